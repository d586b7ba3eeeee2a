"""The control plane's processes: started with their logs in DIR, awaited, and always stopped.

Each component is a child of the process that started the control plane and dies with it
(``PR_SET_PDEATHSIG``): a test run killed with SIGKILL leaves no etcd or API server behind,
which a ``finally`` alone cannot promise. Readiness is each component's own health endpoint,
as kubeadm and envtest wait for them, never a sleep.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class StartError(RuntimeError):
    """A component exited or did not become ready; the message ends with its log's tail."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held together while chosen, so they
    differ; another process may still take one before the component binds it, as in kwok#475,
    which shows as a StartError naming the port)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def _die_with(parent: int) -> None:
    """In the child, before its exec: SIGKILL when ``parent`` dies. The tie is to the thread
    that forks, which is why components start from the test's main thread; a parent already
    gone before it was made would never signal, so the child ends itself then."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


class Process:
    """One component: ``argv`` run with its output in ``log``."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log, self.env = name, argv, log, env
        self.popen = self._spawn()
        #: where and how its readiness was awaited: what a restart awaits again
        self._ready: tuple[str, ssl.SSLContext | None] = ("", None)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=functools.partial(_die_with, os.getpid()),
            )

    def restart(self, timeout: float) -> None:
        """Stop it and start it again with the same command; return once ready again."""
        self.stop()
        self.popen = self._spawn()
        self.wait_ready(*self._ready, timeout)

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_ready(self, url: str, context: ssl.SSLContext | None, timeout: float) -> None:
        """Poll ``url`` until it answers 200 (a component's /healthz, /readyz or /health)."""
        self._ready = (url, context)
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise StartError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(url, context=context, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise StartError(f"{self.name} not ready at {url} in {timeout} s:\n{self.tail()}")
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        self.popen.wait()


def child_env(root: Path) -> dict[str, str]:
    """The components' environment: no proxy (everything is on loopback), and a TMPDIR in
    DIR, so nothing they write lands outside it."""
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    drop = {"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "KUBECONFIG"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(TMPDIR=str(tmp), NO_PROXY="127.0.0.1,localhost", HOME=str(root))
    return env
