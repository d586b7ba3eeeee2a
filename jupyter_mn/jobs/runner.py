"""``python -m jupyter_mn.jobs.runner``: one submitted run, in a session of its own.

``submit.py`` starts it, records its job, then writes its ``Submission`` to its stdin. It runs
the notebook under papermill with the jupyter_mn kernel and is the one writer of the job's row:
RUNNING with the cell it is at, then SUCCEEDED, FAILED with the cause, or CANCELLED. The cells'
outputs (a ``%%cluster`` cell's include its ranks' lines) go to the job's log (``joblogs.py``);
papermill saves the executed notebook when each cell starts and ends, and every ``AUTOSAVE_S``
within a long one, so a crash loses no finished cell. At the run's end, what its gangs used goes
into the notebook's metadata and the run's row (``runusage.py``).

A cancel or release request (``jupyter mn cancel``, the Multi-node jobs panel) interrupts the
running cell and runs no further one; the kernel is then shut down through its shutdown request,
which closes its gangs first (``kernel/kernelshutdown.py``); a kernel still running ``KILL_AFTER_S``
later is killed. A kernel that dies ends the run FAILED with the cause, and what its gangs left
is cleaned up as ``jupyter mn gc`` would.

On Slurm (``slurmrun.py``) it is the batch step of the run's job. It takes the row over when it
starts (its host and pid), and Slurm's SIGTERM (a requeue, a ``scancel``, ``--time``) ends the
run at once: SUBMITTED again when the job is requeued and ``--retries`` allow, else FAILED.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from papermill.iorw import LocalHandler, papermill_io

from ..wire.events import LogLines
from . import runcell, runusage
from .gc import clean
from .joblogs import OUTPUT_RANK, JobLogWriter
from .registry import HOST, JOB_HEARTBEAT_S, ORPHANED, Registry, Request
from .runstate import RunState
from .submit import KERNEL, Submission, counted_cell
from .wholefile import write_whole

POLL_S = 0.25
#: Seconds between papermill's saves of the executed notebook within one long cell.
AUTOSAVE_S = 10
#: Seconds a cancelled run's kernel has to stop its cell before it is killed.
KILL_AFTER_S = 20.0


class Cancelled(Exception):
    """Raised at the next cell's start once the run is cancelled."""


class StoppedBySlurm(BaseException):
    """Raised by SIGTERM in a Slurm run: Slurm stops every process of the job (a requeue, a
    ``scancel``, ``--time``), so the run's row is written now, within Slurm's ``KillWait``.
    A ``BaseException``, as ``KeyboardInterrupt``, so that no cell-level handler swallows it."""


class OutputLog:
    """A file-like sink for papermill's ``stdout_file``/``stderr_file``: whole lines into the
    job's log, a line's unfinished end kept for the next write."""

    def __init__(self, logs: JobLogWriter, stream: str) -> None:
        self.logs, self.stream = logs, stream
        self._rest = ""

    def write(self, text: str) -> None:
        *lines, self._rest = (self._rest + text).split("\n")
        if lines:
            self.logs.write(LogLines(0, 0, ((OUTPUT_RANK, self.stream, tuple(lines)),)))

    def flush(self) -> None:
        if self._rest:
            self.write("\n")


class WholeFiles(LocalHandler):
    """Papermill's I/O for local paths, its saves written whole (``wholefile.py``): the
    executed notebook is opened when written, not when submitted, and a link placed at ``-o
    OUT`` meanwhile is replaced rather than followed."""

    def write(self, buf: str, path: str) -> None:
        write_whole(Path(path), buf)


class Run:
    def __init__(self, submission: Submission, registry: Registry) -> None:
        from jupyter_client.manager import AsyncKernelManager

        self.submission, self.registry = submission, registry
        self.model = registry.job(submission.job)
        self.logs = JobLogWriter(registry.log_dir(submission.job))
        #: nbclient's own kind: its waits call the manager from inside its event loop
        self.km = AsyncKernelManager(kernel_name=KERNEL)
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()
        #: the Slurm job this run is the batch step of ("" for a local run)
        self.slurm_job = os.environ.get("SLURM_JOB_ID", "") if self.model.backend == "slurm" else ""
        #: while papermill runs: a SIGTERM then stops the run (``StoppedBySlurm``)
        self._executing = False
        #: when the cell running now (the last one, at the end) started
        self._cell_at = time.time()

    def update(self, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(self.model, name, value)
            self.model.heartbeat = time.time()
            self.registry.save(self.model)

    def run(self) -> None:
        import papermill
        from nbclient.exceptions import DeadKernelError
        from papermill.cli import _resolve_type  # the types papermill's own ``-p`` gives

        papermill_io.register("/", WholeFiles())  # every path here is absolute (``prepare``)
        os.environ.update(self.submission.secrets)  # the kernel's, as a kernel's own --env
        if self.slurm_job and not self._slurm_start():
            self.logs.close()
            return
        self.update(state=RunState.RUNNING.value, detail="starting the kernel")
        watcher = threading.Thread(target=self._watch, name="jupyter-mn-run-watch", daemon=True)
        watcher.start()
        outcome: dict[str, Any] = {"state": RunState.SUCCEEDED.value, "detail": ""}
        try:
            self._executing = True  # a SIGTERM from here on raises StoppedBySlurm
            try:
                papermill.execute_notebook(
                    self.submission.notebook,
                    self.submission.output,
                    parameters={k: _resolve_type(v) for k, v in self.submission.parameters.items()},
                    kernel_name=KERNEL,
                    language="python",  # the kernel's, whatever the notebook's metadata says
                    progress_bar=False,
                    request_save_on_cell_execute=True,
                    autosave_cell_every=AUTOSAVE_S,
                    stdout_file=OutputLog(self.logs, "out"),
                    stderr_file=OutputLog(self.logs, "err"),
                    km=self.km,
                    on_cell_start=self._cell_started,
                )
            finally:
                self._executing = False
        except StoppedBySlurm:
            outcome = self._stopped_by_slurm()
            self.update(**outcome)  # now: Slurm kills this process KillWait after its SIGTERM
        except Cancelled:
            outcome = self._cancelled()
        except papermill.PapermillExecutionError as exc:
            progress = f"cell {self.model.cells} of {self.model.cells_total}"
            outcome = (
                self._cancelled()
                if self.cancelled.is_set()  # the interrupted cell raised KeyboardInterrupt
                else {
                    **self._failed(f"{progress}: {exc.ename}: {exc.evalue}"),
                    "last_cell": runcell.failed(exc, time.time() - self._cell_at),
                }
            )
        except DeadKernelError:
            outcome = self._failed(f"the kernel died ({self._exit()})")
        except Exception as exc:  # papermill, nbclient or the kernel spec: the run cannot go on
            outcome = self._failed(f"{type(exc).__name__}: {exc}")
        finally:
            kernel_pid = self._stop_kernel()
            self.done.set()
        if outcome["state"] == RunState.SUCCEEDED.value:
            done = runcell.succeeded(Path(self.submission.output), time.time() - self._cell_at)
            outcome["last_cell"] = done
        if outcome["state"] == RunState.SUBMITTED.value:  # requeued: the run starts over
            self.logs.mark(1, f"requeued by Slurm {time.strftime('%H:%M:%S')}")
        else:
            usage = self._usage(outcome["state"]) if kernel_pid is not None else {}
            self.update(**outcome, **usage, ended=time.time())
            self.logs.mark(1, f"{outcome['state']} {time.strftime('%H:%M:%S')}")
        self.logs.close()

    # ---- a Slurm run (``slurmrun.py``): its start, and Slurm's SIGTERM
    def _slurm_start(self) -> bool:
        """Take the row over on this node; False when the run is not to run (cancelled while
        queued, or requeued more often than ``--retries``)."""
        from . import slurmrun

        if self.model.finished:
            return False
        restarts, retries = slurmrun.restarts(), self.submission.retries
        if restarts > retries:
            cause = f"Slurm requeued the run {restarts} times; --retries {retries}"
            self.update(**self._failed(cause), ended=time.time())
            return False
        signal.signal(signal.SIGTERM, self._sigterm)
        job = f"Slurm job {self.slurm_job}" + (f", restart {restarts}" if restarts else "")
        self.logs.mark(1, f"{job} on {HOST} {time.strftime('%H:%M:%S')}")
        # the row's host and pid are now this runner's (``kernel_alive``: started after it)
        self.update(host=HOST, pid=os.getpid(), started=time.time(), cells=0, detail=job)
        return True

    def _sigterm(self, signum: int, frame: Any) -> None:
        if self._executing:
            self._executing = False
            raise StoppedBySlurm

    def _stopped_by_slurm(self) -> dict[str, Any]:
        """The run's end, or its requeue: Slurm has counted a requeue up before it stops it."""
        from ..errors import JupyterMNError
        from ..gang.slurm import commands
        from . import slurmrun

        progress = f"cell {self.model.cells} of {self.model.cells_total}"
        if self.cancelled.is_set():
            return self._cancelled()
        try:
            requeued = commands.restarts(self.slurm_job) > slurmrun.restarts()
        except JupyterMNError:
            requeued = False
        if not requeued:
            return self._failed(f"stopped by Slurm at {progress} (scancel, --time or a node lost)")
        if slurmrun.restarts() >= self.submission.retries:
            return self._failed(f"requeued by Slurm at {progress}; no --retries left")
        detail = f"requeued by Slurm at {progress}; starts over when the job runs again"
        return {"state": RunState.SUBMITTED.value, "detail": detail}

    def _cancelled(self) -> dict[str, Any]:
        detail = f"cancelled at cell {self.model.cells} of {self.model.cells_total}"
        return {"state": RunState.CANCELLED.value, "detail": detail}

    def _failed(self, cause: str) -> dict[str, Any]:
        return {"state": RunState.FAILED.value, "detail": cause, "error": cause}

    def _cell_started(self, cell: Any, cell_index: int, **_: Any) -> None:
        if self.cancelled.is_set():
            raise Cancelled
        if not counted_cell(cell):  # papermill's injected parameters are not the notebook's
            return
        self._cell_at = time.time()
        cells = self.model.cells + 1
        progress = f"cell {cells} of {self.model.cells_total}"
        self.logs.mark(1, f"{progress} started {time.strftime('%H:%M:%S')}")
        self.update(cells=cells, detail=progress)

    # ---- the watcher thread: requests, heartbeat, the cancel's kill
    def _watch(self) -> None:
        beat = kill_at = 0.0
        while not self.done.wait(POLL_S):
            for request in self.registry.open_requests([self.model.id]):
                self.registry.answer(request.id, self._obey(request))
                kill_at = kill_at or time.monotonic() + KILL_AFTER_S
            if kill_at and time.monotonic() > kill_at:
                self._signal(signal.SIGKILL)
                kill_at = float("inf")
            if time.monotonic() - beat > JOB_HEARTBEAT_S:
                self.registry.beat([self.model.id])
                beat = time.monotonic()

    def _obey(self, request: Request) -> str:
        """A cancel and a release alike end the run."""
        self.cancel()
        return "cancelling the run"

    def cancel(self) -> None:
        """End the run: no further cell; the running one stopped as by Ctrl-C (a ``%%cluster``
        cell stops its ranks)."""
        self.cancelled.set()
        self._signal(signal.SIGINT)

    def _signal(self, sig: signal.Signals) -> None:
        process = getattr(self.km.provisioner, "process", None)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)

    def _exit(self) -> str:
        process = getattr(self.km.provisioner, "process", None)
        code = process.poll() if process is not None else None
        if code is None:
            return "it stopped answering"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def _usage(self, state: str) -> dict[str, Any]:
        """Write what the kernel's gangs used into the executed notebook; returns the run row's
        total (its largest unit's), or nothing when no gang was made."""
        gangs = runusage.gangs_of(self.registry.jobs(), self.model.id)
        try:
            runusage.write(
                Path(self.submission.output), runusage.metadata(self.model, state, gangs)
            )
        except FileNotFoundError:  # papermill never wrote it: nothing to mark
            pass
        except (OSError, ValueError) as exc:  # the run's end is still recorded
            line = f"the executed notebook's usage metadata was not written: {exc}"
            self.logs.write(LogLines(0, 0, ((OUTPUT_RANK, "err", (line,)),)))
        totals = runusage.totals(gangs)
        if not totals:
            return {}
        unit, hours = max(totals.items(), key=lambda total: total[1])
        return {"unit": unit, "gpu_hours": hours}

    def _stop_kernel(self) -> int | None:
        """Shut the kernel down (its gangs close first); clean up after a dead one's gangs.
        Returns the kernel's pid (None: it never started)."""
        process = getattr(self.km.provisioner, "process", None)
        pid = process.pid if process is not None else None
        alive = process is not None and process.poll() is None
        if self.km.has_kernel:
            from jupyter_core.utils import run_sync

            with contextlib.suppress(Exception):
                run_sync(self.km.shutdown_kernel)(now=not alive)
        if pid is not None and not alive:
            self._clean_gangs(pid)
        return pid

    def _clean_gangs(self, kernel_pid: int) -> None:
        self.registry.reap()
        for job in self.registry.jobs():
            if job.pid == kernel_pid and job.host == HOST and job.state == ORPHANED:
                for line in clean(job):
                    self.logs.write(LogLines(0, 0, ((OUTPUT_RANK, "err", (line,)),)))


def main() -> int:
    submission = Submission.from_json(sys.stdin.read())  # its end: submit recorded the job
    Run(submission, Registry()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
