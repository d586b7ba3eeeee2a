"""The live widget in JupyterLab (real browser): a 2×2 cell with 2,000 lines per rank, Cancel."""

from __future__ import annotations

from conftest import ARTIFACTS, run_command, wait_kernel_idle
from playwright.sync_api import expect

LOUD = (
    "%%cluster --nodes 2 --gpus 2\nimport time\nfor i in range(2000):\n"
    "    print(f'rank {dist.get_rank()} line {i}')\n"
    "    if i % 250 == 0:\n        time.sleep(0.25)\n"
    "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
)


def last_line_in_view(page, node: int) -> bool:
    """Is the end of a node's log visible inside its box (scrolled to the tail)?"""
    return page.evaluate(
        """node => { const pre = document.querySelector(`pre[data-node="${node}"]`);
        const box = pre.parentElement; box.scrollIntoView();
        let text = pre.lastChild; while (text && text.nodeType !== 3) text = text.lastChild;
        const range = document.createRange();
        range.setStart(text, Math.max(0, text.length - 4)); range.setEnd(text, text.length);
        const at = range.getBoundingClientRect(), frame = box.getBoundingClientRect();
        return at.height > 0 && at.top >= frame.top - 1 && at.bottom <= frame.bottom + 1; }""",
        node,
    )


def test_widget_shows_each_node_its_ranks_state_gpus_and_transport(lab, page):
    page.goto(lab.notebook("widget.ipynb", [LOUD, "%cluster down"]))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-all-cells")
    state = page.locator(".jp-mn-state").first
    expect(state).to_have_text("RUNNING", timeout=120_000)
    expect(state).to_have_text("READY", timeout=120_000)
    node0, node1 = page.locator('pre[data-node="0"]'), page.locator('pre[data-node="1"]')
    expect(node0).to_contain_text("[rank 0] rank 0 line 1999", timeout=30_000)
    expect(node0).to_contain_text("[rank 1] rank 1 line 1999")
    expect(node0).not_to_contain_text("[rank 2]")
    assert last_line_in_view(page, 0)  # the tail is in view, not scrolled away
    page.locator(".lm-TabBar-tab", has_text="node 1").first.click()
    expect(node1).to_be_visible()
    expect(node1).to_contain_text("[rank 2] rank 2 line 1999")
    expect(node1).to_contain_text("[rank 3] rank 3 line 1999")
    assert last_line_in_view(page, 1)
    expect(page.locator(".jp-mn-gpu").first).to_contain_text("no GPU")
    expect(page.locator(".jp-mn-transport").first).to_contain_text("node 0: gloo (CPU)")
    result = page.locator(".jp-OutputArea-executeResult .jp-OutputArea-output").first
    expect(result).to_have_text("4.0")
    expect(page.get_by_text("cluster released")).to_have_count(1, timeout=30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".jp-mn-state").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "widget-2x2-2000-lines.png"))
    assert "IOPub message rate exceeded" not in page.content()
    assert "IOPub data rate exceeded" not in page.content()


def test_cancel_button_interrupts_the_cells_ranks(lab, page):
    cells = ["%%cluster --nodes 1 --gpus 2\nimport time\ntime.sleep(120)", "%cluster down"]
    page.goto(lab.notebook("cancel.ipynb", cells))
    wait_kernel_idle(page)
    run_command(page, "notebook:run-cell-and-select-next")
    state = page.locator(".jp-mn-state").first
    expect(state).to_have_text("RUNNING", timeout=120_000)
    cancel = page.locator("button.jp-mn-cancel").first
    expect(cancel).to_be_enabled()
    cancel.click()
    expect(page.locator(".jp-OutputArea-output", has_text="CellInterrupted")).to_have_count(
        1, timeout=20_000
    )
    expect(state).to_have_text("READY", timeout=20_000)
    expect(cancel).to_be_disabled()
    expect(page.locator(".jp-mn-transport").first).to_contain_text("gloo (CPU)")
    run_command(page, "notebook:move-cursor-down")  # clicking Cancel selected the first cell
    run_command(page, "notebook:run-cell")  # the next cell (down) runs: the kernel is fine
    expect(page.get_by_text("cluster released")).to_have_count(1, timeout=30_000)
