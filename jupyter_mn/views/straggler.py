"""The straggler hint: a rank that took more than twice the median, and what it cost the others.

Two measures per rank (``events.RankTiming``): its time in the cell, and how long after its cell
start it entered the cell's last collective. A slow rank makes the others *wait inside* that
collective, so their cell times look alike; the arrival time is what singles it out.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from ..wire.events import RankStatus, RankTiming

FACTOR = 2.0
#: Below this difference from the median nothing is flagged (scheduling noise on small cells).
FLOOR_S = 0.05


def _outliers(
    timings: tuple[RankTiming, ...], value: Callable[[RankTiming], float | None]
) -> tuple[list[RankTiming], float]:
    known = [t for t in timings if value(t) is not None]
    if len(known) < 2:
        return [], 0.0
    median = statistics.median(value(t) for t in known)
    slow = [t for t in known if value(t) > FACTOR * median and value(t) - median > FLOOR_S]
    return sorted(slow, key=lambda t: -value(t))[:3], median


def hints(timings: tuple[RankTiming, ...]) -> list[str]:
    """One line per straggler, or none."""
    timings = tuple(t for t in timings if t.status == RankStatus.OK)
    out = []
    late, median = _outliers(timings, lambda t: t.entered_s)
    waits = [t.waited_s for t in timings if t.waited_s is not None]
    for t in late:
        waited = f"; the others waited up to {max(waits):.2f} s" if waits else ""
        out.append(
            f"straggler: rank {t.rank} (node {t.node}) reached {t.collective} after "
            f"{t.entered_s:.2f} s, the median rank after {median:.2f} s{waited}"
        )
    if out:
        return out
    slow, median = _outliers(timings, lambda t: t.cell_s)
    return [
        f"straggler: rank {t.rank} (node {t.node}) ran the cell for {t.cell_s:.2f} s, "
        f"the median rank for {median:.2f} s"
        for t in slow
    ]
