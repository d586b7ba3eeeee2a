"""A rank's display calls waiting to go out, compacted: what a later call makes moot is dropped.

A loss plot redrawn every step (``clear_output(wait=True)`` then ``display(fig)``) makes many
frames a second, each tens of KB; the agent sends at a bounded rate (``output.py``), so only the
newest frame of a batch is worth sending: a ``clear`` drops everything before it, an ``update``
replaces the data of earlier outputs with its id.
"""

from __future__ import annotations

import dataclasses

from ..wire.events import DisplayOutput


class DisplayBatch:
    """The outputs to send next, in order, and their size (for the byte budget)."""

    def __init__(self) -> None:
        self.outputs: list[DisplayOutput] = []

    def add(self, out: DisplayOutput) -> None:
        if out.kind == "clear":
            self.outputs = [out]
            return
        if out.kind == "update" and out.display_id:
            self.outputs = [
                dataclasses.replace(o, data=out.data, metadata=out.metadata)
                if o.display_id == out.display_id and o.kind == "display"
                else o
                for o in self.outputs
                if not (o.kind == "update" and o.display_id == out.display_id)
            ]
        self.outputs.append(out)

    @property
    def size(self) -> int:
        """About the bytes the outputs take on the wire (their text and base64 payloads)."""
        return sum(len(v) for o in self.outputs for v in o.data.values() if isinstance(v, str))
