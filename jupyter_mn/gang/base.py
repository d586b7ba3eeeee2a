"""``Gang``: one node agent per node on a dask cluster, all ranks up or none.

Backends differ only in how they provide the dask cluster (a ``Provisioner``); bringing the agents
up, running cells, failing fast and tearing down are the same for all of them and live here.
``Gang`` is the face of its parts: the calls to its node agents (``agents.py``), the run loop
(``runloop.py``), what it does when a node fails or is preempted (``liveness.py``), its group's
re-formings (``generations.py``) and what its agents start (``nodelaunch.py``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..errors import JoinTimeout, JupyterMNError, RendezvousError, SchedulingError
from ..jobs.usage import Meter
from ..kernel.gangids import gang_id
from ..kernel.spec import ClusterSpec
from ..kernel.workdir import Selection
from ..wire.events import GangState, Note, OnEvent, Preemption
from ..wire.launchspec import Launch, Script
from ..wire.rankwhere import RankWhere
from ..wire.rankwire import RankReady
from .agents import NodeAgents
from .files import FileSync
from .generations import Generations
from .heartbeat import Heartbeat
from .hub import EventHub, topics
from .inbox import Reply
from .job import Job
from .lifecycle import GangStatus, allowed
from .liveness import Liveness
from .nodelaunch import launch_for, ranks_cwd
from .runloop import RunLoop
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
        #: worker addresses, their hosts, and (address, port) of the master, in node order
        self.addresses: list[str] = []
        self.hosts: list[str] = []
        self.master: tuple[str, int] = ("", 0)
        self._agents = NodeAgents(self.hub, self.id, self.topic)
        self._on_event: OnEvent | None = None
        self._lock = threading.RLock()
        self._loop = RunLoop(self, self._lock, self._transition)
        self._generations = Generations(self, self._lock, self._transition)
        self._liveness = Liveness(self, self._lock, lambda: self._loop.current)
        self._heartbeat = Heartbeat(
            lambda: self._agents.agents, spec.liveness_timeout, self._liveness.unreachable
        )
        self._closer: threading.Thread | None = None
        #: the notebook's working directory on the nodes (seen, or a copy kept up to date)
        self.files = FileSync(self)
        #: the first node told to go (SIGTERM), while its grace period runs
        self.preemption: Preemption | None = None
        #: GPU-hours: nodes × GPUs × seconds from provisioning to release (``jobs/usage.py``)
        self.usage = Meter(spec.world_size, lambda: "cuda" in self.device or not self.ranks)

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
        return self._loop.request_cancel(reason)

    def notify(self, event: Any) -> None:
        """An event from the provisioner, which works on the starting (main) thread: shown now,
        after the events queued before it (the SCHEDULING transition)."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self.hub.inbox.get(timeout=0)
                if self.hub.inbox.is_event(item):  # no job runs yet: nothing else is waited for
                    self.hub.consume(item, self._on_event)
        self.hub.announce(event, self._on_event)

    @property
    def device(self) -> str:
        """``"cuda (nccl)"`` or ``"cpu (gloo)"``, from what the ranks reported."""
        return device_of(self.ranks)

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
            self.usage.up()
            self._agents.client = client
            client.subscribe_topic(self.topic, self._liveness.on_dask_event)
            self.hosts = self._agents.place(addresses)
            self.addresses = list(addresses)
            self.master = tuple(self._agents.agents[0].endpoint().result())
            self._agents.open_cells(self.hosts)
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

    def _start_ranks(self) -> list[RankReady]:
        # A port picked now, not before the preflight: the fewer seconds between choosing it and
        # rank 0 listening on it, the less chance another socket takes it meanwhile.
        self.master = tuple(self._agents.agents[0].endpoint().result())
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
        where its ranks run (``nodelaunch.py``)."""
        return launch_for(self, master_port, node, script)

    def ranks_cwd(self) -> str | None:
        """The ranks' working directory on the nodes that see the notebook's directory (None:
        the worker's own); the others run in their copy of it."""
        return ranks_cwd(self)

    # ---- the run protocol (docs/architecture.md, "The run protocol")
    def running(self) -> contextlib.AbstractContextManager[int]:
        """A job runs on the gang: RUNNING (a warm gang; nodes claimed for one job have no
        ranks and keep their state), then READY again unless the job moved the gang on (a
        re-forming, a teardown). Yields the run id that interrupt requests name."""
        return self._loop.running()

    def run(self, job: Job[T], timeout: float | None = None) -> T:
        """Run ``job`` on the nodes until it is done: the one loop that applies interrupt
        requests, ``timeout`` and Ctrl-C (as ``job.stop``), ticks the job's escalation and
        shows events as they arrive, on the calling (main) thread (``runloop.py``)."""
        return self._loop.run(job, timeout)

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
        last = self._agents.stop(_STOP_TIMEOUT_S)
        # An event still on its way would bring the topic back on the scheduler after release.
        self.hub.wait_delivered(last, _LAST_EVENTS_S)
        if self._agents.client is not None:
            with contextlib.suppress(Exception):
                self._agents.client.unsubscribe_topic(self.topic)
        self.provisioner.release()
        self.usage.release()
        self._agents.forget()
        self._transition(GangStatus.CLOSED, broken or "")

    # ---- used by jobs (job.py and its kinds) and recovery (recover.py): agents.py's calls
    @property
    def nodes(self) -> int:
        return self._agents.nodes

    @property
    def agents(self) -> list[Any]:
        return self._agents.agents

    @property
    def client(self) -> Any:
        """The gang's ``distributed.Client`` (None once closed)."""
        return self._agents.client

    def send_cell(self, payload: Any, run_id: int) -> None:
        """Start ``agent.run(payload, run_id)`` on every node: on its cell stream where it has
        one, else as an actor call; each node's reply reaches the inbox."""
        rest = self._agents.stream_cell(payload, run_id)
        if rest:
            self.call_each(lambda node, agent: agent.run(payload, run_id), rest)

    def ask_all(self, call: Callable[[int, Any], Any], timeout: float) -> list[Reply]:
        """Call an actor method on every agent at once, ``call(node, agent)`` (while the gang
        starts: no job runs); collect replies via the inbox, showing events meanwhile, until
        all answered or one failed."""
        return self._agents.ask_all(call, timeout, self._on_event)

    def call_each(self, call: Callable[[int, Any], Any], nodes: list[int] | None = None) -> None:
        """Start ``call(node, agent)`` for every node (or ``nodes``); each outcome reaches the
        inbox as that node's reply."""
        self._agents.call_each(call, nodes)

    def ask(self, node: int, method: Callable[[Any], Any]) -> Any:
        """``method(agent)`` for node ``node``, answered by a future of its own rather than the
        inbox; failed at once if the agent is known lost."""
        return self._agents.ask(node, method)

    def stacks(self, timeout: float = 3.0, stack: bool = True) -> list[RankWhere]:
        """Where every rank is (direct calls, no inbox): its main thread's stack in the cell's
        line numbers (unless ``stack`` is False) and its latest collectives."""
        return self._agents.stacks(timeout, stack)

    # ---- re-forming the group (generations.py)
    @property
    def generation(self) -> int:
        return self._generations.generation

    @property
    def incarnation(self) -> int:
        """Bumped whenever rank processes were restarted (they hold no cached notebook names)."""
        return self._generations.incarnation

    def recover(
        self, restart: set[int], notes: list[str] | None = None, if_dead: bool = False
    ) -> None:
        """Re-form the group in the background, restarting the ranks of the ``restart`` nodes."""
        self._generations.recover(restart, notes, if_dead)

    def recovered(self, restart: set[int]) -> None:
        self._generations.recovered(restart)

    def settle(self) -> list[str]:
        """Wait for a re-forming in progress; return what the user should be told about it."""
        return self._generations.settle()

    def next_generation(self) -> int:
        return self._generations.next()


def device_of(ranks: list[RankReady]) -> str:
    """``"cuda (nccl)"`` or ``"cpu (gloo)"`` (both, in a mixed gang; "unknown" before any)."""
    if not ranks:
        return "unknown"
    kinds = {("cuda" if r.device.startswith("cuda") else "cpu", r.backend) for r in ranks}
    return ", ".join(f"{d} ({b})" for d, b in sorted(kinds))


def rendezvous_cause(failures: list[BaseException]) -> JupyterMNError:
    """The error a failed start reports: a node whose rank failed, before the nodes that only
    waited in vain for it to join (``JoinTimeout``)."""
    primary = next((e for e in failures if not isinstance(e, JoinTimeout)), failures[0])
    if isinstance(primary, JupyterMNError):
        return primary
    return RendezvousError(f"{type(primary).__name__}: {primary}")
