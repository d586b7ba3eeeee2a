"""The Multi-node jobs panel after weeks of use, in a real JupyterLab driven by chromium: finished
jobs collapse under a count and page, "Clear finished" forgets only them, jobs read by notebook
and name, ORPHANED explains itself, and the panel has its own icon and title."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from jupyter_mn.jobs.registry import Registry
from tests.support.jobs import make_job
from tests.support.lab import ARTIFACTS, job_item, open_panel

pytestmark = pytest.mark.system

FINISHED = 65
PAGE = 20  # FINISHED_PAGE in labextension/src/panel.ts
#: How tall the panel's content is (the panel itself fills the sidebar).
CONTENT_HEIGHT = """n => Math.round(
  Math.max(...[...n.children].map(c => c.getBoundingClientRect().bottom))
  - n.getBoundingClientRect().top + n.scrollTop)"""


def test_finished_jobs_collapse_under_a_count_page_and_clear_without_touching_live_ones(lab, page):
    registry = Registry()
    registry.forget_finished()  # what earlier tests of this session left
    live_before = {job.id for job in registry.jobs()}
    now = time.time()
    for i in range(FINISHED):
        registry.save(
            make_job(
                f"old-{i:02d}-1a2b3c4d",
                name=f"old-{i:02d}",
                state="ORPHANED" if i % 9 == 0 else "CLOSED",
                started=now - 3600 - 60 * i,
                ended=now - 3000 - 60 * i,  # old-00 ended last
                notebook=str(lab.root / "weeks" / f"run{i % 3}.ipynb"),
            )
        )
    live_id = "live-5e6f7a8b"
    registry.save(make_job(live_id, name="live", notebook=str(lab.root / "train.ipynb")))
    page.goto(lab.fresh())
    panel = open_panel(page)

    live = job_item(panel, "live")
    expect(live).to_have_count(1, timeout=30_000)
    height = panel.evaluate(CONTENT_HEIGHT)  # the same moment as main's 10,600 px list
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "panel-65-finished-height.txt").write_text(f"{height} px\n")
    page.screenshot(path=str(ARTIFACTS / "panel-65-finished-collapsed.png"))
    finished = panel.locator(".jp-mn-Group-finished")
    toggle = finished.locator(".jp-mn-Group-toggle")
    expect(toggle).to_have_text(f"▸ Finished ({FINISHED})")  # collapsed: only the count
    expect(finished.locator("li.jp-mn-Job")).to_have_count(0)
    expect(finished.locator(".jp-mn-Finished-more")).to_be_hidden()
    assert live.bounding_box()["y"] < finished.bounding_box()["y"]  # the live job on top
    assert finished.bounding_box()["height"] < 60  # the collapsed group: one line

    # named by notebook and --name, the id smaller beside them
    expect(live.locator(".jp-mn-Job-title > span")).to_have_text(["train.ipynb", "live"])
    expect(live.locator(".jp-mn-Job-id")).to_have_text(live_id)

    toggle.click()
    expect(toggle).to_have_text(f"▾ Finished ({FINISHED})")
    items = finished.locator("li.jp-mn-Job")
    expect(items).to_have_count(PAGE)
    newest = items.first.locator(".jp-mn-Job-title > span")
    expect(newest).to_have_text(["run0.ipynb", "old-00"])
    more = finished.locator(".jp-mn-Finished-more")
    expect(more).to_have_text(f"Show {PAGE} more ({FINISHED - PAGE} hidden)")
    for shown in (2 * PAGE, 3 * PAGE):
        more.click()
        expect(items).to_have_count(shown)
    expect(more).to_have_text(f"Show {FINISHED - 3 * PAGE} more ({FINISHED - 3 * PAGE} hidden)")
    more.click()
    expect(items).to_have_count(FINISHED)
    expect(more).to_be_hidden()

    orphan = job_item(panel, "old-09")
    state = orphan.locator(".jp-mn-State")
    expect(state).to_have_text("ORPHANED")
    help_text = state.get_attribute("title")
    assert "the kernel that ran this job is gone" in help_text and "jupyter mn gc" in help_text
    expect(job_item(panel, "old-01").locator(".jp-mn-State")).not_to_have_attribute(
        "title", help_text
    )
    page.screenshot(path=str(ARTIFACTS / "panel-65-finished-open.png"))

    finished.get_by_role("button", name="Clear finished").click()
    page.locator(".jp-Dialog").get_by_role("button", name="Clear").click()
    expect(finished).to_be_hidden(timeout=10_000)  # no finished job left: no group
    expect(live).to_have_attribute("data-state", "READY")
    assert {j.id for j in registry.jobs()} == live_before | {live_id}
    assert registry.job(live_id).state == "READY"
    registry.save(make_job(live_id, name="live", state="CLOSED"))
    registry.forget(live_id)


def test_the_panel_has_its_own_icon_and_a_title_no_other_panel_uses(lab, page):
    page.goto(lab.fresh())
    panel = open_panel(page)
    expect(panel.locator(".jp-mn-ClustersPanel-title")).to_have_text("Multi-node jobs")
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-mn-clusters"]')
    expect(tab).to_have_attribute("title", "Multi-node jobs (jupyter_mn)")
    expect(tab.locator('svg[data-icon="jupyter-mn:jobs"]')).to_have_count(1)
