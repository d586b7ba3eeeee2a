"""``jupyter mn list|logs|cancel|release|gc`` against the registry a real kernel writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator

import psutil
import pytest

from jupyter_mn.jobs.registry import JobModel, Registry
from tests.support.kernels import Kernel, Reply
from tests.support.polling import wait_until
from tests.support.procs import ours, rank_processes, running
from tests.support.runs import JUPYTER_MN, mn


def job_named(name: str) -> JobModel:
    return Registry().resolve(name)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    reply = k.run(
        "%%cluster --nodes 2 --gpus 1 --name cli\nimport sys\n"
        "print('hello from', dist.get_rank())\n"
        "print('<b>tag</b>', file=sys.stderr) if dist.get_rank() == 1 else None"
    )
    assert reply.status == "ok", reply.error_text
    yield k
    k.shutdown()


def test_list_shows_the_kernels_job(kernel):
    wait_until(lambda: (j := job_named("cli")).cells == 1 and j.state == "READY", 10, "the cell")
    out = mn("list").stdout.splitlines()
    assert out[0].split()[:7] == ["JOB", "STATE", "SHAPE", "BACKEND", "AGE", "DURATION", "CELLS"]
    row = next(line.split() for line in out if line.startswith("cli-"))
    assert row[1:4] == ["READY", "2×1", "local"] and row[6] == "1"
    (model,) = [j for j in json.loads(mn("list", "--json").stdout) if j["name"] == "cli"]
    assert model["pid"] == kernel.pid and model["nodes"][1]["transport"] == "gloo (CPU)"


def test_logs_by_node_and_rank_with_labels(kernel):
    mark, *lines = mn("logs", "cli").stdout.splitlines()
    assert re.fullmatch(r"──── In\[\d+\] started \d\d:\d\d:\d\d ────", mark)  # once, both nodes
    assert sorted(lines) == [
        "[node 0 rank 0] hello from 0",
        "[node 1 rank 1] <b>tag</b>",
        "[node 1 rank 1] hello from 1",
    ]
    assert len(mn("logs", "cli", "--node", "1", "--tail", "1").stdout.splitlines()) == 1
    node1 = [line for line in lines if line.startswith("[node 1 ")]
    assert mn("logs", "cli", "--node", "1").stdout.splitlines() == [mark, *node1]
    assert len(node1) == 2
    assert mn("logs", "cli", "--rank", "0").stdout == f"{mark}\n[node 0 rank 0] hello from 0\n"


def test_logs_escape_what_a_terminal_would_obey(kernel):
    """A rank's title, clear-screen and bidi sequences reach the terminal as visible text."""
    wrote = "'\\x1b]0;owned\\x07\\x1b[2Jdone\\u202e'"
    reply = kernel.run(f"%%cluster --ranks 0\nprint({wrote} if dist.get_rank() == 0 else '')")
    assert reply.status == "ok", reply.error_text
    shown = "[node 0 rank 0] \\x1b]0;owned\\x07\\x1b[2Jdone\\u202e\n"
    wait_until(lambda: mn("logs", "cli", "--rank", "0", "--tail", "1").stdout == shown, 10, "")
    raw = mn("logs", "cli", "--rank", "0", "--tail", "1", "--raw").stdout
    assert raw == "[node 0 rank 0] \x1b]0;owned\x07\x1b[2Jdone\u202e\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["logs", "cli", "--node", "2"], "jupyter mn logs: --node 2: job cli-"),
        (["logs", "nope"], "jupyter mn logs: no job 'nope' (jupyter mn list shows the jobs)"),
        (["cancel", "nope"], "jupyter mn cancel: no job 'nope'"),
    ],
)
def test_bad_references_get_a_short_error_and_status_2(kernel, args, message):
    proc = mn(*args, ok=False)
    assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_cancel_interrupts_the_running_cell_and_the_kernel_goes_on(kernel):
    replies: list[Reply] = []
    cell = threading.Thread(
        target=lambda: replies.append(kernel.run("%%cluster\nimport time\ntime.sleep(120)"))
    )
    cell.start()
    wait_until(lambda: job_named("cli").state == "RUNNING", 20, "RUNNING")
    out = mn("cancel", "cli").stdout
    assert out.startswith("cli-") and out.endswith(": cancelling the running cell\n")
    cell.join(30)
    (reply,) = replies
    assert reply.ename == "CellInterrupted"
    assert "CellInterrupted: cancelled from jupyter mn: rank " in reply.error_text
    assert kernel.run("%%cluster\ndist.get_world_size()").result == "2"
    assert mn("cancel", "cli").stdout.endswith(": no cell was running\n")


def test_release_frees_the_gang_and_ends_a_follower(kernel):
    job = job_named("cli")
    follower = subprocess.Popen(
        [*JUPYTER_MN, "logs", "-f", "--tail", "1", job.id], stdout=subprocess.PIPE, text=True
    )
    try:
        assert follower.stdout.readline().strip()  # its last line: it is following now
        kernel.run("%%cluster\nprint('late line', dist.get_rank())")
        assert mn("release", job.id).stdout == f"{job.id}: released\n"
        out, _ = follower.communicate(timeout=20)  # -f ends by itself with the job
    finally:
        follower.kill()
    mark, *late = out.splitlines()  # the mark once, though each node's file has it
    assert re.fullmatch(r"──── In\[\d+\] started \d\d:\d\d:\d\d ────", mark)
    assert sorted(late) == ["[node 0 rank 0] late line 0", "[node 1 rank 1] late line 1"]
    pids = [p for node in job.nodes for p in node.pids]
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10)
    assert pids and not alive
    assert Registry().job(job.id).state == "CLOSED"
    proc = mn("release", job.id, ok=False)
    assert proc.returncode == 2 and "is CLOSED: nothing to release" in proc.stderr
    assert "released from jupyter mn" in kernel.run("%cluster status").result


@pytest.mark.slow
def test_gc_kills_a_hung_rank_a_killed_kernel_left(no_leftovers):
    k = Kernel()
    stuck = template = None
    try:
        assert k.run("%%cluster --nodes 2 --gpus 1 --name gc\n1").status == "ok"
        stuck, *others = rank_processes(ours(no_leftovers))
        template = stuck.parent()  # the gang's rank template: it would kill the rank
        for frozen in (stuck, template):  # a rank that cannot notice its node is gone
            os.kill(frozen.pid, signal.SIGSTOP)
        os.kill(k.pid, signal.SIGKILL)
        k.km.provisioner.process.wait(10)
        assert wait_until(lambda: job_named("gc").state == "ORPHANED", 10, "ORPHANED")
        # gone, or a zombie: its template, stopped, cannot reap it
        wait_until(lambda: not running(others), 20, "the other ranks ended with their nodes")
        assert stuck.is_running()
        dry = mn("gc", "--dry-run").stdout
        assert f"would kill 1 leftover rank process(es): {stuck.pid}" in dry
        assert stuck.is_running()
        cleaned = mn("gc").stdout
        assert f"killed 1 leftover rank process(es): {stuck.pid}" in cleaned
        assert f"killed its rank template(s): {template.pid}" in cleaned
        gang = job_named("gc").id  # the session's registry may hold others' orphans
        assert not [line for line in mn("gc").stdout.splitlines() if line.startswith(gang)]
        assert "forgot the job" in mn("gc", "--older-than", "0").stdout
        with pytest.raises(LookupError):
            job_named("gc")
    finally:
        k.kc.stop_channels()
        for frozen in (stuck, template):
            if frozen is not None and frozen.is_running():
                frozen.kill()
