"""Who caused a failed cell (``CellResult.root_cause``), in whatever order the endings came."""

from __future__ import annotations

import itertools

import pytest

from jupyter_mn.model.result import CellResult, RankOutcome
from jupyter_mn.wire.events import RankError, RankStatus

WAITED = RankError("RuntimeError", "[gloo] Connection closed by peer", secondary=True)
STOPPED = RankError("KeyboardInterrupt", "", secondary=True)  # interrupted inside a collective
BUSY = RankError("KeyboardInterrupt", "")  # interrupted in its own code
RAISED = RankError("ValueError", "bad batch")
NODE_GONE = RankError("NodeLost", "node 1 stopped answering", node_lost=True)


def ending(rank: int, status: RankStatus, error: RankError) -> RankOutcome:
    return RankOutcome(rank, rank // 2, rank % 2, status, error=error)


def every_order(endings: list[RankOutcome], **result: object):
    """Each arrival order of ``endings``: the list's order and the finish times both permuted."""
    for order in itertools.permutations(endings):
        timed = [
            RankOutcome(**{**vars(outcome), "finished_at": 100.0 + i})
            for i, outcome in enumerate(order)
        ]
        yield CellResult(ranks=timed, **result)
        yield CellResult(ranks=list(reversed(timed)), **result)


ERROR, INTERRUPTED, LOST = RankStatus.ERROR, RankStatus.INTERRUPTED, RankStatus.LOST
TIMEOUT = "--timeout 1 s reached"


@pytest.mark.parametrize(
    ("endings", "result", "cause"),
    [
        # a timed-out cell: the verdict names rank 3, asleep in its own code; the others'
        # collectives raised (under load, before the SIGINT reached them) or were interrupted
        (
            [
                ending(0, INTERRUPTED, STOPPED),
                ending(1, ERROR, WAITED),
                ending(2, ERROR, WAITED),
                ending(3, INTERRUPTED, BUSY),
            ],
            dict(interrupted=TIMEOUT, verdict="rank 3 never entered", culprits=(3,)),
            3,
        ),
        # the same without a verdict (no rank waited in a collective long enough to judge)
        (
            [
                ending(0, ERROR, WAITED),
                ending(1, INTERRUPTED, STOPPED),
                ending(2, INTERRUPTED, BUSY),
            ],
            dict(interrupted=TIMEOUT),
            2,
        ),
        # a verdict's culprit that was killed for ignoring the interrupt
        (
            [ending(0, ERROR, WAITED), ending(1, LOST, RankError("Killed", "SIGKILL"))],
            dict(interrupted=TIMEOUT, verdict="rank 1 never entered", culprits=(1,)),
            1,
        ),
        # a rank's own error, its peers' broken collectives
        (
            [ending(0, ERROR, WAITED), ending(1, ERROR, RAISED), ending(2, INTERRUPTED, STOPPED)],
            {},
            1,
        ),
        # a lost node explains everything, the verdict included
        (
            [ending(0, ERROR, RAISED), ending(2, LOST, NODE_GONE), ending(3, INTERRUPTED, BUSY)],
            dict(interrupted=TIMEOUT, verdict="rank 3 never entered", culprits=(3,)),
            2,
        ),
    ],
)
def test_the_root_cause_does_not_depend_on_the_order_endings_arrive_in(endings, result, cause):
    causes = {r.root_cause.rank for r in every_order(endings, **result)}
    assert causes == {cause}


def test_among_equals_the_earliest_failure_is_the_cause():
    first, second = ending(1, ERROR, RAISED), ending(2, ERROR, RAISED)
    result = CellResult(
        ranks=[
            RankOutcome(**{**vars(second), "finished_at": 5.0}),
            RankOutcome(**{**vars(first), "finished_at": 7.0}),
        ]
    )
    assert result.root_cause.rank == 2
