"""Submitted runs in a real JupyterLab driven by chromium: the Multi-node jobs panel follows a run
(state, cell k of n, elapsed, rank-hours) and opens its executed notebook; the "Submit notebook"
command submits the open notebook shaped by its first ``%%cluster`` cell, asking for its
parameters, or shows why not and submits nothing; the filter box narrows the list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import expect

from jupyter_mn.jobs.registry import Registry
from tests.support.jobs import make_job
from tests.support.lab import ARTIFACTS, job_item, open_panel, show_finished

pytestmark = pytest.mark.system

#: A submitted run starts a kernel (and a gang), under whatever else this machine runs.
RUN_MS = 240_000


def write_notebook(path, *cells: str, parameters: str | None = None) -> None:
    code = [nbformat.v4.new_code_cell(c) for c in cells]
    if parameters is not None:
        code.insert(0, nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb = nbformat.v4.new_notebook(cells=code)
    nb.metadata["kernelspec"] = {"name": "jupyter_mn", "display_name": "jupyter_mn"}
    nbformat.write(nb, path)


def test_the_panel_shows_a_submitted_runs_progress_and_opens_its_executed_notebook(lab, page):
    gate = lab.root / "progress.gate"
    wait = f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n"
    write_notebook(
        lab.root / "progress.ipynb",
        "print('first cell done')",
        wait + "print('gate passed')",
        "print('last cell done')",
    )
    submit = [sys.executable, "-m", "jupyter_mn.cli", "submit", "progress.ipynb"]
    out = ["-o", "progress-out.ipynb", "--name", "progress"]
    subprocess.run([*submit, *out], cwd=lab.root, check=True, timeout=60, capture_output=True)
    try:
        page.goto(lab.fresh())
        panel = open_panel(page)
        item = job_item(panel, "progress")
        expect(item.locator(".jp-mn-Job-cells")).to_have_text("cell 2 of 3", timeout=RUN_MS)
        expect(item).to_have_attribute("data-state", "RUNNING")
        expect(item.locator(".jp-mn-Job-elapsed")).to_have_text(re.compile(r"^\d\d:\d\d$"))
        # a run ends when cancelled: it has no gang of its own to release, and is not forgotten
        # while it runs
        actions = item.locator(".jp-mn-Job-actions button")
        expect(actions).to_have_text(["View", "Logs", "Output", "Cancel"])
        expect(item.locator(".jp-mn-Badge-gpu")).to_have_count(0)  # its gangs' cards have theirs
        page.screenshot(path=str(ARTIFACTS / "panel-run-at-cell-2.png"))
    finally:
        gate.touch()
    show_finished(panel)
    expect(item).to_have_attribute("data-state", "SUCCEEDED", timeout=RUN_MS)
    expect(item.locator(".jp-mn-Job-cells")).to_have_text("cell 3 of 3")
    expect(actions).to_have_text(["View", "Logs", "Output", "Forget"])

    item.get_by_role("button", name="Output").click()
    tab = page.locator(".lm-TabBar-tab.jp-mod-current", has_text="progress-out.ipynb")
    expect(tab).to_be_visible(timeout=30_000)
    notebook = page.locator(".jp-NotebookPanel:visible")
    for text in ("first cell done", "gate passed", "last cell done"):
        expect(notebook.locator(".jp-OutputArea-output", has_text=text)).to_have_count(1)
    page.screenshot(path=str(ARTIFACTS / "panel-run-output-opened.png"))


def test_the_submit_command_asks_for_parameters_and_the_run_appears_shaped_by_its_cluster_cell(
    lab, page
):
    write_notebook(
        lab.root / "sweep.ipynb",
        "print(f'steps={steps} label={label}')",
        "%%cluster --nodes 2 --gpus 1\nsize = dist.get_world_size()",
        parameters="steps = 2\nlabel = 'small'",
    )
    before = {job.id for job in Registry().jobs()}
    page.goto(lab.fresh("/tree/sweep.ipynb"))
    button = page.locator(".jp-NotebookPanel-toolbar .jp-mn-SubmitButton")
    expect(button).to_be_visible(timeout=60_000)
    button.click()

    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator(".jp-mn-SubmitForm-cluster")).to_have_text("%%cluster --nodes 2 --gpus 1")
    expect(dialog.locator(".jp-mn-SubmitForm-name")).to_have_text(["steps", "label"])
    expect(dialog.locator("input[name=label]")).to_have_value("'small'")  # a value, as it is
    expect(dialog.locator("input[name=steps]")).to_be_focused()
    dialog.locator("input[name=steps]").fill("7")
    page.screenshot(path=str(ARTIFACTS / "submit-parameters-dialog.png"))
    dialog.get_by_role("button", name="Submit").click()

    panel = page.locator("#jupyter-mn-clusters")
    expect(panel).to_be_visible(timeout=30_000)  # the command brings the panel up
    item = job_item(panel, "sweep")
    expect(item).to_have_count(1, timeout=30_000)
    expect(item.locator(".jp-mn-Job-shape")).to_have_text("2×1 · local")
    show_finished(panel)
    expect(item).to_have_attribute("data-state", "SUCCEEDED", timeout=RUN_MS)
    expect(item.locator(".jp-mn-Job-cells")).to_have_text("cell 3 of 3")  # papermill's not counted
    expect(item.locator(".jp-mn-Job-usage")).to_have_text(re.compile(r"^(< )?\d.* rank-hours$"))
    page.screenshot(path=str(ARTIFACTS / "submit-run-succeeded.png"))
    (run,) = [job for job in Registry().jobs() if job.id not in before and job.submitted]
    executed = nbformat.read(run.output, as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "steps=7 label=small" in printed  # the typed value, the notebook's for the other
    assert run.launcher == "JupyterLab: submit --nodes 2 --gpus 1"

    # its executed notebook: in the panel's folder, opened without a kernel, gone when forgotten
    assert Path(run.output) == lab.root / "jupyter-mn-runs" / f"{run.id}.ipynb"
    assert not (lab.root / f"{run.id}.ipynb").exists()  # none beside the notebook
    item.get_by_role("button", name="Output").click()
    expect(page.locator(".lm-TabBar-tab.lm-mod-current", has_text=f"{run.id}.ipynb")).to_be_visible(
        timeout=30_000
    )
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget; return w && w.context"
        " && w.context.isReady && w.sessionContext.isReady; }"
    )
    session = "() => window.jupyterapp.shell.currentWidget.sessionContext.session"
    assert page.evaluate(session) is None  # no kernel: the run's is gone, this is to read
    output = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output", has_text="steps=7")
    expect(output).to_have_count(1)
    item.get_by_role("button", name="Forget").click()
    expect(item).to_have_count(0, timeout=30_000)
    assert not Path(run.output).exists()


def test_the_submit_command_shows_a_refusal_and_submits_nothing(lab, page):
    write_notebook(lab.root / "broken.ipynb", "%%cluster --nodes 0\nprint(1)")
    before = {job.id for job in Registry().jobs()}
    page.goto(lab.fresh("/tree/broken.ipynb"))
    button = page.locator(".jp-NotebookPanel-toolbar .jp-mn-SubmitButton")
    expect(button).to_be_visible(timeout=60_000)
    button.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator(".jp-Dialog-header")).to_have_text("Submit failed")
    expect(dialog.locator(".jp-Dialog-body")).to_contain_text("nodes must be ≥ 1, got 0")
    page.screenshot(path=str(ARTIFACTS / "submit-refused.png"))
    assert {job.id for job in Registry().jobs()} == before


def test_the_filter_box_narrows_the_list_by_name_notebook_and_state(lab, page):
    registry = Registry()
    jobs = [
        make_job("flt-a-1a2b3c4d", name="flt-alpha", notebook=str(lab.root / "flt-train.ipynb")),
        make_job(
            "flt-b-5e6f7a8b",
            name="flt-beta",
            state="RUNNING",
            running="In[3]",
            notebook=str(lab.root / "flt-eval.ipynb"),
        ),
        make_job(  # a READY gang whose last cell failed
            "flt-c-9c0d1e2f",
            name="flt-gamma",
            last_cell={"id": 4, "elapsed": 1.5, "outcome": "FAILED", "error": "ValueError: x"},
        ),
    ]
    for job in jobs:
        registry.save(job)
    try:
        page.goto(lab.fresh())
        panel = open_panel(page)
        alpha, beta = job_item(panel, "flt-alpha"), job_item(panel, "flt-beta")
        gamma = job_item(panel, "flt-gamma")
        expect(alpha).to_have_count(1, timeout=30_000)
        expect(beta).to_have_count(1)
        box = panel.get_by_role("searchbox", name="Filter jobs")
        for text, shown in [
            ("flt-eval", beta),  # by notebook
            ("FLT-ALPHA", alpha),  # by name, any case
            ("flt alpha ready", alpha),  # every word: one of ours, and READY
            ("flt running", beta),
            ("flt failed", gamma),  # its last cell's outcome, not the gang's state
        ]:
            box.fill(text)
            expect(panel.locator("li.jp-mn-Job")).to_have_count(1)
            expect(shown).to_have_count(1)
        page.screenshot(path=str(ARTIFACTS / "panel-filtered.png"))
        box.fill("no-such-job")
        expect(panel.locator("li.jp-mn-Job")).to_have_count(0)
        expect(panel.locator(".jp-mn-ClustersPanel-status")).to_have_text(
            'No job matches "no-such-job".'
        )
        box.fill("")
        expect(alpha).to_have_count(1)
        expect(beta).to_have_count(1)
    finally:
        for job in jobs:
            registry.save(make_job(job.id, name=job.name, state="CLOSED"))
            registry.forget(job.id)
