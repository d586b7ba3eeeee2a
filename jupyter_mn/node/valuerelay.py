"""A rank's big reply passed on to the kernel as it is read (``wire/valueahead.py``).

Waiting for the whole value before sending it would copy it twice in sequence (rank → agent,
then agent → kernel) and hold all of it in the agent. The relay reads the rank's socket a chunk
at a time and hands each chunk to the kernel's connection at once, so both copies run together
and the agent holds a few chunks. Back-pressure both ways: while the connection has more queued
than it takes at once, the relay stops reading the rank (whose writes then wait), and reads
again when the queue drains.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
from collections.abc import Callable
from typing import Protocol

from ..wire.events import RankReply
from ..wire.frames import Frames
from ..wire.valueahead import ReplyAhead

#: One read of the rank's socket while relaying (its send buffer holds 4 MiB).
CHUNK = 1 << 20
_ZEROS = bytes(CHUNK)


class RelaySink(Protocol):
    """The kernel's connection, as a relay writes to it (``cellserver.py``)."""

    @property
    def takes_files(self) -> bool:
        """Whether the kernel is on this host: a big value goes as a file instead
        (``wire/valuefiles.py``)."""

    def relay(self, head: bytes) -> bool:
        """Begin a relayed message with ``head``; False when one is under way or the kernel
        has gone (the reply then goes with its node's)."""

    def relayed(self, data: bytes | memoryview) -> None:
        """More of the message (dropped once the kernel has gone)."""

    def relay_done(self) -> None:
        """The message is whole: what was held back meanwhile goes now."""

    def backlogged(self) -> bool:
        """Whether enough is queued that reading more should wait."""

    def when_drained(self, then: Callable[[], None]) -> None:
        """Call ``then`` once the queue has drained, or the kernel has gone."""


@dataclasses.dataclass(frozen=True)
class Ahead:
    """Where a rank's big reply to a run may go before its node's, and who is told it did."""

    sink: RelaySink
    #: called with the rank whose reply went ahead, whole
    sent: Callable[[int], None]


class ReplyRelay:
    """A rank handle's part that passes the rank's big replies on: idle, or relaying one (its
    ``left`` bytes from the rank's socket ``fd`` to ``sink``). ``resume`` watches ``fd`` again
    after a pause (the rank handle owns the loop's reader)."""

    def __init__(self, fd: int, frames: Frames, resume: Callable[[], None]) -> None:
        self._fd, self._frames, self._resume = fd, frames, resume
        self._loop = asyncio.get_running_loop()
        self._ahead: Ahead | None = None
        #: the reply being relayed, without its value (what the node's reply carries)
        self._reply: RankReply | None = None
        self.left = 0

    @property
    def active(self) -> bool:
        return self._ahead is not None

    def begin(self, run_id: int, ahead: Ahead) -> None:
        """After a read of the rank's socket: if the message being read is a big reply to run
        ``run_id`` and ``ahead.sink`` takes it now, pass it on from here on (``read``)."""
        if (arriving := self._frames.arriving()) is None:
            return
        stand_ins = [pickle.PickleBuffer(bytearray()) for _ in arriving.sizes]
        try:  # the reply, its value left in its pickle: the agent never unpickles that
            reply = pickle.loads(arriving.data, buffers=stand_ins)
        except Exception:  # the message's end says so (``Undecodable``)
            return
        if not isinstance(reply, RankReply):
            return
        if not ahead.sink.relay(ReplyAhead.head(run_id, arriving.data, arriving.sizes)):
            return
        got, self.left = self._frames.divert()  # ``arriving``: some of it is still to come
        ahead.sink.relayed(bytes(got))
        self._ahead, self._reply = ahead, dataclasses.replace(reply, value=None, pulled=None)

    def read(self) -> list[RankReply] | None:
        """One read of the readable socket, passed on (as ``pipes.read_frames``): the reply,
        without its value, once it is whole (its run told it went ahead), none while more is
        due; None at EOF (the rank has gone: ``void`` then), and the loop stops watching."""
        assert self._ahead is not None and self._reply is not None
        sink = self._ahead.sink
        try:
            data = os.read(self._fd, min(CHUNK, self.left))
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self._fd)
            return None
        self.left -= len(data)
        sink.relayed(data)
        if not self.left:
            reply, ahead = self._reply, self._ahead
            self._end()
            ahead.sent(reply.rank)
            return [reply]
        if sink.backlogged():
            self._loop.remove_reader(self._fd)
            sink.when_drained(self._drained)
        return []

    def _drained(self) -> None:
        if self.active:
            self._resume()

    def void(self) -> None:
        """The rank is gone part way: the message is padded to its announced length (so the
        kernel's stream stays in step; the node's reply does not name it, and the kernel drops
        it)."""
        if self._ahead is None:
            return
        view = memoryview(_ZEROS)
        while self.left:
            piece = view[: min(CHUNK, self.left)]
            self._ahead.sink.relayed(piece)
            self.left -= len(piece)
        self._end()

    def _end(self) -> None:
        assert self._ahead is not None
        sink, self._ahead, self._reply = self._ahead.sink, None, None
        sink.relay_done()
