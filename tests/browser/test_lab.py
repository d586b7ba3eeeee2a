"""%%cluster from JupyterLab in a real browser, with the "Python 3 (jupyter_mn)" kernel."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.support.lab import run_command, wait_kernel_idle


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
