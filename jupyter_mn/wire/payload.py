"""What every rank receives for one cell: a leaf that the kernel, the node agent and the rank
may all import, since each of them unpickles it (the kernel builds it in ``cell.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class InFile:
    """Where a captured name's buffers lie in a memfd the agent sends beside the ranks' message
    (``wire/sharednames.py``): that file's index among the message's, and each buffer's offset
    and size in it."""

    index: int
    parts: tuple[tuple[int, int], ...]
    #: the file's descriptor in the process at hand (the kernel's, in the agent's request)
    fd: int = -1
    #: the file's inode: the agent checks that the kernel's ``fd`` is still this file
    inode: int = 0


@dataclass(frozen=True)
class Captured:
    """One notebook variable on its way to the ranks: a protocol-5 pickle and its out-of-band
    buffers (an array's memory, never copied into the pickle), or a digest the ranks hold.

    ``buffers`` are ``PickleBuffer``s in the kernel, memory on arrival; between an agent and its
    ranks a large name's buffers are ``shared`` in a memfd instead (one copy per node).
    ``digest`` is taken only of a large name that the ranks may hold already (else "")."""

    name: str
    digest: str
    data: bytes | None
    buffers: tuple[Any, ...] = ()
    shared: InFile | None = None

    @property
    def nbytes(self) -> int:
        """The pickle's size and its buffers'."""
        return len(self.data or b"") + sum(memoryview(b).nbytes for b in self.buffers)


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
