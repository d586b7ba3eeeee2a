"""A rank process's stdout and stderr, read line by line on the agent's event loop.

Both kinds of rank handle own one (``process.py`` for cell ranks, ``script.py`` for script
ranks): lines go to the agent's log path as they come (the loop reads a pipe when it is
readable: a reader thread per pipe cost a cross-thread wake-up per read); the last ones are kept
for error reports (a fatal error report, e.g. a segfault, apart so the tail stays readable).
When a cell rank's reply arrives, ``catch_up`` reads both pipes to empty and ends their
unfinished lines: what the rank wrote before it replied is in its pipes by then, so no line of a
cell arrives after its result, and no mark on the pipes is needed for it (two writes a rank
and two reads of the agent's, every cell). A line still being
written (a progress bar redrawn with ``\\r``) is kept as a terminal shows it (``lines.py``) and
handed to the agent as it changes.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import subprocess
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import IO, Any

from ..rank import location
from ..wire.frames import Frames
from ..wire.valuefiles import Inbound
from .lines import LineBuffer
from .nodelink import NodeLink

TAIL_LINES = 20
#: Characters kept of one line (its head); the rest is counted and said when the line ends.
MAX_LINE = 10_000
#: Characters of an unfinished line sent live (a progress bar is far shorter).
MAX_PARTIAL = 1_000
_EOF_WAIT_S = 2.0
#: Reads ``catch_up`` makes of one pipe at most (a pipe holds 64 KiB; what a thread of the rank
#: keeps writing after the reply is read as it comes, like any other line).
_CATCH_UP_READS = 16
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
        self.open_streams = {"out", "err"}
        self._streams: list[tuple[IO[bytes], _Stream]] = []
        self._change = asyncio.Event()

    def start(self, proc: subprocess.Popen[bytes]) -> None:
        """Read ``proc``'s pipes from now on (called on the agent's event loop)."""
        loop = asyncio.get_running_loop()
        for stream, pipe in (("out", proc.stdout), ("err", proc.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)  # ``catch_up`` reads until it is empty
            s = _Stream(stream)
            self._streams.append((pipe, s))
            # The loop's handle holds the pipe: it is not closed (by GC) while registered.
            loop.add_reader(pipe.fileno(), self._read, loop, pipe, s)

    # ---- event loop: a pipe is readable, or a reply came (``catch_up``)
    def _read(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], s: _Stream) -> bool:
        """Read what ``pipe`` has; False once it is empty for now, or at its end."""
        fd = pipe.fileno()
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
            self._ended(s, s.decoder.decode(b"", final=True), last=True)
            self._closed_stream(s.name)
            return False
        *ended, rest = s.decoder.decode(chunk).split("\n")
        for text in ended:
            self._ended(s, text)
        if ended:
            s.shown = ""
        s.line.write(rest)
        now = s.line.visible()[:MAX_PARTIAL]
        if now != s.shown:
            s.shown = now
            self.agent.partial(self.rank, s.name, now)
        return True

    def _ended(self, s: _Stream, text: str, last: bool = False) -> None:
        """``text`` ends the stream's line (at a newline, or at EOF when ``last``)."""
        s.line.write(text)
        if not (last and s.line.empty):  # an empty line is a line, but not at EOF
            self._line(s.name, s.line.take())

    def catch_up(self) -> None:
        """A cell rank's reply came: read both pipes to empty and end their unfinished lines
        (the cell's output ends with it)."""
        loop = asyncio.get_running_loop()
        for pipe, s in self._streams:
            if s.name not in self.open_streams:
                continue
            for _ in range(_CATCH_UP_READS):
                if not self._read(loop, pipe, s):
                    break
            if s.name in self.open_streams and not s.line.empty:
                s.shown = ""
                self._line(s.name, s.line.take())

    def _line(self, stream: str, text: str) -> None:
        if text.startswith(location.CRASH_START) or 0 < len(self.crash) < _CRASH_LINES:
            self.crash.append(text)
        else:
            self.tail.append(text)
        if stream == "err":
            self.err_tail.append(text)
        self.agent.log(self.rank, stream, text)

    def _closed_stream(self, stream: str) -> None:
        self.open_streams.discard(stream)
        self._change.set()

    async def drained(self) -> None:
        """Wait (briefly) until both pipes of a dead process are read to their end."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._closed(), _EOF_WAIT_S)

    async def _closed(self) -> None:
        while self.open_streams:
            self._change.clear()
            await self._change.wait()


def read_frames(
    loop: asyncio.AbstractEventLoop,
    conn: Connection,
    frames: Frames,
    files: Inbound | None = None,
) -> list[Any] | None:
    """The messages that a read of a rank's socket ``conn`` completes, when ``loop`` found it
    readable (one read does not block); None at EOF, and ``loop`` stops watching it. The read goes
    into ``frames``' own buffer: a big value's body is filled by the reads themselves. Files that
    come with the bytes go to ``files`` (a socket that may carry them must be read so: a plain
    read closes them)."""
    try:
        into = frames.into()
        n = files.recv_into(into) if files is not None else os.readv(conn.fileno(), [into])
    except OSError:
        n = 0
    if not n:
        loop.remove_reader(conn.fileno())
        return None
    return frames.filled(n)
