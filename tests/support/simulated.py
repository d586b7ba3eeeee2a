"""What the scale test (``tests/gang/test_scale.py``) and bench (``bench/scale.py``) share to watch
a simulated gang of stand-in ranks (``jupyter_mn/rank/standin.py``): its settings, and counts of
what reached the kernel and the registry, taken from outside the code they measure."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from jupyter_mn.node.process import RANK_PYTHON
from jupyter_mn.wire.events import LogLines

#: Hundreds of processes on two shared cores: a beat may come late without anything being lost.
SLOW_MACHINE = {"JUPYTER_MN_HEARTBEAT_TIMEOUT": "300", "JUPYTER_MN_LIVENESS_TIMEOUT": "300"}


def standin_env(python: str = sys.executable) -> dict[str, str]:
    """The environment variables that make node agents start stand-ins instead of real ranks."""
    return {RANK_PYTHON: f"{python} -m jupyter_mn.rank.standin"}


def simulated_env() -> dict[str, str]:
    """Stand-in ranks, and heartbeat windows for a loaded machine (read into the spec)."""
    return {**standin_env(), **SLOW_MACHINE}


def loud_cell(lines: int, chunk: int = 500, pause: float = 0.0) -> str:
    """Every rank prints ``lines`` numbered lines, ``chunk`` per write (as a training loop's
    logger flushes), so the pipeline is measured rather than the ranks' ``print``; ``pause``
    seconds between writes."""
    return (
        "import time\n"
        f"for start in range(0, {lines}, {chunk}):\n"
        f"    end = min(start + {chunk}, {lines})\n"
        "    print('\\n'.join(f'rank {rank} line {i}' for i in range(start, end)))\n"
        f"    time.sleep({pause})"
    )


class RegistryWrites:
    """Counts the job rows written to the registry (inserts and updates of ``jobs``) with SQLite
    triggers in its database, so writes by any process are counted and none of its code is
    touched."""

    def __init__(self, root: Path) -> None:
        self.db = root / "jobs.sqlite"
        with sqlite3.connect(self.db) as conn:
            conn.executescript(
                "CREATE TABLE IF NOT EXISTS scale_writes (n INTEGER NOT NULL);"
                "INSERT INTO scale_writes SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM scale_writes);"
                "CREATE TRIGGER IF NOT EXISTS scale_insert AFTER INSERT ON jobs "
                "BEGIN UPDATE scale_writes SET n = n + 1; END;"
                "CREATE TRIGGER IF NOT EXISTS scale_update AFTER UPDATE ON jobs "
                "BEGIN UPDATE scale_writes SET n = n + 1; END;"
            )
        conn.close()

    def count(self) -> int:
        conn = sqlite3.connect(self.db)
        try:
            return int(conn.execute("SELECT n FROM scale_writes").fetchone()[0])
        finally:
            conn.close()


class LineCount:
    """A gang listener (``gang.core.hub.subscribe``): the lines that reached the kernel, per rank,
    and gaps in each node's batch numbers (a lost ``LogLines``)."""

    def __init__(self) -> None:
        self.per_rank: Counter[int] = Counter()
        self.gaps = 0
        #: ``time.perf_counter()`` when the last batch came
        self.last_at = 0.0
        self._last: dict[int, int] = {}
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        if not isinstance(event, LogLines):
            return
        with self._lock:
            last = self._last.get(event.node)
            if last is not None and event.seq != last + 1:
                self.gaps += 1
            self._last[event.node] = event.seq
            self.last_at = time.perf_counter()
            for rank, _, lines in event.items:
                self.per_rank[rank] += len(lines)

    @property
    def lines(self) -> int:
        with self._lock:
            return sum(self.per_rank.values())
