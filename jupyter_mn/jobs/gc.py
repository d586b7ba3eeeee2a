"""``jupyter mn gc``: clean up what dead kernels left behind, and forget old finished jobs.

A kernel that dies without closing its gang leaves an ORPHANED job. Its ranks normally follow
within a second (they watch their node agent, which watches the kernel), but a rank that is
stopped or stuck in C code can hold a GPU forever; ``gc`` kills those. It finds them by the job's
``JUPYTER_MN_JOB`` mark in their environment, not by the pids the registry holds: a kernel killed
just after its ranks started may not have recorded them, and a recycled pid is never hit. On this
host a job is ORPHANED only once its kernel process is gone (``registry.kernel_alive``): a kernel
busy in C code stops beating but keeps its gang. A rank template left stopped or stuck (it
ends with its nodes otherwise, and kills their ranks as it does) goes too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

from ..rank.env import JOB
from ..rank.procview import ROOM
from .registry import HOST, ORPHAN_AFTER_S, ORPHANED, JobModel, Registry, queued_in_slurm
from .runstate import RunState

_KILL_WAIT_S = 5.0


def collect(registry: Registry, keep_s: float, dry_run: bool = False) -> list[str]:
    """Clean orphaned jobs and forget finished ones older than ``keep_s``; say what was done."""
    registry.reap()
    report: list[str] = []
    now = time.time()
    for job in registry.jobs():
        if job.state == ORPHANED:
            report += clean(job, dry_run)
        if queued_in_slurm(job) and now - job.started > ORPHAN_AFTER_S:
            report += _queued_job_gone(registry, job, dry_run)
        if job.finished and now - (job.ended or job.started) > keep_s:
            if not dry_run:
                registry.forget(job.id)
            days = (now - (job.ended or job.started)) / 86400
            report.append(f"{job.id}: forgot the job and its logs (ended {days:.1f} days ago)")
    return report


def clean(job: JobModel, dry_run: bool = False) -> list[str]:
    """Remove what the ORPHANED ``job`` left (its backend's way); say what was done."""
    cleaner = _CLEANERS.get(job.backend)
    if cleaner is None:
        return [f"{job.id}: no automatic cleanup for the {job.backend} backend"]
    return cleaner(job, dry_run)


def _local(job: JobModel, dry_run: bool) -> list[str]:
    import psutil

    if job.host != HOST:
        return [f"{job.id}: ran on {job.host}; run jupyter mn gc there"]
    left, templates = _marked(job.gang)
    if not left and not templates:
        return []
    verb, alive = "would kill", []
    if not dry_run:
        verb = "killed"
        for proc in left + templates:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # each leads its session: its children too
        _, alive = psutil.wait_procs(left + templates, timeout=_KILL_WAIT_S)
    report = []
    if left:
        pids = ", ".join(str(p.pid) for p in left)
        gone = len([p for p in left if p not in alive])
        report.append(f"{job.id}: {verb} {gone} leftover rank process(es): {pids}")
    if templates:
        pids = ", ".join(str(p.pid) for p in templates)
        report.append(f"{job.id}: {verb} its rank template(s): {pids}")
    report += [f"{job.id}: pid {p.pid} survived SIGKILL (uninterruptible?)" for p in alive]
    return report


def _marked(gang: str) -> tuple[list, list]:
    """This user's processes that carry the gang's mark: the ranks (those that lead their
    session or have a parent that does not: each leads its session, one forked from a rank
    template has a marked parent; not the children that ``killpg`` ends with them), and the
    rank templates (their environment holds ``JUPYTER_MN_TEMPLATE_ROOM``), which end with their
    nodes unless they are stopped or stuck."""
    import psutil

    def environ(proc: psutil.Process) -> dict[str, str]:
        with contextlib.suppress(psutil.Error):
            if proc.uids().real == os.getuid():
                return proc.environ()
        return {}

    ranks, templates = [], []
    for proc in psutil.process_iter():
        env = environ(proc)
        if env.get(JOB) != gang:
            continue
        if ROOM in env:
            templates.append(proc)
            continue
        with contextlib.suppress(psutil.Error, OSError):
            parent = proc.parent()
            leads = os.getsid(proc.pid) == proc.pid
            if leads or parent is None or environ(parent).get(JOB) != gang:
                ranks.append(proc)
    return ranks, templates


def _kubernetes(job: JobModel, dry_run: bool) -> list[str]:
    """Delete the dead kernel's Job and its objects by label, in the job's namespace (the
    kubeconfig's for jobs recorded without one)."""
    from ..errors import JupyterMNError
    from ..gang.kubernetes.gc import collect

    try:
        found = collect(job.namespace or None, only={job.gang}, dry_run=dry_run)
    except JupyterMNError as exc:
        return [f"{job.id}: could not clean up on Kubernetes: {exc}"]
    verb = "would delete" if dry_run else "deleted"
    return [
        f"{job.id}: {verb} {len(left.objects)} Kubernetes object(s) in {left.namespace}"
        for left in found
    ]


def _slurm(job: JobModel, dry_run: bool) -> list[str]:
    """Cancel the dead kernel's Slurm job: it is named after the gang."""
    from ..errors import JupyterMNError
    from ..gang.slurm.commands import cancel_named

    try:
        ids = cancel_named(job.gang, dry_run=dry_run)
    except JupyterMNError as exc:
        return [f"{job.id}: could not clean up on Slurm: {exc}"]
    verb = "would cancel" if dry_run else "cancelled"
    return [f"{job.id}: {verb} Slurm job {i}" for i in ids]


def _queued_job_gone(registry: Registry, job: JobModel, dry_run: bool) -> list[str]:
    """End a run recorded as queued in Slurm whose job Slurm no longer holds (cancelled there
    before it started): no runner will ever write its row."""
    from ..errors import JupyterMNError
    from ..gang.slurm.commands import cancel_named

    try:
        if cancel_named(job.id, dry_run=True):  # only lists: the run's job is named after it
            return []
    except JupyterMNError as exc:
        return [f"{job.id}: could not ask Slurm about the run's job: {exc}"]
    if not dry_run:
        job.state, job.ended = RunState.FAILED.value, time.time()
        job.error = job.detail = "its Slurm job ended before it started (cancelled in Slurm?)"
        registry.save(job)
    return [f"{job.id}: {'would mark' if dry_run else 'marked'} FAILED: its Slurm job is gone"]


#: How each backend's leftovers are found and removed.
_CLEANERS: dict[str, Callable[[JobModel, bool], list[str]]] = {
    "local": _local,
    "kubernetes": _kubernetes,
    "slurm": _slurm,
}
