"""``--rdma`` detection on fake sysfs trees laid out like real ones.

See docs/architecture.md, "RDMA detection".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_mn.node.rdma import detect, nccl_auto_gid, plan

LINK_LOCAL = "fe80:0000:0000:0000:0a5e:45ff:fe1c:4b2e"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def v4(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def port(
    root: Path,
    hca: str,
    gids: list[tuple[str, str, str]],
    *,
    num: int = 1,
    state: str = "4: ACTIVE",
    link: str = "Ethernet",
) -> None:
    """One HCA port; ``gids`` are (gid, type, netdev) by index."""
    base = root / "sys/class/infiniband" / hca / "ports" / str(num)
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "state").write_text(state + "\n")
    (base / "link_layer").write_text(link + "\n")
    for i, (gid, kind, ndev) in enumerate(gids):
        (base / "gids" / str(i)).write_text(gid + "\n")
        (base / "gid_attrs/types" / str(i)).write_text(kind + "\n")
        (base / "gid_attrs/ndevs" / str(i)).write_text(ndev + "\n")


def netdevs(root: Path, *names: str) -> None:
    for name in names:
        (root / "sys/class/net" / name).mkdir(parents=True)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    (tmp_path / "dev/infiniband/uverbs0").write_text("")
    netdevs(tmp_path, "lo", "eth0")
    return tmp_path


def roce_v2(ndev: str, ip: str) -> list[tuple[str, str, str]]:
    """The usual mlx5 RoCE table: link-local v1/v2 at 0/1, IPv4 v1/v2 at 2/3."""
    return [
        (LINK_LOCAL, "IB/RoCE v1", ndev),
        (LINK_LOCAL, "RoCE v2", ndev),
        (v4(ip), "IB/RoCE v1", ndev),
        (v4(ip), "RoCE v2", ndev),
    ]


def test_infiniband_port_is_used_by_exact_name(node):
    port(node, "mlx5_0", [(LINK_LOCAL, "IB/RoCE v1", "")], link="InfiniBand")
    port(node, "mlx5_1", [(LINK_LOCAL, "IB/RoCE v1", "")], link="InfiniBand")
    found = plan(node)
    assert found.env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}  # "=": mlx5_1 must not match mlx5_10
    assert found.labels == ("mlx5_0:1 InfiniBand", "mlx5_1:1 InfiniBand")


def test_roce_v2_standard_table_needs_no_gid_index_on_recent_nccl(node):
    netdevs(node, "net1")
    port(node, "mlx5_2", roce_v2("net1", "10.200.1.10"))
    found = plan(node, nccl_version=(2, 23))
    assert found.env == {"NCCL_IB_HCA": "=mlx5_2:1"}
    assert found.ports[0].gid_index == 3
    assert found.labels == ("mlx5_2:1 RoCE v2 GID 3 (net1 10.200.1.10)",)


def test_ipv6_link_local_first_needs_the_index_on_old_nccl(node):
    netdevs(node, "net1")
    port(node, "mlx5_2", roce_v2("net1", "10.200.1.10"))
    assert nccl_auto_gid(plan(node).ports[0].gids, (2, 20)) == 0  # the link-local GID
    assert plan(node, nccl_version=(2, 20)).env["NCCL_IB_GID_INDEX"] == "3"


def test_roce_v1_only_port_uses_its_ipv4_gid(node):
    netdevs(node, "net1")
    port(
        node, "mlx5_3", [(LINK_LOCAL, "IB/RoCE v1", "net1"), (v4("10.0.0.5"), "IB/RoCE v1", "net1")]
    )
    found = plan(node, nccl_version=(2, 23))
    assert found.ports[0].gid_index == 1 and found.env == {"NCCL_IB_HCA": "=mlx5_3:1"}
    assert "RoCE v1 GID 1" in found.labels[0]


def test_gid_whose_netdev_is_elsewhere_is_skipped_and_the_index_set(node):
    """A shared RDMA device shows the host's GIDs too; NCCL's own pick (index 3) is not ours."""
    netdevs(node, "net2")
    table = [*roce_v2("ens1f0", "10.1.0.7"), (v4("10.200.2.20"), "RoCE v2", "net2")]
    port(node, "mlx5_0", table)
    assert nccl_auto_gid(tuple(detect(node).ports[0].gids), (2, 23)) == 3
    found = plan(node, nccl_version=(2, 23))
    assert found.env == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "4"}


def test_missing_netdev_down_port_and_no_ipv4_make_ports_unusable(node):
    port(node, "mlx5_0", roce_v2("net9", "10.1.0.7"))
    port(node, "mlx5_1", roce_v2("eth0", "10.1.0.8"), state="1: DOWN")
    port(node, "mlx5_2", [(LINK_LOCAL, "RoCE v2", "eth0"), (ZERO, "", "")])
    found = plan(node)
    assert found.env == {}
    reasons = {p.hca: p.problem for p in found.ports}
    assert "net9" in reasons["mlx5_0"] and "not in this network namespace" in reasons["mlx5_0"]
    assert reasons["mlx5_1"] == "port state 1: DOWN"
    assert "IPv4" in reasons["mlx5_2"]
    assert "fall back to TCP" in found.labels[-1]


def test_no_rdma_hardware_or_devices_not_mounted(tmp_path, node):  # node is under tmp_path
    assert plan(tmp_path / "bare").labels == ("no RDMA device (/sys/class/infiniband is missing)",)
    port(node, "mlx5_0", [(LINK_LOCAL, "IB/RoCE v1", "")], link="InfiniBand")
    (node / "dev/infiniband/uverbs0").unlink()
    found = plan(node)
    assert found.env == {} and any("uverbs" in label for label in found.labels)
