"""notebooks/06-slurm.ipynb under papermill, on the real Slurm of ``tests/support/slurm.py``."""

from __future__ import annotations

import nbformat
import papermill
import pytest

from tests.e2e.test_papermill import ROOT, _texts
from tests.support.polling import wait_until

pytestmark = pytest.mark.system


def test_the_slurm_notebook_runs_on_a_real_slurm(slurm, tmp_path, no_leftovers):
    out = tmp_path / "06-out.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks" / "06-slurm.ipynb"),
        str(out),
        kernel_name="jupyter_mn",
        parameters={"nodes": 2, "gpus": 1},
        progress_bar=False,
    )
    text = _texts(nbformat.read(out, as_version=4))
    assert "#SBATCH --nodes=2" in text and "python -m jupyter_mn.node.slurm" in text  # dry run
    assert "declares no GPUs" in text  # the test nodes have none: CPU ranks
    for rank, host in enumerate(slurm.nodes):
        assert f"[node {rank} rank {rank}] {host} job " in text and " sum 1.0" in text
    assert "(2, 2, 'slurm', 'cpu')" in text
    wait_until(lambda: not slurm.jobs(), 30, "%cluster down to leave squeue empty")
