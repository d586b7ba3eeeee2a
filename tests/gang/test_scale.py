"""A 16-node × 4 gang through a real kernel, widget and registry, its ranks light stand-ins.

The nodes are real dask workers running the real node agent; only the rank processes are
stand-ins (``standin_rank.py``) speaking the real rank protocol, so the kernel side (fan-out,
log delivery, the widget's IOPub budget, the registry) meets a gang wider than this machine
could run with torch. Numbers at 8–64 nodes are measured by ``bench/scale.py``, not here.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import RendezvousError
from jupyter_mn.jobs.registry import Registry
from jupyter_mn.node.process import RANK_PYTHON
from tests.support.kernels import Kernel
from tests.support.polling import wait_until
from tests.support.simulated import RegistryWrites, loud_cell, simulated_env

pytestmark = pytest.mark.scale

NODES, GPUS = 16, 4
WORLD = NODES * GPUS
#: Widget parts: the header, a log per node, GPUs, transport, notes.
PARTS = NODES + 4


@dataclass
class Gang:
    kernel: Kernel
    writes: RegistryWrites
    registry: Registry


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("/nonexistent/python rank.py", "'/nonexistent/python' is not an executable"),
        (f"{sys.executable} -c pass", f"failed to start (started as {sys.executable} -c pass)"),
    ],
)
def test_a_bad_rank_command_is_a_short_error_naming_it(monkeypatch, no_leftovers, command, says):
    # first in the module: the shared gang's background re-forming would count as leftovers
    monkeypatch.setenv(RANK_PYTHON, command)
    with pytest.raises(RendezvousError) as failed:
        Cluster(nodes=1, gpus=2).run("1")
    assert says in str(failed.value)
    assert len(str(failed.value)) < 300


@pytest.fixture(scope="module")
def gang() -> Iterator[Gang]:
    registry = Registry()  # the test session's private runtime dir, which the kernel inherits
    writes = RegistryWrites(registry.root)
    kernel = Kernel(env=simulated_env())
    try:
        up = kernel.run(f"%%cluster --nodes {NODES} --gpus {GPUS} --name scale --view text\nrank")
        assert up.status == "ok", up.error_text
        yield Gang(kernel, writes, registry)
    finally:
        kernel.run("%cluster down")
        kernel.shutdown()
        registry.close()


def test_a_cell_fans_out_to_every_rank_and_each_returns_its_value(gang):
    reply = gang.kernel.run("%%cluster --all\n(rank, world_size)")
    assert reply.status == "ok", reply.error_text
    assert ast.literal_eval(reply.result) == [(r, WORLD) for r in range(WORLD)]


def test_every_line_arrives_and_the_widget_keeps_to_ten_updates_a_second(gang):
    lines = 1000  # per rank: 64,000 in all, over about 2 s
    msgs = gang.kernel.iopub_during(
        f"%%cluster --view widget\n{loud_cell(lines, chunk=250, pause=0.5)}"
    )
    comms = [m for m in msgs if m["msg_type"] == "comm_msg"]
    shown = next(m for m in msgs if m["msg_type"] == "display_data")["received"]
    ended = [m for m in msgs if m["msg_type"] == "update_display_data"][-1]["received"]
    # one part per frame, at most ten frames a second, plus the first and the last full draw
    assert len(comms) <= 10 * (ended - shown) + 2 * PARTS, f"{len(comms)} in {ended - shown:.1f} s"
    sent = sum(len(json.dumps(m["content"])) for m in comms)
    assert sent / (ended - shown) < 500_000  # Jupyter's limit: 1 MB/s
    values: dict[str, str] = {}
    for m in comms:
        state = m["content"]["data"].get("state", {})
        if "value" in state:
            values[m["content"]["comm_id"]] = state["value"]
    tabs = {  # a node's log (the folded view at the end holds them all)
        int(n): v
        for v in values.values()
        if v.count('class="jp-mn-nodelog') == 1
        for n in re.findall(r'class="jp-mn-nodelog[^"]*" data-node="(\d+)"', v)
    }
    assert sorted(tabs) == list(range(NODES))
    for node, html in tabs.items():  # the view received every line of the node's ranks
        assert f"of {GPUS * lines} lines" in html, html[-200:]
        last_rank = node * GPUS + GPUS - 1
        assert f"[rank {last_rank}] rank {last_rank} line {lines - 1}" in html
    # and the registry's log files (the panel's source) have them all, once its recorder thread
    # has written them
    logs = gang.registry.log_dir(gang.registry.resolve("scale").id)

    def counts() -> list[int]:
        return [(logs / f"node-{n}.log").read_bytes().count(b" line ") for n in range(NODES)]

    wait_until(lambda: counts() == [GPUS * lines] * NODES, 30, f"the log files: {counts()}")


def test_registry_writes_per_cell_do_not_grow_with_the_nodes(gang):
    before = gang.writes.count()
    cells = 5
    for _ in range(cells):
        assert gang.kernel.run("%%cluster\nx = 1").status == "ok"
    writes = gang.writes.count() - before
    # RUNNING, READY and the cell's outcome coalesce into a write or two; a heartbeat may fall in
    assert writes <= 3 * cells + 1, writes


def test_a_failing_rank_is_the_root_cause_and_the_next_cell_runs(gang):
    failed = gang.kernel.run("%%cluster\nif rank == 37:\n    raise ValueError('boom 37')\nrank")
    assert failed.status == "error"
    assert "rank 37" in failed.error_text and "boom 37" in failed.error_text
    assert gang.kernel.run("%%cluster\nrank").result == "0"


def test_a_lost_rank_s_node_gets_fresh_stand_ins_and_the_next_cell_runs(gang):
    lost = gang.kernel.run("%%cluster\nimport os\nif rank == 21:\n    os._exit(3)\nrank")
    assert lost.status == "error"
    assert "rank 21" in lost.error_text and "exit code 3" in lost.error_text
    again = gang.kernel.run("%%cluster --all\nrank")  # waits for node 5's new ranks
    assert again.status == "ok", again.error_text
    assert ast.literal_eval(again.result) == list(range(WORLD))
