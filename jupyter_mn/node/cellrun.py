"""A cell's run on a node's ranks: the request out to each, their replies into one node reply.

No task and no loop turn between a request and its ranks, or between the last rank's reply and
the node's: the cell stream (``cellserver.py``) starts a run from its read, the requests go out
before ``start`` returns, each rank's reply is handed over from the read of its control socket
(``RankHandle.expect``), and the node's reply is built where the last rank's is read. A run from
the cell stream lets a rank's big reply go to the kernel ahead of the node's, as it is read
(``valuerelay.py``); the node's reply names those ranks. An interrupt stops the run it names,
never the next one. A cell's large names reach the ranks as one sealed memfd that each maps
(``wire/sharednames.py``), passed after the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Callable

from ..wire.events import NodeReply, RankReply, RankStatus
from ..wire.payload import CellPayload
from ..wire.rankwire import LeaveGroup, RunCell
from ..wire.sharednames import SharedNames
from .output import NodeOutput
from .process import RankHandle, pack
from .ranks import NodeRanks
from .telemetry import NodeTelemetry
from .valuerelay import Ahead, RelaySink


class _Run:
    """One run on the ranks it was sent to: their replies, and the node's once all are in."""

    def __init__(
        self,
        run_id: int,
        ranks: list[RankHandle],
        output: NodeOutput,
        ended: Callable[[], None],
    ) -> None:
        self.run_id, self.ranks, self.output, self.ended = run_id, ranks, output, ended
        self.replies: dict[int, RankReply] = {}
        #: the ranks whose replies went to the kernel ahead of the node's
        self.ahead: set[int] = set()
        self.done: asyncio.Future[NodeReply] = asyncio.get_running_loop().create_future()

    def replied(self, r: RankHandle, reply: RankReply) -> None:
        """Rank ``r``'s reply (from the loop's read of its control socket)."""
        try:
            if reply.status != RankStatus.OK:
                primary = not (reply.error and reply.error.secondary)
                self.output.rank_state(r.rank, reply.status, run=self.run_id, primary=primary)
            r.pipes.catch_up()  # the cell's output, to its end, before its reply
            self.replies[r.local_rank] = reply
            if len(self.replies) == len(self.ranks) and not self.done.done():
                self.finish()
        except Exception as exc:  # the node's reply says so, as an actor call's error would
            if not self.done.done():
                self.done.set_exception(exc)

    def finish(self) -> None:
        self.output.send_displays()  # what rank 0 showed last comes before the reply
        self.ended()
        in_order = tuple(self.replies[each.local_rank] for each in self.ranks)
        ahead = tuple(sorted(self.ahead))
        self.done.set_result(NodeReply(self.output.node, self.output.flush(), in_order, ahead))


class CellRuns:
    """Cells on this node's ranks, one run at a time (``run_id``: the latest)."""

    def __init__(self, ranks: NodeRanks, wake: asyncio.Event) -> None:
        self.ranks = ranks
        #: set when a run ends: the watch loop takes its last look at once
        self._wake = wake
        self.run_id = 0
        self.telemetry: NodeTelemetry | None = None  # set once the ranks started

    def start(
        self, payload: CellPayload, run_id: int = 0, sink: RelaySink | None = None
    ) -> asyncio.Future[NodeReply]:
        """Send a cell to every rank; the future is their replies (a ``NodeReply``)
        once output is flushed. A big reply may go to ``sink`` ahead of it."""
        assert self.telemetry is not None
        self.run_id = run_id
        self.telemetry.cell(running=True)
        shared = SharedNames(payload)  # a large name: one copy on this node, which its ranks map
        by_file = sink is not None and sink.takes_files
        request = pack(RunCell(shared.payload, by_file))  # once for all: it may be large
        ranks = list(self.ranks.handles)
        run = _Run(run_id, ranks, self.ranks.output, self._ended)
        ahead = Ahead(sink, run.ahead.add) if sink is not None else None
        sends = []
        for r in ranks:
            r.expect(run_id, functools.partial(run.replied, r), ahead)
            # one that fails is answered by the rank's death ("lost")
            sends.append(r.send_packed(request, shared.fds))
        if shared.fds:  # closed once sent: the ranks hold their own
            asyncio.gather(*sends).add_done_callback(lambda _: shared.close())
        if not ranks:  # none left after a failed relaunch: an empty reply
            run.finish()
        return run.done

    def _ended(self) -> None:
        assert self.telemetry is not None
        if self.telemetry.cell(running=False):
            self._wake.set()  # its last look, now

    async def interrupt(self, run_id: int = 0, generation: int | None = None) -> None:
        """Stop run ``run_id``: SIGINT to busy ranks, whose stacks threads also close their
        group's connections (one blocked in a collective never sees the SIGINT); idle ones leave
        their group (the cascade).

        Actor calls can overtake each other, so a late request (its run is over, the group was
        re-formed since) is ignored rather than hitting the next cell.
        """
        if run_id != self.run_id or generation not in (None, self.ranks.generation):
            return
        generation = self.ranks.generation  # a re-init may arrive while we send: keep to this
        handles = self.ranks.handles
        idle = [r for r in handles if r.running is None]
        for r in handles:
            if r.running == run_id:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r.proc.pid, signal.SIGINT)
                r.stacks.abort(generation)  # one blocked in a collective does not see the SIGINT
        await asyncio.gather(*(r.send(LeaveGroup(generation)) for r in idle))

    def kill(self, run_id: int, reason: str) -> list[int]:
        """The last step of an interrupt: kill the ranks still busy with ``run_id``."""
        busy = [r for r in self.ranks.handles if r.running == run_id and run_id == self.run_id]
        for r in busy:
            r.kill(reason)
        return [r.rank for r in busy]
