"""Where a prepared run starts, and how a run no runner can answer stops: the choices that
``jupyter mn`` and the Jupyter server share. A run starts as a Kubernetes driver pod
(``kuberun.py``, which builds on ``submit.py``'s types), else through ``submit.start`` (a Slurm job
or a runner here)."""

from __future__ import annotations

from .registry import JobModel, Registry
from .runstate import RunState
from .submit import Prepared, start


def launch(prepared: Prepared, registry: Registry) -> JobModel:
    if prepared.model.backend == "kubernetes":
        from . import kuberun

        return kuberun.submit(prepared, registry)
    return start(prepared, registry)


def stop_unanswered(registry: Registry, job: JobModel, wait: float | None) -> JobModel | None:
    """Cancel a run that has no runner to answer a request: one in a driver pod (its Job is
    deleted; with ``wait``, until nothing of it is left) or one still queued in Slurm (its job
    is cancelled). None for any other job: its kernel or runner answers the request."""
    if job.in_cluster:
        from . import kuberun

        return kuberun.cancel(registry, job, wait)
    if job.submitted and job.backend == "slurm" and job.state == RunState.SUBMITTED.value:
        from .slurmrun import cancel_queued

        cancel_queued(registry, job)
        return job
    return None
