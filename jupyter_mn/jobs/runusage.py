"""What a submitted run's gangs used, written into its executed notebook and its row at its end.

A run's gangs are the rows its kernel's recorder wrote: the kernel's pid on this host (the
kernel runs beside its runner), started after the run did, so a pid reused later is not taken
for it. The executed notebook gets ``metadata.jupyter_mn``: the run, its state, its totals by
unit and one entry per gang. The run's own row holds the total of its largest unit; its
``up`` stays unset, so ``jupyter mn usage`` counts the gangs, not the run as well.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from . import usage
from .registry import HOST, JobModel

#: The executed notebook's metadata key.
KEY = "jupyter_mn"


def gangs_of(jobs: list[JobModel], kernel_pid: int, since: float) -> list[JobModel]:
    """The gangs the run's kernel (``kernel_pid``, started at ``since`` or later) made, oldest
    first."""
    mine = [
        job
        for job in jobs
        if not job.submitted and job.pid == kernel_pid and job.host == HOST and job.started >= since
    ]
    return sorted(mine, key=lambda job: job.started)


def totals(gangs: list[JobModel]) -> dict[str, float]:
    """The gangs' count by unit (``GPU-hours``, ``rank-hours``): ``jupyter mn usage``'s sums."""
    return {t.unit.value: t.hours for t in usage.totals(gangs, lambda _: "", since=0.0)}


def metadata(run: JobModel, state: str, gangs: list[JobModel]) -> dict[str, Any]:
    """The run's ``metadata.jupyter_mn``."""
    return {
        "job": run.id,
        "state": state,
        "gpu_hours": totals(gangs),
        "gangs": [
            {
                "id": g.id,
                "shape": g.shape,
                "backend": g.backend,
                "unit": g.unit,
                "gpu_hours": g.gpu_hours,
            }
            for g in gangs
        ],
    }


def write(notebook: Path, meta: dict[str, Any]) -> None:
    """Put ``meta`` into the executed notebook, whole (a temporary file renamed, with the
    notebook's mode), so a ``fetch`` meanwhile reads the old or the new one."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    nb.metadata[KEY] = meta
    fd, temp = tempfile.mkstemp(dir=notebook.parent, prefix=f".{notebook.name}.")
    try:
        os.fchmod(fd, os.stat(notebook).st_mode & 0o777)
        with os.fdopen(fd, "w") as f:
            nbformat.write(nb, f)
        os.replace(temp, notebook)
    except BaseException:
        os.unlink(temp)
        raise
