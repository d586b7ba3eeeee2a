"""A rank process's stdout and stderr, read line by line on the agent's event loop.

Both kinds of rank handle own one (``process.py`` for cell ranks, ``script.py`` for script
ranks): lines go to the agent's log path as they come (the loop reads a pipe when it is
readable: a reader thread per pipe cost a cross-thread wake-up per sync mark, two a rank a
cell); the last ones are kept for error reports
(a fatal error report, e.g. a segfault, apart so the tail stays readable); the sync marks a cell
rank writes after each reply tell when a cell's output has been read to its end. A line still
being written (a progress bar redrawn with ``\\r``) is kept as a terminal shows it
(``lines.py``) and handed to the agent as it changes.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import subprocess
from collections import deque
from dataclasses import dataclass, field
from typing import IO

from ..rank import stacks
from ..rank.sync import SYNC_MARKER
from .lines import LineBuffer
from .link import NodeLink

TAIL_LINES = 20
#: Characters kept of one line (its head); the rest is counted and said when the line ends.
MAX_LINE = 10_000
#: Characters of an unfinished line sent live (a progress bar is far shorter).
MAX_PARTIAL = 1_000
_SYNC_WAIT_S = 2.0
_CRASH_LINES = 200


@dataclass
class _Stream:
    """One pipe's text not yet handed on."""

    name: str  # "out" or "err"
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    #: the line being written, as a terminal shows it
    line: LineBuffer = field(default_factory=lambda: LineBuffer(MAX_LINE))
    #: the start of a sync mark that a read cut in two
    held: str = ""
    #: the unfinished line as last handed to the agent
    shown: str = ""


class PipeReader:
    """Reads one process's pipes for rank ``rank`` and forwards its lines to the agent."""

    def __init__(self, agent: NodeLink, rank: int, err_lines: int = 0) -> None:
        self.agent = agent
        self.rank = rank
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        #: the last ``err_lines`` of stderr alone (a script's traceback is there)
        self.err_tail: deque[str] = deque(maxlen=err_lines)
        self.crash: list[str] = []
        #: sync marks read per stream, and how many the agent waits for
        self.markers = {"out": 0, "err": 0}
        self.expected = 0
        self.open_streams = {"out", "err"}
        self._change = asyncio.Event()

    def start(self, proc: subprocess.Popen[bytes]) -> None:
        """Read ``proc``'s pipes from now on (called on the agent's event loop)."""
        loop = asyncio.get_running_loop()
        for stream, pipe in (("out", proc.stdout), ("err", proc.stderr)):
            assert pipe is not None
            # The loop's handle holds the pipe: it is not closed (by GC) while registered.
            loop.add_reader(pipe.fileno(), self._readable, loop, pipe, _Stream(stream))

    # ---- event loop: a pipe is readable (one read does not block, even on a blocking fd)
    def _readable(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], s: _Stream) -> None:
        fd = pipe.fileno()
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
            self._ended(s, s.held + s.decoder.decode(b"", final=True), last=True)
            self._closed_stream(s.name)
            return
        *ended, rest = (s.held + s.decoder.decode(chunk)).split("\n")
        for text in ended:
            self._ended(s, text)
        at = _mark_start(rest)  # a sync mark cut in two by the read: keep its start back
        rest, s.held = rest[:at], rest[at:]
        if ended:
            s.shown = ""
        s.line.write(rest)
        now = s.line.visible()[:MAX_PARTIAL]
        if now != s.shown:
            s.shown = now
            self.agent.partial(self.rank, s.name, now)

    def _ended(self, s: _Stream, text: str, last: bool = False) -> None:
        """``text`` ends the stream's line (at a newline, or at EOF when ``last``); a sync mark
        in it ends the line before it too."""
        before, mark, after = text.partition(SYNC_MARKER)
        s.line.write(before)
        if not s.line.empty or not (mark or last):  # an empty line is a line, unless at a mark
            self._line(s.name, s.line.take())
        if mark:
            self._marked(s.name)
            if after:
                self._ended(s, after, last)

    def _line(self, stream: str, text: str) -> None:
        if text.startswith(stacks.CRASH_START) or 0 < len(self.crash) < _CRASH_LINES:
            self.crash.append(text)
        else:
            self.tail.append(text)
        if stream == "err":
            self.err_tail.append(text)
        self.agent.log(self.rank, stream, text)

    def _marked(self, stream: str) -> None:
        self.markers[stream] += 1
        self._change.set()

    def _closed_stream(self, stream: str) -> None:
        self.open_streams.discard(stream)
        self._change.set()

    async def synced(self) -> None:
        """Wait until both pipes are read up to the ``expected``-th mark (or closed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SYNC_WAIT_S
        while any(self.markers[s] < self.expected for s in self.open_streams):
            self._change.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._change.wait(), remaining)

    async def drained(self) -> None:
        """Wait (briefly) until both pipes of a dead process are read to their end."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._closed(), _SYNC_WAIT_S)

    async def _closed(self) -> None:
        while self.open_streams:
            self._change.clear()
            await self._change.wait()


def _mark_start(text: str) -> int:
    """Where a sync mark may begin at the end of ``text`` (its length if nowhere)."""
    at = text.find(SYNC_MARKER[0], max(0, len(text) - 2 * len(SYNC_MARKER)))
    while at != -1:
        if SYNC_MARKER.startswith(text[at : at + len(SYNC_MARKER)]):
            return at
        at = text.find(SYNC_MARKER[0], at + 1)
    return len(text)
