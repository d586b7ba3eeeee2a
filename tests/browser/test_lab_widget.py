"""The live widget in JupyterLab (real browser): a 2×2 cell with 2,000 lines per rank, Cancel
only while it runs, the node and rank filter, the folded view once it ended; and the GPU and
transport panels on recorded sample events (this machine has no GPU), whose screenshot is the
README's."""

from __future__ import annotations

import json
import math
import re

import pytest
from playwright.sync_api import expect

from jupyter_mn.node.nccllog import NcclLog
from jupyter_mn.wire.events import GangState, GpuSample, GpuStat, LogLines, to_msg
from tests.node.test_nccl import FIXTURES
from tests.support.lab import ARTIFACTS, run_command, wait_kernel_idle

pytestmark = pytest.mark.system

#: The ranks wait for this file, which the test writes once it has seen the cell running, and
#: for the second before they end, once the test has used the live widget's filter and tabs.
GO, DONE = "go-widget", "done-widget"
LOUD = (
    "%%cluster --nodes 2 --gpus 2\nimport os, time\n"
    f"while not os.path.exists({GO!r}):\n    time.sleep(0.05)\n"
    "for i in range(2000):\n"
    "    print(f'rank {dist.get_rank()} line {i}')\n"
    "    if i % 250 == 0:\n        time.sleep(0.25)\n"
    f"while not os.path.exists({DONE!r}):\n    time.sleep(0.05)\n"
    "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
)


def last_line_in_view(page, node: int) -> bool:
    """Is the end of a node's log visible inside its box (scrolled to the tail)?"""
    return page.evaluate(
        """node => { const pre = document.querySelector(`pre[data-node="${node}"]`);
        const box = pre.parentElement; box.scrollIntoView();
        let text = pre.lastChild; while (text && text.nodeType !== 3) text = text.lastChild;
        const range = document.createRange();
        range.setStart(text, Math.max(0, text.length - 4)); range.setEnd(text, text.length);
        const at = range.getBoundingClientRect(), frame = box.getBoundingClientRect();
        return at.height > 0 && at.top >= frame.top - 1 && at.bottom <= frame.bottom + 1; }""",
        node,
    )


def test_widget_shows_each_node_its_ranks_state_gpus_and_transport(lab, page):
    """Live: a tab per node, a rank filter, the tail in view. Ended: one plain output with every
    node's lines, and no widget model left (the page holds none for a finished cell)."""
    page.goto(lab.notebook("widget.ipynb", [LOUD, "%cluster down"]))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-all-cells")
    state = page.locator(".jp-mn-state").first
    cancel = page.locator("button.jp-mn-cancel").first
    expect(state).to_have_text("RUNNING", timeout=120_000)
    expect(cancel).to_be_visible()
    expect(cancel).to_be_enabled()
    (lab.root / GO).touch()  # the kernel's working directory: the ranks' too
    node0, node1 = page.locator('pre[data-node="0"]'), page.locator('pre[data-node="1"]')
    expect(node0).to_contain_text("[rank 0] rank 0 line 1999", timeout=120_000)
    expect(node0).to_contain_text("[rank 1] rank 1 line 1999", timeout=30_000)
    expect(node0).not_to_contain_text("[rank 2]")
    expect(node1).to_be_visible()  # every node's lines in view, no click
    assert last_line_in_view(page, 0)  # the tail is in view, not scrolled away
    choose = page.locator(".jp-mn-filter select")
    expect(choose.locator("option")).to_have_text(["all ranks", *(f"rank {r}" for r in range(4))])
    choose.select_option(label="rank 1")
    expect(node0).to_contain_text("[rank 1] rank 1 line 1999", use_inner_text=True)
    expect(node0).not_to_contain_text("[rank 0]", use_inner_text=True)
    expect(node1).to_be_hidden()  # no line of rank 1's there
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".jp-mn-nodelog", has=node0).screenshot(path=str(ARTIFACTS / "widget-rank-1.png"))
    page.locator(".jp-mn-filterbutton", has_text="node 1").click()
    expect(choose.locator("option")).to_have_text(["all ranks", "rank 2", "rank 3"])
    expect(node0).to_be_hidden()
    expect(node1).to_contain_text("[rank 3] rank 3 line 1999", timeout=30_000)
    assert last_line_in_view(page, 1)
    (lab.root / DONE).touch()
    expect(state).to_have_text("DONE", timeout=120_000)
    expect(cancel).to_be_hidden()
    # folded: both nodes' lines in view at once, no filter
    expect(node0).to_contain_text("[rank 0] rank 0 line 1999")
    expect(node1).to_be_visible()
    expect(node1).to_contain_text("[rank 2] rank 2 line 1999")
    expect(page.locator(".jp-mn-filter")).to_have_count(0)
    expect(page.locator(".jp-mn-header").first).to_contain_text("2×2 local · no GPU")
    expect(page.locator(".jp-mn-gpu")).to_have_count(0)  # said once, in the header
    result = page.locator(".jp-OutputArea-executeResult .jp-OutputArea-output").first
    expect(result).to_have_text("4.0")
    expect(page.get_by_text("cluster released")).to_have_count(1, timeout=30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".jp-mn-state").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "widget-2x2-2000-lines.png"))
    assert "IOPub message rate exceeded" not in page.content()
    assert "IOPub data rate exceeded" not in page.content()


def test_cancel_button_interrupts_the_cells_ranks(lab, page):
    cells = ["%%cluster --nodes 1 --gpus 2\nimport time\ntime.sleep(120)", "%cluster down"]
    page.goto(lab.notebook("cancel.ipynb", cells))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell-and-select-next")
    state = page.locator(".jp-mn-state").first
    expect(state).to_have_text("RUNNING", timeout=120_000)
    cancel = page.locator("button.jp-mn-cancel").first
    expect(cancel).to_be_enabled()
    cancel.click()
    expect(page.locator(".jp-OutputArea-output", has_text="CellInterrupted")).to_have_count(
        1, timeout=20_000
    )
    expect(state).to_have_text("INTERRUPTED", timeout=20_000)  # in orange, not a green READY
    expect(state).to_have_css("color", "rgb(227, 116, 0)")
    expect(page.locator(".jp-mn-header").first).to_contain_text("gang READY")
    expect(cancel).to_be_hidden()
    expect(page.locator(".jp-mn-header").first).to_contain_text("no GPU")
    run_command(page, "notebook:move-cursor-down")  # clicking Cancel selected the first cell
    run_command(page, "notebook:run-cell")  # the next cell (down) runs: the kernel is fine
    expect(page.get_by_text("cluster released")).to_have_count(1, timeout=30_000)


def sample_events() -> list[dict]:
    """Recorded-looking events of a 2×4 RDMA gang: a minute of GPU samples (made up: this machine
    has no GPU), NCCL's transport from the fixtures' real logs, a few training lines."""
    events: list = [GangState("RUNNING")]
    for t in range(60):
        for node in range(2):
            gpus = tuple(
                GpuStat(
                    g,
                    "NVIDIA H100 80GB HBM3",
                    max(0, min(100, round(86 + 12 * math.sin(t / 4 + g + 2 * node)))),
                    round(1024 * (52 + 2 * g + 3 * node + t / 20)),
                    81559,
                    560.0 + 40 * math.sin(t / 5 + g),
                    63 + g,
                    (node * 4 + g,),
                )
                for g in range(4)
            )
            events.append(GpuSample(node, gpus))
    for node, log in enumerate(["ib_gdrdma", "socket_fallback"]):
        lines = (FIXTURES / f"{log}.log").read_text().splitlines()
        events.append(NcclLog().feed_all(lines).report(node))
    for step in range(0, 260, 20):
        for node in range(2):
            items = tuple(
                (r, "out", (f"epoch 3 step {step}/500 loss {1.9 / (1 + step / 100 + r / 50):.4f}",))
                for r in range(node * 4, node * 4 + 4)
            )
            events.append(LogLines(node, step, items))
    return [to_msg(e) for e in events]


REPLAY = """from jupyter_mn.wire.events import from_msg
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.views.widget import ClusterWidget
import json
widget = ClusterWidget(ClusterSpec(nodes=2, gpus=4, rdma=True), title="SAMPLE DATA")
for msg in json.load(open("sample-events.json")):
    widget(from_msg(msg))"""


def test_gpu_bars_and_transport_badges_on_recorded_sample_events(lab, page):
    """The real widget in a real kernel and browser, fed sample events (no GPU here)."""
    (lab.root / "sample-events.json").write_text(json.dumps(sample_events()))
    page.set_viewport_size({"width": 1000, "height": 1200})  # the whole widget in view
    page.goto(lab.notebook("glance.ipynb", [REPLAY]))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-all-cells")
    widget = page.locator(".jp-OutputArea-output", has=page.locator(".jp-mn-state")).first
    gpus, transport = widget.locator(".jp-mn-gpu"), widget.locator(".jp-mn-transport")
    expect(gpus.locator(".jp-mn-gpurow")).to_have_count(8, timeout=60_000)
    spark = gpus.locator(".jp-mn-spark polyline").first
    expect(spark).to_have_attribute("points", re.compile(r"^(\S+ ){59}\S+$"))  # a minute
    expect(transport.locator(".jp-mn-good", has_text="RDMA IB")).to_have_count(1)
    expect(transport.locator(".jp-mn-bad", has_text="TCP socket")).to_have_count(1)
    expect(transport.locator(".jp-mn-alarm")).to_contain_text("NCCL uses TCP sockets")
    expect(widget.locator("pre[data-node='0']")).to_contain_text("[rank 3] epoch 3 step 240")
    ARTIFACTS.mkdir(exist_ok=True)
    widget.screenshot(path=str(ARTIFACTS / "widget-sample-gpus.png"))
