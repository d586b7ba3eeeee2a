"""``Deadline``: an action called once a deadline passes, re-armed cheaply on a cell's path.

A ``Cluster`` has two: the idle release and the ``--max-runtime`` cost cap (``lifetime.py``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable


class Deadline:
    """Calls ``action`` once a deadline passes; re-armed every cell by one waiting thread
    (a ``threading.Timer`` per cell costs a thread start on the cell's path). The thread is
    woken only when the deadline moves sooner than it waits for: a cell disarms the idle
    release and arms it later again, and each wake-up would cost a thread switch on the cell's
    path; a waiter that wakes early finds the later deadline and waits on."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action = action
        self._due: float | None = None
        #: when the waiting thread wakes up next (None: not before it is notified)
        self._wakes: float | None = None
        #: the waiting thread's number; 0 when none waits (a closed thread sees another number)
        self._thread = 0
        self._numbers = itertools.count(1)
        self._cond = threading.Condition()

    def arm(self, seconds: float | None) -> None:
        """Fire ``seconds`` from now; None disarms."""
        with self._cond:
            self._due = None if seconds is None else time.monotonic() + seconds
            if self._due is None:
                return  # the waiter finds it disarmed when it wakes
            if not self._thread:
                self._thread = next(self._numbers)
                self._wakes = self._due
                threading.Thread(
                    target=self._wait, args=(self._thread,), name="jupyter-mn-idle", daemon=True
                ).start()
            elif self._wakes is None or self._due < self._wakes:
                self._wakes = self._due
                self._cond.notify()

    def close(self) -> None:
        """Disarm and let the waiting thread end (a later ``arm`` starts another)."""
        with self._cond:
            self._due, self._thread = None, 0
            self._cond.notify_all()

    def _wait(self, me: int) -> None:
        with self._cond:
            while self._thread == me:
                if self._due is None or time.monotonic() < self._due:
                    self._wakes = self._due
                    self._cond.wait(None if self._due is None else self._due - time.monotonic())
                    continue
                self._due = self._wakes = None
                self._cond.release()
                try:
                    self._action()
                finally:
                    self._cond.acquire()
