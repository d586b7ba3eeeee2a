"""``SlurmProvisioner``: a gang's dask cluster as one Slurm job of N nodes, or as a step of the
allocation the kernel already runs in.

Submit the batch script (``script.py``) with a fresh TLS certificate in files of a 0700 dir of the
runtime dir (the job's environment names the dir and holds none of the kernel's credentials) →
poll squeue, showing the pending reason whenever it changes (``NodesWaiting``) and cancelling
after ``--schedule-timeout`` → once it runs, connect to task 0's scheduler on the batch host.
A kernel inside an allocation (``SLURM_JOB_ID``) starts the step itself with ``srun`` on the
allocation's first N nodes and submits nothing. ``release`` closes the client and cancels the job
(or ends the step); the tasks also stop on their own after the orphan timeout.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import JupyterMNError, SchedulingError
from ...model.credentials import secret_item
from ...model.spec import ENV_VARIABLE, ClusterSpec
from ...wire.events import NodesWaiting, Note, OnEvent
from ...wire.tlsfiles import TLS_DIR_VAR, TLS_FILES, tls_address
from . import commands
from .sbatch import Batch, batch_script, gres, srun_argv, step_env

#: squeue is asked this often while the job pends (slurmctld answers in milliseconds)
_POLL_S = 0.5
#: one connection attempt to task 0's scheduler, between looks at the job's state
_CONNECT_TRY_S = 5.0
#: the scheduler's port is picked by the kernel (task 0 cannot tell it back without a shared
#: file system): a random one in a range no Linux hands out as ephemeral
_PORTS = (20000, 32000)
_DRY_RUN_SINFO_S = 5.0
_CPU_ONLY = (
    "the {partition} partition declares no GPUs (sinfo %G): no --gres asked, the ranks run on "
    "CPU (gloo); --gpu-gres gpu asks for them anyway"
)


def output_dir() -> Path:
    """Where the jobs' stdout/stderr go: the user's Jupyter runtime dir (on a cluster, in the
    shared home, readable from the kernel's host)."""
    from jupyter_core.paths import jupyter_runtime_dir

    folder = Path(jupyter_runtime_dir()) / "jupyter-mn" / "slurm"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def write_tls(gang_id: str, pem: tuple[str, ...]) -> Path:
    """The gang's certificate as files (0600) in a directory of its own (0700) in the runtime
    dir, which the nodes share with the kernel's host."""
    folder = output_dir() / f"{gang_id}-tls"
    folder.mkdir(mode=0o700)
    for name, text in zip(TLS_FILES, pem, strict=True):
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
    return folder


#: What a job's environment keeps of the kernel's (``job_environ``): what finds programs,
#: libraries, GPUs and networks, module systems and Python environments, Slurm's own settings,
#: the locale and the user's identity; each a name, or a prefix (``CUDA_*``).
EXPORTED = (
    "PATH",
    "LD_LIBRARY_PATH",
    "LIBRARY_PATH",
    "CPATH",
    "PKG_CONFIG_PATH",
    "MANPATH",
    "CC",
    "CXX",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TERM",
    "TMPDIR",
    "CUDA_*",
    "NCCL_*",
    "NVIDIA_*",
    "GLOO_*",
    "UCX_*",
    "FI_*",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "HSA_*",
    "OMP_*",
    "MKL_*",
    "KMP_*",
    "OPENBLAS_*",
    "MODULE*",
    "LMOD*",
    "__LMOD_*",
    "_LMFILES_",
    "LOADEDMODULES",
    "CONDA_*",
    "VIRTUAL_ENV",
    "PYTHON*",
    "TORCH_*",
    "TRITON_*",
    "HF_HOME",
    "HF_HUB_*",
    "HF_DATASETS_*",
    "TRANSFORMERS_*",
    "XDG_*",
    "DASK_*",
    "JUPYTER_MN_*",
    "JUPYTER_RUNTIME_DIR",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "SLURM_*",
    "SBATCH_*",
    "SRUN_*",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
_EXPORTED = re.compile(
    "|".join(re.escape(n.rstrip("*")) + (r"\w*" if n.endswith("*") else "") for n in EXPORTED)
)


def job_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """What the job (sbatch exports it) or the step (srun) gets of the kernel's environment:
    the names ``EXPORTED`` allows, less what looks like a credential among them. slurmctld keeps
    a job's environment, and with ``AccountingStoreFlags=job_env`` so does the accounting
    database: a name not foreseen (``MYSQL_PWD``, ``SIGNING_KEY``, a token under a neutral name)
    stays in the kernel. ``--env`` values reach the ranks through the gang, not the job: their
    variable (``ENV_VARIABLE``, a submitted run's defaults) stays too."""
    return {
        k: v
        for k, v in environ.items()
        if _EXPORTED.fullmatch(k) and k != ENV_VARIABLE and not secret_item(k, v)
    }


def plan(spec: ClusterSpec, gang_id: str, port: int, has_gpus: bool) -> str:
    """The batch script for ``spec``; ``has_gpus``: whether the partition declares GPUs."""
    batch = Batch(
        gang_id=gang_id,
        python=sys.executable,
        port=port,
        output=str(output_dir() / "%x-%j.out"),
        gres=gres(spec, has_gpus),
    )
    return batch_script(spec, batch)


def partition_has_gpus(spec: ClusterSpec, timeout: float = 30.0) -> bool:
    return spec.slurm.gres != "auto" or commands.has_gpus(spec.slurm.partition, timeout)


def dry_run(spec: ClusterSpec) -> str:
    """The batch script ``--dry-run`` prints (the port is drawn again at submission). GPUs are
    asked as sinfo says where Slurm answers, else as on a GPU cluster (and the header says so)."""
    from ...model.gangids import gang_id

    header = (
        f"# jupyter_mn: {spec.nodes} node(s) x {spec.gpus} rank(s) as one Slurm job "
        "(sbatch reads this on stdin).\n"
    )
    try:  # sinfo retries a missing slurm.conf for a minute: a dry run does not wait that long
        has_gpus = partition_has_gpus(spec, timeout=_DRY_RUN_SINFO_S)
    except SchedulingError as exc:
        header += f"# sinfo did not answer ({exc}): GPUs asked as on a GPU partition.\n"
        has_gpus = True
    return header + plan(spec, gang_id(spec.name), random.randrange(*_PORTS), has_gpus)


class SlurmProvisioner:
    backend = "slurm"

    def __init__(self) -> None:
        #: Set by ``make_gang``: shows the pending reason while the job waits.
        self.notify: OnEvent = lambda event: None
        #: the gang's batch job, once submitted (empty inside an existing allocation)
        self.job_id = ""
        self._step: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        #: the gang's certificate files, until every node has read them
        self._tls_dir: Path | None = None

    def provision(self, spec: ClusterSpec, gang_id: str) -> tuple[Any, list[str]]:
        from distributed.security import Security

        security = Security.temporary()
        port = random.randrange(*_PORTS)
        pem = (security.tls_ca_file, security.tls_worker_cert, security.tls_worker_key)
        self._tls_dir = write_tls(gang_id, pem)
        env = {**job_environ(os.environ), **step_env(spec, port), TLS_DIR_VAR: str(self._tls_dir)}
        allocation = os.environ.get("SLURM_JOB_ID")
        if allocation:
            host = self._start_step(spec, allocation, env)
        else:
            host = self._submit(spec, gang_id, port, env)
        deadline = time.monotonic() + spec.start_timeout  # from the job's start
        self._client = self._connect(tls_address(host, port), security, deadline)
        self._client.wait_for_workers(spec.nodes, timeout=max(1.0, deadline - time.monotonic()))
        self._forget_tls()  # every node has read it
        workers = self._client.scheduler_info(n_workers=-1)["workers"]
        return self._client, sorted(workers, key=lambda a: int(workers[a]["name"]))

    # ---- a batch job of its own
    def _submit(self, spec: ClusterSpec, gang_id: str, port: int, env: dict[str, str]) -> str:
        """Submit and wait until the job runs; the address of its first node."""
        has_gpus = partition_has_gpus(spec)
        if not has_gpus:
            self.notify(Note(_CPU_ONLY.format(partition=spec.slurm.partition or "default")))
        script = plan(spec, gang_id, port, has_gpus)
        try:
            self.job_id = commands.submit(script, env)
        except BaseException:  # timed out or interrupted: sbatch may have submitted it already
            with contextlib.suppress(JupyterMNError):
                commands.cancel_named(gang_id)  # the job is named after the gang
            raise
        self._wait_running(spec)
        return commands.node_address(commands.batch_host(self.job_id))

    def _wait_running(self, spec: ClusterSpec) -> None:
        timeout = spec.slurm.schedule_timeout
        deadline = time.monotonic() + timeout
        shown = None
        while True:
            state = commands.job_state(self.job_id)
            if state is None or state.over:
                raise SchedulingError(self._ended(state))
            if state.running:
                return
            if state != shown:
                self.notify(
                    NodesWaiting((), f"{state.state.lower()}: {state.reason}", self._what())
                )
                shown = state
            if time.monotonic() >= deadline:
                raise SchedulingError(
                    f"Slurm job {self.job_id} did not start within --schedule-timeout "
                    f"{timeout:g} s ({state.state.lower()}: {state.reason}); cancelled"
                )
            time.sleep(_POLL_S)  # polling squeue: Slurm has no watch a client can hold

    def _what(self) -> str:
        return f"Slurm job {self.job_id}"

    def _ended(self, state: commands.JobState | None) -> str:
        said = f"{state.state.lower()}: {state.reason}" if state else "gone from squeue"
        tail = ""
        with contextlib.suppress(OSError):
            found = sorted(output_dir().glob(f"*-{self.job_id}.out"))
            if found:
                tail = "\n" + "\n".join(found[0].read_text(errors="replace").splitlines()[-15:])
        return f"Slurm job {self.job_id} ended before the gang was up ({said}){tail}"

    # ---- a step in the kernel's own allocation
    def _start_step(self, spec: ClusterSpec, allocation: str, env: dict[str, str]) -> str:
        nodes = commands.hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
        if len(nodes) < spec.nodes:
            raise SchedulingError(
                f"this kernel runs in Slurm allocation {allocation} of {len(nodes)} node(s); "
                f"{spec.nodes} requested (ask for fewer, or start the kernel outside it)"
            )
        chosen = nodes[: spec.nodes]
        host = commands.node_address(chosen[0])
        env["JUPYTER_MN_SCHEDULER_HOST"] = host
        self.notify(Note(f"a step in this kernel's Slurm allocation {allocation}: {chosen}"))
        log = output_dir() / f"step-{allocation}-{os.getpid()}.out"
        with open(log, "ab") as out:
            self._step = subprocess.Popen(
                srun_argv(sys.executable, spec.nodes, ",".join(chosen)),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Jupyter interrupt must not reach srun
            )
        return host

    # ---- both
    def _connect(self, address: str, security: Any, deadline: float) -> Any:
        """Task 0's scheduler, tried until the deadline while the job (or step) still runs."""
        from distributed import Client

        while True:
            try:
                return Client(
                    address,
                    security=security,
                    set_as_default=False,
                    timeout=min(_CONNECT_TRY_S, max(1.0, deadline - time.monotonic())),
                )
            except OSError as exc:
                if self._step is not None and self._step.poll() is not None:
                    raise SchedulingError(
                        f"the gang's srun step exited ({self._step.returncode})"
                    ) from exc
                if self.job_id:
                    state = commands.job_state(self.job_id)
                    if state is None or not state.running:
                        raise SchedulingError(self._ended(state)) from exc
                if time.monotonic() >= deadline:
                    raise SchedulingError(
                        f"no dask scheduler at {address} (task 0 of the gang): {exc}"
                    ) from exc

    def launch_options(self) -> dict[str, Any]:
        return {}

    def _forget_tls(self) -> None:
        tls_dir, self._tls_dir = self._tls_dir, None
        if tls_dir is not None:
            shutil.rmtree(tls_dir, ignore_errors=True)

    def release(self) -> None:
        """Close the client, end the step or cancel the job; warn if Slurm cannot be reached."""
        self._forget_tls()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        step, self._step = self._step, None
        if step is not None:
            step.terminate()  # srun passes it on to every task and waits for them
            try:
                step.wait(15)
            except subprocess.TimeoutExpired:
                step.kill()
                step.wait()
        job, self.job_id = self.job_id, ""
        if job:
            try:
                commands.cancel(job)
            except JupyterMNError as exc:
                warnings.warn(
                    f"jupyter_mn: could not cancel Slurm job {job} ({exc}); its tasks exit by "
                    "themselves after --orphan-timeout; `jupyter mn gc` cancels it",
                    stacklevel=2,
                )
