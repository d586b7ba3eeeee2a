"""The Slurm commands a gang needs, run in one place: ``sbatch``, ``squeue``, ``scontrol``,
``sinfo``, ``scancel``. Each one fails as a ``SchedulingError`` carrying Slurm's own words.

Clients find the cluster as any Slurm client does (``SLURM_CONF``, ``/etc/slurm``); nothing here
parses a human-formatted table: ``squeue -o`` with a separator, ``scontrol -o`` one line per item.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import SchedulingError

_TIMEOUT_S = 30.0
#: squeue states after which the job will not run (again): it is over
FINISHED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


def available() -> bool:
    """Whether this machine has Slurm's client commands."""
    return shutil.which("sbatch") is not None


def run(
    argv: list[str],
    what: str,
    env: Mapping[str, str] | None = None,
    stdin: str = "",
    timeout: float = _TIMEOUT_S,
) -> str:
    """``argv``'s stdout; a ``SchedulingError`` saying ``what`` failed and why."""
    try:
        done = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            timeout=timeout,
        )
    except FileNotFoundError:
        raise SchedulingError(f"{what}: {argv[0]} not found (is Slurm installed here?)") from None
    except subprocess.TimeoutExpired:
        raise SchedulingError(f"{what}: {argv[0]} did not answer in {timeout:g} s") from None
    if done.returncode != 0:
        raise SchedulingError(f"{what}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def submit(script: str, env: Mapping[str, str], what: str = "the gang's job") -> str:
    """Submit ``script`` (read from stdin) with ``env`` as the job's environment; its job id."""
    argv = ["sbatch", "--parsable"]
    out = run(argv, f"submitting {what}", env=env, stdin=script, timeout=_TIMEOUT_S)
    return out.strip().split(";")[0]


def test_only(script: str, env: Mapping[str, str], what: str) -> None:
    """Whether Slurm could ever run ``script`` (its shape, partition, account): sbatch
    ``--test-only`` submits nothing, and fails with Slurm's reason."""
    run(["sbatch", "--test-only"], f"checking {what}", env=env, stdin=script, timeout=_TIMEOUT_S)


@dataclass(frozen=True)
class JobState:
    """A job as squeue sees it: ``PENDING`` and the reason (``Resources``, ``Priority``, …)."""

    state: str
    reason: str

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def over(self) -> bool:
        return self.state in FINISHED


def job_state(job_id: str) -> JobState | None:
    """The job's state and reason; None once Slurm has forgotten it."""
    out = run(
        ["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T|%r"],
        f"asking squeue about job {job_id}",
    )
    for line in out.splitlines():
        state, _, reason = line.partition("|")
        return JobState(state.strip(), reason.strip())
    return None


def _fields(line: str) -> dict[str, str]:
    """``scontrol -o`` output: ``Key=Value`` words (values without spaces are all we read)."""
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def batch_host(job_id: str) -> str:
    """The node the job's batch script runs on (its first node)."""
    out = run(["scontrol", "-o", "show", "job", job_id], f"asking scontrol about job {job_id}")
    return _fields(out).get("BatchHost", "")


def restarts(job_id: str) -> int:
    """How often Slurm has requeued the job (its ``Restarts``, already counted while the
    requeued run is being stopped)."""
    out = run(["scontrol", "-o", "show", "job", job_id], f"asking scontrol about job {job_id}")
    return int(_fields(out).get("Restarts", "0"))


def node_address(node: str) -> str:
    """Where ``node`` is reached (its ``NodeAddr``; the name where none is configured)."""
    out = run(["scontrol", "-o", "show", "node", node], f"asking scontrol about node {node}")
    return _fields(out).get("NodeAddr") or node


def hostnames(nodelist: str) -> list[str]:
    """``node-[1-3]`` → ``["node-1", "node-2", "node-3"]``."""
    return run(["scontrol", "show", "hostnames", nodelist], "expanding a node list").split()


def has_gpus(partition: str, timeout: float = _TIMEOUT_S) -> bool:
    """Whether the partition's nodes (the default partition's without one) declare GPUs."""
    argv = ["sinfo", "-h", "-o", "%G"] + ([f"--partition={partition}"] if partition else [])
    out = run(argv, "asking sinfo for GPUs", timeout=timeout)
    return any("gpu" in line for line in out.splitlines())


def cancel(job_id: str) -> None:
    run(["scancel", job_id], f"cancelling job {job_id}")


def cancel_named(name: str, dry_run: bool = False) -> list[str]:
    """Cancel this user's live jobs called ``name`` (a gang's jobs are named after it); their
    ids."""
    user = getpass.getuser()
    out = run(["squeue", "-h", f"--name={name}", f"--user={user}", "-o", "%i"], "listing jobs")
    ids = out.split()
    if ids and not dry_run:
        run(["scancel", *ids], f"cancelling job(s) {', '.join(ids)}")
    return ids
