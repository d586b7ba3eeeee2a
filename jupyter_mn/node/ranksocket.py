"""A cell rank's stacks socket, the agent's end: where the rank is, asked while it is busy.

A thread of the rank answers (``rank/runtime.py``) even while its main thread is blocked in a
collective; the same socket brings the rank an abort of its group's connections (an interrupt
that finds it blocked there) and a preemption notice. When the rank does not answer, the record
says what the agent sees of its process instead (``exits.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
from multiprocessing.connection import Connection

from ..wire.events import Preemption
from ..wire.frames import Frames, Undecodable
from ..wire.rankwhere import AbortRequest, RankWhere, WhereRequest
from .exits import STOPPED, describe_exit, silent, stopped
from .pipes import read_frames

_STACKS_WAIT_S = 1.0


class RankStacks:
    """The stacks socket of rank ``rank`` (process ``proc``) on node ``node``, read on the
    agent's loop."""

    def __init__(
        self, conn: Connection, proc: subprocess.Popen[bytes], node: int, rank: int
    ) -> None:
        self.conn, self.proc, self.node, self.rank = conn, proc, node, rank
        self.replies: asyncio.Queue[RankWhere] = asyncio.Queue()
        self._frames = Frames()
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(conn.fileno(), self._read)

    def _read(self) -> None:
        for msg in read_frames(self._loop, self.conn, self._frames) or ():
            if not isinstance(msg, Undecodable):
                self.replies.put_nowait(msg)

    async def where(self, stack: bool, busy: bool) -> RankWhere:
        """Where the rank is (``stack``: with its main thread's stack; ``busy``: with a cell);
        when it does not answer, what the agent sees of its process (exited, stopped, or native
        code holding the GIL). One question at a time (the hang watchdog's and ``--timeout``'s
        may meet), so a reply is never taken for another's."""
        async with self._lock:
            while not self.replies.empty():  # a late answer to an earlier request
                self.replies.get_nowait()
            if stopped(self.proc.pid):
                return self._unanswered(busy, STOPPED)
            if not self._ask(WhereRequest(stack)):
                return self._unanswered(busy, describe_exit(self.proc.poll()))
            try:
                answer = await asyncio.wait_for(self.replies.get(), _STACKS_WAIT_S)
            except asyncio.TimeoutError:
                return self._unanswered(busy, silent(self.proc.pid))
            return dataclasses.replace(answer, node=self.node)

    def abort(self, generation: int) -> None:
        """Have the rank close its group's connections from its stacks thread (an interrupt
        that finds it blocked in a collective: SIGINT would not get it out)."""
        self._ask(AbortRequest(generation))

    def notify(self, notice: Preemption) -> None:
        """Forward a preemption notice: the rank's stacks thread keeps it (``rank/preemption``)."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(notice)

    def _ask(self, request: WhereRequest | AbortRequest) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            self.conn.send(request)  # a few bytes: the socket takes them
        except (OSError, ValueError):
            return False
        return True

    def _unanswered(self, busy: bool, note: str) -> RankWhere:
        return RankWhere(self.node, self.rank, busy, answered=False, note=note)
