"""``%%cluster --bg``: a cell that runs while the notebook stays free, and its handle.

The handle is a future in the ipyparallel ``AsyncResult`` / dask ``Future`` tradition:
``done()``, ``result()`` (rank 0's value, or the cell's ``CellError``), plus ``output`` (the ranks'
labelled lines so far, kept here rather than printed into whichever cell runs at the time),
``stacks()`` (where every rank is now) and ``cancel()`` (the same escalation as Ctrl-C).
``%cluster last`` gives the newest one back (``h = %cluster last``), as ipyparallel's
``%pxresult`` does: ``_`` is the newest value of any cell, not this one.
A handle lives as long as the kernel holds it, so ``output`` keeps only the newest lines; the
job's log files (``joblogs.py``) keep every one. A cluster runs one at a time (``jobslot.py``).
Where a foreground cell gets the widget, the handle shows as the same live view, drawn while
the cell runs and folded once it ends; the cell's output is that view, not the handle's text.
"""

from __future__ import annotations

import concurrent.futures
import io
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from IPython.display import display

from ..views import background_view
from ..views.stacktext import format_stacks
from ..views.text import TextView

if TYPE_CHECKING:
    from ..gang import Gang
    from ..model.result import CellResult
    from ..model.spec import ClusterSpec
    from ..wire.events import OnEvent, Stacks

#: Lines a handle's ``output`` keeps (about 1 MB of typical lines).
OUTPUT_LINES = 10_000


class RecentLines(io.TextIOBase):
    """A text stream that keeps its newest ``limit`` lines and counts those it let go."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._lines: deque[str] = deque(maxlen=limit)
        self._partial = ""
        self._lock = threading.Lock()
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            *done, self._partial = (self._partial + text).split("\n")
            self.dropped += max(0, len(self._lines) + len(done) - self._lines.maxlen)
            self._lines.extend(done)
        return len(text)

    def getvalue(self) -> str:
        with self._lock:
            return "".join(f"{line}\n" for line in self._lines) + self._partial


class CellOwner(Protocol):
    """What a background cell asks of its cluster (``Cluster`` is one): the job's name, and
    stopping and looking at the cell."""

    @property
    def spec(self) -> ClusterSpec: ...

    @property
    def gang(self) -> Gang | None: ...

    def cancel(self, reason: str) -> bool: ...

    def stacks(self) -> Stacks: ...


class OutputText(str):
    """A handle's ``output``: a ``str``, shown in a notebook as the lines it holds (a plain
    ``str`` shows as its repr, one line of ``\\n`` escapes)."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.rstrip("\n"))


class BackgroundCell:
    """A cell running on the gang in a background thread."""

    def __init__(
        self, cluster: CellOwner, cell_id: int, run: Callable[[OnEvent], CellResult]
    ) -> None:
        self.cluster = cluster
        self.cell_id = cell_id
        self.started = time.monotonic()
        self._ended: float | None = None
        self._buffer = RecentLines(OUTPUT_LINES)
        #: its table says the gang's shape and the cell's number, as a foreground cell's does
        spec = cluster.spec
        title = spec.name or f"cell {cell_id}"
        self._text = TextView(self._buffer, self._buffer, spec=spec, title=title, displays=False)
        self._live = background_view(spec, title, cell_id)
        #: the live view is on screen, and the cell has ended: each moves once, under the lock
        self._live_shown = False
        self._lock = threading.Lock()
        self._job = ""
        self._future: concurrent.futures.Future[CellResult] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._work, args=(run,), name=f"jupyter-mn-bg-{cell_id}", daemon=True
        )
        self._thread.start()

    def _work(self, run: Callable[[OnEvent], CellResult]) -> None:
        try:
            self._future.set_result(run(self._view))
        except BaseException as exc:  # handed to whoever asks for the result
            self._future.set_exception(exc)
        finally:
            with self._lock:
                self._ended = time.monotonic()
                if self._live_shown:
                    self._live.close()  # folds it: its final state, one model

    def _view(self, event: Any) -> None:
        if not self._job and self.cluster.gang is not None:  # events come once the gang exists
            self._job = self.cluster.spec.name or self.cluster.gang.core.id
        self._text(event)
        if self._live is not None:
            self._live(event)

    @property
    def _ipython_display_(self) -> Callable[[], None]:
        """Where the widget renders, the handle shows as the cell's live view (IPython looks
        this up; without a live view it finds none and shows ``repr``)."""
        if self._live is None:
            raise AttributeError("_ipython_display_")
        return self._show_live

    def _show_live(self) -> None:
        """The first showing (the cell's own ``Out``, on the kernel's main thread) draws the
        view and starts its updates; a later one (``h`` in another cell) shows it again."""
        assert self._live is not None
        with self._lock:
            if self._live_shown:
                display(self._live)
                return
            self._live.show()
            self._live_shown = True
            if self._ended is not None:  # it ended before it was shown
                self._live.close()

    def done(self) -> bool:
        return self._future.done()

    def runs_here(self) -> bool:
        return threading.current_thread() is self._thread

    def cell_result(self, timeout: float | None = None) -> CellResult:
        """The ``CellResult`` (failures as values); waits up to ``timeout`` seconds."""
        return self._future.result(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's value (every rank's with ``--all``), or raise the cell's ``CellError``."""
        return self.cell_result(timeout).unwrap()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the cell ends; True if it did."""
        concurrent.futures.wait([self._future], timeout)
        return self.done()

    @property
    def output(self) -> OutputText:
        """What the ranks printed so far, ``[node N rank R]``-labelled: the newest
        ``OUTPUT_LINES`` lines, after a note on where the earlier ones are."""
        text, dropped = self._buffer.getvalue(), self._buffer.dropped
        if not dropped:
            return OutputText(text)
        return OutputText(
            f"jupyter_mn: {dropped} earlier line(s) are not kept here: "
            f"`jupyter mn logs {self._job}` shows every line\n{text}"
        )

    def cancel(self) -> None:
        """Stop the cell as Ctrl-C would: stacks, SIGINT, the destroy cascade, then kill."""
        if not self.done():
            self.cluster.cancel(f"background cell In[{self.cell_id}] was cancelled")

    def stacks(self) -> str:
        """Where every rank's main thread is now, in the cell's own line numbers."""
        return format_stacks(self.cluster.stacks())

    @property
    def elapsed(self) -> float:
        return (self._ended or time.monotonic()) - self.started

    def __repr__(self) -> str:
        if not self.done():
            state = "running"
        elif self._future.exception() is not None:
            state = f"failed ({type(self._future.exception()).__name__})"
        else:
            state = "done" if self._future.result().ok else "failed"
        return (
            f"<BackgroundCell In[{self.cell_id}]: {state} after {self.elapsed:.1f} s; "
            ".result(), .output, .stacks(), .cancel()>"
        )
