"""notebooks/03-papermill.ipynb from a terminal: output, registry entry, logs, a failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from jupyter_mn.jobs.registry import Registry

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "03-papermill.ipynb"
PAPERMILL = Path(sys.executable).with_name("papermill")


def papermill(out: Path, *params: str) -> subprocess.CompletedProcess:
    args = [str(PAPERMILL), "-k", "jupyter_mn", str(NOTEBOOK), str(out), "--no-progress-bar"]
    for param in params:
        args += ["-p", *param.split("=", 1)]
    return subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=out.parent)


def _text(path: Path) -> str:
    nb = nbformat.read(path, 4)
    return "\n".join(
        o.get("text") or o.get("data", {}).get("text/plain", "")
        for c in nb.cells
        for o in c.get("outputs", [])
    )


def test_batch_run_writes_output_registry_and_logs(tmp_path, no_leftovers):
    run = papermill(tmp_path / "out.ipynb", "nodes=2", "gpus=1", "steps=10", "name=batch-ok")
    assert run.returncode == 0, run.stderr
    text = _text(tmp_path / "out.ipynb")
    assert "[node 1 rank 1] step 10/10 loss" in text and "mean final loss" in text
    job = Registry().resolve("batch-ok")
    assert (job.state, job.cells, job.shape) == ("CLOSED", 1, "2×1")
    assert "papermill" in job.launcher and str(NOTEBOOK) in job.launcher
    logs = subprocess.run(
        [sys.executable, "-m", "jupyter_mn.cli", "logs", "batch-ok", "--rank", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    mark, first, *_ = logs.splitlines()  # where the cell started, then its lines
    assert mark.startswith("──── In[") and first.startswith("[node 1 rank 1] step 10/10 loss")


@pytest.mark.slow
def test_a_failing_rank_fails_the_batch_run_and_the_job_says_why(tmp_path, no_leftovers):
    run = papermill(tmp_path / "out.ipynb", "nodes=2", "gpus=1", "fail_at=3", "name=batch-bad")
    assert run.returncode == 1
    assert "CellError: rank 1 (node 1) raised RuntimeError: simulated failure at step 3" in (
        run.stderr
    )
    out = nbformat.read(tmp_path / "out.ipynb", 4)
    failed = [c for c in out.cells if c.metadata.get("papermill", {}).get("status") == "failed"]
    assert len(failed) == 1 and "--name $name" in failed[0].source
    job = Registry().resolve("batch-bad")
    assert job.error == "rank 1 (node 1): RuntimeError: simulated failure at step 3"
