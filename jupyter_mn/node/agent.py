"""The node agent: a dask actor (one per node) that owns that node's rank processes.

The agent starts its ranks (``process.py``), relays cells to them, batches their output lines into
events (~5 ms) with the lines they are still writing (progress bars, every ``PARTIAL_S`` at most),
and learns of a rank's death from EOF at once. After a failure it re-forms the
group in place (``reinit``) or restarts its ranks (``relaunch``); it stops them itself when the
kernel's heartbeat stops, and kills a rank over ``--memory-limit`` (``watchdog.py``).

Also used as a dask preload module: ``dask_setup`` makes the worker ignore SIGINT, because Jupyter
interrupts signal the kernel's whole process group, and a local worker is in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import threading
from typing import Any

from distributed import get_worker

from ..collectives import RankWhere
from ..debugwire import DebugAnswer, DebugEnded
from ..errors import JoinTimeout
from ..events import (
    DisplayOutput,
    Displays,
    GangState,
    GangStatus,
    LogLines,
    NodeReply,
    Preemption,
    RankPaused,
    RankState,
    RankStatus,
    to_msg,
)
from ..launch import Launch
from ..manifest import FileUpdate
from ..rank.env import rank_env
from . import template
from .cellserver import CellServer
from .displaybatch import DisplayBatch
from .files import NodeFiles, sees
from .gpu import RankProcess
from .netif import socket_ifname
from .ports import listen_port
from .preemption import GracePeriod
from .process import STOP_GRACE_S, RankHandle, describe_exit, pack, rank_command, start_in_session
from .script import ScriptRun
from .telemetry import SAMPLE_S, NodeTelemetry
from .visible import VISIBLE, check_count, gpu_uuids, visible
from .watchdog import CHECK_S, Watchdog, mib

log = logging.getLogger("jupyter_mn.agent")
#: Lines arriving within this window share one event.
BATCH_S = 0.005
#: A line still being written (a progress bar redrawn with \r) is sent at most this often per
#: node while it changes (5 updates/s: smooth, and a small share of the IOPub budget) ...
PARTIAL_S = 0.2
#: ... and again this long after it last went out while it stands unchanged, so a view that
#: writes it seldom (the text view) still gets to show its latest state.
PARTIAL_REPEAT_S = 2.0
#: Rank 0's displays go out at most this often (a plot redrawn every step: 5 frames/s) ...
DISPLAY_S = 0.2
#: ... and within this many bytes a second (a quarter of Jupyter's IOPub data limit, 1 MB/s).
DISPLAY_BYTES_PER_S = 250_000


def dask_setup(worker: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class NodeAgent:
    """Dask actor: start this node's ranks, relay cells, publish their output as events.

    Everything it does runs on the worker's event loop, which also reads the ranks' pipes and
    control sockets (no reader threads: each hop from one cost a wake-up on the cell's path), so
    its line, partial and display buffers need no lock. Only telemetry's look (and
    ``transport()``, a plain actor method dask calls in a thread) runs off the loop; it touches
    telemetry alone and hands its events over (``call_soon``). One task (``_keep_watch``) does
    the periodic work.
    """

    def __init__(self, job: str, topic: str, node: int) -> None:
        self.job, self.topic, self.node = job, topic, node
        self._worker = get_worker()
        self._ranks: list[RankHandle] = []
        self._buffer: list[tuple[int, str, str]] = []
        self._flush_armed = False
        #: the unfinished line of each (rank, stream), "" once cleared until that is sent
        self._partials: dict[tuple[int, str], str] = {}
        self._partial_changed = False
        self._partial_timer: asyncio.TimerHandle | None = None
        self._partial_sent = 0.0
        #: rank display calls not sent yet, per rank, and when the next batch may go
        self._displays: dict[int, DisplayBatch] = {}
        self._display_armed = False
        self._display_timer: asyncio.TimerHandle | None = None
        self._display_next = 0.0
        self._seq = 0
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake = asyncio.Event()  # a look at the node is due now (a cell ended, or stop)
        self._telemetry: NodeTelemetry | None = None
        self._launch: Launch  # set by start(), before anything reads it
        self._command: list[str] = []  # how a cell rank starts (set by start())
        self._start: template.Start = start_in_session  # forked from the template, once ready
        self._generation = 0
        self._cells: CellServer | None = None
        self._run_id = 0
        self._watchdog: Watchdog | None = None
        self._guard: asyncio.Task[None] | None = None
        self._grace: GracePeriod | None = None
        #: the preemption notice this node's ranks were given (once)
        self._told: Preemption | None = None
        self.script: ScriptRun | None = None
        #: this gang's copy of the notebook's directory, where the node does not see it
        self.files = NodeFiles(job)
        template.prestart(job)  # its imports overlap the rest of the gang's start

    # ---- called from the loop (``call_soon`` from telemetry's thread too)
    def call_soon(self, fn: Any, *args: Any) -> None:
        assert self._loop is not None
        if threading.get_ident() == self._loop_thread:  # no wake-up of the loop needed
            self._loop.call_soon(fn, *args)
            return
        with contextlib.suppress(RuntimeError):  # loop closed while the worker shuts down
            self._loop.call_soon_threadsafe(fn, *args)

    def log(self, rank: int, stream: str, line: str) -> None:
        if self._telemetry is not None:
            self._telemetry.line(line)
        self._buffer.append((rank, stream, line))
        self._partials.pop((rank, stream), None)  # the line is done: views drop its partial
        if self._flush_armed:
            return
        self._flush_armed = True
        # the window counts from this first line, not from when the loop gets to it
        assert self._loop is not None
        self.call_soon(self._loop.call_at, self._loop.time() + BATCH_S, self.flush)

    def partial(self, rank: int, stream: str, text: str) -> None:
        self._partials[(rank, stream)] = text
        if self._partial_changed:
            return
        self._partial_changed = True
        self.call_soon(self._schedule_partials, PARTIAL_S)

    def _schedule_partials(self, after: float) -> None:
        """Send the unfinished lines ``after`` seconds after they last went out (not sooner
        than a line batch would); an earlier due time wins over a later one."""
        assert self._loop is not None
        if self._closing:  # stop() sent the last event: nothing may follow it
            return
        due = max(self._loop.time() + BATCH_S, self._partial_sent + after)
        timer = self._partial_timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self._partial_timer = self._loop.call_at(due, self._send_partials)

    def _send_partials(self) -> None:
        assert self._loop is not None
        self._partial_timer, self._partial_sent = None, self._loop.time()
        self.flush(partials=True)
        standing = bool(self._partials)
        if standing:
            self._schedule_partials(PARTIAL_REPEAT_S)

    def flush(self, always: bool = False, partials: bool = False) -> int:
        """Publish buffered lines as one ``LogLines`` (``always``: even none, as a last event;
        ``partials``: with the unfinished lines); return the last sequence number sent."""
        lines, self._buffer = self._buffer, []
        self._flush_armed = False
        unfinished: tuple[tuple[int, str, str], ...] = ()
        if partials:
            self._partial_changed = False
            unfinished = tuple((r, s, t) for (r, s), t in sorted(self._partials.items()))
            self._partials = {k: t for k, t in self._partials.items() if t}
        if lines or unfinished or always:
            items: list[tuple[int, str, list[str]]] = []
            for rank, stream, text in lines:
                if items and items[-1][0] == rank and items[-1][1] == stream:
                    items[-1][2].append(text)
                else:
                    items.append((rank, stream, [text]))
            self._seq += 1
            self._publish(
                LogLines(
                    self.node,
                    self._seq,
                    tuple((r, s, tuple(t)) for r, s, t in items),
                    unfinished,
                )
            )
        return self._seq

    def display(self, rank: int, output: dict[str, Any]) -> None:
        out = DisplayOutput(
            output["kind"],
            output.get("data") or {},
            output.get("metadata") or {},
            output.get("display_id") or "",
            bool(output.get("wait", False)),
        )
        self._displays.setdefault(rank, DisplayBatch()).add(out)
        if self._display_armed:
            return
        self._display_armed = True
        self.call_soon(self._schedule_displays)

    def _schedule_displays(self) -> None:
        assert self._loop is not None
        if self._closing:  # stop() sent them before its last event
            return
        due = max(self._loop.time() + BATCH_S, self._display_next)
        self._display_timer = self._loop.call_at(due, self.send_displays)

    def send_displays(self) -> None:
        """Publish the pending display calls (from the loop: when due, and before a reply)."""
        assert self._loop is not None
        if self._display_timer is not None:
            self._display_timer.cancel()
            self._display_timer = None
        size = 0
        self._display_armed = False
        batches, self._displays = self._displays, {}
        for rank, batch in sorted(batches.items()):
            self._seq += 1
            self._publish(Displays(self.node, self._seq, rank, tuple(batch.outputs)))
            size += batch.size
        self._display_next = self._loop.time() + max(DISPLAY_S, size / DISPLAY_BYTES_PER_S)

    def _publish(self, event: Any) -> None:
        # Every event goes through the loop's callback queue, so events keep their order.
        self.call_soon(self._worker.log_event, self.topic, to_msg(event))

    def rank_state(
        self,
        rank: int,
        state: RankStatus,
        detail: str = "",
        run: int = 0,
        primary: bool = False,
    ) -> None:
        # after the lines flushed before it, before those flushed after it
        self._publish(RankState(self.node, rank, state, detail, run, primary))

    def paused(self, rank: int, run: int, where: str) -> None:
        self._publish(RankPaused(self.node, rank, run, where))

    # ---- actor methods
    def endpoint(self) -> tuple[str, int]:
        """This node's address and a free port: where rank 0 will host the TCPStore."""
        host = self._worker.ip
        return host, listen_port(host)

    async def serve_cells(self) -> int:
        """Open this node's cell stream (``cellserver.py``); return its port on the worker's
        host. It has the worker's security (TLS with the gang's certificates, if the worker's)."""
        if self._cells is None:
            context = self._worker.security.get_listen_args("worker").get("ssl_context")
            self._cells = CellServer(self.start_run)
            await self._cells.start(self._worker.ip, context)
        return self._cells.port

    def _begin(self) -> None:
        """Once, from the first actor call that starts processes: the loop, and the task that
        watches (dask still holds this actor, the kernel beats, ranks' memory, telemetry)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._guard = asyncio.create_task(self._keep_watch())

    def _hear_sigterm(self, launch: Launch) -> None:
        """From now on a SIGTERM to this node is a preemption notice (``preemption.py``)."""
        if self._grace is None:
            self._grace = GracePeriod(self.node, launch.grace, self._preempted, self._grace_over)
            self._grace.install()

    def _preempted(self, notice: Preemption) -> None:
        """This node was told to go: the kernel (which tells every node) and its ranks hear. A
        script's ranks here get the SIGTERM itself, as under torchrun or Slurm (the other nodes'
        learn it from them, as Lightning's agreed flag does: a SIGTERM to a rank already exiting
        would kill it)."""
        log.warning("%s; stopping in %.0f s", notice.text, notice.left())
        self._publish(notice)
        self._tell_ranks(notice)
        if self.script is not None:
            self.script.notify()

    async def preempt(self, notice: Preemption) -> None:
        """From the kernel: a node of the gang is being preempted (on the loop, as every send to
        the ranks is)."""
        self._tell_ranks(notice)

    def _tell_ranks(self, notice: Preemption) -> None:
        """The notice, and nothing else, to this node's cell ranks, once: they decide when to
        stop."""
        if self._told is not None:
            return
        self._told = notice
        for r in self._ranks:
            r.notify(notice)

    async def _grace_over(self) -> None:
        """The deadline of the notice: stop the ranks (a busy one is killed), then the worker
        (``stop`` hands the SIGTERM on to its own handler)."""
        self._publish(
            GangState(GangStatus.BROKEN, f"node {self.node}: the preemption's grace period ended")
        )
        for r in self._ranks:
            if r.running is not None:
                r.kill("the preemption's grace period ended")
        await self.stop()

    async def start(self, launch: Launch) -> list[dict[str, Any]]:
        """Launch this node's ranks and wait until every one has joined the process group."""
        self._begin()
        self._hear_sigterm(launch)
        self._launch = self._placed(launch)
        self._command = rank_command()  # a bad JUPYTER_MN_RANK_PYTHON: refused before any rank
        self._check_gpus(launch)  # too few GPUs: said now, not once the ranks fail to find them
        self._telemetry = NodeTelemetry(self.node, launch, self._publish)
        infos = await self._spawn_all(generation=0)
        self._telemetry.started(self._sampled(), {info["backend"] for info in infos})
        self._watchdog = Watchdog(launch.heartbeat_timeout, launch.memory_limit)
        return infos

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
        proc = RankHandle(self, local, rank, env, launch.cwd, self._command, self._start)
        self.rank_state(rank, RankStatus.STARTED, f"pid {proc.proc.pid}")
        return proc

    async def _spawn_all(self, generation: int) -> list[dict[str, Any]]:
        """Start every rank of this node and wait until they joined group ``generation``."""
        self._generation = generation
        self._ranks = []
        self._start = await template.starter(self.job)
        timeout = self._launch.start_timeout
        try:
            for local in range(self._launch.gpus):  # the ones started before a failure stop too
                self._ranks.append(self._spawn(local, generation))
            joined = asyncio.gather(*(r.ready() for r in self._ranks))
            # when the agent is stopped meanwhile nobody awaits it: mark its outcome as seen
            joined.add_done_callback(lambda f: f.cancelled() or f.exception())
            infos = await asyncio.wait_for(joined, timeout)
        except asyncio.TimeoutError:
            await self._stop_ranks()
            raise JoinTimeout(
                f"node {self.node}: ranks did not join the process group within {timeout:.0f} s"
            ) from None
        except BaseException:
            await self._stop_ranks()
            raise
        for info in infos:
            self.rank_state(info["rank"], RankStatus.READY, f"{info['device']} ({info['backend']})")
        return infos

    def _visible(self, launch: Launch) -> str | None:
        """The ranks' ``CUDA_VISIBLE_DEVICES`` (None: unset)."""
        return {**os.environ, **launch.env}.get(VISIBLE)

    def _check_gpus(self, launch: Launch) -> None:
        """Refuse ``launch`` when its ranks would see fewer GPUs than there are ranks (NVML's
        count, tens of ms; CUDA stays uninitialized in the agent)."""
        check_count(self.node, launch.gpus, len(visible(self._visible(launch), gpu_uuids())))

    def _sampled(self) -> list[RankProcess]:
        """The ranks as GPU sampling knows them (by pid)."""
        shown = self._visible(self._launch) or ""
        return [RankProcess(r.rank, r.local_rank, r.proc.pid, shown) for r in self._ranks]

    def transport(self) -> dict[str, Any]:
        """This node's transport as NCCL's lines prove it so far (``--require-rdma`` checks it)."""
        assert self._telemetry is not None
        self._telemetry.poll()
        return to_msg(self._telemetry.report())

    async def run(self, payload: Any, run_id: int = 0) -> bytes:
        """Run a cell on every rank of this node (the actor call; see ``start_run``)."""
        return await self.start_run(payload, run_id)

    def start_run(self, payload: Any, run_id: int = 0) -> asyncio.Future[bytes]:
        """Send a cell to every rank of this node; the future is their replies (a packed
        ``NodeReply``) once output is flushed.

        No task and no loop turn between a request and its ranks, or between the last rank's
        reply and the node's: the cell stream calls this from its read, the requests go out
        before it returns, and the reply is built where the last rank's is read.
        """
        assert self._loop is not None and self._telemetry is not None
        telemetry = self._telemetry
        self._run_id = run_id
        telemetry.cell(running=True)
        request = pack({"op": "run", "payload": payload})  # once for all: it may be large
        done: asyncio.Future[bytes] = self._loop.create_future()
        ranks = list(self._ranks)
        replies: dict[int, dict[str, Any]] = {}

        def finish() -> None:
            self.send_displays()  # what rank 0 showed last comes before the reply
            if telemetry.cell(running=False):
                self._wake.set()  # its last look, now
            in_order = [replies[each.local_rank] for each in ranks]
            done.set_result(NodeReply.build(self.node, self.flush(), in_order).packed())

        def replied(r: RankHandle, reply: dict[str, Any]) -> None:
            try:
                if reply["status"] != "ok":
                    error = reply.get("error") or {}
                    secondary = error.get("secondary")
                    self.rank_state(
                        r.rank, RankStatus(reply["status"]), run=run_id, primary=not secondary
                    )
                r.pipes.catch_up()  # the cell's output, to its end, before its reply
                replies[r.local_rank] = reply
                if len(replies) == len(ranks) and not done.done():
                    finish()
            except Exception as exc:  # the node's reply says so, as an actor call's error would
                if not done.done():
                    done.set_exception(exc)

        for r in ranks:
            r.expect(run_id, functools.partial(replied, r))
            r.send_packed(request)  # one that fails is answered by the rank's death ("lost")
        if not ranks:  # none left after a failed relaunch: an empty reply, as before
            finish()
        return done

    async def interrupt(self, run_id: int = 0, generation: int | None = None) -> None:
        """Stop run ``run_id``: SIGINT to busy ranks, whose stacks threads also close their
        group's connections (one blocked in a collective never sees the SIGINT); idle ones leave
        their group (the cascade).

        Actor calls can overtake each other, so a late request (its run is over, the group was
        re-formed since) is ignored rather than hitting the next cell.
        """
        if run_id != self._run_id or generation not in (None, self._generation):
            return
        generation = self._generation  # a re-init may arrive while we send: keep to this one
        idle = [r for r in self._ranks if r.running is None]
        for r in self._ranks:
            if r.running == run_id:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r.proc.pid, signal.SIGINT)
                r.abort(generation)  # one blocked in a collective does not see the SIGINT
        await asyncio.gather(*(r.send({"op": "destroy", "generation": generation}) for r in idle))

    async def kill(self, run_id: int, reason: str) -> list[int]:
        """The last step of an interrupt: kill the ranks still busy with ``run_id``."""
        busy = [r for r in self._ranks if r.running == run_id and run_id == self._run_id]
        for r in busy:
            r.kill(reason)
        return [r.rank for r in busy]

    async def reinit(self, generation: int, reconnect: bool = False) -> list[dict[str, Any]]:
        """Re-form the process group in place; namespaces survive.

        ``reconnect``: rank 0 was restarted, so its c10d store is a new one.
        """
        self._generation = generation
        msg = {"op": "reinit", "generation": generation, "reconnect": reconnect}
        await asyncio.gather(*(r.send(msg) for r in self._ranks))
        replies = await asyncio.gather(*(r.reply("reinit") for r in self._ranks))
        return [{**reply, "rank": r.rank} for r, reply in zip(self._ranks, replies, strict=True)]

    async def retire(self, if_dead: bool = False) -> bool:
        """Stop this node's ranks before they are replaced (``if_dead``: only if one of them is
        dead, since a report of a death may come late). Returns whether it did.

        Rank 0's c10d store must be gone before the others reconnect, or they would find the
        old one still answering.
        """
        if if_dead and all(r.proc.poll() is None for r in self._ranks):
            return False
        await self._stop_ranks()
        return True

    async def relaunch(self, generation: int) -> list[dict[str, Any]]:
        """Replace this node's ranks with fresh processes that join group ``generation``."""
        await self._stop_ranks()
        try:
            infos = await self._spawn_all(generation)
        except Exception as exc:
            return [{"op": "reinit", "ok": False, "rank": -1, "error": str(exc)}]
        assert self._telemetry is not None
        self._telemetry.restarted(self._sampled())
        return [{"op": "reinit", "ok": True, "rank": i["rank"]} for i in infos]

    async def debug(self, rank: int, message: Any = None) -> DebugAnswer:
        """Relay ``message`` to rank ``rank``'s pdb (``rank/debugger.py``); its next answer."""
        handle = next((r for r in self._ranks if r.rank == rank), None)
        if handle is None:
            return DebugEnded(rank, error=f"rank {rank} is not on node {self.node}")
        return await handle.debug(message)

    async def stacks(self, stack: bool = True) -> list[RankWhere]:
        """Where each rank is: its main thread's stack in the cell's own line numbers (unless
        ``stack`` is False: the hang watchdog's poll) and its latest collectives."""
        return list(await asyncio.gather(*(r.where(stack) for r in self._ranks)))

    async def heartbeat(self) -> None:
        """The kernel is alive (see ``watchdog.py``)."""
        if self._watchdog is not None:
            self._watchdog.beat()

    async def _keep_watch(self) -> None:
        """The agent's periodic work, every ``CHECK_S`` (or when woken): stop when dask no longer
        holds this actor (its client is gone) or the kernel stopped beating; kill a rank over
        ``--memory-limit``; sample GPUs and NCCL's transport while a cell runs (in a thread:
        NVML and file reads block)."""
        loop = asyncio.get_running_loop()
        last_look = loop.time()
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), CHECK_S)
            self._wake.clear()
            if self._closing:
                return
            if not any(actor is self for actor in self._worker.state.actors.values()):
                await self.stop()
                return
            if self._watchdog is not None:
                if self._watchdog.kernel_gone():
                    await self._orphaned()
                    return
                self._kill_over_memory(self._watchdog)
            telemetry = self._telemetry
            if telemetry is not None and telemetry.due(loop.time() - last_look >= SAMPLE_S):
                last_look = loop.time()
                try:
                    await loop.run_in_executor(None, telemetry.look)
                except Exception:  # a failed sample must not end the watch over the ranks
                    log.exception("node %s: telemetry failed", self.node)

    def _kill_over_memory(self, watchdog: Watchdog) -> None:
        running = {r.rank: r for r in self._ranks if r.proc.poll() is None}
        over = watchdog.over_memory({k: r.proc.pid for k, r in running.items()})
        for rank, rss in over.items():
            limit = mib(watchdog.memory_limit or 0)
            running[rank].kill(f"out of memory: {mib(rss)} > --memory-limit {limit}")

    async def _orphaned(self) -> None:
        """The kernel stopped beating: free the node rather than hold its GPUs forever."""
        silent = self._watchdog.heartbeat_timeout if self._watchdog else 0
        why = f"node {self.node}: no heartbeat for {silent:.0f} s"
        self._publish(GangState(GangStatus.BROKEN, why))
        for r in self._ranks:  # busy with a cell nobody waits for: it would not read a stop
            if r.running is not None:
                r.kill(f"the kernel is gone ({why})")
        await self.stop()
        if self._launch.exit_when_orphaned:  # the worker is this gang's alone: end it too
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._worker.close(reason="jupyter_mn: the kernel is gone"), STOP_GRACE_S
                )
            os._exit(0)  # its scheduler lives in the silent kernel and may not answer

    async def _stop_ranks(self) -> None:
        await asyncio.gather(*(r.stop() for r in self._ranks))
        # A dead rank's pipes reach EOF on the loop a moment after its exit: its last lines must
        # be read before stop()'s last event (a later one brings the gang's topic back).
        await asyncio.gather(*(r.pipes.drained() for r in self._ranks))
        for r in self._ranks:
            self.rank_state(r.rank, RankStatus.EXITED, describe_exit(r.proc.returncode))

    async def run_script(self, launch: Launch) -> bytes:
        """Run a training script on this node's ranks (``%cluster run``); see node/script.py."""
        self._begin()
        self._hear_sigterm(launch)
        self.script = ScriptRun(self, self._placed(launch))
        outcomes = await self.script.wait()
        return NodeReply.build(self.node, self.flush(), outcomes).packed()

    async def stop_script(self, signum: int = signal.SIGTERM, why: str = "") -> None:
        if self.script is not None:
            await self.script.stop(signum, why or "stopped by the kernel")

    async def stop(self) -> int:
        """Stop everything of this node; return the sequence number of its last event."""
        self._closing = True
        if self._grace is not None:  # a SIGTERM stops the worker again
            self._grace.close()
        if self._guard is not None and self._guard is not asyncio.current_task():
            self._wake.set()  # its look in a thread, if any, ends before telemetry closes
            await asyncio.wait([self._guard], timeout=2 * SAMPLE_S)
        await self.stop_script()
        await self._stop_ranks()
        await asyncio.to_thread(template.release, self.job)
        if self._cells is not None:  # a run in progress has its reply now (its ranks stopped)
            await self._cells.close(STOP_GRACE_S)
        if self._telemetry is not None:
            self._telemetry.close()
        if self._partial_timer is not None:  # the ranks' lines ended with them
            self._partial_timer.cancel()
        self.send_displays()
        self.files.remove()
        last = self.flush(always=True)  # last: once the kernel has it, the topic can be dropped
        if self._grace is not None:  # a preempted node goes now
            asyncio.get_running_loop().call_soon(self._grace.hand_on)
        return last
