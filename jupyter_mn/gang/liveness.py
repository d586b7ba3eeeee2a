"""What a gang hears of its nodes beside a job's replies, and what it does about it.

A node silent to the heartbeat (``heartbeat.py``), a node told to go (a preemption notice) and a
rank lost while the gang is idle: a running job gets each as its failure (the root cause) or
notice; an idle gang is given up, or re-formed in the background.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import NodeUnreachable
from ..wire.events import Preemption, RankState, RankStatus, from_msg
from .inbox import Reply
from .recover import restarted_note

if TYPE_CHECKING:
    from .base import Gang


class Liveness:
    """The gang's handlers of node failures and notices (from the heartbeat, or dask's events)."""

    def __init__(self, gang: Gang, lock: threading.RLock, running: Callable[[], int]) -> None:
        """``lock``: the gang's; ``running``: the running job's run id (0: none)."""
        self._gang, self._lock, self._running = gang, lock, running

    def unreachable(self, node: int, silent: float) -> None:
        """From the heartbeat: node ``node`` has not answered for ``silent`` s. A running job
        gets it as that node's failed reply (the root cause); an idle gang is given up."""
        gang = self._gang
        host = gang.hosts[node] if node < len(gang.hosts) else "?"
        error = NodeUnreachable(
            f"node {node} ({host}) unreachable for {silent:.0f} s (no answer to the heartbeat)"
        )
        with self._lock:
            if self._running():
                gang.hub.inbox.put_reply(Reply(node, error=error))
                return
        gang.close(broken=str(error), wait=False)

    def on_dask_event(self, event: tuple[float, dict[str, Any]]) -> None:
        """An event the agents published on the gang's topic: shown, and acted on."""
        gang = self._gang
        msg = from_msg(event[1])
        gang.hub.dispatch(msg)
        if isinstance(msg, Preemption):
            self.preempted(msg)
        if isinstance(msg, RankState) and msg.state == RankStatus.LOST_IDLE and gang.status.idle:
            note = f"{msg.detail}\n{restarted_note(gang.spec, {msg.node}, done=True)}"
            gang.recover({msg.node}, [note], if_dead=True)

    def preempted(self, notice: Preemption) -> None:
        """A node is being preempted: every node's ranks hear it (``checkpoint.preempted()``);
        a running cell goes on (its loop saves and returns, or the deadline stops it) and then
        ends with ``Preempted``; an idle gang is given up at once."""
        gang = self._gang
        with self._lock:
            if gang.preemption is None:
                gang.preemption = notice
            running = bool(self._running())
        for node in range(gang.nodes):
            gang.ask(node, lambda agent: agent.preempt(notice))
        if not running:
            gang.close(broken=f"node {notice.node} was preempted", wait=False)
