"""The node's rank template (``node/template.py``, ``rank/prefork.py``): a real template process
forks real processes; each must be what a new ``python -m module`` process in its own session
would be, its exit seen as a ``Popen``'s; when the template cannot serve, ranks start anew."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_mn.node.process import start_in_session
from jupyter_mn.node.template import ForkedRank, RankTemplate, spawn
from jupyter_mn.rank.env import CONTROL_FD
from jupyter_mn.rank.procview import ROOM_BYTES
from tests.support.polling import wait_until

#: What a process is: the parts a template must give its children as a new process has them.
PROBE = """
import json, os, sys, threading
def kind(fd):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the listing's own descriptor, closed by now
        return None
    return target.split(":")[0] if ":" in target else target
fds = {fd: k for fd in os.listdir("/proc/self/fd") if (k := kind(fd))}
print(json.dumps({
    "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "ppid": os.getppid(),
    "fds": fds, "threads": sorted(t.name for t in threading.enumerate()),
    "env": dict(os.environ), "name": __name__, "argv0": os.path.basename(sys.argv[0]),
    "argc": len(sys.argv), "path0": sys.path[0], "cwd": os.getcwd(),
    "cuda": "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized(),
    "group": "torch" in sys.modules and sys.modules["torch"].distributed.is_initialized(),
    "sigint": str(__import__("signal").getsignal(__import__("signal").SIGINT)),
}))
print("to stderr", file=sys.stderr)
"""
MODULES = {
    "probe": PROBE,
    "exits3": "import sys\nsys.exit(3)",
    "raises": "raise ValueError('from the forked module')",
    "killsself": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "sleeps": "import time\ntime.sleep(120)",
    "termsparent": "import os, signal, time\nwhile not os.path.exists('go'):\n"
    "    time.sleep(0.05)\nos.kill(os.getppid(), signal.SIGTERM)\ntime.sleep(120)",
    "pkg/__init__": "",
    "pkg/quiet": "if __name__ == '__main__':\n    print('ran as main')",
}
JOB = "jmn-template-test"


#: What a template of JOB started with (``template.spawn``), and what its ranks get here.
def rank_env() -> dict[str, str]:
    """A rank's environment as its node would give it now: read when used, since what the
    environment of the test process holds by then is what a template started then inherits."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "JUPYTER_MN_JOB": JOB}


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("modules")
    for name, code in MODULES.items():
        path = folder / f"{name}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(textwrap.dedent(code))
    return folder


@pytest.fixture(scope="module")
def template() -> Iterator[RankTemplate]:
    started = RankTemplate.own(JOB)
    assert started.wait_ready(), started.failed
    yield started
    started.close()
    assert started.proc.returncode is not None  # it ended with its socket


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie its parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def argv(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def outputs(proc: ForkedRank | subprocess.Popen[bytes]) -> tuple[str, str, int]:
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    return out, err, proc.wait(10)


def probe(start, env: dict[str, str], cwd: Path) -> dict:
    """What the probe module saw of itself, started by ``start`` with a control socket."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        proc = start(
            argv("probe"),
            {**env, CONTROL_FD: str(theirs.fileno())},
            str(cwd),
            pass_fds=(theirs.fileno(),),
        )
    out, err, code = outputs(proc)
    assert (code, err) == (0, "to stderr\n")
    return {**json.loads(out), "proc": proc}


def test_a_forked_process_is_what_a_new_process_would_be(template, modules):
    env = {**rank_env(), "RANK": "3", "LOCAL_RANK": "1", "MASTER_PORT": "29500"}
    forked = probe(template.start, env, modules)
    fresh = probe(start_in_session, env, modules)
    assert isinstance(forked["proc"], ForkedRank), template.failed  # it came from the template
    assert forked["ppid"] == template.proc.pid != fresh["ppid"]
    assert forked["pid"] == forked["sid"] == forked["pgid"]  # it leads its own session
    same = ("fds", "threads", "env", "name", "argv0", "argc", "path0", "cwd", "sigint")
    assert {k: forked[k] for k in same} == {k: fresh[k] for k in same}
    assert forked["fds"] == {"0": "/dev/null", "1": "pipe", "2": "pipe", env_fd(forked): "socket"}
    assert forked["threads"] == ["MainThread"]
    assert forked["cuda"] is False and forked["group"] is False  # torch is there, unused
    assert forked["env"]["RANK"] == "3" and forked["env"]["JUPYTER_MN_JOB"] == JOB


def env_fd(seen: dict) -> str:
    return seen["env"][CONTROL_FD]


def test_proc_shows_its_own_command_line_and_environment(template, modules):
    """As a new process's: ``ps``, psutil and ``jupyter mn gc`` (the job's mark) read them."""
    env = {**rank_env(), "RANK": "5", "HF_TOKEN": "s3cr3t", "JUPYTER_MN_JOB": "jmn-own"}
    proc = template.start(argv("sleeps"), env, str(modules))
    assert isinstance(proc, ForkedRank)
    try:
        seen = psutil.Process(proc.pid)
        assert seen.environ() == env
        assert seen.cmdline() == argv("sleeps")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        assert outputs(proc)[2] == -signal.SIGKILL


@pytest.mark.parametrize(
    ("module", "code", "said"),
    [
        ("exits3", 3, ""),
        ("raises", 1, "ValueError: from the forked module"),
        ("killsself", -signal.SIGKILL, ""),
    ],
)
def test_its_exit_is_seen_as_a_new_process_exit(template, modules, module, code, said):
    forked = template.start(argv(module), rank_env(), str(modules))
    fresh = start_in_session(argv(module), rank_env(), str(modules))
    assert isinstance(forked, ForkedRank)
    (_, err, got), (_, fresh_err, fresh_code) = outputs(forked), outputs(fresh)
    assert got == fresh_code == code
    assert said in err and said in fresh_err
    assert not psutil.pid_exists(forked.pid)  # reaped by the template: no zombie left


def test_a_preloaded_module_runs_as_main_without_a_word(modules, no_leftovers):
    """As ``python -m``: runpy would warn that the module was imported already (the rank
    runtime is: the template preloads it)."""
    env = {**rank_env(), "PYTHONPATH": str(modules)}
    preloaded = RankTemplate.own(JOB, environ=env, preload=("pkg.quiet",))
    try:
        assert preloaded.wait_ready(), preloaded.failed
        proc = preloaded.start(argv("pkg.quiet"), env, str(modules))
        assert isinstance(proc, ForkedRank)
        assert outputs(proc) == ("ran as main\n", "", 0)
    finally:
        preloaded.close()


def test_an_environment_the_template_cannot_stand_for_starts_a_new_process(template, modules):
    """A variable read at start-up (here by OpenMP, at torch's import) needs a new process."""
    env = {**rank_env(), "OMP_PROC_BIND": "true"}
    proc = template.start(argv("exits3"), env, str(modules))
    assert isinstance(proc, subprocess.Popen)
    assert outputs(proc)[2] == 3


def test_an_environment_larger_than_the_templates_room_starts_a_new_process(template, modules):
    """``/proc`` could not show it (``procview.py``): the rank starts as a new process."""
    env = {**rank_env(), "JUPYTER_MN_LARGE": "x" * 2 * ROOM_BYTES}
    proc = template.start(argv("exits3"), env, str(modules))
    assert isinstance(proc, subprocess.Popen)
    assert outputs(proc)[2] == 3


def test_failed_imports_leave_ranks_starting_anew_with_a_warning(modules, caplog, no_leftovers):
    broken = RankTemplate.own(JOB, preload=("torch", "jupyter_mn_no_such_module"))
    try:
        assert not broken.wait_ready()
        assert "ModuleNotFoundError" in broken.failed
        with caplog.at_level(logging.WARNING, logger="jupyter_mn.agent"):
            proc = broken.start(argv("exits3"), rank_env(), str(modules))
        assert isinstance(proc, subprocess.Popen) and outputs(proc)[2] == 3
        assert "ranks start as new processes" in caplog.text
    finally:
        broken.close()


def test_a_template_that_dies_takes_its_ranks_and_later_ones_start_anew(modules, no_leftovers):
    doomed = RankTemplate.own(JOB)
    try:
        assert doomed.wait_ready(), doomed.failed
        rank = doomed.start(argv("sleeps"), rank_env(), str(modules))
        assert isinstance(rank, ForkedRank)
        doomed.proc.kill()
        assert outputs(rank)[2] == -signal.SIGKILL  # ended by its agent: nobody reports it
        assert "its process ended" in doomed.failed
        later = doomed.start(argv("exits3"), rank_env(), str(modules))
        assert isinstance(later, subprocess.Popen) and outputs(later)[2] == 3
    finally:
        doomed.close()


def test_a_fork_answered_too_late_starts_anew_and_the_late_process_is_killed(
    modules, monkeypatch, caplog, no_leftovers
):
    """One rank, one process: the template's child that comes after the agent gave up on it is
    killed, never left beside the rank started anew (nor taken for the next rank)."""
    slow, proc = RankTemplate.own(JOB), None
    try:
        assert slow.wait_ready(), slow.failed
        monkeypatch.setattr("jupyter_mn.node.template._FORK_WAIT_S", 0.0)
        with caplog.at_level(logging.WARNING, logger="jupyter_mn.agent"):
            proc = slow.start(argv("sleeps"), rank_env(), str(modules))
            assert isinstance(proc, subprocess.Popen)  # started anew
            assert "did not fork" in slow.failed
            wait_until(lambda: "forked it after its start was given up" in caplog.text, 20)
        late = int(caplog.text.split("killed pid ")[1].split(":")[0])
        assert late != proc.pid
        wait_until(lambda: gone(late), 20, "the late process to end")  # SIGKILL takes a moment
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        slow.close()


def test_one_template_serves_several_nodes_and_tells_each_of_its_own_ranks(modules, no_leftovers):
    """The local backend's kernel starts one template for a gang's nodes: each node's ranks
    are forked on its request, their exits told to it alone; the template serves on until the
    last node lets it go."""
    proc, socks = spawn(JOB, 2, rank_env())
    first, second = (RankTemplate(sock) for sock in socks)
    try:
        assert first.wait_ready(), first.failed
        assert second.wait_ready(), second.failed
        exits = first.start(argv("exits3"), rank_env(), str(modules))
        sleeps = second.start(argv("sleeps"), rank_env(), str(modules))
        assert isinstance(exits, ForkedRank) and isinstance(sleeps, ForkedRank)
        assert outputs(exits)[2] == 3
        assert sleeps.poll() is None
        first.close()
        later = second.start(argv("exits3"), rank_env(), str(modules))
        assert isinstance(later, ForkedRank) and outputs(later)[2] == 3
        os.kill(sleeps.pid, signal.SIGKILL)
        assert sleeps.wait(10) == -signal.SIGKILL
        second.close()
        assert proc.wait(10) == 0
    finally:
        first.close()
        second.close()
        proc.kill()
        proc.wait()


def test_a_node_process_that_dies_takes_its_ranks_and_the_template_serves_on(modules, no_leftovers):
    """A node killed (its agent never closes anything) leaves the socket's end alone: the
    template kills the ranks it forked for that node at once, whatever the others do."""
    proc, (dying, staying) = spawn(JOB, 2, rank_env())
    node = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time\n"
            "from jupyter_mn.node.template import RankTemplate\n"
            f"t = RankTemplate(socket.socket(fileno={dying.fileno()}))\n"
            "assert t.wait_ready(), t.failed\n"
            f"rank = t.start([sys.executable, '-m', 'sleeps'], {rank_env()!r}, {str(modules)!r})\n"
            "print(rank.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(dying.fileno(),),
    )
    dying.close()
    other = RankTemplate(staying)
    try:
        rank = int(node.stdout.readline())
        assert other.wait_ready(), other.failed
        sleeps = other.start(argv("sleeps"), rank_env(), str(modules))
        node.kill()
        node.wait()
        wait_until(lambda: not psutil.pid_exists(rank), 10)  # killed, and reaped
        assert sleeps.poll() is None and proc.poll() is None
    finally:
        other.close()
        node.kill()
        proc.wait(10)


#: A node process: its end of a template (its own, or an inherited socket of a shared one), one
#: rank of ``module`` forked from it (its pid printed), then, for each line read, whether a
#: SIGTERM reached the node.
NODE = """
import signal, socket, sys
heard = []
signal.signal(signal.SIGTERM, lambda *_: heard.append(1))
from jupyter_mn.node.template import RankTemplate
fd, module, env, cwd = int(sys.argv[1]), sys.argv[2], eval(sys.argv[3]), sys.argv[4]
t = RankTemplate.own(env["JUPYTER_MN_JOB"]) if fd < 0 else RankTemplate(socket.socket(fileno=fd))
assert t.wait_ready(), t.failed
rank = t.start([sys.executable, "-m", module], env, cwd)
print(rank.pid, t.ready.pid, flush=True)
for _ in sys.stdin:
    print("heard" if heard else "not heard", flush=True)
"""


class Node:
    """A node process (``NODE``) and what it says."""

    def __init__(self, fd: int, module: str, modules: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", NODE, str(fd), module, repr(rank_env()), str(modules)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(fd,) if fd >= 0 else (),
        )
        self.rank, self.template = map(int, self.proc.stdout.readline().split())

    def heard(self) -> bool:
        self.proc.stdin.write("?\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip() == "heard"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_a_sigterm_to_a_nodes_own_template_is_one_to_its_node(modules, no_leftovers):
    """Slurm signals every process of the step: the node process hears the SIGTERM (the
    preemption notice), and the template serves on with its rank."""
    node = Node(-1, "sleeps", modules)
    try:
        os.kill(node.template, signal.SIGTERM)
        wait_until(node.heard, 10, "the node heard it")
        assert psutil.pid_exists(node.template) and psutil.pid_exists(node.rank)
    finally:
        node.close()


def test_a_rank_that_sigterms_its_parent_preempts_its_own_node_alone(modules, no_leftovers):
    """As under torchrun, whose ranks' parent is their node's agent: a rank's
    ``os.kill(os.getppid(), SIGTERM)`` reaches its node through the template the local
    backend's nodes share, and no other node."""
    proc, ends = spawn(JOB, 2, rank_env())
    nodes = []
    try:
        for end, module in zip(ends, ("termsparent", "sleeps"), strict=True):
            nodes.append(Node(end.fileno(), module, modules))
            end.close()
        signalled, other = nodes
        (modules / "go").touch()  # now that both nodes have asked the template for a rank
        wait_until(signalled.heard, 10, "the rank's node heard it")
        assert not other.heard()
        assert proc.poll() is None
    finally:
        for node in nodes:
            node.close()
        for end in ends:
            end.close()
        proc.wait(10)
        (modules / "go").unlink(missing_ok=True)
