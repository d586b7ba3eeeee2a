"""The rank environment's socket interfaces: chosen toward the master, unless someone named one."""

from __future__ import annotations

from jupyter_mn.node.netif import socket_ifname
from jupyter_mn.rank.env import rank_env
from jupyter_mn.wire.launchspec import Launch


def env(user: dict[str, str], base: dict[str, str], ifname: str | None) -> dict[str, str]:
    launch = Launch(
        job="j",
        gpus=1,
        nnodes=1,
        master_addr="10.0.0.1",
        master_port=29500,
        backend="local",
        nodes=("a",),
        pg_timeout=60,
        env=user,
    )
    return rank_env(launch, 0, 0, base=base, socket_ifname=ifname)


def test_gloo_and_nccl_get_the_interface_unless_the_user_or_the_node_named_one():
    chosen = env({}, {}, "eth0")
    assert (chosen["GLOO_SOCKET_IFNAME"], chosen["NCCL_SOCKET_IFNAME"]) == ("eth0", "=eth0")
    mine = env({"GLOO_SOCKET_IFNAME": "ib0"}, {"NCCL_SOCKET_IFNAME": "^docker"}, "eth0")
    assert (mine["GLOO_SOCKET_IFNAME"], mine["NCCL_SOCKET_IFNAME"]) == ("ib0", "^docker")
    assert "GLOO_SOCKET_IFNAME" not in env({}, {}, None)


def test_the_interface_toward_a_master_on_this_host_is_loopback():
    assert socket_ifname("127.0.0.1") == "lo"
