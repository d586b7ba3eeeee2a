"""The node agent's periodic task: is it still wanted, are its ranks under ``--memory-limit``?

Every ``CHECK_S`` (or when woken: a cell ended, the agent stops) it stops the agent when dask no
longer holds it (its client is gone) or the kernel stopped beating (``kernelbeat.py``), kills a
rank over ``--memory-limit`` (``rankmemory.py``), and samples GPUs and NCCL's transport while a
cell runs (in a thread: NVML and file reads block). Whether a cell hangs is the kernel's watch
(``gang/hangwatch.py``), not this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ..wire.events import GangState, GangStatus
from .kernelbeat import CHECK_S, KernelBeat
from .rankmemory import mib, over_memory
from .ranks import NodeRanks
from .telemetry import SAMPLE_S, NodeTelemetry

log = logging.getLogger("jupyter_mn.agent")


class NodeUpkeep:
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
        self.kernel: KernelBeat | None = None  # set once the ranks started
        self.memory_limit: int | None = None
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
            if self.kernel is not None:
                if self.kernel.gone():
                    await self._orphaned(self.kernel)
                    return
                self._kill_over_memory()
            telemetry = self.telemetry
            if telemetry is not None and telemetry.due(loop.time() - last_look >= SAMPLE_S):
                last_look = loop.time()
                try:
                    await loop.run_in_executor(None, telemetry.look)
                except Exception:  # a failed sample must not end the watch over the ranks
                    log.exception("node %s: telemetry failed", self.ranks.node)

    def _kill_over_memory(self) -> None:
        if not self.memory_limit:
            return
        running = {r.rank: r for r in self.ranks.handles if r.proc.poll() is None}
        over = over_memory({k: r.proc.pid for k, r in running.items()}, self.memory_limit)
        for rank, rss in over.items():
            limit = mib(self.memory_limit)
            running[rank].kill(f"out of memory: {mib(rss)} > --memory-limit {limit}")

    async def _orphaned(self, kernel: KernelBeat) -> None:
        """The kernel stopped beating: free the node rather than hold its GPUs forever."""
        why = f"node {self.ranks.node}: no heartbeat for {kernel.heartbeat_timeout:.0f} s"
        self.ranks.output.publish(GangState(GangStatus.BROKEN, why))
        # busy with a cell nobody waits for: it would not read a stop
        self.ranks.kill_busy(f"the kernel is gone ({why})")
        await self._stop()
        await self._leave()
