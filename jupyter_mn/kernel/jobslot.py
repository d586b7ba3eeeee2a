"""One job at a time on a ``Cluster``'s gang, in the foreground or in the background.

A job is a cell, a script, a node command, the doctor or a post-mortem. While one runs another is
refused with ``ClusterBusy`` (a background cell's own jobs, on its thread, are its own); ``close``
and ``release`` from another thread stop the job and then wait here until it is over.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..errors import ClusterBusy
from .background import BackgroundCell, CellOwner
from .cell import compile_cell

if TYPE_CHECKING:
    from ..model.result import CellResult
    from ..wire.events import OnEvent


class JobSlot:
    """Which job runs on a cluster's gang (its thread), and its background cell."""

    def __init__(self, lock: threading.RLock) -> None:
        """``lock``: the cluster's; the slot is taken and given back under it."""
        self._lock = lock
        #: the running job's thread (None: none runs)
        self._busy: threading.Thread | None = None
        #: notified when the job ends
        self._quiet = threading.Condition(lock)
        self._background: BackgroundCell | None = None

    @property
    def busy(self) -> bool:
        return self._busy is not None

    @contextlib.contextmanager
    def hold(self, started: Callable[[], None], ended: Callable[[], None]) -> Iterator[None]:
        """The slot, for the job on this thread; ``started`` and ``ended`` run under the lock
        when it is taken and given back."""
        self.refuse_others()
        with self._lock:
            if self._busy is not None:
                raise ClusterBusy(self.busy_message())
            self._busy = threading.current_thread()
            started()
        try:
            yield
        finally:
            with self._lock:
                self._busy = None
                ended()
                self._quiet.notify_all()

    def wait_quiet(self) -> None:
        """Until the running job (stopped by the caller) is over, unless it runs on this thread
        (the caller holds the lock)."""
        self._quiet.wait_for(lambda: self._busy in (None, threading.current_thread()))

    def submit(
        self, cluster: CellOwner, cell_id: int, code: str, run: Callable[[OnEvent], CellResult]
    ) -> BackgroundCell:
        """``run`` (``code``'s cell) in the background, unless a background cell still runs."""
        if self._background is not None and not self._background.done():
            raise ClusterBusy(self.busy_message())
        compile_cell(code)  # a syntax error is the caller's, now
        self._background = BackgroundCell(cluster, cell_id, run)
        return self._background

    def refuse_others(self) -> None:
        """Raise ``ClusterBusy`` while a background cell runs, unless on its own thread."""
        cell = self._background
        if cell is not None and not cell.done() and not cell.runs_here():
            raise ClusterBusy(self.busy_message())

    def busy_message(self) -> str:
        cell = f"In[{self._background.cell_id}]" if self._background is not None else ""
        return (
            f"background cell {cell} is still running on this gang (one cell at a time): "
            "wait for it (handle.result()) or stop it (handle.cancel())"
        )
