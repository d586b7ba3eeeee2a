"""What every rank receives for one cell: a leaf that the kernel, the node agent and the rank
may all import, since each of them unpickles it (the kernel builds it in ``cell.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Captured:
    """One notebook variable on its way to the ranks: pickled bytes, or a digest the ranks hold."""

    name: str
    digest: str
    data: bytes | None


@dataclass(frozen=True)
class CellPayload:
    """What every rank receives for one cell."""

    source: str
    cell_id: int
    names: tuple[Captured, ...] = ()
    return_all: bool = False
    pull: tuple[str, ...] = ()
    #: the most bytes a value or pulled name may pickle to (``ClusterSpec.max_value``)
    max_value: int | None = None
    seed: int | None = None
    #: names the cell binds: rank-local state from now on
    defines: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: the kernel can answer a rank's ``breakpoint()`` (else the ranks skip them, and say so)
    prompts: bool = False
