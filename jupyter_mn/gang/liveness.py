"""What a gang hears of its nodes beside a job's replies, and what it does about it.

A node silent to the heartbeat (``heartbeat.py``), a node told to go (a preemption notice) and a
rank lost while the gang is idle: a running job gets each as its failure (the root cause) or
notice; an idle gang is given up, or re-formed in the background.
"""

from __future__ import annotations

from typing import Any

from ..errors import NodeUnreachable
from ..wire.events import Preemption, RankState, RankStatus, from_msg
from .core import GangCore
from .generations import Generations
from .inbox import Reply
from .recover import restarted_note


class Liveness:
    """The gang's handlers of node failures and notices (from the heartbeat, or dask's events)."""

    def __init__(self, core: GangCore, generations: Generations) -> None:
        """``generations``: where an idle gang that lost a rank is re-formed."""
        self._core, self._generations = core, generations

    def unreachable(self, node: int, silent: float) -> None:
        """From the heartbeat: node ``node`` has not answered for ``silent`` s. A running job
        gets it as that node's failed reply (the root cause); an idle gang is given up."""
        core = self._core
        host = core.hosts[node] if node < len(core.hosts) else "?"
        error = NodeUnreachable(
            f"node {node} ({host}) unreachable for {silent:.0f} s (no answer to the heartbeat)"
        )
        with core.lock:
            if core.run_id:
                core.hub.inbox.put_reply(Reply(node, error=error))
                return
        core.close(broken=str(error), wait=False)

    def on_dask_event(self, event: tuple[float, dict[str, Any]]) -> None:
        """An event the agents published on the gang's topic: shown, and acted on."""
        core = self._core
        msg = from_msg(event[1])
        core.hub.dispatch(msg)
        if isinstance(msg, Preemption):
            self.preempted(msg)
        if isinstance(msg, RankState) and msg.state == RankStatus.LOST_IDLE and core.status.idle:
            note = f"{msg.detail}\n{restarted_note(core.spec, {msg.node}, done=True)}"
            self._generations.recover({msg.node}, [note], if_dead=True)

    def preempted(self, notice: Preemption) -> None:
        """A node is being preempted: every node's ranks hear it (``checkpoint.preempted()``);
        a running cell goes on (its loop saves and returns, or the deadline stops it) and then
        ends with ``Preempted``; an idle gang is given up at once."""
        core = self._core
        with core.lock:
            if core.preemption is None:
                core.preemption = notice
            running = bool(core.run_id)
        for node in range(core.nodes.count):
            core.nodes.ask(node, lambda agent: agent.preempt(notice))
        if not running:
            core.close(broken=f"node {notice.node} was preempted", wait=False)
