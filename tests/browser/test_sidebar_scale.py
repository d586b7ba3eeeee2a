"""The Multi-node jobs panel and the log viewer with 512 ranks, in a real JupyterLab driven by
chromium.

The gang is 16 nodes × 32 stand-in ranks (``jupyter_mn/rank/standin.py``: real dask workers and node
agents, ranks without torch; fewer nodes than 64 × 8 for the same ranks, since a node's dask
worker costs this machine far more than a stand-in), started by a kernel of the test's own, as a
papermill run or a second notebook would: the panel lists every kernel's jobs from the registry.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from tests.support.kernels import Kernel
from tests.support.lab import ARTIFACTS, job_item, open_panel
from tests.support.simulated import loud_cell, simulated_env

pytestmark = [pytest.mark.scale, pytest.mark.slow, pytest.mark.system]

NODES, GPUS, LINES = 16, 32, 50
#: What "usable" means here: each step of the viewer answers within a few seconds.
USABLE_MS = 10_000


def test_the_panel_and_the_log_viewer_stay_usable_with_512_ranks(lab, page):
    page.goto(lab.fresh())
    panel = open_panel(page)
    kernel = Kernel(env=simulated_env())
    try:
        # every rank prints; the cell shows rank 0's lines only (all of them reach the logs)
        reply = kernel.run(
            f"%%cluster --nodes {NODES} --gpus {GPUS} --name wide --view text --ranks 0\n"
            + loud_cell(LINES),
            timeout=600,
        )
        assert reply.status == "ok", reply.error_text
        item = job_item(panel, "wide")
        expect(item).to_have_attribute("data-state", "READY", timeout=USABLE_MS)
        expect(item.locator(".jp-mn-Job-shape")).to_have_text(f"{NODES}×{GPUS} · local")
        expect(item.locator(".jp-mn-Badge-transport")).to_have_text("stand-in (CPU)")

        began = time.monotonic()
        item.get_by_role("button", name="Logs").click()
        viewer = page.locator(".jp-mn-LogViewer")
        text = viewer.locator(".jp-mn-LogViewer-text")
        expect(viewer.locator(".jp-mn-LogViewer-count")).to_have_text(
            "1000 lines · READY", timeout=USABLE_MS
        )  # the newest 1000 of 25,600
        opened = time.monotonic() - began

        rank = GPUS * 13 + 3
        began = time.monotonic()
        viewer.locator("select.jp-mn-LogViewer-rank").select_option(str(rank))
        expect(text.locator(".jp-mn-LogLine")).to_have_count(LINES, timeout=USABLE_MS)
        filtered = time.monotonic() - began
        expect(text.locator(f'.jp-mn-LogLine[data-rank="{rank}"]')).to_have_count(LINES)
        expect(text).to_contain_text(f"[node 13 rank {rank}] rank {rank} line {LINES - 1}")

        node = viewer.locator("select.jp-mn-LogViewer-node")
        node.select_option(str(NODES - 1))  # the rank filter then offers that node's ranks
        expect(viewer.locator("select.jp-mn-LogViewer-rank option")).to_have_count(GPUS + 1)
        last = text.locator(f'.jp-mn-LogLine[data-node="{NODES - 1}"]')
        expect(last).to_have_count(min(GPUS * LINES, 1000), timeout=USABLE_MS)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "sidebar-512-ranks.png"))
        print(f"log viewer: opened in {opened:.1f} s, filtered by rank in {filtered:.1f} s")
    finally:
        kernel.run("%cluster down", timeout=120)
        kernel.shutdown()
