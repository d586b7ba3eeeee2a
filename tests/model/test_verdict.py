"""The hang verdict (``verdict.judge``) on per-rank records as the ranks report them: which rank
holds the others up, in which collective, and where. The gang-level cases (a real 2×2 gloo gang
through a real kernel) are in ``tests/e2e/test_hangs.py``."""

from __future__ import annotations

import dataclasses

from jupyter_mn.model.verdict import HangKind, judge
from jupyter_mn.wire.rankwhere import Collective, RankWhere

S = 1_000_000_000  # ns
NOW = 1_000 * S


def call(seq, op="all_reduce", size=(1024,), dtype="float32", at=NOW - 41 * S, done=False, pg="0"):
    sizes, dtypes = ((size,), (dtype,)) if size is not None else ((), ())
    desc = "default_pg" if pg == "0" else "experts"
    return Collective(pg, desc, seq, op, sizes, dtypes, at, done)


def rank(n, *collectives, busy=True, stack=(), answered=True, note=""):
    return RankWhere(n // 2, n, busy, tuple(stack), tuple(collectives), answered, note, NOW)


IN_LOAD = ("Cell In[7], line 14", "    batch = load_batch()", "File x.py:3, in load_batch")


def test_a_rank_that_never_entered_is_named_with_its_cell_line():
    ranks = [rank(n, call(812)) for n in range(3)] + [rank(3, call(811, done=True), stack=IN_LOAD)]
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.MISSING and verdict.culprits == (3,)
    assert verdict.text == (
        "rank 3 (node 1) never entered all_reduce #812 (pg 0, float32[1024]); the other 3 ranks "
        "have waited in it for 41 s; rank 3 is at Cell In[7], line 14: batch = load_batch()"
    )


def test_a_rank_done_with_the_cell_is_missing_too():
    ranks = [rank(0, call(5)), rank(1, call(4, done=True), busy=False)]
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.MISSING
    assert verdict.text.endswith(
        "rank 0 (node 0) has waited in it for 41 s; rank 1 is done with the cell"
    )


def test_a_rank_with_no_collective_yet_is_missing_from_the_default_group():
    verdict = judge([rank(0, call(1, at=NOW - 2_500_000_000)), rank(1)], NOW)
    assert verdict.kind is HangKind.MISSING and verdict.culprits == (1,)
    assert "have waited" not in verdict.text and "waited in it for 2.5 s" in verdict.text
    assert verdict.text.endswith("rank 1 is busy outside the cell's code")


def test_different_ops_at_one_number_are_a_mismatch():
    ranks = [rank(0, call(5)), rank(1, call(5)), rank(2, call(5, "barrier", None))]
    ranks.append(rank(3, call(5, "barrier", None)))
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.MISMATCH
    assert verdict.text == (
        "collective mismatch at #5 (pg 0): ranks 0, 1 are in all_reduce(float32[1024]), "
        "ranks 2, 3 in barrier"
    )


def test_the_same_op_on_other_sizes_or_dtypes_is_a_mismatch_naming_the_minority():
    ranks = [rank(n, call(9)) for n in range(3)] + [rank(3, call(9, size=(2048,)))]
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.MISMATCH and verdict.culprits == (3,)
    assert verdict.text.endswith(
        "ranks 0, 1, 2 are in all_reduce(float32[1024]), rank 3 in all_reduce(float32[2048])"
    )
    ranks[3] = rank(3, call(9, dtype="float64"))
    assert judge(ranks, NOW).text.endswith("rank 3 in all_reduce(float64[1024])")


def test_a_rank_inside_after_every_other_completed_is_stuck():
    ranks = [rank(n, call(812, done=True)) for n in (0, 1, 3)] + [rank(2, call(812))]
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.STUCK and verdict.culprits == (2,)
    assert verdict.text == (
        "rank 2 (node 1) has been inside all_reduce #812 (pg 0, float32[1024]) for 41 s after "
        "every other rank completed it"
    )


def test_a_silent_rank_is_stuck_with_what_its_agent_saw():
    stopped = "no answer: its process is stopped (SIGSTOP or a debugger)"
    ranks = [rank(n, call(3)) for n in (0, 1, 3)]
    ranks.insert(2, rank(2, answered=False, note=stopped))
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.STUCK and verdict.culprits == (2,)
    assert verdict.text == (
        f"rank 2 (node 1) is silent (rank 2: {stopped}); the other 3 ranks have waited in "
        "all_reduce #3 (pg 0, float32[1024]) for 41 s"
    )


def test_every_rank_in_the_same_collective_blames_the_transport():
    verdict = judge([rank(n, call(4)) for n in range(4)], NOW)
    assert verdict.kind is HangKind.STUCK and verdict.culprits == ()
    assert verdict.text.startswith("all 4 ranks have waited in all_reduce #4 (pg 0, float32[1024])")


def test_no_rank_inside_a_collective_gives_no_verdict():
    busy = [rank(n, call(3, done=True), stack=IN_LOAD) for n in range(4)]
    assert judge(busy, NOW) is None
    assert judge([rank(n) for n in range(4)], NOW) is None
    # an incomplete record of a rank no longer running a cell is history, not a wait
    assert judge([rank(0, call(3), busy=False), rank(1, call(3), busy=False)], NOW) is None


def test_a_named_group_counts_only_its_members_and_is_named():
    experts = [rank(n, call(2, pg="1"), call(7, done=True)) for n in (0, 1)]
    others = [rank(n, call(7, done=True), stack=IN_LOAD) for n in (2, 3)]
    assert judge(experts + others, NOW).kind is HangKind.STUCK  # 2 and 3 are not members
    experts[1] = rank(1, call(1, done=True, pg="1"), call(7, done=True), stack=IN_LOAD)
    verdict = judge(experts + others, NOW)
    assert verdict.kind is HangKind.MISSING and verdict.culprits == (1,)
    assert "never entered all_reduce #2 (pg 1 (experts), float32[1024])" in verdict.text


def test_the_oldest_wait_is_judged_when_several_groups_wait():
    late = NOW - 3 * S
    ranks = [
        rank(0, call(7, at=NOW - 60 * S), call(2, pg="1", at=late)),
        rank(1, call(6, done=True), call(2, pg="1", at=late), stack=IN_LOAD),
    ]
    verdict = judge(ranks, NOW)
    assert verdict.collective.pg == "0" and verdict.culprits == (1,)
    assert "waited in it for 60 s" in verdict.text


def test_a_behind_rank_waiting_elsewhere_says_where():
    ranks = [rank(0, call(5)), rank(1, call(4, done=True), call(3, pg="1", at=NOW - 5 * S))]
    ranks.append(rank(2, call(3, pg="1", at=NOW - 5 * S), call(5)))
    verdict = judge(ranks, NOW)
    assert verdict.culprits == (1,)
    assert verdict.text.endswith("rank 1 is inside all_reduce #3 (pg 1 (experts))")


def test_a_mismatch_outranks_a_rank_that_is_behind():
    """Ranks that called different ops at #5 never complete it, whoever else arrives."""
    ranks = [rank(0, call(5)), rank(1, call(5, "barrier", None)), rank(2, call(4, done=True))]
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.MISMATCH
    assert verdict.text.endswith("rank 0 is in all_reduce(float32[1024]), rank 1 in barrier")


def test_a_member_that_never_used_its_group_is_missing_when_the_group_says_who_its_members_are():
    def experts(seq, done=False):
        return dataclasses.replace(call(seq, pg="1", done=done), members=(0, 1, 3))

    ranks = [rank(0, experts(1)), rank(1, experts(1)), rank(2, call(4, done=True))]
    ranks.append(rank(3, call(4, done=True), stack=IN_LOAD))  # never used "experts" yet
    verdict = judge(ranks, NOW)
    assert verdict.kind is HangKind.MISSING and verdict.culprits == (3,)  # 2 is no member
    assert verdict.text.startswith(
        "rank 3 (node 1) never entered all_reduce #1 (pg 1 (experts), float32[1024]); the other "
        "2 ranks have waited in it"
    )


def test_a_collective_entered_just_before_the_answer_is_in_progress_not_a_wait():
    """Ranks answer milliseconds apart: in a busy loop one may be a collective ahead."""
    ahead = rank(3, call(112, at=NOW - 5_000_000))
    behind = [rank(n, call(111, done=True), stack=IN_LOAD) for n in range(3)]
    assert judge([*behind, ahead], NOW) is None
    assert ahead.waiting() is None
