"""``%cluster doctor | exec | run | bench`` in a real kernel, as a notebook user types them."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.kernels import Kernel
from tests.support.polling import wait_until
from tests.support.procs import ours, rank_processes, started_now, wait_gone

SCRIPT = """
import argparse, torch, torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, required=True)
args = parser.parse_args()
dist.init_process_group()
t = torch.tensor([args.scale])
dist.all_reduce(t)
print("sum", t.item())
dist.destroy_process_group()  # as torch asks: without it gloo may abort at exit (SIGABRT)
"""


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    yield k
    k.shutdown()


def test_doctor_before_any_gang_shows_the_table_and_keeps_nothing(kernel):
    reply = kernel.run("%cluster doctor --nodes 2 --gpus 2 --check-path /nonexistent/data")
    assert reply.status == "ok", reply.error_text
    assert "jupyter_mn doctor: 2×2 on local (FAILED" in reply.result
    assert "✘ paths on node 1: missing on node 1" in reply.result
    assert "<table>" in reply.data["text/html"]
    assert not rank_processes(ours())
    assert kernel.run("%cluster status").result == "no gang (DOWN)"


@pytest.mark.slow
def test_exec_keeps_the_shell_command_verbatim(kernel):
    command = 'echo "it\'s $((40 + 2))" | tr a-z A-Z'
    reply = kernel.run(f"%cluster exec --nodes 2 --gpus 2 --all-nodes -- {command}")
    assert reply.status == "ok", reply.error_text
    assert "[node 0] IT'S 42" in reply.stdout and "[node 1] IT'S 42" in reply.stdout
    failed = kernel.run("%cluster exec --node 1 -- echo out; exit 3")
    assert "[node 1] out\n[node 1] exit code 3" in failed.stdout
    slow = kernel.run("%cluster exec --node 0 --timeout 3 -- echo begun; exec sleep 60")
    assert "[node 0] begun\n[node 0] timed out: stopped" in slow.stdout  # what it wrote is kept
    redrawn = kernel.run(r"%cluster exec --node 0 -- printf 'a\n\nb\rc'")
    assert "[node 0] a\n[node 0] \n[node 0] c\n" in redrawn.stdout  # as a terminal shows it
    bad = kernel.run("%cluster exec --node 7 -- true")
    assert bad.ename == "SpecError" and "the gang has nodes 0..1" in bad.evalue
    assert kernel.run("%cluster exec --node 0").ename == "SpecError"


def test_exec_streams_lines_while_the_command_runs(kernel, tmp_path):
    """The command waits for a file that the test writes only once it has seen the command's
    first line in the cell's output: without streaming it would reach its --timeout."""
    go = tmp_path / "go"

    def answer(stdout: str) -> None:
        if "[node 1] waiting" in stdout:
            go.touch()

    reply = kernel.run(
        f"%cluster exec --nodes 2 --gpus 2 --all-nodes --timeout 30 -- echo waiting; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; echo went",
        on_stream=answer,
    )
    assert reply.status == "ok", reply.error_text
    assert "[node 1] waiting\n" in reply.stdout and "[node 1] went\n" in reply.stdout
    assert "timed out" not in reply.stdout


def test_interrupting_exec_stops_the_command_and_keeps_its_lines(kernel):
    since = started_now()

    def interrupt(stdout: str) -> None:
        if "[node 0] begun" in stdout:
            kernel.km.interrupt_kernel()

    reply = kernel.run(
        "%cluster exec --node 0 --timeout 60 -- echo begun; exec sleep 61", on_stream=interrupt
    )
    assert reply.ename == "KeyboardInterrupt" and reply.elapsed < 30
    assert "[node 0] begun" in reply.stdout
    assert not wait_gone([p for p in ours(since) if p.cmdline()[-1:] == ["61"]])


def test_bench_reports_busbw_by_the_nccl_tests_formula(kernel):
    kernel.run("%%cluster --nodes 2 --gpus 2\n0")
    reply = kernel.run("%cluster bench --size 1M --iters 3 --warmup 1")
    assert reply.status == "ok", reply.error_text
    text = reply.result
    assert "gloo on CPU" in text
    rows = re.findall(
        r"^\s*(.+?)\s+(\d+)\s+1 MiB\s+([\d.]+) ms\s+([\d.]+)\s+([\d.]+)\s+\S+$", text, re.M
    )
    scopes = [r[0] for r in rows]
    assert scopes == [
        "all ranks (inter-node)",
        "intra-node (slowest of 2 nodes)",
        "inter-node (one rank per node)",
    ]
    for _, ranks, ms, alg, bus in rows:
        n, seconds = int(ranks), float(ms) / 1e3
        assert float(alg) == pytest.approx((1 << 20) / seconds / 1e9, rel=0.01, abs=0.002)
        assert float(bus) == pytest.approx(float(alg) * 2 * (n - 1) / n, rel=0.01, abs=0.002)


def test_run_a_script_on_the_gang_then_doctor_reaches_its_master(kernel, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    reply = kernel.run(f"%cluster run --nodes 2 --gpus 2 {tmp_path / 'train.py'} --scale 2.5")
    assert reply.status == "ok", reply.error_text
    assert reply.result == "0"  # rank 0's exit status
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] sum 10.0" in reply.stdout
    failing = kernel.run(f"%cluster run {tmp_path / 'train.py'}")  # --scale missing
    assert failing.ename == "CellError" and "raised ScriptExit: exit code 2: " in failing.evalue
    assert "the following arguments are required: --scale" in failing.evalue
    doctor = kernel.run("%cluster doctor")
    assert "(ok," in doctor.result and "master" in doctor.result
    after = kernel.run("%%cluster\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
    assert after.result == "4.0"  # the TCPStore the doctor connected to still serves the gang


def test_launch_a_notebook_function_then_run_a_module_as_python_m(kernel, tmp_path):
    (tmp_path / "trainpkg").mkdir()
    (tmp_path / "trainpkg" / "__init__.py").write_text("")
    (tmp_path / "trainpkg" / "train.py").write_text(SCRIPT)
    kernel.run(
        "def world(scale, *, label):\n    import torch.distributed as dist\n"
        "    print(label, dist.get_rank())\n    return dist.get_world_size() * scale\n"
        "factor = 2.5"
    )
    launched = kernel.run("%cluster launch --nodes 2 --gpus 2 -- world(factor, label='on rank')")
    assert launched.status == "ok", launched.error_text
    assert launched.result == "10.0"  # rank 0's return value; the argument came from the notebook
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] on rank {rank}" in launched.stdout
    assert kernel.run("%cluster launch world(1, label='again')").result == "4"
    bad = kernel.run("%cluster launch world(")
    assert bad.ename == "SpecError" and "not a function call" in bad.evalue
    kernel.run(f"import os\nhere = os.getcwd()\nos.chdir({str(tmp_path)!r})")
    try:  # the local ranks start in the kernel's working directory, where the package is
        reply = kernel.run("%cluster run -m trainpkg.train --scale 2.5")
    finally:
        kernel.run("os.chdir(here)")
    assert reply.status == "ok", reply.error_text
    assert reply.result == "0"
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] sum 10.0" in reply.stdout


def test_ranks_flag_shows_only_those_ranks_and_the_logs_keep_every_line(kernel):
    reply = kernel.run("%%cluster --nodes 2 --gpus 2 --ranks 0,3\nprint('hi', dist.get_rank())")
    assert reply.status == "ok", reply.error_text
    shown = sorted(line for line in reply.stdout.splitlines() if "] hi " in line)
    assert shown == ["[node 0 rank 0] hi 0", "[node 1 rank 3] hi 3"]
    job = kernel.run(
        "from jupyter_mn.kernel import cluster\ncluster.current().gang.core.id"
    ).result.strip("'")

    def logged(rank: int) -> str:
        cli = [sys.executable, "-m", "jupyter_mn.cli", "logs", job, "--rank", str(rank)]
        return subprocess.run(cli, capture_output=True, text=True, timeout=60).stdout

    wait_until(lambda: "] hi 1" in logged(1), 10, "rank 1's line in the job's logs")


def test_a_verb_without_flags_keeps_the_running_gangs_cost_cap(kernel):
    """``--max-runtime`` given on the cell that started the gang holds for a later verb and cell
    that do not repeat it: the exec is stopped at the cap, not after its 30 s, and no timer
    thread fails."""
    try:
        up = kernel.run("%%cluster --nodes 1 --gpus 1 --max-runtime 8\n0")
        assert up.status == "ok", up.error_text
        assert "max_runtime=8.0" in kernel.run("%cluster config").result
        assert kernel.run("%%cluster\n1").result == "1"
        reply = kernel.run("%cluster exec --all-nodes -- echo begun; exec sleep 30")
        assert "[node 0] begun\n[node 0] stopped: --max-runtime 8 s reached" in reply.stdout
        assert reply.elapsed < 25
        assert "Traceback" not in reply.stderr, reply.stderr
        assert kernel.run("%cluster status").result.startswith("no gang (RELEASED")
    finally:
        kernel.run("%cluster down")
