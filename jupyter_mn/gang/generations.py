"""A gang's process-group generations: re-formed in the background after a failure, waited for
by the next job, and the incarnations of its rank processes (``recover.py`` does the work)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .lifecycle import GangStatus
from .recover import Recovery

if TYPE_CHECKING:
    from .base import Gang


class Generations:
    """The re-forming in progress, the group's generation and the ranks' incarnation."""

    def __init__(
        self, gang: Gang, lock: threading.RLock, transition: Callable[[GangStatus, str], None]
    ) -> None:
        """``lock``: the gang's; ``transition``: the gang's one way to change its state."""
        self._gang, self._lock, self._transition = gang, lock, transition
        self._recovery: Recovery | None = None
        self.generation = 0
        #: bumped whenever rank processes were restarted (they hold no cached notebook names)
        self.incarnation = 0

    def recover(self, restart: set[int], notes: list[str] | None, if_dead: bool) -> None:
        """``Gang.recover``: re-form in the background, restarting the ``restart`` nodes' ranks."""
        with self._lock:  # settle() must find the recovery started once the state says so
            if self._gang.status not in (GangStatus.READY, GangStatus.RUNNING):
                return
            self._recovery = Recovery(self._gang, restart, list(notes or []), if_dead)
            self._transition(GangStatus.RENDEZVOUS, "re-forming the process group")
            self._recovery.start()

    def recovered(self, restart: set[int]) -> None:
        with self._lock:
            if self._gang.status != GangStatus.RENDEZVOUS:
                return  # closed meanwhile
            if restart:
                self.incarnation += 1
            self._transition(GangStatus.READY, "")

    def settle(self) -> list[str]:
        """Wait for a re-forming in progress; return what the user should be told about it."""
        with self._lock:
            recovery = self._recovery
        if recovery is None:
            return []
        recovery.join()
        with self._lock:
            if self._recovery is recovery:
                self._recovery = None
        return recovery.notes

    def next(self) -> int:
        self.generation += 1
        return self.generation
