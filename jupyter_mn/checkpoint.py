"""Checkpoints that survive a killed rank: per-rank shards, a manifest, a ``COMPLETE`` marker last.

Use them inside ``%%cluster`` cells (or any torch.distributed program)::

    from jupyter_mn import checkpoint

    last = checkpoint.latest("ckpt")
    start = checkpoint.load(last, {"model": model, "opt": opt})["step"] if last else 0
    for step in range(start, 200):
        ...
        if (step + 1) % 20 == 0:
            checkpoint.save({"model": model, "opt": opt}, "ckpt", step + 1)

With ``%%cluster --retries 1`` a cell written like this finishes after a rank is killed: the
retry resumes from the last complete checkpoint. For bit-identical results after a resume, prime
a freshly wrapped DDP model with ``prime_ddp`` before the first step.

Layout of ``save(state, "ckpt", 120)``::

    ckpt/step-000000120/rank-00000.pt … rank-00003.pt   one shard per rank (torch.save)
    ckpt/step-000000120/manifest.json                   step, world size, files, keys
    ckpt/step-000000120/COMPLETE                        written last, by rank 0, atomically

A checkpoint without ``COMPLETE`` (a rank died while writing it) is ignored by ``latest``. Every
shard also holds that rank's RNG states (Python, NumPy, torch CPU and CUDA), so a resumed run
draws the same random numbers as an uninterrupted one. Shards are pickles (``weights_only=False``):
load only checkpoints you wrote.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import CheckpointError

FORMAT = 1
MARKER = "COMPLETE"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def save(
    state: Mapping[str, Any], directory: str | os.PathLike[str], step: int, keep: int | None = None
) -> Path:
    """Write this rank's shard of checkpoint ``step``; every rank must call it (a collective).

    ``state`` maps names to objects with ``state_dict()`` (models, optimizers, schedulers) or to
    plain values. ``keep``: afterwards, delete all but the newest ``keep`` complete checkpoints.
    Returns the checkpoint's directory.
    """
    import torch

    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be a non-negative integer, got {step!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise CheckpointError(f"keep must be a positive integer, got {keep!r}")
    rank, world = _place()
    path = Path(directory) / f"step-{step:09d}"
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        (path / MARKER).unlink(missing_ok=True)  # rewriting a step: it is incomplete until done
    _barrier()
    shard = {
        "format": FORMAT,
        "step": step,
        "rank": rank,
        "world_size": world,
        "state": {k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in state.items()},
        "rng": _rng_state(),
    }
    _write(path / _shard(rank), lambda f: torch.save(shard, f))
    _barrier()
    if rank == 0:
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": world,
            "files": [_shard(r) for r in range(world)],
            "keys": sorted(state),
            "created": time.time(),
        }
        _write(path / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        _write(path / MARKER, lambda f: f.write(b"ok\n"))
        _sync_dir(path)
        if keep is not None:
            for old in complete(directory)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()  # nobody goes on (or dies) believing a checkpoint is complete before it is
    return path


def complete(directory: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints under ``directory``, oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and (entry / MARKER).is_file() and (entry / MANIFEST).is_file():
            found.append((int(match[1]), entry))
    return [entry for _, entry in sorted(found)]


def latest(directory: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint under ``directory``, or ``None``; incomplete ones skipped."""
    found = complete(directory)
    return found[-1] if found else None


def load(
    path: str | os.PathLike[str],
    state: Mapping[str, Any] | None = None,
    *,
    rank: int | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore checkpoint ``path`` (a ``step-…`` directory, e.g. from ``latest``).

    Objects in ``state`` with ``load_state_dict`` are restored in place; the return value has
    every saved entry plus ``"step"``. ``rank``: read another rank's shard (replicated models
    only), e.g. to load on a gang of a different size. RNG states are restored unless
    ``restore_rng=False``.
    """
    import torch

    path = Path(path)
    if not (path / MARKER).is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    manifest = json.loads((path / MANIFEST).read_text())
    own, world = _place()
    rank = own if rank is None else rank
    if rank >= manifest["world_size"] or (rank == own and world != manifest["world_size"]):
        raise CheckpointError(
            f"{path} was written by {manifest['world_size']} rank(s); this is rank {rank} of "
            f"{world}: pass rank=0 to load rank 0's shard (replicated state only)"
        )
    shard = torch.load(path / _shard(rank), map_location="cpu", weights_only=False)
    for key, target in (state or {}).items():
        if key not in shard["state"]:
            raise CheckpointError(f"{path} has no {key!r} (it has {', '.join(manifest['keys'])})")
        if hasattr(target, "load_state_dict"):
            target.load_state_dict(shard["state"][key])
    if restore_rng:
        _set_rng_state(shard["rng"])
    return {**shard["state"], "step": shard["step"]}


def prime_ddp(model: Any, *inputs: Any, **kwargs: Any) -> None:
    """Run one zero-loss step through a fresh ``DistributedDataParallel`` model (a collective).

    DDP lays out its gradient buckets anew after its first backward pass, and the layout decides
    the order in which a float is summed across ranks. A run resumed from a checkpoint wraps a
    fresh model: prime it (and prime the model of the run you compare with) so the first real
    step already uses the final layout, and a resumed run matches an uninterrupted one bit for
    bit on CPU. Parameters, optimizer state, RNG and batch-norm statistics are left untouched
    (the step runs in eval mode and updates nothing).
    """
    import torch

    training = model.training
    model.eval()
    try:
        out = model(*inputs, **kwargs)
        tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        sum(t.float().sum() for t in tensors if t.requires_grad).mul(0).backward()
    finally:
        model.train(training)
    model.zero_grad(set_to_none=True)


# ---- helpers
def _shard(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _place() -> tuple[int, int]:
    """(rank, world size): from the process group when there is one, else the env contract."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _write(path: Path, fill: Any) -> None:
    """Write via a temporary file and an atomic rename: a reader sees all of it or nothing."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        fill(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    import numpy
    import torch

    state = {
        "python": random.getstate(),
        "numpy": numpy.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    import numpy
    import torch

    random.setstate(state["python"])
    numpy.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
