"""The hang verdict: which rank holds the others up, in which collective, and where it is.

People compare flight-recorder dumps across ranks by hand to find this; here every rank's
``RankWhere`` (its latest collective per process group, from torch's flight recorder, and its
stack) is compared at once. Every member of a group issues its collectives in one order, #1, #2,
…, so the ranks waiting in the group's newest one, #M, are explained by one of:

- *missing*: a member never entered #M (it is behind, busy in its own code or done with the
  cell);
- *mismatch*: the members at #M called different ops, or the same op on different sizes or
  dtypes;
- *stuck*: a member entered #M and never left it after the others completed it, or does not
  answer at all (its process is stopped), or every member waits in #M (the transport is stuck).

No rank inside a collective (each busy in its own code) gives no verdict: the stacks say it all.
Pure: the kernel calls ``judge`` with the records it gathered and the time.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..wire.events import Stacks
from ..wire.plural import counted
from ..wire.rankwhere import Collective, RankWhere


class HangKind(enum.Enum):
    MISSING = "missing"
    MISMATCH = "mismatch"
    STUCK = "stuck"


@dataclass(frozen=True)
class Verdict:
    kind: HangKind
    #: one explanation, naming ranks, nodes, op, sequence number, group and cell line
    text: str
    #: the collective the others wait in
    collective: Collective
    #: the ranks that hold the others up (none when every member waits alike)
    culprits: tuple[int, ...]
    #: how long the first rank has waited in it
    waited_s: float


def judge(ranks: Sequence[RankWhere], now_ns: int) -> Verdict | None:
    """The verdict on ``ranks`` at wall-clock time ``now_ns``, or None when no rank waits in a
    collective. With several groups waiting, the oldest wait is judged (it blocks the rest)."""
    waits = [(w, r) for r in ranks if r.busy and (w := r.waiting()) is not None]
    if not waits:
        return None
    oldest = min(waits, key=lambda pair: pair[0].entered_ns)[0]
    case = _Case(ranks, oldest, now_ns)
    return case.mismatch() or case.missing() or case.stuck()


class _Case:
    """The members of the waiting collective's group and where each is relative to #M."""

    def __init__(self, ranks: Sequence[RankWhere], waited: Collective, now_ns: int) -> None:
        self.records = {r.rank: _record_in(r, waited.pg) for r in ranks}
        self.members = self._members(ranks, waited)
        self.seq = max(c.seq for c in self.records.values() if c is not None)
        self.at = [r for r in self.members if self._seq(r) == self.seq]
        waiting = [c for r in self.at if not (c := self._record(r)).completed]
        #: the collective the others wait in, as the rank that waited longest issued it
        self.waited = min(waiting or [self._record(self.at[0])], key=lambda c: c.entered_ns)
        self.waited_s = max(now_ns - self.waited.entered_ns, 0) / 1e9

    def _members(self, ranks: Sequence[RankWhere], waited: Collective) -> list[RankWhere]:
        """The group's members as its ranks know them; where they do not say: every rank for
        the default group, else the ranks with a record in it."""
        if waited.members:
            return [r for r in ranks if r.rank in waited.members]
        if waited.pg_desc == "default_pg":
            return list(ranks)
        return [r for r in ranks if self.records[r.rank] is not None]

    def _seq(self, r: RankWhere) -> int:
        record = self.records[r.rank]
        return record.seq if record is not None else 0

    def _record(self, r: RankWhere) -> Collective:
        record = self.records[r.rank]
        assert record is not None
        return record

    def _verdict(self, kind: HangKind, text: str, culprits: list[RankWhere]) -> Verdict:
        culprit_ranks = tuple(r.rank for r in culprits)
        return Verdict(kind, text, self.waited, culprit_ranks, self.waited_s)

    def mismatch(self) -> Verdict | None:
        calls: dict[str, list[RankWhere]] = {}
        for r in self.at:
            calls.setdefault(self._record(r).signature, []).append(r)
        if len(calls) < 2:
            return None
        groups = sorted(calls.items(), key=lambda item: (-len(item[1]), item[1][0].rank))
        parts = [f"{_ranks(groups[0][1])} {_are(groups[0][1])} in {groups[0][0]}"]
        parts += [f"{_ranks(members)} in {call}" for call, members in groups[1:]]
        group = self._record(self.at[0]).group
        text = f"collective mismatch at #{self.seq} ({group}): " + ", ".join(parts)
        return self._verdict(HangKind.MISMATCH, text, [r for _, g in groups[1:] for r in g])

    def missing(self) -> Verdict | None:
        behind = [r for r in self.members if self._seq(r) < self.seq and r.answered]
        if not behind:
            return None
        text = (
            f"{_labels(behind)} never entered {self._call()}; {_others(self.at)} "
            f"{_have(self.at)} waited in it for {_seconds(self.waited_s)}"
        )
        text += "".join(f"; rank {r.rank} is {self._doing(r)}" for r in behind[:3])
        return self._verdict(HangKind.MISSING, text, behind)

    def stuck(self) -> Verdict:
        waited = _seconds(self.waited_s)
        silent = [r for r in self.members if not r.answered]
        if silent:
            why = "; ".join(f"rank {r.rank}: {r.note}" for r in silent[:3])
            text = (
                f"{_labels(silent)} {_are(silent)} silent ({why}); {_others(self.at)} "
                f"{_have(self.at)} waited in {self._call()} for {waited}"
            )
            return self._verdict(HangKind.STUCK, text, silent)
        inside = [r for r in self.at if not self._record(r).completed]
        if len(inside) < len(self.at):  # every member is at #M: the others are done with it
            text = (
                f"{_labels(inside)} {_have(inside)} been inside {self._call()} for {waited} "
                "after every other rank completed it"
            )
            return self._verdict(HangKind.STUCK, text, inside)
        text = (
            f"all {counted(len(self.at), 'rank')} have waited in {self._call()} for {waited}; "
            "none is missing and none called another op: the transport (network, NCCL, a device) "
            "is stuck"
        )
        return self._verdict(HangKind.STUCK, text, [])

    def _call(self) -> str:
        """``all_reduce #812 (pg 0, float32[1024])``."""
        c = self.waited
        return (
            f"{c.op} #{c.seq} ({c.group}, {c.args})" if c.args else f"{c.op} #{c.seq} ({c.group})"
        )

    def _doing(self, r: RankWhere) -> str:
        """Where a rank that is behind is: its own collective, its cell line, or done."""
        if not r.busy:
            return "done with the cell"
        own = r.waiting()
        if own is not None:
            return f"inside {own.op} #{own.seq} ({own.group})"
        line = r.cell_line()
        return f"at {line}" if line else "busy outside the cell's code"


def _record_in(r: RankWhere, pg: str) -> Collective | None:
    return next((c for c in r.collectives if c.pg == pg), None)


def _ranks(ranks: Sequence[RankWhere]) -> str:
    numbers = ", ".join(str(r.rank) for r in ranks[:8]) + (", …" if len(ranks) > 8 else "")
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {numbers}"


def _labels(ranks: Sequence[RankWhere]) -> str:
    """``rank 3 (node 1)``, or ``ranks 2, 3 (nodes 1, 1)`` shortened to the ranks."""
    if len(ranks) == 1:
        return ranks[0].label
    return _ranks(ranks)


def _others(ranks: Sequence[RankWhere]) -> str:
    """The ranks that wait, after the ones named: ``rank 0 (node 0)`` or ``the other 3 ranks``."""
    return ranks[0].label if len(ranks) == 1 else f"the other {counted(len(ranks), 'rank')}"


def _are(ranks: Sequence[object]) -> str:
    return "is" if len(ranks) == 1 else "are"


def _have(ranks: Sequence[object]) -> str:
    return "has" if len(ranks) == 1 else "have"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def explain(
    reason: str, ranks: Sequence[RankWhere], stop: bool = False
) -> tuple[Stacks, Verdict | None]:
    """``ranks`` (as ``NodeAgents.stacks`` gathered them) judged now: the ``Stacks`` event the views
    show, the verdict first, and the verdict itself (None when no rank waits). ``stop``: taken
    by a stop of the cell."""
    ordered = tuple(sorted(ranks, key=lambda r: r.rank))
    verdict = judge(ordered, time.time_ns())
    return Stacks(reason, ordered, verdict.text if verdict else "", stop), verdict
