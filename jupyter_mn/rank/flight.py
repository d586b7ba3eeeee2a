"""torch's flight recorder, read back: the collectives this rank issued, newest last.

torch.distributed records every collective in a ring buffer (on by default for gloo and NCCL;
``TORCH_FR_BUFFER_SIZE`` sets its size) with its process group, sequence number, op, input sizes
and dtypes and the wall-clock time the rank issued it, without any torch function wrapped or
patched. On gloo (torch 2.13) every entry stays "scheduled": what a rank has completed comes from
the dump's per-group status (``last_completed_collective``), which gloo keeps (updated from its
own thread, just after ``wait()`` returns). Reading 256 entries costs ~2 ms, so it is read on
request (timing, stacks, the hang watchdog's poll), never per collective.
"""

from __future__ import annotations

import pickle
from typing import Any

from ..wire.rankwhere import Collective, dtype_name

#: Ring size we ask for (torch's default, 2000, takes ~20 ms to read back).
FR_BUFFER_SIZE = "256"


def trace() -> dict[str, Any]:
    """The recorder's dump (``entries``, ``pg_status``), or {} without a group or a recorder."""
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return {}
        from torch._C import _distributed_c10d as c10d

        backend = dist.get_backend()
        names = ("_dump_nccl_trace", "_dump_fr_trace") if backend == "nccl" else ("_dump_fr_trace",)
        for name in names:
            dump = getattr(c10d, name, None)
            if dump is not None:  # collectives, no stacks, not only the active ones
                return pickle.loads(dump(True, False, False))
    except Exception:  # a private torch API: never fail a cell or a stacks request over it
        return {}
    return {}


def group_ranks() -> dict[str, tuple[int, ...]]:
    """Each live group's global ranks, by name: ``new_group`` is called by every rank, member
    or not, so any rank can say who should enter a group's collectives."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        groups = list(c10d._world.pg_names.items())  # a private torch table: read, never fail
        return {str(name): tuple(dist.get_process_group_ranks(pg)) for pg, name in groups}
    except Exception:
        return {}


def latest(
    dump: dict[str, Any], since_ns: int = 0, members: dict[str, tuple[int, ...]] | None = None
) -> tuple[Collective, ...]:
    """This rank's latest collective in each process group (p2p ops aside) issued after
    ``since_ns``: when the current group was formed. The ring still holds entries of groups a
    re-forming destroyed, and the new groups reuse their names (``"0"`` is always the default
    group), while torch's internal ids go on counting and differ on a restarted rank; so a group
    is known by its name, and older entries are left out."""
    status = dump.get("pg_status") or {}
    found: dict[str, Collective] = {}
    for entry in reversed(dump.get("entries") or []):
        name = str((entry.get("process_group") or ("",))[0])
        if entry.get("is_p2p") or name in found or (entry.get("time_created_ns") or 0) < since_ns:
            continue
        done = (status.get(str(entry.get("pg_id"))) or {}).get("last_completed_collective", -1)
        found[name] = _record(entry, int(done), (members or {}).get(name, ()))
    return tuple(found[name] for name in sorted(found, key=lambda n: (len(n), n)))


def _record(entry: dict[str, Any], last_completed: int, members: tuple[int, ...]) -> Collective:
    name, desc = (*(entry.get("process_group") or ()), "", "")[:2]
    op = str(entry.get("profiling_name", "")).rpartition(":")[2]
    seq = int(entry["collective_seq_id"])
    return Collective(
        pg=str(name),
        pg_desc=str(desc),
        seq=seq,
        op=op,
        sizes=tuple(tuple(int(n) for n in size) for size in entry.get("input_sizes") or ()),
        dtypes=tuple(dtype_name(str(d)) for d in entry.get("input_dtypes") or ()),
        entered_ns=int(entry.get("time_created_ns") or 0),
        completed=entry.get("state") == "completed" or seq <= last_completed,
        members=members,
    )
