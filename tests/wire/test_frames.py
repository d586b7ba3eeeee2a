"""The control socket's messages decoded as bytes arrive, as a rank writes them."""

from __future__ import annotations

import socket
import threading

from jupyter_mn.wire.events import DisplayOutput, RankReply, RankStatus
from jupyter_mn.wire.frames import Frames, Undecodable, encode, write_all
from jupyter_mn.wire.rankwire import RankReady, Reformed
from jupyter_mn.wire.values import Pickled

OK = RankReply(0, RankStatus.OK)


def _fail() -> None:
    raise ValueError("no such class here")


class Boom:
    """Pickles fine in the rank; unpickling in the agent raises (a class only the rank has)."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_fail, ())


def _wire(*messages: object) -> bytes:
    """What a rank puts on its socket for ``messages`` (written while it is read)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        writer = threading.Thread(
            target=lambda: [write_all(theirs.fileno(), encode(msg)) for msg in messages]
        )
        writer.start()
        data = b""
        ours.settimeout(5)
        while sum(1 for _ in Frames().feed(data)) < len(messages):
            data += ours.recv(1 << 20)
        writer.join()
        return data


def test_a_message_that_does_not_unpickle_is_said_and_the_next_one_still_arrives():
    data = _wire(DisplayOutput("display", {"x": Boom()}), OK)
    bad, reply = Frames().feed(data)
    assert isinstance(bad, Undecodable) and "no such class here" in bad.error
    assert reply == OK


def test_messages_split_anywhere_come_out_whole_and_in_order():
    messages = [
        RankReady(0, 0, 1, "cpu", "gloo", "h"),
        RankReply(0, RankStatus.OK, value=Pickled(b"x" * 70_000)),
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


def test_a_values_arrays_cross_every_hop_out_of_band_and_arrive_whole():
    """rank → agent → kernel, as ``wire/values.py`` and the cell stream send it: the arrays'
    memory is never inside a pickle, and the kernel's array is the bytes the rank had."""
    import numpy as np

    from jupyter_mn.rank.execute import dumps
    from jupyter_mn.wire.events import NodeReply

    array = np.random.default_rng(0).random(300_000)
    (reply,) = Frames().feed(_wire(RankReply(0, RankStatus.OK, value=dumps({"a": array}))))
    header, pickled, *buffers = encode(NodeReply(0, 1, (reply,)))  # the agent sends it on
    assert len(pickled) < 4096 and [b.nbytes for b in buffers] == [array.nbytes]
    (forwarded,) = Frames().feed(b"".join([header, pickled, *buffers]))
    got = forwarded.ranks[0].value.loads()["a"]
    assert np.array_equal(got, array) and got.flags.writeable


def test_a_value_packed_for_an_actor_call_keeps_its_arrays_in_band():
    """Where a node has no cell stream the reply goes packed through dask (one pickle)."""
    import numpy as np

    from jupyter_mn.rank.execute import dumps
    from jupyter_mn.wire.events import NodeReply

    array = np.arange(1000.0)
    packed = NodeReply(0, 1, (RankReply(0, RankStatus.OK, value=dumps([array])),)).packed()
    (got,) = NodeReply.of(packed).ranks[0].value.loads()
    assert np.array_equal(got, array)


def test_messages_read_straight_into_the_frames_buffer_arrive_whole_whatever_the_reads():
    """A reader that ``recv_into``s ``into()``: small messages through its scratch buffer, a
    big one's buffer filled by the reads themselves (checksummed)."""
    import hashlib

    import numpy as np

    from jupyter_mn.rank.execute import dumps

    big = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8)
    wire = _wire(OK, dumps({"big": big}), RankReady(0, 0, 1, "cpu", "gloo", "h"), OK)
    for step in (1 << 10, 5_000, 1 << 16, 1 << 20):
        frames, got, at = Frames(), [], 0
        while at < len(wire):
            into = frames.into()
            n = min(len(into), step, len(wire) - at)
            into[:n] = wire[at : at + n]
            got += frames.filled(n)
            at += n
        assert [type(m) for m in got] == [RankReply, Pickled, RankReady, RankReply]
        value = got[1].loads()["big"]
        assert hashlib.sha256(value).digest() == hashlib.sha256(big).digest()
