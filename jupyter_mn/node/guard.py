"""The node agent's one periodic task: is it still wanted, are its ranks within their limits.

Every ``CHECK_S`` (or when woken: a cell ended, the agent stops) it stops the agent when dask no
longer holds it (its client is gone) or the kernel stopped beating (``watchdog.py``), kills a
rank over ``--memory-limit``, and samples GPUs and NCCL's transport while a cell runs (in a
thread: NVML and file reads block).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ..wire.events import GangState, GangStatus
from .ranks import NodeRanks
from .telemetry import SAMPLE_S, NodeTelemetry
from .watchdog import CHECK_S, Watchdog, mib

log = logging.getLogger("jupyter_mn.agent")


class NodeGuard:
    """The watch over one node agent, from its first call that starts processes to its stop."""

    def __init__(
        self,
        ranks: NodeRanks,
        held: Callable[[], bool],
        stop: Callable[[], Awaitable[object]],
        leave: Callable[[], Awaitable[None]],
    ) -> None:
        """``held``: whether dask still holds the agent; ``stop``: the agent's stop; ``leave``:
        end the worker too, once the kernel is gone (a worker of this gang's alone)."""
        self.ranks = ranks
        self._held, self._stop, self._leave = held, stop, leave
        self.wake = asyncio.Event()  # a look at the node is due now (a cell ended, or stop)
        self.closing = False
        self.watchdog: Watchdog | None = None  # set once the ranks started
        self.telemetry: NodeTelemetry | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._keep_watch())

    async def close(self) -> None:
        """No look after this one (a look in a thread, if any, ends before telemetry closes)."""
        self.closing = True
        if self._task is not None and self._task is not asyncio.current_task():
            self.wake.set()
            await asyncio.wait([self._task], timeout=2 * SAMPLE_S)

    async def _keep_watch(self) -> None:
        loop = asyncio.get_running_loop()
        last_look = loop.time()
        while not self.closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), CHECK_S)
            self.wake.clear()
            if self.closing:
                return
            if not self._held():
                await self._stop()
                return
            if self.watchdog is not None:
                if self.watchdog.kernel_gone():
                    await self._orphaned(self.watchdog)
                    return
                self._kill_over_memory(self.watchdog)
            telemetry = self.telemetry
            if telemetry is not None and telemetry.due(loop.time() - last_look >= SAMPLE_S):
                last_look = loop.time()
                try:
                    await loop.run_in_executor(None, telemetry.look)
                except Exception:  # a failed sample must not end the watch over the ranks
                    log.exception("node %s: telemetry failed", self.ranks.node)

    def _kill_over_memory(self, watchdog: Watchdog) -> None:
        running = {r.rank: r for r in self.ranks.handles if r.proc.poll() is None}
        over = watchdog.over_memory({k: r.proc.pid for k, r in running.items()})
        for rank, rss in over.items():
            limit = mib(watchdog.memory_limit or 0)
            running[rank].kill(f"out of memory: {mib(rss)} > --memory-limit {limit}")

    async def _orphaned(self, watchdog: Watchdog) -> None:
        """The kernel stopped beating: free the node rather than hold its GPUs forever."""
        why = f"node {self.ranks.node}: no heartbeat for {watchdog.heartbeat_timeout:.0f} s"
        self.ranks.output.publish(GangState(GangStatus.BROKEN, why))
        # busy with a cell nobody waits for: it would not read a stop
        self.ranks.kill_busy(f"the kernel is gone ({why})")
        await self._stop()
        await self._leave()
