"""``%cluster run SCRIPT``: unchanged torchrun-style scripts on a warm 2×2 gang (real processes)."""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import CellError, RankLost, SpecError
from jupyter_mn.gang import script as script_module
from jupyter_mn.gang.script import run_script
from jupyter_mn.views import TextView
from tests.support.procs import ours, started_now, wait_gone

TRAIN = """
import argparse, os
import torch, torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1)
parser.add_argument("--fail-rank", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group()  # env://, as under torchrun
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.zeros(1)
for step in range(args.steps):
    if rank == args.fail_rank and step == 1:
        raise ValueError(f"bad batch on rank {rank}")
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    total += t
print(f"rank {rank}/{world} node {os.environ['NODE_RANK']} local {os.environ['LOCAL_RANK']} "
      f"total {total.item():g} run {os.environ['TORCHELASTIC_RUN_ID']}")
dist.destroy_process_group()
"""

RECORDED = """
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group()
    if dist.get_rank() == 3:
        raise KeyError("missing shard")
    dist.barrier()

main()
"""

# what the C++ runtime writes when gloo throws in a destructor at exit, after Python's traceback
TERMINATE = (
    "terminate called after throwing an instance of 'gloo::IoException'\n"
    "  what():  [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500\n"
)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("scripts")
    (folder / "train.py").write_text(TRAIN)
    (folder / "recorded.py").write_text(RECORDED)
    (folder / "killed.py").write_text(
        "import os, signal, traceback, torch.distributed as dist\ndist.init_process_group()\n"
        "if dist.get_rank() == 1:\n    try:\n        {}['handled']\n    except KeyError:\n"
        "        traceback.print_exc()  # a logged, handled error is not why it died\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()\n"
    )
    (folder / "aborts.py").write_text(  # what gloo does at exit after an uncaught exception
        f"import os, sys, traceback\nTERMINATE = {TERMINATE!r}\n"
        "if os.environ['RANK'] == '2':\n    try:\n"
        "        raise ValueError('bad batch')\n    except ValueError:\n"
        "        traceback.print_exc()\n        sys.stderr.write(TERMINATE)\n"
        "        sys.stderr.flush()\n        os.abort()\n"
    )
    (folder / "sleepy.py").write_text("import time\ntime.sleep(600)\n")
    (folder / "stops.py").write_text(  # twice at one place: said once
        "import os\nfor _ in range(2):\n    breakpoint()\nprint('went on', os.environ['RANK'])\n"
    )
    return folder


def run(
    gang_2x2: Cluster,
    script: Path | str,
    *args: str,
    timeout: float | None = None,
    module: bool = False,
):
    out, err = io.StringIO(), io.StringIO()
    with gang_2x2.nodes() as gang:
        result = run_script(gang, str(script), args, TextView(out, err), timeout, module=module)
    return result, out.getvalue(), err.getvalue()


def test_an_unchanged_script_runs_on_every_rank_next_to_the_warm_gang(gang_2x2, scripts):
    before = gang_2x2.run("import os\nint(os.environ['MASTER_PORT'])").value
    result, out, _ = run(gang_2x2, scripts / "train.py", "--steps", "3")
    assert result.ok and result.value == 0  # rank 0's exit status
    for rank in range(4):
        line = f"[node {rank // 2} rank {rank}] rank {rank}/4 node {rank // 2} local {rank % 2} "
        assert line + "total 30 run " in out
    assert gang_2x2.run("import os\nint(os.environ['MASTER_PORT'])").value == before
    assert gang_2x2.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()").value == 4.0


def test_a_breakpoint_in_a_script_is_skipped_and_said_once_per_rank(gang_2x2, scripts):
    result, out, err = run(gang_2x2, scripts / "stops.py")
    assert result.ok, err
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] went on {rank}" in out
        skipped = f"rank {rank} skipped breakpoint() at {scripts / 'stops.py'}, line 3: "
        assert err.count(skipped) == 1, err


def test_a_failing_rank_stops_the_others_and_is_reported_like_a_cell(gang_2x2, scripts):
    started = time.monotonic()
    result, _, err = run(gang_2x2, scripts / "train.py", "--steps", "3", "--fail-rank", "2")
    assert time.monotonic() - started < 30  # the others were stopped, not left in all_reduce
    cause = result.root_cause
    assert (cause.rank, cause.node, cause.status) == (2, 1, "error")
    assert cause.error.ename == "ValueError" and "bad batch on rank 2" in cause.error.evalue
    line = next(n for n, text in enumerate(TRAIN.splitlines(), 1) if "raise ValueError" in text)
    assert any(f'train.py", line {line}' in text for text in cause.error.traceback)
    with pytest.raises(CellError, match=r"rank 2 \(node 1\) raised ValueError: bad batch"):
        result.unwrap()
    assert "[node 1 rank 2] [rank2]: ValueError: bad batch on rank 2" in err  # live, as written
    assert gang_2x2.run("1 + 1").value == 2  # the warm gang is untouched


def test_an_exception_is_the_cause_even_when_the_process_then_aborts(gang_2x2, scripts):
    cause = run(gang_2x2, scripts / "aborts.py")[0].root_cause
    assert (cause.rank, cause.status, cause.error.ename) == (2, "error", "ValueError")
    assert cause.error.evalue == "bad batch (killed by SIGABRT)"


def test_torchelastic_error_file_and_a_killed_rank(gang_2x2, scripts):
    result, _, _ = run(gang_2x2, scripts / "recorded.py")
    cause = result.root_cause
    assert cause.rank == 3 and cause.error.ename == "KeyError"
    assert any("missing shard" in line for line in cause.error.traceback)
    killed, _, _ = run(gang_2x2, scripts / "killed.py")
    with pytest.raises(RankLost, match=r"rank 1 \(node 0\) was lost: killed by SIGKILL"):
        killed.unwrap()


def test_a_script_only_the_kernel_has_is_sent_to_the_nodes(gang_2x2, scripts, monkeypatch):
    # "/proc/self/cwd/..." is a file in each process's own working directory: here the scripts
    # folder; on the nodes (dask workers started elsewhere) a folder without it, as in a pod.
    monkeypatch.chdir(scripts)
    only_here = Path("/proc/self/cwd/train.py")
    copies = set(Path(tempfile.gettempdir()).glob("jupyter-mn-script-*"))
    result, out, _ = run(gang_2x2, only_here, "--steps", "2")
    assert result.ok, result.root_cause
    assert all(f"[node {r // 2} rank {r}] rank {r}/4 " in out for r in range(4))
    assert "total 20 run" in out
    sent = "train.py was sent to node(s) 0, 1, which do not have it (files it imports were not)"
    assert sent in result.notes
    assert set(Path(tempfile.gettempdir()).glob("jupyter-mn-script-*")) == copies  # removed
    monkeypatch.setattr(script_module, "COPY_LIMIT", 100)
    with pytest.raises(SpecError, match=r"train\.py: not on node\(s\) 0, 1, and at [\d.]+ MiB"):
        run(gang_2x2, only_here)


def test_timeout_stops_every_rank_and_missing_scripts_are_refused(gang_2x2, scripts):
    since = started_now()
    result, _, _ = run(gang_2x2, scripts / "sleepy.py", timeout=2)
    assert {r.status for r in result.ranks} == {"interrupted"}
    assert "the script was stopped: --timeout 2 s reached" in result.notes
    assert not wait_gone([p for p in ours(since) if "sleepy.py" in " ".join(p.cmdline())])
    with pytest.raises(SpecError, match=r"nope\.py: no such file on node\(s\) 0, 1"):
        run(gang_2x2, scripts / "nope.py")


def test_a_module_runs_as_python_m_does_and_a_missing_package_is_refused(
    gang_2x2, tmp_path, monkeypatch
):
    (tmp_path / "trainpkg").mkdir()
    (tmp_path / "trainpkg" / "__init__.py").write_text("")
    (tmp_path / "trainpkg" / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)  # the local ranks' working directory: the package is found there
    result, out, _ = run(gang_2x2, "trainpkg.train", "--steps", "2", module=True)
    assert result.ok and result.value == 0
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] rank {rank}/4 node {rank // 2} " in out
    assert out.count(" total 20 run ") == 4
    with pytest.raises(SpecError, match=r"-m nopkg\.train: no package 'nopkg' on node\(s\) 0, 1"):
        run(gang_2x2, "nopkg.train", module=True)
    with pytest.raises(SpecError, match=r"-m train\.py: give the module's name \(-m train\)"):
        run(gang_2x2, "train.py", module=True)
    with pytest.raises(SpecError, match="not a module name"):
        run(gang_2x2, "train-v2", module=True)
