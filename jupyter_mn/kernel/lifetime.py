"""When a ``Cluster``'s warm gang goes without being asked to.

``idle_timeout`` after its last job ends (the idle release), and ``max_runtime`` after it came up
(the cost cap, ``--max-runtime``). Neither tears a gang down under a running job: the cap stops
the job through the same interrupt request as Ctrl-C, and the gang goes when the job has ended
(``Cluster``'s job slot asks ``expired``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .deadline import Deadline


class GangLifetime:
    """The idle release and the cost cap of one cluster's gang, each a ``Deadline``."""

    def __init__(
        self,
        lock: threading.RLock,
        busy: Callable[[], bool],
        drop: Callable[[str], None],
        cancel: Callable[[str], bool],
    ) -> None:
        """``lock``: the cluster's, held while the gang changes; ``busy``: whether a job runs;
        ``drop(why)``: tear the gang down (if any), saying why; ``cancel(why)``: stop the job."""
        self._lock, self._busy, self._drop, self._cancel = lock, busy, drop, cancel
        self._idle = Deadline(self._release_idle)
        self._idle_timeout = 0.0
        self._expiry = Deadline(self._expire)
        #: the cost cap of the warm gang, counted from ``_up_at`` (None: no gang, or no cap)
        self._cap: float | None = None
        self._up_at = 0.0
        #: why the cap stopped the running job ("" if it did not): the gang goes when it ends
        self.expired = ""

    def started(self, max_runtime: float | None) -> None:
        """A gang came up now: its cost cap counts from here."""
        self._up_at = time.monotonic()
        self.cap(max_runtime)

    def cap(self, max_runtime: float | None) -> None:
        """(Re-)arm the cost cap, counted from the gang's start."""
        self._cap = max_runtime
        left = None if max_runtime is None else max(self._up_at + max_runtime - time.monotonic(), 0)
        self._expiry.arm(left)

    def idle(self, seconds: float | None) -> None:
        """Release the gang ``seconds`` from now unless a job runs then; None: not while a job
        runs (armed again when it ends)."""
        if seconds is not None:
            self._idle_timeout = seconds
        self._idle.arm(seconds)

    def gone(self) -> None:
        """The gang was torn down: no cap to enforce."""
        self._cap = None
        self._expiry.arm(None)

    def take_expired(self) -> str:
        """Why the cap stopped the job that just ended ("" if it did not); cleared."""
        why, self.expired = self.expired, ""
        return why

    def close(self) -> None:
        self._idle.close()
        self._expiry.close()

    def _expire(self) -> None:
        """``max_runtime`` is up: tear the gang down now, or once its running job is stopped."""
        with self._lock:
            if self._cap is None:  # the gang went meanwhile
                return
            reason = f"--max-runtime {self._cap:g} s reached"
            if not self._busy():
                self._drop(f"torn down: {reason}")
                return
            self.expired = reason
        self._cancel(reason)

    def _release_idle(self) -> None:
        with self._lock:
            if not self._busy():
                self._drop(f"released after {self._idle_timeout:g} s idle")
