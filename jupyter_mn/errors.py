"""One exception hierarchy, rendered short in notebooks.

IPython calls ``_render_traceback_`` instead of printing library frames, so a user sees what went
wrong (and on which rank) rather than jupyter_mn's internals. ``ename`` stays the class name, so
papermill and nbclient still report e.g. ``CellError``.
"""

from __future__ import annotations

from typing import Any


class JupyterMNError(Exception):
    """Root of every error jupyter_mn raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class SpecError(JupyterMNError, ValueError):
    """Bad input: raised before anything is launched."""


class CaptureError(SpecError):
    """A notebook variable the cell reads cannot be sent to the ranks."""


class ClusterBusy(JupyterMNError):
    """A cell is already running on this gang (one at a time, e.g. a ``--bg`` cell)."""


class DebugUnavailable(JupyterMNError):
    """``%cluster debug`` cannot open pdb: no failed cell, a rank that did not fail or is gone,
    a frontend that cannot prompt."""


class SchedulingError(JupyterMNError):
    """The backend could not provide all nodes of the gang (all or nothing)."""


class PreflightError(SchedulingError):
    """A preflight check failed on some node; carries the doctor's table with a fix per ✘."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}", *str(self.report or "").splitlines()]


class RendezvousError(JupyterMNError):
    """Ranks started but did not form a process group."""


class JoinTimeout(RendezvousError):
    """A node's ranks did not join in time: often because another node's rank failed first,
    so the gang reports another node's error before this one."""


class TransportError(JupyterMNError):
    """The interconnect is not what was required (e.g. ``--require-rdma`` on a socket fallback)."""


class CheckpointError(JupyterMNError):
    """A checkpoint is missing, incomplete, or was written by a gang of another size."""


class Stopped(JupyterMNError):
    """A node command or the doctor was stopped on request (Cancel, ``--max-runtime``)."""


class CellError(JupyterMNError):
    """The cell failed on at least one rank; carries the root-cause rank and its traceback, and
    ``result``: the cell's ``CellResult`` (``model/result.py``, which builds this error: typed
    ``Any`` here, since every process imports this module and none but the kernel that one)."""

    def __init__(
        self,
        message: str,
        result: Any = None,
        traceback: list[str] | None = None,
        notes: list[str] | None = None,
    ):
        super().__init__(message)
        self.result = result
        self.traceback = traceback or []
        self.notes = notes or []

    def _render_traceback_(self) -> list[str]:
        head = [f"{type(self).__name__}: {self}"]
        return head + self.traceback + self.notes


class RankLost(CellError):
    """A rank process died (signal, exit, OOM) while the gang was up."""


class NodeLost(RankLost):
    """A node's agent (its dask worker) went away, and its ranks with it: the gang is broken."""


class FilesNotSent(JupyterMNError):
    """A node's copy of the notebook's directory could not be brought up to date (its agent was
    lost, its disk is full): the gang is torn down, and the next cell starts a fresh one."""


class NodeUnreachable(JupyterMNError):
    """A node's agent has not answered the kernel's heartbeat within ``liveness_timeout``: its
    link is cut or its host is frozen (no FIN, no RST: nothing else would tell for minutes)."""


class Preempted(CellError):
    """A node of the gang was told to go (SIGTERM: a Slurm preemption or time limit, a pod's
    deletion); ``node``, ``cause`` and the ``checkpoint`` completed during the grace period
    ("" when none was) say what happened. ``--retries`` runs the cell again on a new gang."""

    def __init__(
        self,
        message: str,
        result: Any = None,
        *,
        node: int,
        cause: str,
        checkpoint: str = "",
        notes: list[str] | None = None,
    ) -> None:
        super().__init__(message, result=result, notes=notes)
        self.node, self.cause, self.checkpoint = node, cause, checkpoint


class CellInterrupted(CellError):
    """The cell was interrupted (Ctrl-C / stop button) or hit ``--timeout``."""
