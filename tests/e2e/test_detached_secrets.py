"""What a detached run is given stays out of what others read: an ``--env`` value shows masked
wherever the run's command line shows (``jupyter mn list --json``, the registry)."""

from __future__ import annotations

import uuid
from pathlib import Path

from jupyter_mn.jobs.registry import Registry
from tests.e2e.test_detached_runs import ended, mn, notebook, submit


def _files_holding(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_an_env_value_shows_masked_in_list_and_is_nowhere_in_the_registry(tmp_path, no_leftovers):
    value = "v" + uuid.uuid4().hex
    nb = notebook(tmp_path / "env.ipynb", "x = 1", "print(x)")
    job_id = submit(str(nb), "--env", f"WANDB_API_KEY={value}", f"--env=SEED={value}")
    run = ended(job_id)
    assert run.state == "SUCCEEDED", run.error
    assert "--env WANDB_API_KEY=*** --env=SEED=***" in run.launcher, run.launcher
    assert value not in mn("list", "--json").stdout
    assert _files_holding(Registry().root, value) == []
