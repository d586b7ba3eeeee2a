"""One cell on a gang: dispatch, stream, fail fast, stop on demand, collect, then re-form.

The kernel's main thread runs the gang's loop (``Gang.run``), so output is printed from the main
thread (ipykernel routes it to the running cell) and a Ctrl-C lands there, where it becomes an
interrupt of the ranks rather than a dead kernel.

Stopping a cell escalates (docs/architecture.md, "Stopping a cell"): on ``--timeout``, Ctrl-C
or a cancel request every rank's stack is shown first; then SIGINT to the busy ranks (Python
code stops in ms) while idle ranks leave their group (the destroy cascade frees ranks blocked
in a collective); ranks still busy ``KILL_AFTER_S`` later are killed, and their node's ranks
are restarted. A second Ctrl-C kills at once. Restarted ranks join the group in the background
(``recover.py``), so the error shows without waiting for them.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import reprlib
import sys
import time
from typing import Any

from ..errors import NodeUnreachable, TransportError
from ..model.credentials import holds_secret
from ..model.result import ERROR, INTERRUPTED, LOST, CellResult, PreemptionOutcome, RankOutcome
from ..model.spec import ClusterSpec
from ..model.usage import hours
from ..model.verdict import Verdict, explain
from ..wire.events import (
    CellDone,
    NodeReply,
    OnEvent,
    RankError,
    RankPaused,
    RankReply,
    RankResumed,
    RunStarted,
)
from ..wire.payload import CellPayload
from .base import Gang
from .core import GangCore
from .debugger import converse
from .generations import Generations
from .hangwatch import HangWatch, Look
from .inbox import Message, Reply
from .job import Job
from .lifecycle import GangStatus
from .recover import restarted_note
from .transport import violation

#: After an interrupt, how long busy ranks get to stop before they are killed.
KILL_AFTER_S = 3.0
#: After the kill, how long node agents get to answer before the gang is declared broken.
GIVE_UP_AFTER_S = 10.0
#: The most of a value's text that the registry keeps for a reloaded page.
VALUE_TEXT_MAX = 300
#: How long the hang watchdog's look waits for the agents.
_STACKS_S = 3.0


class RemoteRepr:
    """Stands for a rank value that could not be pickled: shows the rank's ``repr``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class CellJob(Job[CellResult]):
    """One cell on every rank; stopped by escalation, from the first interrupt to the kill."""

    def __init__(
        self,
        core: GangCore,
        generations: Generations,
        payload: CellPayload,
        on_event: OnEvent | None,
        hang_timeout: float = 0.0,
    ) -> None:
        """``generations``: where a failed cell's group is re-formed, and its generation."""
        super().__init__(core, on_event)
        self.generations = generations
        self.payload = payload
        self.hang_timeout = hang_timeout
        self.watch: HangWatch | None = None
        self.started = time.monotonic()
        self.since: float | None = None
        self.killed_at: float | None = None
        #: where the busy ranks were when the user stopped the cell
        self.where: list[str] = []
        #: what the stacks said when the user stopped a hung cell (``verdict.py``)
        self.verdict: Verdict | None = None
        #: a node that stopped answering the heartbeat (its peers cannot finish: kill at once)
        self.unreachable: int | None = None

    def what(self) -> RunStarted:
        cell = self.payload.cell_id
        return RunStarted(self.run_id, f"In[{cell}]", cell)

    def start(self) -> None:
        self.started = time.monotonic()
        if self.hang_timeout:
            look = functools.partial(self.core.nodes.stacks, _STACKS_S)
            post = self.core.hub.inbox.put_reply
            self.watch = HangWatch(self.hang_timeout, self.started, look, post)
        self.core.hub.replay(self.on_event)
        payload, run_id = self.payload, self.run_id
        self.core.nodes.send_cell(payload, run_id)

    def take(self, item: Any) -> bool:
        if isinstance(item, Message) and isinstance(item.body, Look):
            self._looked(item.body)
            return False
        if isinstance(item, Reply) and self.watch is not None:  # its ranks ended the cell
            self.watch.progress.moved(time.monotonic())
        if isinstance(item, Reply) and isinstance(item.error, NodeUnreachable):
            self.unreachable = item.node if self.unreachable is None else self.unreachable
        if isinstance(item, RankPaused) and item.run == self.run_id:
            self._answer(item)
            return False
        return super().take(item)

    def _answer(self, paused: RankPaused) -> None:
        """A rank stopped at a breakpoint: the user answers its pdb here, one rank at a time
        (the next paused rank's event waits in the inbox); ``--timeout`` waits meanwhile."""
        self.core.hub.consume(paused, self.on_event)
        began = time.monotonic()
        try:
            if self.since is None:  # a cell being stopped does not prompt
                converse(self.core, paused.rank, None, input, sys.stdout.write)
        finally:
            self.paused_for += time.monotonic() - began
            if self.watch is not None:  # time at a prompt is no hang
                self.watch.progress.moved(time.monotonic())
            resumed = RankResumed(paused.node, paused.rank, paused.run)
            self.core.hub.consume(resumed, self.on_event)

    def _looked(self, look: Look) -> None:
        """The hang watchdog's look came back: show its verdict if the cell now hangs."""
        if look.watch is not self.watch or self.since is not None:
            return  # a look of another cell's, or this one is being stopped anyway
        why = f"no rank progressed for {self.hang_timeout:g} s (--hang-timeout); still running"
        for event in look.watch.take(look, time.monotonic(), why):
            self.core.hub.announce(event, self.on_event)

    def stop(self, reason: str, by_user: bool, again: bool = False) -> None:
        if self.since is not None:
            if again and self.killed_at is None:  # a second Ctrl-C: do not wait
                self._kill("interrupted twice")
            return
        if by_user:
            self.reason = reason
            self._show_stacks(reason)
        self.since = time.monotonic()
        generation, run_id = self.generations.generation, self.run_id
        for node in range(self.core.nodes.count):
            self.core.nodes.ask(node, lambda agent: agent.interrupt(run_id, generation))
        if self.unreachable is not None:  # ranks blocked on it would only wait for the kill
            self._kill(f"node {self.unreachable} is unreachable")

    def _kill(self, why: str) -> None:
        self.killed_at = time.monotonic()
        for node in range(self.core.nodes.count):
            self.core.nodes.ask(node, lambda agent: agent.kill(self.run_id, why))

    def tick(self, now: float) -> bool:
        if self.watch is not None and self.since is None:
            self.watch.tick(now)
        if self.since is not None and self.killed_at is None and now - self.since > KILL_AFTER_S:
            self._kill(f"it did not stop within {KILL_AFTER_S:g} s of the interrupt")
        return self.killed_at is not None and now - self.killed_at > GIVE_UP_AFTER_S

    def _show_stacks(self, reason: str) -> None:
        try:
            stacks, self.verdict = explain(reason, self.core.nodes.stacks(), stop=True)
        except KeyboardInterrupt:  # impatient: stop without them
            return
        self.core.hub.consume(stacks, self.on_event)
        for r in stacks.ranks:
            if r.busy and (line := r.cell_line()):
                self.where.append(f"{r.label} was at {line}")

    def settle(self) -> None:
        if self.watch is not None:
            self.watch.close()
        with contextlib.suppress(KeyboardInterrupt):  # the cell is over: only late output is lost
            self.drain_logs()
        result = _assemble(self, time.monotonic() - self.started)
        result.interrupted = self.reason
        result.verdict = self.verdict.text if self.verdict else ""
        result.culprits = self.verdict.culprits if self.verdict else ()
        result.notes += self.where
        _settle(self.core, self.generations, result, interrupted=self.since is not None)
        self.result = result

    def finish(self) -> CellResult:
        core, result = self.core, self.result
        _drain_events(core, self.on_event)  # the settled state (READY, BROKEN) reaches the view
        cause = result.root_cause
        error = f"{cause.label}: {cause.error.line()}" if cause and cause.error else ""
        if result.preemption is not None:
            error = result.preemption.text()
        done = CellDone(
            self.payload.cell_id,
            result.elapsed,
            result.timings(),
            error,
            value_text(result.value) if result.ok else "",
            result.outcome,
            hours(core.spec.world_size, result.elapsed),
            core.usage.hours(),
            core.usage.unit,
            result.interrupted,
            result.verdict,
            cause.rank if cause else -1,
            cause.node if cause else -1,
            cause.error.traceback if cause and cause.error else (),
        )
        core.hub.announce(done, self.on_event)
        if core.spec.require_rdma and (problem := violation(core.hub.transport.values())):
            core.close(broken=problem)
            raise TransportError(f"--require-rdma: {problem}")
        return result


def run_cell(
    gang: Gang,
    payload: CellPayload,
    on_event: OnEvent | None,
    timeout: float | None = None,
    hang_timeout: float = 0.0,
) -> CellResult:
    """Run ``payload`` on every rank; return the outcome (failures as values). A stall of
    ``hang_timeout`` seconds (0: never) shows the hang verdict while the cell keeps running."""
    job = CellJob(gang.core, gang.generations, payload, on_event, hang_timeout)
    return gang.run(job, timeout)


def _drain_events(core: GangCore, on_event: OnEvent | None) -> None:
    """Show the events already queued (no waiting); replies stay for whoever waits on them."""
    while True:
        try:
            item = core.hub.inbox.get(timeout=0)
        except queue.Empty:
            return
        if isinstance(item, Reply):
            core.hub.inbox.put_reply(item)
            return
        if core.hub.inbox.is_event(item):  # an interrupt request that came too late is dropped
            core.hub.consume(item, on_event)


def _assemble(job: CellJob, elapsed: float) -> CellResult:
    outcomes, raw = rank_outcomes(job.core.spec, job.replies)
    result = CellResult(ranks=outcomes, elapsed=elapsed)
    for r in raw.values():
        result.notes.extend(r.notes)
    first = raw.get(0)
    if result.ok and first is not None:
        result.value = _value(first)
        if job.payload.return_all:
            result.values = [_value(raw[rank]) for rank in sorted(raw)]
        result.displays = list(first.displays)
        result.pulled = {k: v.loads() for k, v in (first.pulled or {}).items()}
    result.preemption = _preemption(job.core, first)  # after the value: kept, though not ok
    return result


def value_text(value: Any) -> str:
    """``value`` as the notebook's ``Out[]`` would print it, cut to ``VALUE_TEXT_MAX``; never a
    credential's text, since the registry keeps it and serves it to the panel."""
    if value is None:
        return ""
    if holds_secret("value", value):
        return "<hidden: it looks like a credential>"
    short = reprlib.Repr()  # a long list or dict is summarized, never printed whole
    short.maxstring = short.maxother = VALUE_TEXT_MAX
    text = short.repr(value)  # a repr that raises gives "<T instance at …>"
    return text if len(text) <= VALUE_TEXT_MAX else text[: VALUE_TEXT_MAX - 1] + "…"


def rank_outcomes(
    spec: ClusterSpec, replies: dict[int, Reply]
) -> tuple[list[RankOutcome], dict[int, RankReply]]:
    """Each rank's outcome (a node whose agent did not answer: all its ranks lost), and the
    ranks' own replies by rank."""
    gpus = spec.gpus
    outcomes: list[RankOutcome] = []
    raw: dict[int, RankReply] = {}
    for node in range(spec.nodes):
        reply = replies.get(node)
        if reply is None or reply.error is not None:
            why = reply.error if reply is not None else "no answer"
            err = RankError(
                "NodeLost", f"its agent (a dask worker) stopped answering: {why}", node_lost=True
            )
            outcomes += [
                RankOutcome(node * gpus + i, node, i, LOST, error=err) for i in range(gpus)
            ]
            continue
        answer: NodeReply = reply.value
        for r in answer.ranks:
            raw[r.rank] = r
            outcomes.append(
                RankOutcome(
                    r.rank,
                    node,
                    r.rank - node * gpus,
                    r.status,
                    r.duration,
                    r.error,
                    r.finished_at,
                    r.collective,
                )
            )
    outcomes.sort(key=lambda o: o.rank)
    return outcomes, raw


def _preemption(core: GangCore, first: RankReply | None) -> PreemptionOutcome | None:
    """The notice the gang got while the cell ran, with the checkpoint rank 0 (``first``) saw
    completed after it (every rank saves the same one)."""
    notice = core.preemption
    if notice is None:
        return None
    if first is None or not first.checkpoint:
        return PreemptionOutcome(notice)
    return PreemptionOutcome(notice, first.checkpoint, first.checkpoint_after_s)


def _value(reply: RankReply) -> Any:
    if reply.value is not None:
        return reply.value.loads()
    if reply.value_repr is not None:
        return RemoteRepr(reply.value_repr)
    return None


def _settle(
    core: GangCore, generations: Generations, result: CellResult, interrupted: bool
) -> None:
    """After a failure: re-form the group (in place: now, it takes tens of ms; with restarted
    ranks: in the background, they take seconds), or give the gang up."""
    if core.status != GangStatus.RUNNING or (result.ok and not interrupted):
        return  # closed meanwhile (``%cluster down``, max runtime), or nothing to re-form
    if result.preemption is not None:  # its node is going: no gang to re-form
        core.close(broken=f"node {result.preemption.notice.node} was preempted", wait=False)
        result.notes.append("the gang was torn down; the next cell starts a fresh one")
        return
    agents_lost = {o.node for o in result.ranks if o.error and o.error.node_lost}
    if agents_lost:
        nodes = ", ".join(f"node {n}" for n in sorted(agents_lost))
        core.close(broken=f"the agent of {nodes} was lost", wait=False)
        result.notes.append(
            f"the agent of {nodes} was lost, so the gang was torn down; "
            "the next cell starts a fresh one (rank state is lost)"
        )
        return
    restart = {o.node for o in result.ranks if o.status == LOST}
    generations.recover(restart)
    if restart:
        result.notes.append(restarted_note(core.spec, restart, done=False))
        return
    result.notes += generations.settle()  # what went wrong, if re-forming failed
    if core.status == GangStatus.READY and any(
        o.status in (ERROR, INTERRUPTED) for o in result.ranks
    ):
        result.notes.append(
            "the process group was re-formed in place; rank namespaces are intact, but what "
            "holds the old group (a DDP model, a new_group()) must be built again"
        )
