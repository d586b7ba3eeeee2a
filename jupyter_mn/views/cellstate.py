"""What a view knows about one cell's gang, built from events; both views read the same state.

Log lines are kept bounded per rank (the widget shows the tail; text mode prints every line as it
arrives), GPU samples and transport reports keep the latest per node plus the peak and the last
minute of utilization per GPU (the widget's sparkline), and
``dirty`` tells the widget which parts changed since it last drew them.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..wire.events import (
    CellDone,
    CellOutcome,
    GangState,
    GangStatus,
    GpuSample,
    Hung,
    LogLines,
    NodesWaiting,
    Note,
    Preemption,
    RankPaused,
    RankResumed,
    RankState,
    RankStatus,
    Stacks,
    TransportReport,
)
from .straggler import hints

#: Lines kept per rank: bounded per rank, so a chatty rank cannot push a quiet one out of view.
TAIL_LINES = 100
#: Utilization samples kept per GPU for the sparkline: about a minute at ~1 Hz.
HISTORY = 60
#: A cell that ran at least this long says its per-rank times even when nothing went wrong.
TABLE_AFTER_S = 10.0


@dataclass
class NodeLog:
    """A node's recent lines, per rank, in the order they arrived."""

    ranks: dict[int, deque[tuple[int, int, str, str]]] = field(default_factory=dict)
    total: int = 0
    #: the line each (rank, stream) is still writing (a progress bar), redrawn in place
    partial: dict[tuple[int, str], str] = field(default_factory=dict)

    def add(self, rank: int, stream: str, lines: tuple[str, ...]) -> None:
        """A progress bar's finished line (stderr, redrawn before it ended) is kept as ``bar``:
        tqdm writes to stderr, and its last state is no error."""
        tail = self.ranks.setdefault(rank, deque(maxlen=TAIL_LINES))
        streams = [stream] * len(lines)
        if self.partial.pop((rank, stream), None) is not None and stream == "err" and lines:
            streams[0] = "bar"  # its line is finished
        tail.extend(
            (self.total + i, rank, kind, line)
            for i, (kind, line) in enumerate(zip(streams, lines, strict=True))
        )
        self.total += len(lines)

    def redraw(self, rank: int, stream: str, text: str) -> None:
        if text:
            self.partial[(rank, stream)] = text
        else:
            self.partial.pop((rank, stream), None)

    @property
    def live(self) -> list[tuple[int, str, str]]:
        """(rank, stream, text) of the lines still being written, by rank."""
        return [(rank, stream, text) for (rank, stream), text in sorted(self.partial.items())]

    @property
    def shown(self) -> int:
        """The lines the log shows: the finished ones and the bars still being drawn."""
        return self.total + len(self.partial)

    @property
    def lines(self) -> list[tuple[int, str, str]]:
        """(rank, stream, text) of every rank's tail, merged back into arrival order."""
        return [(rank, stream, text) for _, rank, stream, text in heapq.merge(*self.ranks.values())]


class CellState:
    """Accumulates one cell's events; thread-safe (events on the main thread, drawing elsewhere)."""

    def __init__(
        self,
        title: str,
        shape: str,
        backend: str,
        nodes: int,
        rdma: bool,
        ranks: tuple[int, ...] = (),
    ) -> None:
        self.title, self.shape, self.backend, self.rdma = title, shape, backend, rdma
        #: the ranks whose lines are shown (``--ranks``; empty: all)
        self.ranks = frozenset(ranks)
        self.state, self.detail = GangStatus.PENDING, ""
        #: the rank whose pdb prompt is open (``breakpoint()`` in the cell)
        self.paused: RankPaused | None = None
        self.started = time.monotonic()
        self.ended: float | None = None
        self.logs = {n: NodeLog() for n in range(nodes)}
        self.gpus: dict[int, GpuSample] = {}
        self.peaks: dict[tuple[int, int], tuple[int, int]] = {}
        #: (node, GPU index) → its last ``HISTORY`` utilization samples, oldest first
        self.history: dict[tuple[int, int], deque[int]] = {}
        self.transport: dict[int, TransportReport] = {}
        self.done: CellDone | None = None
        #: what the user should read besides the logs: retries, restarts
        self.notices: list[str] = []
        #: the hang verdict while the cell runs, and after it if it ended HUNG ("" when none)
        self.hung = ""
        #: where every rank was when last asked: a newer look replaces it (shown once)
        self.stacks: Stacks | None = None
        #: why each node (-1: the gang) is not up yet, while the gang comes up
        self.waiting: dict[int, NodesWaiting] = {}
        #: a node told to go while the cell runs (its grace period counts down in the header)
        self.preemption: Preemption | None = None
        #: ranks whose failure is a cause (no log filter hides their lines)
        self.failing: frozenset[int] = frozenset()
        self.dirty: set[str] = {"header"}
        self.lock = threading.Lock()

    def shows(self, rank: int) -> bool:
        return not self.ranks or rank in self.ranks

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def apply(self, event: Any) -> None:
        with self.lock:
            self._apply(event)

    def _apply(self, event: Any) -> None:
        if isinstance(event, LogLines):
            shown = [item for item in event.items if self.shows(item[0])]
            live = [item for item in event.partial if self.shows(item[0])]
            if shown or live:
                log = self.logs.setdefault(event.node, NodeLog())
                for rank, stream, lines in shown:
                    log.add(rank, stream, lines)
                for rank, stream, text in live:
                    log.redraw(rank, stream, text)
                self.dirty.add(f"log{event.node}")
                if self.preemption is not None:  # the countdown moves on with the output
                    self.dirty.add("header")
        elif isinstance(event, RankState):
            if event.primary and event.state in (RankStatus.ERROR, RankStatus.LOST):
                self.failing |= {event.rank}
                self.dirty.add(f"log{event.node}")
        elif isinstance(event, Preemption):
            self.preemption = self.preemption or event
            self.dirty.add("header")
        elif isinstance(event, GangState):
            self.state, self.detail = event.state, event.detail
            if event.state not in (GangStatus.PENDING, GangStatus.SCHEDULING):
                self.waiting.clear()
            self.dirty.add("header")
        elif isinstance(event, (RankPaused, RankResumed)):
            self.paused = event if isinstance(event, RankPaused) else None
            self.dirty.add("header")
        elif isinstance(event, NodesWaiting):
            for node in event.nodes or (-1,):
                self.waiting[node] = event
            self.dirty.add("header")
        elif isinstance(event, GpuSample):
            self.gpus[event.node] = event
            for g in event.gpus:
                util, mem = self.peaks.get((event.node, g.index), (0, 0))
                self.peaks[(event.node, g.index)] = (max(util, g.util), max(mem, g.mem_used))
                history = self.history.setdefault((event.node, g.index), deque(maxlen=HISTORY))
                history.append(g.util)
            self.dirty.add("gpu")
        elif isinstance(event, TransportReport):
            self.transport[event.node] = event
            self.dirty.add("transport")
        elif isinstance(event, CellDone):
            self.done, self.ended = event, time.monotonic()
            if event.outcome != CellOutcome.HUNG:
                self.hung = ""
            elif self.stacks is not None:  # the verdict on the stacks the stop took
                self.hung = self.stacks.verdict or self.hung
            self.dirty.update({"header", "summary"})
        elif isinstance(event, Hung):
            self.hung = "" if event.over else event.verdict
            self.dirty.add("header")
        elif isinstance(event, Note):
            self.notices.append(event.text)
            self.dirty.add("summary")
        elif isinstance(event, Stacks):
            self.stacks = event
            self.dirty.add("summary")

    @property
    def label(self) -> str:
        """The state the header shows: the rank whose pdb prompt is open and where it stopped
        (``PAUSED at rank 1, Cell In[4], line 7``), ``PREEMPTING node 2 (94 s left)`` while a
        node's grace period runs and the cell is not done, else the gang's state."""
        paused, notice = self.paused, self.preemption
        if paused is not None:
            return f"PAUSED at rank {paused.rank}" + (f", {paused.where}" if paused.where else "")
        if (
            notice is None
            or self.done is not None
            or self.state in (GangStatus.BROKEN, GangStatus.CLOSED)
        ):
            return str(self.state)
        return f"PREEMPTING node {notice.node} ({notice.left():.0f} s left)"

    def notable(self) -> bool:
        """The ended cell has more to say than its header: it failed, has a straggler, ran
        long, or its transport is not what was asked for."""
        done = self.done
        return (
            done is None
            or not done.ok
            or done.elapsed >= TABLE_AFTER_S
            or bool(hints(done.ranks))
            or any(self.alarm(node) for node in self.transport)
        )

    def waiting_lines(self) -> list[str]:
        """The current pending reasons, one line per reason naming its nodes."""
        groups: dict[tuple[str, str], list[int]] = {}
        for node, event in sorted(self.waiting.items()):
            groups.setdefault((event.reason, event.message), []).append(node)
        return [
            NodesWaiting(tuple(n for n in nodes if n >= 0), *key).text
            for key, nodes in groups.items()
        ]

    def take_dirty(self) -> set[str]:
        with self.lock:
            dirty, self.dirty = self.dirty, set()
            return dirty

    def alarm(self, node: int) -> bool:
        """The node was asked to use RDMA and does not (the widget turns red)."""
        report = self.transport.get(node)
        return self.rdma and report is not None and (report.fallback or report.backend == "gloo")
