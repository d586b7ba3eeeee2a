"""The narrow seam between a node agent and what it owns (rank handles, a script run).

They run on the agent's event loop (it reads their pipes and control sockets) and must not reach
into the agent: they hand it output lines, unfinished lines and display calls, and tell it of a
rank's state change or of a rank paused at a breakpoint. Nothing else.
"""

from __future__ import annotations

from typing import Protocol

from ..wire.events import DisplayOutput, RankStatus


class NodeLink(Protocol):
    """What rank handles may ask of their node agent (its output, ``output.py``, implements
    it)."""

    @property
    def node(self) -> int:
        """This node's rank in the gang."""

    def log(self, rank: int, stream: str, line: str) -> None:
        """One output line of a rank (from the loop); the agent batches them into events."""

    def partial(self, rank: int, stream: str, text: str) -> None:
        """The line a rank is still writing (a progress bar) now reads ``text`` ("": none);
        the agent sends it at a bounded rate (from the loop)."""

    def display(self, rank: int, output: DisplayOutput) -> None:
        """One of the rank's display calls (``rank/displays.py``), from the loop; the
        agent batches them."""

    def rank_state(
        self,
        rank: int,
        state: RankStatus,
        detail: str = "",
        run: int = 0,
        primary: bool = False,
    ) -> None:
        """A rank started, became ready, failed (``primary``: as a cause, not a consequence),
        was lost or exited (from the loop)."""

    def paused(self, rank: int, run: int, where: str) -> None:
        """A rank of run ``run`` stopped at a ``breakpoint()`` (at ``where``) and waits for the
        kernel to answer its pdb (from the loop)."""
