"""A notebook of many finished ``%%cluster`` cells in JupyterLab: its JS heap and load time against
the same notebook with plain cells (issue 40 item 3; acceptance: heap within 1.5× the plain one's).

Both notebooks are run once through a real jupyter_mn kernel (``tests/support/finished.py``:
the cluster cells with the widget view, saved with the open models' widget state as Lab's save
keeps it; the plain cells print and return the same), then each is opened REPEATS times in a
fresh chromium page of a real JupyterLab, every cell attached (``windowingMode`` ``none``: the
whole notebook's cost, not the viewport's). Load time: from navigation until every cell's saved
outputs are in the page; heap: CDP ``Performance.getMetrics`` ``JSHeapUsedSize`` after a forced
garbage collection, once the kernel is idle. Prints medians and the ratios.

Run: ``.venv/bin/python -m bench.labheap [--cells 300] [--repeats 3] [--keep DIR]`` (``--keep``
reuses the notebooks made there by an earlier run).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import nbformat
from playwright.sync_api import sync_playwright

from tests.support.finished import CLUSTER_CELL, PLAIN_CELL, run_notebook
from tests.support.lab import CHROMIUM, CHROMIUM_ARGS, Lab, lab_server, wait_kernel_idle

KINDS = {"plain": PLAIN_CELL, "cluster": CLUSTER_CELL}


def cells_with_outputs(path: Path) -> int:
    """Counted by cell: Lab joins a cell's consecutive stream outputs into one."""
    return sum(1 for cell in nbformat.read(path, 4).cells if cell.get("outputs"))


def open_once(browser: object, lab: Lab, name: str, outputs: int) -> tuple[float, float]:
    """Load seconds and used JS heap (MB) of one fresh page showing notebook ``name``."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        start = time.perf_counter()
        page.goto(lab.fresh(f"/tree/{name}"))
        page.wait_for_function(
            """n => [...document.querySelectorAll('.jp-Notebook .jp-OutputArea')]
            .filter(area => area.querySelector('.jp-OutputArea-output')).length >= n""",
            arg=outputs,
            timeout=300_000,
            polling=100,
        )
        loaded = time.perf_counter() - start
        wait_kernel_idle(page, 120_000)
        cdp.send("HeapProfiler.collectGarbage")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        return loaded, metrics["JSHeapUsedSize"] / 2**20
    finally:
        context.close()
        for session in lab.api("/api/sessions"):  # its kernel: the next page starts afresh
            lab.api(f"/api/sessions/{session['id']}", method="DELETE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="make the notebooks here (reused if present)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="labheap-"))
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, cell in KINDS.items():
        paths[kind] = root / f"{kind}.ipynb"
        if not paths[kind].exists():
            run_notebook(paths[kind], cell, args.cells)
    settings = root / ".settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    rows: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    with lab_server(root) as lab, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        for _ in range(args.repeats):
            for kind, path in paths.items():  # interleaved: a drift in load hits both
                rows[kind].append(open_once(browser, lab, path.name, cells_with_outputs(path)))
        browser.close()
    medians = {
        kind: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for kind, runs in rows.items()
    }
    print(f"{args.cells} cells, median of {args.repeats}, JupyterLab in headless chromium")
    print(f"{'notebook':<10} {'load s':>8} {'JS heap MB':>11}")
    for kind, (load, heap) in medians.items():
        print(f"{kind:<10} {load:>8.2f} {heap:>11.1f}")
    (pload, pheap), (cload, cheap) = medians["plain"], medians["cluster"]
    ratios = f"{cload / pload:>7.2f}× {cheap / pheap:>10.2f}×"
    print(f"{'ratio':<10} {ratios}  (acceptance: heap ≤ 1.5×)")


if __name__ == "__main__":
    main()
