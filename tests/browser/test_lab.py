"""%%cluster from JupyterLab in a real browser, with the "Python 3 (jupyter_mn)" kernel and its
logo in the launcher."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.lab import ARTIFACTS, run_command, wait_kernel_idle

pytestmark = pytest.mark.system


def test_the_launcher_shows_the_kernels_logo(lab, page):
    page.goto(lab.fresh())
    card = page.locator('.jp-LauncherCard[title="Python 3 (jupyter_mn)"]').first
    logo = card.locator("img.jp-Launcher-kernelIcon")
    expect(logo).to_have_attribute(
        "src", re.compile(r"kernelspecs/jupyter_mn/logo-64x64\.png"), timeout=60_000
    )
    page.wait_for_function(
        "img => img.complete && img.naturalWidth === 64", arg=logo.element_handle()
    )
    ARTIFACTS.mkdir(exist_ok=True)
    card.screenshot(path=str(ARTIFACTS / "launcher-kernel-logo.png"))


def test_text_view_streams_labelled_output_into_the_notebook(lab, page):
    url = lab.notebook(
        "lab-quick.ipynb",
        [
            "%%cluster --nodes 2 --gpus 1 --view text\nt = torch.ones(1) * (dist.get_rank() + 1)\n"
            "dist.all_reduce(t)\nprint('sum is', t.item())\nt.item()",
            "%cluster down",
        ],
    )
    page.goto(url)
    wait_kernel_idle(page)
    run_command(page, "notebook:run-all-cells")
    output = page.locator(".jp-OutputArea-output")
    expect(output.filter(has_text="[node 1 rank 1] sum is 3.0")).to_have_count(1, timeout=90_000)
    expect(output.filter(has_text="[node 0 rank 0] sum is 3.0")).to_have_count(1)
    expect(page.locator(".jp-OutputArea-executeResult .jp-OutputArea-output").first).to_have_text(
        "3.0"
    )
    expect(output.filter(has_text="cluster released")).to_have_count(1, timeout=30_000)
