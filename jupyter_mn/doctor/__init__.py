"""Preflight doctor: the multi-node debugging checklist, on every node, before GPU-hours are spent.

Each node runs a probe (``node/probe.py``) with its ranks' environment; the facts come back here
and every check judges them across nodes and against the kernel: same Python / torch / CUDA /
NCCL / jupyter_mn / cloudpickle, GPUs visible for ``--gpus``, MASTER_ADDR:PORT reachable from every
node, the interface NCCL or gloo will use, RDMA ports ACTIVE with ``--rdma``, /dev/shm size, free
disk, ``--check-path`` paths. The result is a ✔/✘ table per check × node with a fix for each ✘.

It runs as ``%cluster doctor``, ``jupyter mn doctor``, and by itself before the first cell of a
new gang (``ClusterSpec.runs_preflight``), which then fails with ``PreflightError`` and the table.
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import PreflightError, Stopped
from ..gang.job import INTERRUPTED_BY_USER, WorkerCall
from ..wire.events import RunStarted
from .checks import judge
from .report import DoctorReport

if TYPE_CHECKING:
    from ..gang.base import Gang
    from ..wire.events import OnEvent

__all__ = ["DoctorReport", "doctor", "examine", "preflight"]

#: Seconds a node's probe may take (it imports torch, which is slow on network filesystems).
PROBE_TIMEOUT_S = 120.0
REACH_TIMEOUT_S = 5.0


def examine(gang: Gang) -> DoctorReport:
    """Probe every node of ``gang`` (its agents must be up) and judge the facts."""
    from ..node.workerfuncs import probe

    started = time.perf_counter()
    core = gang.core
    spec = core.spec
    options: dict[str, Any] = {
        "paths": list(spec.check_paths),
        "env": dict(spec.env),
        "cwd": core.provisioner.launch_options().get("cwd"),
        "timeout": PROBE_TIMEOUT_S,
        "reach_timeout": REACH_TIMEOUT_S,
    }
    if core.ranks:  # rank 0's TCPStore listens on the master port
        master = core.master
    else:  # node 0 listens on a free port at the master address while the probes run
        master = (core.master[0], core.nodes.agents[0].endpoint().result()[1])
        options["listen"] = {
            "worker": core.addresses[0],
            "host": master[0],
            "port": master[1],
            "expect": spec.nodes,
        }
    options["master"] = {"addr": master[0], "port": master[1]}
    answers = gang.run(_Probes(core, None, range(spec.nodes), probe, options))
    facts = []
    for address in core.addresses:
        answer = answers.get(address)
        facts.append(answer if isinstance(answer, dict) else {"error": repr(answer)})
    target = f"{spec.shape} on {core.provisioner.backend}" + (
        f" {spec.scheduler}" if spec.scheduler else ""
    )
    return DoctorReport(
        target=target,
        nodes=[f"node {n} {host}" for n, host in enumerate(core.hosts)],
        checks=judge(spec, facts, kernel_facts(), master),
        elapsed=time.perf_counter() - started,
        facts=facts,
    )


class _Probes(WorkerCall):
    """Every node's probe; stopping it stops waiting (each probe ends by its own timeout)."""

    def what(self) -> RunStarted:
        return RunStarted(self.run_id, "%cluster doctor")

    def stop(self, reason: str, by_user: bool, again: bool = False) -> None:
        self.reason, self.answers = reason, {}

    def finish(self) -> dict[str, Any]:
        if self.reason == INTERRUPTED_BY_USER:
            raise KeyboardInterrupt
        if self.reason:
            raise Stopped(f"the doctor was stopped: {self.reason}")
        return super().finish()


def preflight(gang: Gang, note: Callable[[str], None]) -> None:
    """Check a new gang's nodes before ranks start; raise ``PreflightError`` on a ✘ (an RDMA ✘
    only with ``--require-rdma``: plain ``--rdma`` warns, as the transport view does)."""
    report = examine(gang)
    spec = gang.core.spec
    rdma_needed = spec.require_rdma and spec.nodes > 1  # one node uses no network
    blocking = [f for f in report.failures() if f[0] != "RDMA" or rdma_needed]
    if blocking:
        raise PreflightError(
            f"preflight failed: {report.summary()}; fix it, or skip the checks with --no-preflight",
            report,
        )
    for _, node, cell in report.failures():  # --rdma asks for the fabric; only --require-rdma
        note(f"preflight: WARNING node {node}: RDMA {cell.value}: {cell.fix}")  # insists
    note(f"preflight: {report.summary()}")


class NodeSource(Protocol):
    """Where the doctor gets nodes to probe: a ``Cluster`` (its warm gang's, or nodes claimed
    for the checks alone)."""

    def nodes(
        self, on_event: OnEvent | None = None, preflight: bool | None = None, files: bool = True
    ) -> contextlib.AbstractContextManager[Gang]: ...


def doctor(cluster: NodeSource, on_event: OnEvent | None = None) -> DoctorReport:
    """Run the checks on ``cluster``'s nodes (the warm gang's, or nodes claimed for it)."""
    with cluster.nodes(on_event, preflight=False, files=False) as gang:
        return examine(gang)


def kernel_facts() -> dict[str, str | None]:
    """The versions the kernel pickles cells and values with (torch from metadata: no import)."""
    import importlib.metadata

    import cloudpickle

    from ..wire.version import __version__

    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return {
        "python": platform.python_version(),
        "jupyter_mn": __version__,
        "cloudpickle": cloudpickle.__version__,
        "torch": torch,
    }
