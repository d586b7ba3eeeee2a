"""A notebook open all day: many ``%%cluster --view widget`` cells and plain API cells through a
real kernel, and what each thousand of them leaves behind.

For the kernel: live widget models, RSS, open files, threads; for the node agents and ranks:
RSS, open files and threads summed; and the warm round trip at the start and at the end. The
growth is printed per 1000 cells (IPython itself keeps every cell's input and output in its
history).

Run: ``.venv/bin/python -m bench.soak [--widget-cells 1000] [--api-cells 3000]``.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import time

from bench.cells import Kernel

PROBE = """import os, psutil, threading
from ipywidgets.widgets import widget as _w
_me = psutil.Process()
_kids = _me.children(recursive=True)
def _sum(f):
    total = 0
    for p in _kids:
        try:
            total += f(p)
        except psutil.Error:
            pass
    return total
(len(_w._instances), _me.memory_info().rss, _me.num_fds(), threading.active_count(),
 _sum(lambda p: p.memory_info().rss), _sum(lambda p: p.num_fds()),
 _sum(lambda p: p.num_threads()))"""
FIELDS = (
    "widget models",
    "kernel RSS (MB)",
    "kernel fds",
    "kernel threads",
    "nodes+ranks RSS (MB)",
    "nodes+ranks fds",
    "nodes+ranks threads",
)
REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)\n"
WIDGET_CELL = f"%%cluster --view widget\n{REDUCE}print('loss', t.item())\nt.item()"
API_CELL = f"%%cluster --view text\n{REDUCE}t.item()"


def probe(kernel: Kernel) -> list[float]:
    results: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "execute_result":
            results.append(msg["content"]["data"]["text/plain"])

    reply = kernel.kc.execute_interactive(PROBE, timeout=60, output_hook=hook)
    assert reply["content"]["status"] == "ok", reply["content"]
    values = list(ast.literal_eval(results[-1]))
    for i in (1, 4):
        values[i] /= 2**20
    return values


def round_trip(kernel: Kernel, n: int = 20) -> float:
    return statistics.median(kernel.run("%%cluster --view text\n1") for _ in range(n)) * 1000


def soak(kernel: Kernel, cell: str, count: int) -> tuple[list[float], list[float], float, float]:
    first_rt = round_trip(kernel)
    start = probe(kernel)
    for _ in range(count):
        kernel.run(cell)
    end = probe(kernel)
    return start, end, first_rt, round_trip(kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widget-cells", type=int, default=1000)
    parser.add_argument("--api-cells", type=int, default=3000)
    args = parser.parse_args()
    kernel = Kernel("jupyter_mn")
    kernel.run("%%cluster --nodes 2 --gpus 2 --view text\n1", timeout=600)
    try:
        rows = []
        for name, cell, count in (
            ("widget cells", WIDGET_CELL, args.widget_cells),
            ("API cells", API_CELL, args.api_cells),
        ):
            started = time.perf_counter()
            start, end, rt0, rt1 = soak(kernel, cell, count)
            rows.append((name, count, start, end, rt0, rt1, time.perf_counter() - started))
    finally:
        kernel.run("%cluster down")
        kernel.close()
    for name, count, start, end, rt0, rt1, took in rows:
        print(f"\n{count} {name} in {took:.0f} s; warm round trip {rt0:.1f} → {rt1:.1f} ms")
        print(f"  {'':24} {'start':>10} {'end':>10} {'per 1000 cells':>15}")
        for field, a, b in zip(FIELDS, start, end, strict=True):
            print(f"  {field:24} {a:10.1f} {b:10.1f} {(b - a) * 1000 / count:15.1f}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
