"""Plain-text view: rank-labelled lines on stdout/stderr as they arrive, a table at the end.

Used under papermill and wherever no widget frontend is attached. It is called on the kernel's
main thread, so ipykernel routes what it prints to the running cell. A line still being written
``PARTIAL_AFTER_S`` after it began (a progress bar) is printed as a line at most every
``PARTIAL_EVERY_S`` while it changes; its final state is the finished line, printed like any
other. A line finished sooner (one written in pieces) is printed once, finished.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ..model.spec import ClusterSpec
from ..wire.events import (
    CellDone,
    Displays,
    GangState,
    GangStatus,
    Hung,
    LogLines,
    NodesWaiting,
    Note,
    Preemption,
    Stacks,
    TransportReport,
)
from .cellstate import CellState
from .displays import RankDisplays
from .stacktext import format_stacks
from .summary import evidence, final, header

#: A progress bar's state is printed at most this often (a saved notebook keeps every print).
PARTIAL_EVERY_S = 5.0
#: An unfinished line is a progress bar once it has been unfinished this long.
PARTIAL_AFTER_S = 1.0


class TextView:
    """Consumes gang events; writes ``[node N rank R] line`` for every output line."""

    def __init__(
        self,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        *,
        spec: ClusterSpec | None = None,
        title: str = "cell",
        displays: bool = True,
    ) -> None:
        """``displays``: show rank 0's displays in the running cell (not for a background cell,
        whose displays stay on its handle)."""
        spec = spec or ClusterSpec()
        self._stdout = stdout
        self._stderr = stderr
        self.state = CellState(
            title, spec.shape, spec.backend, spec.nodes, spec.rdma, ranks=spec.ranks
        )
        self._warned: set[int] = set()
        self.displays = RankDisplays() if displays else None
        #: per (node, rank, stream): when a progress state was last printed, and what
        self._printed: dict[tuple[int, int, str], tuple[float, str]] = {}
        #: per (node, rank, stream): the newest progress state not printed yet
        self._held: dict[tuple[int, int, str], str] = {}
        #: per (node, rank, stream): when its unfinished line was first seen
        self._begun: dict[tuple[int, int, str], float] = {}
        #: this cell brought the gang up: its first table says where the ranks run
        self._cold = False
        #: the stacks printed last: a stop that finds the ranks where a hang left them says so
        #: in a line, not in the same stacks again
        self._stacks_shown: Stacks | None = None
        #: a hang verdict was printed (the watchdog's): the cell's error does not repeat it
        self.verdict_shown = False

    def __call__(self, event: Any) -> None:
        self.state.apply(event)
        if self._held:
            self._partials(())
        if isinstance(event, LogLines):
            self._lines(event)
        elif isinstance(event, Displays):
            if self.displays is not None:
                self.displays(event)
        elif isinstance(event, GangState):
            self._gang(event)
        elif isinstance(event, TransportReport):
            self._transport(event)
        elif isinstance(event, CellDone):
            self._final()
        elif isinstance(event, Hung) and event.over:  # its verdict came with its stacks
            self._note("the ranks progress again (the hang is over)")
        elif isinstance(event, Preemption):
            self._note(
                f"{self.state.label}: {event.cause.text}; checkpoint.preempted() returns "
                "True on every rank from its next call",
                stream="err",
            )
        elif isinstance(event, Stacks):
            self._stacks(event)
        elif isinstance(event, (Note, NodesWaiting)):
            self._note(event.text)

    def close(self) -> None:
        """Nothing to release: text is written as events arrive."""

    def follow(self, gang: Any) -> None:
        """Nothing to follow: a re-form's outcome is printed by the next cell."""

    def _out(self, stream: str = "out") -> TextIO:
        if stream == "err":
            return self._stderr or sys.stderr
        return self._stdout or sys.stdout

    def _lines(self, event: LogLines) -> None:
        for rank, stream, lines in event.items:
            if not self.state.shows(rank):
                continue
            prefix = f"[node {event.node} rank {rank}] "
            out = self._out(stream)
            out.write("".join(f"{prefix}{line}\n" for line in lines))
            out.flush()
            for started in (self._held, self._printed, self._begun):  # the next bar starts afresh
                started.pop((event.node, rank, stream), None)
        self._partials(
            ((event.node, rank, stream), text)
            for rank, stream, text in event.partial
            if self.state.shows(rank)
        )

    def _partials(self, changes: Any) -> None:
        """Hold each new progress state; print those of bars (lines unfinished for a while)
        whose key has not printed for a while."""
        now = time.monotonic()
        for key, text in changes:
            if text:
                self._held[key] = text
                self._begun.setdefault(key, now)
            else:
                self._held.pop(key, None)
        for key, text in list(self._held.items()):
            at, last = self._printed.get(key, (-PARTIAL_EVERY_S, ""))
            if now - at < PARTIAL_EVERY_S or now - self._begun[key] < PARTIAL_AFTER_S:
                continue
            del self._held[key]
            if text != last:
                node, rank, stream = key
                out = self._out(stream)
                out.write(f"[node {node} rank {rank}] {text}\n")
                out.flush()
                self._printed[key] = (now, text)

    def _stacks(self, event: Stacks) -> None:
        last, self._stacks_shown = self._stacks_shown, event
        out = self._out("err")
        if last is not None and _where(last) == _where(event):
            out.write(f"jupyter_mn: {event.reason}; every rank is where the stacks above show\n")
        else:
            same_verdict = last is not None and last.verdict == event.verdict
            verdict = not same_verdict and not event.stop  # a stop's: its error says it
            self.verdict_shown |= verdict and bool(event.verdict)
            out.write(format_stacks(event, verdict=verdict) + "\n")
        out.flush()

    def _gang(self, event: GangState) -> None:
        if event.state == GangStatus.SCHEDULING:
            self._note(f"starting a {event.detail} gang …")
        elif event.state == GangStatus.READY and event.detail:
            self._cold = True
            self._note(f"gang up: ranks run on {event.detail}")
            if "cuda" not in event.detail:
                self._note("no CUDA GPU: each --gpus slot is a CPU rank (gloo backend)")
        elif event.state == GangStatus.BROKEN:
            self._note(f"gang broken: {event.detail}", stream="err")

    def _transport(self, event: TransportReport) -> None:
        if self.state.alarm(event.node) and event.node not in self._warned:
            self._warned.add(event.node)
            why = "ranks run gloo on CPU" if event.backend == "gloo" else "NCCL uses TCP sockets"
            proof = evidence(event)
            self._note(
                f"WARNING node {event.node}: --rdma was asked for but {why}"
                + (f"\n  {proof}" if proof else ""),
                stream="err",
            )

    def _final(self) -> None:
        """The table, when it says something: a trivial warm cell ends without one."""
        with self.state.lock:
            worth = self._cold or self._warned or self.state.notable()
            lines = [header(self.state), *final(self.state)] if worth else []
        if lines:
            self._note("\n".join(lines))

    def _note(self, text: str, stream: str = "out") -> None:
        out = self._out(stream)
        out.write(f"jupyter_mn: {text}\n")
        out.flush()


def _where(event: Stacks) -> list[tuple[int, bool, str, tuple[str, ...]]]:
    """What a rank's stack says, without when it was taken."""
    return [(r.rank, r.busy, r.note, tuple(r.stack)) for r in event.ranks]
