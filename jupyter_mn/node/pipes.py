"""A rank process's stdout and stderr, read line by line on the agent's event loop.

Both kinds of rank handle own one (``process.py`` for cell ranks, ``script.py`` for script
ranks): lines go to the agent's log path as they come (the loop reads a pipe when it is
readable: a reader thread per pipe cost a cross-thread wake-up per sync mark, two a rank a
cell); the last ones are kept for error reports
(a fatal error report, e.g. a segfault, apart so the tail stays readable); the sync marks a cell
rank writes after each reply tell when a cell's output has been read to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections import deque
from typing import IO

from ..rank import stacks
from ..rank.sync import SYNC_MARKER
from .link import NodeLink

TAIL_LINES = 20
MAX_LINE = 10_000
_SYNC_WAIT_S = 2.0
_CRASH_LINES = 200


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
        #: the unfinished last line read from each pipe
        self._partial = {"out": b"", "err": b""}
        self._change = asyncio.Event()

    def start(self, proc: subprocess.Popen[bytes]) -> None:
        """Read ``proc``'s pipes from now on (called on the agent's event loop)."""
        loop = asyncio.get_running_loop()
        for stream, pipe in (("out", proc.stdout), ("err", proc.stderr)):
            assert pipe is not None
            # The loop's handle holds the pipe: it is not closed (by GC) while registered.
            loop.add_reader(pipe.fileno(), self._readable, loop, pipe, stream)

    # ---- event loop: a pipe is readable (one read does not block, even on a blocking fd)
    def _readable(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], stream: str) -> None:
        fd = pipe.fileno()
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if chunk:
            *lines, self._partial[stream] = (self._partial[stream] + chunk).split(b"\n")
            for raw in lines:
                self._line(stream, raw.decode("utf-8", "replace"))
            return
        loop.remove_reader(fd)
        if self._partial[stream]:
            self._line(stream, self._partial[stream].decode("utf-8", "replace"))
        self._closed_stream(stream)

    def _line(self, stream: str, text: str) -> None:
        if SYNC_MARKER in text:
            before, _, _ = text.partition(SYNC_MARKER)
            if before:
                self._line(stream, before)
            self._marked(stream)
            return
        text = text.rsplit("\r", 1)[-1][:MAX_LINE]
        if text.startswith(stacks.CRASH_START) or 0 < len(self.crash) < _CRASH_LINES:
            self.crash.append(text)
        else:
            self.tail.append(text)
        if stream == "err":
            self.err_tail.append(text)
        self.agent.log(self.rank, stream, text)

    # ---- event loop
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
