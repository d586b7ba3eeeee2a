"""Plain-text view: rank-labelled lines on stdout/stderr as they arrive.

Used under papermill and wherever no widget frontend is attached. It is called on the kernel's
main thread, so ipykernel routes what it prints to the running cell.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from ..events import GangState, LogLines, Notice, Stacks


class TextView:
    """Consumes gang events; writes ``[node N rank R] line`` for every output line."""

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._started: float | None = None

    def __call__(self, event: Any) -> None:
        if isinstance(event, LogLines):
            self._lines(event)
        elif isinstance(event, GangState):
            self._gang(event)
        elif isinstance(event, Notice):
            self._note(event.text)
        elif isinstance(event, Stacks):
            out = self._out("err")
            out.write(format_stacks(event) + "\n")
            out.flush()

    def _out(self, stream: str = "out") -> TextIO:
        if stream == "err":
            return self._stderr or sys.stderr
        return self._stdout or sys.stdout

    def _lines(self, event: LogLines) -> None:
        for rank, stream, lines in event.items:
            prefix = f"[node {event.node} rank {rank}] "
            out = self._out(stream)
            out.write("".join(f"{prefix}{line}\n" for line in lines))
            out.flush()

    def _gang(self, event: GangState) -> None:
        if event.state == "SCHEDULING":
            self._note(f"starting a {event.detail} gang …")
        elif event.state == "READY" and event.detail:
            self._note(f"gang up: ranks run on {event.detail}")
            if "cuda" not in event.detail:
                self._note("no CUDA GPU: each --gpus slot is a CPU rank (gloo backend)")
        elif event.state == "BROKEN":
            self._note(f"gang broken: {event.detail}", stream="err")

    def _note(self, text: str, stream: str = "out") -> None:
        out = self._out(stream)
        out.write(f"jupyter_mn: {text}\n")
        out.flush()


def format_stacks(event: Stacks) -> str:
    """Every rank's stack, innermost last, under a ``[node N rank R]`` heading."""
    lines = [f"jupyter_mn: {event.reason}; where each rank is (innermost last):"]
    for node, rank, busy, stack, note in event.ranks:
        state = note or ("running" if busy else "idle (done with this cell)")
        lines.append(f"[node {node} rank {rank}] {state}")
        lines += [f"    {line}" for line in stack]
    return "\n".join(lines)
