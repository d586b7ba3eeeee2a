"""The agent's handle on one rank process (``node/process.py``): requests reach the rank in the
order they were made, however large, and a cell's reply goes straight to whoever expects it, or a
"lost" outcome when the rank dies first. A real child process speaks the control socket."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from jupyter_mn.node.process import RankHandle, pack
from jupyter_mn.wire.events import RankReply
from jupyter_mn.wire.payload import CellPayload
from jupyter_mn.wire.rankwire import RunCell
from tests.support.agentloop import Recorder, on_loop_thread

#: A rank that answers each cell with the size of its source (in its notes), dies on a cell
#: "die", ends on ``Stop``.
ECHO = """
import os
from multiprocessing.connection import Connection
from jupyter_mn.wire.events import RankReply, RankStatus
from jupyter_mn.wire.frames import encode, write_all
from jupyter_mn.wire.rankwire import RunCell, Stop
conn = Connection(int(os.environ["JUPYTER_MN_CONTROL_FD"]))
while True:
    msg = conn.recv()
    if isinstance(msg, Stop):
        break
    if msg.payload.source == "die":
        os._exit(3)
    reply = RankReply(0, RankStatus.OK, notes=(str(len(msg.payload.source)),))
    write_all(conn.fileno(), encode(reply))
"""


def _handle() -> RankHandle:
    return RankHandle(Recorder(), 0, 0, dict(os.environ), None, [sys.executable, "-c", ECHO])


def _cell(source: str) -> bytes:
    return pack(RunCell(CellPayload(source, 1)))


def _expect(handle: RankHandle, run_id: int) -> asyncio.Future[RankReply]:
    got: asyncio.Future[RankReply] = asyncio.get_running_loop().create_future()
    handle.expect(run_id, got.set_result)
    return got


def _size(reply: RankReply) -> int:
    return int(reply.notes[0])


def test_a_small_request_never_overtakes_a_large_one_still_being_sent():
    async def main() -> list[int]:
        handle = _handle()
        try:
            sizes = [1 << 22, 10, 1 << 21, 20]  # the large ones go from a thread
            replies = [_expect(handle, run_id) for run_id in range(len(sizes))]
            for size in sizes:
                handle.send_packed(_cell("x" * size))
            return [_size(reply) for reply in await asyncio.wait_for(asyncio.gather(*replies), 30)]
        finally:
            await handle.stop()

    assert on_loop_thread(main()) == [1 << 22, 10, 1 << 21, 20]


def test_a_small_request_is_on_its_way_when_send_returns():
    """The cell stream relies on it: a cell's requests reach every rank before the loop turns."""

    async def main() -> RankReply:
        handle = _handle()
        try:
            reply = _expect(handle, 1)
            sent = handle.send_packed(_cell("abc"))
            assert sent.done() and sent.result() is True
            return await asyncio.wait_for(reply, 30)
        finally:
            await handle.stop()

    assert _size(on_loop_thread(main())) == 3


def test_a_rank_that_dies_before_its_reply_is_lost_to_every_cell_expecting_one():
    async def main() -> tuple[list[RankReply], Any]:
        handle = _handle()
        try:
            replies = [_expect(handle, run_id) for run_id in (1, 2)]
            handle.send_packed(_cell("die"))
            got = await asyncio.wait_for(asyncio.gather(*replies), 30)
            return got, handle.running
        finally:
            await handle.stop()

    replies, running = on_loop_thread(main())
    assert [(r.status, r.exit_code, r.error and r.error.ename) for r in replies] == [
        ("lost", 3, "RankLost")
    ] * 2
    assert running is None


def test_a_cell_sent_to_a_rank_already_dead_or_stopped_is_lost_at_once():
    """A rank dead between cells (its death seen, or its handle stopped) still answers the next
    cell, as "lost": nothing would ever read its socket again."""

    async def main() -> list[str]:
        handle = _handle()
        first = _expect(handle, 1)
        handle.send_packed(_cell("die"))
        statuses = [(await asyncio.wait_for(first, 30)).status]  # its death was read
        late = _expect(handle, 2)
        assert handle.send_packed(_cell("")).result() is False
        statuses.append((await asyncio.wait_for(late, 30)).status)
        await handle.stop()

        stopped = _handle()
        await stopped.stop()
        statuses.append((await asyncio.wait_for(_expect(stopped, 1), 30)).status)
        return statuses

    assert on_loop_thread(main()) == ["lost"] * 3
