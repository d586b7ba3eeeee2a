"""The node agent: a dask actor (one per node) that owns that node's rank processes.

Ranks are plain processes in their own session (a Jupyter interrupt never reaches them), with
stdout/stderr on pipes (C-level output included) and a control socket for cells. The agent relays
cells, batches output lines into events (~5 ms), and learns of a rank's death from EOF at once.
After a failure it re-forms the group in place (``reinit``) or restarts its ranks (``relaunch``);
it stops them itself when the kernel's heartbeat stops (``watchdog.py``).

Also used as a dask preload module: ``dask_setup`` makes the worker ignore SIGINT, because Jupyter
interrupts signal the kernel's whole process group, and a local worker is in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from distributed import get_worker

from ..errors import RendezvousError
from ..events import GangState, LogLines, RankState, to_msg
from . import stacks
from .runtime import SYNC_MARKER, contract_env
from .watchdog import CHECK_S, Watchdog, mib

BATCH_S = 0.005
TAIL_LINES = 20
MAX_LINE = 10_000
_STOP_GRACE_S = 3.0
_SYNC_WAIT_S = 2.0
_STACKS_WAIT_S = 1.0


def dask_setup(worker: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _thread_default(ranks_per_node: int) -> dict[str, str]:
    """torchrun's rule: several ranks on a node get one OpenMP thread each unless told otherwise
    (more spin-waiting threads than cores made a small DDP step 10× slower here)."""
    if ranks_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        return {"OMP_NUM_THREADS": "1"}
    return {}


class _Rank:
    """One rank process as its agent sees it."""

    def __init__(
        self, agent: NodeAgent, local_rank: int, rank: int, env: dict[str, str], cwd: str | None
    ) -> None:
        self.agent = agent
        self.local_rank = local_rank
        self.rank = rank
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        #: a fatal error report (segfault) the rank wrote: kept apart, the tail stays readable
        self.crash: list[str] = []
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.markers = {"out": 0, "err": 0}
        self.expected = 0
        self.open_streams = {"out", "err"}
        self.stream_change = asyncio.Event()
        self.stack_replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        #: the run this rank is busy with (None between cells)
        self.running: int | None = None
        #: why the agent killed it (shown with its exit status)
        self.killed_because = ""
        self.stopping = False
        self._send_lock = asyncio.Lock()  # sends reach the rank in the order they were made
        parent, child = socket.socketpair()
        env = {**env, "JUPYTER_MN_CONTROL_FD": str(child.fileno())}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_mn.rank.runtime"],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(child.fileno(),),
            start_new_session=True,
        )
        child.close()
        self.conn = Connection(parent.detach())
        for stream, pipe in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            threading.Thread(
                target=self._read_pipe,
                args=(pipe, stream),
                daemon=True,
                name=f"jupyter-mn-rank{rank}-{stream}",
            ).start()
        threading.Thread(
            target=self._read_control, daemon=True, name=f"jupyter-mn-rank{rank}-control"
        ).start()

    # ---- threads: forward what the process says to the event loop
    def _read_pipe(self, pipe: Any, stream: str) -> None:
        fd, pending = pipe.fileno(), b""
        while chunk := os.read(fd, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                self._line(stream, raw.decode("utf-8", "replace"))
        if pending:
            self._line(stream, pending.decode("utf-8", "replace"))
        self.agent.call_soon(self._stream_closed, stream)

    def _line(self, stream: str, text: str) -> None:
        if SYNC_MARKER in text:
            before, _, _ = text.partition(SYNC_MARKER)
            if before:
                self._line(stream, before)
            self.agent.call_soon(self._marked, stream)
            return
        text = text.rsplit("\r", 1)[-1][:MAX_LINE]
        if text.startswith(stacks.CRASH_START) or self.crash:
            self.crash.append(text)
        else:
            self.tail.append(text)
        self.agent.log(self.rank, stream, text)

    def _read_control(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            box = self.stack_replies if msg["op"] == "stacks" else self.messages
            self.agent.call_soon(box.put_nowait, msg)
        self.agent.call_soon(self.messages.put_nowait, {"op": "exit"})
        self.agent.call_soon(self._gone)

    def _gone(self) -> None:
        """The process went away; when no cell was running, nobody else would notice."""
        if not self.stopping and self.running is None:
            self.report = asyncio.ensure_future(self.agent.lost_while_idle(self))

    def _marked(self, stream: str) -> None:
        self.markers[stream] += 1
        self.stream_change.set()

    def _stream_closed(self, stream: str) -> None:
        self.open_streams.discard(stream)
        self.stream_change.set()

    # ---- event loop side
    async def send(self, msg: dict[str, Any]) -> bool:
        async with self._send_lock:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.conn.send, msg)
                return True
            except (OSError, ValueError):
                return False

    async def ready(self) -> dict[str, Any]:
        msg = await self.messages.get()
        if msg["op"] == "ready":
            return {**msg, "rank": self.rank, "local_rank": self.local_rank}
        reason = msg.get("error") or describe_exit(await self.exit_code())
        raise RendezvousError(self.explain(f"failed to start: {reason}"))

    async def reply(self, op: str) -> dict[str, Any]:
        """The next reply of kind ``op``, or a "lost" outcome when the process died first."""
        msg = await self.messages.get()
        self.running = None
        if msg["op"] == op:
            return msg
        code = await self.exit_code()
        return {
            "op": op,
            "rank": self.rank,
            "status": "lost",
            "ok": False,
            "exit_code": code,
            "error": {
                "ename": "RankLost",
                "evalue": self.exit_reason(code),
                "traceback": [
                    *(["last lines:", *self.tail] if self.tail else []),
                    *stacks.crash_summary(self.crash),
                ],
                "secondary": False,
            },
        }

    def exit_reason(self, code: int | None) -> str:
        why = describe_exit(code)
        return f"{why} ({self.killed_because})" if self.killed_because else why

    async def where(self) -> dict[str, Any]:
        """The rank's main-thread stack; "no answer" when it holds the GIL in native code."""
        while not self.stack_replies.empty():  # a late answer to an earlier request
            self.stack_replies.get_nowait()
        state = {"rank": self.rank, "node": self.agent.node, "busy": self.running is not None}
        if self.proc.poll() is not None or not await self.send({"op": "stacks"}):
            return {**state, "stack": [], "note": describe_exit(self.proc.poll())}
        try:
            msg = await asyncio.wait_for(self.stack_replies.get(), _STACKS_WAIT_S)
        except asyncio.TimeoutError:
            return {**state, "stack": [], "note": "no answer (native code holding the GIL?)"}
        return {**state, "busy": msg["busy"], "stack": msg["stack"], "note": ""}

    async def synced(self) -> None:
        """Wait until both pipes are read up to this cell's end (or closed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SYNC_WAIT_S
        while any(self.markers[s] < self.expected for s in self.open_streams):
            self.stream_change.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stream_change.wait(), remaining)

    async def exit_code(self) -> int | None:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self.proc.wait, _STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            return None

    def explain(self, what: str) -> str:
        lines = "\n".join(f"    {line}" for line in self.tail)
        return f"rank {self.rank} (node {self.agent.node}) {what}" + (
            f"\n  last lines:\n{lines}" if lines else ""
        )

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def kill(self, reason: str) -> None:
        if self.proc.poll() is None:
            self.killed_because = reason
            self.signal(signal.SIGKILL)

    async def stop(self) -> None:
        self.stopping = True
        if self.proc.poll() is None:
            await self.send({"op": "stop"})
            if await self.exit_code() is None:
                self.signal(signal.SIGKILL)
                await self.exit_code()
        self.signal(signal.SIGKILL)  # children the rank left in its session (DataLoader workers)
        self.conn.close()


class NodeAgent:
    """Dask actor: start this node's ranks, relay cells, publish their output as events."""

    def __init__(self, job: str, topic: str, node: int) -> None:
        self.job, self.topic, self.node = job, topic, node
        self._worker = get_worker()
        self._ranks: list[_Rank] = []
        self._cond = threading.Condition()
        self._buffer: list[tuple[int, str, str]] = []
        self._seq = 0
        self._closing = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._launch: dict[str, Any] = {}
        self._generation = 0
        self._run_id = 0
        self._watchdog: Watchdog | None = None
        self._guard: asyncio.Task[None] | None = None

    # ---- called from threads
    def call_soon(self, fn: Any, *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # loop closed while the worker shuts down
            self._loop.call_soon_threadsafe(fn, *args)

    def log(self, rank: int, stream: str, line: str) -> None:
        with self._cond:
            self._buffer.append((rank, stream, line))
            self._cond.notify()

    def _flush_loop(self) -> None:
        while not self._closing.is_set():
            with self._cond:
                while not self._buffer and not self._closing.is_set():
                    self._cond.wait()
            self._closing.wait(BATCH_S)  # the batching window: lines arriving now share an event
            self.flush()

    def flush(self) -> int:
        """Publish buffered lines as one ``LogLines``; return the last sequence number sent."""
        with self._cond:
            lines, self._buffer = self._buffer, []
            if lines:
                items: list[tuple[int, str, list[str]]] = []
                for rank, stream, text in lines:
                    if items and items[-1][0] == rank and items[-1][1] == stream:
                        items[-1][2].append(text)
                    else:
                        items.append((rank, stream, [text]))
                self._seq += 1
                self._publish(
                    LogLines(self.node, self._seq, tuple((r, s, tuple(t)) for r, s, t in items))
                )
            return self._seq

    def _publish(self, event: Any) -> None:
        # Every event goes through the loop's callback queue, so events keep their order.
        self._worker.loop.add_callback(self._worker.log_event, self.topic, to_msg(event))

    def _state(self, rank: int, state: str, detail: str = "", run: int = 0) -> None:
        with self._cond:
            self._publish(RankState(self.node, rank, state, detail, run))

    # ---- actor methods
    def endpoint(self) -> tuple[str, int]:
        """This node's address and a free port: where rank 0 will host the TCPStore."""
        host = self._worker.ip
        with socket.socket() as sock:
            sock.bind((host, 0))
            return host, sock.getsockname()[1]

    async def start(self, launch: dict[str, Any]) -> list[dict[str, Any]]:
        """Launch this node's ranks and wait until every one has joined the process group."""
        self._loop = asyncio.get_running_loop()
        self._launch = launch
        threading.Thread(target=self._flush_loop, daemon=True, name="jupyter-mn-flush").start()
        infos = await self._spawn_all(generation=0)
        self._watchdog = Watchdog(launch["heartbeat_timeout"], launch.get("memory_limit"))
        self._guard = asyncio.create_task(self._keep_watch())
        return infos

    def _spawn(self, local: int, generation: int) -> _Rank:
        launch, gpus = self._launch, self._launch["gpus"]
        rank = self.node * gpus + local
        env = {
            **os.environ,
            **_thread_default(gpus),
            **launch["env"],
            **contract_env(
                rank=rank,
                local_rank=local,
                gpus=gpus,
                node_rank=self.node,
                nnodes=launch["nnodes"],
                master_addr=launch["master_addr"],
                master_port=launch["master_port"],
                job=self.job,
                backend=launch["backend"],
                nodes=launch["nodes"],
                pg_timeout=launch["pg_timeout"],
            ),
            "JUPYTER_MN_GENERATION": str(generation),
        }
        proc = _Rank(self, local, rank, env, launch.get("cwd"))
        self._state(rank, "started", f"pid {proc.proc.pid}")
        return proc

    async def _spawn_all(self, generation: int) -> list[dict[str, Any]]:
        """Start every rank of this node and wait until they joined group ``generation``."""
        self._generation = generation
        self._ranks = [self._spawn(local, generation) for local in range(self._launch["gpus"])]
        timeout = self._launch["start_timeout"]
        joined = asyncio.gather(*(r.ready() for r in self._ranks))
        # when the agent is stopped meanwhile nobody awaits it: mark its outcome as seen
        joined.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            infos = await asyncio.wait_for(joined, timeout)
        except asyncio.TimeoutError:
            await self._stop_ranks()
            raise RendezvousError(
                f"node {self.node}: ranks did not join the process group within {timeout:.0f} s"
            ) from None
        except BaseException:
            await self._stop_ranks()
            raise
        for info in infos:
            self._state(info["rank"], "ready", f"{info['device']} ({info['backend']})")
        return infos

    async def run(self, payload: Any, run_id: int = 0) -> dict[str, Any]:
        """Run a cell on every rank of this node; return their replies once output is flushed."""
        self._run_id = run_id
        for r in self._ranks:
            r.running = run_id
            r.expected += 1
        await asyncio.gather(*(r.send({"op": "run", "payload": payload}) for r in self._ranks))
        replies = await asyncio.gather(*(self._watch(r, run_id) for r in self._ranks))
        await asyncio.gather(*(r.synced() for r in self._ranks))
        return {"node": self.node, "seq": self.flush(), "ranks": replies}

    async def _watch(self, r: _Rank, run_id: int) -> dict[str, Any]:
        reply = await r.reply("done")
        if reply["status"] != "ok":
            error = reply.get("error") or {}
            primary = "" if error.get("secondary") else "primary"
            self._state(r.rank, reply["status"], primary, run_id)
        return reply

    async def interrupt(self, run_id: int = 0, generation: int | None = None) -> None:
        """Stop run ``run_id``: SIGINT to busy ranks; idle ones leave their group (the cascade).

        Actor calls can overtake each other, so a late request (its run is over, the group was
        re-formed since) is ignored rather than hitting the next cell.
        """
        if run_id != self._run_id or generation not in (None, self._generation):
            return
        for r in self._ranks:
            if r.running == run_id:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r.proc.pid, signal.SIGINT)
            elif r.running is None:
                await r.send({"op": "destroy", "generation": self._generation})

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

    async def relaunch(self, generation: int, if_dead: bool = False) -> list[dict[str, Any]]:
        """Replace this node's ranks with fresh processes that join group ``generation``.

        ``if_dead``: only when one of them is dead (a report of it may come late); else re-init.
        """
        if if_dead and all(r.proc.poll() is None for r in self._ranks):
            return await self.reinit(generation, reconnect=True)
        await self._stop_ranks()
        try:
            infos = await self._spawn_all(generation)
        except Exception as exc:
            return [{"op": "reinit", "ok": False, "rank": -1, "error": str(exc)}]
        return [{"op": "reinit", "ok": True, "rank": i["rank"], "restarted": True} for i in infos]

    async def stacks(self) -> list[dict[str, Any]]:
        """Where each rank's main thread is, in the cell's own line numbers."""
        return list(await asyncio.gather(*(r.where() for r in self._ranks)))

    async def heartbeat(self) -> None:
        """The kernel is alive (see ``watchdog.py``)."""
        if self._watchdog is not None:
            self._watchdog.beat()

    async def lost_while_idle(self, r: _Rank) -> None:
        reason = r.exit_reason(await r.exit_code())
        self._state(r.rank, "lost-idle", r.explain(f"died between cells: {reason}"))

    async def _keep_watch(self) -> None:
        assert self._watchdog is not None
        while not self._closing.is_set():
            await asyncio.sleep(CHECK_S)
            if self._watchdog.kernel_gone():
                await self._orphaned()
                return
            running = {r.rank: r for r in self._ranks if r.proc.poll() is None}
            limit = self._watchdog.memory_limit
            for rank, rss in self._watchdog.over_memory(
                {k: r.proc.pid for k, r in running.items()}
            ).items():
                running[rank].kill(f"out of memory: {mib(rss)} > --memory-limit {mib(limit or 0)}")

    async def _orphaned(self) -> None:
        """The kernel stopped beating: free the node rather than hold its GPUs forever."""
        silent = self._watchdog.heartbeat_timeout if self._watchdog else 0
        self._publish(GangState("BROKEN", f"node {self.node}: no heartbeat for {silent:.0f} s"))
        await self.stop()
        if self._launch.get("exit_when_orphaned"):  # the worker is this gang's alone: end it too
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._worker.close(nanny=True, reason="jupyter_mn: the kernel is gone"),
                    _STOP_GRACE_S,
                )
            os._exit(0)  # its nanny lives in the silent kernel and may not answer

    async def _stop_ranks(self) -> None:
        await asyncio.gather(*(r.stop() for r in self._ranks))
        for r in self._ranks:
            self._state(r.rank, "exited", describe_exit(r.proc.returncode))

    async def stop(self) -> None:
        if self._guard is not None and self._guard is not asyncio.current_task():
            self._guard.cancel()
        await self._stop_ranks()
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
        self.flush()
