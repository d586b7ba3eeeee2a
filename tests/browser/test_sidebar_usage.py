"""GPU-hours in a real JupyterLab: the Multi-node jobs panel counts a running gang's rank-hours up,
and ``--max-gpu-hours`` on a ``%%cluster`` cell ends the gang at its cap with the reason in the cell
and the count in the widget's header."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from jupyter_mn.jobs.registry import Registry
from tests.support.lab import job_item, open_panel, run_command, show_finished, wait_kernel_idle

pytestmark = pytest.mark.system

COUNT = re.compile(r"^(< )?\d+(\.\d+)? rank-hours$")


def test_the_panel_counts_rank_hours_and_max_gpu_hours_ends_the_cell_at_its_cap(lab, page):
    cap = 0.02  # 2×2 CPU ranks: 18 s from the nodes being up
    cell = f"%%cluster --nodes 2 --gpus 2 --name usage --max-gpu-hours {cap}\n"
    page.goto(lab.notebook("usage.ipynb", [cell + "import time\ntime.sleep(120)"]))
    wait_kernel_idle(page)
    panel = open_panel(page)
    run_command(page, "notebook:run-all-cells")
    item = job_item(panel, "usage")
    expect(item).to_have_attribute("data-state", "RUNNING", timeout=90_000)
    usage = item.locator(".jp-mn-Job-usage")
    expect(usage).to_have_text(COUNT, timeout=20_000)
    # it grows while the cell runs, in place (the item is not redrawn for it)
    expect(usage).not_to_have_text(usage.inner_text(), timeout=20_000)

    reason = "--max-gpu-hours reached (0.02 rank-hours: 4 × 18 s)"
    expect(page.locator(".jp-OutputArea-output", has_text="CellInterrupted")).to_contain_text(
        reason, timeout=60_000
    )
    header = page.locator(".jp-mn-header").first
    expect(header).to_contain_text("INTERRUPTED")
    expect(header).to_contain_text(re.compile(r"rank-hours \(gang 0\.0[2-3]\d*\)"))
    show_finished(panel)
    expect(item).to_have_attribute("data-state", "CLOSED", timeout=30_000)
    job = next(j for j in Registry().jobs() if j.name == "usage")
    assert cap <= job.gpu_hours < 2 * cap and usage.inner_text() == job.usage
