"""A ``%%cluster --bg`` cell in JupyterLab (real kernel, gang and chromium; issue 43 item 11):
the cell shows the live view a foreground cell gets, which keeps updating while other cells run
and folds once the cell ends; its handle outlives other cells' values."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.test_lab_reload import newest_step
from tests.support.lab import ARTIFACTS, run_command, wait_kernel_idle

pytestmark = pytest.mark.system

GO = "go-background"
BG = (
    "%%cluster --nodes 1 --gpus 2 --bg\nimport os, time\ni = 0\n"
    f"while not os.path.exists({GO!r}):\n"
    "    print(f'rank {dist.get_rank()} step {i}', flush=True)\n"
    "    i += 1\n    time.sleep(0.2)\n'done'"
)
CELLS = [BG, "41 + 1", "import time\ntime.sleep(5)", "h = %cluster last\nh.result(timeout=60)"]


def run_cell(page, index: int) -> None:
    page.locator(".jp-Notebook .jp-Cell").nth(index).click()
    run_command(page, "notebook:run-cell")


def test_a_background_cell_shows_a_live_view_while_other_cells_run_then_folds(lab, page):
    page.goto(lab.notebook("background.ipynb", [*CELLS, "%cluster down"]))
    wait_kernel_idle(page)
    cells = page.locator(".jp-Notebook .jp-Cell")
    background = cells.first.locator(".jp-Cell-outputWrapper")
    run_cell(page, 0)
    try:
        expect(background.locator(".jp-mn-state")).to_have_text("RUNNING", timeout=120_000)
        log = background.locator('pre[data-node="0"]')
        expect(log).to_contain_text("[rank 1] rank 1 step", timeout=30_000)
        expect(background).not_to_contain_text("BackgroundCell")  # the view, not the repr
        wait_kernel_idle(page)
        run_cell(page, 1)  # another cell's value: `_` moves on, the handle stays
        expect(cells.nth(1).locator(".jp-OutputArea-output")).to_have_text("42", timeout=30_000)
        before = newest_step(log)
        run_cell(page, 2)  # the kernel is busy with another cell: the view keeps updating
        expect(cells.nth(2).locator(".jp-InputPrompt")).to_have_text("[*]:", timeout=10_000)
        page.wait_for_function(
            """([before]) => {
            const log = document.querySelector('.jp-Cell pre[data-node="0"]');
            const m = [...log.innerText.matchAll(/step (\\d+)/g)].map(x => Number(x[1]));
            const busy = document.querySelectorAll('.jp-InputPrompt')[2].innerText.trim();
            return busy === '[*]:' && Math.max(...m) >= before + 5; }""",
            arg=[before],
            timeout=15_000,
        )
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "background-live-view.png"))
        (lab.root / GO).touch()
        expect(background.locator(".jp-mn-state")).to_have_text("DONE", timeout=60_000)
        expect(background.locator(".jp-mn-done")).to_be_visible()  # folded, as a foreground cell
        expect(background.locator("button.jp-mn-cancel")).to_have_count(0)
        wait_kernel_idle(page)
        run_cell(page, 3)
        expect(cells.nth(3).locator(".jp-OutputArea-output")).to_have_text("'done'")
        cells.first.screenshot(path=str(ARTIFACTS / "background-folded-view.png"))
    finally:
        wait_kernel_idle(page)
        run_cell(page, len(CELLS))
        expect(page.get_by_text("cluster released")).to_have_count(1, timeout=60_000)
