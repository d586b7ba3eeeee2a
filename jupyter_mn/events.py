"""Events shared by both sides: node agents publish them, views and the registry consume them.

They cross dask's event channel (``log_event`` / ``subscribe_topic``), which carries msgpack, so
each event travels as a plain dict tagged with its kind and is rebuilt with ``from_msg``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_KINDS: dict[str, type] = {}


def _event(cls: type) -> type:
    _KINDS[cls.__name__] = cls
    return cls


@_event
@dataclass(frozen=True)
class LogLines:
    """Lines a node's ranks wrote, batched (~5 ms). ``seq`` counts batches per node agent."""

    node: int
    seq: int
    #: (rank, "out" | "err", lines) in the order each rank wrote them
    items: tuple[tuple[int, str, tuple[str, ...]], ...]


@_event
@dataclass(frozen=True)
class RankState:
    """A rank process changed state: started, ready, exited (with code / signal)."""

    node: int
    rank: int
    state: str
    detail: str = ""


@_event
@dataclass(frozen=True)
class GangState:
    """The gang moved to ``state`` (a ``gang.state.GangStatus`` value)."""

    state: str
    detail: str = ""


@_event
@dataclass(frozen=True)
class CellDone:
    """A cell finished on the gang; ``ok`` false when any rank failed."""

    cell_id: int
    ok: bool
    elapsed: float


@_event
@dataclass(frozen=True)
class NodesWaiting:
    """Nodes not up yet, and why (Kubernetes: the pods' pending reason); no nodes: the gang."""

    nodes: tuple[int, ...]
    reason: str
    message: str = ""

    @property
    def text(self) -> str:
        if not self.nodes:
            who = "gang"
        else:
            who = ("node " if len(self.nodes) == 1 else "nodes ") + _ranges(self.nodes)
        return f"{who}: {self.reason}" + (f" ({self.message})" if self.message else "")


def _ranges(numbers: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` → ``"0-2, 5"``."""
    parts: list[str] = []
    for n in sorted(numbers):
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


Event = LogLines | RankState | GangState | CellDone | NodesWaiting


def to_msg(event: Any) -> dict[str, Any]:
    msg = dataclasses.asdict(event)
    msg["kind"] = type(event).__name__
    return msg


def from_msg(msg: dict[str, Any]) -> Any:
    cls = _KINDS[msg["kind"]]
    names = {f.name for f in dataclasses.fields(cls)}
    msg = {k: v for k, v in msg.items() if k in names}  # dask adds e.g. "worker"
    if cls is LogLines:
        msg["items"] = tuple((r, s, tuple(lines)) for r, s, lines in msg["items"])
    return cls(**msg)
