"""``jupyter mn fetch``: a copy of a submitted run's executed notebook, also while it runs.

The runner's papermill rewrites the notebook in place at each cell's start and end (and every
few seconds within a long cell), so a read may meet a half-written file: it is read again until
it parses, within ``READ_WITHIN_S``. The copy is written whole (``wholefile.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

from .registry import JobModel, Registry, RegistryError
from .wholefile import write_whole

READ_WITHIN_S = 10.0


def fetch(registry: Registry, job: JobModel, out: Path) -> None:
    """Write ``job``'s executed notebook, as far as it has run, to ``out``."""
    import nbformat

    if not job.submitted:
        raise RegistryError(f"job {job.id} is a gang, not a submitted run: nothing to fetch")
    if job.in_cluster:  # its driver pod's log holds it (``kuberun.py``)
        from .kuberun import notebook

        write_whole(out, notebook(registry, job))
        return
    source = Path(job.output or "")
    deadline = time.monotonic() + READ_WITHIN_S
    while True:
        try:
            text = source.read_text()
            nbformat.reads(text, as_version=4)
            break
        except FileNotFoundError:
            raise RegistryError(
                f"job {job.id} ({job.state}) has not written {source} yet"
            ) from None
        except ValueError:  # half written (json's and nbformat's errors are ValueErrors)
            if time.monotonic() > deadline:
                raise RegistryError(f"{source} does not read as a notebook") from None
            time.sleep(0.1)  # papermill is writing it; it is whole again within milliseconds
    write_whole(out, text)
