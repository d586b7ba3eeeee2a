"""Where a prepared run starts, the one choice ``jupyter mn submit`` and Lab's Submit share: a
Kubernetes driver pod (``kuberun.py``, which builds on ``submit.py``'s types), else ``submit.start``
(a Slurm job or a runner here)."""

from __future__ import annotations

from .registry import JobModel, Registry
from .submit import Prepared, start


def launch(prepared: Prepared, registry: Registry) -> JobModel:
    if prepared.model.backend == "kubernetes":
        from . import kuberun

        return kuberun.submit(prepared, registry)
    return start(prepared, registry)
