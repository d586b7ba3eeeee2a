"""A real JupyterLab server and a real browser (Debian chromium driven by Python playwright).

Screenshots go to ``test-artifacts/`` (kept by CI as evidence; ignored by git).
"""

from __future__ import annotations

import json
import os
import socket
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
        workspace = uuid.uuid4().hex[:8]  # a fresh workspace: no state from other tests
        return f"{self.url}/lab/workspaces/{workspace}/tree/{name}?reset&token={self.token}"

    def api(self, path: str) -> object:
        req = urllib.request.Request(
            f"{self.url}{path}", headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("lab")
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    token, port = uuid.uuid4().hex, _free_port()
    log = (root / "lab.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            f"--LabApp.workspaces_dir={root / '.ws'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
        ],
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(root / ".settings")},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    deadline = time.monotonic() + 90
    while True:
        try:
            lab.api("/api/status")
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("jupyter lab did not start:\n" + (root / "lab.log").read_text())
            time.sleep(0.2)  # polling for the port to answer
    yield lab
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


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
