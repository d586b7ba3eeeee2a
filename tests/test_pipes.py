"""A rank's pipes read on the event loop: sync marks cut by a read, unfinished lines, EOF."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from jupyter_mn.node.pipes import MAX_LINE, PipeReader
from jupyter_mn.rank.sync import SYNC_MARKER

T = TypeVar("T")


class Recorder:
    """The agent's side of the seam, recording what the reader hands it."""

    node = 0

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.partials: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    def log(self, rank: int, stream: str, line: str) -> None:
        self.lines.append((stream, line))
        self.changed.set()

    def partial(self, rank: int, stream: str, text: str) -> None:
        self.partials.append((stream, text))
        self.changed.set()

    def display(self, rank: int, output: dict[str, Any]) -> None:
        raise AssertionError("pipes never carry displays")

    def rank_state(self, rank: int, state: str, detail: str = "", **_: Any) -> None:
        pass


def on_loop_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh loop in a thread of its own, as the agent's loop runs on its
    worker's thread (and whatever an earlier test left on the main thread cannot interfere)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def _until(link: Recorder, done: Any) -> None:
    while not done():
        link.changed.clear()
        await asyncio.wait_for(link.changed.wait(), 10)


def test_a_sync_mark_cut_in_two_by_a_read_ends_the_line_and_is_never_shown():
    half = len(SYNC_MARKER) // 2
    code = (
        "import os, sys\n"
        f"os.write(1, b'abc' + {SYNC_MARKER[:half].encode()!r})\n"
        "sys.stdin.readline()\n"  # the reader has read the first half by then
        f"os.write(1, {SYNC_MARKER[half:].encode()!r} + b'\\n')\n"
        f"os.write(2, {(SYNC_MARKER + chr(10)).encode()!r})\n"
    )

    async def main() -> tuple[Recorder, PipeReader]:
        link = Recorder()
        proc = _child(code)
        reader = PipeReader(link, rank=0)
        reader.expected = 1
        reader.start(proc)
        await _until(link, lambda: ("out", "abc") in link.partials)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        await reader.synced()
        await reader.drained()
        proc.wait()
        return link, reader

    link, reader = on_loop_thread(main())
    assert reader.markers == {"out": 1, "err": 1}
    assert link.lines == [("out", "abc")]
    assert all("\x1e" not in text for _, text in link.partials)


def test_an_unfinished_progress_bar_is_a_line_at_eof():
    code = "import sys; sys.stdout.write(' 50%|##   |\\r100%|#####|'); sys.stdout.flush()"

    async def main() -> Recorder:
        link = Recorder()
        proc = _child(code)
        reader = PipeReader(link, rank=0)
        reader.start(proc)
        await reader.drained()
        proc.wait()
        assert not reader.open_streams
        return link

    link = on_loop_thread(main())
    assert link.lines == [("out", "100%|#####|")]


def test_a_long_line_without_a_newline_keeps_its_head_and_counts_the_rest():
    size = 3_000_000
    code = f"import sys; sys.stdout.write('y' * {size}); sys.stdout.flush()"

    async def main() -> Recorder:
        link = Recorder()
        proc = _child(code)
        reader = PipeReader(link, rank=0)
        reader.start(proc)
        await _until(link, lambda: not reader.open_streams)
        proc.wait()
        return link

    link = on_loop_thread(main())
    [(stream, text)] = link.lines
    assert stream == "out"
    assert text.startswith("y" * MAX_LINE + " … [jupyter_mn: ")
    assert f"{size - MAX_LINE:,} more characters" in text
    assert all(len(t) <= 1_000 for _, t in link.partials)  # a live line is sent short


def test_a_rank_prints_a_line_in_one_write_and_a_redrawn_bar_as_it_is_drawn():
    """What the agent reads: each packet of a SOCK_SEQPACKET stdout is one write of the rank's.
    Unbuffered, ``print("line", 6)`` is four writes, and a read between them sees "line" as a
    line still being written."""
    import os
    import socket

    code = (
        "import sys\nfrom jupyter_mn.rank.runtime import _line_buffered\n_line_buffered()\n"
        "print('line', 6)\nsys.stdout.write('\\r 50%|')\nsys.stdout.write('#')\n"
        "sys.stdout.flush()\nprint('err', 7, file=sys.stderr)\n"
    )
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        subprocess.run(
            [sys.executable, "-c", code],
            stdout=theirs,
            stderr=theirs,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            check=True,
        )
        theirs.close()
        packets = list(iter(lambda: ours.recv(4096), b""))
    assert packets == [b"line 6\n", b"\r 50%|", b"#", b"err 7\n"]
