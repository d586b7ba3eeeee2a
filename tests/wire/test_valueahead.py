"""A reply sent ahead: offered by the reader once its pickle is in, rebuilt by the kernel from the
rank's pickle and the buffers that follow, and put back in its node's reply."""

from __future__ import annotations

import pickle

import numpy as np

from jupyter_mn.wire.events import NodeReply, RankReply, RankStatus
from jupyter_mn.wire.frames import RELAY_MIN, Frames, encode
from jupyter_mn.wire.valueahead import ReplyAhead
from jupyter_mn.wire.values import Pickled


def _reply(rank: int, array: np.ndarray) -> RankReply:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(array, protocol=5, buffer_callback=buffers.append)
    return RankReply(rank, RankStatus.OK, value=Pickled(data, tuple(buffers)))


def _joined(parts: list) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in parts)


def test_a_big_message_is_offered_once_its_pickle_is_in_and_the_rest_read_by_the_caller():
    array = np.arange(RELAY_MIN, dtype=np.uint8)
    head, data, buffer = encode(_reply(0, array))
    frames = Frames()
    assert frames.feed(head + data + bytes(buffer[:10])) == []
    arriving = frames.arriving()
    assert arriving is not None and arriving.data == data and arriving.sizes == (array.nbytes,)
    assert frames.arriving() is None  # once
    got, left = frames.divert()
    assert bytes(got) == bytes(buffer[:10]) and left == array.nbytes - 10
    assert frames.feed(_joined(encode(RankReply(1, RankStatus.OK)))) == [
        RankReply(1, RankStatus.OK)
    ]  # what follows is the next message


def test_a_small_message_is_never_offered():
    head, data, buffer = encode(_reply(0, np.zeros(RELAY_MIN // 2, dtype=np.uint8)))
    frames = Frames()
    frames.feed(head + data + bytes(buffer[:10]))
    assert frames.arriving() is None


def test_the_kernel_rebuilds_a_reply_sent_ahead_and_puts_it_back_in_its_nodes():
    array = np.random.default_rng(3).integers(0, 255, RELAY_MIN, dtype=np.uint8)
    head, data, buffer = encode(_reply(2, array))
    frames = Frames()
    frames.feed(head + data)
    arriving = frames.arriving()
    assert arriving is not None
    (ahead,) = Frames().feed(ReplyAhead.head(9, arriving.data, arriving.sizes) + bytes(buffer))
    assert isinstance(ahead, ReplyAhead) and ahead.run_id == 9
    node = NodeReply(1, 0, (RankReply(2, RankStatus.OK),), ahead=(2,))
    (rank,) = node.with_ahead({2: ahead.reply}).ranks
    assert rank.value is not None and np.array_equal(rank.value.loads(), array)


def test_a_reply_sent_ahead_that_its_node_does_not_name_is_dropped():
    lost = RankReply(2, RankStatus.LOST)
    node = NodeReply(1, 0, (lost,))
    assert node.with_ahead({2: RankReply(2, RankStatus.OK)}).ranks == (lost,)
