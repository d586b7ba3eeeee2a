"""Checkpoints on ``torch.distributed.checkpoint`` (DCP) that survive a killed rank.

Use them inside ``%%cluster`` cells (or any torch.distributed program)::

    from jupyter_mn import checkpoint

    last = checkpoint.latest("ckpt")
    start = checkpoint.load(last, {"model": model, "opt": opt})["step"] if last else 0
    for step in range(start, 200):
        ...
        if (step + 1) % 20 == 0:
            checkpoint.save({"model": model, "opt": opt}, "ckpt", step + 1, async_=True)
    checkpoint.wait()

To save when the gang is preempted, end each step with
``if checkpoint.preempted(): checkpoint.save(...); break`` (docs/reference.md,
"Preemption"). With ``%%cluster --retries 1`` such a cell finishes after a rank is killed or a node
preempted: the retry resumes from the last complete checkpoint. For bit-identical results after
a resume, prime a freshly wrapped DDP model with ``prime_ddp`` before the first step.

Why DCP rather than one ``torch.save`` per rank: a DDP model's replicated tensors are written
once, not once per rank; FSDP2/DTensor shards are saved as shards; and a checkpoint loads at
another world size (DCP reshards), so a gang re-formed on fewer nodes resumes. Models and
optimizers go through ``torch.distributed.checkpoint.state_dict`` (plain, DDP and FSDP2 modules
alike; optimizer state keyed by parameter name, not by position); other entries (an LR
scheduler's ``state_dict()``, an epoch number) are pickled and written once, as replicated.

Layout of ``save(state, "ckpt", 120)`` on 4 ranks::

    ckpt/step-000000120/__0_0.distcp … __3_0.distcp, .metadata   DCP's files
    ckpt/step-000000120/rng-00000.pt … rng-00003.pt              each rank's RNG states
    ckpt/step-000000120/manifest.json                            step, world size, keys
    ckpt/step-000000120/COMPLETE                                 written last, by rank 0

Rank 0 writes ``COMPLETE`` only after DCP's ``save`` returned there, which is after every rank's
write finished and DCP wrote ``.metadata``; a checkpoint without it (a rank died while writing)
is ignored by ``latest``. With ``async_=True`` the state is copied to memory and written by
DCP's background thread while training goes on, on a gloo group of its own; ``wait()`` (or the
next ``save``, ``latest``, ``load``) waits for it. The RNG files (Python, NumPy, torch CPU and
CUDA) let a resumed run draw the same random numbers as an uninterrupted one; at another world
size a rank restores its own if the checkpoint has it, and rank 0 warns whose were not.

Paths may be fsspec URLs (``s3://…``) as well as local paths (a shared volume, a PVC): DCP
picks its fsspec writer for them. Checkpoints of the first format (one ``torch.save`` per rank,
``rank-00000.pt``) still load, at the world size that wrote them. Pickles are loaded with
``weights_only=False``: load only checkpoints you wrote.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from . import preemption

FORMAT = 2
MARKER = "COMPLETE"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")

Location = Path | str
"""A checkpoint's place: a ``Path`` for a local directory, the URL for any other fsspec one."""


def save(
    state: Mapping[str, Any],
    directory: str | os.PathLike[str],
    step: int,
    keep: int | None = None,
    *,
    async_: bool = False,
) -> Location:
    """Write checkpoint ``step`` under ``directory``; every rank must call it (a collective).

    ``state`` maps names to modules (plain, DDP, FSDP2), optimizers (their model must be in
    ``state`` too), objects with ``state_dict()`` (schedulers) or plain values. ``keep``:
    afterwards, delete all but the newest ``keep`` complete checkpoints. ``async_``: return once
    the state is copied to memory; the write goes on in the background (see ``wait``).
    A previous asynchronous save is waited for first, and its failure raised here.
    Returns the checkpoint's directory.
    """
    import torch.distributed.checkpoint as dcp

    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be a non-negative integer, got {step!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise CheckpointError(f"keep must be a positive integer, got {keep!r}")
    tensors, values = _split(state)
    flat = {**_get(tensors), **{k: io.BytesIO(_pickle(v)) for k, v in values.items()}}
    wait()
    rank, world = _place()
    fs, root = _fs(directory)
    path = f"{root}/step-{step:09d}"
    if rank == 0:
        if fs.exists(path):  # rewriting a step: it is incomplete until done
            fs.rm(path, recursive=True)
        fs.makedirs(path, exist_ok=True)
    group = _process.group()
    _barrier(group)
    _write(fs, f"{path}/{_rng_file(rank)}", _pickle(_rng_state()))
    manifest = {
        "format": FORMAT,
        "step": step,
        "world_size": world,
        "keys": sorted(state),
        "values": sorted(values),
    }

    def finish() -> Location:
        if rank == 0:
            _write(fs, f"{path}/{MANIFEST}", json.dumps({**manifest, "created": time.time()}))
            _write(fs, f"{path}/{MARKER}", "ok\n")
            if keep is not None:
                for old in _complete(directory)[:-keep]:
                    fs.rm(_fs(old)[1], recursive=True)
        _barrier(group)  # nobody goes on (or dies) believing a checkpoint is complete before it is
        done = _location(directory, path)
        preemption.saved(str(done))
        return done

    checkpoint_id = _location(directory, path)
    if not async_:
        dcp.save(flat, checkpoint_id=str(checkpoint_id), process_group=group)
        return finish()
    written = dcp.async_save(flat, checkpoint_id=str(checkpoint_id), process_group=group)
    _process.start(written, finish)
    return checkpoint_id


def preempted() -> bool:
    """True on every rank, at the same call, once a node of the gang has been told to go
    (SIGTERM: a Slurm preemption or time limit, a pod's deletion): save now, then stop.

    Call it once per step on every rank: it is a collective (an all-reduce of one flag), so all
    ranks agree on the step. ``cluster_info().preemption`` says which node, why, and the
    deadline; nothing is killed before it. Outside a process group it says whether this process
    heard a notice.
    """
    return preemption.agree()


def wait() -> Location | None:
    """Block until this rank's asynchronous save is complete (``COMPLETE`` written, every rank
    past it); return its directory, or ``None`` if none was under way.

    Raises ``CheckpointError`` if it failed (e.g. a rank was lost while writing). Not a
    collective: the background threads of all ranks finish it together.
    """
    return _process.wait(raise_failure=True)


def complete(directory: str | os.PathLike[str]) -> list[Location]:
    """The complete checkpoints under ``directory``, oldest first (after this rank's
    asynchronous save, if one is under way, is finished)."""
    _process.wait(raise_failure=False)
    return _complete(directory)


def _complete(directory: str | os.PathLike[str]) -> list[Location]:
    fs, root = _fs(directory)
    if not fs.isdir(root):
        return []
    found = []
    for entry in fs.ls(root, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        match = _STEP_DIR.match(name)
        if (
            match
            and fs.isfile(f"{root}/{name}/{MARKER}")
            and fs.isfile(f"{root}/{name}/{MANIFEST}")
        ):
            found.append((int(match[1]), _location(directory, f"{root}/{name}")))
    return [entry for _, entry in sorted(found)]


def latest(directory: str | os.PathLike[str]) -> Location | None:
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
    """Restore checkpoint ``path`` (a ``step-…`` directory, e.g. from ``latest``): a collective.

    Modules, optimizers and objects with ``load_state_dict`` in ``state`` are restored in place,
    at any world size (DCP reshards). Returns the saved plain values plus ``"step"``. RNG states
    are restored unless ``restore_rng=False``: each rank's own (``rank``: another rank's), where
    the checkpoint has one; rank 0 warns which were not restored.
    """
    import torch.distributed.checkpoint as dcp

    _process.wait(raise_failure=False)
    fs, where = _fs(path)
    if not fs.isfile(f"{where}/{MARKER}"):
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    manifest = json.loads(fs.cat_file(f"{where}/{MANIFEST}"))
    if manifest.get("format", 1) == 1:
        return _load_v1(fs, where, manifest, state or {}, rank, restore_rng)
    if manifest["format"] != FORMAT:
        raise CheckpointError(
            f"{path} has checkpoint format {manifest['format']}; this jupyter_mn reads 1 and 2"
        )
    state = state or {}
    for key in state:
        if key not in manifest["keys"]:
            raise CheckpointError(f"{path} has no {key!r} (it has {', '.join(manifest['keys'])})")
    tensors, _ = _split({k: v for k, v in state.items() if k not in manifest["values"]})
    for obj in tensors.values():
        if hasattr(obj, "param_groups") and not obj.state:
            # DCP creates a fresh optimizer's state (to load into) only if no gradient is set
            obj.zero_grad(set_to_none=True)
    flat: dict[str, Any] = {**_get(tensors), **dict.fromkeys(manifest["values"])}
    group = _process.group()
    dcp.load(flat, checkpoint_id=str(path), process_group=group)
    _set(tensors, flat)
    values = {k: _unpickle(flat[k].getvalue()) for k in manifest["values"]}  # a BytesIO each
    for key, target in state.items():
        if key in values and hasattr(target, "load_state_dict"):
            target.load_state_dict(values[key])
    own, world = _place()
    if restore_rng:
        saved = manifest["world_size"]
        mine = own if rank is None else rank
        if mine < saved:
            _set_rng_state(_unpickle(fs.cat_file(f"{where}/{_rng_file(mine)}")))
        if own == 0 and rank is None and world != saved:
            warnings.warn(_rng_note(saved, world), stacklevel=2)
    return {**values, "step": manifest["step"]}


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


class _Process:
    """This process's checkpoint machinery: its gloo group and its asynchronous save under way.

    Both belong to one default process group. When the gang re-forms it (after a lost rank), the
    group is built anew, and a save started under the old one (which failed with it) is dropped
    rather than raised in the next cell.
    """

    def __init__(self) -> None:
        self._world: Callable[[], Any] = lambda: None
        self._group: Any = None
        self._pending: Future[Location] | None = None
        self._pending_world: Callable[[], Any] = lambda: None
        self._finisher: ThreadPoolExecutor | None = None

    def group(self) -> Any:
        """A gloo group of all ranks, built on first use (a collective, as ``save`` is).

        Its own group, so an asynchronous save's collectives never interleave with the training
        step's on the default group; gloo, because DCP's async save needs a CPU backend.
        """
        import torch.distributed as dist

        world = _world()
        if world is None:
            return None
        if self._world() is not world:
            self._group = dist.new_group(backend="gloo")
            self._world = weakref.ref(world)
        return self._group

    def start(self, written: Future[Any], finish: Callable[[], Location]) -> None:
        """Finish (``COMPLETE``, a barrier) in a thread of ours once DCP's write is done."""

        def complete() -> Location:
            written.result()
            return finish()

        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(1, thread_name_prefix="jupyter_mn-checkpoint")
        self._pending = self._finisher.submit(complete)
        self._pending_world = self._world

    def wait(self, raise_failure: bool) -> Location | None:
        pending, world = self._pending, self._pending_world
        self._pending, self._pending_world = None, lambda: None
        if pending is None or world() is not _world():
            return None
        try:
            return pending.result()
        except Exception as e:
            if raise_failure:
                raise CheckpointError(f"the asynchronous checkpoint save failed: {e}") from e
            return None


_process = _Process()


# ---- state dicts: models and optimizers through DCP's state_dict API, the rest pickled
def _split(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(modules and optimizers, everything else as plain values or state dicts)."""
    import torch

    tensors, values = {}, {}
    for key, obj in state.items():
        if isinstance(obj, torch.nn.Module | torch.optim.Optimizer):
            tensors[key] = obj
        else:
            values[key] = obj.state_dict() if hasattr(obj, "state_dict") else obj
    return tensors, values


def _owner(tensors: Mapping[str, Any], opt: Any) -> Any:
    import torch

    params = {id(p) for group in opt.param_groups for p in group["params"]}
    for obj in tensors.values():
        if isinstance(obj, torch.nn.Module) and any(id(p) in params for p in obj.parameters()):
            return obj
    raise CheckpointError("an optimizer's model must be in the checkpoint's state as well")


def _get(tensors: Mapping[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint import state_dict as sd

    return {
        key: sd.get_optimizer_state_dict(_owner(tensors, obj), obj)
        if hasattr(obj, "param_groups")
        else sd.get_model_state_dict(obj)
        for key, obj in tensors.items()
    }


def _set(tensors: Mapping[str, Any], loaded: Mapping[str, Any]) -> None:
    from torch.distributed.checkpoint import state_dict as sd

    for key, obj in tensors.items():
        if hasattr(obj, "param_groups"):
            sd.set_optimizer_state_dict(_owner(tensors, obj), obj, loaded[key])
        else:
            sd.set_model_state_dict(obj, loaded[key])


# ---- the first format: one torch.save per rank, loads at the world size that wrote it
def _load_v1(
    fs: Any,
    where: str,
    manifest: Mapping[str, Any],
    state: Mapping[str, Any],
    rank: int | None,
    restore_rng: bool,
) -> dict[str, Any]:
    own, world = _place()
    rank = own if rank is None else rank
    if rank >= manifest["world_size"] or (rank == own and world != manifest["world_size"]):
        raise CheckpointError(
            f"{where} (format 1, one file per rank) was written by {manifest['world_size']} "
            f"rank(s); this is rank {rank} of {world}: pass rank=0 to load rank 0's shard "
            "(replicated state only)"
        )
    shard = _unpickle(fs.cat_file(f"{where}/rank-{rank:05d}.pt"))
    for key, target in state.items():
        if key not in shard["state"]:
            raise CheckpointError(f"{where} has no {key!r} (it has {', '.join(manifest['keys'])})")
        if hasattr(target, "load_state_dict"):
            target.load_state_dict(shard["state"][key])
    if restore_rng:
        _set_rng_state(shard["rng"])
    return {**shard["state"], "step": shard["step"]}


# ---- helpers
def _rng_file(rank: int) -> str:
    return f"rng-{rank:05d}.pt"


def _rng_note(saved: int, world: int) -> str:
    if world < saved:
        lost = ", ".join(str(r) for r in range(world, saved))
        return f"checkpoint of {saved} ranks loaded on {world}: RNG states of rank(s) {lost} unused"
    new = ", ".join(str(r) for r in range(saved, world))
    return (
        f"checkpoint of {saved} ranks loaded on {world}: rank(s) {new} keep their own RNG states "
        "(the checkpoint has none for them)"
    )


def _fs(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for a local path or a URL."""
    from fsspec.core import url_to_fs

    fs, where = url_to_fs(os.fspath(path))
    return fs, where.rstrip("/")


def _location(directory: str | os.PathLike[str], path: str) -> Location:
    """``path`` as the user spelled ``directory``: a ``Path`` when local, else a URL."""
    text = os.fspath(directory)
    if "://" not in text:
        return Path(path)
    protocol = text.split("://", 1)[0]
    return f"{protocol}://{path}"


def _place() -> tuple[int, int]:
    """(rank, world size): from the process group when there is one, else the env contract."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _world() -> Any:
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def _barrier(group: Any) -> None:
    import torch.distributed as dist

    if group is not None:
        dist.barrier(group=group)


def _write(fs: Any, path: str, data: bytes | str) -> None:
    """Write via a temporary file and a rename: a reader sees all of it or nothing."""
    tmp = f"{path.rsplit('/', 1)[0]}/.{path.rsplit('/', 1)[1]}.tmp-{os.getpid()}"
    from fsspec.implementations.local import LocalFileSystem

    with fs.open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        if isinstance(fs, LocalFileSystem):  # on disk before the rename makes it visible
            f.flush()
            os.fsync(f.fileno())
    fs.mv(tmp, path)


def _pickle(obj: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unpickle(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


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
