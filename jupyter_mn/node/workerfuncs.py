"""Functions the kernel runs on a node's dask worker with ``client.run``.

``client.run`` calls them on the worker's event loop, outside task scheduling: they take no
thread slot from other users' tasks on a shared cluster. So they must be quick, or ``async`` and
leave the real work to a subprocess (the probe, a shell command).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import sys
from importlib import metadata, util
from typing import Any

from .netif import interfaces, route
from .probe import machine_id, rdma_ports

#: Shell commands started by ``run_command``, by token, so an interrupt can stop them.
_commands: dict[str, asyncio.subprocess.Process] = {}
_OUTPUT_LIMIT = 1 << 20
#: A command's lines are published at most this often (one dask event each), as ranks' lines.
_BATCH_S = 0.005


def identity() -> dict[str, Any]:
    """Where this process runs: machine and process group (what a Jupyter interrupt hits)."""
    return {"machine": machine_id(), "pgid": os.getpgrp()}


def worker_facts(kernel: dict[str, Any]) -> dict[str, Any]:
    """Cheap facts for choosing nodes (nothing heavy is imported into the user's worker)."""
    from ..wire.version import __version__

    torch = None
    if util.find_spec("torch") is not None:
        try:
            torch = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch = "unknown"
    return {
        "jupyter_mn": __version__,
        "torch": torch,
        "python": platform.python_version(),
        "in_kernel_group": identity() == kernel,
    }


def link_facts(master_addr: str) -> dict[str, Any]:
    """The links this node has (RDMA ports, interfaces, the one to the master): sysfs and
    psutil only, so it is quick enough for the worker's event loop."""
    nics = interfaces()
    return {"rdma": rdma_ports(), "interfaces": nics, "route": route(master_addr, nics)}


def ignore_sigint() -> bool:
    """Shield a worker (or its nanny) that shares the kernel's process group from interrupts."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: this process runs its loop elsewhere
        return False
    return True


def find_script(paths: list[str], cwd: str | None) -> str | None:
    """The first of ``paths`` that is a file here (relative ones from the ranks' cwd)."""
    for path in paths:
        full = os.path.join(cwd or os.getcwd(), path)
        if os.path.isfile(full):
            return os.path.abspath(full)
    return None


def has_package(name: str, cwd: str | None) -> bool:
    """Whether ``python -m name`` in ``cwd`` finds ``name``'s top-level package here (found on
    the path without importing anything into the user's worker)."""
    from importlib.machinery import PathFinder

    top = name.partition(".")[0]
    if top in sys.builtin_module_names:
        return True
    return PathFinder.find_spec(top, [cwd or os.getcwd(), *sys.path]) is not None


async def _start(
    argv_or_shell: list[str] | str,
    env: dict[str, str],
    cwd: str | None,
    stdin: bytes | None = None,
) -> Any:
    """Start a command in a session of its own; ``stdin`` is written to it (and closed)."""
    kwargs: dict[str, Any] = {
        "stdin": asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        "stdout": asyncio.subprocess.PIPE,
        "stderr": asyncio.subprocess.STDOUT,
        "env": {**os.environ, **env},
        "cwd": cwd,
        "start_new_session": True,  # never in the worker's (or kernel's) process group
    }
    if isinstance(argv_or_shell, str):
        proc = await asyncio.create_subprocess_shell(argv_or_shell, **kwargs)
    else:
        proc = await asyncio.create_subprocess_exec(*argv_or_shell, **kwargs)
    if stdin is not None:
        proc.stdin.write(stdin)
        with contextlib.suppress(ConnectionError):  # it died first: its exit status tells
            await proc.stdin.drain()
        proc.stdin.close()
    return proc


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class _CommandOutput:
    """A command's output as it comes: the last ``_OUTPUT_LIMIT`` bytes kept for its reply, its
    lines published on ``topic`` (lines arriving within ``_BATCH_S`` share an event)."""

    def __init__(self, token: str, topic: str, dask_worker: Any) -> None:
        self.token, self.topic, self.worker = token, topic, dask_worker
        self.output = bytearray()
        self.published = 0
        self._pending = b""  # a line not ended yet
        self._ended: list[bytes] = []  # lines waiting for the batching window to close
        self._window: asyncio.TimerHandle | None = None

    def feed(self, chunk: bytes) -> None:
        self.output.extend(chunk)
        del self.output[:-_OUTPUT_LIMIT]
        *done, pending = (self._pending + chunk).split(b"\n")
        self._pending = pending[-_OUTPUT_LIMIT:]
        self._ended.extend(done)
        if self._ended and self._window is None:
            self._window = asyncio.get_running_loop().call_later(_BATCH_S, self._publish)

    def _publish(self) -> None:
        self._window = None
        lines = [_shown(line.decode("utf-8", "replace")) for line in self._ended]
        self._ended.clear()
        self.published += len(lines)
        address = self.worker.address
        msg = {"token": self.token, "worker": address, "lines": lines, "upto": self.published}
        self.worker.log_event(self.topic, msg)

    def stop(self) -> None:
        """No batch waits any more (the reader stopped)."""
        if self._window is not None:
            self._window.cancel()

    def end(self) -> str:
        """Publish what is left, the unended line too; return the output kept."""
        if self._pending:
            self._ended.append(self._pending)
        if self._ended:
            self._publish()
        return bytes(self.output).decode("utf-8", "replace")


async def run_command(
    command: str,
    env: dict[str, str],
    cwd: str | None,
    timeout: float,
    token: str,
    topic: str,
    dask_worker: Any,
) -> dict[str, Any]:
    """Run a shell command on this node, publishing its lines on ``topic`` as they come; return
    its output (stdout and stderr, the last MiB; what it wrote before a timeout too), the number
    of lines published and the exit code."""
    proc = await _start(command, env, cwd)
    _commands[token] = proc
    output = _CommandOutput(token, topic, dask_worker)

    async def read() -> None:
        while chunk := await proc.stdout.read(1 << 16):
            output.feed(chunk)

    try:
        await asyncio.wait_for(read(), timeout)
        code, timed_out = await proc.wait(), False
    except asyncio.TimeoutError:
        _kill(proc)
        code, timed_out = await proc.wait(), True
    finally:
        _commands.pop(token, None)
        output.stop()
    text = output.end()
    return {"exit_code": code, "output": text, "lines": output.published, "timed_out": timed_out}


def split_lines(text: str) -> list[str]:
    """A command's output as the lines ``run_command`` publishes."""
    return [_shown(line) for line in text.removesuffix("\n").split("\n")] if text else []


def _shown(line: str) -> str:
    """What a terminal ends up showing of a line: ``\\r`` redraws it (progress bars)."""
    return line.rsplit("\r", 1)[-1]


def stop_command(token: str) -> bool:
    proc = _commands.get(token)
    if proc is not None:
        _kill(proc)
    return proc is not None


async def probe(options: dict[str, Any], dask_worker: Any) -> dict[str, Any]:
    """Run the probe subprocess with the ranks' env and cwd; return its facts.

    Its options go through its stdin, never its command line: ``ps`` shows a command line to
    every local user, and the ranks' env holds ``--env`` secrets.

    On node 0 (``options["listen"]``) first listen on the master address, so every node's probe
    can test that it reaches it; keep listening until all nodes connected or time is up.
    """
    listen = options.get("listen")
    server = None
    connected = asyncio.Event()
    seen = 0

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        await reader.read()  # the probe closes first: this side's port never lingers
        writer.close()
        seen += 1
        if seen >= listen["expect"]:
            connected.set()

    if listen and listen["worker"] == dask_worker.address:
        server = await asyncio.start_server(accept, listen["host"], listen["port"])
    try:
        proc = await _start(
            [sys.executable, "-m", "jupyter_mn.node.probe"],
            options.get("env", {}),
            options.get("cwd"),
            stdin=json.dumps({k: v for k, v in options.items() if k != "env"}).encode(),
        )
        try:
            output = await asyncio.wait_for(proc.stdout.read(), options["timeout"])
        except asyncio.TimeoutError:
            _kill(proc)
            await proc.wait()
            return {"error": f"the probe did not finish within {options['timeout']:.0f} s"}
        if await proc.wait() != 0:
            tail = output.decode("utf-8", "replace").strip().splitlines()[-5:]
            return {"error": "the probe failed: " + " | ".join(tail)}
        if server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(connected.wait(), options.get("reach_timeout", 5) + 1)
        return json.loads(output.decode().strip().splitlines()[-1])
    finally:
        if server is not None:
            server.close()
