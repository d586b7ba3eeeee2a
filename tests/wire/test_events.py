"""Messages between the agents and the kernel: a node's packed reply, read back."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from jupyter_mn.errors import JoinTimeout, RendezvousError
from jupyter_mn.gang.base import rendezvous_cause
from jupyter_mn.wire.events import (
    CellDone,
    CellOutcome,
    GangState,
    GangStatus,
    NodeReply,
    RankError,
    RankReply,
    RankState,
    RankStatus,
    from_msg,
    to_msg,
)


def test_a_packed_node_reply_reads_back_as_it_was_sent():
    failed = RankReply(7, RankStatus.ERROR, error=RankError("E", "v", ("a", "b")))
    ok = RankReply(6, RankStatus.OK, 0.5, value=b"x", notes=("n",))
    reply = NodeReply(3, 17, (ok, failed))
    again = NodeReply.of(reply.packed())
    assert again == reply
    assert again.ranks[1].error == RankError("E", "v", ("a", "b"))
    assert again.failed
    assert [r.status for r in again.ranks] == [RankStatus.OK, RankStatus.ERROR]


@pytest.mark.parametrize(
    "event",
    [GangState(GangStatus.BROKEN, "node 1 lost"), RankState(1, 3, RankStatus.LOST_IDLE, "killed")],
)
def test_states_cross_the_event_channel_as_their_enum_members(event):
    """dask's event channel carries msgpack: a state arrives as its enum member, not text."""
    again = from_msg(msgpack.unpackb(msgpack.packb(to_msg(event), strict_types=True)))
    assert again == event
    assert type(again.state) is type(event.state)
    assert f"{again.state}" == str(again.state) == again.state.value  # views print the text
    assert repr([again.state]) == repr([again.state.value])  # and so does a user's print


def test_a_node_that_waited_in_vain_is_not_the_cause_of_a_failed_start():
    waited = JoinTimeout("node 0: ranks did not join the process group within 60 s")
    raised = RendezvousError("node 1: rank 3 raised ValueError")
    assert rendezvous_cause([waited, raised]) is raised
    assert rendezvous_cause([waited]) is waited
    other = rendezvous_cause([OSError("no route")])
    assert isinstance(other, RendezvousError) and str(other) == "OSError: no route"
    assert isinstance(pickle.loads(pickle.dumps(waited)), JoinTimeout)  # it crosses dask


def test_bytes_that_are_not_a_node_reply_are_refused_by_name():
    other = pickle.dumps(GangState("READY", ""))
    with pytest.raises(TypeError, match="expected a NodeReply, got GangState"):
        NodeReply.of(other)


def test_a_finished_cell_says_how_it_went_once_as_its_outcome():
    """Whether every rank finished is the outcome DONE: no second field that could disagree."""
    lost = CellDone(4, 1.5, outcome=CellOutcome.LOST)
    assert "ok" not in to_msg(lost)
    again = from_msg(to_msg(lost))
    assert again == lost and again.outcome is CellOutcome.LOST and not again.ok
    assert CellDone(5, 0.1).ok
