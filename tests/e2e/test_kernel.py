"""%%cluster in a real kernel: values, state, bad input, warm reuse, and nothing left behind."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

import pytest

from tests.support.kernels import Kernel
from tests.support.procs import ours, rank_processes, started_now, wait_gone


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    yield k
    k.shutdown()


def running_ranks(since: float | None = None) -> list:
    return rank_processes(ours(since))


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("%%cluster --nodes 0\n1", "SpecError: nodes must be ≥ 1, got 0"),
        ("%%cluster --gpus -1\n1", "SpecError: gpus must be ≥ 1, got -1"),
        ("%%cluster --nodez 2\n1", "unrecognized arguments: --nodez 2"),
        ("%%cluster --nodes two\n1", "argument --nodes: invalid int value: 'two'"),
        ("%%cluster --view html\n1", "argument --view: invalid choice: 'html'"),
        ("%%cluster --max-value 2apples\n1", "max_value '2apples' is not a size"),
        ("%%cluster\n", "cell body is empty"),
        ("%%cluster\n   \n\n", "the cell is empty"),
        ("%%cluster\nx = 1\ny = (2 +\n", "SyntaxError in the cell, line 2"),
        ("import threading\nlk = threading.Lock()\n%%cluster\nlk", None),
        ("%cluster fly", "%cluster needs a verb"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(kernel, cell, expected):
    since = started_now()
    if expected is None:  # an unpicklable notebook variable the cell reads
        setup, cell = cell.split("%%cluster")
        assert kernel.run(setup).status == "ok"
        cell, expected = "%%cluster" + cell, "'lk' of type lock"
    reply = kernel.run(cell)
    assert reply.status == "error"
    assert expected in reply.error_text
    assert len(reply.error_text) < 600, reply.error_text  # short, no library frames
    assert not running_ranks(since)


def test_cell_values_state_pull_and_labelled_output(kernel):
    kernel.run("def scale(x):\n    return 10 * x\nclass Box:\n    pass")
    first = kernel.run(
        "%%cluster --nodes 2 --gpus 2\nb = Box()\nb.v = scale(dist.get_rank())\n"
        "t = torch.tensor([float(dist.get_rank())])\ndist.all_reduce(t)\n"
        "print('rank', dist.get_rank(), 'sum', t.item())\nt.item()"
    )
    assert first.status == "ok", first.error_text
    assert first.result == "6.0"
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] rank {rank} sum 6.0" in first.stdout
    assert "no CUDA GPU" in first.stdout and first.stdout.count("no CUDA GPU") == 1
    assert kernel.run("%%cluster --all\nb.v").result == "[0, 10, 20, 30]"
    assert kernel.run("%%cluster --pull b\nb.v += 1").status == "ok"
    assert kernel.run("b.v").result == "1"
    error = kernel.run("%%cluster\nmissing_name + 1")
    assert error.ename == "CellError" and "NameError" in error.error_text
    assert "rank 0 (node 0)" in error.error_text


def status(kernel: Kernel) -> dict:
    """The cluster's status as data (``%cluster status`` shows it as text)."""
    return ast.literal_eval(kernel.run("_s = %cluster status\ndict(_s)").result)


def test_cluster_status_reads_as_a_summary_and_stays_data(kernel):
    """``%cluster status`` shows text a person reads (not a dict); its value is still data."""
    kernel.run("%%cluster --nodes 1 --gpus 2\n0")
    shown = kernel.run("%cluster status").result
    head, *rest = shown.splitlines()
    assert head.startswith("gang ") and "READY · 1×2 local" in head, shown
    assert "{" not in shown and "'detail'" not in shown
    assert re.fullmatch(r"  (< )?[\d.]+ rank-hours so far", rest[1]), shown
    data = status(kernel)
    assert data["unit"] == "rank-hours" and isinstance(data["gpu_hours"], float)


def test_output_streams_while_the_cell_runs(kernel):
    reply = kernel.run(
        "%%cluster --nodes 1 --gpus 2\nimport time\nprint('early', flush=True)\n"
        "time.sleep(3)\nprint('late')"
    )
    assert reply.status == "ok", reply.error_text
    early = min(t for t, text in reply.stream_times if "early" in text)
    assert reply.elapsed - early > 2, "the first line only arrived when the cell ended"


def test_config_and_environment_defaults(kernel):
    kernel.run("%config ClusterMagics.default_gpus = 3")
    spec = kernel.run("%cluster down\n%cluster config")
    assert "gpus=3" in spec.result
    kernel.run("%config ClusterMagics.default_gpus = None")
    kernel.run("import os\nos.environ['JUPYTER_MN_IDLE_TIMEOUT'] = '77'")
    assert "idle_timeout=77.0" in kernel.run("%cluster config").result
    kernel.run("del os.environ['JUPYTER_MN_IDLE_TIMEOUT']")


def test_warm_reuse_same_shape_replace_other_shape(kernel):
    kernel.run("%%cluster --nodes 2 --gpus 2\n1")
    first = status(kernel)
    assert kernel.run("%%cluster\n2").result == "2"  # bare: uses the gang that is up
    assert kernel.run("%%cluster --gpus 2\n2").result == "2"  # same shape: reused
    assert status(kernel)["id"] == first["id"]
    old = running_ranks()
    assert len(old) == 4
    kernel.run("%%cluster --nodes 1 --gpus 2\n3")
    now = status(kernel)
    assert now["shape"] == "1×2" and now["id"] != first["id"]
    assert not wait_gone(old)  # the replaced gang is gone


def test_auto_mode_runs_every_cell_on_the_gang(kernel):
    kernel.run("%%cluster --nodes 1 --gpus 2\n0")
    assert "auto mode on" in kernel.run("%cluster auto on").stdout
    assert kernel.run("import os\nint(os.environ['LOCAL_WORLD_SIZE'])").result == "2"
    kernel.run("%cluster auto off")
    assert kernel.run("import os\n'LOCAL_WORLD_SIZE' in os.environ").result == "False"


@pytest.mark.slow
def test_down_shutdown_and_restart_leave_nothing(no_leftovers):
    k = Kernel()
    try:
        assert k.run("%%cluster --nodes 2 --gpus 1\n1").result == "1"
        ranks = running_ranks(no_leftovers)
        assert len(ranks) == 2
        k.run("%cluster down")
        assert not wait_gone(ranks)
        assert k.run("%%cluster --nodes 1 --gpus 2\n1").result == "1"
        tree = k.descendants()
        k.shutdown(restart=True)
        assert not wait_gone(tree), "restart left processes of the old kernel"
        assert k.run("%%cluster --nodes 1 --gpus 1\n5").result == "5"
        tree = k.descendants()
    finally:
        k.shutdown()
    assert not wait_gone(tree), "shutdown left processes behind"


@pytest.mark.slow
def test_a_shut_down_kernel_closes_its_gang_and_exits_on_its_own(no_leftovers):
    """Not SIGTERMed by jupyter_client after 2.5 s (ipykernel signals its group's children first),
    and the registry says CLOSED, not ORPHANED."""
    from jupyter_mn.jobs.registry import Registry

    k = Kernel()
    try:
        assert k.run("%%cluster --nodes 2 --gpus 1 --name before-restart\n1").result == "1"
        k.shutdown(restart=True)
        assert Registry().resolve("before-restart").state == "CLOSED"
        assert k.run("%%cluster --nodes 2 --gpus 1 --name before-shutdown\n2").result == "2"
        kernel_process, tree = k.km.provisioner.process, k.descendants()
    finally:
        k.shutdown()
    assert kernel_process.wait(timeout=10) == 0
    assert Registry().resolve("before-shutdown").state == "CLOSED"
    assert not wait_gone(tree)


def test_a_cell_is_named_by_the_number_the_notebook_shows(kernel):
    kernel.run("x = 1")
    reply = kernel.run("%%cluster --nodes 1 --gpus 2\nif dist.get_rank() == 1:\n    1 / 0")
    n = reply.execution_count
    assert reply.status == "error" and n is not None
    assert f"Cell In[{n}], line 2" in reply.error_text, reply.error_text
    assert f"Cell In[{n + 1}]" not in reply.error_text
    busy = kernel.run("%%cluster --bg\nimport time\ntime.sleep(30)")
    again = kernel.run("%%cluster\n1")
    assert f"background cell In[{busy.execution_count}] is still running" in again.error_text
    assert kernel.run(f"Out[{busy.execution_count}].cancel()").status == "ok"
