"""Live output in a real kernel, on one warm local gang: a progress bar redrawn with ``\\r``, rank
0's plots and tables, and a rank writing 100 MB without a newline.

Each gated cell waits for a file that the test writes only once the kernel has shown what the
test waits for (on IOPub: the widget's state, a stream, a display), so output that reaches the
notebook only when the cell ends fails the test: nothing is seen, and after ``GIVE_UP_S`` the
test opens the gate anyway so the cell can end, and fails.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kernels import Kernel, module_kernel
from tests.support.procs import node_of, rank_processes

SHAPE = "--nodes 1 --gpus 2"
GIVE_UP_S = 60.0
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

#: rank 0 draws a tqdm bar to 50 %, waits for the gate, then finishes it
BAR = """%%cluster {shape} --view {view}
import os, time
from tqdm import tqdm
if dist.get_rank() == 0:
    bar = tqdm(total=10, mininterval=0, ncols=60)
    for _ in range(5):
        bar.update(1)
    while not os.path.exists({gate!r}):
        time.sleep(0.02)
    for _ in range(5):
        bar.update(1)
    bar.close()
print("after the bar")
"""

#: rank 0 shows a figure, waits for the gate, then redraws it in place and shows a table
PLOT = """%%cluster {shape} --view {view}
import os, time
import matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt
from IPython.display import HTML, clear_output, display, update_display
if dist.get_rank() == 0:
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([1.0, 0.5, 0.25])
    display(fig)
    while not os.path.exists({gate!r}):
        time.sleep(0.02)
    for step in range(3):
        ax.plot([0.1 * step] * 3)
        clear_output(wait=True)
        display(fig)
    display(HTML("<b>loss table v1</b>"), display_id="table")
    update_display(HTML("<b>loss table v2</b>"), display_id="table")
    plt.close(fig)
"""

#: 100 MB without a newline, then the line ends and one more line follows
FLOOD = f"""%%cluster {SHAPE} --view text
import sys
chunk = "y" * 1_000_000
if dist.get_rank() == 0:
    for _ in range(100):
        sys.stdout.write(chunk)
    sys.stdout.flush()
    print()
print("flood done")
"""


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with module_kernel(f"%%cluster {SHAPE} --view text\n0") as k:  # one warm gang for all
        yield k


class Gate:
    """Opens (creates ``path``) when ``shown(msg)`` first holds, or after ``GIVE_UP_S``."""

    def __init__(self, path: Path, shown: Callable[[dict[str, Any]], bool]) -> None:
        self.path, self.shown = path, shown
        self.started = time.monotonic()
        self.seen_at: float | None = None

    def __call__(self, msg: dict[str, Any] | None) -> None:
        if self.path.exists():
            return
        if msg is not None and self.shown(msg):
            self.seen_at = msg["received"] - self.started
            self.path.touch()
        elif time.monotonic() - self.started > GIVE_UP_S:
            self.path.touch()


def widget_value(msg: dict[str, Any]) -> str:
    if msg["msg_type"] != "comm_msg":
        return ""
    return msg["content"]["data"].get("state", {}).get("value", "")


def live_rows(value: str) -> list[str]:
    return re.findall(r'<span class="jp-mn-live"[^>]*>([^<]*)</span>', value)


def test_a_progress_bar_redraws_in_place_in_the_widget_while_the_cell_runs(kernel, tmp_path):
    gate = Gate(tmp_path / "gate", lambda m: any("50%|" in r for r in live_rows(widget_value(m))))
    msgs = kernel.iopub_during(
        BAR.format(shape=SHAPE, view="widget", gate=str(gate.path)), on_msg=gate
    )
    assert gate.seen_at is not None, "the bar at 50 % was not shown before the cell ended"
    logs = [v for v in map(widget_value, msgs) if "data-node=" in v]
    assert all(len(live_rows(v)) <= 1 for v in logs)  # one line, redrawn: never appended
    final = logs[-1]
    assert "100%|" in final and "after the bar" in final and not live_rows(final)
    assert "50%|" not in final  # a redrawn state is not kept as a line of its own
    assert re.search(r'<span data-rank="0">\[rank 0\] 100%\|', final)  # tqdm's stderr: not red


def test_a_progress_bar_is_printed_now_and_then_by_the_text_view(kernel, tmp_path):
    def shown(msg: dict[str, Any]) -> bool:
        text = msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
        return "[node 0 rank 0]" in text and "50%|" in text

    gate = Gate(tmp_path / "gate", shown)
    msgs = kernel.iopub_during(
        BAR.format(shape=SHAPE, view="text", gate=str(gate.path)), on_msg=gate
    )
    assert gate.seen_at is not None, "the bar at 50 % was not printed before the cell ended"
    text = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    bars = [line for line in text.splitlines() if "%|" in line]
    assert bars[-1].startswith("[node 0 rank 0] 100%|")
    assert len(bars) <= 4, bars  # a few states while it waits, and the final one


@pytest.mark.parametrize("view", ["widget", "text"])
def test_rank_zero_plots_and_tables_show_while_the_cell_runs(kernel, tmp_path, view):
    def shown(msg: dict[str, Any]) -> bool:
        return msg["msg_type"] == "display_data" and "image/png" in msg["content"]["data"]

    gate = Gate(tmp_path / "gate", shown)
    msgs = kernel.iopub_during(
        PLOT.format(shape=SHAPE, view=view, gate=str(gate.path)), on_msg=gate
    )
    assert gate.seen_at is not None, "the figure was not shown before the cell ended"
    shown = [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
    views = {  # the cell's own output: its widget, folded when the cell ended
        m["content"].get("transient", {}).get("display_id")
        for m in shown
        if WIDGET_VIEW in m["content"]["data"]
    }
    outputs = [m for m in shown if m["content"].get("transient", {}).get("display_id") not in views]
    pngs = [m for m in outputs if "image/png" in m["content"]["data"]]
    first = pngs[0]
    assert first["msg_type"] == "display_data"
    slot = first["content"]["transient"]["display_id"]
    # redrawn in place: the same slot updated, no second figure output in the cell
    assert all(m["content"]["transient"]["display_id"] == slot for m in pngs)
    assert [m["msg_type"] for m in pngs[1:]] and {m["msg_type"] for m in pngs[1:]} == {
        "update_display_data"
    }
    tables = [
        m
        for m in outputs
        if "text/html" in m["content"]["data"] and "loss table" in m["content"]["data"]["text/html"]
    ]
    assert "loss table v2" in tables[-1]["content"]["data"]["text/html"]
    shown_ids = {m["content"]["transient"]["display_id"] for m in outputs}
    assert len(shown_ids) == 2  # the figure's slot and the table's: nothing shown twice


def test_a_line_of_100_mb_without_newline_is_cut_with_bounded_memory(kernel):
    rank0 = min(rank_processes(kernel.descendants()), key=lambda p: int(p.environ()["RANK"]))
    watched = {"agent": node_of(rank0).pid, "kernel": kernel.pid}
    before = {name: peak_rss_mib(pid) for name, pid in watched.items()}
    reply = kernel.run(FLOOD)
    assert reply.status == "ok", reply.error_text
    grew = {name: peak_rss_mib(pid) - before[name] for name, pid in watched.items()}
    print(f"peak RSS growth while rank 0 wrote 100 MB without a newline (MiB): {grew}")
    assert all(mib < 50 for mib in grew.values()), grew  # 100 MB held would be ≥ 100 MiB
    lines = [line for line in reply.stdout.splitlines() if line.startswith("[node 0 rank 0] ")]
    # the line as it ends: its head and what was cut (the text view also printed it unfinished)
    cut = [line for line in lines if "more characters of this line were cut" in line]
    assert len(cut) == 1 and "99,990,000 more characters" in cut[0], lines
    assert cut[0].startswith("[node 0 rank 0] " + "y" * 10_000 + " … [jupyter_mn: ")
    assert "[node 0 rank 0] flood done" in reply.stdout


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_cold_cells_widget_appears_while_the_gang_is_scheduled(kernel):
    kernel.run("%cluster down")
    msgs = kernel.iopub_during(f"%%cluster {SHAPE} --view widget\n1")
    first = next(i for i, m in enumerate(msgs) if m["msg_type"] == "display_data")
    assert " · SCHEDULING · " in msgs[first]["content"]["data"]["text/plain"]
    rendezvous = [i for i, m in enumerate(msgs) if "RENDEZVOUS" in widget_value(m)]
    assert rendezvous and first < rendezvous[0]


def test_under_the_widget_a_stopped_hangs_verdict_is_said_once_in_its_banner(kernel):
    cell = "import time\nt = torch.ones(1)\nif dist.get_rank() == 1:\n    time.sleep(60)\n"
    msgs = kernel.iopub_during(
        f"%%cluster {SHAPE} --view widget --timeout 3\n{cell}dist.all_reduce(t)"
    )
    error = next(m["content"] for m in msgs if m["msg_type"] == "error")
    assert error["evalue"] == "--timeout 3 s reached: the ranks hung (the verdict above)"
    assert not any("never entered" in line for line in error["traceback"])
    banners = [v for v in map(widget_value, msgs) if "HUNG: rank 1 (node 0) never entered" in v]
    assert banners  # the widget says it
