"""The local backend is loopback only: nothing of a gang listens where the network reaches it."""

from __future__ import annotations

import ipaddress
import os
import time

import psutil
import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import SchedulingError
from jupyter_mn.gang import local

#: A cell that holds the group's sockets open while the test looks (gloo listens per pair).
ALL_REDUCE = """
import os, torch, torch.distributed as dist
t = torch.ones(1)
dist.all_reduce(t)
(t.item(), os.environ.get("GLOO_SOCKET_IFNAME"))
"""


def listening(proc: psutil.Process) -> set[tuple[str, int]]:
    try:
        return {
            (c.laddr.ip, c.laddr.port)
            for c in proc.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return set()


def test_a_local_gang_listens_on_loopback_only(no_leftovers):
    kernel = psutil.Process(os.getpid())
    before, running = listening(kernel), set(kernel.children(recursive=True))
    with Cluster(nodes=2, gpus=2) as cluster:
        total, ifname = cluster.run(ALL_REDUCE).unwrap()
        # the kernel's new listeners (none: its client only connects), then the scheduler's, the
        # workers' and the ranks'
        sockets = {("kernel", *s) for s in listening(kernel) - before}
        for proc in set(kernel.children(recursive=True)) - running:  # the gang's processes
            sockets |= {(" ".join(proc.cmdline()[:5]), *s) for s in listening(proc)}
    ranks = [s for s in sockets if "jupyter_mn.rank.runtime" in s[0]]
    assert ranks, f"no rank listens (the store, gloo): {sockets}"
    assert not [s for s in sockets if s[0] == "kernel"], "the scheduler is a process of its own"
    assert [s for s in sockets if "localnode.scheduler" in s[0]], sockets
    exposed = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert (total, ifname) == (4.0, "lo")


def test_a_node_whose_worker_dies_at_start_fails_the_gang_at_once(monkeypatch, no_leftovers):
    """A worker process that cannot start (here: its preload cannot be imported) is named within
    seconds, not after ``start_timeout`` (waiting for workers alone would wait it out)."""
    spawn = local.LocalProvisioner._spawn

    def broken_workers(self, env, kind, opts, **io):
        if kind == "worker":
            opts = {**opts, "preload": ["jupyter_mn.no_such_module"]}
        return spawn(self, env, kind, opts, **io)

    monkeypatch.setattr(local.LocalProvisioner, "_spawn", broken_workers)
    started = time.monotonic()
    with pytest.raises(SchedulingError, match=r"node \d's worker process exited with code \d+"):
        Cluster(nodes=2, gpus=1, start_timeout=120).run("1")
    assert time.monotonic() - started < 60  # half the start timeout: it did not wait it out


def test_a_scheduler_that_cannot_start_fails_the_gang_at_once(monkeypatch, no_leftovers):
    """The scheduler's process is named when it dies at start (here: no Python runtime)."""
    monkeypatch.setitem(local._PROCESS_ENV, "PYTHONHOME", "/nonexistent")
    started = time.monotonic()
    with pytest.raises(SchedulingError, match=r"scheduler's process exited with code \d+"):
        Cluster(nodes=2, gpus=1, start_timeout=120).run("1")
    assert time.monotonic() - started < 60
