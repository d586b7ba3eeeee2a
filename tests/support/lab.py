"""A real JupyterLab server and a real browser (Debian chromium driven by Python playwright).

Screenshots go to ``test-artifacts/`` (kept by CI as evidence; ignored by git).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from jupyter_mn.node.ports import listen_port

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
#: Chromium makes no outbound connection on this closed network with these.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Lab:
    url: str
    token: str
    root: Path

    def notebook(self, name: str, cells: list[str], kernel: str = "jupyter_mn") -> str:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
        nbformat.write(nb, self.root / name)
        return self.fresh(f"/tree/{name}")

    def fresh(self, path: str = "") -> str:
        """Lab's URL in a workspace of its own: no layout restored from other tests."""
        workspace = uuid.uuid4().hex[:8]
        return f"{self.url}/lab/workspaces/{workspace}{path}?reset&token={self.token}"

    def api(self, path: str, method: str = "GET", token: bool = True) -> object:
        """Call the REST API with the token header (no token: as an anonymous client)."""
        headers = {"Authorization": f"token {self.token}"} if token else {}
        req = urllib.request.Request(f"{self.url}{path}", method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
            return json.loads(body) if body else None


@contextlib.contextmanager
def jupyter_server(root: Path, *args: str, module: str = "jupyterlab") -> Iterator[Lab]:
    """A real Jupyter server (``python -m <module>``) on a free port; always stopped."""
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    token, port = uuid.uuid4().hex, listen_port("127.0.0.1")  # port_retries=0
    log_path = root / f"{module}-{port}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            *args,
        ],
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(root / ".settings")},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Lab(f"http://127.0.0.1:{port}", token, root)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                server.api("/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{module} did not start:\n" + log_path.read_text())
                time.sleep(0.2)  # polling for the port to answer
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def lab_server(root: Path) -> contextlib.AbstractContextManager[Lab]:
    """JupyterLab serving ``root``, its app on ``window.jupyterapp``."""
    return jupyter_server(
        root,
        f"--LabApp.workspaces_dir={root / '.ws'}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.expose_app_in_browser=True",
    )


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab_server(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="session")
def notebook7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A Notebook 7 server (``python -m notebook``); its notebooks open at ``/notebooks/``."""
    root = tmp_path_factory.mktemp("nb7")
    with jupyter_server(
        root, "--JupyterNotebookApp.expose_app_in_browser=True", module="notebook"
    ) as server:
        yield server


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture
def page(browser: object, request: pytest.FixtureRequest) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    yield pg
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
    context.close()


def wait_kernel_idle(page: object, timeout_ms: int = 60_000) -> None:
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session"
        " && w.sessionContext.session.kernel; return k && k.status === 'idle'; }",
        timeout=timeout_ms,
    )


def run_command(page: object, command: str) -> None:
    """Fire a Lab command without awaiting it (run-cell resolves only when the cell ends)."""
    page.evaluate("c => { window.jupyterapp.commands.execute(c); }", command)


def failed_log_reads(page: object, seconds: float = 10) -> int:
    """Fail the page's job-log reads for ``seconds`` and count them: a view that backs off asks a
    few times, one that does not asks every second. The server answers again afterwards."""
    asked = []
    logs = "**/jupyter-mn/api/jobs/*/logs?*"
    page.route(logs, lambda route: (asked.append(route.request.url), route.abort()))
    page.wait_for_timeout(seconds * 1000)  # an observation window: the count is the check
    page.unroute(logs)
    return len(asked)


def open_panel(page: object) -> object:
    """Open the Multi-node jobs panel from the left sidebar; returns its locator."""
    from playwright.sync_api import expect

    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-mn-clusters"]')
    expect(tab).to_be_visible(timeout=60_000)
    # The tab shows before Lab has restored its layout, and restoring sets which sidebar panel is
    # open: a click before that can be undone (CI saw it). Click once the layout is final.
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("() => window.jupyterapp.restored")
    if "lm-mod-current" not in (tab.get_attribute("class") or "").split():
        tab.click()
    panel = page.locator("#jupyter-mn-clusters")
    expect(panel).to_be_visible()
    return panel


def job_item(panel: object, name: str) -> object:
    """The panel's entry for the job named ``name``."""
    return panel.locator("li.jp-mn-Job").filter(
        has=panel.page.locator(".jp-mn-Job-name", has_text=name)
    )


def show_finished(panel: object) -> None:
    """Open the panel's "Finished" group (collapsed by default) once it has a job."""
    from playwright.sync_api import expect

    toggle = panel.locator(".jp-mn-Group-toggle")
    expect(toggle).to_be_visible(timeout=60_000)
    if toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
