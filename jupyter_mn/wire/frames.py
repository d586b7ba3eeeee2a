"""Messages on a byte stream of our own: a rank's control and stacks sockets to its agent, and the
cell stream between the agent and the kernel.

A message is pickled at protocol 5 with its buffers out of band (``pickle.PickleBuffer``: a
value's arrays, see ``values.py``), and goes as a header (the pickle's length, the number of
buffers and each one's length, 64-bit), the pickle, then each buffer as it is in memory. So a
256 MiB tensor is never copied into a pickle, nor into the message that carries it on: the
reader fills one buffer per message, sized by the header, and hands the buffers on as
``PickleBuffer``s, which the next hop sends out of band again.

A big message may be passed on before it is whole (``arriving`` and ``divert``): the agent
relays a rank's reply to the kernel as it reads it (``node/valuerelay.py``).

The agent reads a rank's socket on its event loop whenever it is readable (a reader thread per
rank cost a cross-thread wake-up per reply), so a message may arrive in pieces. A message the
agent cannot unpickle (rank 0 displayed data holding a class of its own ``__main__``) is dropped
as an ``Undecodable`` and the messages after it are still read: left at the head of the stream
it would have hidden the cell's reply for good.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_HEAD = struct.Struct("!QI")  # the pickle's length, how many buffers follow it
_SIZE = struct.Struct("!Q")  # each buffer's length
#: The send buffer of a local socket that may carry a big value (the kernel caps it at
#: ``net.core.wmem_max``): Linux's default, ~200 KiB, takes a 256 MiB value in ~1,300 reads.
SOCKET_BUFFER = 1 << 22
#: A read's size while no big body is being filled: a small message, several, or a header.
SCRATCH = 1 << 16
_HUGE = 1 << 21  # a huge page
#: A message whose buffers are this large or larger is offered by ``Frames.arriving``.
RELAY_MIN = 1 << 20


@dataclass(frozen=True)
class Undecodable:
    """A complete message that did not unpickle, in place of it."""

    error: str


@dataclass(frozen=True)
class Arriving:
    """A big message whose pickle has come and whose buffers are still coming: enough to pass
    it on before it is whole."""

    data: bytes  # its pickle
    sizes: tuple[int, ...]  # its buffers' lengths


def header(length: int, sizes: Sequence[int]) -> bytes:
    """A message's header: its pickle's ``length``, then its buffers' ``sizes``."""
    return _HEAD.pack(length, len(sizes)) + b"".join(_SIZE.pack(n) for n in sizes)


def encode(message: Any) -> list[bytes | memoryview]:
    """``message`` as the parts to write one after the other (joining them would copy a big
    value): the header, the pickle, each buffer."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    return [header(len(data), [v.nbytes for v in views]), data, *views]


def write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``parts`` to a blocking ``fd`` (``os.writev`` may write part of them)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        written = os.writev(fd, views[:64])
        while views and written >= views[0].nbytes:
            written -= views.pop(0).nbytes
        if written:
            views[0] = views[0][written:]


class Frames:
    """Incremental decoder: bytes in, the complete messages so far out.

    A reader either ``feed``s what it read, or reads straight into ``into()`` and says how much
    with ``filled``: then a big message's buffers are filled by the socket read itself, with no
    copy and no zero-filling (its body is an anonymous mapping, whose pages the OS provides as
    they are written), so a 256 MiB value costs the receiver its size once."""

    def __init__(self) -> None:
        self._head = bytearray()
        #: the message being read: its body (pickle and buffers), how much of it has come, and
        #: the lengths of its parts
        self._body: bytearray | mmap.mmap | None = None
        self._filled = 0
        self._sizes: tuple[int, ...] = ()
        #: where small reads land (headers, small messages, several in one read)
        self._scratch = bytearray(SCRATCH)
        self._direct = False  # whether ``into`` last gave the body itself
        self._offered = False  # whether ``arriving`` gave the message being read

    def into(self) -> memoryview:
        """Where the next bytes read should go: the rest of a big message's pickle, then of its
        body (so ``arriving`` can offer it before its buffers come), or a scratch buffer that
        ``filled`` then decodes."""
        body = self._body
        self._direct = body is not None and len(body) - self._filled > SCRATCH
        if body is None or not self._direct:
            return memoryview(self._scratch)
        end = self._sizes[0] if self._filled < self._sizes[0] else len(body)
        return memoryview(body)[self._filled : end]

    def arriving(self) -> Arriving | None:
        """The message being read, once, when its pickle has come and its buffers (``RELAY_MIN``
        or more) have not all come yet."""
        body, sizes = self._body, self._sizes
        if self._offered or body is None or len(body) - sizes[0] < RELAY_MIN:
            return None
        if not sizes[0] <= self._filled < len(body):
            return None
        self._offered = True
        return Arriving(bytes(body[: sizes[0]]), sizes[1:])

    def divert(self) -> tuple[memoryview, int]:
        """Stop reading the message ``arriving`` offered: its buffers' bytes read so far, and
        how many more the caller reads from the stream itself; the next bytes fed or filled
        begin the next message."""
        assert self._body is not None and self._offered
        got = memoryview(self._body)[self._sizes[0] : self._filled]
        left = len(self._body) - self._filled
        self._body, self._sizes, self._filled = None, (), 0
        return got, left

    def filled(self, n: int) -> list[Any]:
        """``n`` bytes were read into ``into()``'s buffer; the messages they complete."""
        if not self._direct:
            return self.feed(memoryview(self._scratch)[:n])
        self._filled += n
        assert self._body is not None
        return [self._decode()] if self._filled == len(self._body) else []

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        messages: list[Any] = []
        view = memoryview(data).cast("B")
        while view.nbytes:
            if self._body is None:
                view = self._read_head(view)
                continue
            n = min(view.nbytes, len(self._body) - self._filled)
            self._body[self._filled : self._filled + n] = view[:n]
            self._filled += n
            view = view[n:]
            if self._filled == len(self._body):
                messages.append(self._decode())
        return messages

    def _read_head(self, view: memoryview) -> memoryview:
        """Take header bytes from ``view``; once the header is whole, the body is sized."""
        need = _HEAD.size
        if len(self._head) >= _HEAD.size:
            need += _SIZE.size * _HEAD.unpack_from(self._head)[1]
        take = min(need - len(self._head), view.nbytes)
        self._head += view[:take]
        if len(self._head) < _HEAD.size:
            return view[take:]
        length, count = _HEAD.unpack_from(self._head)
        if len(self._head) < _HEAD.size + _SIZE.size * count:
            return view[take:]  # the buffers' lengths follow
        sizes = [
            _SIZE.unpack_from(self._head, _HEAD.size + _SIZE.size * i)[0] for i in range(count)
        ]
        self._sizes = (length, *sizes)
        self._body, self._filled = _allocate(sum(self._sizes)), 0
        self._head, self._offered = bytearray(), False
        return view[take:]

    def _decode(self) -> Any:
        body, sizes = memoryview(self._body if self._body is not None else b""), self._sizes
        self._body, self._sizes = None, ()
        parts, start = [], 0
        for size in sizes:
            parts.append(body[start : start + size])
            start += size
        try:
            return pickle.loads(parts[0], buffers=[pickle.PickleBuffer(p) for p in parts[1:]])
        except Exception as exc:  # what unpickling runs may raise anything
            return Undecodable(f"{type(exc).__name__}: {exc}")


def _allocate(size: int) -> bytearray | mmap.mmap:
    """A message's body: ``bytearray(size)`` writes ``size`` zeros first; a big body is an
    anonymous mapping instead, whose pages cost nothing until the read writes them, in huge
    pages where the OS has them (a 256 MiB value: 128 page faults rather than 65,536)."""
    if size <= SCRATCH:
        return bytearray(size)
    body = mmap.mmap(-1, size)
    if size >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        body.madvise(mmap.MADV_HUGEPAGE)
    return body
