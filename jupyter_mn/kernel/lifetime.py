"""When a ``Cluster``'s warm gang goes without being asked to.

``idle_timeout`` after its last job ends (the idle release), and the cost cap: ``max_runtime``
after it came up (``--max-runtime``), or once its nodes have used ``max_gpu_hours``
(``--max-gpu-hours``, counted by the gang's ``Meter`` from its nodes being up), whichever comes
first. Neither tears a gang down under a running job: the cap stops the job through the same
interrupt request as Ctrl-C (a job that holds the cluster but whose run has not started yet, say
a cell still sending its files, is stopped as its run starts), and the gang goes when the job has
ended (``Cluster``'s job slot asks ``expired``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..model.usage import cap_seconds, text
from .deadline import Deadline

if TYPE_CHECKING:
    from ..model.spec import ClusterSpec
    from ..model.usage import Meter


class GangLifetime:
    """The idle release and the cost cap of one cluster's gang, each a ``Deadline``."""

    def __init__(
        self,
        lock: threading.RLock,
        busy: Callable[[], bool],
        drop: Callable[[str], None],
        stop: Callable[[str], None],
    ) -> None:
        """``lock``: the cluster's, held while the gang changes; ``busy``: whether a job runs;
        ``drop(why)``: tear the gang down (if any), saying why; ``stop(why)``: stop the job, and
        any the gang runs after it."""
        self._lock, self._busy, self._drop, self._stop = lock, busy, drop, stop
        self._idle = Deadline(self._release_idle)
        self._idle_timeout = 0.0
        self._expiry = Deadline(self._expire)
        #: what the armed cap says when it fires ("": no gang, or no cap)
        self._reason = ""
        self._up_at = 0.0
        self._meter: Meter | None = None
        #: why the cap stopped the running job ("" if it did not): the gang goes when it ends
        self.expired = ""

    def started(self, spec: ClusterSpec, meter: Meter) -> None:
        """A gang came up now (its nodes at ``meter.up_at``): its cost cap counts from here."""
        self._up_at = time.monotonic()
        self._meter = meter
        self.cap(spec)

    def cap(self, spec: ClusterSpec) -> None:
        """(Re-)arm the cost cap, counted from the gang's start: the sooner of ``max_runtime``
        and ``max_gpu_hours``."""
        caps = []
        if spec.max_runtime is not None:
            left = self._up_at + spec.max_runtime - time.monotonic()
            caps.append((left, f"--max-runtime {spec.max_runtime:g} s reached"))
        if spec.max_gpu_hours is not None and self._meter is not None:
            meter = self._meter
            held = cap_seconds(spec.max_gpu_hours, meter.slots)
            used = f"{text(spec.max_gpu_hours, meter.unit)}: {meter.slots} × {held:.4g} s"
            caps.append((held - meter.seconds(), f"--max-gpu-hours reached ({used})"))
        left, self._reason = min(caps, default=(None, ""))
        self._expiry.arm(None if left is None else max(left, 0))

    def idle(self, seconds: float | None) -> None:
        """Release the gang ``seconds`` from now unless a job runs then; None: not while a job
        runs (armed again when it ends)."""
        if seconds is not None:
            self._idle_timeout = seconds
        self._idle.arm(seconds)

    def gone(self) -> None:
        """The gang was torn down: no cap to enforce."""
        self._reason, self._meter = "", None
        self._expiry.arm(None)

    def take_expired(self) -> str:
        """Why the cap stopped the job that just ended ("" if it did not); cleared."""
        why, self.expired = self.expired, ""
        return why

    def close(self) -> None:
        self._idle.close()
        self._expiry.close()

    def _expire(self) -> None:
        """The cost cap is reached: tear the gang down now, or once its running job is stopped."""
        with self._lock:
            reason = self._reason
            if not reason:  # the gang went meanwhile
                return
            if not self._busy():
                self._drop(f"torn down: {reason}")
                return
            self.expired = reason
        self._stop(reason)

    def _release_idle(self) -> None:
        with self._lock:
            if not self._busy():
                self._drop(f"released after {self._idle_timeout:g} s idle")
