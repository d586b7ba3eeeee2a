"""Loud cells: what the views cost, next to ipyparallel doing the same, on this machine.

Each rank (ipyparallel: each engine) of a 2×2 gang prints LINES lines; we time the cell until
its output is in the notebook process, and the cost of the widget's per-frame redraw. Prints a
table of medians and ratios. Run: ``.venv/bin/python -m bench.views``.
"""

from __future__ import annotations

import io
import statistics
import time

from jupyter_mn import Cluster
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.views import TextView
from jupyter_mn.views.cellstate import HISTORY
from jupyter_mn.views.glance import gpu_html
from jupyter_mn.views.widget import ClusterWidget
from jupyter_mn.wire.events import GpuSample, GpuStat

LINES = 2000
REPEATS = 5
CODE = f"for i in range({LINES}):\n    print('line', i)\n"


def median_s(fn) -> float:
    fn()  # warm
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ours() -> dict[str, float]:
    rows = {}
    with Cluster(nodes=2, gpus=2) as cluster:
        cluster.run("1")
        rows["jupyter_mn, no view"] = median_s(lambda: cluster.run(CODE))
        rows["jupyter_mn, text view"] = median_s(
            lambda: cluster.run(CODE, on_event=TextView(io.StringIO(), io.StringIO()))
        )
        widget = ClusterWidget(cluster.spec)

        def with_widget() -> None:
            cluster.run(CODE, on_event=widget.state.apply)
            widget._draw({"log0", "log1", "header", "gpu", "transport", "summary"})

        rows["jupyter_mn, widget state + final draw"] = median_s(with_widget)
        rows["widget: build both node tabs' HTML (one frame)"] = median_s(
            lambda: (widget._log_html(0), widget._log_html(1))
        )
        rows["jupyter_mn, trivial cell (telemetry on)"] = median_s(lambda: cluster.run("1"))
    return rows


def gpu_panel(nodes: int = 64, gpus: int = 8) -> dict[str, float]:
    """The GPU panel of a large gang after a minute of samples: bars and sparklines per GPU."""
    state = ClusterWidget(ClusterSpec(nodes=nodes, gpus=gpus)).state
    for t in range(HISTORY):
        for node in range(nodes):
            stats = tuple(
                GpuStat(g, "NVIDIA H100 80GB HBM3", (t + g) % 100, 40960, 81559, 500.0, 60, (g,))
                for g in range(gpus)
            )
            state.apply(GpuSample(node, stats))
    size = len(gpu_html(state))
    name = f"widget: GPU panel, {nodes}×{gpus} GPUs, {size / 1000:.0f} kB (one frame)"
    return {name: median_s(lambda: gpu_html(state))}


def ipyparallel() -> dict[str, float]:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=4, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(4, timeout=120)
        view = rc[:]

        def run() -> None:
            result = view.execute(CODE, block=True)
            assert all(s.count("\n") == LINES for s in result.stdout)

        return {"ipyparallel 9 (4 engines), execute + stdout": median_s(run)}
    finally:
        cluster.stop_cluster_sync()


def main() -> None:
    rows = {**ours(), **gpu_panel(), **ipyparallel()}
    base = rows["jupyter_mn, no view"]
    print(f"{LINES} lines per rank, 2×2 (4 ranks), median of {REPEATS}; CPU, gloo")
    print(f"{'what':<48} {'median':>10} {'vs no view':>10}")
    for name, seconds in rows.items():
        ratio = f"{seconds / base:9.2f}×" if "frame" not in name and "trivial" not in name else ""
        print(f"{name:<48} {seconds * 1000:8.1f} ms {ratio:>10}")


if __name__ == "__main__":
    main()
