"""All-reduce timings on the ranks, for ``%cluster bench`` (every rank calls ``measure``).

Like nccl-tests' ``all_reduce_perf``: a float32 buffer of the requested size, warm-up
iterations, then the mean time of ``iters`` back-to-back all-reduces; each scope's time is the
slowest rank's (nccl-tests takes the max across ranks too). With several nodes, also each node's
link on its own: a collective runs at its slowest link's pace, and does not say whose it is.
"""

from __future__ import annotations

import time
from typing import Any


def _groups(world: int, gpus: int, nnodes: int) -> list[tuple[str, list[list[int]]]]:
    """(scope, rank groups measured at the same time). Every rank creates every group."""
    node = [[n * gpus + i for i in range(gpus)] for n in range(nnodes)]
    scopes = [("all ranks", [list(range(world))])]
    if nnodes > 1 and gpus > 1:
        scopes.append(("intra-node", node))
        scopes.append(("inter-node", [[n * gpus for n in range(nnodes)]]))
    return scopes


def _time(tensor: Any, group: Any, iters: int, warmup: int, sync: Any) -> float:
    import torch.distributed as dist

    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    sync()
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    sync()
    return (time.perf_counter() - started) / iters


def _links(tensor: Any, info: Any, iters: int, warmup: int, sync: Any) -> list[float]:
    """Seconds for ``tensor`` to go from node k to node k+1 (one rank per node, one pair at a
    time, in a ring), for every k: node k's link carries transfers k−1→k and k→k+1."""
    import torch
    import torch.distributed as dist

    n, gpus = info.nnodes, info.local_world_size
    seconds = torch.zeros(n, dtype=torch.float64, device=tensor.device)
    for k in range(n):
        src, dst = k * gpus, (k + 1) % n * gpus
        for i in range(warmup + iters):
            dist.barrier()
            started = time.perf_counter()
            if info.rank == src:
                dist.send(tensor, dst)
            elif info.rank == dst:
                dist.recv(tensor, src)
                sync()
                if i >= warmup:  # the receiver's clock: the data has arrived
                    seconds[k] += (time.perf_counter() - started) / iters
    dist.all_reduce(seconds)  # only the receivers wrote
    return seconds.tolist()


def measure(size: int, iters: int, warmup: int) -> list[dict[str, Any]] | None:
    """Rows (scope, ranks, size, seconds) on rank 0, ``None`` elsewhere."""
    import torch
    import torch.distributed as dist

    from .info import cluster_info

    info = cluster_info()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", info.local_rank) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tensor = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
    rows = []
    for scope, groups in _groups(info.world_size, info.local_world_size, info.nnodes):
        made = [(g, dist.new_group(g) if len(g) < info.world_size else None) for g in groups]
        mine = next(((g, pg) for g, pg in made if info.rank in g), None)
        seconds = _time(tensor, mine[1], iters, warmup, sync) if mine else 0.0
        slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if mine and mine[1] is not None:
            dist.destroy_process_group(mine[1])
        rows.append(
            {
                "scope": scope,
                "groups": len(groups),
                "ranks": len(groups[0]),
                "size": tensor.numel() * 4,
                "seconds": slowest.item(),
            }
        )
    if info.nnodes > 1:
        links = _links(tensor, info, iters, warmup, sync)
        rows.append({"scope": "links", "size": tensor.numel() * 4, "seconds": links})
    return rows if info.rank == 0 else None
