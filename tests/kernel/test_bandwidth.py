"""``%cluster bench`` arithmetic: sizes and nccl-tests' bandwidth formulas on known numbers.

The real measurement on a gang (and its printed table checked against these formulas) is in
``tests/e2e/test_node_verbs.py``.
"""

from __future__ import annotations

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import SpecError
from jupyter_mn.kernel.bandwidth import (
    ONE_RANK,
    BenchReport,
    BenchRow,
    algbw,
    bench,
    busbw,
    link_rates,
    node_links,
    parse_size,
    slow_links,
)
from tests.support.procs import ours


@pytest.mark.parametrize(
    ("text", "size"),
    [("256M", 256 << 20), ("1G", 1 << 30), ("64MiB", 64 << 20), ("4096", 4096), ("1.5k", 1536)],
)
def test_sizes_are_binary_multiples_like_nccl_tests(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1M", "2", "1X"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(SpecError, match="--size"):
        parse_size(text)


def test_busbw_of_a_known_size():
    size, seconds = 256 << 20, 0.5  # 256 MiB all-reduced in 0.5 s
    assert algbw(size, seconds) == pytest.approx(0.536870912)  # GB/s (10^9 bytes/s)
    assert busbw(size, seconds, 4) == pytest.approx(0.536870912 * 1.5)  # 2(n-1)/n = 1.5
    assert busbw(size, seconds, 2) == pytest.approx(0.536870912)  # 2(n-1)/n = 1
    assert busbw(size, seconds, 1) == 0.0  # one rank moves nothing over a bus


def test_report_prints_both_bandwidths_and_the_expected_rate():
    report = BenchReport("cuda (nccl)", iters=20, warmup=5)
    report.rows.append(BenchRow("inter-node (one rank per node)", 2, 1 << 30, 0.05, 50.0))
    text = str(report)
    assert "algbw = size / time, busbw = algbw × 2(n−1)/n" in text
    assert "inter-node (one rank per node)      2  1 GiB  50.000 ms      21.475      21.475" in text
    assert text.rstrip().endswith("21.475             50")


def test_a_one_rank_gang_has_nothing_to_measure_and_is_not_started(no_leftovers):
    cluster = Cluster(nodes=1, gpus=1)
    report = bench(cluster, 256 << 20)
    assert str(report) == ONE_RANK and not report.rows
    assert cluster.gang is None and not ours(no_leftovers)


def test_expected_rate_is_the_slowest_nodes_usable_rdma_or_nic():
    ib = {"state": "ACTIVE", "rate_gbps": 200.0, "problem": ""}
    eth = {"name": "eth0", "speed_mbps": 25000}
    down = {**ib, "state": "DOWN", "problem": "port state 1: DOWN"}
    node = {"rdma": [ib, ib, down], "interfaces": [eth], "route": {}}
    nic_only = {"rdma": [], "interfaces": [eth], "route": {"interface": "eth0"}}
    assert link_rates([node]) == 50.0  # two usable 200 Gb/s ports = 50 GB/s
    assert link_rates([node, nic_only]) == 3.125  # 25 Gb/s NIC on the slower node
    loopback = {
        "rdma": [],
        "interfaces": [{"name": "lo", "speed_mbps": 0}],
        "route": {"interface": "lo"},
    }
    assert link_rates([loopback]) is None


def test_a_node_is_named_slow_only_by_its_own_link():
    """Transfers go k → k+1 in a ring: node 2's link carries 1→2 and 2→3, both slow."""
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    mib = 1 << 20
    links = node_links(hosts, mib, [0.04, 0.4, 0.4, 0.04])  # 0→1, 1→2, 2→3, 3→0
    assert [round(k.rate, 4) for k in links] == [0.0262, 0.0262, 0.0026, 0.0262]
    ((slow, others),) = slow_links(links)
    assert (slow.node, slow.host, round(others, 4)) == (2, "10.0.0.3", 0.0262)
    report = BenchReport("cpu (gloo)", iters=3, warmup=1, links=links, link_size=mib)
    assert "✘ node 2 (10.0.0.3) has a slow link: 0.002621 GB/s, the other nodes' 0.02621" in str(
        report
    )
    # two nodes share both transfers: nobody can be named
    assert slow_links(node_links(hosts[:2], mib, [0.04, 0.4])) == []
    assert slow_links(node_links(hosts[:3], mib, [0.04, 0.05, 0.045])) == []
