"""A running ``%%cluster`` cell seen from a reloaded page and from a second tab (real JupyterLab,
real kernel, chromium): the kernel answers nothing while it runs the cell, so the widget cannot
be restored; the cell's job reference is drawn from the server instead, live, with Cancel, and
with the cell's outcome when it ends."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from jupyter_mn.views.widget import JOB_MIME
from tests.support.lab import (
    ARTIFACTS,
    failed_log_reads,
    job_item,
    open_panel,
    run_command,
    wait_kernel_idle,
)

pytestmark = pytest.mark.system

#: The ranks print until this file exists (the kernel's working directory: the ranks' too).
GO = "go-reload"
LIVE = (
    "%%cluster --nodes 1 --gpus 2\nimport os, time\ni = 0\n"
    f"while not os.path.exists({GO!r}):\n"
    "    print(f'rank {dist.get_rank()} step {i}', flush=True)\n"
    "    i += 1\n    time.sleep(0.2)\n'done'"
)
FOREVER = (
    "%%cluster --nodes 1 --gpus 2\nimport time\ni = 0\nwhile True:\n"
    "    print(f'rank {dist.get_rank()} tick {i}', flush=True)\n    i += 1\n    time.sleep(0.2)"
)


def start_and_save(page, lab, name: str, cell: str) -> None:
    """Run the notebook's cell, wait for its widget to show it running, save the notebook (its
    outputs hold the widget and the job reference)."""
    page.goto(lab.notebook(name, [cell, "%cluster down"]))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell")
    expect(page.locator(".jp-mn-state").first).to_have_text("RUNNING", timeout=120_000)
    expect(page.locator(".jp-mn-JobView")).to_be_empty()  # the widget is drawn: it stands by
    run_command(page, "docmanager:save")
    deadline = time.monotonic() + 30
    while JOB_MIME not in (lab.root / name).read_text():  # the save is written by the server
        assert time.monotonic() < deadline, "the notebook was not saved with its job reference"
        time.sleep(0.2)


def newest_step(view) -> int:
    """The newest ``step N`` the view shows."""
    return max(int(n) for n in re.findall(r"step (\d+)", view.inner_text()))


def take_the_gang_down(page) -> None:
    """Run the notebook's second cell (``%cluster down``) once the kernel answers again."""
    wait_kernel_idle(page)
    page.locator(".jp-Notebook .jp-Cell").nth(1).click()
    run_command(page, "notebook:run-cell")
    expect(page.get_by_text("cluster released")).to_have_count(1, timeout=60_000)


def test_a_reloaded_page_and_a_second_tab_follow_the_running_cell_and_get_its_value(
    lab, page, browser
):
    start_and_save(page, lab, "reload.ipynb", LIVE)
    page.reload()
    expect(page.locator(".jp-Notebook .jp-Cell").first).to_be_visible(timeout=120_000)
    ready = time.monotonic()
    view = page.locator(".jp-mn-JobView").first
    expect(view.locator(".jp-mn-JobView-state")).to_have_text("RUNNING", timeout=10_000)
    expect(view.locator(".jp-mn-JobView-log")).to_contain_text("step", timeout=10_000)
    ARTIFACTS.mkdir(exist_ok=True)  # how long it took: evidence, not a pass mark (bench/ times)
    (ARTIFACTS / "reload-first-update.txt").write_text(f"{time.monotonic() - ready:.2f} s\n")
    before = newest_step(view)
    # ipywidgets' renderer waits on the busy kernel: its "Loading widget..." stays out of sight
    expect(page.locator(".jp-Notebook .jp-Cell").first.get_by_text("Loading widget")).to_be_hidden()
    expect(view.locator(".jp-mn-JobView-cancel")).to_be_visible()
    expect(page.get_by_text("was not saved since it started")).to_have_count(0)  # saved: no notice
    page.wait_for_function(  # new lines keep coming while the kernel is busy
        """([before]) => { const v = document.querySelector('.jp-mn-JobView');
        const m = [...v.innerText.matchAll(/step (\\d+)/g)].map(x => Number(x[1]));
        return Math.max(...m) >= before + 5; }""",
        arg=[before],
        timeout=15_000,
    )
    other = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    try:
        other.goto(lab.fresh("/tree/reload.ipynb"))
        expect(other.locator(".jp-mn-JobView-state").first).to_have_text("RUNNING", timeout=30_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "reloaded-running-cell.png"))
        (lab.root / GO).touch()
        outcome = view.locator(".jp-mn-JobView-outcome")
        expect(outcome).to_have_text(
            re.compile(r"^Out\[(\d+)\]: 'done' .*Out\[\1\]"), timeout=60_000
        )
        expect(other.locator(".jp-mn-JobView-outcome").first).to_contain_text(
            "'done'", timeout=30_000
        )
        expect(view.locator(".jp-mn-JobView-cancel")).to_have_count(0)
        expect(page.locator(".jp-mn-state").first).to_have_text("DONE", timeout=60_000)
        expect(outcome).to_be_visible()  # the widget is back; the value it never had stays
    finally:
        other.context.close()
    take_the_gang_down(page)


@pytest.mark.slow
def test_cancel_from_a_reloaded_page_stops_the_cell(lab, page):
    start_and_save(page, lab, "cancel.ipynb", FOREVER)
    page.reload()
    view = page.locator(".jp-mn-JobView").first
    expect(view.locator(".jp-mn-JobView-log")).to_contain_text("tick", timeout=120_000)
    reads = failed_log_reads(page)  # the view backs off while the server fails, then catches up
    assert 2 <= reads <= 6, f"{reads} reads in 10 s while they failed"
    ticks = view.locator(".jp-mn-JobView-log").inner_text()
    expect(view.locator(".jp-mn-JobView-log")).not_to_have_text(ticks, timeout=40_000)
    view.locator(".jp-mn-JobView-cancel").click()
    expect(view.locator(".jp-mn-JobView-outcome")).to_contain_text(" INTERRUPTED: ", timeout=60_000)
    take_the_gang_down(page)


def test_a_notebook_not_saved_since_the_cell_started_reloads_without_it_and_says_so(lab, page):
    go = "go-unsaved"
    cell = LIVE.replace("--gpus 2", "--gpus 2 --name unsaved").replace(GO, go)
    page.goto(lab.notebook("unsaved.ipynb", [cell, "%cluster down"]))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell")
    expect(page.locator(".jp-mn-state").first).to_have_text("RUNNING", timeout=120_000)
    page.reload()  # the file on disk has no output: the cell comes back empty
    first = page.locator(".jp-Notebook .jp-Cell").first
    expect(first).to_be_visible(timeout=120_000)
    expect(first.locator(".jp-InputPrompt")).to_have_text("[ ]:")
    expect(first.locator(".jp-OutputArea-output")).to_have_count(0)
    notice = page.locator(".Toastify__toast", has_text="was not saved since it started")
    expect(notice).to_contain_text("unsaved.ipynb: a %%cluster cell is running (job unsaved)")
    notice.get_by_role("button", name="View").click()
    view = page.locator(".jp-mn-JobPage")
    expect(view.locator(".jp-mn-JobView-state")).to_have_text("RUNNING", timeout=10_000)
    expect(view.locator(".jp-mn-JobView-log")).to_contain_text("step")
    (lab.root / go).touch()
    item = job_item(open_panel(page), "unsaved")
    expect(item).to_have_attribute("data-state", "READY", timeout=60_000)
    # Lab brings the reloaded notebook to the front once its kernel answers again: back to the job
    page.wait_for_function(
        """() => [...window.jupyterapp.shell.widgets('main')].some(w =>
        w.context?.path === 'unsaved.ipynb'
        && w.sessionContext.session?.kernel?.status === 'idle')"""
    )
    page.locator(".lm-TabBar-tab", has_text="Job: unsaved").click()
    expect(view.locator(".jp-mn-JobView-outcome")).to_have_text(
        re.compile(r"^Out\[\d+\]: 'done'$"), timeout=30_000
    )
    expect(first.locator(".jp-OutputArea-output")).to_have_count(0)  # the page never gets it
    page.locator(".lm-TabBar-tab", has_text="unsaved.ipynb").click()
    take_the_gang_down(page)
