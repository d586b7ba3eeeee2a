"""A submitted run on Slurm (``jupyter mn submit --backend slurm``): one batch job.

Its batch step, on the job's first node, runs ``runner.py`` with the job's ``Submission``; the
kernel it starts inherits the allocation (``SLURM_JOB_ID``), so every ``%%cluster`` cell is a
step of this same job (``gang/slurm/provision.py``) and no second job is submitted. The job is
named after the run, which is how ``cancel`` and ``gc`` find it without its Slurm id.

A requeue (``scontrol requeue``, a preemption with ``PreemptMode=REQUEUE``) stops every process
of the job and, after Slurm's own delay, starts the batch step again: the run starts over, up to
``--retries`` times (the job is ``--no-requeue`` without them). The runner tells a requeue from
a cancel by the job's ``Restarts``, which Slurm has already counted up when it stops the run.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import JupyterMNError, SchedulingError, SpecError
from ..gang.slurm import commands
from .registry import JobModel, Registry, open_private
from .runstate import RunState

if TYPE_CHECKING:
    from ..model.spec import ClusterSpec

#: Slurm's count of the job's requeues, in the batch step's environment (unset: none yet)
RESTARTS_VAR = "SLURM_RESTART_COUNT"


def batch_script(spec: ClusterSpec, job_id: str, log_dir: Path, cwd: Path) -> str:
    """The run's job: ``spec.nodes`` nodes for its cells' gangs; the runner reads its
    submission from the registry (on the shared home, like the runtime dir)."""
    from ..gang.slurm.provision import partition_has_gpus
    from ..gang.slurm.sbatch import directive, gres, placement_options

    options = [
        f"--job-name={job_id}",
        f"--nodes={spec.nodes}",
        f"--chdir={cwd}",
        f"--output={log_dir / 'runner.log'}",
        "--open-mode=append",  # a restarted run's lines after the first's
        "--requeue" if spec.retries else "--no-requeue",
        *placement_options(spec, gres(spec, partition_has_gpus(spec))),
    ]
    lines = ["#!/bin/sh", *map(directive, options)]
    lines += [
        f"# jupyter_mn submitted run {job_id}: the notebook's kernel runs here, on the job's",
        "# first node; its %%cluster cells are steps of this job.",
        f"exec {shlex.quote(sys.executable)} -m jupyter_mn.jobs.runner"
        f" < {shlex.quote(str(log_dir / 'submission.json'))}",
    ]
    return "\n".join(lines) + "\n"


def check(spec: ClusterSpec, script: str, environ: dict[str, str]) -> None:
    """Refuse, before anything is recorded, a run this cluster cannot hold (too many nodes, an
    unknown partition or account): Slurm's own reason, in one line."""
    try:
        commands.test_only(script, environ, "the run's job")
    except SchedulingError as exc:
        reason = str(exc).splitlines()[-1].removeprefix("sbatch: error: ")
        raise SpecError(f"--backend slurm, {spec.shape}: {reason}") from None


def start(
    model: JobModel, submission: str, registry: Registry, environ: dict[str, str], script: str
) -> JobModel:
    """Record the run (queued: no runner yet), leave its submission (JSON) for the runner,
    submit."""
    log_dir = registry.log_dir(model.id)
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = open_private(log_dir / "submission.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        out.write(submission)
    model.detail = "queued in Slurm"
    registry.save(model)
    try:
        slurm_id = commands.submit(script, environ, f"run {model.id}")
    except BaseException as exc:
        model.state, model.error = RunState.FAILED.value, str(exc) or type(exc).__name__
        model.ended = time.time()
        registry.save(model)
        with contextlib.suppress(JupyterMNError):  # timed out: sbatch may have submitted it
            commands.cancel_named(model.id)
        raise
    model.detail = f"queued as Slurm job {slurm_id}"  # what submit says; the runner owns the row
    return model


def environ(base: dict[str, str]) -> dict[str, str]:
    """What the job gets of this environment (sbatch exports it): ``job_environ``'s allowlist,
    no credentials, plus the run's own variables in ``base``."""
    from ..gang.slurm.provision import job_environ

    return {**job_environ(os.environ), **base}


def restarts() -> int:
    """How often Slurm has restarted this batch step's job."""
    return int(os.environ.get(RESTARTS_VAR) or 0)


def cancel_queued(registry: Registry, job: JobModel) -> None:
    """End a run whose job has not started: recorded first, so a runner starting meanwhile
    finds it over and does nothing, then cancelled in Slurm."""
    job.state, job.detail = RunState.CANCELLED.value, "cancelled while queued in Slurm"
    registry.save(job)
    commands.cancel_named(job.id)


def cancel_job(job: JobModel) -> None:
    """Cancel what Slurm still holds of a run that has ended (its job exits with its runner;
    this leaves nothing even where it did not)."""
    commands.cancel_named(job.id)
