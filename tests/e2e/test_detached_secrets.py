"""What a detached run is given stays out of what others read: an ``--env`` value shows masked
wherever the run's command line shows (``jupyter mn list --json``, the registry), and another
local user cannot turn ``-o OUT`` into a write elsewhere."""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from pathlib import Path

import nbformat

from jupyter_mn.jobs.registry import Registry
from tests.e2e.test_detached_runs import ended, mn, notebook, submit
from tests.support.otheruser import other_user


def _files_holding(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_an_env_value_reaches_the_ranks_shows_masked_in_list_and_is_nowhere_in_the_registry(
    tmp_path, no_leftovers
):
    value = "v" + uuid.uuid4().hex
    nb = notebook(
        tmp_path / "env.ipynb",
        "x = 1",
        "%%cluster --nodes 1 --gpus 1\nimport hashlib, os\n"
        "print(hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest())",
    )
    job_id = submit(str(nb), "--env", f"WANDB_API_KEY={value}", f"--env=SEED={value}")
    run = ended(job_id)
    assert run.state == "SUCCEEDED", run.error
    assert "--env WANDB_API_KEY=*** --env=SEED=***" in run.launcher, run.launcher
    assert value not in mn("list", "--json").stdout
    cell = nbformat.read(run.output, 4).cells[-1]
    ranks = "".join(o.get("text", "") for o in cell.outputs)
    assert hashlib.sha256(value.encode()).hexdigest() in ranks, ranks
    assert _files_holding(Registry().root, value) == []


def test_a_link_another_user_places_at_the_output_is_replaced_not_written_through(
    tmp_path, no_leftovers
):
    """``-o /tmp/out.ipynb``: another user has put a link there to a file of ours; the run
    writes its notebook at OUT (a file of ours now, 0600) and the link's target is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    nb = notebook(tmp_path / "out.ipynb", "token = ''", "print(len(token))")
    with other_user() as other:
        other.sh(f"ln -s {victim} out.ipynb")
        out = other.shared / "out.ipynb"
        run = ended(submit(str(nb), "-o", str(out), "-p", "token", "hf_" + uuid.uuid4().hex))
        assert run.state == "SUCCEEDED", run.error
        assert victim.read_text() == "mine\n"
        assert not out.is_symlink() and out.stat().st_uid == os.getuid()
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
        assert nbformat.read(out, 4).cells[-1].outputs[0]["text"] == "35\n"
