"""One rank process: the env contract, its process group, and the loop that runs cells.

Started by the node agent as ``python -m jupyter_mn.rank.runtime`` in its own session, with stdout
and stderr on pipes to the agent and a control socket (fd ``JUPYTER_MN_CONTROL_FD``) for cells.
The environment follows torchrun's contract, so existing training code runs unchanged.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from . import abort, stacks

#: Written by a rank to stdout and stderr after each reply, so the agent knows both pipes are
#: drained up to that point before it reports the cell as done.
SYNC_MARKER = "\x1e\x1fjupyter-mn-sync\x1f\x1e"
_PARENT_POLL_S = 1.0


@dataclass(frozen=True)
class ClusterInfo:
    """Where this rank sits in the gang; ``jupyter_mn.cluster_info()`` inside a cell."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    nodes: tuple[str, ...] = field(default=())
    backend: str = "local"
    job: str = ""
    device: str = "cpu"


def contract_env(
    *,
    rank: int,
    local_rank: int,
    gpus: int,
    node_rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int,
    job: str,
    backend: str,
    nodes: list[str],
    pg_timeout: float,
) -> dict[str, str]:
    """The variables every rank gets (torchrun-compatible, plus ``JUPYTER_MN_*``)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(nnodes * gpus),
        "LOCAL_WORLD_SIZE": str(gpus),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "NNODES": str(nnodes),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "JUPYTER_MN_JOB": job,
        "JUPYTER_MN_BACKEND": backend,
        "JUPYTER_MN_NODES": json.dumps(nodes),
        "JUPYTER_MN_PG_TIMEOUT": str(pg_timeout),
        "PYTHONUNBUFFERED": "1",
    }


def cluster_info() -> ClusterInfo:
    """This rank's place in the gang. Raises outside a ``%%cluster`` rank."""
    env = os.environ
    if "JUPYTER_MN_JOB" not in env or "RANK" not in env:
        from ..errors import JupyterMNError

        raise JupyterMNError("cluster_info() describes a rank: call it inside a %%cluster cell")
    return ClusterInfo(
        rank=int(env["RANK"]),
        local_rank=int(env["LOCAL_RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        local_world_size=int(env["LOCAL_WORLD_SIZE"]),
        node_rank=int(env["NODE_RANK"]),
        nnodes=int(env["NNODES"]),
        master_addr=env["MASTER_ADDR"],
        master_port=int(env["MASTER_PORT"]),
        nodes=tuple(json.loads(env.get("JUPYTER_MN_NODES", "[]"))),
        backend=env.get("JUPYTER_MN_BACKEND", "local"),
        job=env["JUPYTER_MN_JOB"],
        device=_device_label(int(env["LOCAL_RANK"])),
    )


def _device_label(local_rank: int) -> str:
    import torch

    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"


class ProcessGroup:
    """The rank's membership in torch.distributed, re-formed in place after a failure.

    Rank 0 hosts the TCPStore; each generation uses its own key prefix, so a re-init never sees a
    stale key from the group it replaces. When rank 0 was restarted its store is new, and the
    other ranks reconnect to it (``reinit(..., reconnect=True)``).
    """

    def __init__(self, info: ClusterInfo, pg_timeout: float) -> None:
        import torch

        self.info = info
        self.pg_timeout = pg_timeout
        self.cuda = torch.cuda.is_available()
        self.backend = "nccl" if self.cuda else "gloo"
        self.generation = -1
        self._store: Any = None
        self._pg: Any = None
        self._old: Any = None
        self._sockets: dict[int, str] = {}
        if self.cuda:
            count = torch.cuda.device_count()
            if info.local_rank >= count:
                raise RuntimeError(
                    f"node {info.node_rank} has {count} GPU(s); "
                    f"local rank {info.local_rank} needs at least {info.local_rank + 1}"
                )
            torch.cuda.set_device(info.local_rank)

    def connect_store(self) -> None:
        import torch.distributed as dist

        self._store = dist.TCPStore(
            self.info.master_addr,
            self.info.master_port,
            world_size=None,
            is_master=self.info.rank == 0,
            timeout=timedelta(seconds=self.pg_timeout),
            wait_for_workers=False,
        )

    def init(self, generation: int) -> None:
        import torch
        import torch.distributed as dist

        if self._store is None:
            self.connect_store()
        store = dist.PrefixStore(f"jupyter_mn/{generation}/", self._store)
        kwargs: dict[str, Any] = {}
        if self.cuda:
            kwargs["device_id"] = torch.device("cuda", self.info.local_rank)
        before = abort.open_sockets()
        dist.init_process_group(
            self.backend,
            store=store,
            rank=self.info.rank,
            world_size=self.info.world_size,
            timeout=timedelta(seconds=self.pg_timeout),
            **kwargs,
        )
        self._sockets = abort.opened_since(before)
        self._pg = dist.group.WORLD
        self.generation = generation

    def destroy(self) -> None:
        """Leave the group so peers blocked on us fail at once (the fail-fast cascade).

        Idempotent. Objects that still hold the old group (a DDP model) get errors if used.
        The group object itself is kept until ``release``: its destructor joins gloo's threads,
        which is time better spent after the reply has gone.
        """
        import torch.distributed as dist

        if self._pg is None:
            return
        if self.cuda:
            with contextlib.suppress(Exception):  # NCCL: communicator abort unblocks kernels
                dist.distributed_c10d._abort_process_group()
        else:
            abort.shut_down(self._sockets, spare_port=self.info.master_port)
        if dist.is_initialized():
            dist.destroy_process_group()
        self._old, self._pg, self._sockets = self._pg, None, {}

    def release(self) -> None:
        self._old = None

    def reinit(self, generation: int, reconnect: bool = False) -> None:
        self.destroy()
        self.release()
        if reconnect:
            self.connect_store()
        self.init(generation)


class _CellSignals:
    """SIGINT interrupts a running cell and is ignored between cells (the loop must survive)."""

    def __init__(self) -> None:
        self.active = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.active:
            interrupt = KeyboardInterrupt()
            # where it struck: a rank stopped inside torch.distributed was waiting for its peers
            where = frame.f_code.co_filename if frame is not None else ""
            interrupt.struck_in = where  # type: ignore[attr-defined]
            raise interrupt


def _exit_with_parent() -> None:
    """Ranks must not outlive their node agent (a lost agent means a lost node)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="jupyter-mn-parent-watch", daemon=True).start()


def sync_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.write(fd, (SYNC_MARKER + "\n").encode())


class _Control:
    """The control socket: the main thread sends cell replies, the reader thread stack replies."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        with self._lock:
            self.conn.send(msg)


def _read_commands(
    control: _Control, commands: queue.Queue[dict[str, Any]], shell: Any, signals: _CellSignals
) -> None:
    """Reader thread: answer stack requests at once (the main thread may be blocked); queue
    everything else for the main thread."""
    while True:
        try:
            msg = control.conn.recv()
        except (EOFError, OSError):
            commands.put({"op": "stop"})
            return
        if msg["op"] == "stacks":
            busy = signals.active
            control.send({"op": "stacks", "busy": busy, "stack": stacks.main_thread(shell)})
        else:
            commands.put(msg)


def main() -> None:
    from . import execute

    faulthandler.enable(all_threads=False)  # a segfault leaves its Python stack in the log
    control = _Control(Connection(int(os.environ["JUPYTER_MN_CONTROL_FD"])))
    _exit_with_parent()
    signals = _CellSignals()
    info = cluster_info()
    try:
        group = ProcessGroup(info, float(os.environ.get("JUPYTER_MN_PG_TIMEOUT", "1800")))
        group.init(int(os.environ.get("JUPYTER_MN_GENERATION", "0")))
        shell = execute.RankShell.for_rank()
    except Exception as exc:
        control.send({"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        sync_streams()
        os._exit(1)

    def on_error() -> None:
        signals.active = False  # a late interrupt must not replace the real error
        group.destroy()

    shell.on_error = on_error
    commands: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(
        target=_read_commands,
        args=(control, commands, shell, signals),
        name="jupyter-mn-control",
        daemon=True,
    ).start()
    control.send(
        {
            "op": "ready",
            "pid": os.getpid(),
            "device": info.device,
            "backend": group.backend,
            "host": os.uname().nodename,
        }
    )
    while True:
        msg = commands.get()
        op = msg["op"]
        if op == "run":
            reply = execute.run(shell, msg["payload"], info, group, signals)
            control.send(reply)
            sync_streams()
            group.release()
        elif op == "destroy":
            if msg["generation"] == group.generation:  # a late request must not hit a new group
                group.destroy()
        elif op == "reinit":
            try:
                group.reinit(msg["generation"], reconnect=msg.get("reconnect", False))
                control.send({"op": "reinit", "ok": True})
            except Exception as exc:
                control.send({"op": "reinit", "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        elif op == "stop":
            break
    group.destroy()
    sync_streams()
    os._exit(0)


if __name__ == "__main__":
    main()
