"""The driver Job of a detached run on Kubernetes (``jobs/kuberun.py``), built as ``submit
--backend kubernetes`` builds it, for the manifest tests and their real twins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat

from jupyter_mn.jobs import kuberun
from jupyter_mn.jobs.podlog import new_key
from jupyter_mn.jobs.registry import JobModel
from jupyter_mn.jobs.submit import Prepared, Submission


def driver_job(folder: Path, namespace: str) -> dict[str, Any]:
    """The driver's Job for an empty notebook in ``folder``, in ``namespace``."""
    notebook = folder / "run.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), notebook)
    model = JobModel("r1", "run", "jmn-r1", "kubernetes", "1x1", 1, 1, "queued", 0.0)
    submission = Submission("r1", str(notebook), str(folder / "out.ipynb"), {})
    prepared = Prepared(submission, model, {})
    job, _ = kuberun.manifests(prepared, namespace, "agent:1", "", new_key())
    return job
