"""Where a rank sits in the gang, read back from its environment (``rank/env.py``).

``jupyter_mn.cluster_info()`` inside a cell; the rank's main loop reads it once at start.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..wire.events import Preemption
from . import env as contract
from . import preemption


@dataclass(frozen=True)
class ClusterInfo:
    """Where this rank sits in the gang; ``jupyter_mn.cluster_info()`` inside a cell."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    nodes: tuple[str, ...] = field(default=())
    backend: str = "local"
    job: str = ""
    device: str = "cpu"
    #: which node is being preempted, why, and its deadline, once this rank has heard
    #: (``checkpoint.preempted()`` says when every rank agrees); None otherwise
    preemption: Preemption | None = None


def cluster_info() -> ClusterInfo:
    """This rank's place in the gang. Raises outside a ``%%cluster`` rank."""
    env = os.environ
    if contract.JOB not in env or "RANK" not in env:
        from ..errors import JupyterMNError

        raise JupyterMNError("cluster_info() describes a rank: call it inside a %%cluster cell")
    return ClusterInfo(
        rank=int(env["RANK"]),
        local_rank=int(env["LOCAL_RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        local_world_size=int(env["LOCAL_WORLD_SIZE"]),
        node_rank=int(env["NODE_RANK"]),
        nnodes=int(env["NNODES"]),
        master_addr=env["MASTER_ADDR"],
        master_port=int(env["MASTER_PORT"]),
        nodes=tuple(json.loads(env.get(contract.NODES, "[]"))),
        backend=env.get(contract.BACKEND, "local"),
        job=env[contract.JOB],
        device=_device_label(int(env["LOCAL_RANK"])),
        preemption=preemption.notice(),
    )


def _device_label(local_rank: int) -> str:
    import torch

    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
