"""``Gang``: one node agent per node on a dask cluster, all ranks up or none, and its run loop.

Backends differ only in how they provide the dask cluster (a ``Provisioner``); bringing the agents
up, running jobs, failing fast and tearing down are the same for all of them. The gang's state is
one object, ``GangCore`` (``core.py``), which every part receives: the calls to its node agents
(``agents.py``), what it does when a node fails or is preempted (``liveness.py``), its group's
re-formings (``generations.py``), the notebook's files on its nodes (``files.py``) and the jobs
the run loop here drives (``job.py``). As torch elastic's agent drives one ``WorkerGroup`` from
one ``_invoke_run`` loop, ``Gang`` starts the nodes and runs the one loop (``run``).
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ..errors import JoinTimeout, JupyterMNError, RendezvousError, SchedulingError
from ..model.spec import ClusterSpec
from ..model.workdir import Selection
from ..wire.events import Note, OnEvent
from ..wire.rankwire import RankReady
from .core import GangCore, Provisioner
from .files import FileSync
from .generations import Generations
from .heartbeat import Heartbeat
from .inbox import InterruptRequest
from .job import INTERRUPTED_BY_USER, Job
from .lifecycle import GangStatus
from .liveness import Liveness
from .nodelaunch import launch_for
from .transport import require_rdma

T = TypeVar("T")
#: A check of a new gang's nodes before its ranks start (the preflight doctor): it raises to
#: refuse the gang and says what it found through the note callback.
Preflight = Callable[["Gang", Callable[[str], None]], None]


class Gang:
    """A running group of node agents and their ranks, driven from the kernel."""

    def __init__(self, spec: ClusterSpec, provisioner: Provisioner) -> None:
        #: the state every part shares: status, lock, hub, node agents (``core.py``)
        self.core = GangCore(spec, provisioner)
        #: the process group's re-formings, its generation and the ranks' incarnation
        self.generations = Generations(self.core)
        #: the notebook's working directory on the nodes (seen, or a copy kept up to date)
        self.files = FileSync(self.core)
        self._liveness = Liveness(self.core, self.generations)
        self._heartbeat = Heartbeat(
            lambda: self.core.nodes.agents,
            spec.liveness_timeout,
            self._liveness.unreachable,
            self.core.closing,
        )
        self._runs = 0

    # ---- start
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
        core = self.core
        core.watcher = on_event
        try:
            backend = core.provisioner.backend
            core.transition(GangStatus.SCHEDULING, f"{core.spec.shape} {backend}")
            core.show_queued()  # the view appears now, not after the nodes are provisioned
            client, addresses = core.provisioner.provision(core.spec, core.id)
            if len(addresses) != core.spec.nodes:
                raise SchedulingError(
                    f"got {len(addresses)} node(s) from the {backend} backend, "
                    f"need {core.spec.nodes}"
                )
            core.usage.up()
            core.nodes.client = client
            client.subscribe_topic(core.topic, self._liveness.on_dask_event)
            core.hosts = core.nodes.place(addresses)
            core.addresses = list(addresses)
            core.master = tuple(core.nodes.agents[0].endpoint().result())
            core.nodes.open_cells(core.hosts)
            if preflight is not None:
                preflight(self, lambda text: core.notify(Note(text)))
            self.files.decide(files, local=backend == "local")
            if ranks:
                core.transition(GangStatus.RENDEZVOUS)
                core.ranks = self._start_ranks()
                if core.spec.require_rdma:
                    require_rdma(core)
                self._heartbeat.start()
                core.usage.started(gpu="cuda" in core.device)  # the count's unit, fixed now
                core.transition(GangStatus.READY, core.device)
            else:  # agents alone (doctor, exec, scripts): counted as the GPUs they hold
                core.usage.started(gpu=True)
        except BaseException as exc:
            core.close(broken=str(exc) if isinstance(exc, Exception) else "interrupted")
            raise
        finally:
            core.watcher = None

    def _start_ranks(self) -> list[RankReady]:
        # A port picked now, not before the preflight: the fewer seconds between choosing it and
        # rank 0 listening on it, the less chance another socket takes it meanwhile.
        core = self.core
        core.master = tuple(core.nodes.agents[0].endpoint().result())
        port = core.master[1]
        replies = core.nodes.ask_all(
            lambda node, agent: agent.start(launch_for(core, self.files, port, node)),
            core.spec.start_timeout + 30,
            core.watcher,
        )
        failures = [r.error for r in replies if r.error is not None]
        if failures:
            raise rendezvous_cause(failures)
        return [info for r in sorted(replies, key=lambda r: r.node) for info in r.value]

    # ---- the run protocol (docs/architecture.md, "The run protocol")
    @contextlib.contextmanager
    def running(self) -> Iterator[int]:
        """A job runs on the gang: RUNNING (a warm gang; nodes claimed for one job have no
        ranks and keep their state), then READY again unless the job moved the gang on (a
        re-forming, a teardown). Yields the run id that interrupt requests name."""
        core = self.core
        self.generations.settle()
        with core.lock:
            if core.run_id:
                raise JupyterMNError(f"gang {core.id} is already running run {core.run_id}")
            if core.status.usable:
                core.transition(GangStatus.RUNNING)
            elif core.ranks or core.status != GangStatus.SCHEDULING:
                raise JupyterMNError(f"gang {core.id} is {core.status.value}: {core.detail}")
            self._runs += 1
            core.run_id = self._runs
            if core.stop_every_run:
                core.hub.inbox.put_reply(InterruptRequest(core.stop_every_run, core.run_id))
        try:
            yield core.run_id
        finally:
            with core.lock:
                core.run_id = 0
                if core.status == GangStatus.RUNNING:
                    core.transition(GangStatus.READY)
                if core.preemption is not None:  # any job (a script, a command): its node goes
                    core.close(broken=f"node {core.preemption.node} was preempted", wait=False)

    def run(self, job: Job[T], timeout: float | None = None) -> T:
        """Run ``job`` on the nodes until it is done: the one loop that applies interrupt
        requests, ``timeout`` and Ctrl-C (as ``job.stop``), ticks the job's escalation and
        shows events as they arrive, on the calling (main) thread."""
        hub = self.core.hub
        with self.running() as run_id:
            job.run_id = run_id
            hub.announce(job.what(), job.on_event)
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
                        item = hub.inbox.get(timeout=job.tick_s)
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

    def request_cancel(self, reason: str) -> bool:
        """Stop the running job (a cell, script, node command or doctor), from any thread (the
        registry's cancel request, a background cell's ``cancel()``, ``--max-runtime``); False
        when none runs. The run loop (``run``) stops the job as Ctrl-C would."""
        core = self.core
        with core.lock:
            if not core.run_id:
                return False
            core.hub.inbox.put_reply(InterruptRequest(reason, core.run_id))
            return True

    def stop_every_run(self, reason: str) -> None:
        """Stop the running job and every job that starts later, as ``request_cancel`` does
        (the cost cap, from its thread: the gang goes when the job holding the cluster ends, and
        that job may not have reached its run loop yet, with no run to interrupt)."""
        core = self.core
        with core.lock:
            core.stop_every_run = reason
            self.request_cancel(reason)


def rendezvous_cause(failures: list[BaseException]) -> JupyterMNError:
    """The error a failed start reports: a node whose rank failed, before the nodes that only
    waited in vain for it to join (``JoinTimeout``)."""
    primary = next((e for e in failures if not isinstance(e, JoinTimeout)), failures[0])
    if isinstance(primary, JupyterMNError):
        return primary
    return RendezvousError(f"{type(primary).__name__}: {primary}")
