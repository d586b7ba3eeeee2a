"""Gangs: all ranks of a cluster, up together or not at all, on a chosen backend."""

from __future__ import annotations

from ..errors import SpecError
from ..model.spec import ClusterSpec
from .base import Gang
from .core import GangCore, Provisioner
from .lifecycle import GangStatus

__all__ = ["Gang", "GangCore", "GangStatus", "Provisioner", "make_gang"]


def make_gang(spec: ClusterSpec) -> Gang:
    """A gang for ``spec`` on its backend (not started yet)."""
    if spec.backend == "local":
        from .local import LocalProvisioner

        return Gang(spec, LocalProvisioner())
    if spec.backend == "dask":
        from .dask import DaskProvisioner

        provisioner = DaskProvisioner()
        gang = Gang(spec, provisioner)
        provisioner.notify = gang.core.notify  # waiting for workers is shown while it lasts
        return gang
    if spec.backend == "kubernetes":
        from .kubernetes.provision import KubernetesProvisioner

        provisioner = KubernetesProvisioner()
        gang = Gang(spec, provisioner)
        provisioner.notify = gang.core.notify  # pending reasons are shown while the pods come up
        return gang
    if spec.backend == "slurm":
        from .slurm.provision import SlurmProvisioner

        provisioner = SlurmProvisioner()
        gang = Gang(spec, provisioner)
        provisioner.notify = gang.core.notify  # squeue's pending reason, while the job waits
        return gang
    raise SpecError(f"the {spec.backend!r} backend is not available in this build")
