"""The control socket's messages decoded as bytes arrive, as a rank's Connection writes them."""

from __future__ import annotations

import socket
from multiprocessing.connection import Connection

from jupyter_mn.node.frames import Frames, Undecodable
from jupyter_mn.wire.events import DisplayOutput, RankReply, RankStatus
from jupyter_mn.wire.rankwire import RankReady, Reformed

OK = RankReply(0, RankStatus.OK)


def _fail() -> None:
    raise ValueError("no such class here")


class Boom:
    """Pickles fine in the rank; unpickling in the agent raises (a class only the rank has)."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_fail, ())


def _wire(*messages: object) -> bytes:
    """What a rank's ``Connection.send`` puts on its socket for ``messages``."""
    ours, theirs = socket.socketpair()
    with ours, Connection(theirs.detach()) as conn:
        for msg in messages:
            conn.send(msg)
        data = b""
        ours.settimeout(5)
        while sum(1 for _ in Frames().feed(data)) < len(messages):
            data += ours.recv(1 << 20)
        return data


def test_a_message_that_does_not_unpickle_is_said_and_the_next_one_still_arrives():
    data = _wire(DisplayOutput("display", {"x": Boom()}), OK)
    bad, reply = Frames().feed(data)
    assert isinstance(bad, Undecodable) and "no such class here" in bad.error
    assert reply == OK


def test_messages_split_anywhere_come_out_whole_and_in_order():
    messages = [
        RankReady(0, 0, 1, "cpu", "gloo", "h"),
        RankReply(0, RankStatus.OK, value=b"x" * 70_000),
        Reformed(0, True),
    ]
    data = _wire(*messages)
    for size in (1, 3, 4, 5, 4096, len(data)):
        frames, got = Frames(), []
        for start in range(0, len(data), size):
            got += frames.feed(data[start : start + size])
        assert got == messages, size


def test_an_incomplete_message_waits_for_the_rest():
    data = _wire(OK)
    frames = Frames()
    assert frames.feed(data[:-1]) == []
    assert frames.feed(data[-1:]) == [OK]
