"""What each of a gang's node agents is told to start (a ``Launch``, ``launchspec.py``): the
gang's shape and settings, rank 0's store, and where the ranks run (the worker's directory, the
notebook's, or the node's copy of it)."""

from __future__ import annotations

from ..wire.launchspec import Launch, Script
from .core import GangCore
from .files import FileSync


def launch_for(
    core: GangCore, files: FileSync, master_port: int, node: int, script: Script | None = None
) -> Launch:
    """What node ``node``'s agent starts: the gang's shape and settings, rank 0's store on
    ``master_port`` (a script gets a fresh one: the warm gang's rank 0 keeps its own), and where
    its ranks run (``files``: the node's copy, or where the nodes see the directory)."""
    spec = core.spec
    return Launch(
        job=core.id,
        gpus=spec.gpus,
        nnodes=spec.nodes,
        master_addr=core.master[0],
        master_port=master_port,
        backend=core.provisioner.backend,
        nodes=tuple(core.hosts),
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
        **{**core.provisioner.launch_options(), **files.launch_options(node)},
    )


def ranks_cwd(core: GangCore, files: FileSync) -> str | None:
    """The ranks' working directory on the nodes that see the notebook's directory (None: the
    worker's own); the others run in their copy of it."""
    return {**core.provisioner.launch_options(), **files.shared_options()}.get("cwd")
