"""Find this test session's processes by the mark they inherit, even after re-parenting."""

from __future__ import annotations

import contextlib
import os
import time
import uuid

import psutil

TOKEN = os.environ.setdefault("JUPYTER_MN_TEST_TOKEN", uuid.uuid4().hex)


#: multiprocessing's per-interpreter helper: it belongs to (and exits with) its parent.
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker",)


#: The processes running at each ``started_now`` mark: never counted as started after it.
_RUNNING: dict[float, set[tuple[int, float]]] = {}


def started_now() -> float:
    """A mark for ``ours``: what starts from now on. What runs now is remembered (by pid and
    create time, which tell a reused pid apart) and left out; a create time is never compared
    with the clock, as it is only as exact as the boot time (a whole second)."""
    since = time.time()
    running = psutil.process_iter(["pid", "create_time"])
    _RUNNING[since] = {(p.info["pid"], p.info["create_time"]) for p in running}
    return since


def ours(since: float | None = None) -> list[psutil.Process]:
    """Live processes of this test session started after the mark ``since`` (``started_now``),
    or all of them (excluding pytest itself)."""
    found = []
    before = _RUNNING[since] if since is not None else set()
    for proc in psutil.process_iter(["pid", "create_time"]):
        if proc.pid == os.getpid() or (proc.pid, proc.info["create_time"]) in before:
            continue
        try:
            if proc.environ().get("JUPYTER_MN_TEST_TOKEN") != TOKEN or proc.status() in (
                psutil.STATUS_ZOMBIE,
                psutil.STATUS_DEAD,
            ):
                continue
            if not any(h in " ".join(proc.cmdline()) for h in _INTERPRETER_HELPERS):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_gone(procs: list[psutil.Process], timeout: float = 20.0) -> list[str]:
    """Describe the processes still alive after ``timeout`` (psutil polls; no blind sleep)."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return running(alive)


def running(procs: list[psutil.Process]) -> list[str]:
    """Describe those still running: zombies count as gone (their parent may not reap them)."""
    left = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return left


def processes(*pids: int) -> list[psutil.Process]:
    """The ones of ``pids`` that still exist."""
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return found


def rank_processes(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if "jupyter_mn.rank.runtime" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def node_of(rank: psutil.Process) -> psutil.Process:
    """The node process (its dask worker) a rank runs under: its parent; or, for a rank forked
    from a rank template, its template's parent (a node's own template), or the local node of
    the rank's job and ``GROUP_RANK`` beside the template (the one a local gang's nodes share)."""
    parent = rank.parent()
    if "jupyter_mn.rank.prefork" not in parent.cmdline():
        return parent
    above = parent.parent()
    if "dask_spec" in " ".join(above.cmdline()):
        return above
    env = rank.environ()  # the worker's ``dask spec`` names its job and its node
    marks = (f'"job": "{env["JUPYTER_MN_JOB"]}"', f'"name": "{env["GROUP_RANK"]}"')
    return next(p for p in above.children() if all(m in " ".join(p.cmdline()) for m in marks))


def open_files(pid: int | str = "self") -> list[str]:
    """What process ``pid``'s descriptors name (one closed before its readlink is left out;
    none once the process has gone)."""
    paths: list[str] = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return paths
    for fd in fds:
        with contextlib.suppress(FileNotFoundError):
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return paths
