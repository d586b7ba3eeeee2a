"""The agent's side of its node's rank template (``rank/prefork.py``): start it as soon as the
node knows its job (a local gang's nodes share one their kernel started first, ``spawn``, and
find their end of its socket in ``SHARED``), fork cell ranks from it, hear their exits; start a
rank the old way (``process.start_in_session``) whenever it cannot.

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
    NODE_PID,
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
#: A local node's end of the socket to the template its kernel started for the gang (a
#: descriptor number), in its worker process's environment (``gang/local.py``).
SHARED = "JUPYTER_MN_TEMPLATE_SHARED_FD"
#: The template's command: as long as a rank's (``procview.py``).
COMMAND = [sys.executable, "-m", "jupyter_mn.rank.prefork"]
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


def _differs(env: Mapping[str, str], template: Mapping[str, str]) -> list[str]:
    """The variables read as a process starts whose values ``env`` and ``template`` differ in."""
    return sorted(k for k in {*env, *template} if _early(k) and env.get(k) != template.get(k))


Start = Callable[..., Any]


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this node starts its ranks from a template: unless ``JUPYTER_MN_RANK_TEMPLATE=0``,
    never for stand-in ranks."""
    return environ.get(ENABLE, "1") != "0" and not environ.get(RANK_PYTHON, "").strip()


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


def spawn(
    job: str,
    agents: int,
    environ: Mapping[str, str],
    node_pid: int | None = None,
    preload: tuple[str, ...] = MODULES,
) -> tuple[subprocess.Popen[bytes], list[socket.socket]]:
    """Start a template for ``agents`` node agents: its process, and each agent's end of its
    socket. ``node_pid``: the node process a SIGTERM to it goes on to (a node's own template)."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(agents)]
    theirs = [fd.fileno() for _, fd in pairs]
    env = {
        **environ,
        "PYTHONUNBUFFERED": "1",
        JOB: job,
        PRELOAD: ",".join(preload),
        SOCKET_FD: ",".join(map(str, theirs)),
        ROOM: "x" * ROOM_BYTES,  # room for a rank's larger environment (``procview.py``)
    }
    if node_pid is not None:
        env[NODE_PID] = str(node_pid)
    try:
        proc = subprocess.Popen(
            COMMAND,
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=theirs,
            start_new_session=True,  # ``jupyter mn gc`` kills it by its session, as a rank
        )
    except BaseException:
        for pair in pairs:
            for end in pair:
                end.close()
        raise
    for _, end in pairs:
        end.close()
    return proc, [ours for ours, _ in pairs]


class RankTemplate:
    """A node's end of a template (its own, ``proc``, or the one the local backend's kernel
    started for all of a gang's nodes) and the ranks it forked for this node (``start``)."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.proc = proc
        #: why ranks do not come from it ("" while it works)
        self.failed = ""
        #: what it said once its imports were done
        self.ready: TemplateReady | None = None
        self._ready = threading.Event()
        self._replies: queue.Queue[ForkedRank | ForkFailed] = queue.Queue()
        self._live: dict[int, ForkedRank] = {}
        self._lock = threading.Lock()  # one fork request at a time
        #: set once a fork's reply came too late: the rank started anew, and what the template
        #: forks after that is killed, never a second process for one rank
        self._gave_up = False
        self._reply_lock = threading.Lock()
        self._warned = False
        self._sock = sock
        self._listener = threading.Thread(
            target=self._listen, name="jupyter-mn-rank-template", daemon=True
        )
        self._listener.start()

    @classmethod
    def own(
        cls, job: str, environ: Mapping[str, str] = os.environ, preload: tuple[str, ...] = MODULES
    ) -> RankTemplate:
        """A template of this node's own, this process's child."""
        proc, (sock,) = spawn(job, 1, environ, os.getpid(), preload)
        return cls(sock, proc)

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
        ready = self.ready
        if module is None:
            pass
        elif ready is None or self.failed:
            self._warn(self.failed or "it is still importing")
        elif not fits(argv, env, ready.room):
            log.info("rank starts anew: its environment is too large for the template's room")
        elif early := _differs(env, ready.env):
            log.info("rank starts anew: its environment differs from the template's in %s", early)
        else:
            try:
                return self._fork(ForkRank(module, dict(env), cwd, tuple(pass_fds), os.getpid()))
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
        if self.proc is None:
            self.failed = self.failed or "it closed its socket"
        else:
            code = self.proc.wait()
            self.failed = self.failed or f"its process ended (exit code {code})"
        self._ready.set()
        for rank in list(self._live.values()):  # no exit status can come: they end now
            self._end_orphan(rank)

    def _hear(self, msg: Any) -> None:
        if isinstance(msg, TemplateReady):
            self.ready = msg
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
        """Let the template go (its ranks are stopped already): it exits once its sockets'
        other ends are closed."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self.proc is not None and not self._ready.is_set():  # still importing: not needed
            self.proc.kill()
        self._listener.join(_CLOSE_WAIT_S)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._sock.close()


#: This process's templates by job (a dask worker of the dask backend may serve several).
_templates: dict[str, RankTemplate] = {}


def prestart(job: str) -> None:
    """Start ``job``'s template now, so its imports overlap the rest of the node's start: the
    one the local backend's kernel started for the gang's nodes (its socket in ``SHARED``),
    else one of this node's own."""
    if not enabled() or job in _templates:
        return
    shared = os.environ.pop(SHARED, "")  # not the ranks': only this process holds it
    if shared:
        _templates[job] = RankTemplate(socket.socket(fileno=int(shared)))
    else:
        _templates[job] = RankTemplate.own(job)


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
