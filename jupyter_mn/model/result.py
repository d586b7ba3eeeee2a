"""``CellResult``: a cell's outcome as a value (rank 0's result, per-rank status, root cause)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import CellError, CellInterrupted, NodeLost, Preempted, RankLost
from ..wire.events import CellOutcome, Preemption, RankError, RankStatus, RankTiming
from ..wire.plural import counted

#: a rank's outcome of a cell
OK, ERROR, LOST, INTERRUPTED = (
    RankStatus.OK,
    RankStatus.ERROR,
    RankStatus.LOST,
    RankStatus.INTERRUPTED,
)


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    node: int
    local_rank: int
    status: RankStatus
    duration: float | None = None
    error: RankError | None = None
    #: Wall-clock time the rank finished (``time.time()``), to order failures across ranks.
    finished_at: float | None = None
    #: The last collective the rank entered (``rank/timing.py``): name, key, entered_ns/_s.
    collective: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank} (node {self.node})"


@dataclass(frozen=True)
class PreemptionOutcome:
    """A cell during which a node was preempted: the notice, and the newest checkpoint the
    ranks completed after it (``""``: none) with how many seconds after the notice."""

    notice: Preemption
    checkpoint: str = ""
    after_s: float | None = None

    def text(self) -> str:
        head = f"node {self.notice.node} was preempted: {self.notice.cause.text}"
        if not self.checkpoint:
            return f"{head}; no checkpoint was completed after the notice"
        after = f", written {self.after_s:.1f} s after the notice" if self.after_s else ""
        return f"{head}; checkpoint {self.checkpoint} is COMPLETE{after}"


@dataclass
class CellResult:
    """What a cell run produced. ``unwrap()`` gives rank 0's value or raises the root cause."""

    ranks: list[RankOutcome]
    value: Any = None
    values: list[Any] | None = None
    displays: list[dict[str, Any]] = field(default_factory=list)
    pulled: dict[str, Any] = field(default_factory=dict)
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: why the cell was stopped (``--timeout``, Ctrl-C, ``--max-runtime``); empty otherwise
    interrupted: str = ""
    #: the hang verdict when it was stopped while ranks waited in a collective (``verdict.py``)
    verdict: str = ""
    #: the ranks that verdict names as holding the others up
    culprits: tuple[int, ...] = ()
    #: a node was preempted while the cell ran: the cell did not finish its work (its loop
    #: saved and stopped, or the deadline stopped it), even when every rank returned
    preemption: PreemptionOutcome | None = None

    @property
    def ok(self) -> bool:
        return self.preemption is None and all(r.status == OK for r in self.ranks)

    @property
    def outcome(self) -> CellOutcome:
        """The word the cell's view shows, from its root cause."""
        if self.preemption is not None:
            return CellOutcome.PREEMPTED
        cause = self.root_cause
        if cause is None:
            return CellOutcome.DONE
        if cause.status == INTERRUPTED:
            return CellOutcome.HUNG if self.verdict else CellOutcome.INTERRUPTED
        return CellOutcome.LOST if cause.status == LOST else CellOutcome.FAILED

    @property
    def root_cause(self) -> RankOutcome | None:
        """The failure that started it: a lost node, the rank the hang verdict names, a lost
        rank or a primary error, a rank interrupted in its own code, then the ranks that only
        waited on it (secondary errors, interrupted waits); the earliest first within each.

        Secondary errors come last whatever the order they arrived in: a stop or an abort makes
        the waiting ranks' collectives raise, sometimes before the interrupt reaches the rank
        the others waited for.
        """
        failed = [r for r in self.ranks if r.status != OK]
        if not failed:
            return None

        def order(r: RankOutcome) -> tuple[int, float, int]:
            secondary = bool(r.error and r.error.secondary)
            if r.error and r.error.node_lost:  # explains its peers' kills
                kind = -1
            elif r.rank in self.culprits:
                kind = 0
            elif r.status == LOST or (r.status == ERROR and not secondary):
                kind = 1
            elif r.status == INTERRUPTED and not secondary:  # busy in its own code
                kind = 2
            else:  # waited on a peer
                kind = 3
            return (kind, r.finished_at or float("inf"), r.rank)

        return min(failed, key=order)

    def timings(self) -> tuple[RankTiming, ...]:
        """Per rank: cell time, last collective, and how long it waited there for the others.

        Waits are comparable only between ranks whose last collective is the same one (same
        group and sequence number); the rank that entered it last waited ~0.
        """
        keys = [tuple(r.collective["key"]) for r in self.ranks if r.collective]
        common = keys[0] if keys and len(keys) == len(self.ranks) and len(set(keys)) == 1 else None
        last = max((r.collective["entered_ns"] for r in self.ranks if r.collective), default=0)
        out = []
        for r in self.ranks:
            c = r.collective or {}
            waited = (last - c["entered_ns"]) / 1e9 if common and c else None
            out.append(
                RankTiming(
                    r.rank,
                    r.node,
                    r.status,
                    r.duration,
                    c.get("name", ""),
                    c.get("entered_s"),
                    waited,
                )
            )
        return tuple(out)

    def unwrap(self, verdict_shown: bool = False) -> Any:
        """Return rank 0's value (every rank's with ``--all``) or raise a ``CellError``."""
        if self.ok:
            return self.values if self.values is not None else self.value
        raise self.error(verdict_shown)

    def error(self, verdict_shown: bool = False) -> CellError:
        """The root cause as an exception; ``verdict_shown``: a view shows the hang verdict
        above the error, which then does not say it again."""
        if self.preemption is not None:
            return self._preempted(self.preemption)
        cause = self.root_cause
        assert cause is not None and cause.error is not None
        others = [r for r in self.ranks if r.status != OK and r is not cause]
        notes = list(self.notes)
        if others:
            kinds = sorted({r.error.ename if r.error else r.status for r in others})
            notes.append(
                f"{counted(len(others), 'other rank')} stopped as a consequence "
                f"({', '.join(r.label for r in others[:6])}"
                f"{', …' if len(others) > 6 else ''}: {', '.join(kinds)})"
            )
        cls = {LOST: RankLost, INTERRUPTED: CellInterrupted}.get(cause.status, CellError)
        what = cause.error.evalue if cause.status == LOST else cause.error.line()
        message = f"{cause.label} {_verb(cause.status)} {what}"
        if cause.error.node_lost:
            cls, message = NodeLost, f"node {cause.node} was lost: {what}"
        if self.interrupted and self.verdict:  # the ranks' errors are its consequences
            notes.insert(0, f"then {message}")
            message = "the ranks hung (the verdict above)" if verdict_shown else self.verdict
        if self.interrupted:
            cls, message = CellInterrupted, f"{self.interrupted}: {message}"
        return cls(message, result=self, traceback=list(cause.error.traceback), notes=notes)

    def _preempted(self, outcome: PreemptionOutcome) -> Preempted:
        failed = [r for r in self.ranks if r.status != OK]
        notes = list(self.notes)
        if failed:
            notes.append(f"{_ranks(failed)} stopped with it")
        notice = outcome.notice
        return Preempted(
            outcome.text(),
            self,
            node=notice.node,
            cause=notice.cause.value,
            checkpoint=outcome.checkpoint,
            notes=notes,
        )


def _ranks(outcomes: list[RankOutcome]) -> str:
    numbers = ", ".join(str(r.rank) for r in outcomes[:8]) + (", …" if len(outcomes) > 8 else "")
    return f"{'rank' if len(outcomes) == 1 else 'ranks'} {numbers}"


def _verb(status: RankStatus) -> str:
    return {LOST: "was lost:", INTERRUPTED: "was interrupted:"}.get(status, "raised")
