"""A real Jupyter kernel (the "Python 3 (jupyter_mn)" kernel spec) driven like a notebook."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_client.manager import KernelManager


@dataclass
class Reply:
    status: str
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    #: every representation of the execute_result (text/plain, text/html, …)
    data: dict[str, Any] = field(default_factory=dict)
    ename: str | None = None
    evalue: str | None = None
    traceback: list[str] = field(default_factory=list)
    displays: list[dict[str, Any]] = field(default_factory=list)
    #: (seconds since the request, text) for every stdout chunk: shows output arrives live
    stream_times: list[tuple[float, str]] = field(default_factory=list)
    #: the prompts of the input requests the cell made, in order
    prompts: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    #: the cell's In[N], from its execute_input
    execution_count: int | None = None

    @property
    def error_text(self) -> str:
        return "\n".join([f"{self.ename}: {self.evalue}", *self.traceback, self.stderr])


class Kernel:
    """Start a kernel, run cells, collect their outputs; always shut down."""

    def __init__(
        self,
        name: str = "jupyter_mn",
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        """``env``: variables added to this process's environment for the kernel; ``cwd``:
        its working directory (the notebook's)."""
        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel(env={**os.environ, **(env or {})}, cwd=cwd)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.pid).children(recursive=True)

    def run(
        self,
        code: str,
        timeout: float = 120,
        on_stream: Callable[[str], None] | None = None,
        answer: Callable[[str], str | None] | None = None,
        allow_stdin: bool = True,
    ) -> Reply:
        """Run ``code``; ``on_stream(all stdout so far)`` as each stdout message arrives;
        ``answer(prompt)`` replies to each input request, as a notebook's input box does (None:
        no reply); ``allow_stdin=False`` runs it as papermill and nbclient do."""
        reply = Reply(status="?")
        started = time.monotonic()

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_input":
                reply.execution_count = content["execution_count"]
            elif kind == "stream":
                name = "stdout" if content["name"] == "stdout" else "stderr"
                setattr(reply, name, getattr(reply, name) + content["text"])
                reply.stream_times.append((time.monotonic() - started, content["text"]))
                if on_stream is not None and name == "stdout":
                    on_stream(reply.stdout)
            elif kind == "execute_result":
                reply.result = content["data"].get("text/plain")
                reply.data = content["data"]
            elif kind == "display_data":
                reply.displays.append(content["data"])
            elif kind == "error":
                reply.ename, reply.evalue = content["ename"], content["evalue"]
                reply.traceback = content["traceback"]

        def stdin_hook(msg: dict[str, Any]) -> None:
            prompt = msg["content"]["prompt"]
            reply.prompts.append(prompt)
            line = answer(prompt) if answer is not None else ""
            if line is not None:
                self.kc.input(line)

        msg = self.kc.execute_interactive(
            code,
            timeout=timeout,
            output_hook=hook,
            stdin_hook=stdin_hook,
            allow_stdin=allow_stdin,
        )
        reply.status = msg["content"]["status"]
        reply.elapsed = time.monotonic() - started
        return reply

    def iopub_during(
        self,
        code: str,
        timeout: float = 120,
        on_msg: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Every IOPub message (any parent: widget threads send without one) until the cell ends.

        ``on_msg(msg)`` sees each message as it arrives, and ``on_msg(None)`` each second
        without one (a test that gates the cell on what it saw can give up and let it end).
        """
        msg_id = self.kc.execute(code)
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=min(1.0, deadline - time.monotonic()))
            except queue.Empty:
                if on_msg is not None:
                    on_msg(None)
                continue
            msg["received"] = time.monotonic()
            seen.append(msg)
            if on_msg is not None:
                on_msg(msg)
            ours = msg["parent_header"].get("msg_id") == msg_id
            if ours and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return seen
        raise TimeoutError(f"cell did not finish within {timeout} s")

    def shutdown(self, restart: bool = False) -> None:
        if restart:
            self.km.restart_kernel(now=False)
            self.kc.wait_for_ready(timeout=60)
            return
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


@contextmanager
def module_kernel(warm: str = "") -> Iterator[Kernel]:
    """A kernel that a module's tests share (after ``warm``, a first cell that must pass); its
    gang is taken down and the kernel shut down afterwards, also when a test failed."""
    k = Kernel()
    try:
        if warm:
            reply = k.run(warm, timeout=180)
            assert reply.status == "ok", reply.error_text
        yield k
    finally:
        k.run("%cluster down")
        k.shutdown()
