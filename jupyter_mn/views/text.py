"""Plain-text view: rank-labelled lines on stdout/stderr as they arrive, a table at the end.

Used under papermill and wherever no widget frontend is attached. It is called on the kernel's
main thread, so ipykernel routes what it prints to the running cell.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from ..events import CellDone, GangState, LogLines, Stacks, TransportReport
from ..spec import ClusterSpec
from .stacks import format_stacks
from .state import CellState
from .straggler import hints
from .summary import evidence, final, header

#: Cells at least this long end with the per-rank table even when nothing went wrong.
TABLE_AFTER_S = 10.0


class TextView:
    """Consumes gang events; writes ``[node N rank R] line`` for every output line."""

    def __init__(
        self,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        *,
        spec: ClusterSpec | None = None,
        title: str = "cell",
    ) -> None:
        spec = spec or ClusterSpec()
        self._stdout = stdout
        self._stderr = stderr
        self.state = CellState(
            title, spec.shape, spec.backend, spec.nodes, spec.rdma, ranks=spec.ranks
        )
        self._warned: set[int] = set()
        #: this cell brought the gang up: its first table says where the ranks run
        self._cold = False

    def __call__(self, event: Any) -> None:
        self.state.apply(event)
        if isinstance(event, LogLines):
            self._lines(event)
        elif isinstance(event, GangState):
            self._gang(event)
        elif isinstance(event, TransportReport):
            self._transport(event)
        elif isinstance(event, CellDone):
            self._final()
        elif isinstance(event, Stacks):
            out = self._out("err")
            out.write(format_stacks(event) + "\n")
            out.flush()
        elif hasattr(event, "text"):  # Note, NodesWaiting
            self._note(event.text)

    def close(self) -> None:
        """Nothing to release: text is written as events arrive."""

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

    def _gang(self, event: GangState) -> None:
        if event.state == "SCHEDULING":
            self._note(f"starting a {event.detail} gang …")
        elif event.state == "READY" and event.detail:
            self._cold = True
            self._note(f"gang up: ranks run on {event.detail}")
            if "cuda" not in event.detail:
                self._note("no CUDA GPU: each --gpus slot is a CPU rank (gloo backend)")
        elif event.state == "BROKEN":
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
            done = self.state.done
            worth = (
                self._cold
                or self._warned
                or done is None
                or not done.ok
                or done.elapsed >= TABLE_AFTER_S
                or bool(hints(done.ranks))
            )
            lines = [header(self.state), *final(self.state)] if worth else []
        if lines:
            self._note("\n".join(lines))

    def _note(self, text: str, stream: str = "out") -> None:
        out = self._out(stream)
        out.write(f"jupyter_mn: {text}\n")
        out.flush()
