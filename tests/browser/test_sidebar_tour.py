"""The tour of a new user, replayed in a real JupyterLab driven by chromium: a notebook renamed
before its first cell keeps its jobs under its new name; a submitted run's card lists its gangs
and its View follows it (each node's newest lines, ``cell k of n``, the value or the traceback);
hours read as a person writes them everywhere; the Logs viewer keeps red for the root cause."""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest
from playwright.sync_api import expect

from jupyter_mn.jobs.registry import Registry
from tests.browser.test_sidebar_runs import RUN_MS, write_notebook
from tests.support.jobs import SCIENTIFIC, make_job
from tests.support.lab import (
    ARTIFACTS,
    job_item,
    open_panel,
    run_command,
    show_finished,
    wait_kernel_idle,
)
from tests.support.runs import JUPYTER_MN

pytestmark = pytest.mark.system

HOURS = re.compile(r"^(< )?\d[\d.,]* rank-hours$")


def mn(lab, *args: str) -> str:
    """``jupyter mn ARGS`` in the server's root, as a user's terminal there; its output."""
    done = subprocess.run(
        [*JUPYTER_MN, *args],
        cwd=lab.root,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    return done.stdout


def test_a_notebook_renamed_before_its_first_cell_shows_its_jobs_under_its_new_name(lab, page):
    tag = uuid.uuid4().hex[:6]
    page.goto(lab.fresh())
    panel = open_panel(page)
    # from the launcher: Untitled*.ipynb with the jupyter_mn kernel
    page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="jupyter_mn").click()
    expect(page.locator(".lm-TabBar-tab.jp-mod-current")).to_contain_text("Untitled")
    wait_kernel_idle(page)
    run_command(page, "docmanager:rename")
    name = f"tour-{tag}.ipynb"
    page.locator(".jp-Dialog input").fill(name)
    page.locator(".jp-Dialog").get_by_role("button", name="Rename").click()
    expect(page.locator(".lm-TabBar-tab.jp-mod-current")).to_contain_text(name)
    page.evaluate(
        "code => { const w = window.jupyterapp.shell.currentWidget;"
        " w.content.activeCell.model.sharedModel.setSource(code); }",
        "%%cluster --nodes 2 --gpus 1\nprint('hello from', dist.get_rank())",
    )
    run_command(page, "notebook:run-cell")

    item = panel.locator("li.jp-mn-Job").filter(has=page.locator(".jp-mn-Job-nb", has_text=name))
    expect(item).to_have_count(1, timeout=120_000)
    expect(item).to_have_attribute("data-state", "READY", timeout=60_000)
    expect(item.locator(".jp-mn-Job-notebook")).to_have_text(name)
    # the cell's time is the same in its header and in the panel
    took = item.locator(".jp-mn-Job-cellelapsed")
    expect(took).to_have_text(re.compile(r"^\d+\.\d s$"), timeout=30_000)
    header = page.locator(".jp-mn-header").first
    expect(header).to_contain_text(f"· {took.inner_text()}")
    expect(item.locator(".jp-mn-Job-usage")).to_have_text(HOURS)
    assert not SCIENTIFIC.search(panel.inner_text() + header.inner_text())
    page.screenshot(path=str(ARTIFACTS / "tour-renamed-notebook.png"))

    box = panel.get_by_role("searchbox", name="Filter jobs")
    box.fill(f"tour-{tag}")
    expect(panel.locator("li.jp-mn-Job")).to_have_count(1)
    box.fill("")
    run_command(page, "launcher:create")  # another tab in front: the link brings the notebook
    expect(page.locator(".lm-TabBar-tab.jp-mod-current")).to_contain_text("Launcher")
    item.locator(".jp-mn-Job-notebook").click()
    expect(page.locator(".lm-TabBar-tab.jp-mod-current")).to_contain_text(name)
    expect(page.locator(".jp-Dialog")).to_have_count(0)  # no "cannot open" error

    listed = [line for line in mn(lab, "list").splitlines() if name in line]
    assert len(listed) == 1 and "Untitled" not in listed[0]
    assert name in mn(lab, "usage")
    run_command(page, "kernelmenu:shutdown")


def test_a_runs_card_lists_its_gangs_and_its_view_follows_the_run_to_its_value(lab, page):
    tag = uuid.uuid4().hex[:6]
    gate = lab.root / f"tour-{tag}.gate"
    wait = (
        f"    if k == 3:\n        while not os.path.exists({str(gate)!r}):\n"
        "            time.sleep(0.1)\n"
    )
    write_notebook(
        lab.root / f"train-{tag}.ipynb",
        "%%cluster --nodes 2 --gpus 1\nimport os, time\nfor k in range(1, 16):\n"
        "    print(f'step {k}/15', flush=True)\n" + wait,
        "steps * 2",
        parameters="steps = 1",
    )
    mn(lab, "submit", f"train-{tag}.ipynb", "-p", "steps", "21")  # papermill injects a cell
    try:
        page.goto(lab.fresh())
        panel = open_panel(page)
        run = job_item(panel, f"train-{tag}")
        expect(run.locator(".jp-mn-Job-cells")).to_have_text("cell 2 of 3", timeout=RUN_MS)
        gang = run.locator(".jp-mn-Run-gang")
        expect(gang).to_have_count(1, timeout=60_000)
        expect(gang).to_have_attribute("data-state", "RUNNING", timeout=60_000)
        gang_id = gang.get_attribute("data-job-id")
        expect(panel.locator(f'li.jp-mn-Job[data-job-id="{gang_id}"]')).to_have_count(0)
        expect(gang.locator("button")).to_have_text(["View", "Logs"])  # no Release: the run's
        expect(run.locator(".jp-mn-Job-actions button")).to_have_text(["View", "Logs", "Cancel"])
        run.locator(".jp-mn-Job-actions").get_by_role("button", name="Cancel").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text(f"Cancel the run train-{tag}?")
        dialog.get_by_role("button", name="Keep running").click()
        expect(run).to_have_attribute("data-state", "RUNNING")

        run.locator(".jp-mn-Job-actions").get_by_role("button", name="View").click()
        view = page.locator(".jp-mn-JobPage:visible")
        run_id = run.get_attribute("data-job-id")
        expect(page.locator(".lm-TabBar-tab", has_text=f"Job: {run_id}")).to_have_count(1)
        expect(view.locator(".jp-mn-JobView-progress")).to_have_text("cell 2 of 3")
        logs = view.locator(".jp-mn-JobView-log")
        expect(logs).to_have_count(2, timeout=30_000)
        for node in range(2):
            expect(logs.nth(node)).to_contain_text("step 3/15", timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "tour-run-view-running.png"))
    finally:
        gate.touch()
    expect(view.locator(".jp-mn-JobView-state")).to_have_text("SUCCEEDED", timeout=RUN_MS)
    expect(view.locator(".jp-mn-JobView-outcome")).to_contain_text(": 42")
    expect(view.locator(".jp-mn-JobView-progress")).to_have_text("cell 3 of 3")
    page.screenshot(path=str(ARTIFACTS / "tour-run-view-succeeded.png"))

    show_finished(panel)
    expect(run).to_have_attribute("data-state", "SUCCEEDED", timeout=RUN_MS)
    expect(run.locator(".jp-mn-Job-usage")).to_have_text(HOURS)
    expect(run.locator(".jp-mn-Job-detail")).to_have_count(0)  # no bare "done"
    expect(gang).to_have_attribute("data-state", "CLOSED")
    expect(gang.locator(".jp-mn-Run-gangusage")).to_have_text(HOURS)
    assert not SCIENTIFIC.search(panel.inner_text())
    page.screenshot(path=str(ARTIFACTS / "tour-run-card.png"))


def test_a_failed_runs_view_shows_the_traceback_and_its_logs_keep_red_for_it(lab, page):
    tag = uuid.uuid4().hex[:6]
    write_notebook(
        lab.root / f"fails-{tag}.ipynb",
        "%%cluster --nodes 2 --gpus 1\nimport sys\n"
        "print(' 50%|#####     | 5/10', file=sys.stderr, flush=True)\n"
        "if dist.get_rank() == 1:\n    raise ValueError('bad batch')",
    )
    mn(lab, "submit", f"fails-{tag}.ipynb")
    page.goto(lab.fresh())
    panel = open_panel(page)
    show_finished(panel)
    run = job_item(panel, f"fails-{tag}")
    expect(run).to_have_attribute("data-state", "FAILED", timeout=RUN_MS)

    run.locator(".jp-mn-Job-actions").get_by_role("button", name="View").click()
    view = page.locator(".jp-mn-JobPage:visible")
    expect(view.locator(".jp-mn-JobView-outcome")).to_contain_text("FAILED")
    expect(view.locator(".jp-mn-JobView-traceback")).to_contain_text("ValueError: bad batch")
    page.screenshot(path=str(ARTIFACTS / "tour-run-view-failed.png"))

    gang = run.locator(".jp-mn-Run-gang")
    gang.get_by_role("button", name="View").click()  # the gang's own View: each node's lines
    gang_view = page.locator(".jp-mn-JobPage:visible")
    node1 = gang_view.locator(".jp-mn-JobView-log").nth(1)
    expect(node1).to_contain_text("started", timeout=30_000)  # its cell's mark, on node 1 too
    expect(node1).to_contain_text("FAILED")

    gang.get_by_role("button", name="Logs").click()
    viewer = page.locator(".jp-mn-LogViewer:visible")
    bar = viewer.locator(".jp-mn-LogLine", has_text="5/10").first
    cause = viewer.locator(".jp-mn-LogLine", has_text="ValueError: bad batch").last
    expect(cause).to_be_visible(timeout=30_000)
    red = cause.evaluate("e => getComputedStyle(e).color")
    assert bar.evaluate("e => getComputedStyle(e).color") != red  # stderr is no error
    page.screenshot(path=str(ARTIFACTS / "tour-logs-colours.png"))


def test_a_narrow_panel_that_scrolls_keeps_each_badge_by_its_title_and_the_buttons_in_a_row(
    lab, page
):
    tag = uuid.uuid4().hex[:6]
    registry = Registry()
    run = make_job(f"run-{tag}", name=f"a-long-run-name-{tag}", output="out.ipynb", nodes=[])
    jobs = [run, make_job(f"gang-{tag}", run=run.id)] + [
        make_job(f"narrow-{tag}-{n}", name=f"narrow-job-with-a-long-name-{n}") for n in range(8)
    ]
    for job in jobs:
        registry.save(job)
    try:
        page.goto(lab.fresh())
        panel = open_panel(page)
        expect(panel.locator("li.jp-mn-Job", has_text=f"narrow-{tag}")).to_have_count(
            8, timeout=30_000
        )
        panel.evaluate("p => { p.style.width = '200px'; }")  # as dragged narrow
        assert panel.evaluate("p => p.scrollHeight > p.clientHeight")  # it scrolls
        for card in panel.locator("li.jp-mn-Job", has_text=tag).all():
            title = card.locator(".jp-mn-Job-title").bounding_box()
            badge = card.locator(".jp-mn-Job-head .jp-mn-State").bounding_box()
            assert badge["y"] < title["y"] + 20, "the state badge went under the title"
            buttons = card.locator(".jp-mn-Job-actions .jp-mn-Action").all()
            tops = {round(b.bounding_box()["y"]) for b in buttons}
            assert len(tops) == 1, "a button went to a row of its own"
        page.screenshot(path=str(ARTIFACTS / "tour-narrow-panel.png"))
    finally:
        for job in jobs:
            registry.save(make_job(job.id, state="CLOSED"))
            registry.forget(job.id)


def test_a_cluster_cells_error_wraps_between_words_not_inside_an_identifier(lab, page):
    tag = uuid.uuid4().hex[:6]
    failing = (
        "%%cluster --nodes 1 --gpus 2\n"
        "raise ValueError('a_long_identifier_that_must_stay_whole ' * 12)"
    )
    page.goto(lab.notebook(f"wraps-{tag}.ipynb", [failing]))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-all-cells")
    error = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    expect(error.first).to_contain_text("CellError", timeout=120_000)
    for pre in error.locator("pre").all():
        assert pre.evaluate("e => getComputedStyle(e).wordBreak") == "normal"
    page.screenshot(path=str(ARTIFACTS / "tour-error-wraps.png"))
    run_command(page, "kernelmenu:shutdown")
