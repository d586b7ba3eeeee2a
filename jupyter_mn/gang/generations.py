"""A gang's process-group generations: re-formed in the background after a failure, waited for
by the next job, and the incarnations of its rank processes (``recover.py`` does the work)."""

from __future__ import annotations

from .core import GangCore
from .lifecycle import GangStatus
from .recover import Recovery


class Generations:
    """The re-forming in progress, the group's generation and the ranks' incarnation."""

    def __init__(self, core: GangCore) -> None:
        self._core = core
        self._recovery: Recovery | None = None
        self.generation = 0
        #: bumped whenever rank processes were restarted (they hold no cached notebook names)
        self.incarnation = 0

    def recover(
        self, restart: set[int], notes: list[str] | None = None, if_dead: bool = False
    ) -> None:
        """Re-form the group in the background, restarting the ranks of the ``restart`` nodes
        (``if_dead``: only those with a dead rank); ``notes`` are for the next job."""
        core = self._core
        with core.lock:  # settle() must find the recovery started once the state says so
            if core.status not in (GangStatus.READY, GangStatus.RUNNING):
                return
            self._recovery = Recovery(
                core, restart, list(notes or []), if_dead, self._next, self._recovered
            )
            core.transition(GangStatus.RENDEZVOUS, "re-forming the process group")
            self._recovery.start()

    def _recovered(self, restart: set[int]) -> None:
        core = self._core
        with core.lock:
            if core.status != GangStatus.RENDEZVOUS:
                return  # closed meanwhile
            if restart:
                self.incarnation += 1
            core.transition(GangStatus.READY, "")

    def settle(self) -> list[str]:
        """Wait for a re-forming in progress; return what the user should be told about it."""
        with self._core.lock:
            recovery = self._recovery
        if recovery is None:
            return []
        recovery.join()
        with self._core.lock:
            if self._recovery is recovery:
                self._recovery = None
        return recovery.notes

    def _next(self) -> int:
        self.generation += 1
        return self.generation
