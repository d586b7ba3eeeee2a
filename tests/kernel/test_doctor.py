"""The preflight doctor: every check made to fail on purpose.

Where this machine can produce the failure for real, a real gang does (a missing path, a too small
/dev/shm or disk threshold, --rdma without RDMA, an interface that does not exist, a closed master
port, a worker loading another jupyter_mn). Where it cannot (another Python, CUDA or NCCL
build, GPUs), one node's facts from a real probe of this machine are changed as that node would
report them, and the same judging code runs.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_mn import Cluster
from jupyter_mn.doctor import doctor, kernel_facts
from jupyter_mn.doctor.checks import Cell, Check, ifname_matches, judge
from jupyter_mn.doctor.report import DoctorReport
from jupyter_mn.errors import PreflightError
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.node.probe import rdma_ports
from tests.support.procs import ours, rank_processes

ROOT = Path(__file__).resolve().parents[2]
MASTER = ("127.0.0.1", 29500)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once it is closed


def probe(options: dict, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_mn.node.probe"],
        input=json.dumps(options),
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def facts() -> dict:
    """This machine as a node reports it, with the master reachable."""
    found = probe({"paths": [str(ROOT / "README.md")]})
    found["master"] = {"ok": True, "ms": 0.2}
    found["route"] = {"ip": "127.0.0.1", "interface": "lo", "error": None}
    return found


def two_nodes(facts: dict, change) -> list[dict]:
    second = copy.deepcopy(facts)
    change(second)
    return [copy.deepcopy(facts), second]


def cells(checks, name: str) -> list:
    return next(c for c in checks if c.name == name).cells


def judged(nodes: list[dict], **spec) -> list:
    return judge(ClusterSpec(nodes=len(nodes), **spec), nodes, kernel_facts(), MASTER)


def test_healthy_nodes_pass_every_check(facts):
    checks = judged([facts, facts], check_paths=(str(ROOT / "README.md"),))
    assert [c.name for c in checks if not c.ok] == []
    names = [c.name for c in checks]
    assert names[:6] == ["python", "torch", "CUDA", "NCCL", "jupyter_mn", "cloudpickle"]
    assert {"GPUs", "master", "interface", "RDMA", "/dev/shm", "disk", "paths"} <= set(names)


@pytest.mark.parametrize(
    ("check", "change", "value", "fix"),
    [
        ("python", lambda f: f.update(python="3.10.14"), "3.10.14", "use Python 3.11"),
        (
            "torch",
            lambda f: f["packages"]["torch"].update(version="2.12.0"),
            "2.12.0",
            "install torch==2.13.0",
        ),
        (
            "torch",  # same release, another build (+cu128 vs +cpu): must match across nodes
            lambda f: f["packages"]["torch"].update(version="2.13.0+cu999"),
            "2.13.0+cu999",
            "install torch=={torch}",  # this machine's build (+cpu or +cu130)
        ),
        ("CUDA", lambda f: f["accelerator"].update(cuda="12.8"), "12.8", "same torch build"),
        ("NCCL", lambda f: f["accelerator"].update(nccl="2.21.5"), "2.21.5", "same torch build"),
        (
            "cloudpickle",
            lambda f: f["packages"]["cloudpickle"].update(version="3.0.0"),
            "3.0.0",
            "install cloudpickle==",
        ),
    ],
)
def test_a_version_differing_on_one_node_fails(facts, check, change, value, fix):
    node0, node1 = cells(judged(two_nodes(facts, change)), check)
    assert node0.ok is True
    assert node1.ok is False and node1.value == value
    assert fix.format(torch=facts["packages"]["torch"]["version"]) in node1.fix
    assert "node 1" in node1.fix


def test_gpus_fewer_than_requested_or_missing_on_one_node_fail(facts):
    def gpus(n: int):
        return lambda f: f["accelerator"].update(gpus=n)

    nodes = [copy.deepcopy(facts) for _ in range(3)]
    for node, count in zip(nodes, (4, 2, 0), strict=True):
        gpus(count)(node)
    full, short, none = cells(judged(nodes, gpus=4), "GPUs")
    assert full.ok and full.value == "4"
    assert not short.ok and short.value == "2 of 4" and "use --gpus 2" in short.fix
    assert not none.ok and "every node needs GPUs" in none.fix
    cpu = cells(judged([facts, facts], gpus=4), "GPUs")  # no GPU anywhere: CPU ranks, fine
    assert all(c.ok and "CPU ranks" in c.value for c in cpu)


def test_each_node_shows_its_own_gpus_and_the_variable_that_chose_a_value_in_full(facts):
    def own(visible: str):
        return lambda f: (
            f["accelerator"].update(gpus=1),
            f["env"].update(CUDA_VISIBLE_DEVICES=visible),
        )

    nodes = two_nodes(facts, own("1"))
    own("0")(nodes[0])
    assert [c.value for c in cells(judged(nodes), "GPUs")] == [
        "1 (CUDA_VISIBLE_DEVICES=0)",
        "1 (CUDA_VISIBLE_DEVICES=1)",
    ]
    text = str(DoctorReport("local", ["node 0", "node 1"], judged(nodes)))
    assert "✔ lo 127.0.0.1 (NCCL_SOCKET_IFNAME, chosen)" in text
    long = Cell(True, "eth0 10.200.100.105, 100 Gb/s (NCCL_SOCKET_IFNAME, chosen)")
    text = str(DoctorReport("local", ["node 0"], [Check("interface", [long])]))
    assert "✔ eth0 10.200.100.105, 100 Gb… (NCCL_SOCKET_IFNAME, chosen)" in text


@pytest.mark.gpu
def test_more_gpus_than_visible_fail_on_a_real_gpu_node(no_leftovers):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    # the user's CUDA_VISIBLE_DEVICES: the local backend leaves the node's GPUs to it
    with Cluster(nodes=1, gpus=2, env={"CUDA_VISIBLE_DEVICES": "0"}) as cluster:
        (cell,) = cells(doctor(cluster).checks, "GPUs")
    assert cell.ok is False and "needs one per rank" in cell.fix


def test_an_unreachable_master_fails(facts):
    port = closed_port()
    node = probe({"master": {"addr": "127.0.0.1", "port": port}, "reach_timeout": 1})
    assert node["master"]["ok"] is False
    (cell,) = cells(judge(ClusterSpec(), [node], kernel_facts(), ("127.0.0.1", port)), "master")
    assert cell.ok is False and "unreachable" in cell.value
    assert "ConnectionRefusedError" in cell.fix and "allow TCP between the nodes" in cell.fix


def test_interface_rules_nccl_and_loopback_across_machines(facts):
    assert ifname_matches("eth", ["lo", "eth0", "eth1", "ib0"]) == ["eth0", "eth1"]
    assert ifname_matches("=eth0", ["eth0", "eth01"]) == ["eth0"]
    assert ifname_matches("^lo,docker", ["lo", "docker0", "eth0"]) == ["eth0"]

    def nccl(value: str):
        return lambda f: (
            f["accelerator"].update(gpus=1),
            f["env"].update(NCCL_SOCKET_IFNAME=value),
        )

    gpu_nodes = two_nodes(facts, nccl("nosuch"))
    nccl("lo")(gpu_nodes[0])
    good, bad = cells(judged(gpu_nodes), "interface")
    assert good.ok and "(NCCL_SOCKET_IFNAME)" in good.value
    assert bad.ok is False and "NCCL_SOCKET_IFNAME=nosuch names no interface" in bad.fix
    # two machines, but MASTER_ADDR is loopback: node 1 could never reach it
    far = two_nodes(facts, lambda f: f.update(machine="elsewhere"))
    assert all("is a loopback address" in c.fix for c in cells(judged(far), "interface"))


def test_interface_chosen_for_the_user_and_a_hostname_that_resolves_to_nothing(facts):
    far = two_nodes(facts, lambda f: f.update(machine="elsewhere"))
    master = ("10.0.0.1", 29500)
    chosen = cells(judge(ClusterSpec(nodes=2), far, kernel_facts(), master), "interface")
    assert all(c.ok and c.value.endswith("(GLOO_SOCKET_IFNAME, chosen)") for c in chosen)
    for node in far:  # no interface carries the route: gloo falls back to the hostname
        node.update(route={"ip": "10.0.0.9", "interface": None, "error": None}, hostname_ips=[])
    (bad, _) = cells(judge(ClusterSpec(nodes=2), far, kernel_facts(), master), "interface")
    assert bad.ok is False and bad.value == "gloo: hostname unresolved"
    assert f"hostname {far[0]['host']} resolves to no address" in bad.fix


def test_rdma_ports_from_sysfs(tmp_path):
    for device, state, layer in (
        ("mlx5_0", "4: ACTIVE", "InfiniBand"),
        ("mlx5_1", "1: DOWN", "Ethernet"),
    ):
        port = tmp_path / "sys" / "class" / "infiniband" / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
        (port / "link_layer").write_text(layer + "\n")
    (tmp_path / "dev" / "infiniband").mkdir(parents=True)
    (tmp_path / "dev" / "infiniband" / "uverbs0").touch()
    ports = rdma_ports(str(tmp_path))
    assert [(p["device"], p["state"], p["link_layer"], p["rate_gbps"]) for p in ports] == [
        ("mlx5_0", "ACTIVE", "InfiniBand", 200.0),
        ("mlx5_1", "DOWN", "Ethernet", 200.0),
    ]
    assert [p["problem"] for p in ports] == ["", "port state 1: DOWN"]


def test_rdma_down_ports_fail_and_active_ports_pass(facts):
    down = {
        "device": "mlx5_0",
        "port": "1",
        "state": "DOWN",
        "link_layer": "Ethernet",
        "rate_gbps": 100.0,
        "problem": "port state 1: DOWN",
    }
    nodes = two_nodes(facts, lambda f: f.update(rdma=[down]))
    nodes[0]["rdma"] = [{**down, "state": "ACTIVE", "problem": ""}]
    active, inactive = cells(judged(nodes, rdma=True), "RDMA")
    assert active.ok and "mlx5_0/1 Ethernet 100.0 Gb/s" in active.value
    assert inactive.ok is False and "none usable (mlx5_0/1 port state 1: DOWN)" in inactive.fix
    assert all(c.ok is None for c in cells(judged(nodes), "RDMA"))  # not requested: not judged


def test_a_node_whose_probe_failed_is_a_row_of_its_own(facts):
    checks = judged([facts, {"error": "TimeoutError()"}])
    assert checks[0].name == "probe" and [c.ok for c in checks[0].cells] == [True, False]
    assert all(c.cells[1].ok is None for c in checks[1:])


def test_real_gang_fails_shm_disk_paths_rdma_and_interface_with_a_fix_each(no_leftovers):
    spec = ClusterSpec(
        nodes=2,
        gpus=1,
        rdma=True,
        min_shm_gb=1e6,
        min_disk_gb=1e6,
        check_paths=(str(ROOT / "README.md"), "/nonexistent/dataset"),
        env=(("GLOO_SOCKET_IFNAME", "nosuch0"),),
    )
    with Cluster(spec) as cluster:
        report = doctor(cluster)
    failed = {name for name, _, _ in report.failures()}
    assert failed == {"interface", "RDMA", "/dev/shm", "disk", "paths"}
    for name in ("python", "torch", "jupyter_mn", "cloudpickle", "GPUs", "master"):
        assert all(c.ok for c in cells(report.checks, name)), name
    text = str(report)
    assert "FAILED" in text and text.count("✘ paths on node") == 2
    assert "/nonexistent/dataset; mount or copy" in text
    assert "GLOO_SOCKET_IFNAME=nosuch0 names no interface" in text
    assert "no InfiniBand/RoCE device" in text and "--shm-size" in text
    assert "<td" in report._repr_html_() and "(&lt; 1e+06 GiB)" in report._repr_html_()
    assert not rank_processes(ours(no_leftovers))


def test_preflight_stops_a_new_gang_before_its_ranks_start(no_leftovers):
    cluster = Cluster(nodes=2, gpus=1, check_paths=("/nonexistent/dataset",))
    with pytest.raises(PreflightError) as info:
        cluster.run("1")
    rendered = "\n".join(info.value._render_traceback_())
    assert "preflight failed: 2 ✘ (paths on node 0, paths on node 1)" in rendered
    assert "--no-preflight" in rendered and "✘ paths on node 1: missing" in rendered
    assert not rank_processes(ours(no_leftovers))
    skipped = Cluster(nodes=1, gpus=1, check_paths=("/nonexistent/dataset",), preflight=False)
    with skipped:
        assert skipped.run("40 + 2").value == 42


def test_cli_doctor_prints_the_table_and_fails_with_status_1(no_leftovers):
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_mn.cli", "doctor", "--nodes", "1", "--check-path", "/nope"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stderr
    assert "✔ 2.13" in proc.stdout and "✘ paths on node 0: missing on node 0" in proc.stdout


# ---- a real version mismatch: a dask worker whose PYTHONPATH shadows jupyter_mn
@pytest.fixture
def old_worker(dask_cli, tmp_path) -> Path:
    """A worker on host 127.0.0.3 importing a copy of jupyter_mn that says it is 0.0.9."""
    package = tmp_path / "shadow" / "jupyter_mn"
    shutil.copytree(ROOT / "jupyter_mn", package, ignore=shutil.ignore_patterns("__pycache__"))
    version = package / "wire" / "version.py"
    text = re.sub(r'__version__ = "[^"]+"', '__version__ = "0.0.9"', version.read_text())
    version.write_text(text)
    dask_cli.start_worker("w-old", "127.0.0.3", env={"PYTHONPATH": str(package.parent)})
    yield package
    dask_cli.stop_worker("w-old")


@pytest.mark.slow
def test_a_node_with_another_jupyter_mn_fails_with_a_clear_row(no_leftovers, dask_tls, old_worker):
    cluster = Cluster(backend="dask", scheduler=dask_tls, nodes=3, gpus=1)
    report = doctor(cluster)
    row = cells(report.checks, "jupyter_mn")
    assert [c.ok for c in row] == [True, True, False] and row[2].value == "0.0.9"
    assert f"node 2 loads {old_worker}" in row[2].fix
    assert "install jupyter_mn==0.1.0" in row[2].fix
    assert [name for name, _, _ in report.failures()] == ["jupyter_mn"]
    assert "✘ 0.0.9" in str(report) and "✘ jupyter_mn on node 2:" in str(report)
    with pytest.raises(PreflightError, match="jupyter_mn on node 2"):
        cluster.run("1")  # the same check, before any rank starts
    assert not rank_processes(ours(no_leftovers))
    with Cluster(backend="dask", scheduler=dask_tls, nodes=2, gpus=1) as spare:
        assert doctor(spare).ok  # with a node to spare, matching workers are chosen
