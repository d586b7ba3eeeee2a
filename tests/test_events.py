"""Messages between the agents and the kernel: a node's packed reply, read back."""

from __future__ import annotations

import pickle

import pytest

from jupyter_mn.events import GangState, NodeReply, RankError


def test_a_packed_node_reply_reads_back_as_it_was_sent():
    failed = {
        "rank": 7,
        "status": "error",
        "error": {"ename": "E", "evalue": "v", "traceback": ["a", "b"]},
    }
    ok = {"rank": 6, "status": "ok", "duration": 0.5, "value": b"x", "notes": ["n"]}
    reply = NodeReply.build(3, 17, [ok, failed])
    again = NodeReply.of(reply.packed())
    assert again == reply
    assert again.ranks[1].error == RankError("E", "v", ("a", "b"))
    assert again.failed


def test_bytes_that_are_not_a_node_reply_are_refused_by_name():
    other = pickle.dumps(GangState("READY", ""))
    with pytest.raises(TypeError, match="expected a NodeReply, got GangState"):
        NodeReply.of(other)
