"""``%%cluster`` cells in Notebook 7 (real server, kernel and chromium; issue 43 item 2): the
header's cell number, a raising cell's ``Cell In[n]`` and the job log's marker are the prompt
number Notebook 7 shows, as in JupyterLab and papermill."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from playwright.sync_api import expect

from jupyter_mn.jobs.registry import Registry
from tests.support.lab import ARTIFACTS, run_command, wait_kernel_idle

pytestmark = pytest.mark.system

NAME = "nb7cells.ipynb"
CELLS = [
    "x = 1",
    "%%cluster --nodes 1 --gpus 2\nprint(f'rank {dist.get_rank()} here')",
    "y = 2",
    "%%cluster --nodes 1 --gpus 2\nif dist.get_rank() == 1:\n    1 / 0",
    "%cluster down",
]


def prompt_number(cell) -> int:
    expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"))
    return int(re.search(r"\d+", cell.locator(".jp-InputPrompt").inner_text()).group())


def job_logs(notebook: str) -> str:
    job = max(
        (j for j in Registry().jobs() if (j.notebook or "").endswith(notebook)),
        key=lambda j: j.started,
    )
    cli = [sys.executable, "-m", "jupyter_mn.cli", "logs", job.id]
    return subprocess.run(cli, capture_output=True, text=True, check=True).stdout


def test_cell_numbers_are_the_prompts_notebook7_shows(notebook7, page):
    notebook7.notebook(NAME, CELLS)  # written to its root; Notebook 7 opens it below
    page.goto(f"{notebook7.url}/notebooks/{NAME}?token={notebook7.token}")
    cells = page.locator(".jp-Notebook .jp-Cell")
    expect(cells.first).to_be_visible(timeout=60_000)
    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell")  # x = 1 twice: the kernel's count is not the index
    expect(cells.first.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=30_000)
    wait_kernel_idle(page)
    cells.first.click()
    run_command(page, "notebook:run-all-cells")  # it stops at the raising cell
    try:
        failed = cells.nth(3)
        expect(failed.locator(".jp-mn-state")).to_have_text("FAILED", timeout=240_000)
        wait_kernel_idle(page)
        ran, raised = prompt_number(cells.nth(1)), prompt_number(failed)
        assert (ran, raised) == (3, 5)  # what the notebook shows; the check is that we match it
        expect(cells.nth(1).locator(".jp-mn-header")).to_contain_text(f"cell {ran} · DONE")
        expect(failed.locator(".jp-mn-header")).to_contain_text(f"cell {raised} · FAILED")
        traceback = failed.locator(".jp-OutputArea-output", has_text="Traceback")
        expect(traceback).to_contain_text(f"Cell In[{raised}], line 2")  # the line under %%
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "notebook7-cell-numbers.png"), full_page=True)
        marks = [line for line in job_logs(NAME).splitlines() if line.startswith("────")]
        assert {int(n) for m in marks for n in re.findall(r"In\[(\d+)\]", m)} == {ran, raised}
        assert f"──── In[{ran}] started" in "\n".join(marks), marks
        assert f"──── In[{raised}] FAILED" in "\n".join(marks), marks
    finally:
        wait_kernel_idle(page)
        cells.last.click()
        run_command(page, "notebook:run-cell")
        expect(page.get_by_text("cluster released")).to_have_count(1, timeout=60_000)
