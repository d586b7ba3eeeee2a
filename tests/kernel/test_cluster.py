"""The Python API on real local gangs: real dask workers, real rank processes, gloo."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import time

import psutil
import pytest
import torch

from jupyter_mn import Cluster
from jupyter_mn.errors import CellError, SpecError
from jupyter_mn.kernel.cell import CACHE_MIN_BYTES
from jupyter_mn.views import TextView
from jupyter_mn.wire.cellendpoint import CellEndpoint
from tests.support.bigvalue import MAPPED, check_big_push, check_big_value
from tests.support.procs import open_files, ours, rank_processes, wait_gone

ENV_CHECK = """
import json, os, torch.distributed as dist
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES",
        "MASTER_ADDR", "MASTER_PORT"]
env = {k: os.environ[k] for k in keys}
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
json.dumps({"env": env, "sum": t.item(), "rank": dist.get_rank(), "ws": dist.get_world_size(),
            "info": cluster_info().__dict__, "backend": dist.get_backend()})
"""


@pytest.mark.parametrize(("nodes", "gpus"), [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_env_contract_and_all_reduce_on_every_shape(nodes, gpus, no_leftovers):
    with Cluster(nodes=nodes, gpus=gpus) as cluster:
        result = cluster.run(ENV_CHECK, return_all=True)
        assert result.ok, result.unwrap()
        rows = [json.loads(v) for v in result.values]
    world = nodes * gpus
    ports = {r["env"]["MASTER_PORT"] for r in rows}
    assert len(rows) == world and len(ports) == 1
    for rank, row in enumerate(rows):
        env = row["env"]
        assert row["rank"] == rank == int(env["RANK"]) and row["ws"] == world
        assert int(env["WORLD_SIZE"]) == world and int(env["NNODES"]) == nodes
        assert int(env["LOCAL_WORLD_SIZE"]) == gpus
        assert int(env["NODE_RANK"]) == rank // gpus and int(env["LOCAL_RANK"]) == rank % gpus
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert row["sum"] == world * (world - 1) / 2
        assert row["backend"] == "gloo"
        info = row["info"]
        assert (info["rank"], info["node_rank"], info["nnodes"]) == (rank, rank // gpus, nodes)
        assert info["device"] == "cpu" and len(info["nodes"]) == nodes


def test_rank0_value_state_and_notebook_names(gang_2x2):
    ns: dict = {}
    exec("SCALE = 10\ndef f(x):\n    return x * SCALE\nclass Acc:\n    total = 0\n", ns)
    first = gang_2x2.run("acc = Acc()\nacc.total = f(dist.get_rank())\nacc.total", namespace=ns)
    assert first.value == 0 and first.ok
    later = gang_2x2.run("acc.total + 1", namespace=ns, return_all=True)
    assert later.values == [1, 11, 21, 31]
    assert [r.status for r in later.ranks] == ["ok"] * 4


def test_a_semicolon_keeps_the_value_on_the_rank(gang_2x2):
    """IPython's rule, which the ranks remember per cell text (execute.py): it holds for the
    same text run again, too."""
    for _ in range(2):
        assert gang_2x2.run("7;").value is None
        assert gang_2x2.run("7").value == 7


def test_a_cell_goes_on_the_cell_stream_large_captured_names_too(gang_2x2, monkeypatch):
    """docs/architecture.md, "The cell stream": with the actor path for cells broken, a warm
    cell still runs (its request went on the stream), and so does one with 100 KB of captured
    names."""
    actor_cells: list[list[int] | None] = []
    agents = gang_2x2.gang.core.nodes
    real = agents.call_each
    monkeypatch.setattr(
        agents, "call_each", lambda call, nodes=None: (actor_cells.append(nodes), real(call, nodes))
    )
    assert gang_2x2.run("dist.get_rank() + 40").value == 40
    blob = b"x" * 100_000
    result = gang_2x2.run("len(blob) + dist.get_world_size()", namespace={"blob": blob})
    assert result.value == 100_004 and actor_cells == []


def test_a_big_notebook_array_reaches_every_rank_intact_in_one_copy_per_node(gang_2x2):
    check_big_push(gang_2x2, mib=64)


def test_a_big_notebook_array_over_tls_reaches_every_rank_in_one_copy_per_node(
    monkeypatch, no_leftovers
):
    """Where the agent is not on the kernel's host the request carries the array (TLS), and the
    agent writes the one memfd its ranks map."""
    monkeypatch.setattr(CellEndpoint, "local", lambda self: False)
    with Cluster(nodes=1, gpus=2) as cluster:
        cluster.run("1").unwrap()
        (channel,) = cluster.gang.core.nodes._cells._channels.values()
        assert channel.sock.family == socket.AF_INET and not channel.local
        check_big_push(cluster, mib=16)


def test_a_pushed_array_is_one_copy_on_this_host_that_a_rank_writes_only_for_itself(gang_2x2):
    """The kernel's one memfd is mapped by every rank of the host's agents; a rank that writes
    to the array copies the pages it writes (its peers and the next cell see the notebook's)."""
    import numpy as np

    ns = {"arr": np.arange(4 << 20, dtype=np.int64)}  # 32 MiB
    gang_2x2.run(MAPPED).unwrap()
    where = gang_2x2.run("_mapped(arr.ctypes.data)", namespace=ns, return_all=True).unwrap()
    assert len(set(map(tuple, where))) == 1 and where[0][2].startswith("/memfd:jupyter-mn-arr")
    wrote = "if dist.get_rank() == 1:\n    arr[:3] = -1\nint(arr[:3].sum())"
    assert gang_2x2.run(wrote, namespace=ns, return_all=True).unwrap() == [3, -3, 3, 3]
    assert gang_2x2.run("int(arr[:3].sum())", namespace=ns, return_all=True).unwrap() == [3] * 4
    gang_2x2.run("1").unwrap()  # the kernel's file goes with the next request: the ranks hold it
    assert not [path for path in open_files() if "jupyter-mn-arr" in path]


def test_a_notebook_tensor_travels_as_its_memory_into_the_shared_copy(gang_2x2):
    import torch

    ns = {"weights": torch.rand(2 << 20, generator=torch.Generator().manual_seed(4))}  # 8 MiB
    gang_2x2.run(MAPPED).unwrap()
    digest = "hashlib.sha256(weights.numpy()).hexdigest()"
    cell = f"import hashlib\n_mapped(weights.data_ptr())[2], {digest}, type(weights).__name__"
    rows = gang_2x2.run(cell, namespace=ns, return_all=True).unwrap()
    assert {(path.split(" ")[0], kind) for path, _, kind in rows} == {
        ("/memfd:jupyter-mn-weights", "Tensor")
    }
    assert {got for _, got, _ in rows} == {hashlib.sha256(ns["weights"].numpy()).hexdigest()}


def test_a_big_notebook_array_sent_as_actor_calls_arrives_the_same(gang_2x2, monkeypatch):
    """Where the kernel has no cell stream to an agent (a port-forward, a gateway), the same
    names go through dask's actor call, and the agent shares them with its ranks alike."""
    agents = gang_2x2.gang.core.nodes
    monkeypatch.setattr(agents, "stream_cell", lambda payload, run_id: list(range(agents.count)))
    check_big_push(gang_2x2, mib=64)


TENSORS = """
g = torch.Generator().manual_seed(dist.get_rank())
big = torch.rand(9 * 2**20, generator=g)  # 36 MiB: many TLS records, many reads
tensors = {
    "big": big,
    "bf16": torch.rand(3, 5, generator=g).to(torch.bfloat16),
    "strided": torch.arange(24.0).reshape(4, 6)[:, ::2],
    "view": big[10:14],
    "scalar": torch.tensor(2.5),
    "empty": torch.zeros(0, 3, dtype=torch.int64),
    "grad": torch.ones(2, requires_grad=True),
    "param": torch.nn.Parameter(torch.ones(2)),
    "bool": torch.tensor([True, False]),
}
"""


def test_tensor_values_arrive_whole_in_every_dtype_and_layout(gang_2x2):
    """A tensor travels as its memory (``wire/values.py``): the same bytes, dtype, shape and
    grad flag; a view sends its own elements, not its storage; a Parameter stays one."""
    import torch

    gang_2x2.run(TENSORS).unwrap()
    digest = "hashlib.sha256(tensors['big'].numpy().tobytes()).hexdigest()"
    sent = gang_2x2.run(f"import hashlib\n{digest}").unwrap()
    got = gang_2x2.run("tensors").unwrap()
    assert hashlib.sha256(got["big"].numpy().tobytes()).hexdigest() == sent
    g = torch.Generator().manual_seed(0)
    big = torch.rand(9 * 2**20, generator=g)
    assert torch.equal(got["bf16"], torch.rand(3, 5, generator=g).to(torch.bfloat16))
    assert got["bf16"].dtype == torch.bfloat16
    assert torch.equal(got["strided"], torch.arange(24.0).reshape(4, 6)[:, ::2])
    assert torch.equal(got["view"], big[10:14]) and got["view"].untyped_storage().nbytes() == 16
    assert got["scalar"].shape == () and got["scalar"].item() == 2.5
    assert got["empty"].shape == (0, 3) and got["empty"].dtype == torch.int64
    assert got["grad"].requires_grad and not got["bool"].requires_grad
    assert isinstance(got["param"], torch.nn.Parameter)
    assert got["bool"].tolist() == [True, False]


def test_a_big_value_and_its_bytes_arrive_intact(gang_2x2):
    check_big_value(gang_2x2, mib=64)


def test_a_big_value_on_this_host_is_one_file_the_kernel_maps_and_no_process_keeps_open(gang_2x2):
    """On the kernel's host rank 0's big value (and a ``--pull``ed one) is written once, into a
    sealed memfd its agent passes on and the kernel maps copy-on-write (``wire/valuefiles.py``):
    the value's memory here is that file's, it is the kernel's to change, and the rank, the
    agent and the kernel have all closed their descriptors of it."""
    code = "import torch\nx = torch.arange(4 << 20, dtype=torch.int32)\npulled = x * 2\nx"
    result = gang_2x2.run(code, pull=["pulled"])
    value, pulled = result.unwrap(), result.pulled["pulled"]
    assert torch.equal(value, torch.arange(4 << 20, dtype=torch.int32))
    assert torch.equal(pulled, value * 2)
    scope = {}
    exec(MAPPED, scope)
    for tensor in (value, pulled):
        assert scope["_mapped"](tensor.data_ptr())[2].startswith("/memfd:jupyter-mn-value")
    value.add_(1)  # copy-on-write: the kernel's own
    held = [
        (p.pid, path)
        for p in [*ours(), psutil.Process()]
        for path in open_files(p.pid)
        if "jupyter-mn-value" in path
    ]
    assert not held


def test_large_bytes_travel_out_of_band_and_come_back_as_they_were():
    """``bytes``/``bytearray`` over ``OUT_OF_BAND_BYTES`` leave the pickle (as arrays do), deep
    in a value too; short ones stay in it."""
    from jupyter_mn.rank.execute import dumps
    from jupyter_mn.wire.values import OUT_OF_BAND_BYTES

    big, mutable = b"\x01" * OUT_OF_BAND_BYTES, bytearray(b"\x02" * OUT_OF_BAND_BYTES)
    pickled = dumps({"a": [big, (mutable, b"short")]})
    assert len(pickled.buffers) == 2 and len(pickled.data) < 1000
    back = pickled.loads()
    assert back == {"a": [big, (mutable, b"short")]}
    assert type(back["a"][0]) is bytes and type(back["a"][1][0]) is bytearray


def test_the_same_large_bytes_twice_in_a_value_travel_once_and_arrive_as_one_object():
    from jupyter_mn.rank.execute import dumps
    from jupyter_mn.wire.values import OUT_OF_BAND_BYTES

    big, other = b"\x01" * OUT_OF_BAND_BYTES, bytearray(OUT_OF_BAND_BYTES)
    pickled = dumps([big, {"again": big}, other, other])
    assert len(pickled.buffers) == 2
    back = pickled.loads()
    assert back == [big, {"again": big}, other, other]
    assert back[0] is back[1]["again"] and back[2] is back[3] and back[0] is not big


def test_a_value_over_max_value_is_refused_on_the_rank_and_the_gang_carries_on(gang_2x2):
    """Refused before anything is sent: the cell fails naming the size and the flag; the
    namespaces stay, and so does the next cell's value. ``--pull`` and ``--all`` alike."""
    spec = gang_2x2.spec
    gang_2x2.adopt(spec.replace(max_value=1 << 20))
    try:
        result = gang_2x2.run("kept = 5\nbytes(2 << 20)")
        assert not result.ok and result.value is None
        cause = result.root_cause
        assert (cause.rank, cause.error.ename) == (0, "ValueTooLarge")
        assert "2.0 MiB pickled, over --max-value 1.0 MiB" in cause.error.evalue
        with pytest.raises(CellError, match="--max-value"):
            result.unwrap()
        pulled = gang_2x2.run("blob = bytes(2 << 20)", pull=["blob"])
        assert "--pull blob is 2.0 MiB" in pulled.root_cause.error.evalue
        each = gang_2x2.run("bytes(2 << 20) if dist.get_rank() == 3 else 1", return_all=True)
        assert each.root_cause.rank == 3 and each.root_cause.error.ename == "ValueTooLarge"
        assert gang_2x2.run("kept + 1").value == 6
    finally:
        gang_2x2.adopt(spec)


def test_pull_copies_names_from_rank_zero(gang_2x2):
    result = gang_2x2.run("w = {'rank': dist.get_rank(), 'x': torch.arange(3)}", pull=["w"])
    assert result.value is None
    assert result.pulled["w"]["rank"] == 0 and result.pulled["w"]["x"].tolist() == [0, 1, 2]


def test_output_of_every_rank_is_labelled_and_ordered(gang_2x2):
    out, err = io.StringIO(), io.StringIO()
    code = (
        "import sys, os\nfor i in range(50):\n    print('line', i)\n"
        "print('to stderr', file=sys.stderr)\nos.system('echo from-libc')\n"
    )
    assert gang_2x2.run(code, on_event=TextView(out, err)).ok
    lines = out.getvalue().splitlines()
    for rank in range(4):
        node = rank // 2
        mine = [ln for ln in lines if ln.startswith(f"[node {node} rank {rank}] ")]
        assert [ln.split("] ")[1] for ln in mine] == [f"line {i}" for i in range(50)] + [
            "from-libc"
        ]
        assert f"[node {node} rank {rank}] to stderr" in err.getvalue()


def test_display_and_magics_work_inside_the_cell(gang_2x2):
    result = gang_2x2.run("from IPython.display import display\ndisplay({'k': 1})\n%time z = 2\nz")
    assert result.value == 2
    assert result.displays[0]["data"]["text/plain"] == "{'k': 1}"


def test_name_error_names_the_rank_and_the_gang_survives(gang_2x2):
    result = gang_2x2.run("x = 1\nnot_defined_anywhere + x")
    assert not result.ok
    cause = result.root_cause
    assert cause.error.ename == "NameError" and cause.status == "error"
    with pytest.raises(CellError) as info:
        result.unwrap()
    rendered = "\n".join(info.value._render_traceback_())
    assert "rank " in rendered and "NameError" in rendered and "line 2" in rendered
    assert gang_2x2.run("x").value == 1  # namespaces survived


def test_one_rank_raising_ends_the_cell_with_its_traceback(gang_2x2):
    result = gang_2x2.run(
        "t = torch.ones(1)\nif dist.get_rank() == 2:\n    raise ValueError('boom on 2')\n"
        "dist.all_reduce(t)\n"
    )
    cause = result.root_cause
    assert (cause.rank, cause.node, cause.error.ename) == (2, 1, "ValueError")
    assert any("line 3" in line for line in cause.error.traceback)
    after = gang_2x2.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
    assert after.value == 4.0


def test_unpicklable_value_comes_back_as_its_repr(gang_2x2):
    result = gang_2x2.run("import threading\nthreading.Lock()")
    assert "lock" in repr(result.value)
    assert any("could not be sent" in n for n in result.notes)


def test_bad_input_raises_before_anything_starts(no_leftovers):
    cluster = Cluster(nodes=2, gpus=1)
    with pytest.raises(SpecError, match="SyntaxError in the cell, line 1"):
        cluster.run("def (:")
    with pytest.raises(SpecError, match="empty"):
        cluster.run("")
    with pytest.raises(SpecError, match="hang_timeout must be 0"):
        cluster.run("1", hang_timeout=-1)
    assert cluster.gang is None and not rank_processes(ours(no_leftovers))
    with pytest.raises(SpecError, match="nodes must be ≥ 1"):
        Cluster(nodes=0)


def test_a_cold_cells_view_hears_of_scheduling_before_the_ranks_start(no_leftovers):
    """The view is shown with its first event: the SCHEDULING transition reaches it while the
    nodes are provisioned, not once the start waits for the ranks (RENDEZVOUS)."""
    cluster = Cluster(nodes=1, gpus=2)
    heard: list[tuple[str, str]] = []  # (the event, the gang's state when the view got it)

    def view(event) -> None:
        heard.append((type(event).__name__, cluster.gang.core.status.value))

    try:
        assert cluster.run("1", on_event=view).ok
    finally:
        cluster.close()
    assert heard[0] == ("GangState", "SCHEDULING")


def test_close_stops_every_process(no_leftovers):
    cluster = Cluster(nodes=2, gpus=1)
    cluster.run("1")
    procs = ours(no_leftovers)
    assert len(rank_processes(procs)) == 2
    cluster.close()
    assert not wait_gone(procs)
    assert cluster.status()["state"] == "DOWN"


class Pickled:
    """Counts how often the kernel pickles it; the ranks get plain bytes."""

    count = 0

    def __reduce__(self) -> tuple:
        Pickled.count += 1
        return (bytes, (b"x" * CACHE_MIN_BYTES,))


def test_idle_gang_is_released_and_comes_back(no_leftovers):
    cluster = Cluster(nodes=1, gpus=1, idle_timeout=1)
    blob = {"blob": Pickled()}
    assert cluster.run("len(blob)", namespace=blob).value == CACHE_MIN_BYTES
    assert Pickled.count == 1  # once per cell, the first of a new gang too
    procs = ours(no_leftovers)
    deadline = time.monotonic() + 30
    while cluster.status()["state"] != "RELEASED":  # the idle timer fires on its own thread
        assert time.monotonic() < deadline, cluster.status()
        time.sleep(0.05)
    assert not wait_gone(procs)
    assert cluster.run("2").value == 2  # a later cell brings a fresh gang
    # whose new ranks get the large value in full, though the old ones held it
    assert cluster.run("len(blob)", namespace=blob).value == CACHE_MIN_BYTES
    assert Pickled.count == 2
    cluster.close()


def test_seed_gives_each_rank_seed_plus_rank_and_env_reaches_ranks(no_leftovers):
    with Cluster(nodes=1, gpus=2, env={"MY_SETTING": "on"}) as cluster:
        code = (
            "import os, random, numpy\n"
            "(random.random(), float(numpy.random.rand()), torch.rand(1).item(), "
            "os.environ['MY_SETTING'])"
        )
        first = cluster.run(code, seed=7, return_all=True).values
        again = cluster.run(code, seed=7, return_all=True).values
    assert first == again and first[0] != first[1]
    for rank, (py, np_, th, setting) in enumerate(first):
        import random

        import numpy
        import torch

        random.seed(7 + rank)
        numpy.random.seed(7 + rank)
        torch.manual_seed(7 + rank)
        assert (py, np_, th) == (random.random(), float(numpy.random.rand()), torch.rand(1).item())
        assert setting == "on"
