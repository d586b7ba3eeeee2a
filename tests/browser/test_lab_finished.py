"""A notebook of finished ``%%cluster`` cells, saved with widget state as a real run leaves it
(``tests/support/finished.py``), opened in JupyterLab (real server and chromium): every cell shows
its final, folded state, with no widget left loading. ``bench/labheap.py`` measures the heap and
load time of 300 such cells; this checks only what they show."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.finished import CLUSTER_CELL, run_notebook
from tests.support.lab import ARTIFACTS

pytestmark = pytest.mark.system

CELLS = 3


def test_every_finished_cell_shows_its_folded_final_state_after_load(lab, page):
    run_notebook(lab.root / "finished.ipynb", CLUSTER_CELL, CELLS)
    page.goto(lab.fresh("/tree/finished.ipynb"))
    folded = page.locator(".jp-Notebook .jp-mn-done")
    expect(folded).to_have_count(CELLS, timeout=120_000)
    for index in range(CELLS):
        view = folded.nth(index)
        expect(view.locator(".jp-mn-state")).to_have_text("DONE")
        expect(view.locator('pre[data-node="1"]')).to_contain_text("[rank 1] loss 2.0")
    expect(page.locator(".jp-Notebook")).not_to_contain_text("Loading widget")
    expect(page.locator(".jp-Notebook")).not_to_contain_text("Error displaying widget")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".jp-Cell").first.screenshot(path=str(ARTIFACTS / "finished-cell-reopened.png"))
