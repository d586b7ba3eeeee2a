"""The agent's decoder of a rank's control messages, fed the bytes a real
``multiprocessing.connection.Connection`` writes, in any split (the loop reads what is there)."""

from __future__ import annotations

import os
import socket
from multiprocessing.connection import Connection

from jupyter_mn.node.frames import Frames


def _wire(*messages: object) -> bytes:
    """The exact bytes a rank's ``Connection.send`` puts on its control socket."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        conn = Connection(theirs.detach())
        for msg in messages:
            conn.send(msg)
        conn.close()
        data = b""
        while chunk := os.read(ours.fileno(), 1 << 20):
            data += chunk
    return data


def test_messages_split_anywhere_come_out_whole_and_in_order():
    messages = [{"op": "ready", "pid": 1}, {"op": "done", "value": b"x" * 70_000}, {"op": "exit"}]
    data = _wire(*messages)
    for size in (1, 3, 4, 5, 4096, len(data)):
        frames, got = Frames(), []
        for start in range(0, len(data), size):
            got += frames.feed(data[start : start + size])
        assert got == messages, size


def test_an_incomplete_message_waits_for_the_rest():
    data = _wire({"op": "done"})
    frames = Frames()
    assert frames.feed(data[:-1]) == []
    assert frames.feed(data[-1:]) == [{"op": "done"}]
