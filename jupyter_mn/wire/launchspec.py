"""What a node agent is told to start: one frozen description, built by the kernel's ``Gang``.

It is pickled to every node's agent (``NodeAgent.start`` for cell ranks, ``run_script`` for a
script) and read there by attribute, so both sides agree on one shape. A leaf: the kernel, the
agent and the tests import it without pulling in either side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Script:
    """A training script to run on every rank (``%cluster run``)."""

    #: where this node finds it (or its file name, when ``source`` is sent; a module's name
    #: with ``module``)
    path: str
    args: tuple[str, ...] = ()
    #: the kernel's copy, for a node that does not have the file
    source: bytes | None = None
    #: ``python -m path`` (``%cluster run -m package.module``)
    module: bool = False


@dataclass(frozen=True)
class Launch:
    """The gang's shape and the ranks' settings; what ``rank/env.py`` turns into environments."""

    job: str
    gpus: int
    nnodes: int
    master_addr: str
    master_port: int
    backend: str
    nodes: tuple[str, ...]
    pg_timeout: float
    #: the user's variables (``--env``), on top of the agent's own environment
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout: float = 180.0
    heartbeat_timeout: float = 15.0
    memory_limit: int | None = None
    rdma: bool = False
    require_rdma: bool = False
    debug: bool = False
    #: the ranks' working directory (None: the worker's)
    cwd: str | None = None
    #: the notebook's directory travels to this node: the ranks' working directory is the
    #: gang's copy of it (``node/files.py``), not ``cwd``
    files: bool = False
    #: the worker is this gang's alone: an orphaned agent ends it too
    exit_when_orphaned: bool = False
    script: Script | None = None
    #: seconds a node keeps running after a SIGTERM (the preemption notice) before it stops
    grace: float = 120.0
