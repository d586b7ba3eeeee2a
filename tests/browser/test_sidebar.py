"""The Multi-node jobs panel and log viewer in a real JupyterLab, driven by chromium."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from playwright.sync_api import expect

from jupyter_mn.jobs.registry import Registry
from tests.support.lab import (
    ARTIFACTS,
    failed_log_reads,
    job_item,
    open_panel,
    run_command,
    show_finished,
    wait_kernel_idle,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.system

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "03-papermill.ipynb"
XSS = '<img src=x onerror="window.__xss=1">'


def test_panel_follows_a_job_and_the_log_viewer_shows_rank_labelled_text(lab, page):
    (lab.root / "work").mkdir()
    page.goto(
        lab.notebook(
            "work/panel.ipynb",
            [
                "%%cluster --nodes 2 --gpus 1 --name panel\nimport time\n"
                "print('step', dist.get_rank())\n"
                f"print({XSS!r})\ntime.sleep(3)\nprint('done', dist.get_rank())"
            ],
        )
    )
    wait_kernel_idle(page)
    panel = open_panel(page)
    run_command(page, "notebook:run-all-cells")
    item = job_item(panel, "panel")
    expect(item).to_have_attribute("data-state", "RUNNING", timeout=90_000)
    expect(panel.locator(".jp-mn-Group-running")).to_contain_text("panel")
    expect(item.locator(".jp-mn-Job-shape")).to_have_text("2×1 · local")
    expect(item).to_have_attribute("data-state", "READY", timeout=30_000)
    expect(panel.locator(".jp-mn-Group-idle")).to_contain_text("panel")
    expect(item.locator(".jp-mn-Badge-gpu")).to_have_text("no GPU")
    expect(item.locator(".jp-mn-Badge-transport")).to_have_text("gloo (CPU)")
    expect(item.locator(".jp-mn-Job-notebook")).to_have_text("work/panel.ipynb")

    item.get_by_role("button", name="Logs").click()
    viewer = page.locator(".jp-mn-LogViewer")
    text = viewer.locator(".jp-mn-LogViewer-text")
    expect(text).to_contain_text("[node 1 rank 1] done 1", timeout=20_000)
    expect(text).to_contain_text("[node 0 rank 0] step 0")
    mark = text.locator(".jp-mn-LogMark")  # where the cell starts: once, for both nodes
    expect(mark).to_have_count(1)
    expect(mark).to_have_text(re.compile(r"^──── In\[\d+\] started \d\d:\d\d:\d\d ────$"))
    shown = text.locator(".jp-mn-LogLine", has_text="onerror")
    expect(shown).to_have_count(2)
    expect(shown.first).to_contain_text(XSS)  # the markup shows as text …
    assert text.locator("img").count() == 0  # … no element was made of it
    assert page.evaluate("window.__xss") is None  # … and no script ran

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "sidebar-log-viewer.png"))

    node, rank = (viewer.locator(f"select.jp-mn-LogViewer-{s}") for s in ("node", "rank"))
    node.select_option("1")
    expect(text.locator(".jp-mn-LogLine")).to_have_count(3)
    expect(text.locator('.jp-mn-LogLine[data-node="0"]')).to_have_count(0)
    expect(rank.locator("option")).to_have_text(["All ranks", "Rank 1"])  # node 1's ranks
    # A quick second change: the page asked for under the first filter comes back last.
    held = []
    logs = "**/jupyter-mn/api/jobs/*/logs?*"
    page.route(logs, lambda route: route.continue_() if held else held.append(route))
    with page.expect_request(lambda request: "/logs?" in request.url):
        node.select_option("")  # all ranks: held back
    rank.select_option("0")
    held[0].continue_()
    expect(text.locator(".jp-mn-LogLine")).to_have_count(3)
    expect(text.locator('.jp-mn-LogLine[data-rank="1"]')).to_have_count(0)
    page.unroute(logs)

    # the log viewer comes back with the layout, once Lab has saved it (debounced)
    wait_until(lambda: "jupyter-mn-logs:" in json.dumps(lab.api("/lab/api/workspaces")), 30, "save")
    page.goto(page.url.replace("?reset&", "?"))
    expect(page.locator(".jp-mn-LogViewer-text")).to_contain_text("done 1", timeout=60_000)
    expect(page.locator(".lm-TabBar-tab", has_text="Logs: panel")).to_have_count(1)
    panel = open_panel(page)
    item = job_item(panel, "panel")

    item.locator(".jp-mn-Job-notebook").click()  # the link brings the notebook back to front
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.context?.path === 'work/panel.ipynb'"
    )
    item.get_by_role("button", name="Release").click()
    show_finished(panel)
    expect(item).to_have_attribute("data-state", "CLOSED", timeout=30_000)


def test_cancel_stops_a_long_cell_and_release_frees_the_idle_gang(lab, page):
    page.goto(
        lab.notebook(
            "cancel.ipynb",
            [
                "%%cluster --nodes 1 --gpus 2 --name cancel\nimport time\n"
                "print('sleeping', dist.get_rank())\ntime.sleep(300)"
            ],
        )
    )
    wait_kernel_idle(page)
    panel = open_panel(page)
    run_command(page, "notebook:run-all-cells")
    item = job_item(panel, "cancel")
    expect(item).to_have_attribute("data-state", "RUNNING", timeout=90_000)
    item.get_by_role("button", name="Cancel").click()
    output = page.locator(".jp-OutputArea-output")
    expect(output.filter(has_text="CellInterrupted")).to_have_count(1, timeout=30_000)
    # the error says why; the widget shows where each rank was, under the same words
    expect(
        output.filter(has_text="CellInterrupted: cancelled from the Multi-node jobs panel")
    ).to_have_count(1)
    expect(item).to_have_attribute("data-state", "READY", timeout=30_000)

    job = Registry().resolve("cancel")
    ranks = [psutil.Process(p) for node in job.nodes for p in node.pids]
    assert len(ranks) == 2 and all(r.is_running() for r in ranks)
    item.get_by_role("button", name="Release").click()
    show_finished(panel)
    expect(item).to_have_attribute("data-state", "CLOSED", timeout=30_000)
    expect(panel.locator(".jp-mn-Group-finished")).to_contain_text("cancel")
    _, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive
    item.get_by_role("button", name="Forget").click()
    expect(item).to_have_count(0)


def test_a_papermill_run_from_a_terminal_appears_in_the_panel(lab, page, tmp_path):
    page.goto(lab.fresh())
    panel = open_panel(page)
    papermill = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("papermill")),
            "-k",
            "jupyter_mn",
            str(NOTEBOOK),
            str(tmp_path / "out.ipynb"),
            "-p",
            "steps",
            "60",
            "-p",
            "name",
            "terminal",
            "--no-progress-bar",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        item = job_item(panel, "terminal")
        expect(item).to_have_count(1, timeout=90_000)  # while it runs (or just after, if fast)
        expect(item.locator(".jp-mn-Job-origin")).to_contain_text("papermill")
        assert papermill.wait(120) == 0
        show_finished(panel)
        expect(item).to_have_attribute("data-state", "CLOSED", timeout=10_000)
    finally:
        papermill.kill()
        papermill.wait()


def looping_cell(flags: str, go: str, value: str) -> str:
    """A cell whose ranks print a step every 0.2 s until the file ``go`` exists in the kernel's
    working directory (the ranks' too), then return ``value``."""
    return (
        f"%%cluster --nodes 1 --gpus 2 {flags}\nimport os, time\ni = 0\n"
        f"while not os.path.exists({go!r}):\n"
        "    print(f'rank {dist.get_rank()} step {i}', flush=True)\n"
        f"    i += 1\n    time.sleep(0.2)\n{value!r}"
    )


NEWEST_STEP = """() => { const v = document.querySelector('.jp-mn-JobPage');
  const m = [...v.innerText.matchAll(/step (\\d+)/g)].map(x => Number(x[1]));
  return m.length ? Math.max(...m) : -1; }"""


@pytest.mark.slow
def test_a_papermill_job_opens_from_the_panel_into_a_live_view_that_ends_with_its_value(
    lab, page, tmp_path
):
    notebook = tmp_path / "view.ipynb"
    cell = looping_cell("--name pmview", "go-view", "pm-done")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]), notebook)
    page.goto(lab.fresh())
    panel = open_panel(page)
    papermill = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("papermill")),
            *("-k", "jupyter_mn", "--cwd", str(tmp_path), "--no-progress-bar"),
            *(str(notebook), str(tmp_path / "out.ipynb")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        item = job_item(panel, "pmview")
        expect(item).to_have_attribute("data-state", "RUNNING", timeout=120_000)
        item.get_by_role("button", name="View").click()
        view = page.locator(".jp-mn-JobPage")
        expect(view.locator(".jp-mn-JobView-state")).to_have_text("RUNNING", timeout=10_000)
        expect(page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")).to_have_text(
            re.compile(r"^Job: pmview-[0-9a-f]{8}$")  # by its id: two runs are two tabs
        )
        expect(view.locator(".jp-mn-JobView-log")).to_contain_text("[rank 1] rank 1 step")
        expect(view.locator(".jp-mn-JobView-cancel")).to_be_visible()
        before = page.evaluate(NEWEST_STEP)
        page.wait_for_function(f"() => ({NEWEST_STEP})() >= {before + 5}", timeout=15_000)

        # The server fails the view's log reads for 10 s: the view backs off, then catches up.
        reads = failed_log_reads(page)
        ARTIFACTS.mkdir(exist_ok=True)  # evidence: reads while failing (1 a second without backoff)
        (ARTIFACTS / "job-view-backoff.txt").write_text(f"{reads} reads in 10 s\n")
        assert 2 <= reads <= 6, f"{reads} reads in 10 s while they failed"
        before = page.evaluate(NEWEST_STEP)
        page.wait_for_function(f"() => ({NEWEST_STEP})() > {before}", timeout=40_000)

        (tmp_path / "go-view").touch()
        assert papermill.wait(120) == 0
        expect(view.locator(".jp-mn-JobView-state")).to_have_text("CLOSED", timeout=30_000)
        expect(view.locator(".jp-mn-JobView-outcome")).to_have_text(
            re.compile(r"^Out\[\d+\]: 'pm-done'$")  # the value, as text
        )
        expect(view.locator(".jp-mn-JobView-cancel")).to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "papermill-job-view.png"))
        polled = []
        page.on("request", lambda r: polled.append(r.url) if "/logs?" in r.url else None)
        page.wait_for_timeout(3_000)  # the job is over: the view asks for nothing more
        assert polled == []
        # the view comes back with the layout, once Lab has saved it (debounced)
        wait_until(
            lambda: "jupyter-mn-job:" in json.dumps(lab.api("/lab/api/workspaces")), 30, "save"
        )
        page.goto(page.url.replace("?reset&", "?"))
        expect(page.locator(".jp-mn-JobPage .jp-mn-JobView-outcome")).to_have_text(
            re.compile(r"^Out\[\d+\]: 'pm-done'$"), timeout=60_000
        )
    finally:
        papermill.kill()
        papermill.wait()


def test_a_background_cell_opens_from_the_panel_into_a_live_view_while_the_kernel_is_free(
    lab, page
):
    cell = looping_cell("--bg --name bgview", "go-bg", "bg-done")
    page.goto(lab.notebook("bg.ipynb", [cell, "%cluster down"]))
    wait_kernel_idle(page)
    panel = open_panel(page)
    run_command(page, "notebook:run-cell")
    item = job_item(panel, "bgview")
    expect(item).to_have_attribute("data-state", "RUNNING", timeout=120_000)
    wait_kernel_idle(page)  # the cell returned its handle; the job runs on
    clicked = time.monotonic()
    item.get_by_role("button", name="View").click()
    view = page.locator(".jp-mn-JobPage")
    expect(view.locator(".jp-mn-JobView-state")).to_have_text("RUNNING", timeout=10_000)
    expect(view.locator(".jp-mn-JobView-log")).to_contain_text("[rank 0] rank 0 step")
    ARTIFACTS.mkdir(exist_ok=True)  # how long it took: evidence, not a pass mark
    (ARTIFACTS / "job-view-first-update.txt").write_text(f"{time.monotonic() - clicked:.2f} s\n")
    (lab.root / "go-bg").touch()
    expect(view.locator(".jp-mn-JobView-state")).to_have_text("READY", timeout=60_000)
    outcome = view.locator(".jp-mn-JobView-outcome")
    expect(outcome).to_have_text(re.compile(r"^Out\[\d+\]: 'bg-done'$"))
    page.locator(".lm-TabBar-tab", has_text="bg.ipynb").click()
    page.locator(".jp-Notebook .jp-Cell").nth(1).click()
    run_command(page, "notebook:run-cell")
    expect(page.get_by_text("cluster released")).to_have_count(1, timeout=60_000)
    page.locator(".lm-TabBar-tab", has_text="Job: bgview").click()  # shown again: it refreshes
    expect(view.locator(".jp-mn-JobView-state")).to_have_text("CLOSED", timeout=30_000)
    expect(outcome).to_have_text(re.compile(r"^Out\[\d+\]: 'bg-done'$"))


#: Lab's light theme: error-color1, warn-color1, success-color1
RED, ORANGE, GREEN = "rgb(211, 47, 47)", "rgb(245, 124, 0)", "rgb(56, 142, 60)"


def test_a_failed_cell_shows_red_on_its_card_and_the_next_cell_runs_without_its_error(lab, page):
    page.goto(
        lab.notebook(
            "outcome.ipynb",
            [
                "%%cluster --nodes 1 --gpus 2 --name outcome\nraise ValueError('boom')",
                looping_cell("--name outcome", "go-outcome", "next-done"),
                "%cluster down",
            ],
        )
    )
    wait_kernel_idle(page)
    panel = open_panel(page)
    run_command(page, "notebook:run-cell-and-select-next")
    item = job_item(panel, "outcome")
    outcome = item.locator(".jp-mn-Job-cell .jp-mn-Outcome")
    expect(outcome).to_have_text("FAILED", timeout=90_000)
    expect(outcome).to_have_css("background-color", RED)
    expect(item.locator(".jp-mn-Job-error")).to_contain_text("ValueError: boom")
    state = item.locator(".jp-mn-State")  # the gang is READY; its badge does not say "all good"
    expect(state).to_have_text("READY")
    assert state.evaluate("e => getComputedStyle(e).backgroundColor") not in (RED, ORANGE, GREEN)
    ARTIFACTS.mkdir(exist_ok=True)
    panel.screenshot(path=str(ARTIFACTS / "sidebar-card-failed.png"))

    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell-and-select-next")
    try:
        expect(item).to_have_attribute("data-state", "RUNNING", timeout=60_000)
        expect(outcome).to_have_text("running")
        expect(item.locator(".jp-mn-Job-cell")).to_contain_text(re.compile(r"In\[\d+\]"))
        expect(item.locator(".jp-mn-Job-error")).to_have_count(0)  # no stale "boom"
        panel.screenshot(path=str(ARTIFACTS / "sidebar-card-next-running.png"))
    finally:
        (lab.root / "go-outcome").touch()
    expect(outcome).to_have_text("DONE", timeout=60_000)
    expect(item.locator(".jp-mn-Job-error")).to_have_count(0)
    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell")
    show_finished(panel)
    expect(item).to_have_attribute("data-state", "CLOSED", timeout=60_000)
