"""Ranks' resident memory against ``--memory-limit``: the out-of-memory fault made explicit.

With ``--memory-limit`` the agent kills a rank whose resident memory (with its children, e.g.
DataLoader workers) exceeds the limit, and says so, as dask's nanny does for workers
(``upkeep.py`` looks). The kernel's OOM killer sends the same SIGKILL, but without a reason anyone
can read.
"""

from __future__ import annotations

import contextlib

import psutil


def over_memory(pids: dict[int, int], limit: int) -> dict[int, int]:
    """``{rank: rss}`` of the ranks (given as ``{rank: pid}``) above ``limit`` bytes."""
    over = {}
    for rank, pid in pids.items():
        rss = resident_memory(pid)
        if rss > limit:
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
