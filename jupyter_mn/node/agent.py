"""The node agent: a dask actor (one per node) that owns that node's rank processes.

The agent is the actor's face, composed of parts with one job each: its output to the kernel
(``output.py``: lines batched into events, unfinished lines, rank 0's displays), its cell ranks'
lives (``ranks.py``: start, re-form in place, restart, stop), cell runs (``cellrun.py``), a
script's processes (``script.py``) and the periodic upkeep (``upkeep.py``: the kernel's heartbeat,
``--memory-limit``, telemetry). A SIGTERM to the node is a preemption notice
(``preemption.py``).

Also used as a dask preload module: ``dask_setup`` makes the worker ignore SIGINT, because Jupyter
interrupts signal the kernel's whole process group, and a local worker is in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from typing import Any

from distributed import get_worker

from ..wire.cellendpoint import CellEndpoint
from ..wire.debugwire import DebugAnswer
from ..wire.events import GangState, GangStatus, NodeReply, Preemption, to_msg
from ..wire.launchspec import Launch
from ..wire.manifest import FileUpdate
from ..wire.payload import CellPayload
from ..wire.rankwhere import RankWhere
from ..wire.rankwire import RankReady, Reformed
from . import template
from .cellrun import CellRuns
from .cellserver import CellServer
from .files import NodeFiles, sees
from .kernelbeat import KernelBeat
from .output import NodeOutput
from .ports import listen_port
from .preemption import GracePeriod
from .process import STOP_GRACE_S, rank_command
from .ranks import NodeRanks
from .script import ScriptRun
from .telemetry import NodeTelemetry
from .upkeep import NodeUpkeep
from .valuerelay import RelaySink

log = logging.getLogger("jupyter_mn.agent")


def dask_setup(worker: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class NodeAgent:
    """Dask actor: start this node's ranks, relay cells, publish their output as events.

    Everything it does runs on the worker's event loop, which also reads the ranks' pipes and
    control sockets (no reader threads: each hop from one cost a wake-up on the cell's path), so
    its parts need no lock. Only telemetry's look (and ``transport()``, a plain actor method
    dask calls in a thread) runs off the loop; it touches telemetry alone and hands its events
    over (``NodeOutput.call_soon``).
    """

    def __init__(self, job: str, topic: str, node: int) -> None:
        self.job, self.topic, self.node = job, topic, node
        self._worker = get_worker()
        self.output = NodeOutput(node, lambda msg: self._worker.log_event(topic, msg))
        self.ranks = NodeRanks(self.output)
        self._upkeep = NodeUpkeep(self.ranks, self._held, self.stop, self._leave)
        self.cells = CellRuns(self.ranks, self._upkeep.wake)
        self._started = False
        self._telemetry: NodeTelemetry | None = None
        self._launch: Launch | None = None
        self._stream: CellServer | None = None
        self._grace: GracePeriod | None = None
        self.script: ScriptRun | None = None
        #: this gang's copy of the notebook's directory, where the node does not see it
        self.files = NodeFiles(job)
        template.prestart(job)  # its imports overlap the rest of the gang's start

    # ---- actor methods
    def endpoint(self) -> tuple[str, int]:
        """This node's address and a free port: where rank 0 will host the TCPStore."""
        host = self._worker.ip
        return host, listen_port(host)

    async def serve_cells(self) -> CellEndpoint:
        """Open this node's cell stream (``cellserver.py``); return where it listens. Across
        hosts it has the worker's security (TLS with the gang's certificates, if the worker's);
        on this host, a directory only this user may enter."""
        if self._stream is None:
            context = self._worker.security.get_listen_args("worker").get("ssl_context")
            self._stream = CellServer(self.start_run)
            await self._stream.start(self._worker.ip, context)
        return self._stream.endpoint

    def _kernel_runs(self) -> bool:
        """Whether the kernel, connected from this host, runs (``cellserver.py``)."""
        return self._stream is not None and self._stream.kernel_runs()

    def _begin(self, launch: Launch) -> None:
        """Once, from the first actor call that starts processes: the loop, the watch, and from
        now on a SIGTERM to this node is a preemption notice (``preemption.py``)."""
        if not self._started:
            self._started = True
            self.output.begin(asyncio.get_running_loop())
            self._upkeep.start()
        if self._grace is None:
            self._grace = GracePeriod(self.node, launch.grace, self._preempted, self._grace_over)
            self._grace.install()

    def _preempted(self, notice: Preemption) -> None:
        """This node was told to go: the kernel (which tells every node) and its ranks hear. A
        script's ranks here get the SIGTERM itself, as under torchrun or Slurm (the other nodes'
        learn it from them, as Lightning's agreed flag does: a SIGTERM to a rank already exiting
        would kill it)."""
        log.warning("%s; stopping in %.0f s", notice.text, notice.left())
        self.output.publish(notice)
        self.ranks.tell(notice)
        if self.script is not None:
            self.script.notify()

    async def preempt(self, notice: Preemption) -> None:
        """From the kernel: a node of the gang is being preempted (on the loop, as every send to
        the ranks is)."""
        self.ranks.tell(notice)

    async def _grace_over(self) -> None:
        """The deadline of the notice: stop the ranks (a busy one is killed), then the worker
        (``stop`` hands the SIGTERM on to its own handler)."""
        why = f"node {self.node}: the preemption's grace period ended"
        self.output.publish(GangState(GangStatus.BROKEN, why))
        self.ranks.kill_busy("the preemption's grace period ended")
        await self.stop()

    async def start(self, launch: Launch) -> list[RankReady]:
        """Launch this node's ranks and wait until every one has joined the process group."""
        self._begin(launch)
        self._launch = self._placed(launch)
        # a bad JUPYTER_MN_RANK_PYTHON, too few GPUs: refused before any rank starts
        self.ranks.prepare(self._launch, rank_command())
        telemetry = NodeTelemetry(self.node, launch, self.output.publish)
        self._telemetry = self.cells.telemetry = self._upkeep.telemetry = telemetry
        self.output.on_line = telemetry.line
        ready = await self.ranks.start(telemetry)
        self._upkeep.kernel = KernelBeat(launch.heartbeat_timeout, self._kernel_runs)
        self._upkeep.memory_limit = launch.memory_limit
        return ready

    def _placed(self, launch: Launch) -> Launch:
        """``launch`` with its working directory on this node: the gang's copy of the
        notebook's directory where it travels here."""
        return dataclasses.replace(launch, cwd=self.files.folder) if launch.files else launch

    async def sees_files(self, root: str, paths: list[str], stamp: str) -> bool:
        """Whether this node sees the kernel's directory itself (``node/files.py``)."""
        return await asyncio.to_thread(sees, root, paths, stamp)

    async def missing_files(self, digests: list[str]) -> list[str]:
        """The file contents this node lacks, of those the kernel is about to place."""
        return await asyncio.to_thread(self.files.missing, digests)

    async def update_files(self, update: FileUpdate) -> None:
        """Bring this gang's copy of the notebook's directory up to date."""
        await asyncio.to_thread(self.files.apply, update)

    def transport(self) -> dict[str, Any]:
        """This node's transport as NCCL's lines prove it so far (``--require-rdma`` checks it)."""
        assert self._telemetry is not None
        self._telemetry.poll()
        return to_msg(self._telemetry.report())

    async def run(self, payload: CellPayload, run_id: int = 0) -> bytes:
        """Run a cell on every rank of this node (the actor call; see ``start_run``): the
        reply packed, as dask carries bytes best."""
        return (await self.start_run(payload, run_id)).packed()

    def start_run(
        self, payload: CellPayload, run_id: int = 0, sink: RelaySink | None = None
    ) -> asyncio.Future[NodeReply]:
        """Send a cell to every rank of this node; the future is their ``NodeReply``
        (``cellrun.py``). The cell stream calls this from its read, with its connection as
        ``sink``: a rank's big reply goes there as it is read (``valuerelay.py``), and the
        reply's buffers (a value's arrays) go out of band."""
        return self.cells.start(payload, run_id, sink)

    async def interrupt(self, run_id: int = 0, generation: int | None = None) -> None:
        """Stop run ``run_id`` (``CellRuns.interrupt``)."""
        await self.cells.interrupt(run_id, generation)

    async def kill(self, run_id: int, reason: str) -> list[int]:
        """The last step of an interrupt: kill the ranks still busy with ``run_id``."""
        return self.cells.kill(run_id, reason)

    async def reinit(self, generation: int, reconnect: bool = False) -> list[Reformed]:
        """Re-form the process group in place; namespaces survive.

        ``reconnect``: rank 0 was restarted, so its c10d store is a new one.
        """
        return await self.ranks.reinit(generation, reconnect)

    async def retire(self, if_dead: bool = False) -> bool:
        """Stop this node's ranks before they are replaced (``if_dead``: only if one of them is
        dead, since a report of a death may come late). Returns whether it did.

        Rank 0's c10d store must be gone before the others reconnect, or they would find the
        old one still answering.
        """
        return await self.ranks.retire(if_dead)

    async def relaunch(self, generation: int) -> list[Reformed]:
        """Replace this node's ranks with fresh processes that join group ``generation``."""
        return await self.ranks.relaunch(generation)

    async def debug(self, rank: int, message: Any = None) -> DebugAnswer:
        """Relay ``message`` to rank ``rank``'s pdb (``rank/debugger.py``); its next answer."""
        return await self.ranks.debug(rank, message)

    async def stacks(self, stack: bool = True) -> list[RankWhere]:
        """Where each rank is: its main thread's stack in the cell's own line numbers (unless
        ``stack`` is False: the hang watchdog's poll) and its latest collectives."""
        return await self.ranks.where(stack)

    async def heartbeat(self) -> None:
        """The kernel is alive (see ``kernelbeat.py``)."""
        if self._upkeep.kernel is not None:
            self._upkeep.kernel.beat()

    def _held(self) -> bool:
        """Whether dask still holds this actor (its client is not gone)."""
        return any(actor is self for actor in self._worker.state.actors.values())

    async def _leave(self) -> None:
        """The kernel is gone: end the worker too where it is this gang's alone."""
        if self._launch is None or not self._launch.exit_when_orphaned:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self._worker.close(reason="jupyter_mn: the kernel is gone"), STOP_GRACE_S
            )
        os._exit(0)  # its scheduler lives in the silent kernel and may not answer

    async def run_script(self, launch: Launch) -> bytes:
        """Run a training script on this node's ranks (``%cluster run``); see node/script.py."""
        self._begin(launch)
        self.script = ScriptRun(self.output, self._placed(launch))
        outcomes = await self.script.wait()
        return NodeReply(self.node, self.output.flush(), tuple(outcomes)).packed()

    async def stop_script(self, signum: int = signal.SIGTERM, why: str = "") -> None:
        if self.script is not None:
            await self.script.stop(signum, why or "stopped by the kernel")

    async def stop(self) -> int:
        """Stop everything of this node; return the sequence number of its last event."""
        if self._grace is not None:  # a SIGTERM stops the worker again
            self._grace.close()
        await self._upkeep.close()
        await self.stop_script()
        await self.ranks.stop()
        await asyncio.to_thread(template.release, self.job)
        if self._stream is not None:  # a run in progress has its reply now (its ranks stopped)
            await self._stream.close(STOP_GRACE_S)
        if self._telemetry is not None:
            self._telemetry.close()
        self.files.remove()
        last = self.output.close()  # last: once the kernel has it, the topic can be dropped
        if self._grace is not None:  # a preempted node goes now
            asyncio.get_running_loop().call_soon(self._grace.hand_on)
        return last
