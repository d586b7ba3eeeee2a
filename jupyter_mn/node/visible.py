"""Which GPUs a node's ranks see: the machine's visible list, the local backend's split of it
among its nodes, and the count check a node makes before its ranks start.

The GPUs are counted through NVML (nvidia-ml-py), never through CUDA: a process that initialized
CUDA (a kernel, an agent) would hold a context on every GPU and could not fork cleanly. The
functions that decide are pure (a list of entries in, a value or an error out), so they are
tested with made-up lists on machines without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from ..errors import SchedulingError, SpecError

VISIBLE = "CUDA_VISIBLE_DEVICES"


def gpu_uuids() -> list[str]:
    """The UUIDs of this machine's GPUs in NVML's order; [] without a driver or NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, or pynvml.NVMLError and its many per-code subclasses
        return []
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return [nvml_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def visible(value: str | None, uuids: Sequence[str]) -> list[str]:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (``value``; None: unset) that name a GPU here, as
    CUDA reads them: every GPU when unset, else the entries up to the first that names none
    (CUDA ignores the rest). Entries are indexes, ``GPU-<uuid>`` prefixes or MIG slices."""
    if value is None:
        return [str(i) for i in range(len(uuids))]
    entries = []
    for raw in value.split(","):
        entry = raw.strip()
        known = (
            (entry.isdigit() and int(entry) < len(uuids))
            or (entry.startswith("GPU-") and any(u.startswith(entry) for u in uuids))
            or (entry.startswith("MIG-") and bool(uuids))
        )
        if not known:
            break
        entries.append(entry)
    return entries


def split(entries: Sequence[str], nodes: int, gpus: int) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` of each local node: node i gets entries ``i*gpus … i*gpus+gpus-1``,
    so no two nodes' ranks share a GPU. None where no GPU is visible (CPU ranks, nothing to
    split); a ``SpecError`` where the nodes need more GPUs than are visible."""
    if not entries:
        return None
    need = nodes * gpus
    if need > len(entries):
        have = len(entries)
        fit_nodes = min(nodes, have)
        raise SpecError(
            f"the local backend's {nodes} nodes × {gpus} GPUs need {need} GPUs; this machine "
            f"has {have} visible: use --nodes {fit_nodes} --gpus {have // fit_nodes} "
            f"(or {VISIBLE}= for CPU ranks)"
        )
    return [",".join(entries[i * gpus : (i + 1) * gpus]) for i in range(nodes)]


def local_split(environ: Mapping[str, str], nodes: int, gpus: int) -> list[str] | None:
    """The local backend's split of what the kernel's environment shows (see ``split``)."""
    return split(visible(environ.get(VISIBLE), gpu_uuids()), nodes, gpus)


def check_count(node: int, gpus: int, count: int) -> None:
    """Refuse a node whose ranks would find fewer GPUs than ranks (none: CPU ranks, fine)."""
    if 0 < count < gpus:
        raise SchedulingError(
            f"node {node} has {count} GPU(s); local rank {count} needs at least {count + 1} "
            f"(--gpus {gpus} starts {gpus} ranks per node, one per GPU): use --gpus {count}"
        )


def nvml_text(value: str | bytes) -> str:
    """NVML's strings are bytes in older nvidia-ml-py releases."""
    return value.decode() if isinstance(value, bytes) else str(value)
