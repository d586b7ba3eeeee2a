"""Whether the kernel still beats, as a node agent sees it: a dead-man switch for a lost kernel.

The kernel calls ``NodeAgent.heartbeat`` every ``KERNEL_HEARTBEAT_S``; when it has been silent
for ``heartbeat_timeout`` the kernel is gone (``kill -9``, a lost laptop) and the agent stops its
ranks instead of holding GPUs forever (``upkeep.py`` looks). On the local backend the dask workers
would also die with the kernel (their nannies live in it); on a shared dask scheduler or
Kubernetes nothing else would notice.

Silence alone cannot tell a dead kernel from a busy one: the kernel beats from a Python thread,
and one long call on its main thread that never lets go of the GIL (IPython drawing the repr of a
256 MiB value: seconds per ``repr`` and per ``json.dumps``) silences it as surely as ``kill -9``.
So a silent kernel on the agent's own host whose process runs (``runs``: its cell stream's
AF_UNIX peer, not stopped) is busy, not gone, for up to ``BUSY_TIMEOUTS`` heartbeat timeouts
(150 s by default); a killed or stopped one is gone after ``heartbeat_timeout``. From another host
the agent cannot see the kernel's process (the TCP acknowledgements it tried outlived a cut link
in the test of a partition, which must stop the ranks within the timeout), so a kernel there is
gone after ``heartbeat_timeout`` of silence, busy or not.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: How often the kernel beats to its node agents, and how often an agent looks.
KERNEL_HEARTBEAT_S = 2.0
CHECK_S = 0.5
#: How many heartbeat timeouts a silent kernel whose process runs counts as busy: past them,
#: gone all the same (a kernel stuck for good).
BUSY_TIMEOUTS = 10


class KernelBeat:
    """When the kernel last beat; it is gone after ``heartbeat_timeout`` seconds of silence
    unless ``runs()`` says its process runs on this host (then after ``BUSY_TIMEOUTS`` of them)."""

    def __init__(self, heartbeat_timeout: float, runs: Callable[[], bool] = lambda: False) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self._runs = runs
        self._last_beat = time.monotonic()

    def beat(self) -> None:
        self._last_beat = time.monotonic()

    def gone(self) -> bool:
        silent = time.monotonic() - self._last_beat
        if silent <= self.heartbeat_timeout:
            return False
        busy_limit = BUSY_TIMEOUTS * self.heartbeat_timeout
        return silent > busy_limit or not self._runs()
