"""``Gang``: one node agent per node on a dask cluster, all ranks up or none.

Backends differ only in how they provide the dask cluster (a ``Provisioner``); bringing the agents
up, running cells, failing fast and tearing down are the same for all of them and live here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from ..collectives import RankWhere
from ..errors import (
    JoinTimeout,
    JupyterMNError,
    NodeUnreachable,
    RendezvousError,
    SchedulingError,
)
from ..events import GangState, Note, OnEvent, Preemption, RankState, RankStatus, from_msg
from ..launchspec import Launch, Script
from ..names import gang_id
from ..rankwire import RankReady
from ..spec import ClusterSpec
from ..workdir import Selection
from .cellstream import CellStream
from .files import FileSync
from .heartbeat import Heartbeat
from .hub import EventHub, topics
from .inbox import InterruptRequest, Reply
from .job import INTERRUPTED_BY_USER, Job
from .recover import Recovery, restarted_note
from .state import GangStatus, allowed
from .transport import require_rdma

T = TypeVar("T")
#: A check of a new gang's nodes before its ranks start (the preflight doctor): it raises to
#: refuse the gang and says what it found through the note callback.
Preflight = Callable[["Gang", Callable[[str], None]], None]

_STOP_TIMEOUT_S = 15.0
#: How long teardown waits for the agents' last events (they are normally there in ms).
_LAST_EVENTS_S = 2.0


class Provisioner(Protocol):
    """Provides a dask cluster with one worker per node (all of them, or raises)."""

    backend: str

    def provision(self, spec: ClusterSpec, gang_id: str) -> tuple[Any, list[str]]:
        """Return a connected ``distributed.Client`` and worker addresses in node order."""

    def launch_options(self) -> dict[str, Any]:
        """Extra launch settings for the agents (e.g. the working directory of local ranks)."""

    def release(self) -> None:
        """Give everything back; safe to call twice and after a failed ``provision``."""


class Gang:
    """A running group of node agents and their ranks, driven from the kernel."""

    def __init__(self, spec: ClusterSpec, provisioner: Provisioner) -> None:
        #: where the gang's events go: the running job's inbox, listeners, the last telemetry
        self.hub = EventHub()
        self.spec = spec
        self.provisioner = provisioner
        self.id = gang_id(spec.name)
        self.topic, self.exec_topic = topics(self.id)
        self.status = GangStatus.PENDING
        self.detail = ""
        self.ranks: list[RankReady] = []
        self.started_at = time.time()
        self._client: Any = None
        #: worker addresses, their hosts, and (address, port) of the master, in node order
        self.addresses: list[str] = []
        self.hosts: list[str] = []
        self.master: tuple[str, int] = ("", 0)
        self._agents: list[Any] = []
        self._agent_futures: list[Any] = []
        #: cells' requests and replies, beside dask (cellstream.py)
        self._cells = CellStream(self.hub.inbox)
        self._generation = 0
        self._runs = 0
        #: the id of the job running now (0: none), which interrupt requests are meant for
        self._running = 0
        #: bumped whenever rank processes were restarted (they hold no cached notebook names)
        self.incarnation = 0
        self._on_event: OnEvent | None = None
        self._lock = threading.RLock()
        self._heartbeat = Heartbeat(lambda: self._agents, spec.liveness_timeout, self._unreachable)
        self._recovery: Recovery | None = None
        self._closer: threading.Thread | None = None
        #: the notebook's working directory on the nodes (seen, or a copy kept up to date)
        self.files = FileSync(self)
        #: the first node told to go (SIGTERM), while its grace period runs
        self.preemption: Preemption | None = None

    # ---- state and events
    def _transition(self, status: GangStatus, detail: str = "") -> None:
        with self._lock:
            if status == self.status:
                return
            if not allowed(self.status, status):
                raise JupyterMNError(f"gang {self.id}: cannot go from {self.status} to {status}")
            self.status, self.detail = status, detail
        self.hub.dispatch(GangState(status, detail))

    def request_cancel(self, reason: str) -> bool:
        """Stop the running job (a cell, script, node command or doctor), from any thread (the
        registry's cancel request, a background cell's ``cancel()``, ``--max-runtime``); False
        when none runs. The run loop (``run``) stops the job as Ctrl-C would."""
        with self._lock:
            if not self._running:
                return False
            self.hub.inbox.put_reply(InterruptRequest(reason, self._running))
            return True

    def _unreachable(self, node: int, silent: float) -> None:
        """From the heartbeat: node ``node`` has not answered for ``silent`` s. A running job
        gets it as that node's failed reply (the root cause); an idle gang is given up."""
        host = self.hosts[node] if node < len(self.hosts) else "?"
        error = NodeUnreachable(
            f"node {node} ({host}) unreachable for {silent:.0f} s (no answer to the heartbeat)"
        )
        with self._lock:
            if self._running:
                self.hub.inbox.put_reply(Reply(node, error=error))
                return
        self.close(broken=str(error), wait=False)

    def notify(self, event: Any) -> None:
        """An event from the provisioner, which works on the starting (main) thread: shown now,
        after the events queued before it (the SCHEDULING transition)."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self.hub.inbox.get(timeout=0)
                if self.hub.inbox.is_event(item):  # no job runs yet: nothing else is waited for
                    self.hub.consume(item, self._on_event)
        self.hub.announce(event, self._on_event)

    def _on_dask_event(self, event: tuple[float, dict[str, Any]]) -> None:
        msg = from_msg(event[1])
        self.hub.dispatch(msg)
        if isinstance(msg, Preemption):
            self._preempted(msg)
        if isinstance(msg, RankState) and msg.state == RankStatus.LOST_IDLE and self.status.idle:
            note = f"{msg.detail}\n{restarted_note(self.spec, {msg.node}, done=True)}"
            self.recover({msg.node}, [note], if_dead=True)

    def _preempted(self, notice: Preemption) -> None:
        """A node is being preempted: every node's ranks hear it (``checkpoint.preempted()``);
        a running cell goes on (its loop saves and returns, or the deadline stops it) and then
        ends with ``Preempted``; an idle gang is given up at once."""
        with self._lock:
            if self.preemption is None:
                self.preemption = notice
            running = bool(self._running)
        for node in range(self.nodes):
            self.ask(node, lambda agent: agent.preempt(notice))
        if not running:
            self.close(broken=f"node {notice.node} was preempted", wait=False)

    @property
    def device(self) -> str:
        """``"cuda (nccl)"`` or ``"cpu (gloo)"``, from what the ranks reported."""
        if not self.ranks:
            return "unknown"
        kinds = {("cuda" if r.device.startswith("cuda") else "cpu", r.backend) for r in self.ranks}
        return ", ".join(f"{d} ({b})" for d, b in sorted(kinds))

    # ---- lifecycle
    def start(
        self,
        on_event: OnEvent | None = None,
        ranks: bool = True,
        preflight: Preflight | None = None,
        files: Selection | None = None,
    ) -> None:
        """Provision all nodes and ranks, or raise and leave nothing behind.

        ``on_event`` sees the events that arrive meanwhile, on the calling (main) thread. With
        ``ranks=False`` only the node agents come up (for doctor, exec and scripts). The nodes
        are checked by ``preflight`` (the doctor, passed in by ``Cluster``) before ranks start,
        and asked whether they see the directory that travels (``files``, ``gang/files.py``).
        """
        self._on_event = on_event
        try:
            self._transition(GangStatus.SCHEDULING, f"{self.spec.shape} {self.provisioner.backend}")
            client, addresses = self.provisioner.provision(self.spec, self.id)
            if len(addresses) != self.spec.nodes:
                raise SchedulingError(
                    f"got {len(addresses)} node(s) from the {self.provisioner.backend} backend, "
                    f"need {self.spec.nodes}"
                )
            self._client = client
            client.subscribe_topic(self.topic, self._on_dask_event)
            self._place_agents(addresses)
            if preflight is not None:
                preflight(self, lambda text: self.notify(Note(text)))
            self.files.decide(files, local=self.provisioner.backend == "local")
            if ranks:
                self._transition(GangStatus.RENDEZVOUS)
                self.ranks = self._start_ranks()
                if self.spec.require_rdma:
                    require_rdma(self)
                self._heartbeat.start()
                self._transition(GangStatus.READY, self.device)
        except BaseException as exc:
            self.close(broken=str(exc) if isinstance(exc, Exception) else "interrupted")
            raise
        finally:
            self._on_event = None

    def _place_agents(self, addresses: list[str]) -> None:
        """One node agent (a dask actor) per node; node 0's agent names the master address."""
        from ..node.agent import NodeAgent

        client = self._client
        with client.as_current():
            self._agent_futures = [
                client.submit(
                    NodeAgent,
                    self.id,
                    self.topic,
                    node,
                    actor=True,
                    workers=[addr],
                    allow_other_workers=False,
                    pure=False,
                    key=f"jupyter-mn-agent-{self.id}-{node}",
                )
                for node, addr in enumerate(addresses)
            ]
            self._agents = client.gather(self._agent_futures)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        self.addresses = list(addresses)
        self.hosts = [workers[a]["host"] for a in addresses]
        self.master = tuple(self._agents[0].endpoint().result())
        self._open_cells()

    def _open_cells(self) -> None:
        """A cell stream to every agent the kernel can reach (not through a port-forward, which
        carries dask's scheduler connection alone); the others get their cells as actor calls."""
        client, cells = self._client, self._cells
        if client.direct_to_workers is False:
            return
        context = client.security.get_connection_args("client").get("ssl_context")
        ports = [agent.serve_cells() for agent in self._agents]
        agents = zip(range(self.nodes), self.hosts, ports, strict=True)
        cells.open_all([(node, host, port.result()) for node, host, port in agents], context)

    def send_cell(self, payload: Any, run_id: int) -> None:
        """Start ``agent.run(payload, run_id)`` on every node: on its cell stream where it has
        one, else as an actor call; each node's reply reaches the inbox."""
        request = self._cells.request(payload, run_id)
        rest = [node for node in range(self.nodes) if not self._cells.send(node, request)]
        if rest:
            self.call_each(lambda node, agent: agent.run(payload, run_id), rest)

    def _start_ranks(self) -> list[RankReady]:
        # A port picked now, not before the preflight: the fewer seconds between choosing it and
        # rank 0 listening on it, the less chance another socket takes it meanwhile.
        self.master = tuple(self._agents[0].endpoint().result())
        port = self.master[1]
        replies = self.ask_all(
            lambda node, agent: agent.start(self.launch(port, node)), self.spec.start_timeout + 30
        )
        failures = [r.error for r in replies if r.error is not None]
        if failures:
            raise rendezvous_cause(failures)
        return [info for r in sorted(replies, key=lambda r: r.node) for info in r.value]

    def launch(self, master_port: int, node: int, script: Script | None = None) -> Launch:
        """What node ``node``'s agent starts: this gang's shape and settings, rank 0's store on
        ``master_port`` (a script gets a fresh one: the warm gang's rank 0 keeps its own), and
        where its ranks run."""
        return Launch(
            job=self.id,
            gpus=self.spec.gpus,
            nnodes=self.spec.nodes,
            master_addr=self.master[0],
            master_port=master_port,
            backend=self.provisioner.backend,
            nodes=tuple(self.hosts),
            pg_timeout=self.spec.pg_timeout,
            env=dict(self.spec.env),
            start_timeout=self.spec.start_timeout,
            heartbeat_timeout=self.spec.heartbeat_timeout,
            grace=self.spec.grace,
            memory_limit=self.spec.memory_limit,
            rdma=self.spec.rdma,
            require_rdma=self.spec.require_rdma,
            debug=self.spec.debug,
            script=script,
            **{**self.provisioner.launch_options(), **self.files.launch_options(node)},
        )

    def ranks_cwd(self) -> str | None:
        """The ranks' working directory on the nodes that see the notebook's directory (None:
        the worker's own); the others run in their copy of it."""
        return {**self.provisioner.launch_options(), **self.files.shared_options()}.get("cwd")

    def ask_all(self, call: Callable[[int, Any], Any], timeout: float) -> list[Reply]:
        """Call an actor method on every agent at once, ``call(node, agent)`` (while the gang
        starts: no job runs); collect replies via the inbox, showing events meanwhile, until
        all answered or one failed."""
        self.call_each(call)
        replies: dict[int, Reply] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < len(self._agents):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RendezvousError(f"no answer from node agents within {timeout:.0f} s")
            try:
                item = self.hub.inbox.get(timeout=remaining)
            except queue.Empty:
                continue
            if isinstance(item, Reply):
                replies[item.node] = item
                if item.error is not None:
                    break
            elif self.hub.inbox.is_event(item):
                self.hub.consume(item, self._on_event)
        return list(replies.values())

    # ---- the run protocol (docs/architecture.md, "The run protocol")
    @contextlib.contextmanager
    def running(self) -> Iterator[int]:
        """A job runs on the gang: RUNNING (a warm gang; nodes claimed for one job have no
        ranks and keep their state), then READY again unless the job moved the gang on (a
        re-forming, a teardown). Yields the run id that interrupt requests name."""
        self.settle()
        with self._lock:
            if self._running:
                raise JupyterMNError(f"gang {self.id} is already running run {self._running}")
            if self.status.usable:
                self._transition(GangStatus.RUNNING)
            elif self.ranks or self.status != GangStatus.SCHEDULING:
                raise JupyterMNError(f"gang {self.id} is {self.status.value}: {self.detail}")
            self._runs += 1
            self._running = self._runs
        try:
            yield self._running
        finally:
            with self._lock:
                self._running = 0
                if self.status == GangStatus.RUNNING:
                    self._transition(GangStatus.READY)
                if self.preemption is not None:  # any job (a script, a command): its node goes
                    self.close(broken=f"node {self.preemption.node} was preempted", wait=False)

    def run(self, job: Job[T], timeout: float | None = None) -> T:
        """Run ``job`` on the nodes until it is done: the one loop that applies interrupt
        requests, ``timeout`` and Ctrl-C (as ``job.stop``), ticks the job's escalation and
        shows events as they arrive, on the calling (main) thread."""
        with self.running() as run_id:
            job.run_id = run_id
            self.hub.announce(job.what(), job.on_event)
            job.start()
            deadline = time.monotonic() + timeout if timeout else None
            while not job.done():
                try:
                    now = time.monotonic()
                    if deadline is not None and now - job.paused_for >= deadline:
                        deadline = None
                        job.stop(f"--timeout {timeout:g} s reached", by_user=True)
                    if job.tick(now):
                        break
                    try:
                        item = self.hub.inbox.get(timeout=job.tick_s)
                    except queue.Empty:
                        continue
                    if isinstance(item, InterruptRequest):
                        if item.run == run_id:  # else: meant for a run that is over
                            job.stop(item.reason, by_user=True, again=True)
                    elif job.take(item):
                        job.stop("another rank failed", by_user=False)
                except KeyboardInterrupt:
                    job.stop(INTERRUPTED_BY_USER, by_user=True, again=True)
            job.settle()
        return job.finish()

    def close(self, broken: str | None = None, wait: bool = True) -> None:
        """Stop ranks, agents and the dask cluster. Idempotent; safe from any thread.

        ``wait=False``: return at once (the gang is BROKEN or CLOSING meanwhile); a later
        ``close()`` waits for the teardown to finish.
        """
        with self._lock:
            if self.status == GangStatus.CLOSED:
                return
            if broken and self.status != GangStatus.BROKEN:
                self._transition(GangStatus.BROKEN, broken)
            if self._closer is None:
                self._closer = threading.Thread(
                    target=self._teardown, args=(broken,), name="jupyter-mn-close", daemon=True
                )
                self._closer.start()
            closer = self._closer
        if wait and closer is not threading.current_thread():
            closer.join()

    def _teardown(self, broken: str | None) -> None:
        self._heartbeat.stop()
        stops = [self.ask(node, lambda agent: agent.stop()) for node in range(self.nodes)]
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        last = {}
        for node, future in enumerate(stops):
            with contextlib.suppress(Exception):  # a lost agent: its worker goes with the cluster
                last[node] = future.result(timeout=max(deadline - time.monotonic(), 0.1))
        self._cells.close("the gang was torn down")  # after the agents: a run's reply came first
        # An event still on its way would bring the topic back on the scheduler after release.
        self.hub.wait_delivered(last, _LAST_EVENTS_S)
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.unsubscribe_topic(self.topic)
        self._agents, self._agent_futures = [], []
        self.provisioner.release()
        self._client = None
        self._transition(GangStatus.CLOSED, broken or "")

    # ---- used by jobs (job.py and its kinds) and recovery (recover.py)
    @property
    def nodes(self) -> int:
        return len(self._agents)

    @property
    def generation(self) -> int:
        return self._generation

    def call_each(self, call: Callable[[int, Any], Any], nodes: list[int] | None = None) -> None:
        """Start ``call(node, agent)`` (an actor call) for every node, all with one wake-up of
        the client's loop (one per node cost a thread switch each on the cell's path); each
        outcome reaches the inbox as that node's reply. The actor proxy raises at once when its
        worker is already known lost: that is the reply then."""
        inbox = self.hub.inbox
        agents = list(self._agents)
        chosen = range(len(agents)) if nodes is None else nodes

        async def one(node: int, agent: Any) -> None:
            try:
                value = await call(node, agent)
            except BaseException as exc:
                inbox.put_reply(Reply(node, error=exc))
            else:
                inbox.put_reply(Reply(node, value=value))

        async def go() -> None:
            await asyncio.gather(*(one(node, agents[node]) for node in chosen))

        self._client.loop.add_callback(go)

    def ask(self, node: int, method: Callable[[Any], Any]) -> Any:
        """``method(agent)`` for node ``node``, answered by a future of its own rather than the
        inbox (stacks, teardown and re-forming run beside a cell); failed at once if the agent
        is known lost."""
        try:
            return method(self._agents[node])
        except Exception as exc:  # "Worker holding Actor was lost"
            failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
            failed.set_exception(exc)
            return failed

    def stacks(self, timeout: float = 3.0, stack: bool = True) -> list[RankWhere]:
        """Where every rank is (direct calls, no inbox): its main thread's stack in the cell's
        line numbers (unless ``stack`` is False) and its latest collectives."""
        futures = [self.ask(node, lambda agent: agent.stacks(stack)) for node in range(self.nodes)]
        deadline = time.monotonic() + timeout
        out: list[RankWhere] = []
        for node, future in enumerate(futures):
            try:
                out += future.result(timeout=max(deadline - time.monotonic(), 0.1))
            except Exception as exc:
                out.append(RankWhere(node, -1, False, answered=False, note=str(exc)))
        return out

    def recover(
        self, restart: set[int], notes: list[str] | None = None, if_dead: bool = False
    ) -> None:
        """Re-form the group in the background, restarting the ranks of the ``restart`` nodes."""
        with self._lock:  # settle() must find the recovery started once the state says so
            if self.status not in (GangStatus.READY, GangStatus.RUNNING):
                return
            self._recovery = Recovery(self, restart, list(notes or []), if_dead)
            self._transition(GangStatus.RENDEZVOUS, "re-forming the process group")
            self._recovery.start()

    def recovered(self, restart: set[int]) -> None:
        with self._lock:
            if self.status != GangStatus.RENDEZVOUS:
                return  # closed meanwhile
            if restart:
                self.incarnation += 1
            self._transition(GangStatus.READY)

    def settle(self) -> list[str]:
        """Wait for a re-forming in progress; return what the user should be told about it."""
        with self._lock:
            recovery = self._recovery
        if recovery is None:
            return []
        recovery.join()
        with self._lock:
            if self._recovery is recovery:
                self._recovery = None
        return recovery.notes

    def next_generation(self) -> int:
        self._generation += 1
        return self._generation

    @property
    def agents(self) -> list[Any]:
        return self._agents

    @property
    def client(self) -> Any:
        """The gang's ``distributed.Client`` (None once closed)."""
        return self._client


def rendezvous_cause(failures: list[BaseException]) -> JupyterMNError:
    """The error a failed start reports: a node whose rank failed, before the nodes that only
    waited in vain for it to join (``JoinTimeout``)."""
    primary = next((e for e in failures if not isinstance(e, JoinTimeout)), failures[0])
    if isinstance(primary, JupyterMNError):
        return primary
    return RendezvousError(f"{type(primary).__name__}: {primary}")
