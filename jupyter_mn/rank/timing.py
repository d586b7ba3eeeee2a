"""When did this rank enter its last collective? Read from torch's flight recorder.

torch.distributed records every collective in a ring buffer (the "flight recorder", on by default
for gloo and NCCL; ``TORCH_FR_BUFFER_SIZE`` sets its size) with the wall-clock time the rank
issued it. Comparing those times across ranks shows who arrived late and how long the others
waited, without wrapping or patching any torch function. Reading the buffer costs ~2 ms for 256
entries, so it is only read after cells that ran long enough for a straggler to matter.
"""

from __future__ import annotations

import pickle
from typing import Any

#: Ring size we ask for (torch's default, 2000, takes ~20 ms to read back).
FR_BUFFER_SIZE = "256"
#: Cells shorter than this get no collective timing (a straggler hint would be noise).
MIN_CELL_S = 0.2


def last_collective(since_ns: int) -> dict[str, Any] | None:
    """The last collective this rank issued after ``since_ns`` (``time.time_ns()``), or None."""
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        entries = _entries(dist.get_backend())
    except Exception:  # the recorder is a private torch API: never fail a cell over it
        return None
    for entry in reversed(entries):
        if entry.get("is_p2p"):
            continue
        created = int(entry.get("time_created_ns") or 0)
        if created < since_ns:
            return None
        return {
            "name": str(entry.get("profiling_name", "")),
            "key": [entry.get("pg_id"), entry.get("collective_seq_id")],
            "entered_ns": created,
            "entered_s": (created - since_ns) / 1e9,
        }
    return None


def _entries(backend: str) -> list[dict[str, Any]]:
    from torch._C import _distributed_c10d as c10d

    names = ("_dump_nccl_trace", "_dump_fr_trace") if backend == "nccl" else ("_dump_fr_trace",)
    for name in names:
        dump = getattr(c10d, name, None)
        if dump is not None:
            trace = pickle.loads(
                dump(True, False, False)
            )  # collectives, no stacks, not only active
            return list(trace.get("entries") or [])
    return []
