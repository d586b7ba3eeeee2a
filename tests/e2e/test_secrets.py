"""A token planted with ``--env`` (and given to papermill as a parameter) reaches the ranks and
nothing else a gang leaves behind: no process's command line while it runs (the preflight
probe's included), no registry row, log file or other file of the runtime dir, no output or
source of the saved notebook (``%cluster config`` included), nothing papermill printed."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest

from jupyter_mn.jobs.registry import Registry
from tests.e2e.test_papermill import _notebook, _texts

PAPERMILL = Path(sys.executable).with_name("papermill")
#: Shaped like a Hugging Face token, made fresh for each run.
TOKEN = "hf_" + uuid.uuid4().hex + "Zx"
CELLS = [
    "token = ''",
    "%%cluster --nodes 2 --gpus 1 --preflight --env HF_TOKEN=$token --name secret-scan\n"
    "import hashlib, os\n"
    "print('ranks see', hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest()[:12])",
    "%cluster config",
    "%cluster exec --all-nodes -- echo exec sees ${#HF_TOKEN} characters",
    "%cluster down",
]


class CommandLines:
    """Every process's command line, sampled until stopped (a probe lives about a second)."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.seen: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(0.02):
            for proc in psutil.process_iter(["pid", "cmdline"]):
                if proc.info["pid"] != self.skip and proc.info["cmdline"]:
                    self.seen.add(" ".join(proc.info["cmdline"]))

    def done(self) -> set[str]:
        self.stop.set()
        self.thread.join()
        return self.seen


@pytest.mark.slow
def test_a_planted_token_reaches_the_ranks_and_no_artifact(tmp_path, no_leftovers):
    cells = [("parameters", CELLS[0]), *((None, cell) for cell in CELLS[1:])]
    source, out = _notebook(cells, tmp_path / "in.ipynb"), tmp_path / "out.ipynb"
    args = [str(PAPERMILL), "-k", "jupyter_mn", str(source), str(out), "--no-progress-bar"]
    run = subprocess.Popen(
        [*args, "-p", "token", TOKEN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    sampled = CommandLines(skip=run.pid)
    try:
        stdout, stderr = run.communicate(timeout=300)
    finally:
        lines = sampled.done()
    assert run.returncode == 0, stderr
    nb = nbformat.read(out, 4)
    shown = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    outputs = _texts(shown)
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    assert f"[node 1 rank 1] ranks see {digest}" in outputs  # the ranks got it
    assert f"[node 1] exec sees {len(TOKEN)} characters" in outputs
    assert "('HF_TOKEN', '***')" in outputs  # %cluster config names it, masked
    assert any("jupyter_mn.node.probe" in line for line in lines)  # the probe was sampled
    # papermill's own command line holds it (the test put it there), also in a child it forks,
    # for the moment before that child execs what it runs
    ours = " ".join([*args, "-p", "token", TOKEN])
    leaks = [line for line in lines if TOKEN in line and not line.endswith(ours)]
    assert leaks == [], "a command line holds the token"
    assert TOKEN not in nbformat.writes(nbformat.v4.new_notebook(cells=shown))
    assert TOKEN not in stdout + stderr
    registry = Registry()
    job = registry.resolve("secret-scan")
    assert "papermill -k jupyter_mn" in job.launcher and f"{out} --no" in job.launcher
    assert job.launcher.endswith("-p token ***")
    files = [p for p in registry.root.rglob("*") if p.is_file()]
    assert registry.log_dir(job.id) in {p.parent for p in files}
    assert [p for p in files if TOKEN.encode() in p.read_bytes()] == []
