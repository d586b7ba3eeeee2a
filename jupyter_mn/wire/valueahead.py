"""A rank's big reply sent to the kernel ahead of its node's, as the agent reads it from the rank.

A node's reply waits for every rank of the node; a value of hundreds of MiB would wait whole in
the agent, then cross again. So the agent passes a big reply on to the kernel as its bytes come
from the rank (``node/valuerelay.py``), without unpickling its value: the rank's pickle travels as
``data`` and its buffers as this message's own, so the kernel reads each one into one buffer as
it does any message's (``frames.py``). The node's reply names the ranks that came ahead
(``NodeReply.ahead``) and leaves their values out; the kernel puts them back
(``NodeReply.with_ahead``). A reply cut short (its rank died while sending) is padded to its
announced length, so the stream stays in step, and is not named: the kernel drops it.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass

from .events import RankReply
from .frames import header


@dataclass(frozen=True)
class ReplyAhead:
    """Rank ``reply.rank``'s reply to run ``run_id``, ahead of its node's reply."""

    run_id: int
    reply: RankReply

    @staticmethod
    def head(run_id: int, data: bytes, sizes: Sequence[int]) -> bytes:
        """The frame's header and pickle for a rank's reply (its pickle ``data``, whose buffers
        of ``sizes`` follow as they come): what the agent sends before the buffers' bytes."""
        slots = [pickle.PickleBuffer(bytearray()) for _ in sizes]  # stand-ins, out of band
        wrapper = pickle.dumps(
            _Relayed(run_id, data, slots), protocol=5, buffer_callback=lambda _: False
        )
        return header(len(wrapper), sizes) + wrapper


class _Relayed:
    """Pickles as ``_arrived(run_id, data, *buffers)``: the kernel's unpickling gets the
    buffers that followed in place of the stand-ins."""

    __slots__ = ("data", "run_id", "slots")

    def __init__(self, run_id: int, data: bytes, slots: list[pickle.PickleBuffer]) -> None:
        self.run_id, self.data, self.slots = run_id, data, slots

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return _arrived, (self.run_id, self.data, *self.slots)


def _arrived(run_id: int, data: bytes, *buffers: pickle.PickleBuffer) -> ReplyAhead:
    return ReplyAhead(run_id, pickle.loads(data, buffers=buffers))
