"""What nodes report on real local gangs: debug env, transport, GPUs, RDMA, stragglers."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import TransportError
from jupyter_mn.gang.transport import ONE_NODE
from jupyter_mn.node.files import NodeFiles
from jupyter_mn.node.gpu import RankProcess
from jupyter_mn.node.telemetry import NodeTelemetry
from jupyter_mn.views import TextView
from jupyter_mn.wire.events import GpuSample, Note, TransportReport
from jupyter_mn.wire.launchspec import Launch
from tests.node.test_nccl import FIXTURES
from tests.support.procs import ours, rank_processes

ENV = (
    "import os\n{k: os.environ.get(k) for k in ['NCCL_DEBUG', 'NCCL_DEBUG_SUBSYS', "
    "'NCCL_DEBUG_FILE', 'TORCH_FR_BUFFER_SIZE', 'TORCH_DISTRIBUTED_DEBUG', "
    "'TORCH_SHOW_CPP_STACKTRACES']}"
)


def test_nccl_info_goes_to_a_file_per_rank_not_the_users_stream(gang_2x2):
    envs = gang_2x2.run(ENV, return_all=True).values
    for rank, env in enumerate(envs):
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
        assert env["NCCL_DEBUG_FILE"].endswith(f"nccl-rank{rank}.log")
        assert os.path.isdir(os.path.dirname(env["NCCL_DEBUG_FILE"]))
        assert env["TORCH_FR_BUFFER_SIZE"] == "256" and env["TORCH_DISTRIBUTED_DEBUG"] is None
    assert {n: r.backend for n, r in gang_2x2.gang.core.hub.transport.items()} == {
        0: "gloo",
        1: "gloo",
    }


def test_straggler_is_named_from_its_late_arrival(gang_2x2):
    out = io.StringIO()
    code = (
        "import time\ntime.sleep(1.2 if dist.get_rank() == 3 else 0.3)\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\n"
    )
    assert gang_2x2.run(code, on_event=TextView(out, io.StringIO(), spec=gang_2x2.spec)).ok
    text = out.getvalue()
    assert "straggler: rank 3 (node 1) reached gloo:all_reduce after 1.2" in text, text
    assert text.count("straggler:") == 1


def test_debug_flag_shows_torch_and_nccl_debug_and_reports_gloo_and_no_gpu(no_leftovers):
    seen: list = []
    with Cluster(nodes=1, gpus=2, debug=True) as cluster:
        envs = cluster.run(ENV, return_all=True, on_event=seen.append).values
    for env in envs:
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] is None  # in the stream
        assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
        assert env["TORCH_SHOW_CPP_STACKTRACES"] == "1"
    reports = [e for e in seen if isinstance(e, TransportReport)]
    assert reports and reports[0].summary == "gloo (CPU)"
    samples = [e for e in seen if isinstance(e, GpuSample)]
    assert all(s.gpus == () and s.note.startswith("no GPU") for s in samples)
    assert 1 <= len(samples) <= 2  # "no GPU" is said at start and per cell, not every second


def test_users_own_nccl_debug_is_left_alone(no_leftovers):
    with Cluster(nodes=1, gpus=1, env={"NCCL_DEBUG": "WARN"}) as cluster:
        env = cluster.run(ENV).value
    assert env["NCCL_DEBUG"] == "WARN" and env["NCCL_DEBUG_FILE"] is None


def test_require_rdma_without_rdma_fails_before_any_rank_starts(no_leftovers):
    cluster = Cluster(nodes=2, gpus=1, require_rdma=True)
    assert cluster.spec.rdma  # --require-rdma implies --rdma
    with pytest.raises(TransportError, match=r"--require-rdma: node [01] has no usable RDMA port"):
        cluster.run("1")
    assert cluster.gang is None or not cluster.gang.core.status.usable
    assert not rank_processes(ours(no_leftovers))
    cluster.close()


def test_require_rdma_on_one_node_passes_with_a_note(no_leftovers):
    seen: list = []
    with Cluster(nodes=1, gpus=1, require_rdma=True) as cluster:
        assert cluster.run("1", on_event=seen.append).value == 1
    assert ONE_NODE in [e.text for e in seen if isinstance(e, Note)]
    (report,) = {e for e in seen if isinstance(e, TransportReport)}
    assert report.one_node and not report.fallback


def test_rdma_asked_on_a_cpu_gang_warns_with_what_was_found(no_leftovers):
    err = io.StringIO()
    cluster = Cluster(nodes=1, gpus=1, rdma=True)
    with cluster:
        view = TextView(io.StringIO(), err, spec=cluster.spec)
        assert cluster.run("1", on_event=view).value == 1  # a warning, not a failure
    assert "WARNING node 0: --rdma was asked for but ranks run gloo on CPU" in err.getvalue()
    report = view.state.transport[0]
    assert report.hcas == ("no RDMA device (/sys/class/infiniband is missing)",)


def test_node_telemetry_follows_nccl_files_as_ranks_write_them(tmp_path):
    published: list = []
    # two nodes, as the fixture's NCCL lines say (nNodes 2)
    launch = Launch("job", 1, 2, "127.0.0.1", 0, "local", ("127.0.0.1", "127.0.0.2"), 60.0)
    telemetry = NodeTelemetry(0, launch, published.append)
    try:
        env = telemetry.rank_env(0, {})
        log_file = env["NCCL_DEBUG_FILE"]
        lines = (FIXTURES / "ib_gdrdma.log").read_text().splitlines(keepends=True)
        with open(log_file, "w") as f:
            f.writelines(lines[:6])
            f.write(lines[6][:20])  # NCCL is mid-line
        telemetry.started([RankProcess(0, 0, os.getpid())], {"nccl"})
        first = [e for e in published if isinstance(e, TransportReport)][-1]
        assert first.network == "IB" and first.inter_node == ()
        with open(log_file, "a") as f:
            f.write(lines[6][20:])
            f.writelines(lines[7:])
        telemetry.poll()  # what the sampling thread does ~1 Hz while a cell runs
        last = [e for e in published if isinstance(e, TransportReport)][-1]
        assert last.inter_node == ("NET/IB/GDRDMA",) and last.gdr
        count = len(published)
        telemetry.poll()
        assert len(published) == count  # nothing new, nothing published
        with open(log_file, "w") as f:  # a relaunched rank starts its file over
            f.write("h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n")
        telemetry.poll()
        assert "SHM/direct/direct" in published[-1].intra_node
    finally:
        telemetry.close()
    assert not os.path.exists(os.path.dirname(log_file))


def test_an_agent_cleans_up_the_log_folders_of_agents_that_died(tmp_path):
    """A killed agent cannot remove its folder; the next one to start does, and leaves those
    of live agents alone."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    temp = Path(tempfile.gettempdir())
    stale = temp / f"jupyter-mn-nccl-jmn-0dead000-node0-p{dead}-x1"
    live = temp / f"jupyter-mn-nccl-jmn-0live000-node0-p{os.getpid()}-x2"
    # a live agent's, and a running gang's copy, of a job whose name looks like a dead agent's
    named = f"bert-node2-p{dead}-5f3a9c2e"
    live_named = temp / f"jupyter-mn-nccl-{named}-node0-p{os.getpid()}-x3"
    copy = Path(NodeFiles(named).folder)
    for folder in (stale, live, live_named):
        folder.mkdir()
        (folder / "nccl-rank0.log").write_text("h:1:1 [0] NCCL INFO init\n")
    launch = Launch("job", 1, 1, "127.0.0.1", 0, "local", ("127.0.0.1",), 60.0)
    telemetry = NodeTelemetry(0, launch, [].append)
    try:
        assert not stale.exists() and live.exists()
        assert live_named.exists() and copy.exists()
    finally:
        telemetry.close()
        for folder in (live, live_named, copy):
            shutil.rmtree(folder, ignore_errors=True)
