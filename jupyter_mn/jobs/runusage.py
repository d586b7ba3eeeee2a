"""What a submitted run's gangs used, written into its executed notebook and its row at its end.

A run's gangs are the rows its kernel's recorder wrote with the run's id (``JobModel.run``: the
kernel inherits its runner's ``JUPYTER_MN_JOB``). The executed notebook gets
``metadata.jupyter_mn``: the run, its state, its totals by unit and one entry per gang. The
run's own row holds the total of its largest unit; its ``up`` stays unset, so
``jupyter mn usage`` counts the gangs, not the run as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model import usage
from .registry import JobModel
from .wholefile import write_whole

#: The executed notebook's metadata key.
KEY = "jupyter_mn"


def gangs_of(jobs: list[JobModel], run: str) -> list[JobModel]:
    """The gangs the kernel of the run ``run`` (its id) made, oldest first."""
    return sorted((job for job in jobs if job.run == run), key=lambda job: job.started)


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
    """Put ``meta`` into the executed notebook, whole (``wholefile.py``), so a ``fetch``
    meanwhile reads the old or the new one."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    nb.metadata[KEY] = meta
    write_whole(notebook, nbformat.writes(nb))
