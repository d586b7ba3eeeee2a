"""Re-form a gang after a failed cell, in the background, so the error is shown at once.

Ranks that raised keep their process: the group is re-initialized in place with a new generation
(namespaces survive). A node that lost a rank gets fresh rank processes (their state is lost) that
join the same new generation; when rank 0 was among them its c10d store is a new one, and the
other ranks reconnect to it. The next cell waits for this (``Generations.settle``); when it fails
the gang is torn down, and that cell starts a fresh one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import RendezvousError
from ..model.spec import ClusterSpec
from .core import GangCore

#: Seconds allowed on top of ``start_timeout`` (restarted ranks import torch before they join).
_SLACK_S = 30.0


def _reform_call(node: int, restarted: set[int], generation: int) -> Any:
    if node in restarted:
        return lambda agent: agent.relaunch(generation)
    return lambda agent: agent.reinit(generation, 0 in restarted)


def reform(
    core: GangCore, restart: set[int], generation: Callable[[], int], if_dead: bool = False
) -> set[int]:
    """Bring every rank into a new group generation, restarting the ranks of nodes in ``restart``
    (``if_dead``: only those with a dead rank); ``generation`` numbers the new one. Return the
    nodes whose ranks were restarted.

    Two steps: the old ranks of those nodes stop first (rank 0's c10d store with them), then
    fresh ones start while the others re-initialize (and reconnect, when rank 0 is new).
    """
    deadline = time.monotonic() + core.spec.start_timeout + _SLACK_S
    nodes = sorted(restart)
    retiring = [core.nodes.ask(node, lambda agent: agent.retire(if_dead)) for node in nodes]
    retired = _answers(dict(zip(nodes, retiring, strict=True)), deadline)
    restarted = {node for node, did in retired.items() if did}
    new = generation()
    calls = {
        node: core.nodes.ask(node, _reform_call(node, restarted, new))
        for node in range(core.nodes.count)
    }
    replies = _answers(calls, deadline)
    problems = [f"rank {r.rank}: {r.error}" for rs in replies.values() for r in rs if not r.ok]
    if problems:
        raise RendezvousError("; ".join(problems[:3]))
    return restarted


def _answers(futures: dict[int, Any], deadline: float) -> dict[int, Any]:
    """Each node's answer, or a ``RendezvousError`` naming the nodes that failed."""
    answers, problems = {}, []
    for node, future in futures.items():
        try:
            answers[node] = future.result(timeout=max(deadline - time.monotonic(), 0.1))
        except Exception as exc:
            problems.append(f"node {node}: {type(exc).__name__}: {exc}")
    if problems:
        raise RendezvousError("; ".join(problems[:3]))
    return answers


class Recovery:
    """One background re-forming; ``notes`` says what the next cell should tell the user.
    ``generation`` numbers the new group; ``done`` is told which nodes' ranks were restarted."""

    def __init__(
        self,
        core: GangCore,
        restart: set[int],
        notes: list[str],
        if_dead: bool,
        generation: Callable[[], int],
        done: Callable[[set[int]], None],
    ) -> None:
        self.core = core
        self.restart = restart
        self.if_dead = if_dead
        self.notes = notes
        self._generation, self._done = generation, done
        self._thread = threading.Thread(target=self._run, name="jupyter-mn-recover", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        try:
            restarted = reform(self.core, self.restart, self._generation, self.if_dead)
        except Exception as exc:
            self.core.close(broken=f"re-forming the process group failed: {exc}")
            self.notes.append(
                f"re-forming the process group failed ({exc}), so the gang was torn down; "
                "the next cell starts a fresh one"
            )
            return
        if self.if_dead and not restarted:
            self.notes.clear()  # a late report of a death already dealt with
        self._done(restarted)


def restarted_note(spec: ClusterSpec, nodes: set[int], done: bool) -> str:
    """Tell the user which ranks lost their state and which kept it."""
    fresh = [n * spec.gpus + i for n in sorted(nodes) for i in range(spec.gpus)]
    kept = [r for r in range(spec.world_size) if r not in fresh]
    where = ", ".join(f"node {n}" for n in sorted(nodes))
    verb = "were restarted" if done else "are being restarted"
    text = f"the ranks of {where} ({_list(fresh)}) {verb}: their state is lost"
    return text + (f"; ranks {_list(kept)} kept theirs" if kept else "")


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
