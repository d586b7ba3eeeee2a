"""When did this rank enter its last collective? Read from torch's flight recorder (``flight.py``).

Comparing the wall-clock times at which the ranks issued the cell's last collective shows who
arrived late and how long the others waited. Reading the recorder costs ~2 ms for 256 entries,
so it is only read after cells that ran long enough for a straggler to matter.
"""

from __future__ import annotations

from typing import Any

from .flight import trace

#: Cells shorter than this get no collective timing (a straggler hint would be noise).
MIN_CELL_S = 0.2


def last_collective(since_ns: int) -> dict[str, Any] | None:
    """The last collective this rank issued after ``since_ns`` (``time.time_ns()``), or None."""
    for entry in reversed(trace().get("entries") or []):
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
