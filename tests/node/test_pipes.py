"""A rank's pipes read on the event loop: caught up at a reply, unfinished lines, EOF."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

from jupyter_mn.node.pipes import MAX_LINE, PipeReader
from tests.support.agentloop import Recorder, on_loop_thread


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


def test_catch_up_reads_what_the_rank_wrote_before_its_reply_and_ends_the_unfinished_line():
    """The agent calls ``catch_up`` when a rank's reply arrives: lines the loop has not read yet
    come out then, and the unfinished line ends with the cell, as a line of its own."""
    code = (
        "import os, sys\n"
        "os.write(1, b'a\\nb\\nunfinished')\nos.write(2, b'e1\\n')\n"
        "os.write(int(sys.argv[1]), b'x')\n"  # as a rank sends its reply: after its writes
        "sys.stdin.readline()\nos.write(1, b'next\\n')\n"
    )
    replied, reply = os.pipe()

    async def main() -> Recorder:
        link = Recorder()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(reply)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(reply,),
        )
        os.close(reply)
        reader = PipeReader(link, rank=0)
        reader.start(proc)
        assert os.read(replied, 1) == b"x"  # blocks this loop: it reads nothing meanwhile
        reader.catch_up()
        assert link.lines == [("out", "a"), ("out", "b"), ("out", "unfinished"), ("err", "e1")]
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        await reader.drained()
        proc.wait()
        return link

    try:
        link = on_loop_thread(main())
    finally:
        os.close(replied)
    assert link.lines[4:] == [("out", "next")]  # the next cell's line starts afresh


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
