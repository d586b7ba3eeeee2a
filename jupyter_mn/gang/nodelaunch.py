"""What each of a gang's node agents is told to start (a ``Launch``, ``launchspec.py``): the
gang's shape and settings, rank 0's store, and where the ranks run (the worker's directory, the
notebook's, or the node's copy of it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire.launchspec import Launch, Script

if TYPE_CHECKING:
    from .base import Gang


def launch_for(gang: Gang, master_port: int, node: int, script: Script | None) -> Launch:
    """``Gang.launch``: node ``node``'s ``Launch``, rank 0's store on ``master_port``."""
    spec = gang.spec
    return Launch(
        job=gang.id,
        gpus=spec.gpus,
        nnodes=spec.nodes,
        master_addr=gang.master[0],
        master_port=master_port,
        backend=gang.provisioner.backend,
        nodes=tuple(gang.hosts),
        pg_timeout=spec.pg_timeout,
        env=dict(spec.env),
        start_timeout=spec.start_timeout,
        heartbeat_timeout=spec.heartbeat_timeout,
        grace=spec.grace,
        memory_limit=spec.memory_limit,
        rdma=spec.rdma,
        require_rdma=spec.require_rdma,
        debug=spec.debug,
        script=script,
        **{**gang.provisioner.launch_options(), **gang.files.launch_options(node)},
    )


def ranks_cwd(gang: Gang) -> str | None:
    """``Gang.ranks_cwd``: the ranks' working directory on the nodes that see the notebook's
    directory (None: the worker's own); the others run in their copy of it."""
    return {**gang.provisioner.launch_options(), **gang.files.shared_options()}.get("cwd")
