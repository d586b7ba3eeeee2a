"""The dask backend across test hosts (``hosts.py``): own addresses, own hostnames, a bridge.

A user's TLS cluster as on real machines: ``dask scheduler`` on the bridge, one ``dask worker``
per host. The hosts' names resolve to nothing, so gloo works only on the interface the agent
chooses (docs/architecture.md, "Rank environment"); the user sets none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from daskcli import DaskCLI
from hosts import HostNet

from jupyter_mn import Cluster
from jupyter_mn.doctor import doctor

HOSTS = 3

CHECK = """
import json, os, socket, torch, torch.distributed as dist
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
json.dumps({"sum": t.item(), "host": socket.gethostname(), "master": os.environ["MASTER_ADDR"],
            "gloo": os.environ.get("GLOO_SOCKET_IFNAME"),
            "nccl": os.environ.get("NCCL_SOCKET_IFNAME")})
"""


@pytest.fixture(scope="module")
def bridge_dask(host_net: HostNet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The scheduler on the bridge, a worker on every host; this process has the TLS config."""
    with DaskCLI.on_hosts(tmp_path_factory.mktemp("dask-hosts"), host_net) as cli:
        yield cli.address


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_gang_across_hosts_reduces_on_the_interface_chosen_for_it(
    nodes, host_net, bridge_dask, no_leftovers
):
    with Cluster(nodes=nodes, gpus=1, backend="dask", scheduler=bridge_dask) as cluster:
        rows = [json.loads(v) for v in cluster.run(CHECK, return_all=True).unwrap()]
        interface = next(c for c in doctor(cluster).checks if c.name == "interface")
    hosts = host_net.hosts[:nodes]
    assert [r["host"] for r in rows] == [h.hostname for h in hosts]
    assert {r["master"] for r in rows} == {hosts[0].ip}
    assert all(r["sum"] == nodes * (nodes - 1) / 2 for r in rows)
    assert all((r["gloo"], r["nccl"]) == ("eth0", "=eth0") for r in rows)
    assert [c.value for c in interface.cells] == [
        f"eth0 {h.ip}, 10 Gb/s (GLOO_SOCKET_IFNAME, chosen)" for h in hosts
    ]
