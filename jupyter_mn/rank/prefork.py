"""A node's rank template: a process that imports what every rank imports (torch and the rank
runtime, ~3.6 s of a rank's 4.6 s start-up) once, then forks each rank from that state.

The node agent (``node/template.py``) starts it as ``python -m jupyter_mn.rank.prefork`` (a
command as long as a rank's: ``procview.py``) as soon as the node knows its job. It imports the
modules ``JUPYTER_MN_TEMPLATE_PRELOAD`` names, checks that CUDA is still uninitialized (a
forked child cannot use a CUDA context its parent made), says ``TemplateReady`` on the socket
``JUPYTER_MN_TEMPLATE_FD`` names, then forks on each ``ForkRank`` (``forkwire.py``). The child
becomes what ``Popen([python, "-m", module], start_new_session=True, pass_fds=…)`` would start
(``_become``): its own session, only the descriptors it was given (at the agent's numbers),
exactly the environment it was sent (``/proc`` shows it, and its command line), ``cwd`` first
on ``sys.path``, the signal dispositions the template started with. The template reaps its
children and reports each exit (``Exited``): only a parent gets a child's exit status. It exits
when the agent's end of the socket closes (the agent, or its node, is gone); its ranks follow
(``parent.py``). multiprocessing's forkserver does the same job but also re-runs the parent's
``__main__`` in each child, gives it the parent's ``sys.argv`` and working directory and leaves
its own descriptors (resource tracker, forkserver liveness) open in every child.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import os
import pickle
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from . import procview
from .forkwire import (
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

#: The dispositions a fresh process inherits, as this one found them at its start, and the
#: signals it found blocked (the template blocks SIGTERM: ``_Agents.terms``).
_STARTED_WITH = {
    sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGCHLD, signal.SIGTERM)
}
_BLOCKED = signal.pthread_sigmask(signal.SIG_BLOCK, [])
#: How often the template looks for a SIGTERM (blocked: only waiting for it says who sent it).
_TERM_POLL_S = 0.1


def _send(sock: socket.socket, msg: Any) -> None:
    sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _preload(modules: list[str]) -> None:
    for name in modules:
        importlib.import_module(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("an import initialized CUDA: forked ranks could not use the GPU")


def _move_fds(given: list[int], targets: list[int]) -> None:
    """Put each descriptor of ``given`` at its number in ``targets`` and close every other one
    (stdin, stdout and stderr are among the targets)."""
    above = max(given + targets) + 1  # parked where no target is, then moved
    parked = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in given]
    for fd in given:
        os.close(fd)
    for fd, target in zip(parked, targets, strict=True):
        os.dup2(fd, target)  # a dup2 target is inheritable, as pass_fds makes it
    low = 0
    for fd in [*sorted(targets), os.sysconf("SC_OPEN_MAX")]:
        if fd > low:  # an empty range would close them all (close_range(low, low - 1))
            os.closerange(low, fd)
        low = fd + 1


def _fresh_state(module: str, env: dict[str, str], cwd: str | None) -> None:
    """What a new interpreter would have, where the template's own differs."""
    os.environ.clear()
    procview.show([sys.executable, "-m", module], env)
    os.environ.update(env)
    if cwd:
        os.chdir(cwd)
    sys.path[0] = os.getcwd()  # ``python -m`` puts the working directory first
    del sys.argv[1:]  # runpy sets argv[0]; the template's own arguments go
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and "torch" in sys.modules:  # OpenMP read it when torch loaded
        sys.modules["torch"].set_num_threads(int(threads))


def _become(request: ForkRank, given: list[int], led: int) -> None:
    """In the child: turn into the process ``request`` describes and run its module; never
    returns. Closing ``led`` tells the template it is set up: it leads its session, ``/proc``
    shows its own command line and environment (``_fork`` waits for that, as ``Popen`` returns
    once its child has run, so a ``killpg`` or a look at ``/proc`` right away finds it)."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig, handler in _STARTED_WITH.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, _BLOCKED)
        null = os.open(os.devnull, os.O_RDONLY)
        held = max([2, *request.fds]) + 1  # ``led``, kept open at a number of its own meanwhile
        _move_fds([null, *given, led], [0, 1, 2, *request.fds, held])
        _fresh_state(request.module, request.env, request.cwd)
        os.close(held)
        if "numpy" in sys.modules:  # seeded in the template (numpy 2 reseeds at a fork itself)
            sys.modules["numpy"].random.seed()  # 15 ms: after the template's wait
        code = _run(request.module)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _run(module: str) -> int:
    """``python -m module``: its exit code, its uncaught exception printed, atexit run."""
    sys.modules.pop(module, None)  # as under ``-m``: the module runs as ``__main__`` alone
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


def _fork(sock: socket.socket) -> tuple[int, int] | None:
    """Serve one request of ``sock``'s agent: the pid forked (0: none) and the asking node's
    process; None once the agent is gone."""
    data, given, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 64)
    if not data:
        return None
    request: ForkRank = pickle.loads(data)
    pid = 0
    try:
        if threading.active_count() > 1:  # only the forking thread would live on in the child
            raise RuntimeError(f"the template runs {threading.active_count()} threads")
        waiting, led = os.pipe()
        pid = os.fork()
    except (OSError, RuntimeError) as exc:
        _send(sock, ForkFailed(f"{type(exc).__name__}: {exc}"))
    else:
        if pid == 0:
            os.close(waiting)
            _become(request, given, led)  # closes every descriptor it was not given
        os.close(led)
        os.read(waiting, 1)  # its end: the child is set up (or died trying)
        os.close(waiting)
        _send(sock, Forked(pid))
    for fd in given:
        os.close(fd)
    return pid, request.node


class _Agents:
    """The agents' sockets (one per node the template serves), which one asked for each
    process (its exit goes to that agent alone) and each agent's node process. An agent gone
    (its socket's end: its node process died, or it let the template go) takes the processes
    it asked for: a rank never outlives its node, even while the template serves other nodes."""

    def __init__(self, socks: list[socket.socket], node: int | None) -> None:
        self.open = set(socks)
        self._asked: dict[int, socket.socket] = {}
        #: each agent's node process, as its requests say (a node's own template: from its start)
        self._nodes: dict[socket.socket, int] = {socks[0]: node} if node else {}

    def serve(self, sock: socket.socket) -> bool:
        """One request of ``sock``'s; False once that agent is gone."""
        try:
            forked = _fork(sock)
        except OSError:  # its end closed mid-request
            forked = None
        if forked is None:
            self.open.discard(sock)
            self._nodes.pop(sock, None)
            sock.close()
            for child, asker in self._asked.items():
                if asker is sock:  # not reaped yet: its pid is still its own
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(child, signal.SIGKILL)
            return False
        pid, node = forked
        if pid:
            self._asked[pid] = sock
            self._nodes[sock] = node
        return True

    def reap(self) -> None:
        """Report every child that ended, to its agent."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            sock = self._asked.pop(pid, None)
            if sock in self.open:
                with contextlib.suppress(OSError):  # its agent is going: no one to tell
                    _send(sock, Exited(pid, os.waitstatus_to_exitcode(status)))

    def terms(self) -> None:
        """Pass each SIGTERM on: a rank's (``os.kill(os.getppid(), SIGTERM)``, as under
        torchrun, whose parent is its node's agent) to that rank's node; anyone else's (Slurm
        signals every process of a step) to every node it serves. The template lives on until
        its agents let it go."""
        while (info := signal.sigtimedwait([signal.SIGTERM], 0)) is not None:
            asker = self._asked.get(info.si_pid)
            nodes = [self._nodes[asker]] if asker in self._nodes else list(self._nodes.values())
            for node in nodes:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(node, signal.SIGTERM)


def serve(socks: list[socket.socket], node: int | None = None) -> None:
    """Fork on request, report exits and pass SIGTERMs on until every agent has closed its
    end (``node``: the one node process a node's own template serves)."""
    agents = _Agents(socks, node)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd hears it
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while agents.open:
        for key, _ in selector.select(_TERM_POLL_S):
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
            elif key.fileobj in agents.open and not agents.serve(key.fileobj):
                selector.unregister(key.fileobj)
        agents.reap()
        agents.terms()


def _ready(socks: list[socket.socket], msg: Any) -> list[socket.socket]:
    """Say ``msg`` to every agent; those still there."""
    heard = []
    for sock in socks:
        try:
            _send(sock, msg)
            heard.append(sock)
        except OSError:  # that agent went first (its gang closed while this one imported)
            sock.close()
    return heard


def main() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # said on, not obeyed: ``terms``
    node = int(os.environ.pop(NODE_PID, "0")) or None
    socks = [socket.socket(fileno=int(fd)) for fd in os.environ.pop(SOCKET_FD).split(",")]
    try:
        _preload(os.environ.pop(PRELOAD).split(","))
    except Exception as exc:
        _ready(socks, TemplateFailed(f"{type(exc).__name__}: {exc}"))
        return
    env = {k: v for k, v in os.environ.items() if k != procview.ROOM}
    if socks := _ready(socks, TemplateReady(os.getpid(), env, procview.room())):
        serve(socks, node)
    os._exit(0)  # torch's interpreter teardown takes a while, and nothing here needs it


if __name__ == "__main__":
    main()
