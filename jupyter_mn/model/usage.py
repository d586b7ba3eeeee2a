"""GPU-hours: what a gang used, counted as nodes × GPUs × the seconds its nodes were held.

A gang's count runs from the moment the backend hands over its nodes (provisioning returned) to
their release (teardown done), whatever ran meanwhile: an idle warm gang costs what a busy one
does. Ranks on CPUs are counted the same way and labelled rank-hours. ``Meter`` is the running
gang's count (kernel side, with an injected clock); ``job_hours`` recomputes a registry row's
from what it stores (``up``, ``ended``), so the server and the CLI show a live job's count
growing without the kernel writing it; ``totals`` sums rows for ``jupyter mn usage``.

A gang's unit is fixed once, when it has started (its ranks said whether they run on GPUs), and
``number`` is the one way hours are written for a person, in Python and, through the registry
row's ``usage`` text, in the panel.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..errors import JupyterMNError
from ..wire.events import HoursUnit

Clock = Callable[[], float]


class Held(Protocol):
    """What a count needs of a registry row (``JobModel``), which imports this module."""

    world_size: int
    up: float | None
    ended: float | None
    unit: str
    gpu_hours: float


Row = TypeVar("Row", bound=Held)
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def hours(slots: int, seconds: float) -> float:
    """``slots`` GPUs (or CPU ranks) held for ``seconds``, in hours."""
    return slots * max(seconds, 0.0) / 3600.0


def cap_seconds(max_hours: float, slots: int) -> float:
    """How long ``slots`` GPUs may be held before they have used ``max_hours``."""
    return max_hours * 3600.0 / slots


def number(value: float) -> str:
    """Hours as a person reads them, never in scientific notation: ``0``, ``< 0.01``, ``0.03``,
    ``1.2``, ``12``, ``1,234``."""
    if value <= 0:
        return "0"
    if round(value, 2) < 0.01:
        return "< 0.01"
    if round(value, 2) < 1:
        return f"{value:.2f}"
    if round(value, 1) < 10:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def text(value: float, unit: HoursUnit | str) -> str:
    """``0.03 GPU-hours`` (an empty unit: a job recorded before its ranks said, GPU-hours)."""
    return f"{number(value)} {HoursUnit(unit or HoursUnit.GPU).value}"


class Meter:
    """One gang's count, from its nodes being up to their release.

    >>> now = [100.0]
    >>> m = Meter(slots=4, clock=lambda: now[0])
    >>> m.up(); m.started(gpu=True); now[0] += 1800; m.text()
    '2.0 GPU-hours'
    """

    def __init__(self, slots: int, clock: Clock = time.time) -> None:
        self.slots = slots
        self.clock = clock
        #: GPU-hours, or rank-hours for ranks on CPUs; None until the gang has started (its
        #: ranks said which), then fixed: a count never changes unit
        self.unit: HoursUnit | None = None
        #: when the nodes were handed over and released, on ``clock`` (None: not yet)
        self.up_at: float | None = None
        self.released_at: float | None = None

    def started(self, gpu: bool) -> None:
        """The gang has started: its count is in GPU-hours if ``gpu``, else in rank-hours."""
        if self.unit is None:
            self.unit = HoursUnit.GPU if gpu else HoursUnit.RANK

    def up(self) -> None:
        """The backend handed over every node: the count starts."""
        self.up_at = self.clock()

    def release(self) -> None:
        """The nodes went back: the count stops (a gang that never got its nodes stays at 0)."""
        if self.up_at is not None and self.released_at is None:
            self.released_at = self.clock()

    def seconds(self) -> float:
        """Seconds the nodes have been held (so far, while they are)."""
        if self.up_at is None:
            return 0.0
        end = self.released_at if self.released_at is not None else self.clock()
        return max(end - self.up_at, 0.0)

    def hours(self) -> float:
        return hours(self.slots, self.seconds())

    def text(self) -> str:
        """The count so far in its unit ("" before the gang has started: no unit yet)."""
        return text(self.hours(), self.unit) if self.unit is not None else ""


def job_hours(job: Held, now: float) -> float:
    """A registry row's count: from ``up`` to ``ended`` (a live job: to ``now``)."""
    if job.up is None:
        return 0.0
    return hours(job.world_size, (job.ended if job.ended is not None else now) - job.up)


def parse_since(value: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` (or a sum: ``1d12h``) as seconds; a clear error
    for anything else."""
    spans = _SPAN.findall(value.strip().lower())
    if not spans or _SPAN.sub("", value.strip().lower()).strip():
        raise UsageError(
            f"--since {value!r}: expected a span like 7d, 12h, 30m, 90s or 2w (or 1d12h)"
        )
    return sum(float(n) * _UNIT_S[u] for n, u in spans)


class UsageError(JupyterMNError):
    """A ``jupyter mn usage`` argument that cannot be read."""


@dataclass
class Total:
    """The count of a group of jobs (one job, or one notebook's jobs) in one unit."""

    key: str
    unit: HoursUnit
    jobs: int = 0
    hours: float = 0.0


def totals(jobs: Iterable[Row], key: Callable[[Row], str], since: float) -> list[Total]:
    """The jobs that held nodes after ``since`` (epoch seconds), summed by ``key`` and unit,
    largest first. Only the part of a job's count after ``since`` is summed."""
    out: dict[tuple[str, HoursUnit], Total] = {}
    for job in jobs:
        if job.up is None or (job.ended is not None and job.ended < since):
            continue
        unit = HoursUnit(job.unit or HoursUnit.GPU)
        total = out.setdefault((key(job), unit), Total(key(job), unit))
        total.jobs += 1
        total.hours += job.gpu_hours - hours(job.world_size, since - job.up)
    return sorted(out.values(), key=lambda t: (-t.hours, t.key))
