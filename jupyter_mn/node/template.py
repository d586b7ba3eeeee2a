"""The agent's side of its node's rank template (``rank/prefork.py``): start it as soon as the
node knows its job, fork cell ranks from it, hear their exits; start a rank the old way
(``process.start_in_session``) whenever it cannot.

A forked rank skips the import of torch and the rank runtime (3.6 s of a rank's 4.6 s cold
start here), at a cold start and at every restart. ``ForkedRank`` is what ``RankHandle`` holds
in place of a ``Popen``: the same pid, pipes, ``poll`` and ``wait``, its exit status from the
template; ``/proc`` shows its own command line and environment (``rank/procview.py``). A rank is
forked only when its environment and the template's agree on every variable read as a process
starts (``_early``: ``PYTHON*``, ``LD_*``, OpenMP's, ``TORCH_*``, …); a difference there
(``--env OMP_PROC_BIND=…``, a new ``PYTHONPATH``) starts it anew, any other (torchrun's
variables, ``NCCL_*``, a user's ``HF_TOKEN``) is the rank's own.
``JUPYTER_MN_RANK_TEMPLATE=0`` in the node's environment turns the template off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any

import psutil

from ..rank.env import JOB
from ..rank.forkwire import (
    MAX_MESSAGE,
    PRELOAD,
    SOCKET_FD,
    Exited,
    Forked,
    ForkFailed,
    ForkRank,
    TemplateFailed,
    TemplateReady,
)
from ..rank.procview import ROOM, ROOM_BYTES, fits
from .process import RANK_PYTHON, start_in_session

log = logging.getLogger("jupyter_mn.agent")

ENABLE = "JUPYTER_MN_RANK_TEMPLATE"
#: What every rank imports first (``python -c "import torch, jupyter_mn.rank.runtime"``).
MODULES = ("torch", "jupyter_mn.rank.runtime")
#: How long ranks wait for their template's imports before they start anew (a cold template
#: on a loaded node takes seconds; a new process would import just as long).
READY_WAIT_S = 120.0
_FORK_WAIT_S = 30.0
_CLOSE_WAIT_S = 5.0
#: Variables read as a process starts (the interpreter, the C library, OpenMP and BLAS as they
#: load, torch at its import): a rank whose value differs from its template's starts anew.
_EARLY = frozenset({"LANG", "LANGUAGE", "HOME", "TZ"})
_EARLY_PREFIXES = (
    "PYTHON",
    "LD_",
    "LC_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "GOTO",
    "MALLOC_",
    "GLIBC_",
    "TORCH_",
    "PYTORCH_",
)
#: ... but these of them are read later (at the group's start), or applied in the child.
_LATE = frozenset({"OMP_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG"})
_LATE_PREFIXES = ("TORCH_NCCL_", "TORCH_FR_")


def _early(name: str) -> bool:
    if name in _LATE or name.startswith(_LATE_PREFIXES):
        return False
    return name in _EARLY or name.startswith(_EARLY_PREFIXES)


Start = Callable[..., Any]


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this node starts its ranks from a template: asked for with
    ``JUPYTER_MN_RANK_TEMPLATE=1`` (opt-in until the suite is green with it on: see
    docs/architecture.md, "The rank template"), never for stand-in ranks."""
    return environ.get(ENABLE, "0") == "1" and not environ.get(RANK_PYTHON, "").strip()


class ForkedRank:
    """A rank forked by the template, as a ``Popen`` looks to its reader: ``pid``, ``stdout``
    and ``stderr`` (the read ends of its pipes), ``returncode``, ``poll``, ``wait``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()


def _module(argv: list[str]) -> str | None:
    """The module of ``python -m module``, the only command a template can stand in for."""
    if len(argv) == 3 and argv[0] == sys.executable and argv[1] == "-m":
        return argv[2]
    return None


class RankTemplate:
    """One node's template process and the ranks it forked (``start``)."""

    def __init__(
        self, job: str, preload: tuple[str, ...] = MODULES, environ: Mapping[str, str] = os.environ
    ) -> None:
        self.env = {**environ, "PYTHONUNBUFFERED": "1", JOB: job}
        #: why ranks do not come from it ("" while it works)
        self.failed = ""
        self._ready = threading.Event()
        self._replies: queue.Queue[ForkedRank | ForkFailed] = queue.Queue()
        self._live: dict[int, ForkedRank] = {}
        self._lock = threading.Lock()  # one fork request at a time
        #: set once a fork's reply came too late: the rank started anew, and what the template
        #: forks after that is killed, never a second process for one rank
        self._gave_up = False
        self._reply_lock = threading.Lock()
        self._warned = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._argv = [sys.executable, "-m", "jupyter_mn.rank.prefork"]
        #: its start-up environment: room for a rank's larger one (``procview.py``)
        self._room = {
            **self.env,
            PRELOAD: ",".join(preload),
            SOCKET_FD: str(theirs.fileno()),
            ROOM: "x" * ROOM_BYTES,
        }
        with theirs:
            self.proc = subprocess.Popen(
                self._argv,
                env=self._room,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # ``jupyter mn gc`` kills it by its session, as a rank
            )
        self._listener = threading.Thread(
            target=self._listen, name="jupyter-mn-rank-template", daemon=True
        )
        self._listener.start()

    def wait_ready(self, timeout: float = READY_WAIT_S) -> bool:
        """Whether it can fork now (False: it failed, or is still importing after ``timeout``)."""
        self._ready.wait(timeout)
        return self._ready.is_set() and not self.failed

    # ---- the agent's loop: start a rank
    def start(
        self, argv: list[str], env: dict[str, str], cwd: str | None, pass_fds: tuple[int, ...] = ()
    ) -> ForkedRank | subprocess.Popen[bytes]:
        """``start_in_session(argv, env, cwd, pass_fds)``, forked from the template when it can
        stand in for that command."""
        module = _module(argv)
        differs = sorted(k for k in {*env, *self.env} if env.get(k) != self.env.get(k))
        early = [k for k in differs if _early(k)]
        if module is None:
            pass
        elif not fits(argv, env, self._argv, self._room):
            log.info("rank starts anew: its environment is too large for the template's room")
        elif early:
            log.info("rank starts anew: its environment differs from the template's in %s", early)
        elif not self.wait_ready(0):
            self._warn(self.failed or "it is still importing")
        else:
            try:
                return self._fork(ForkRank(module, dict(env), cwd, tuple(pass_fds)))
            except (OSError, queue.Empty, RuntimeError) as exc:
                self.failed = self.failed or f"it did not fork: {type(exc).__name__}: {exc}"
                self._warn(self.failed)
        return start_in_session(argv, env, cwd, pass_fds)

    def _fork(self, request: ForkRank) -> ForkedRank:
        with self._lock:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            try:
                data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
                socket.send_fds(self._sock, [data], [out_w, err_w, *request.fds])
                reply = self._await_reply()
                if isinstance(reply, ForkFailed):
                    raise RuntimeError(reply.error)
            except BaseException:
                os.close(out_r)
                os.close(err_r)
                raise
            finally:
                os.close(out_w)  # the rank holds them now: its pipes end with it
                os.close(err_w)
        reply.stdout, reply.stderr = open(out_r, "rb"), open(err_r, "rb")  # noqa: SIM115
        return reply

    def _await_reply(self) -> ForkedRank | ForkFailed:
        try:
            return self._replies.get(timeout=_FORK_WAIT_S)
        except queue.Empty:
            with self._reply_lock:
                self._gave_up = True
                late = []
                while not self._replies.empty():
                    late.append(self._replies.get_nowait())
            for rank in late:  # came between the timeout and the lock
                if isinstance(rank, ForkedRank):
                    self._end_orphan(rank)
            raise

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("node rank template unavailable (%s): ranks start as new processes", why)

    # ---- its listener thread
    def _listen(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            self._hear(pickle.loads(data))
        code = self.proc.wait()
        self.failed = self.failed or f"its process ended (exit code {code})"
        self._ready.set()
        for rank in list(self._live.values()):  # no exit status can come: they end now
            self._end_orphan(rank)

    def _hear(self, msg: Any) -> None:
        if isinstance(msg, TemplateReady):
            self._ready.set()
        elif isinstance(msg, TemplateFailed):
            self.failed = f"its imports failed: {msg.error}"
            self._ready.set()
        elif isinstance(msg, Forked):
            self._live[msg.pid] = rank = ForkedRank(msg.pid)
            with self._reply_lock:
                if not self._gave_up:
                    self._replies.put(rank)
                    return
            log.warning(
                "killed pid %d: the template forked it after its start was given up", msg.pid
            )
            self._end_orphan(rank)  # the rank started anew
        elif isinstance(msg, ForkFailed):
            self._replies.put(msg)
        elif isinstance(msg, Exited) and (rank := self._live.pop(msg.pid, None)):
            rank.ended(msg.returncode)

    def _end_orphan(self, rank: ForkedRank) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rank.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(rank.pid).wait(_CLOSE_WAIT_S)
        self._live.pop(rank.pid, None)
        rank.ended(-signal.SIGKILL)

    def close(self) -> None:
        """End the template (its ranks are stopped already); it exits at its socket's end."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if not self._ready.is_set():  # still importing: nothing of it is needed any more
            self.proc.kill()
        self._listener.join(_CLOSE_WAIT_S)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._sock.close()


#: This process's templates by job (a dask worker of the dask backend may serve several).
_templates: dict[str, RankTemplate] = {}


def prestart(job: str) -> None:
    """Start ``job``'s template now, so its imports overlap the rest of the node's start."""
    if enabled() and job not in _templates:
        _templates[job] = RankTemplate(job)


async def starter(job: str) -> Start:
    """How ``job``'s ranks start on this node: forked from its template once that is ready,
    else (template off, or failed: said once, as a warning) as new processes."""
    if not enabled():
        return start_in_session
    prestart(job)
    template = _templates[job]
    await asyncio.to_thread(template.wait_ready)
    return template.start


def release(job: str) -> None:
    """``job`` is over on this node: end its template."""
    template = _templates.pop(job, None)
    if template is not None:
        template.close()
