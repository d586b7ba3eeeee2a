"""The environment contract of a rank: what its node agent sets, what the rank reads.

torchrun's variables (so existing training code runs unchanged) plus ``JUPYTER_MN_*``. One
function writes them for cell ranks and script ranks alike, from the gang's ``Launch``. A leaf:
it imports nothing from jupyter_mn (but a type), so the agent and the rank both read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..wire.launchspec import Launch

#: The rank's end of its control socket to the agent (cell ranks only): cells, read by the
#: rank's main thread between cells.
CONTROL_FD = "JUPYTER_MN_CONTROL_FD"
#: The rank's end of its stacks socket: where-is-your-main-thread requests, answered by a thread
#: while the main thread is busy.
STACKS_FD = "JUPYTER_MN_STACKS_FD"
#: Which generation of the process group the rank joins first (a relaunched rank: a later one).
GENERATION = "JUPYTER_MN_GENERATION"
PG_TIMEOUT = "JUPYTER_MN_PG_TIMEOUT"
JOB = "JUPYTER_MN_JOB"
BACKEND = "JUPYTER_MN_BACKEND"
NODES = "JUPYTER_MN_NODES"
#: Set by a rank without CUDA unless the user set it: Accelerate (and the HF ``Trainer`` on it)
#: otherwise takes a CPU rank for a lone process and trains it unsynchronized.
ACCELERATE_CPU = "ACCELERATE_USE_CPU"


def rank_env(
    gang: Launch,
    node_rank: int,
    local_rank: int,
    *,
    base: Mapping[str, str] = os.environ,
    generation: int = 0,
    error_file: str | None = None,
    socket_ifname: str | None = None,
) -> dict[str, str]:
    """A rank's whole environment: ``base`` (the agent's), the defaults (threads, sockets), the
    user's variables (``gang.env``), then the contract (torchrun's variables, torchelastic's
    included). ``error_file``: a script rank's, where torchelastic's ``@record`` writes its
    uncaught exception. ``socket_ifname``: the interface toward ``master_addr``
    (``node/netif.py``), for gloo and NCCL unless the agent's environment or the user names
    one."""
    gpus, nnodes, job = gang.gpus, gang.nnodes, gang.job
    rank = node_rank * gpus + local_rank
    env = {
        **base,
        **_thread_default(gpus, base),
        **_socket_default(socket_ifname, base),
        **gang.env,
    }
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nnodes * gpus),
        LOCAL_WORLD_SIZE=str(gpus),
        NODE_RANK=str(node_rank),
        GROUP_RANK=str(node_rank),
        NNODES=str(nnodes),
        MASTER_ADDR=gang.master_addr,
        MASTER_PORT=str(gang.master_port),
        PYTHONUNBUFFERED="1",
    )
    env.update(
        {
            JOB: job,
            BACKEND: gang.backend,
            NODES: json.dumps(list(gang.nodes)),
            PG_TIMEOUT: str(gang.pg_timeout),
            GENERATION: str(generation),
        }
    )
    # torchelastic's variables, as torchrun sets them: frameworks (Lightning, Accelerate) take
    # their presence to mean "launched externally" and join the existing process group
    env.update(
        GROUP_WORLD_SIZE=str(nnodes),
        ROLE_NAME="default",
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(nnodes * gpus),
        TORCHELASTIC_RUN_ID=job,
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
        TORCHELASTIC_USE_AGENT_STORE="False",
    )
    if error_file is not None:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    return env


def _thread_default(ranks_per_node: int, base: Mapping[str, str]) -> dict[str, str]:
    """torchrun's rule: several ranks on a node get one OpenMP thread each unless told otherwise
    (more spin-waiting threads than cores made a small DDP step 10× slower here)."""
    if ranks_per_node > 1 and "OMP_NUM_THREADS" not in base:
        return {"OMP_NUM_THREADS": "1"}
    return {}


def _socket_default(ifname: str | None, base: Mapping[str, str]) -> dict[str, str]:
    """Both libraries on the interface the other nodes reach this one by (NCCL's ``=`` asks
    for that exact name, not every interface it prefixes)."""
    if ifname is None:
        return {}
    values = {"GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": f"={ifname}"}
    return {k: v for k, v in values.items() if k not in base}
