"""A node's cell ranks through their lives: started, joined, re-formed, restarted, stopped.

The node agent (``agent.py``) owns one; it starts the ranks (``process.py``) with the launch's
environment (``rank/env.py``), waits until every one joined the process group, re-forms the
group in place (``reinit``) or replaces the ranks (``relaunch``) after a failure, and stops them.
Each change of a rank's life is a ``RankState`` event through the node's output.
"""

from __future__ import annotations

import asyncio
import os

from ..errors import JoinTimeout
from ..rank.env import rank_env
from ..wire.debugwire import DebugAnswer, DebugEnded
from ..wire.events import Preemption, RankStatus
from ..wire.launchspec import Launch
from ..wire.rankwhere import RankWhere
from ..wire.rankwire import RankReady, Reform, Reformed
from . import template
from .exits import describe_exit
from .gpu import RankProcess
from .netif import socket_ifname
from .output import NodeOutput
from .process import RankHandle, start_in_session
from .telemetry import NodeTelemetry
from .visible import VISIBLE, check_count, gpu_uuids, visible


class NodeRanks:
    """This node's cell rank processes (``handles``) and the group generation they are in."""

    def __init__(self, output: NodeOutput) -> None:
        self.output = output
        self.node = output.node
        self.handles: list[RankHandle] = []
        self.generation = 0
        self._launch: Launch  # set by prepare(), before anything reads it
        self._command: list[str] = []
        self._start: template.Start = start_in_session  # forked from the template, once ready
        self._telemetry: NodeTelemetry | None = None
        #: the preemption notice these ranks were given (once)
        self._told: Preemption | None = None

    def prepare(self, launch: Launch, command: list[str]) -> None:
        """What ``start`` launches: ``command`` as ``launch`` says. Refuse a launch whose ranks
        would see fewer GPUs than there are ranks (NVML's count, tens of ms; CUDA stays
        uninitialized in the agent): said now, not once the ranks fail to find them."""
        self._launch, self._command = launch, command
        check_count(self.node, launch.gpus, len(visible(self._visible(), gpu_uuids())))

    async def start(self, telemetry: NodeTelemetry) -> list[RankReady]:
        """Launch this node's ranks and wait until every one joined group 0."""
        self._telemetry = telemetry
        ready = await self._spawn_all(generation=0)
        telemetry.started(self.sampled(), {r.backend for r in ready})
        return ready

    def _visible(self) -> str | None:
        """The ranks' ``CUDA_VISIBLE_DEVICES`` (None: unset)."""
        return {**os.environ, **self._launch.env}.get(VISIBLE)

    def sampled(self) -> list[RankProcess]:
        """The ranks as GPU sampling knows them (by pid)."""
        shown = self._visible() or ""
        return [RankProcess(r.rank, r.local_rank, r.proc.pid, shown) for r in self.handles]

    def _spawn(self, local: int, generation: int) -> RankHandle:
        launch = self._launch
        rank = self.node * launch.gpus + local
        env = rank_env(
            launch,
            self.node,
            local,
            generation=generation,
            socket_ifname=socket_ifname(launch.master_addr),
        )
        assert self._telemetry is not None
        env.update(self._telemetry.rank_env(rank, env))
        proc = RankHandle(self.output, local, rank, env, launch.cwd, self._command, self._start)
        self.output.rank_state(rank, RankStatus.STARTED, f"pid {proc.proc.pid}")
        return proc

    async def _spawn_all(self, generation: int) -> list[RankReady]:
        """Start every rank of this node and wait until they joined group ``generation``."""
        self.generation = generation
        self.handles = []
        self._start = await template.starter(self._launch.job)
        timeout = self._launch.start_timeout
        try:
            for local in range(self._launch.gpus):  # the ones started before a failure stop too
                self.handles.append(self._spawn(local, generation))
            joined = asyncio.gather(*(r.ready() for r in self.handles))
            # when the agent is stopped meanwhile nobody awaits it: mark its outcome as seen
            joined.add_done_callback(lambda f: f.cancelled() or f.exception())
            ready = await asyncio.wait_for(joined, timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise JoinTimeout(
                f"node {self.node}: ranks did not join the process group within {timeout:.0f} s"
            ) from None
        except BaseException:
            await self.stop()
            raise
        for r in ready:
            self.output.rank_state(r.rank, RankStatus.READY, f"{r.device} ({r.backend})")
        return ready

    async def reinit(self, generation: int, reconnect: bool = False) -> list[Reformed]:
        """Re-form the process group in place; namespaces survive."""
        self.generation = generation
        await asyncio.gather(*(r.send(Reform(generation, reconnect)) for r in self.handles))
        return list(await asyncio.gather(*(r.reformed() for r in self.handles)))

    async def retire(self, if_dead: bool = False) -> bool:
        """Stop the ranks before they are replaced (``if_dead``: only if one of them is dead);
        whether it did."""
        if if_dead and all(r.proc.poll() is None for r in self.handles):
            return False
        await self.stop()
        return True

    async def relaunch(self, generation: int) -> list[Reformed]:
        """Replace the ranks with fresh processes that join group ``generation``."""
        await self.stop()
        try:
            ready = await self._spawn_all(generation)
        except Exception as exc:
            return [Reformed(-1, False, str(exc))]
        assert self._telemetry is not None
        self._telemetry.restarted(self.sampled())
        return [Reformed(r.rank, True) for r in ready]

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.handles))
        # A dead rank's pipes reach EOF on the loop a moment after its exit: its last lines must
        # be read before the agent's last event (a later one brings the gang's topic back).
        await asyncio.gather(*(r.pipes.drained() for r in self.handles))
        for r in self.handles:
            self.output.rank_state(r.rank, RankStatus.EXITED, describe_exit(r.proc.returncode))

    def tell(self, notice: Preemption) -> None:
        """The notice, and nothing else, to the ranks, once: they decide when to stop."""
        if self._told is not None:
            return
        self._told = notice
        for r in self.handles:
            r.stacks.notify(notice)

    def kill_busy(self, reason: str) -> None:
        """Kill the ranks busy with a cell (nobody will wait for it: they would not read a
        stop)."""
        for r in self.handles:
            if r.running is not None:
                r.kill(reason)

    async def debug(self, rank: int, message: object = None) -> DebugAnswer:
        """Relay ``message`` to rank ``rank``'s pdb (``rank/debugger.py``); its next answer."""
        handle = next((r for r in self.handles if r.rank == rank), None)
        if handle is None:
            return DebugEnded(rank, error=f"rank {rank} is not on node {self.node}")
        return await handle.debug(message)

    async def where(self, stack: bool = True) -> list[RankWhere]:
        """Where each rank is (``RankHandle.where``)."""
        return list(await asyncio.gather(*(r.where(stack) for r in self.handles)))
