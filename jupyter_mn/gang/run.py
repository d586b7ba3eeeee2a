"""One cell on a gang: dispatch, stream, fail fast, stop on demand, collect, then re-form.

The kernel's main thread waits on the gang's inbox, where agent replies and events arrive, so
output is printed from the main thread (ipykernel routes it to the running cell) and a Ctrl-C
lands here, where it becomes an interrupt of the ranks rather than a dead kernel.

Stopping a cell escalates (docs/architecture.md, "Stopping a cell"): on ``--timeout``, Ctrl-C or a
cancel request every rank's stack is shown first; then SIGINT to the busy ranks (Python code stops
in ms) while idle ranks leave their group (the destroy cascade frees ranks blocked in a collective);
ranks still busy ``KILL_AFTER_S`` later are killed, and their node's ranks are restarted. A second
Ctrl-C kills at once. Restarted ranks join the group in the background (``recover.py``), so the
error shows without waiting for them.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..cell import CellPayload
from ..errors import TransportError
from ..events import CellDone, RankState, Stacks
from ..result import ERROR, INTERRUPTED, LOST, OK, CellResult, RankOutcome, RemoteError
from .base import _LOG_DRAIN_S, Gang
from .inbox import InterruptRequest, Reply
from .recover import restarted_note
from .state import GangStatus
from .transport import violation

_TICK_S = 0.25
#: After an interrupt, how long busy ranks get to stop before they are killed.
KILL_AFTER_S = 3.0
#: After the kill, how long node agents get to answer before the gang is declared broken.
GIVE_UP_AFTER_S = 10.0


class RemoteRepr:
    """Stands for a rank value that could not be pickled: shows the rank's ``repr``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _Stopper:
    """The escalation of one run, from the first interrupt to the kill."""

    def __init__(self, gang: Gang, run_id: int, on_event: Callable[[Any], None] | None) -> None:
        self.gang, self.run_id, self.on_event = gang, run_id, on_event
        self.since: float | None = None
        self.killed_at: float | None = None
        #: why the user's cell was stopped; empty when only a rank's failure stopped it
        self.reason = ""
        self.where: list[str] = []

    def interrupt(self, reason: str, by_user: bool, again_kills: bool = False) -> None:
        if self.since is not None:
            if again_kills and self.killed_at is None:  # a second Ctrl-C: do not wait
                self.kill("interrupted twice")
            return
        if by_user:
            self.reason = reason
            self._show_stacks(reason)
        self.since = time.monotonic()
        generation = self.gang.generation
        for node in range(self.gang.nodes):
            self.gang.ask(node, lambda agent: agent.interrupt(self.run_id, generation))

    def kill(self, why: str) -> None:
        self.killed_at = time.monotonic()
        for node in range(self.gang.nodes):
            self.gang.ask(node, lambda agent: agent.kill(self.run_id, why))

    def tick(self, now: float) -> bool:
        """Escalate when due; True when the agents have stopped answering."""
        if self.since is not None and self.killed_at is None and now - self.since > KILL_AFTER_S:
            self.kill(f"it did not stop within {KILL_AFTER_S:g} s of the interrupt")
        return self.killed_at is not None and now - self.killed_at > GIVE_UP_AFTER_S

    def _show_stacks(self, reason: str) -> None:
        try:
            ranks = sorted(self.gang.stacks(), key=lambda r: r["rank"])
        except KeyboardInterrupt:  # impatient: stop without them
            return
        self.gang.consume(
            Stacks(
                reason,
                tuple(
                    (r["node"], r["rank"], r["busy"], tuple(r["stack"]), r["note"]) for r in ranks
                ),
            ),
            self.on_event,
        )
        for r in ranks:
            cell = [i for i, line in enumerate(r["stack"]) if line.startswith("Cell ")]
            if r["busy"] and cell:
                at = r["stack"][cell[-1] : cell[-1] + 2]
                code = f": {at[1].strip()}" if len(at) > 1 and at[1].startswith("    ") else ""
                self.where.append(f"rank {r['rank']} (node {r['node']}) was at {at[0]}{code}")


def run_cell(
    gang: Gang,
    payload: CellPayload,
    on_event: Callable[[Any], None] | None,
    timeout: float | None = None,
) -> CellResult:
    """Run ``payload`` on every rank; return the outcome (failures as values)."""
    run_id = gang.begin_run()
    started = time.monotonic()
    gang.replay(on_event)
    for node, agent in enumerate(gang.agents):
        gang.call(node, lambda agent=agent: agent.run(payload, run_id))
    replies: dict[int, Reply] = {}
    stopper = _Stopper(gang, run_id, on_event)
    deadline = started + timeout if timeout else None
    while len(replies) < gang.nodes:
        try:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                deadline = None
                stopper.interrupt(f"--timeout {timeout:g} s reached", by_user=True)
            if stopper.tick(now):
                break
            try:
                item = gang.inbox.get(timeout=_TICK_S)
            except queue.Empty:
                continue
            if isinstance(item, Reply):
                replies[item.node] = item
                if item.error is not None or _failed(item.value):
                    stopper.interrupt("another rank failed", by_user=False)
            elif isinstance(item, InterruptRequest):
                if item.run == run_id:  # else: meant for a run that is over
                    stopper.interrupt(item.reason, by_user=True, again_kills=True)
            else:
                gang.consume(item, on_event)
                if isinstance(item, RankState) and item.run == run_id and item.detail == "primary":
                    stopper.interrupt("another rank failed", by_user=False)
        except KeyboardInterrupt:
            stopper.interrupt("interrupted by the user", by_user=True, again_kills=True)
    with contextlib.suppress(KeyboardInterrupt):  # the cell is over: only late output is lost
        _drain_logs(gang, replies, on_event)
    result = _assemble(gang, payload, replies, time.monotonic() - started)
    result.interrupted = stopper.reason
    result.notes += stopper.where
    _settle(gang, result, interrupted=stopper.since is not None)
    _drain_events(gang, on_event)  # the settled state (READY, BROKEN) reaches the view first
    cause = result.root_cause
    error = "" if cause is None or cause.error is None else f"{cause.label}: {cause.error.line()}"
    done = CellDone(payload.cell_id, result.ok, result.elapsed, result.timings(), error)
    gang.announce(done, on_event)
    if gang.spec.require_rdma and (problem := violation(gang.transport.values())):
        gang.close(broken=problem)
        raise TransportError(f"--require-rdma: {problem}")
    return result


def _failed(value: Any) -> bool:
    return bool(value) and any(r["status"] != OK for r in value["ranks"])


def _drain_logs(gang: Gang, replies: dict[int, Reply], on_event: Any) -> None:
    """Show every line the ranks wrote before their reply (events travel another path)."""
    wanted = {n: r.value["seq"] for n, r in replies.items() if r.error is None}
    deadline = time.monotonic() + _LOG_DRAIN_S
    while any(gang.seen(n) < seq for n, seq in wanted.items()):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            item = gang.inbox.get(timeout=remaining)
        except queue.Empty:
            return
        if not isinstance(item, (Reply, InterruptRequest)):
            gang.consume(item, on_event)


def _drain_events(gang: Gang, on_event: Any) -> None:
    """Show the events already queued (no waiting); replies stay for whoever waits on them."""
    while True:
        try:
            item = gang.inbox.get(timeout=0)
        except queue.Empty:
            return
        if isinstance(item, Reply):
            gang.inbox.put_reply(item)
            return
        if not isinstance(item, InterruptRequest):  # one that came too late is dropped
            gang.consume(item, on_event)


def _assemble(
    gang: Gang, payload: CellPayload, replies: dict[int, Reply], elapsed: float
) -> CellResult:
    outcomes, raw = rank_outcomes(gang, replies)
    result = CellResult(ranks=outcomes, elapsed=elapsed)
    for r in raw.values():
        result.notes.extend(r.get("notes") or [])
    first = raw.get(0, {})
    if result.ok:
        result.value = _value(first)
        if payload.return_all:
            result.values = [_value(raw[rank]) for rank in sorted(raw)]
        result.displays = first.get("displays") or []
        result.pulled = {k: cloudpickle.loads(v) for k, v in (first.get("pulled") or {}).items()}
    return result


def rank_outcomes(
    gang: Gang, replies: dict[int, Reply]
) -> tuple[list[RankOutcome], dict[int, dict[str, Any]]]:
    """Each rank's outcome (a node whose agent did not answer: all its ranks lost), and the
    raw per-rank replies by rank."""
    gpus = gang.spec.gpus
    outcomes: list[RankOutcome] = []
    raw: dict[int, dict[str, Any]] = {}
    for node in range(gang.spec.nodes):
        reply = replies.get(node)
        if reply is None or reply.error is not None:
            why = reply.error if reply is not None else "no answer"
            err = RemoteError("NodeLost", f"its agent (a dask worker) stopped answering: {why}")
            outcomes += [
                RankOutcome(node * gpus + i, node, i, LOST, error=err) for i in range(gpus)
            ]
            continue
        for r in reply.value["ranks"]:
            raw[r["rank"]] = r
            error = (
                RemoteError(
                    r["error"]["ename"],
                    r["error"]["evalue"],
                    tuple(r["error"]["traceback"]),
                    r["error"]["secondary"],
                )
                if r.get("error")
                else None
            )
            outcomes.append(
                RankOutcome(
                    r["rank"],
                    node,
                    r["rank"] - node * gpus,
                    r["status"],
                    r.get("duration"),
                    error,
                    r.get("finished_at"),
                    r.get("collective"),
                )
            )
    outcomes.sort(key=lambda o: o.rank)
    return outcomes, raw


def _value(reply: dict[str, Any]) -> Any:
    if reply.get("value") is not None:
        return cloudpickle.loads(reply["value"])
    if reply.get("value_repr") is not None:
        return RemoteRepr(reply["value_repr"])
    return None


def _settle(gang: Gang, result: CellResult, interrupted: bool) -> None:
    """After a failure: re-form the group (in place: now, it takes tens of ms; with restarted
    ranks: in the background, they take seconds), or give the gang up."""
    if gang.status != GangStatus.RUNNING:
        return  # closed meanwhile (``%cluster down``, max runtime)
    if result.ok and not interrupted:
        gang._transition(GangStatus.READY)
        return
    agents_lost = {o.node for o in result.ranks if o.error and o.error.ename == "NodeLost"}
    if agents_lost:
        nodes = ", ".join(f"node {n}" for n in sorted(agents_lost))
        gang.close(broken=f"the agent of {nodes} was lost", wait=False)
        result.notes.append(
            f"the agent of {nodes} was lost, so the gang was torn down; "
            "the next cell starts a fresh one (rank state is lost)"
        )
        return
    restart = {o.node for o in result.ranks if o.status == LOST}
    gang.recover(restart)
    if restart:
        result.notes.append(restarted_note(gang.spec, restart, done=False))
        return
    result.notes += gang.settle()  # what went wrong, if re-forming failed
    if gang.status == GangStatus.READY and any(
        o.status in (ERROR, INTERRUPTED) for o in result.ranks
    ):
        result.notes.append(
            "the process group was re-formed in place; rank namespaces are intact, but what "
            "holds the old group (a DDP model, a new_group()) must be built again"
        )
