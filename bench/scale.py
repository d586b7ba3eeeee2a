"""Scale, simulated: N nodes × 8 ranks on one machine; prints a table, plots docs/scale.png.

Every node is a real dask worker running the real node agent; its rank processes are light
stand-ins (``jupyter_mn/rank/standin.py``, started through ``JUPYTER_MN_RANK_PYTHON``) that speak
the real rank protocol without torch, so 64 nodes × 8 ranks fit here. This process is the kernel
side (the Python API, which the magics call), and for each N it measures:

* start: ``Cluster.up()`` until every rank is ready;
* warm cell: ``run("x = 1")`` round trip (median);
* kernel CPU per node per cell: this process's CPU time (all its threads: the dask client, the
  heartbeat, the recorder; the local backend's dask scheduler is a process of its own) over the
  warm cells, per cell and node (goal ≤ 0.3 ms); and the same net of what the process spends
  idle (measured over a quiet while first: the kernel's heartbeat, the client hearing the
  scheduler), since that grows with the cells' wall time on a loaded machine;
* fan-out: from ``run()`` until the last rank starts the cell (each rank's ``time.time()``,
  one clock here; median);
* registry writes per warm cell (SQLite triggers count the job rows written);
* log throughput: every rank prints ``--lines`` lines; lines that reached the kernel over the
  time from ``run()`` to the last one (goal ≥ 200k lines/s), checked complete: every rank's
  count, no gap in any node's batch numbers, and the lines in the registry's log files. "late":
  lines that came after the cell's result (its drain gave up), "view dropped": batches the
  cell's view lost (the kernel's inbox is bounded), "lost": lines that never came;
* widget: that cell's ``ClusterWidget`` (no frontend attached: its own count of the comm
  updates it sends while the cell runs, its first and last full draws left out) messages and
  bytes per second (goal ≤ 10 msg/s);
* memory: resident memory of the nodes and ranks (RSS, shared pages counted per process).

Run: ``python -m bench.scale [--nodes 8 16 32 64] [--cells 20] [--lines 2000]`` (about 6 min on
2 cores; the ``bench`` extra brings matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

RUNTIME_DIR = os.environ["JUPYTER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="jmn-bench-scale-")
from tests.support.simulated import LineCount, RegistryWrites, loud_cell, simulated_env  # noqa: E402

os.environ.update(simulated_env())

from jupyter_mn import Cluster, ClusterSpec  # noqa: E402
from jupyter_mn.jobs.registry import Registry  # noqa: E402
from jupyter_mn.views.widget import ClusterWidget  # noqa: E402

GPUS = 8
CPU_GOAL_MS, LINES_GOAL, WIDGET_GOAL = 0.3, 200_000, 10.0
IDLE_S = 3.0


@dataclass
class Row:
    nodes: int
    start_s: float
    cell_ms: float
    cpu_ms_per_node: float
    net_cpu_ms_per_node: float
    idle_cpu_pct: float
    fanout_ms: float
    registry_writes: float
    lines_per_s: float
    late_lines: int
    view_dropped: int
    lost_lines: int
    widget_msgs_per_s: float
    widget_bytes_per_s: float
    memory_gb: float


def memory_gb() -> float:
    total = 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**30


def logged_lines(registry: Registry, job: str) -> int:
    return sum(
        f.read_bytes().count(b"\n")
        for f in registry.log_dir(job).glob("node-*.log*")
        if f.is_file()
    )


def measure(nodes: int, cells: int, lines: int, writes: RegistryWrites) -> Row:
    started = time.perf_counter()
    cluster = Cluster(nodes=nodes, gpus=GPUS)
    try:
        gang = cluster.up()
        start_s = time.perf_counter() - started
        for _ in range(3):  # warm-up
            cluster.run("x = 1").unwrap()
        idle_cpu, t0 = time.process_time(), time.perf_counter()
        time.sleep(IDLE_S)  # the process's own background work, with no cell running
        idle_rate = (time.process_time() - idle_cpu) / (time.perf_counter() - t0)
        walls, fanouts = [], []
        cpu, before, began = time.process_time(), writes.count(), time.perf_counter()
        for _ in range(cells):
            t0 = time.time()
            cluster.run("x = 1").unwrap()
            walls.append(time.time() - t0)
        cpu = time.process_time() - cpu
        net_cpu = cpu - idle_rate * (time.perf_counter() - began)
        registry_writes = (writes.count() - before) / cells
        for _ in range(max(3, cells // 4)):
            t0 = time.time()
            started_at = cluster.run("import time\ntime.time()", return_all=True).unwrap()
            fanouts.append(max(started_at) - t0)
        count = LineCount()
        gang.core.hub.subscribe(count)
        dropped = gang.core.hub.inbox.dropped
        widget = ClusterWidget(ClusterSpec(nodes=nodes, gpus=GPUS), title="loud")
        with contextlib.redirect_stdout(io.StringIO()):  # no frontend: display() prints
            widget.show()  # its first full draw is not counted, nor its last (close)
            shown = widget.updates, widget.sent_bytes
            t0 = time.perf_counter()
            cluster.run(loud_cell(lines), on_event=widget).unwrap()
            elapsed = time.perf_counter() - t0
            drawn = widget.updates - shown[0], widget.sent_bytes - shown[1]
            widget.close()
        expected = nodes * GPUS * lines
        at_result = count.lines
        deadline = time.monotonic() + 120
        while count.lines < expected and time.monotonic() < deadline:
            time.sleep(0.1)  # polling for late lines, with a deadline
        delivered = count.last_at - t0
        short = sum(max(lines - count.per_rank[r], 0) for r in range(nodes * GPUS))
        if count.gaps or count.lines != expected:
            print(f"  {nodes} nodes: {count.lines}/{expected} lines, {count.gaps} gaps")
        dropped = gang.core.hub.inbox.dropped - dropped
        mem = memory_gb()
    finally:
        cluster.close()
    on_disk = logged_lines(Registry(), gang.core.id)
    if on_disk != expected:
        print(f"  {nodes} nodes: {on_disk}/{expected} lines in the registry's log files")
    return Row(
        nodes=nodes,
        start_s=start_s,
        cell_ms=statistics.median(walls) * 1e3,
        cpu_ms_per_node=cpu / cells / nodes * 1e3,
        net_cpu_ms_per_node=net_cpu / cells / nodes * 1e3,
        idle_cpu_pct=idle_rate * 100,
        fanout_ms=statistics.median(fanouts) * 1e3,
        registry_writes=registry_writes,
        lines_per_s=count.lines / delivered,
        late_lines=expected - at_result,
        view_dropped=dropped,
        lost_lines=short + max(expected - on_disk, 0),
        widget_msgs_per_s=drawn[0] / elapsed,
        widget_bytes_per_s=drawn[1] / elapsed,
        memory_gb=mem,
    )


COLUMNS = (
    ("nodes×8", "nodes", "{:>7}"),
    ("start s", "start_s", "{:>7.1f}"),
    ("cell ms", "cell_ms", "{:>7.1f}"),
    ("CPU ms/node/cell", "cpu_ms_per_node", "{:>16.2f}"),
    ("net of idle", "net_cpu_ms_per_node", "{:>11.2f}"),
    ("idle CPU %", "idle_cpu_pct", "{:>10.1f}"),
    ("fan-out ms", "fanout_ms", "{:>10.1f}"),
    ("registry writes/cell", "registry_writes", "{:>20.2f}"),
    ("lines/s", "lines_per_s", "{:>9,.0f}"),
    ("late", "late_lines", "{:>4}"),
    ("view dropped", "view_dropped", "{:>12}"),
    ("lost", "lost_lines", "{:>4}"),
    ("widget msg/s", "widget_msgs_per_s", "{:>12.1f}"),
    ("widget kB/s", "widget_bytes_per_s", "{:>11.0f}"),
    ("memory GB", "memory_gb", "{:>9.1f}"),
)


def table(rows: list[Row]) -> str:
    head = " | ".join(name for name, _, _ in COLUMNS)
    lines = [f"| {head} |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        cells = []
        for _, attr, fmt in COLUMNS:
            value = getattr(row, attr)
            cells.append(fmt.format(value / 1000 if attr == "widget_bytes_per_s" else value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r.nodes for r in rows]
    panels = (
        ("start (s)", [r.start_s for r in rows], None),
        ("kernel CPU per node per cell (ms)", [r.cpu_ms_per_node for r in rows], CPU_GOAL_MS),
        ("fan-out and warm cell (ms)", [r.fanout_ms for r in rows], None),
        ("log lines/s (512 ranks at 64)", [r.lines_per_s for r in rows], LINES_GOAL),
        ("widget messages/s", [r.widget_msgs_per_s for r in rows], WIDGET_GOAL),
        ("registry writes per cell", [r.registry_writes for r in rows], None),
    )
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (title, values, goal) in zip(axes.flat, panels, strict=True):
        ax.plot(n, values, "o-", label="measured" if goal else "fan-out")
        if title.startswith("fan-out"):
            ax.plot(n, [r.cell_ms for r in rows], "s--", label="warm cell")
        if title.startswith("kernel CPU"):
            ax.plot(n, [r.net_cpu_ms_per_node for r in rows], "s--", label="net of idle")
        if goal is not None:
            ax.axhline(goal, color="tab:red", linestyle=":", label="goal")
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [f"{x}×8" for x in n])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if goal is not None or title.startswith("fan-out"):
            ax.legend(fontsize=8)
    fig.suptitle(
        "jupyter_mn at scale, simulated (real dask workers and node agents, stand-in ranks; "
        f"{os.cpu_count()} cores)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--cells", type=int, default=20, help="warm cells per size")
    parser.add_argument("--lines", type=int, default=2000, help="lines each rank prints")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "scale.png")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    writes = RegistryWrites(Registry().root)  # the bench's own registry, removed at the end
    rows = []
    try:
        for nodes in args.nodes:
            rows.append(measure(nodes, args.cells, args.lines, writes))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        shutil.rmtree(RUNTIME_DIR, ignore_errors=True)
    print(f"\n{table(rows)}")
    print(
        f"\ngoals: kernel CPU ≤ {CPU_GOAL_MS} ms per node per cell, ≥ {LINES_GOAL:,} lines/s "
        f"with none lost, widget ≤ {WIDGET_GOAL:g} msg/s"
    )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
