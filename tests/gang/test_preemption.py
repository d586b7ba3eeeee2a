"""Preemption on a real 2×2 local gang: a SIGTERM to node 1's worker process is a notice that
every rank agrees on at the same step (``checkpoint.preempted()``), the grace period is
honoured, the cell ends with ``Preempted``, and ``--retries`` resumes it from the checkpoint."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from jupyter_mn import Cluster
from jupyter_mn.checkpoint import latest
from jupyter_mn.errors import Preempted
from jupyter_mn.gang.script import run_script
from jupyter_mn.rank.env import JOB
from jupyter_mn.wire.events import PreemptCause
from tests.support.polling import wait_until
from tests.support.preempting import PreemptAt
from tests.support.procs import node_of, ours

#: A loop that saves and stops when the gang agrees it is preempted; deterministic, so a run
#: resumed from the preemption checkpoint ends with an uninterrupted run's parameters.
TRAIN = """
import time
from jupyter_mn import checkpoint, cluster_info

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start, seen = 0, None
last = checkpoint.latest(CKPT)
if last is not None:
    start = checkpoint.load(last, {"model": model, "opt": opt})["step"]
    print(f"resumed from step {start}")
for step in range(start, STEPS):
    x = torch.full((2, 4), float(step % 7))
    loss = (model(x) - 1.0).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print(f"step {step}")
    if checkpoint.preempted():
        checkpoint.save({"model": model, "opt": opt}, CKPT, step + 1)
        notice = cluster_info().preemption
        seen = (step, notice.node, notice.cause.value)
        break
    time.sleep(0.02)
seen if seen else [p.detach().clone() for p in model.parameters()]
"""


def worker_of(rank: int, procs: list[psutil.Process]) -> psutil.Process:
    """The node process (its dask worker) that runs ``rank`` (a cell's or a script's), among
    the processes of one gang (a gang given up may still be ending beside a new one)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("RANK") == str(rank) and (
                "dask_spec" in " ".join(node_of(proc).cmdline())
            ):
                return node_of(proc)
    raise AssertionError(f"rank {rank} is not running")


def gang_of(cluster: Cluster) -> list[psutil.Process]:
    """The processes of ``cluster``'s current gang, by the job its ranks carry."""
    found = []
    for proc in ours():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(JOB) == cluster.gang.core.id:
                found.append(proc)
    return found


class SigtermAt(PreemptAt):
    """Sends SIGTERM to node 1's process once rank 0 printed ``line``."""

    def __init__(self, line: str, cluster: Cluster) -> None:
        super().__init__(line)
        self.cluster = cluster

    def preempt(self) -> None:
        os.kill(worker_of(2, gang_of(self.cluster)).pid, signal.SIGTERM)  # node 1


def test_every_rank_sees_the_notice_at_the_same_step_and_the_cell_ends_preempted(
    tmp_path, no_leftovers
):
    ckpt = tmp_path / "ckpt"
    with Cluster(nodes=2, gpus=2) as cluster:
        sigterm = SigtermAt("step 5", cluster)
        result = cluster.run(
            TRAIN,
            namespace={"CKPT": str(ckpt), "STEPS": 100_000},
            return_all=True,
            on_event=sigterm,
        )
        assert sigterm.sent_at and [n.node for n in sigterm.notices] == [1]
        assert 115 < sigterm.left[0] <= 120  # the default grace, nowhere near spent
        assert all(r.status == "ok" for r in result.ranks), result.error()  # each saved, returned
        steps = {v[0] for v in result.values}
        assert len(steps) == 1 and steps.pop() >= 5, result.values  # one step, on every rank
        assert {v[1:] for v in result.values} == {(1, PreemptCause.SIGNAL.value)}
        with pytest.raises(Preempted) as info:
            result.unwrap()
        error = info.value
        assert (error.node, error.cause) == (1, "signal")
        assert error.checkpoint == str(latest(ckpt)) and (latest(ckpt) / "COMPLETE").exists()
        assert str(error).startswith(
            f"node 1 was preempted: its process got SIGTERM; checkpoint {latest(ckpt)} "
            "is COMPLETE, written "
        )
        assert cluster.status()["state"] in ("BROKEN", "CLOSED")


@pytest.mark.slow
def test_with_retries_the_cell_resumes_from_the_preemption_checkpoint(tmp_path, no_leftovers):
    """Ends with an uninterrupted run's parameters; then an idle gang's notice gives it up."""
    steps = {"STEPS": 120}
    with Cluster(nodes=2, gpus=2, retries=1) as cluster:
        sigterm = SigtermAt("step 30", cluster)
        resumed = cluster.run(
            TRAIN, namespace={"CKPT": str(tmp_path / "a"), **steps}, on_event=sigterm
        )
        assert resumed.ok, resumed.unwrap()
        assert sigterm.notes == ["retry 1/1: node 1 was preempted; running the cell again"]
        starts = {int(t.split()[-1]) for t in sigterm.lines if t.startswith("resumed from step")}
        assert len(starts) == 1 and 30 < min(starts) < 120, sigterm.lines  # not from step 0
        reference = cluster.run(TRAIN, namespace={"CKPT": str(tmp_path / "b"), **steps})
        assert all(torch.equal(a, b) for a, b in zip(resumed.value, reference.value, strict=True))

        idle = cluster.gang
        os.kill(worker_of(2, gang_of(cluster)).pid, signal.SIGTERM)
        wait_until(lambda: not idle.core.status.usable, 30, "the idle gang to be given up")
        assert cluster.run("1 + 1").unwrap() == 2 and cluster.gang is not idle


IGNORES_NOTICES = """
import time
print("looping")
while True:
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.05)
"""


def test_a_loop_that_never_asks_is_stopped_at_the_deadline_not_before(no_leftovers):
    grace = 4.0
    with Cluster(nodes=2, gpus=2, grace=grace) as cluster:
        sigterm = SigtermAt("looping", cluster)
        result = cluster.run(IGNORES_NOTICES, on_event=sigterm)
        took = time.monotonic() - sigterm.sent_at
        assert grace <= took < grace + 15, took
        with pytest.raises(Preempted, match="no checkpoint was completed after the notice"):
            result.unwrap()


#: A torchrun-style script that handles SIGTERM itself, as Lightning does: a flag agreed across
#: ranks each step (node 1's ranks get the SIGTERM, node 0's learn it from them), a clean exit.
SCRIPT = """
import signal, time
import torch, torch.distributed as dist
heard = torch.zeros(1)
signal.signal(signal.SIGTERM, lambda *_: heard.fill_(1))
dist.init_process_group()
print("looping", flush=True)
for step in range(100_000):
    flag = heard.clone()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        print(f"rank {dist.get_rank()} stops at step {step}", flush=True)
        break
    time.sleep(0.02)
dist.destroy_process_group()
"""


def test_a_scripts_ranks_on_the_preempted_node_get_its_sigterm(tmp_path, no_leftovers):
    script = tmp_path / "handles_sigterm.py"
    script.write_text(SCRIPT)
    with Cluster(nodes=2, gpus=2) as cluster:
        sigterm = SigtermAt("looping", cluster)
        cluster.up()  # the warm gang's agents run it
        with cluster.nodes() as gang:
            result = run_script(gang, str(script), (), sigterm)
        assert not gang.core.status.usable  # its node is going: the next cell starts a fresh gang
    assert result.ok, (sigterm.lines, result.error())
    stops = {line.split()[-1] for line in sigterm.lines if " stops at step " in line}
    assert len(stops) == 1 and len([t for t in sigterm.lines if " stops at " in t]) == 4


#: A rank's shield, then a child it forks (as a DataLoader's worker) and ends with terminate().
FORKED_CHILD = """
import multiprocessing, os, signal
from jupyter_mn.rank import preemption

preemption.shield()
ctx = multiprocessing.get_context("fork")
ready = ctx.Event()

def work():
    ready.set()
    while True:
        signal.pause()

child = ctx.Process(target=work)
child.start()
assert ready.wait(30)
child.terminate()
child.join(15)
code = child.exitcode
if code is None:
    child.kill()
    child.join()
os.kill(os.getpid(), signal.SIGTERM)  # the rank itself keeps its shield
print(code)
"""


def test_a_child_the_rank_forks_ends_on_sigterm_while_the_rank_keeps_its_shield():
    done = subprocess.run(
        [sys.executable, "-c", FORKED_CHILD], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(-signal.SIGTERM)
