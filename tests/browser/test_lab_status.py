"""The kernel status JupyterLab shows during a kernel's first ``%%cluster`` cell (real Lab, real
kernel, chromium): Busy for as long as the cell runs, although the page opens a kernel subshell
for the widget's comm meanwhile (``jupyter_mn/server/kernelstatus.py``) and sends on it when a
node's filter is clicked."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from playwright.sync_api import expect

from jupyter_mn.server.kernelstatus import SUBSHELL_MESSAGES
from tests.browser.test_lab_reload import take_the_gang_down
from tests.support.lab import ARTIFACTS, jupyter_server, run_command, wait_kernel_idle

pytestmark = pytest.mark.system

FIRST_CELL = (
    "%%cluster --nodes 2 --gpus 1\nimport time\nfor i in range(6):\n"
    "    print('step', i, flush=True)\n    time.sleep(1)\n'done'"
)
#: Every 100 ms: the status bar's word for the kernel, the first cell's prompt, and whether the
#: kernel has started the cell (its execute_input arrived). Between the click and that, the
#: kernel may still be handling what the page sent it on connecting (the widget manager's
#: comm_close, a subshell's deletion): real work, shown Busy then Idle, not the cell's.
#: ``__comms`` holds the comm messages the page sent that the kernel has not finished: the filter
#: click's, which the kernel handles after the cell (Busy, then Idle, once more).
SAMPLE = """() => {
  window.__status = [];
  window.__started = false;
  window.__comms = new Set();
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  kernel.anyMessage.connect((_, { msg, direction }) => {
    const type = msg.header.msg_type, state = msg.content.execution_state;
    if (direction === 'send' && type === 'comm_msg') window.__comms.add(msg.header.msg_id);
    if (type === 'execute_input') window.__started = true;
    if (type === 'status' && state === 'idle') window.__comms.delete(msg.parent_header.msg_id);
  });
  window.__sample = () => {
    const bar = document.querySelector('#jp-main-statusbar').innerText;
    const word = (bar.match(/\\b(Idle|Busy|Starting|Unknown|Connecting)\\b/) || ['?'])[0];
    const prompt = document.querySelector('.jp-Notebook .jp-Cell .jp-InputPrompt').innerText;
    window.__status.push([word, prompt.trim(), window.__started]);
  };
  window.__sampler = setInterval(window.__sample, 100);
}"""


def test_the_status_bar_says_busy_for_the_whole_first_cluster_cell_and_idle_after(lab, page):
    page.goto(lab.notebook("status.ipynb", [FIRST_CELL, "%cluster down"]))
    wait_kernel_idle(page)
    page.evaluate(SAMPLE)
    run_command(page, "notebook:run-cell")
    expect(page.locator(".jp-mn-state").first).to_have_text("RUNNING", timeout=120_000)
    try:
        # the log filter's choice: a comm message on the page's subshell
        page.locator(".jp-mn-filterbutton", has_text="node 1").click()
        expect(page.locator(".jp-mn-state").first).to_have_text("DONE", timeout=120_000)
        expect(page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").first).to_have_text("[1]:")
        page.wait_for_function("() => window.__comms.size === 0", timeout=30_000)
        expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=30_000)
        samples = page.evaluate(
            "() => { clearInterval(window.__sampler); window.__sample(); return window.__status; }"
        )
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "first-cell-status.json").write_text(json.dumps(samples))
        running = [word for word, prompt, started in samples if prompt == "[*]:" and started]
        busy_from = running.index("Busy")  # the status follows the request by one message
        assert busy_from <= 5, running[: busy_from + 1]
        assert set(running[busy_from:]) == {"Busy"}, running  # never Idle while the cell runs
        assert len(running) - busy_from > 40  # the cell ran for seconds, sampled all along
        assert samples[-1][:2] == ["Idle", "[1]:"]
    finally:  # a failure here leaves no gang to the tests after it
        take_the_gang_down(page)


def test_the_subshell_messages_are_added_to_the_untracked_ones_the_user_configured(
    tmp_path,
):
    args = (
        "--MappingKernelManager.untracked_message_types=mine",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    )
    with jupyter_server(tmp_path, *args) as server:
        url = f"{server.url}/lab?token={server.token}"
        with urllib.request.urlopen(url, timeout=30) as reply:
            page = reply.read().decode()
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S)[1])
    assert config["untracked_message_types"] == ["mine", *SUBSHELL_MESSAGES]
