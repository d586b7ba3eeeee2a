"""One cell on a gang: dispatch, stream, fail fast, collect, re-form the group after a failure.

The kernel's main thread waits on the gang's inbox, where agent replies and events arrive, so
output is printed from the main thread (ipykernel routes it to the running cell) and a Ctrl-C
lands here, where it becomes an interrupt of the ranks rather than a dead kernel.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..cell import CellPayload
from ..errors import CellInterrupted, TransportError
from ..events import CellDone
from ..result import ERROR, INTERRUPTED, LOST, OK, CellResult, RankOutcome, RemoteError
from .base import _LOG_DRAIN_S, Gang, _Reply
from .state import GangStatus
from .transport import violation

_TICK_S = 0.25
#: After an interrupt, how long ranks get to stop before the gang is declared broken.
STOP_AFTER_INTERRUPT_S = 10.0


class RemoteRepr:
    """Stands for a rank value that could not be pickled: shows the rank's ``repr``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def run_cell(
    gang: Gang,
    payload: CellPayload,
    on_event: Callable[[Any], None] | None,
    timeout: float | None = None,
) -> CellResult:
    """Run ``payload`` on every rank; return the outcome (failures as values)."""
    gang._transition(GangStatus.RUNNING)
    started = time.monotonic()
    for node, agent in enumerate(gang.agents):
        gang._submit(node, agent.run(payload))
    replies: dict[int, _Reply] = {}
    interrupted_at: float | None = None
    reason = ""
    deadline = started + timeout if timeout else None

    def interrupt(why: str) -> None:
        nonlocal interrupted_at, reason
        if interrupted_at is None:
            interrupted_at, reason = time.monotonic(), why
            for agent in gang.agents:
                agent.interrupt()

    while len(replies) < len(gang.agents):
        try:
            now = time.monotonic()
            if gang.cancel_reason:
                interrupt(gang.cancel_reason)
            if deadline is not None and now >= deadline:
                interrupt(f"--timeout {timeout:g} s reached")
            if interrupted_at is not None and now - interrupted_at > STOP_AFTER_INTERRUPT_S:
                gang.close(
                    broken=f"ranks did not stop within {STOP_AFTER_INTERRUPT_S:.0f} s "
                    f"of being interrupted ({reason})"
                )
                raise CellInterrupted(
                    f"{reason}; the ranks did not stop, so the gang was torn down "
                    "(the next cell starts a fresh one)"
                )
            try:
                item = gang.inbox.get(timeout=_TICK_S)
            except queue.Empty:
                continue
            if isinstance(item, _Reply):
                replies[item.node] = item
                if item.error is not None or _failed(item.value):
                    interrupt("another rank failed")
            else:
                gang.consume(item, on_event)
                if gang.is_primary_failure(item):
                    interrupt("another rank failed")
        except KeyboardInterrupt:
            interrupt("interrupted by the user")
    _drain_logs(gang, replies, on_event)
    result = _assemble(gang, payload, replies, time.monotonic() - started)
    said_why = reason.startswith("--timeout") or bool(reason and reason == gang.cancel_reason)
    if interrupted_at is not None and said_why:  # the ranks only say "KeyboardInterrupt"
        result.notes.append(f"the cell was interrupted: {reason}")
    _settle(gang, result)
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


def _drain_logs(gang: Gang, replies: dict[int, _Reply], on_event: Any) -> None:
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
        if not isinstance(item, _Reply):
            gang.consume(item, on_event)


def _drain_events(gang: Gang, on_event: Any) -> None:
    """Show the events already queued (no waiting); replies stay for whoever waits on them."""
    while True:
        try:
            item = gang.inbox.get(timeout=0)
        except queue.Empty:
            return
        if isinstance(item, _Reply):
            gang.inbox.put_reply(item)
            return
        gang.consume(item, on_event)


def _assemble(
    gang: Gang, payload: CellPayload, replies: dict[int, _Reply], elapsed: float
) -> CellResult:
    gpus = gang.spec.gpus
    outcomes: list[RankOutcome] = []
    raw: dict[int, dict[str, Any]] = {}
    for node in sorted(replies):
        reply = replies[node]
        if reply.error is not None:
            err = RemoteError("NodeLost", f"the node agent stopped answering: {reply.error}")
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


def _value(reply: dict[str, Any]) -> Any:
    if reply.get("value") is not None:
        return cloudpickle.loads(reply["value"])
    if reply.get("value_repr") is not None:
        return RemoteRepr(reply["value_repr"])
    return None


def _settle(gang: Gang, result: CellResult) -> None:
    """After a failure: re-form the process group in place, or mark the gang broken."""
    if result.ok:
        gang._transition(GangStatus.READY)
        return
    lost = [o for o in result.ranks if o.status == LOST]
    if lost:
        gang.close(broken=f"{lost[0].label} was lost")
        result.notes.append(
            "the gang was torn down; the next cell starts a fresh one (rank state is lost)"
        )
        return
    generation = gang.next_generation()
    replies = gang._call_all(
        lambda agent: agent.reinit(generation), gang.spec.start_timeout, until_first_error=False
    )
    problems = [str(r.error) for r in replies if r.error is not None]
    problems += [
        f"rank {x['rank']}: {x.get('error')}"
        for r in replies
        if r.error is None
        for x in r.value
        if not x.get("ok")
    ]
    if problems:
        gang.close(broken="re-forming the process group failed: " + "; ".join(problems[:3]))
        result.notes.append(
            "the process group could not be re-formed, so the gang was torn "
            "down; the next cell starts a fresh one"
        )
        return
    gang._transition(GangStatus.READY)
    if any(o.status in (ERROR, INTERRUPTED) for o in result.ranks):
        result.notes.append("the process group was re-formed; rank namespaces are intact")
