"""``jupyter mn gc`` kills a dead kernel's leftover ranks, and never a live kernel's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_mn.jobs.gc import collect
from jupyter_mn.jobs.registry import ORPHAN_AFTER_S, NodeModel, Registry
from jupyter_mn.node.template import ForkedRank, RankTemplate
from tests.support.jobs import make_job


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "reg")
    yield reg
    reg.close()


@pytest.fixture
def spawn() -> Iterator:
    """Start sleeping processes (each leading its own session, as ranks do); stop them after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            env={**os.environ, **env},
            start_new_session=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def stalled_job(gang: str, kernel_pid: int, rank_pid: int, started: float):
    """A local job whose kernel stopped beating ``ORPHAN_AFTER_S`` ago, with one rank."""
    return make_job(
        gang,
        pid=kernel_pid,
        started=started,
        heartbeat=time.time() - ORPHAN_AFTER_S - 1,
        nodes=[NodeModel(0, ranks=["ready"], pids=[rank_pid])],
    )


def test_a_live_kernel_whose_heartbeat_stalled_keeps_its_ranks(registry, spawn):
    """This test process is the kernel: alive, started before its job, silent for 31 s."""
    rank = spawn(JUPYTER_MN_JOB="jmn-busy")
    registry.save(stalled_job("jmn-busy", os.getpid(), rank.pid, started=time.time()))
    assert registry.reap() == []  # its process is seen to run: not ORPHANED
    assert registry.job("jmn-busy").state == "READY"
    assert collect(registry, keep_s=0) == []
    assert rank.poll() is None  # not killed
    assert registry.job("jmn-busy")  # not forgotten either


def test_a_kernel_that_is_gone_has_its_ranks_killed_even_if_its_pid_was_reused(registry, spawn):
    rank = spawn(JUPYTER_MN_JOB="jmn-gone")
    reused = spawn()  # a new process that got the dead kernel's pid: it started after the job
    registry.save(stalled_job("jmn-gone", reused.pid, rank.pid, started=time.time() - 60))
    report = collect(registry, keep_s=1e9)
    assert report == [f"jmn-gone: killed 1 leftover rank process(es): {rank.pid}"]
    rank.wait(10)  # ended (gc reaped it: its exit status went to psutil)
    assert reused.poll() is None  # only the rank was touched


def test_a_rank_forked_from_its_template_is_killed_and_so_is_the_template(
    registry, spawn, tmp_path
):
    """The forked rank shows the job's mark in /proc as a new rank would (``procview.py``);
    its template carries the mark too and is said apart from the ranks."""
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    template = RankTemplate.own("jmn-forked")
    try:
        assert template.wait_ready(), template.failed
        rank = template.start([sys.executable, "-m", "sleeper"], template.ready.env, str(tmp_path))
        assert isinstance(rank, ForkedRank)
        reused = spawn()
        registry.save(stalled_job("jmn-forked", reused.pid, rank.pid, started=time.time() - 60))
        report = collect(registry, keep_s=1e9)
        assert report == [
            f"jmn-forked: killed 1 leftover rank process(es): {rank.pid}",
            f"jmn-forked: killed its rank template(s): {template.proc.pid}",
        ]
        assert rank.wait(10) == -signal.SIGKILL  # ended by gc: the agent heard the exit
        template.proc.wait(10)  # its status went to gc's psutil, which reaped it here
        assert not psutil.pid_exists(template.proc.pid)
    finally:
        template.close()
