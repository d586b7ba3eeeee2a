"""Whether the kernel still beats, as a node agent sees it: a dead-man switch for a lost kernel.

The kernel calls ``NodeAgent.heartbeat`` every ``KERNEL_HEARTBEAT_S``; when it has been silent
for ``heartbeat_timeout`` the kernel is gone (``kill -9``, a lost laptop) and the agent stops its
ranks instead of holding GPUs forever (``upkeep.py`` looks). On the local backend the dask workers
would also die with the kernel (their nannies live in it); on a shared dask scheduler or
Kubernetes nothing else would notice.

Silence alone cannot tell a dead kernel from a busy one: the kernel beats from a Python thread,
and one long call on its main thread that never lets go of the GIL (IPython drawing the repr of a
256 MiB value: seconds per ``repr`` and per ``json.dumps``) silences it as surely as ``kill -9``.
So a silent kernel whose host still acknowledges its cell-stream connection at the TCP level
(``answered``: keepalive probes, which the kernel's OS answers whatever its Python does) is busy,
not gone, for up to ``BUSY_TIMEOUTS`` heartbeat timeouts (150 s by default). A killed kernel's
connection closes; a cut link or a frozen host stops acknowledging: both still count as gone after
``heartbeat_timeout``. A kernel on the agent's own host is busy while its process runs (not
stopped); from another host a stopped kernel process (``SIGSTOP``) looks busy: it is gone after
the longer wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: How often the kernel beats to its node agents, and how often an agent looks.
KERNEL_HEARTBEAT_S = 2.0
CHECK_S = 0.5
#: How many heartbeat timeouts a silent kernel whose host still answers counts as busy: past
#: them, gone all the same (a kernel stopped or stuck for good; a proxy, such as a port-forward,
#: answering for a lost one).
BUSY_TIMEOUTS = 10


class KernelBeat:
    """When the kernel last beat; it is gone after ``heartbeat_timeout`` seconds of silence
    unless ``answered(seconds)`` says its host acknowledged its connection that recently."""

    def __init__(
        self, heartbeat_timeout: float, answered: Callable[[float], bool] = lambda _: False
    ) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self._answered = answered
        self._last_beat = time.monotonic()

    def beat(self) -> None:
        self._last_beat = time.monotonic()

    def gone(self) -> bool:
        silent = time.monotonic() - self._last_beat
        if silent <= self.heartbeat_timeout:
            return False
        busy_limit = BUSY_TIMEOUTS * self.heartbeat_timeout
        return silent > busy_limit or not self._answered(self.heartbeat_timeout)
