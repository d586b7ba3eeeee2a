"""``%cluster bench`` against the line rate: the test hosts' links shaped with ``tc tbf`` (both
ways, ``hosts.py``), a gang of one rank per host on the dask backend. Loose bounds: the box is
shared, and these are gloo's CPU numbers over TCP."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from jupyter_mn import Cluster
from jupyter_mn.kernel.bandwidth import bench
from tests.support.daskcli import DaskCLI
from tests.support.hosts import HostNet

HOSTS = 3
#: Shaped links move megabytes at 20-200 Mbit/s.
pytestmark = [pytest.mark.slow, pytest.mark.system]

#: Low enough for two shared cores to drive, high enough above the box's noise.
LINE, LINE_GBS = "200mbit", 0.025
SLOW, SLOW_GBS = "20mbit", 0.0025
SIZE = 4 << 20


@contextlib.contextmanager
def shaped_links(host_net: HostNet) -> Iterator[None]:
    """Every host's link at the line rate; plain again afterwards."""
    try:
        for host in host_net.hosts:
            host.shape(LINE)
        yield
    finally:
        for host in host_net.hosts:
            host.heal()


def test_bench_reports_the_line_rate_and_names_a_node_with_a_slow_link(
    host_net, tmp_path_factory, no_leftovers
):
    with (
        DaskCLI.on_hosts(tmp_path_factory.mktemp("dask-bench"), host_net) as cli,
        Cluster(nodes=HOSTS, gpus=1, backend="dask", scheduler=cli.address) as cluster,
    ):
        cluster.up()
        with shaped_links(host_net):
            even = bench(cluster, SIZE, iters=3, warmup=1)
            far = host_net.hosts[2]
            far.heal()
            far.shape(SLOW)
            uneven = bench(cluster, SIZE, iters=3, warmup=1)
    (all_ranks,) = even.rows
    assert 0.5 * LINE_GBS < all_ranks.busbw < 1.2 * LINE_GBS, str(even)
    assert all(0.5 * LINE_GBS < link.rate < 1.2 * LINE_GBS for link in even.links), str(even)
    assert not even.slow, str(even)
    ((link, others),) = uneven.slow
    assert (link.node, link.host) == (2, far.ip), str(uneven)
    assert 0.5 * SLOW_GBS < link.rate < 1.2 * SLOW_GBS, str(uneven)
    assert 0.5 * LINE_GBS < others < 1.2 * LINE_GBS, str(uneven)
    assert f"✘ node 2 ({far.ip}) has a slow link: " in str(uneven)
    # the all-reduce goes at the slow link's pace: the collective alone would not say whose
    assert uneven.rows[0].busbw < 0.3 * LINE_GBS, str(uneven)
