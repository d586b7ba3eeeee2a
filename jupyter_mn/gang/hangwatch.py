"""The kernel's hang watch over one running cell (``--hang-timeout S``): do its ranks progress?

Unlike a node's upkeep (``node/upkeep.py``: the agent's processes, memory and the kernel's
heartbeat), it watches collectives, to notice a hang nobody set ``--timeout`` for.

A cell hangs when no rank has completed a collective or ended its cell for S seconds while at
least one waits in a collective (gloo's own timeout is 30 minutes, NCCL's 10). While a cell runs
the kernel asks every rank for its latest collectives (``WhereRequest(stack=False)``: the flight
recorder only, ~2 ms a rank) every S/5 seconds, between 0.5 and 10 s; any rank whose collectives
or busy state changed since the last look is progress. When S seconds pass without any, the
ranks are asked once more with their stacks, and the verdict (``verdict.py``) goes out as a
``Hung`` event with the ``Stacks``: the cell keeps running, the user decides. When the ranks
move again a ``Hung(over=True)`` says so; it fires again only after progress. A slow job that
keeps completing collectives, however slowly, never fires it.

The looks run on a thread of the job's own (a stacks call waits up to a second for a rank
holding the GIL in native code); their answers reach the run loop through the inbox.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..model.verdict import explain
from ..wire.events import Hung
from ..wire.rankwhere import RankWhere
from .inbox import Message

#: Bounds on how often the ranks are looked at.
MIN_POLL_S, MAX_POLL_S = 0.5, 10.0


@dataclass(frozen=True)
class Look:
    """A look at the ranks, as it reaches the run loop (``stack``: the confirming one)."""

    watch: HangWatch
    stack: bool
    ranks: Future[list[RankWhere]]


class Progress:
    """When the ranks last moved (pure: fed the looks and the time)."""

    def __init__(self, timeout: float, now: float) -> None:
        self.timeout = timeout
        self.moved_at = now
        self.fired = False
        self._marks: dict[int, tuple[object, ...]] = {}

    def moved(self, now: float) -> None:
        """A rank ended its cell (its node answered) or changed its collectives."""
        self.moved_at, self.fired = now, False

    def saw(self, ranks: Sequence[RankWhere], now: float) -> bool:
        """Take a look; True when the cell now counts as hung and has not been reported."""
        marks = {r.rank: r.progress() for r in ranks if r.answered}
        if any(self._marks.get(rank) != mark for rank, mark in marks.items()):
            if self._marks:  # the first look sets the marks; only a change is progress
                self.moved(now)
            self._marks.update(marks)
        waiting = any(r.busy and r.waiting() is not None for r in ranks)
        return waiting and not self.fired and now - self.moved_at >= self.timeout


class HangWatch:
    """One cell's watchdog: polls the ranks when due and reports a hang once per stall."""

    def __init__(
        self,
        timeout: float,
        now: float,
        stacks: Callable[[bool], list[RankWhere]],
        post: Callable[[Message], None],
    ) -> None:
        self.progress = Progress(timeout, now)
        self.poll_s = min(max(timeout / 5, MIN_POLL_S), MAX_POLL_S)
        self._next = now + self.poll_s
        self._stacks, self._post = stacks, post
        self._looking = False
        #: the hang reported and not over yet
        self._reported: Hung | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="jupyter-mn-hangwatch")

    def tick(self, now: float) -> None:
        if not self._looking and now >= self._next:
            self._look(stack=False)

    def _look(self, stack: bool) -> None:
        self._looking = True
        future = self._pool.submit(self._stacks, stack)
        future.add_done_callback(lambda f: self._post(Message(Look(self, stack, f))))

    def take(self, look: Look, now: float, reason: str) -> list[Any]:
        """A look came back: the events to show (a ``Hung`` and its ``Stacks``), or none."""
        self._looking = False
        self._next = now + self.poll_s
        try:
            ranks = look.ranks.result()
        except Exception:  # an agent that does not answer: the heartbeat deals with it
            return []
        hung = self.progress.saw(ranks, now)
        if self._reported is not None and not self.progress.fired:  # it moved on since
            over, self._reported = Hung(self._reported.verdict, self._reported.silent_s, True), None
            return [over]
        if hung and not look.stack:  # confirm with the stacks, which the user will want
            self._look(stack=True)
            return []
        if not hung:
            return []
        stacks, verdict = explain(reason, ranks)
        if verdict is None:
            return []
        self.progress.fired = True
        self._reported = Hung(verdict.text, now - self.progress.moved_at)
        return [self._reported, stacks]

    def close(self) -> None:
        self._pool.shutdown(wait=False)
