"""The hang watchdog's clock (``gang/hangwatch.py``, ``Progress``) on looks at the ranks: it
fires once S seconds pass with no rank moving while one waits in a collective, never for a
slow job that keeps moving, and again only after progress. The watchdog on a real gang, through
a real kernel, is in ``tests/e2e/test_hangs.py``."""

from __future__ import annotations

from jupyter_mn.gang.hangwatch import Progress
from jupyter_mn.wire.rankwhere import Collective, RankWhere

S = 1_000_000_000  # ns: when the ranks answer, a second after they entered


def at(seq, done=False):
    return Collective("0", "default_pg", seq, "all_reduce", ((1,),), ("float32",), 1, done)


def look(*seqs, done=(), busy=True):
    return [RankWhere(0, n, busy, (), (at(s, n in done),), taken_ns=S) for n, s in enumerate(seqs)]


def test_a_stall_with_a_rank_waiting_fires_once_after_the_timeout():
    p = Progress(5, now=0)
    assert not p.saw(look(3, 2, done={1}), now=1)
    assert not p.saw(look(3, 2, done={1}), now=4.9)
    assert p.saw(look(3, 2, done={1}), now=5)
    p.fired = True  # as HangWatch marks a reported hang
    assert not p.saw(look(3, 2, done={1}), now=60)


def test_a_slow_job_that_keeps_completing_collectives_never_fires():
    p = Progress(1, now=0)
    for step in range(100):  # every rank waits at every look, but the numbers move
        assert not p.saw(look(step, step), now=0.5 * step)


def test_progress_after_a_report_arms_it_again():
    p = Progress(2, now=0)
    assert p.saw(look(4, 3, done={1}), now=3)
    p.fired = True
    assert not p.saw(look(5, 4, done={1}), now=4)  # moved
    assert not p.saw(look(5, 4, done={1}), now=5.9)
    assert p.saw(look(5, 4, done={1}), now=6)


def test_no_rank_in_a_collective_is_not_a_hang_however_long():
    p = Progress(1, now=0)
    assert not p.saw(look(3, 3, done={0, 1}), now=100)  # busy in their own code
    assert not p.saw(look(3, 2, busy=False), now=200)  # between cells: history, not a wait


def test_a_node_that_answers_counts_as_progress():
    p = Progress(2, now=0)
    p.saw(look(4, 3, done={1}), now=1)
    p.moved(now=1.5)  # its ranks ended the cell
    assert not p.saw(look(4, 3, done={1}), now=3)
    assert p.saw(look(4, 3, done={1}), now=3.5)


def test_a_rank_that_stops_answering_is_not_progress():
    p = Progress(2, now=0)
    p.saw(look(4, 4), now=1)
    silent = [look(4, 4)[0], RankWhere(0, 1, True, answered=False, note="no answer")]
    assert p.saw(silent, now=2)
