"""Where the executed notebooks of runs submitted from JupyterLab go: one folder under the
server's root, ``jupyter-mn-runs/<job id>.ipynb``, that the panel manages. Its Output button opens
one without a kernel (the run's kernel is gone; running it again is a new submit), and forgetting
a run (Forget, Clear finished) deletes its executed notebook with its logs, so none piles up
beside the notebooks. A path given with ``jupyter mn submit -o`` is the user's, never deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

#: The folder, under the server's root.
FOLDER = "jupyter-mn-runs"


def output_path(root: str, job_id: str) -> Path:
    """Where the run ``job_id`` writes its executed notebook (its folder made here)."""
    folder = Path(root) / FOLDER
    folder.mkdir(exist_ok=True)
    return folder / f"{job_id}.ipynb"


def remove_outputs(root: str, job_ids: Iterable[str]) -> None:
    """Delete the executed notebooks of the forgotten runs ``job_ids`` (none: a gang, or a run
    that kept its notebook elsewhere)."""
    for job_id in job_ids:
        (Path(root) / FOLDER / f"{job_id}.ipynb").unlink(missing_ok=True)
