"""A node agent's periodic checks: the kernel's heartbeat, and its ranks' memory.

Heartbeat (a dead-man switch): the kernel calls ``NodeAgent.heartbeat`` every
``HEARTBEAT_S``; when it has been silent for ``heartbeat_timeout`` the kernel is gone (``kill -9``,
a lost laptop) and the agent stops its ranks instead of holding GPUs forever. On the local backend
the dask workers would also die with the kernel (their nannies live in it); on a shared dask
scheduler or Kubernetes nothing else would notice.

Memory: with ``--memory-limit`` the agent kills a rank whose resident memory (with its children,
e.g. DataLoader workers) exceeds the limit, and says so, as dask's nanny does for workers. This is
the out-of-memory fault made explicit: the kernel's OOM killer sends the same SIGKILL, but without
a reason anyone can read.
"""

from __future__ import annotations

import contextlib
import time

import psutil

#: How often the kernel beats, and how often the agent looks.
HEARTBEAT_S = 2.0
CHECK_S = 0.5


class Watchdog:
    def __init__(self, heartbeat_timeout: float, memory_limit: int | None) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self.memory_limit = memory_limit
        self._last_beat = time.monotonic()

    def beat(self) -> None:
        self._last_beat = time.monotonic()

    def kernel_gone(self) -> bool:
        return time.monotonic() - self._last_beat > self.heartbeat_timeout

    def over_memory(self, pids: dict[int, int]) -> dict[int, int]:
        """``{rank: rss}`` of the ranks (given as ``{rank: pid}``) above the memory limit."""
        if not self.memory_limit:
            return {}
        over = {}
        for rank, pid in pids.items():
            rss = resident_memory(pid)
            if rss > self.memory_limit:
                over[rank] = rss
        return over


def resident_memory(pid: int) -> int:
    """Resident bytes of a process and its descendants (0 once it is gone)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"
