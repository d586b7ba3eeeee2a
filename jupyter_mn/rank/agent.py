"""The node agent: a dask actor (one per node) that owns that node's rank processes.

Ranks are plain processes in their own session (a Jupyter interrupt never reaches them), with
stdout/stderr on pipes (C-level output included) and a control socket for cells. The agent relays
cells, batches output lines into events (~5 ms), and learns of a rank's death from EOF at once.

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
from ..events import LogLines, RankState, to_msg
from .gpu import RankProcess
from .runtime import SYNC_MARKER, contract_env
from .telemetry import NodeTelemetry

BATCH_S = 0.005
TAIL_LINES = 20
MAX_LINE = 10_000
_STOP_GRACE_S = 3.0
_SYNC_WAIT_S = 2.0


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


class _Rank:
    """One rank process as its agent sees it."""

    def __init__(
        self, agent: NodeAgent, local_rank: int, rank: int, env: dict[str, str], cwd: str | None
    ) -> None:
        self.agent = agent
        self.local_rank = local_rank
        self.rank = rank
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.markers = {"out": 0, "err": 0}
        self.expected = 0
        self.open_streams = {"out", "err"}
        self.stream_change = asyncio.Event()
        self.busy = False
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
        self.tail.append(text)
        self.agent.log(self.rank, stream, text)

    def _read_control(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            self.agent.call_soon(self.messages.put_nowait, msg)
        self.agent.call_soon(self.messages.put_nowait, {"op": "exit"})

    def _marked(self, stream: str) -> None:
        self.markers[stream] += 1
        self.stream_change.set()

    def _stream_closed(self, stream: str) -> None:
        self.open_streams.discard(stream)
        self.stream_change.set()

    # ---- event loop side
    async def send(self, msg: dict[str, Any]) -> bool:
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
        self.busy = False
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
                "evalue": describe_exit(code),
                "traceback": ["last lines:", *self.tail],
                "secondary": False,
            },
        }

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

    async def stop(self) -> None:
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
        self._telemetry: NodeTelemetry | None = None

    # ---- called from threads
    def call_soon(self, fn: Any, *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # loop closed while the worker shuts down
            self._loop.call_soon_threadsafe(fn, *args)

    def log(self, rank: int, stream: str, line: str) -> None:
        if self._telemetry is not None:
            self._telemetry.line(line)
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

    def _state(self, rank: int, state: str, detail: str = "") -> None:
        with self._cond:
            self._publish(RankState(self.node, rank, state, detail))

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
        self._telemetry = NodeTelemetry(self.node, self.job, launch, self._publish)
        threading.Thread(target=self._flush_loop, daemon=True, name="jupyter-mn-flush").start()
        gpus = launch["gpus"]
        for local in range(gpus):
            rank = self.node * gpus + local
            env = {
                **os.environ,
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
            }
            env.update(self._telemetry.rank_env(rank, env))
            self._ranks.append(_Rank(self, local, rank, env, launch.get("cwd")))
            self._state(rank, "started", f"pid {self._ranks[-1].proc.pid}")
        try:
            infos = await asyncio.wait_for(
                asyncio.gather(*(r.ready() for r in self._ranks)), launch["start_timeout"]
            )
        except asyncio.TimeoutError:
            await self.stop()
            raise RendezvousError(
                f"node {self.node}: ranks did not join the process group within "
                f"{launch['start_timeout']:.0f} s"
            ) from None
        except BaseException:
            await self.stop()
            raise
        for info in infos:
            self._state(info["rank"], "ready", f"{info['device']} ({info['backend']})")
        visible = {**os.environ, **launch["env"]}.get("CUDA_VISIBLE_DEVICES", "")
        self._telemetry.started(
            [RankProcess(r.rank, r.local_rank, r.proc.pid, visible) for r in self._ranks],
            {info["backend"] for info in infos},
        )
        return infos

    def transport(self) -> dict[str, Any]:
        """This node's transport as NCCL's lines prove it so far (``--require-rdma`` checks it)."""
        assert self._telemetry is not None
        self._telemetry.poll()
        return to_msg(self._telemetry.report())

    async def run(self, payload: Any) -> dict[str, Any]:
        """Run a cell on every rank of this node; return their replies once output is flushed."""
        for r in self._ranks:
            r.busy = True
            r.expected += 1
        self._telemetry.cell(running=True)
        await asyncio.gather(*(r.send({"op": "run", "payload": payload}) for r in self._ranks))
        replies = await asyncio.gather(*(self._watch(r) for r in self._ranks))
        await asyncio.gather(*(r.synced() for r in self._ranks))
        self._telemetry.cell(running=False)
        return {"node": self.node, "seq": self.flush(), "ranks": replies}

    async def _watch(self, r: _Rank) -> dict[str, Any]:
        reply = await r.reply("done")
        if reply["status"] != "ok":
            error = reply.get("error") or {}
            self._state(r.rank, reply["status"], "" if error.get("secondary") else "primary")
        return reply

    async def interrupt(self) -> None:
        """Stop the cell: SIGINT to busy ranks, and idle ranks drop their group (the cascade)."""
        for r in self._ranks:
            if r.busy:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r.proc.pid, signal.SIGINT)
            else:
                await r.send({"op": "destroy"})

    async def reinit(self, generation: int) -> list[dict[str, Any]]:
        """Re-form the process group in place; namespaces survive."""
        await asyncio.gather(
            *(r.send({"op": "reinit", "generation": generation}) for r in self._ranks)
        )
        return list(await asyncio.gather(*(r.reply("reinit") for r in self._ranks)))

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self._ranks))
        for r in self._ranks:
            self._state(r.rank, "exited", describe_exit(r.proc.returncode))
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
        self.flush()
        if self._telemetry is not None:
            self._telemetry.close()
