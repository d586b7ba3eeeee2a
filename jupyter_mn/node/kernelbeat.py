"""Whether the kernel still beats, as a node agent sees it: a dead-man switch for a lost kernel.

The kernel calls ``NodeAgent.heartbeat`` every ``KERNEL_HEARTBEAT_S``; when it has been silent
for ``heartbeat_timeout`` the kernel is gone (``kill -9``, a lost laptop) and the agent stops its
ranks instead of holding GPUs forever (``upkeep.py`` looks). On the local backend the dask workers
would also die with the kernel (their nannies live in it); on a shared dask scheduler or
Kubernetes nothing else would notice.
"""

from __future__ import annotations

import time

#: How often the kernel beats to its node agents, and how often an agent looks.
KERNEL_HEARTBEAT_S = 2.0
CHECK_S = 0.5


class KernelBeat:
    """When the kernel last beat; it is gone after ``heartbeat_timeout`` seconds of silence."""

    def __init__(self, heartbeat_timeout: float) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self._last_beat = time.monotonic()

    def beat(self) -> None:
        self._last_beat = time.monotonic()

    def gone(self) -> bool:
        return time.monotonic() - self._last_beat > self.heartbeat_timeout
