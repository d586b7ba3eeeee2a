"""The batch script of a Slurm gang and its step's ``srun`` line: pure functions of the spec.

One job of ``nodes`` nodes with one task per node (``--ntasks-per-node 1``); each task is a node
of the gang (``jupyter_mn.node.slurm``), which starts one rank per GPU itself. GPUs are asked as
``--gres gpu:G`` only where the cluster has them: on CPU-only nodes the ranks are CPU ranks
(gloo), as on the local backend. Nothing secret is in the script (``--dry-run`` prints it): the
gang's certificate is in files of a 0700 dir that the job's environment names.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ...errors import SpecError
from ...model.spec import ClusterSpec

#: the module every task runs
STEP_MODULE = "jupyter_mn.node.slurm"
#: seconds a worker waits for its scheduler (task 0 starts at the same time)
CONNECT_TIMEOUT_S = 60


@dataclass(frozen=True)
class Batch:
    """What the script depends on beyond the spec."""

    gang_id: str
    python: str
    port: int
    output: str
    #: the ``--gres`` value (``gpu:2``), or empty for CPU-only nodes
    gres: str = ""


def gres(spec: ClusterSpec, cluster_has_gpus: bool) -> str:
    """``--gres`` for the spec's GPUs per node: per ``--gpu-gres``, or (``auto``) only where
    the partition declares GPUs."""
    choice = spec.slurm.gres
    if choice == "none" or (choice == "auto" and not cluster_has_gpus):
        return ""
    kind = "gpu" if choice == "auto" else choice
    return f"{kind}:{spec.gpus}"


def sbatch_options(spec: ClusterSpec, batch: Batch) -> list[str]:
    """The job's sbatch options, in the order they appear as ``#SBATCH`` lines."""
    return [
        f"--job-name={batch.gang_id}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--output={batch.output}",
        # SIGTERM to the steps this long before --time runs out: the nodes' preemption notice
        f"--signal=TERM@{spec.kill_after}",
        *placement_options(spec, batch.gres),
    ]


def placement_options(spec: ClusterSpec, gres: str) -> list[str]:
    """Where the job runs and what it may use: ``--gres`` and the Slurm flags of the spec
    (a gang's job and a submitted run's alike)."""
    opts = spec.slurm
    out = [f"--gres={gres}"] if gres else []
    for flag, value in (
        ("--partition", opts.partition),
        ("--account", opts.account),
        ("--qos", opts.qos),
        ("--time", opts.time),
        ("--constraint", opts.constraint),
    ):
        if value:
            out.append(f"{flag}={value}")
    if opts.exclusive:
        out.append("--exclusive")
    return out + list(opts.sbatch_args)


def step_env(spec: ClusterSpec, port: int) -> dict[str, str]:
    """What every task reads besides Slurm's own variables and the certificate."""
    return {
        "JUPYTER_MN_DASK_PORT": str(port),
        "JUPYTER_MN_ORPHAN_TIMEOUT": str(spec.slurm.orphan_timeout),
        "JUPYTER_MN_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT_S),
    }


def srun_argv(python: str, nodes: int, nodelist: str = "") -> list[str]:
    """The step: one task per node; one task failing ends the step (the gang is lost anyway).
    ``--overlap``: inside an allocation the kernel's own step may hold the CPUs."""
    argv = ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if nodelist:
        argv += [f"--nodelist={nodelist}", "--overlap"]
    return [*argv, python, "-m", STEP_MODULE]


def directive(option: str) -> str:
    """``option`` as a batch script's ``#SBATCH`` line. Such a line ends at a newline, and what
    follows it runs as shell (quoting does not carry a newline across), so an option holding a
    control character (a directory named ``x\\ntouch y``) is refused, before anything runs."""
    if not option.isprintable():
        raise SpecError(
            f"{option!r}: holds a control character, which a batch script's #SBATCH line "
            "cannot carry (rename the directory or value)"
        )
    return f"#SBATCH {shlex.quote(option)}"


def batch_script(spec: ClusterSpec, batch: Batch) -> str:
    """The whole script ``sbatch`` reads from stdin."""
    lines = ["#!/bin/sh"]
    lines += [directive(opt) for opt in sbatch_options(spec, batch)]
    lines += [
        f"# jupyter_mn gang {batch.gang_id}: {spec.nodes} node(s) x {spec.gpus} rank(s).",
        "# Task 0 runs the gang's TLS dask scheduler, every task a worker and its node agent;",
        "# the kernel connects back. The certificate is in files the job environment names.",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in step_env(spec, batch.port).items()]
    lines.append("exec " + shlex.join(srun_argv(batch.python, spec.nodes)))
    return "\n".join(lines) + "\n"
