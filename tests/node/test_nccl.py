"""NCCL transport parsing on real-format NCCL_DEBUG=INFO logs, and the JSON CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_mn.gang.transport import violation
from jupyter_mn.node.nccllog import NcclLog, normalize_path
from jupyter_mn.views.glance import transport_badges
from jupyter_mn.views.summary import evidence

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
#: The fixtures whose NCCL lines say ``nNodes 1``.
ONE_NODE = {"one_rank", "p2p_ipc", "p2p_cumem", "nvls_on", "shm"}

# fixture: (network, inter_node, intra_node, gdr, nvls, fallback, a line that must be evidence)
CASES = {
    "ib_gdrdma": (
        "IB",
        ["NET/IB/GDRDMA"],
        ["P2P/IPC/read"],
        True,
        False,
        False,
        "via NET/IB/3/GDRDMA",
    ),
    "ib_no_gdr": ("IB", ["NET/IB"], [], False, False, False, "via NET/IB/0"),
    "roce": ("RoCE", ["NET/IB/GDRDMA"], [], True, False, False, "mlx5_10:1/RoCE"),
    "socket_fallback": (
        "Socket",
        ["NET/Socket"],
        ["P2P/CUMEM"],
        False,
        False,
        True,
        "Using network Socket",
    ),
    # one node: NCCL loaded a network plugin (sockets, here), but no path uses it
    "p2p_ipc": ("", [], ["P2P/IPC/read", "P2P/IPC"], False, False, False, "P2P/IPC/read"),
    "p2p_cumem": ("", [], ["P2P/CUMEM", "P2P/CUMEM/read"], False, False, False, "P2P/CUMEM"),
    "one_rank": ("", [], [], False, False, False, "nRanks 1 nNodes 1"),
    "shm": ("", [], ["SHM/direct/direct"], False, False, False, "via SHM/direct/direct"),
    "nvls_on": (
        "",
        [],
        ["P2P/CUMEM/read", "NVLS"],
        False,
        True,
        False,
        "16 nvls channels",
    ),
    "nvls_off": ("", [], ["P2P/direct pointer"], False, False, False, "0 nvls channels"),
    "efa_ofi": (
        "EFA",
        ["NET/AWS Libfabric/GDRDMA"],
        ["P2P/CUMEM"],
        True,
        False,
        False,
        "Selected Provider is efa",
    ),
}


def parse(name: str) -> NcclLog:
    return NcclLog().feed_all((FIXTURES / f"{name}.log").read_text().splitlines())


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_reports_the_real_transport(name):
    network, inter, intra, gdr, nvls, fallback, proof = CASES[name]
    report = parse(name).report()
    assert report.network == network
    assert list(report.inter_node) == inter
    assert list(report.intra_node) == intra
    assert (report.gdr, report.nvls, report.fallback) == (gdr, nvls, fallback)
    assert report.one_node == (name in ONE_NODE)
    assert any(proof in line for line in report.evidence), report.evidence
    assert all("NCCL" in line for line in report.evidence)  # whole lines, as NCCL printed them


def test_fallback_reasons_are_kept_with_their_lines():
    report = parse("socket_fallback").report()
    assert report.reasons == ("NET/IB : No device found.",)
    assert any("NET/Socket : Using [0]eno1" in line for line in report.evidence)
    assert "inter-node NET/Socket" in report.summary


def test_one_node_uses_no_network_and_nothing_falls_back():
    log = parse("one_rank")
    assert (log.network, log.reasons != {}) == ("Socket", True)  # what NCCL loaded, and why
    report = log.report(node=0)
    assert report.summary == "no network (one node)"
    assert (report.fallback, report.reasons, report.network) == (False, (), "")
    assert not violation([report]), "--require-rdma has nothing to require on one node"
    glance = [badge.text for badge in transport_badges(report)]
    assert glance == ["no network (one node)"]
    assert "nNodes 1" in evidence(report)
    two = parse("p2p_cumem").report(node=0, nnodes=2)  # the gang's count wins over NCCL's
    assert (two.one_node, two.network) == (False, "RoCE")
    intra = parse("p2p_cumem").report(node=0)
    assert intra.summary == "no network (one node); intra-node P2P/CUMEM, P2P/CUMEM/read"


def test_nvls_available_but_unused_is_not_nvls():
    log = parse("nvls_off")
    assert log.nvls_available is False and log.nvls_channels == 0
    assert not log.report().nvls


def test_lines_arrive_incrementally_and_unrelated_lines_are_ignored():
    log = NcclLog()
    assert not log.feed("epoch 1 loss 0.3 via P2P/IPC")  # a user's print, not NCCL's
    assert log.report().network == ""
    assert log.feed("h:1:2 [0] NCCL INFO Using network IB")
    assert not log.feed("h:1:2 [0] NCCL INFO Using network IB")  # nothing new
    assert log.report().inter_node == ()
    assert log.feed("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/IB/1/GDRDMA")
    report = log.report(node=3)
    assert (report.node, report.inter_node, report.gdr) == (3, ("NET/IB/GDRDMA",), True)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("NET/IB/0/GDRDMA", "NET/IB/GDRDMA"),
        ("NET/Socket/3", "NET/Socket"),
        ("NET/IBext_v8/2", "NET/IBext_v8"),
        ("P2P/CUMEM/read", "P2P/CUMEM/read"),
        ("direct shared memory", "SHM/direct"),
    ],
)
def test_path_kinds_drop_the_nic_index(raw, kind):
    assert normalize_path(raw) == kind


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_mn.nccl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_the_report_of_several_logs_as_json():
    done = run_cli(str(FIXTURES / "p2p_cumem.log"), str(FIXTURES / "roce.log"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {"network", "inter_node", "intra_node", "gdr", "fallback", "evidence"} <= set(report)
    assert report["network"] == "RoCE" and report["gdr"] is True
    assert report["inter_node"] == ["NET/IB/GDRDMA"]
    assert report["intra_node"] == ["P2P/CUMEM", "P2P/CUMEM/read"]


def test_cli_reads_stdin_and_says_when_there_is_nothing_to_read(tmp_path):
    done = run_cli("-", stdin=(FIXTURES / "socket_fallback.log").read_text())
    assert done.returncode == 0 and json.loads(done.stdout)["fallback"] is True
    empty = tmp_path / "train.log"
    empty.write_text("epoch 1\nepoch 2\n")
    done = run_cli(str(empty))
    assert done.returncode == 1 and "NCCL_DEBUG=INFO" in done.stderr
    done = run_cli(str(tmp_path / "missing.log"))
    assert done.returncode == 2 and "cannot read" in done.stderr
    assert "Traceback" not in done.stderr
