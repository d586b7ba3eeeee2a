"""A rank's ``breakpoint()`` answered in JupyterLab's own input box (real Lab, kernel, chromium):
the prompt is labelled with the rank, pdb's answers show in the cell, the widget says which rank
is paused and where, and ``c`` lets the cell finish with rank 0's value."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.lab import ARTIFACTS, run_command, wait_kernel_idle

pytestmark = pytest.mark.system

CELL = (
    "%%cluster --nodes 1 --gpus 2\nx = 10 * dist.get_rank() + 7\n"
    "if dist.get_rank() == 1:\n    breakpoint()\nx"
)


def answer(page, line: str) -> None:
    """Type ``line`` into the open pdb prompt (Lab's stdin box) and send it."""
    box = page.locator(".jp-Stdin-input").last
    expect(box).to_be_visible(timeout=60_000)
    box.fill(line)
    box.press("Enter")


def test_a_breakpoint_on_a_rank_is_answered_in_the_notebook(lab, page):
    page.goto(lab.notebook("debug.ipynb", [CELL, "%cluster down"]))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell")
    prompt = page.locator(".jp-Stdin-prompt").last
    expect(prompt).to_have_text("(Pdb rank 1) ", timeout=120_000)
    expect(page.locator(".jp-mn-state").first).to_contain_text("PAUSED at rank 1")
    answer(page, "p x")
    output = page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-Cell-outputArea")
    expect(output).to_contain_text("17", timeout=30_000)  # rank 1's own x, printed by its pdb
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "lab-breakpoint-prompt.png"))
    answer(page, "c")
    result = page.locator(".jp-OutputArea-executeResult .jp-OutputArea-output").first
    expect(result).to_have_text("7", timeout=60_000)  # rank 0's value: the cell went on
    expect(page.locator(".jp-mn-state").first).to_have_text("DONE")
    wait_kernel_idle(page)
    page.locator(".jp-Notebook .jp-Cell").nth(1).click()
    run_command(page, "notebook:run-cell")
    expect(page.get_by_text("cluster released")).to_have_count(1, timeout=60_000)
