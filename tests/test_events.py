"""Messages between the agents and the kernel: a node's packed reply, read back."""

from __future__ import annotations

import pickle

import pytest

from jupyter_mn.events import GangState, NodeReply, to_msg


def test_a_packed_node_reply_reads_back_as_it_was_sent():
    reply = NodeReply.build(3, 17, [{"rank": 6, "status": "ok", "duration": 0.5, "value": b"x"}])
    again = NodeReply.of(reply.packed())
    assert again == reply
    assert NodeReply.of(to_msg(reply)) == reply


def test_bytes_that_are_not_a_node_reply_are_refused_by_name():
    other = pickle.dumps(to_msg(GangState("READY", "")))
    with pytest.raises(TypeError, match="expected a NodeReply, got GangState"):
        NodeReply.of(other)
