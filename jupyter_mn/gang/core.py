"""``GangCore``: the one state object of a gang, shared by all its parts.

Who the gang is (spec, id, topics), where it stands (``status`` and ``detail``, changed only by
``transition`` under ``lock``, checked against ``lifecycle.py``'s table), where its events go
(``hub``), its node agents (``nodes``) and what they told us, the running job's id, a preemption
notice, and the way down (``close``). The run loop (``base.py``), the generations, liveness, file
sync, transport check and jobs each receive this object, never the ``Gang``: as the parts of
torch elastic's agent share one ``WorkerGroup`` (docs/architecture.md, "Gang states").
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any, Protocol

from ..errors import JupyterMNError
from ..model.gangids import gang_id
from ..model.spec import ClusterSpec
from ..model.usage import Meter
from ..wire.events import GangState, OnEvent, Preemption
from ..wire.rankwire import RankReady
from .agents import NodeAgents
from .hub import EventHub, topics
from .lifecycle import GangStatus, allowed

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


class GangCore:
    """A gang's identity, state and node agents; the parts of a gang all hold this one."""

    def __init__(self, spec: ClusterSpec, provisioner: Provisioner) -> None:
        self.spec = spec
        self.provisioner = provisioner
        self.id = gang_id(spec.name)
        self.topic, self.exec_topic = topics(self.id)
        #: where the gang's events go: the running job's inbox, listeners, the last telemetry
        self.hub = EventHub()
        #: the calls to its node agents, and its ``distributed.Client``
        self.nodes = NodeAgents(self.hub, self.id, self.topic)
        #: guards ``status``, ``run_id``, ``stop_every_run`` and ``preemption``
        self.lock = threading.RLock()
        self.status = GangStatus.PENDING
        self.detail = ""
        self.started_at = time.time()
        #: worker addresses, their hosts, and (address, port) of the master, in node order
        self.addresses: list[str] = []
        self.hosts: list[str] = []
        self.master: tuple[str, int] = ("", 0)
        self.ranks: list[RankReady] = []
        #: the id of the job running now (0: none), which interrupt requests name
        self.run_id = 0
        #: why every job is stopped as it starts ("": none is); the cost cap sets it once the
        #: gang is to go when its job slot frees (``Gang.stop_every_run``)
        self.stop_every_run = ""
        #: the first node told to go (SIGTERM), while its grace period runs
        self.preemption: Preemption | None = None
        #: who sees the events while the gang starts (on the starting thread; None otherwise)
        self.watcher: OnEvent | None = None
        #: set once teardown begins: the heartbeat stops
        self.closing = threading.Event()
        #: GPU-hours: nodes × GPUs × seconds from provisioning to release (``model/usage.py``)
        self.usage = Meter(spec.world_size)
        self._closer: threading.Thread | None = None

    def transition(self, status: GangStatus, detail: str = "") -> None:
        """The one way to change the gang's state: an illegal move raises; a move is an event."""
        with self.lock:
            if status == self.status:
                return
            if not allowed(self.status, status):
                raise JupyterMNError(f"gang {self.id}: cannot go from {self.status} to {status}")
            self.status, self.detail = status, detail
        self.hub.dispatch(GangState(status, detail))

    def notify(self, event: Any) -> None:
        """An event from the provisioner or a start-up check, on the starting (main) thread:
        shown now, after the events queued before it (the SCHEDULING transition)."""
        self.show_queued()
        self.hub.announce(event, self.watcher)

    def show_queued(self) -> None:
        """Show the events queued so far, on the starting (main) thread: the cell's view
        appears with the phase the start is in, not once the ranks are being waited for."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self.hub.inbox.get(timeout=0)
                if self.hub.inbox.is_event(item):  # no job runs yet: nothing else is waited for
                    self.hub.consume(item, self.watcher)

    @property
    def device(self) -> str:
        """``"cuda (nccl)"`` or ``"cpu (gloo)"``, from what the ranks reported."""
        if not self.ranks:
            return "unknown"
        kinds = {("cuda" if r.device.startswith("cuda") else "cpu", r.backend) for r in self.ranks}
        return ", ".join(f"{d} ({b})" for d, b in sorted(kinds))

    def close(self, broken: str | None = None, wait: bool = True) -> None:
        """Stop ranks, agents and the dask cluster. Idempotent; safe from any thread.

        ``wait=False``: return at once (the gang is BROKEN or CLOSING meanwhile); a later
        ``close()`` waits for the teardown to finish.
        """
        with self.lock:
            if self.status == GangStatus.CLOSED:
                return
            if broken and self.status != GangStatus.BROKEN:
                self.transition(GangStatus.BROKEN, broken)
            if self._closer is None:
                self._closer = threading.Thread(
                    target=self._teardown, args=(broken,), name="jupyter-mn-close", daemon=True
                )
                self._closer.start()
            closer = self._closer
        if wait and closer is not threading.current_thread():
            closer.join()

    def _teardown(self, broken: str | None) -> None:
        self.closing.set()
        last = self.nodes.stop(_STOP_TIMEOUT_S)
        # An event still on its way would bring the topic back on the scheduler after release.
        self.hub.wait_delivered(last, _LAST_EVENTS_S)
        if self.nodes.client is not None:
            with contextlib.suppress(Exception):
                self.nodes.client.unsubscribe_topic(self.topic)
        self.provisioner.release()
        self.usage.release()
        self.nodes.forget()
        self.transition(GangStatus.CLOSED, broken or "")
