"""The fault matrix on one 2×2 local gang: real rank processes, gloo, real dask workers.

Every fault must end the cell with the right error naming the right rank, within its bound (the
issue's number × 3, since the CI machine is shared), leave a gang whose next cell works, and leave
exactly the rank processes the gang should have. The real numbers are measured by
``bench/faults.py``. Tests run in file order: the last one breaks the gang on purpose.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections.abc import Iterator

import psutil
import pytest
import torch

from jupyter_mn import Cluster
from jupyter_mn.errors import CellError, CellInterrupted, ClusterBusy, NodeLost, RankLost
from jupyter_mn.gang.run import KILL_AFTER_S
from jupyter_mn.views import TextView
from jupyter_mn.wire.events import LogLines, Note
from tests.support.polling import wait_until
from tests.support.procs import (
    TOKEN,
    node_of,
    ours,
    processes,
    rank_processes,
    started_now,
    wait_gone,
)

RAISE_S, LOST_S = 1.0 * 3, 2.0 * 3
#: what a healthy 2×2 gang computes; every test checks the cell after its fault with it
ALL_REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()"


@pytest.fixture(scope="module")
def gang() -> Iterator[Cluster]:
    started = started_now()
    cluster = Cluster(nodes=2, gpus=2, memory_limit="900MB")
    cluster.up()
    yield cluster
    cluster.close()
    left = wait_gone(ours(started))
    assert not left, "gang processes survived close():\n" + "\n".join(left)


def rank_pids() -> dict[int, int]:
    """Live rank processes of this test session, by global rank."""
    pids = {}
    for proc in rank_processes(ours()):
        try:
            pids[int(proc.environ()["RANK"])] = proc.pid
        except (psutil.Error, KeyError):
            continue
    return pids


def ready(gang: Cluster) -> dict[int, int]:
    """Run a healthy cell (waits for any re-forming) that marks every rank; return the pids."""
    assert gang.run("marker = dist.get_rank()\n" + ALL_REDUCE).value == 4.0
    pids = rank_pids()
    assert sorted(pids) == [0, 1, 2, 3], pids
    return pids


def timed(gang: Cluster, code: str, **options: object) -> tuple[object, float]:
    started = time.perf_counter()
    result = gang.run(code, **options)
    return result, time.perf_counter() - started


def error_of(result: object) -> CellError:
    with pytest.raises(CellError) as info:
        result.unwrap()
    return info.value


def check_next_cell(gang: Cluster, kept: set[int]) -> None:
    """The next cell works; ranks in ``kept`` still have their namespace, the others do not."""
    after = gang.run(ALL_REDUCE + "\n(t.item(), 'marker' in globals())", return_all=True)
    assert after.ok, after.unwrap()
    assert after.values == [(4.0, rank in kept) for rank in range(4)]


RAISES = {
    "before": "if dist.get_rank() == R:\n    raise ValueError('boom')\nt = torch.ones(1)\n"
    "dist.all_reduce(t)",
    "inside": "t = torch.ones(1)\nx = 'not a tensor' if dist.get_rank() == R else t\n"
    "dist.all_reduce(x)",
    "after": "t = torch.ones(1)\ndist.all_reduce(t)\nif dist.get_rank() == R:\n"
    "    raise ValueError('boom')",
}


@pytest.mark.parametrize("rank", [0, 3])
@pytest.mark.parametrize("where", list(RAISES))
def test_rank_raises(gang, where, rank):
    pids = ready(gang)
    result, took = timed(gang, RAISES[where].replace("R", str(rank)))
    error = error_of(result)
    assert type(error) is CellError
    cause = result.root_cause
    assert (cause.rank, cause.node) == (rank, rank // 2)
    line = {"before": 2, "inside": 3, "after": 4}[where]
    assert any(f"line {line}" in text for text in cause.error.traceback), cause.error.traceback
    rendered = "\n".join(error._render_traceback_())
    assert f"rank {rank} (node {rank // 2}) raised" in rendered
    others = [r for r in result.ranks if r.status != "ok" and r.rank != rank]
    if others:  # peers' secondary errors: one summary line, not their tracebacks
        assert rendered.count("Connection closed") == 0
        ranks = "rank" if len(others) == 1 else "ranks"
        assert f"{len(others)} other {ranks} stopped as a consequence" in rendered
    assert took < RAISE_S, f"{where} on rank {rank} took {took:.2f} s"
    check_next_cell(gang, kept={0, 1, 2, 3})
    assert rank_pids() == pids  # re-formed in place: the same processes


DEATHS = {
    "sigkill": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    "exit": ("import os\nos._exit(7)", "exit code 7"),
    "segfault": ("import ctypes\nctypes.string_at(0)", "killed by SIGSEGV"),
    "oom": (  # over the gang's --memory-limit 900MB: its agent kills it, as the OOM killer would
        "big = torch.ones(900_000_000, dtype=torch.uint8)\nimport time\ntime.sleep(30)",
        "killed by SIGKILL (out of memory: ",
    ),
}


@pytest.mark.parametrize(
    ("how", "rank"),
    [("sigkill", 3), ("exit", 3), ("segfault", 1), ("oom", 2), ("sigkill", 0)],
)
def test_rank_dies(gang, how, rank):
    pids = ready(gang)
    death, expected = DEATHS[how]
    body = "\n".join(f"    {line}" for line in death.splitlines())
    code = (
        f"print('last words of', dist.get_rank())\nif dist.get_rank() == {rank}:\n{body}\n"
        + ALL_REDUCE
    )
    result, took = timed(gang, code)
    error = error_of(result)
    assert isinstance(error, RankLost) and not isinstance(error, NodeLost)
    assert str(error).startswith(f"rank {rank} (node {rank // 2}) was lost: {expected}")
    assert f"last words of {rank}" in error.traceback  # the rank's last log lines
    if how == "segfault":  # faulthandler's report, cut to the cell's line
        assert error.traceback[-2:] == [
            "Fatal Python error: Segmentation fault",
            f"  at Cell In[{gang.cells}], line 4",
        ]
    node = rank // 2
    assert any(f"ranks of node {node}" in n and "state is lost" in n for n in error.notes)
    assert took < LOST_S + (1 if how == "oom" else 0), f"{how} took {took:.2f} s"
    restarted = {node * 2, node * 2 + 1}
    check_next_cell(gang, kept={0, 1, 2, 3} - restarted)
    now = rank_pids()
    assert all(now[r] != pids[r] for r in restarted) and all(
        now[r] == pids[r] for r in set(pids) - restarted
    )
    assert not psutil.pid_exists(pids[rank]) or psutil.Process(pids[rank]).status() == "zombie"


def test_rank_dying_between_cells_is_replaced_before_the_next(gang):
    pids = ready(gang)
    os.kill(pids[2], signal.SIGKILL)
    deadline = time.monotonic() + LOST_S
    while gang.status()["state"] == "READY":  # until its agent's report arrived
        assert time.monotonic() < deadline
        time.sleep(0.01)
    result = gang.run(ALL_REDUCE)
    assert result.value == 4.0
    assert any("rank 2 (node 1) died between cells: killed by SIGKILL" in n for n in result.notes)
    assert rank_pids()[2] != pids[2]


def test_timeout_shows_every_stack_then_interrupts_in_place(gang):
    pids = ready(gang)
    code = "import time\nt = torch.ones(1)\nif dist.get_rank() == 3:\n    time.sleep(60)\n"
    code += "dist.all_reduce(t)"
    out, err = io.StringIO(), io.StringIO()
    result, took = timed(gang, code, timeout=1, on_event=TextView(out, err))
    error = error_of(result)
    assert isinstance(error, CellInterrupted)
    assert str(error).startswith(
        "--timeout 1 s reached: rank 3 (node 1) never entered all_reduce #"
    )
    stacks = err.getvalue()
    cell = f"Cell In[{gang.cells}]"
    assert f"[node 1 rank 3] running\n    {cell}, line 4\n        time.sleep(60)" in stacks
    assert "never entered" not in stacks  # the verdict is said once: in the error
    for rank in range(3):
        heading = f"[node {rank // 2} rank {rank}] running, inside all_reduce #"
        assert re.search(
            rf"{re.escape(heading)}\d+ \(pg \d+\)\n    {re.escape(cell)}, line 5", stacks
        )
    assert f"rank 0 (node 0) was at {cell}, line 5: dist.all_reduce(t)" in error.notes
    # the rank busy in its own code is the cause, not the first of those waiting on it to stop
    assert result.root_cause.rank == 3
    assert [r.error.secondary for r in result.ranks] == [True, True, True, False]
    assert took < 30, took  # the timeout stopped it, not the end of its 60 s sleep
    check_next_cell(gang, kept={0, 1, 2, 3})
    assert rank_pids() == pids


def test_a_blocked_receive_ends_at_the_interrupt_in_place(gang):
    """Every rank waits in ``recv``, none sends: SIGINT does not reach a thread blocked in
    gloo, but the interrupt closes each rank's connections, so none has to be killed."""
    pids = ready(gang)
    code = "t = torch.ones(1)\ndist.recv(t, src=(dist.get_rank() + 1) % 4)"  # all wait, none sends
    result, _ = timed(gang, code, timeout=1)
    assert isinstance(error_of(result), CellInterrupted)
    assert all(r.status != "lost" for r in result.ranks), result.ranks  # none was killed
    check_next_cell(gang, kept={0, 1, 2, 3})
    assert rank_pids() == pids


def test_a_hang_that_ignores_interrupts_is_killed_and_restarted(gang):
    pids = ready(gang)
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
    result, took = timed(gang, code, timeout=1)
    error = error_of(result)
    assert isinstance(error, CellInterrupted)
    assert f"did not stop within {KILL_AFTER_S:g} s of the interrupt" in str(error)
    assert 1 + KILL_AFTER_S <= took < (1 + KILL_AFTER_S) * 3, took
    check_next_cell(gang, kept=set())
    assert not set(rank_pids().values()) & set(pids.values())


def test_retries_run_the_cell_again_on_the_recovered_gang(gang, tmp_path):
    ready(gang)
    once = tmp_path / "killed"
    code = (
        f"import os\nif dist.get_rank() == 1 and not os.path.exists({str(once)!r}):\n"
        f"    open({str(once)!r}, 'w').close()\n    os._exit(3)\n" + ALL_REDUCE
    )
    events: list[object] = []
    result = gang.run(code, retries=1, on_event=events.append)
    assert result.value == 4.0
    assert [e.text for e in events if isinstance(e, Note)] == [
        "retry 1/1: rank 1 (node 0) was lost; running the cell again"
    ]


TRAIN = """
import time
from torch.nn.parallel import DistributedDataParallel as DDP
from jupyter_mn import checkpoint

model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
checkpoint.prime_ddp(model, torch.zeros(1, 16))
start = 0
last = checkpoint.latest(CKPT)
if last is not None:
    start = checkpoint.load(last, {"model": model, "opt": opt})["step"]
    print(f"resumed from step {start}")
for step in range(start, 200):
    x = torch.randn(32, 16)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if (step + 1) % 20 == 0:
        checkpoint.save({"model": model, "opt": opt}, CKPT, step + 1)
    if (step + 1) % 10 == 0 and dist.get_rank() == 0:
        print(f"step {step + 1} loss {loss.item():.4f}")
    time.sleep(0.02)
torch.cat([p.detach().flatten() for p in model.parameters()])
"""


@pytest.mark.slow
def test_training_killed_midway_resumes_from_its_checkpoint_bit_for_bit(gang, tmp_path):
    """The acceptance check for multi-node training: kill rank 3 at step ~100 of 200; with
    --retries 1 the cell finishes from the last COMPLETE checkpoint, and matches an
    uninterrupted run with the same seed exactly."""
    ready(gang)
    reference = gang.run(TRAIN, namespace={"CKPT": str(tmp_path / "a")}, seed=7)
    assert reference.ok, reference.unwrap()

    lines: list[str] = []
    killed: list[int] = []

    def kill_rank_3_at_step_100(event: object) -> None:
        if not isinstance(event, LogLines):
            return
        for _, _, texts in event.items:
            lines.extend(texts)
            if not killed and any(t.startswith("step 100 ") for t in texts):
                killed.append(rank_pids()[3])
                os.kill(killed[0], signal.SIGKILL)

    resumed = gang.run(
        TRAIN,
        namespace={"CKPT": str(tmp_path / "b")},
        seed=7,
        retries=1,
        on_event=kill_rank_3_at_step_100,
    )
    assert killed and resumed.ok, resumed.unwrap()
    starts = {int(t.split()[-1]) for t in lines if t.startswith("resumed from step")}
    assert len(starts) == 1 and starts.pop() in (100, 120), lines  # not from step 0
    assert torch.equal(resumed.value, reference.value)


def test_background_cell_stacks_and_cancel(gang):
    pids = ready(gang)
    handle = gang.submit(
        "import time\nfor i in range(600):\n    print('tick', i)\n    t = torch.ones(1)\n"
        "    dist.all_reduce(t)\n    time.sleep(0.05)"
    )
    deadline = time.monotonic() + 30
    while "tick 3" not in handle.output:  # polling its output, with a deadline
        assert time.monotonic() < deadline and not handle.done(), handle.output
        time.sleep(0.05)
    assert "running" in repr(handle)
    stacks = handle.stacks()
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] running\n    Cell In[{handle.cell_id}]" in stacks
    with pytest.raises(ClusterBusy, match=f"background cell In\\[{handle.cell_id}\\] is still"):
        gang.run("1")
    with pytest.raises(ClusterBusy), gang.nodes():  # %cluster exec, doctor, run: the same
        pass
    started = time.perf_counter()
    handle.cancel()
    assert handle.wait(timeout=KILL_AFTER_S * 3)
    assert time.perf_counter() - started < 3
    with pytest.raises(CellInterrupted, match=f"background cell In\\[{handle.cell_id}\\] was"):
        handle.result()
    check_next_cell(gang, kept={0, 1, 2, 3})
    assert rank_pids() == pids


def test_lost_node_agent_breaks_the_gang_and_the_next_cell_brings_a_fresh_one(gang):
    pids = ready(gang)
    old_id = gang.gang.core.id
    worker = node_of(psutil.Process(pids[3]))
    assert worker.environ()["JUPYTER_MN_TEST_TOKEN"] == TOKEN
    code = "import time\nif dist.get_rank() == 3:\n    time.sleep(60)\n" + ALL_REDUCE
    handle = gang.submit(code)
    deadline = time.monotonic() + 30
    while not any(
        r.rank == 3 and "time.sleep(60)" in "".join(r.stack) for r in gang.stacks().ranks
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker.kill()
    killed_at = time.perf_counter()
    result = handle.cell_result(timeout=30)
    assert time.perf_counter() - killed_at < LOST_S
    error = error_of(result)
    assert isinstance(error, NodeLost)
    assert str(error).startswith("node 1 was lost: its agent (a dask worker) stopped answering")
    assert gang.status()["state"] in ("BROKEN", "CLOSED")
    assert not wait_gone(processes(pids[2], pids[3]))  # its ranks went with it
    assert gang.run(ALL_REDUCE).value == 4.0
    assert gang.gang.core.id != old_id and not set(rank_pids().values()) & set(pids.values())


def test_a_frozen_node_is_named_within_the_liveness_window(no_leftovers):
    """Its agent SIGSTOPped: processes alive, sockets open, nothing answers (a frozen host)."""
    code = "print('looping', flush=True)\nwhile True:\n    " + ALL_REDUCE.replace("\n", "\n    ")
    frozen: list[tuple[psutil.Process, float]] = []

    def freeze(event: object) -> None:
        if not frozen and isinstance(event, LogLines) and event.node == 1:
            worker = node_of(psutil.Process(rank_pids()[1]))
            worker.suspend()
            frozen.append((worker, time.monotonic()))

    with Cluster(nodes=2, gpus=1, liveness_timeout=5) as cluster:
        try:
            result = cluster.run(code, on_event=freeze)
            took = time.monotonic() - frozen[0][1]
        finally:
            for worker, _ in frozen:
                worker.resume()
        cause = result.root_cause
        assert (cause.node, cause.error.ename) == (1, "NodeLost")
        assert "node 1 (127.0.0.1) unreachable for 5 s" in cause.error.evalue
        assert 4 < took < 5 * 3, took
        assert result.ranks[0].status in ("interrupted", "lost")  # a consequence: stopped
        assert cluster.run(ALL_REDUCE).value == 2.0  # a fresh gang


def test_max_runtime_tears_the_gang_down_with_a_message(no_leftovers):
    cluster = Cluster(nodes=1, gpus=1, max_runtime=6)
    try:
        assert cluster.run("1").value == 1
        result = cluster.run("import time\ntime.sleep(60)")
        error = error_of(result)
        assert isinstance(error, CellInterrupted)
        assert str(error).startswith("--max-runtime 6 s reached")
        assert "the gang was torn down: --max-runtime 6 s reached" in error.notes
        status = cluster.status()
        assert (status["state"], status["detail"]) == (
            "RELEASED",
            "torn down: --max-runtime 6 s reached",
        )
    finally:
        cluster.close()


def test_a_kernel_whose_main_thread_holds_the_gil_keeps_its_gang(no_leftovers):
    """One long call that never lets go of the GIL (IPython drawing a huge value's repr)
    silences the kernel's heartbeat past ``heartbeat_timeout``; its process still runs (the
    agents share its host and see it), so they know it busy, not gone: the gang and its
    namespaces stay."""
    import ctypes

    with Cluster(nodes=1, gpus=1, heartbeat_timeout=3) as cluster:
        assert cluster.run("x = 41").ok
        gang = cluster.gang
        ctypes.PyDLL(None).sleep(6)  # libc's sleep with the GIL held throughout
        after = cluster.run("x + 1")
        assert after.value == 42, after.notes
        assert cluster.gang is gang


class CapFallsDueWhileSent:
    """A notebook name the cell reads: sending it lowers the cap to now and waits until it has
    fired, so the cap falls due after the cell took the cluster and before its run began."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def __reduce__(self) -> tuple[type, tuple[int]]:
        self.cluster.adopt(self.cluster.spec.replace(max_runtime=0.001))
        wait_until(lambda: self.cluster._warm.lifetime.expired, what="the cap to fire")
        return int, (1,)


def test_max_runtime_due_before_the_cell_runs_stops_that_cell(no_leftovers):
    cluster = Cluster(nodes=1, gpus=1, max_runtime=3600)
    try:
        cluster.up()
        result = cluster.run(  # run to its end, it would return 1
            "import time\ntime.sleep(60)\nlate",
            namespace={"late": CapFallsDueWhileSent(cluster)},
            push=["late"],  # sent though it holds the cluster
        )
        error = error_of(result)
        assert isinstance(error, CellInterrupted)
        assert str(error).startswith("--max-runtime 0.001 s reached")
        assert cluster.status()["detail"] == "torn down: --max-runtime 0.001 s reached"
    finally:
        cluster.close()
