"""Kernel side of the registry: keep each gang's ``JobModel`` and logs current, obey requests.

``track(owner, gang)`` subscribes to the gang's events (they arrive on dask's thread) and hands
them to one recorder thread per process, which writes the registry and the log files, beats the
heartbeat and polls the ``requests`` table. Polling from a thread is what lets the Multi-node jobs
panel and ``jupyter mn cancel`` reach a kernel that is busy running a cell as well as an idle one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from ..jobs.joblogs import ERROR_STREAM, JobLogWriter
from ..jobs.registry import HUNG, JOB_HEARTBEAT_S, JobModel, NodeModel, Registry, Request
from ..model.kernelid import current_kernel_id
from ..model.usage import job_hours
from ..rank.env import JOB
from ..wire.events import (
    CellDone,
    CellOutcome,
    GangState,
    GangStatus,
    GpuSample,
    Hung,
    LogLines,
    NodesWaiting,
    Preemption,
    RankState,
    RunStarted,
    TransportReport,
)

if TYPE_CHECKING:
    from ..gang import Gang

log = logging.getLogger(__name__)
POLL_S = 0.25
#: Events that arrive within this window are written together: a cell's RUNNING, READY and
#: CellDone cost one SQLite write and one wake-up of the recorder thread, not one each.
BATCH_S = 0.02
#: Gang states written at once (a teardown must be on record even if the process exits next).
_TERMINAL = (GangStatus.BROKEN, GangStatus.CLOSED)
#: The states of a gang that runs something (HUNG: the registry's, for a hung cell)
_BUSY = (GangStatus.RUNNING.value, HUNG)
_SOURCES = {"panel": "the Multi-node jobs panel", "cli": "jupyter mn"}
_DONE = {"cancel": "cancelled", "release": "released"}


class GangOwner(Protocol):
    """Who holds a recorded gang and obeys its requests: a cluster's warm gang (``Cluster``
    answers the same calls)."""

    gang: Gang | None

    def cancel(self, reason: str) -> bool: ...

    def release(self, reason: str) -> None: ...


class JobRecord:
    """One gang's row and log files; only the recorder thread touches it."""

    def __init__(self, registry: Registry, owner: GangOwner, gang: Gang) -> None:
        spec = gang.core.spec
        self.registry = registry
        self.owner = weakref.ref(owner)
        self.gang = gang
        job_id = gang.core.id  # unique and path-safe; the user's name is ``name``
        self.model = JobModel(
            id=job_id,
            name=spec.name or gang.core.id,
            gang=gang.core.id,
            backend=spec.backend,
            shape=spec.shape,
            gpus=spec.gpus,
            world_size=spec.world_size,
            state=gang.core.status.value,
            started=gang.core.started_at,
            heartbeat=time.time(),
            pid=os.getpid(),
            kernel_id=current_kernel_id(),
            notebook=_notebook(),
            launcher=_launcher(),
            run=os.environ.get(JOB, ""),  # a submitted run's kernel inherits its runner's mark
            nodes=[NodeModel(node=n, ranks=["pending"] * spec.gpus) for n in range(spec.nodes)],
        )
        self.logs = JobLogWriter(registry.log_dir(job_id))
        #: the running job's name in the logs (``In[7]``), and whether its hang verdict is there
        self._what = ""
        self._verdict_logged = False

    def handle(self, event: Any) -> bool:
        """Apply one event; True when the registry row changed."""
        if isinstance(event, LogLines):
            self.logs.write(event)
            return False
        model = self.model
        if isinstance(event, NodesWaiting):  # the first comes once the namespace is chosen
            return self._placed()
        if isinstance(event, GangState):
            self._placed()
            over = event.state == GangStatus.READY and model.state in _BUSY
            if over or event.state in _TERMINAL:  # (a cold gang is READY before its first run)
                model.running = ""
            model.state, model.detail = event.state, event.detail
            usage = self.gang.core.usage
            model.up, model.unit = usage.up_at, usage.unit.value if usage.unit else ""
            if event.state == GangStatus.READY:
                self._ranks_up()
            elif event.state == GangStatus.BROKEN:
                model.error = event.detail
            elif event.state == GangStatus.CLOSED:
                model.ended = usage.released_at or time.time()
        elif isinstance(event, RankState):
            node = model.nodes[event.node]
            node.ranks[event.rank - event.node * model.gpus] = event.state
        elif isinstance(event, GpuSample):
            utils = [g.util for g in event.gpus]
            model.nodes[event.node].gpu_util = sum(utils) / len(utils) if utils else None
        elif isinstance(event, TransportReport) and event.node >= 0:
            model.nodes[event.node].transport = event.summary
        elif isinstance(event, RunStarted):  # counted when it starts: the panel shows it running
            model.cells += 1 if event.cell else 0
            # the last run's failure is its cell's (``last_cell``), not a state of the new one
            model.running, model.error = event.what, None
            self._what, self._verdict_logged = event.what, False
            self._mark(f"{event.what} started")
        elif isinstance(event, Hung) and event.over:
            core = self.gang.core
            model.state, model.detail, model.error = core.status.value, core.detail, None
        elif isinstance(event, Hung):  # until it is over or the gang's next state (the cell ends)
            model.state, model.detail, model.error = HUNG, event.verdict, event.verdict
            self._log_verdict(event.verdict)
        elif isinstance(event, Preemption):  # the panel polls: a deadline, not a countdown
            deadline = time.strftime("%H:%M:%S", time.localtime(event.deadline))
            model.error = f"PREEMPTING node {event.node} (until {deadline}): {event.cause.text}"
        elif isinstance(event, CellDone):
            model.last_cell = {
                "id": event.cell_id,
                "elapsed": event.elapsed,
                "value": event.value,
                "error": event.error,
                "hours": event.hours,
                "outcome": event.outcome.value,
                # the root cause's, for a job's View (the cell shows it; a --bg cell's View, too)
                "traceback": "\n".join(event.traceback),
            }
            failure = event.stopped or event.error or event.outcome.value
            model.error = None if event.ok else failure
            self._log_outcome(event)
        else:
            return False
        return True

    def _mark(self, text: str) -> None:
        self.logs.mark(len(self.model.nodes), f"{text} {time.strftime('%H:%M:%S')}")

    def _log_verdict(self, verdict: str) -> None:
        if not self._verdict_logged:
            self._mark(f"{self._what} hang verdict: {verdict} ·")
        self._verdict_logged = True

    def _log_outcome(self, done: CellDone) -> None:
        """How a cell that did not finish its work ended, in its logs: the outcome with why it
        was stopped or its root cause, the hang verdict, the root cause's traceback."""
        if done.outcome == CellOutcome.DONE:
            return
        if done.verdict:
            self._log_verdict(done.verdict)
        self._mark(f"{self._what} {done.outcome.value}: {done.stopped or done.error} ·")
        if done.traceback and done.outcome in (CellOutcome.FAILED, CellOutcome.LOST):
            lines = tuple(line for text in done.traceback for line in text.splitlines())
            cause = (done.cause_rank, ERROR_STREAM, lines)
            self.logs.write(LogLines(done.cause_node, 0, (cause,)))

    def _placed(self) -> bool:
        """Record the gang's Kubernetes namespace once its provisioner has chosen it (``gc``
        deletes there); other provisioners have none."""
        namespace = getattr(self.gang.core.provisioner, "namespace", "")
        changed = namespace != self.model.namespace
        self.model.namespace = namespace
        return changed

    def _ranks_up(self) -> None:
        for info in self.gang.core.ranks:
            node = self.model.nodes[info.rank // self.model.gpus]
            node.host = info.host
            gpu = info.device.startswith("cuda")
            node.transport = f"{info.backend} ({'GPU' if gpu else 'CPU'})"
            if info.pid and info.pid not in node.pids:
                node.pids.append(info.pid)

    def save(self) -> None:
        self.model.heartbeat = time.time()
        self.model.gpu_hours = job_hours(self.model, self.model.heartbeat)
        self.registry.save(self.model)

    def obey(self, request: Request) -> str:
        """Carry out a cancel/release request; returns what happened (stored as its outcome)."""
        owner = self.owner()
        why = f"{_DONE[request.action]} from {_SOURCES.get(request.source, request.source)}"
        if owner is None or owner.gang is not self.gang:
            return "the job had already ended"
        if request.action == "cancel":
            if owner.cancel(why):
                return "cancelling the running cell"
            return "no cell was running"
        threading.Thread(
            target=owner.release, args=(why,), name="jupyter-mn-release", daemon=True
        ).start()
        return "releasing the gang"


class Recorder:
    """The per-process writer thread; jobs are added by ``track`` and leave when CLOSED."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        self._queue: queue.SimpleQueue[tuple[JobRecord, Any]] = queue.SimpleQueue()
        self._records: dict[str, JobRecord] = {}
        #: records whose last save failed (disk full): saved again on the next drain
        self._unsaved: dict[str, JobRecord] = {}
        self._failing = False
        self._lock = threading.Lock()
        #: set by the first event after a drain; the thread then waits ``BATCH_S`` for the rest
        self._wake = threading.Event()
        #: set by a terminal state: no batching wait
        self._urgent = threading.Event()
        self._pending = False
        #: what the requests carried out said, until written (request id → outcome): a write that
        #: fails (a locked database) is tried again, and the request never carried out twice
        self._answers: dict[int, str] = {}
        self._thread = threading.Thread(target=self._loop, name="jupyter-mn-recorder", daemon=True)
        self._thread.start()

    def track(self, owner: GangOwner, gang: Gang) -> JobRecord:
        """Record ``gang``: its row now, or (a locked or full database) by the recorder thread
        as soon as it can be written, so the panel, the CLI and ``gc`` see every gang."""
        record = JobRecord(self.registry, owner, gang)
        with self._lock:
            self._records[record.model.id] = record
            try:
                record.save()
            except (sqlite3.Error, OSError) as exc:
                self._unsaved[record.model.id] = record
                self._failed(exc)

        def listener(event: Any) -> None:
            self._queue.put((record, event))
            if isinstance(event, GangState) and event.state in _TERMINAL:
                self._urgent.set()
                self._wake.set()
                if event.state == GangStatus.CLOSED:
                    self.drain()  # synchronously: the process may be exiting (atexit close)
            elif not self._pending:  # the first of a batch (a benign race: one wake-up more)
                self._pending = True
                self._wake.set()

        gang.core.hub.subscribe(listener)
        return record

    def drain(self) -> None:
        """Apply every queued event and write what changed (any thread)."""
        with self._lock:
            changed, self._unsaved = self._unsaved, {}
            while True:
                try:
                    record, event = self._queue.get_nowait()
                except queue.Empty:
                    break
                try:
                    if record.handle(event):
                        changed[record.model.id] = record
                except Exception:
                    log.exception("jupyter_mn: could not record %r", event)
            for job_id, record in changed.items():
                try:
                    record.save()
                except (sqlite3.Error, OSError) as exc:
                    self._unsaved[job_id] = record
                    self._failed(exc)
                    continue
                if record.model.finished and job_id in self._records:
                    record.logs.close()
                    del self._records[job_id]

    def _loop(self) -> None:
        last_beat = 0.0
        while True:
            if self._wake.wait(POLL_S):
                self._urgent.wait(BATCH_S)  # the rest of the batch, unless a teardown is due
            self._wake.clear()
            self._urgent.clear()
            self._pending = False
            try:
                self.drain()
                with self._lock:
                    records = dict(self._records)
                for request in self.registry.open_requests(list(records)):
                    if request.id not in self._answers:
                        self._answers[request.id] = records[request.job].obey(request)
                for request_id, outcome in list(self._answers.items()):
                    self.registry.answer(request_id, outcome)  # also once its job is gone
                    del self._answers[request_id]
                if time.monotonic() - last_beat > JOB_HEARTBEAT_S:
                    self.registry.beat(list(records))
                    last_beat = time.monotonic()
            except (sqlite3.Error, OSError) as exc:
                self._failed(exc)
            except Exception:
                log.exception("jupyter_mn: the job recorder failed (retrying)")
            else:
                self._failing = bool(self._unsaved)

    def _failed(self, exc: BaseException) -> None:
        """One warning while the registry cannot be written (disk full), not one per poll."""
        if not self._failing:
            log.warning("jupyter_mn: cannot write the job registry (%s); retrying", exc)
        self._failing = True


_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def track(owner: GangOwner, gang: Gang) -> None:
    """Record ``gang`` (not started yet) in the registry; never fails the cell."""
    global _recorder
    try:
        with _recorder_lock:
            if _recorder is None:
                _recorder = Recorder()
        _recorder.track(owner, gang)
    except Exception:
        log.exception("jupyter_mn: the job registry is not available; the job is not recorded")


def _notebook() -> str | None:
    """Jupyter server tells a kernel its notebook in ``JPY_SESSION_NAME`` (an absolute path)."""
    return os.environ.get("JPY_SESSION_NAME") or None


def _launcher() -> str:
    """What started this process (``papermill … in.ipynb out.ipynb``, ``jupyter-lab``, …), with
    what looks like a credential masked (``--IdentityProvider.token=***``, ``-p password ***``):
    the registry is shown by ``jupyter mn list``, the REST API and the panel."""
    import psutil

    from ..model.credentials import mask_argv

    with contextlib.suppress(psutil.Error):
        parent = psutil.Process().parent()
        command = parent.cmdline() if parent is not None else []
        if command:
            return " ".join(mask_argv([os.path.basename(command[0]), *command[1:]]))[:300]
    return ""
