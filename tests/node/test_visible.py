"""Which GPUs a node's ranks see: made-up visible lists here, real GPUs in the ``gpu`` tests.

The local gangs below run on a machine that NVML pretends (in the kernel alone) has four GPUs:
the split is the kernel's, so its outcome (each node's ``CUDA_VISIBLE_DEVICES``, an error before
any process starts) is real; the ranks, which find no driver, run on CPU as they would anyway.
"""

from __future__ import annotations

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import SchedulingError, SpecError
from jupyter_mn.node import visible as gpus
from jupyter_mn.node.visible import check_count, split, visible
from tests.support.procs import ours

UUIDS = ["GPU-1111aaaa-0000", "GPU-2222bbbb-0000", "GPU-3333cccc-0000", "GPU-4444dddd-0000"]

#: Every rank's CUDA_VISIBLE_DEVICES, gathered to rank 0.
VISIBLE_PER_RANK = """
import os, torch.distributed as dist
seen = [None] * dist.get_world_size()
dist.all_gather_object(seen, os.environ.get("CUDA_VISIBLE_DEVICES"))
seen
"""


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        (None, ["0", "1", "2", "3"]),  # unset: every GPU
        ("2,3", ["2", "3"]),
        (" 3 , 1", ["3", "1"]),
        ("1,9,2", ["1"]),  # CUDA stops at the first entry that names no GPU
        ("GPU-3333cccc,GPU-1111", ["GPU-3333cccc", "GPU-1111"]),  # UUID prefixes
        ("GPU-ffff", []),
        ("", []),  # hidden: CPU ranks
    ],
)
def test_visible_entries_are_read_as_cuda_reads_them(value, entries):
    assert visible(value, UUIDS) == entries
    assert visible(value, []) == []  # no driver: no GPU, whatever the variable says


@pytest.mark.parametrize(
    ("entries", "nodes", "per_node", "each"),
    [
        (["0", "1", "2", "3"], 2, 2, ["0,1", "2,3"]),
        (["4", "5", "6", "7"], 2, 2, ["4,5", "6,7"]),  # the kernel's own CUDA_VISIBLE_DEVICES
        (["0", "1", "2", "3"], 3, 1, ["0", "1", "2"]),  # spares are left out
        (["GPU-a", "GPU-b"], 2, 1, ["GPU-a", "GPU-b"]),
        ([], 4, 8, None),  # no GPU: CPU ranks, nothing to split
    ],
)
def test_local_nodes_get_gpus_of_their_own(entries, nodes, per_node, each):
    assert split(entries, nodes, per_node) == each


def test_more_gpus_than_visible_is_refused_with_what_fits():
    with pytest.raises(SpecError) as info:
        split(["0"], 2, 4)
    assert str(info.value) == (
        "the local backend's 2 nodes × 4 GPUs need 8 GPUs; this machine has 1 visible: "
        "use --nodes 1 --gpus 1 (or CUDA_VISIBLE_DEVICES= for CPU ranks)"
    )
    with pytest.raises(SpecError, match="has 6 visible: use --nodes 2 --gpus 3"):
        split([str(i) for i in range(6)], 2, 4)


def test_a_node_with_fewer_gpus_than_ranks_is_refused_and_cpu_nodes_are_not():
    with pytest.raises(SchedulingError) as info:
        check_count(3, 2, 1)
    assert str(info.value).startswith("node 3 has 1 GPU(s); local rank 1 needs at least 2")
    check_count(0, 8, 0)  # no GPU: CPU ranks
    check_count(0, 2, 4)


@pytest.fixture
def four_gpus(monkeypatch):
    """NVML, as the kernel asks it, sees four GPUs."""
    monkeypatch.setattr(gpus, "gpu_uuids", lambda: list(UUIDS))


def test_a_local_gang_splits_the_kernels_gpus_among_its_nodes(four_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1,2,0")
    with Cluster(nodes=2, gpus=2) as cluster:
        assert cluster.run(VISIBLE_PER_RANK).unwrap() == ["3,1", "3,1", "2,0", "2,0"]


def test_too_few_gpus_fail_before_any_process_starts(four_gpus, no_leftovers):
    with pytest.raises(SpecError, match="2 nodes × 4 GPUs need 8 GPUs; this machine has 4"):
        Cluster(nodes=2, gpus=4).run("1")
    assert not ours(no_leftovers), "a process started"
