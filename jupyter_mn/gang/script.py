"""``%cluster run SCRIPT [ARGS…]``: an unchanged training script on every rank of a gang's nodes.

Like torchrun: every rank runs ``python -u SCRIPT ARGS`` with the env contract, on a fresh
rendezvous port (rank 0 of a warm gang already hosts a TCPStore on MASTER_PORT); output streams
live like a cell's; the first rank to fail stops all of them, and the result names it with its
traceback. The value is rank 0's exit status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import SpecError
from ..launch import Script
from ..node.worker import find_script
from ..result import LOST, CellResult
from .base import Gang
from .inbox import Reply
from .run import _drain_logs, rank_outcomes
from .state import GangStatus

_TICK_S = 0.25


#: The largest script sent to nodes that do not have it (bytes).
COPY_LIMIT = 16 << 20


def locate(gang: Gang, script: str) -> tuple[list[str | None], bytes | None]:
    """The script's path as each node sees it, or None where the node lacks it and it is sent
    (with its bytes, the second item); raise before anything starts if it cannot be.

    Tried in order: the path as the kernel resolves it (a shared filesystem), then the path
    as given, relative to the ranks' working directory on each node. A node without it gets
    the kernel's copy (a pod, say, does not see the notebook's files).
    """
    here = os.path.isfile(script)
    tried = [os.path.abspath(script)] if here else []
    if script not in tried:
        tried.append(script)
    cwd = gang.provisioner.launch_options().get("cwd")
    found = gang.client.run(find_script, tried, cwd, workers=gang.addresses, on_error="return")
    paths = [p if isinstance(p := found.get(a), str) else None for a in gang.addresses]
    missing = _lacking(paths)
    if not missing:
        return paths, None
    if not here:
        raise SpecError(
            f"{script}: no such file on node(s) {missing} (looked for {' and '.join(tried)}); "
            "copy it there or use a filesystem the nodes share"
        )
    size = os.path.getsize(script)
    if size > COPY_LIMIT:
        raise SpecError(
            f"{script}: not on node(s) {missing}, and at {size / 2**20:.1f} MiB too large to "
            f"send (limit {COPY_LIMIT >> 20} MiB); put it on a filesystem the nodes share"
        )
    with open(script, "rb") as f:
        return paths, f.read()


def _lacking(paths: list[str | None]) -> str:
    """The nodes without the script, as "1, 3"."""
    return ", ".join(str(node) for node, path in enumerate(paths) if path is None)


def run_script(
    gang: Gang,
    script: str,
    args: Sequence[str],
    on_event: Callable[[Any], None] | None,
    timeout: float | None = None,
) -> CellResult:
    """Run ``script`` on every rank; the first failure stops the rest (failures as values)."""
    paths, source = locate(gang, script)
    _, port = gang.agents[0].endpoint().result()
    launch = gang.launch(port)
    warm = gang.status.usable
    if warm:
        gang._transition(GangStatus.RUNNING)
    started = time.monotonic()
    for node, agent in enumerate(gang.agents):
        path = paths[node]
        sent = Script(path or os.path.basename(script), tuple(args), None if path else source)
        node_launch = dataclasses.replace(launch, script=sent)
        gang.call(node, lambda agent=agent, sent=node_launch: agent.run_script(sent))
    replies, reason = _collect(gang, on_event, timeout)
    _drain_logs(gang, replies, on_event)
    outcomes, raw = rank_outcomes(gang, replies)
    result = CellResult(ranks=outcomes, elapsed=time.monotonic() - started)
    result.value = raw.get(0, {}).get("exit_code")
    if source is not None:
        result.notes.append(
            f"{os.path.basename(script)} was sent to node(s) {_lacking(paths)}, which do not "
            "have it (files it imports were not)"
        )
    if reason.startswith("--timeout"):
        result.notes.append(f"the script was stopped: {reason}")
    lost = [o for o in outcomes if o.status == LOST and o.error and o.error.ename == "NodeLost"]
    if lost:
        gang.close(broken=f"{lost[0].label} was lost")
        result.notes.append("a node was lost, so the gang was torn down")
    elif warm:
        gang._transition(GangStatus.READY)
    return result


def _collect(
    gang: Gang, on_event: Callable[[Any], None] | None, timeout: float | None
) -> tuple[dict[int, Reply], str]:
    """Wait for every node's reply; on a failure, timeout or Ctrl-C, stop every node's script."""
    deadline = time.monotonic() + timeout if timeout else None
    replies: dict[int, Reply] = {}
    reason = ""

    def stop(why: str, signum: int = signal.SIGTERM) -> None:
        nonlocal reason
        if not reason:
            reason = why
            for agent in gang.agents:
                with contextlib.suppress(Exception):  # a lost agent's reply says so
                    agent.stop_script(signum, why)

    while len(replies) < len(gang.agents):
        try:
            if deadline is not None and time.monotonic() >= deadline:
                stop(f"--timeout {timeout:g} s reached")
            if gang.take(replies, on_event, _TICK_S):
                stop("another rank failed")
        except KeyboardInterrupt:
            stop("interrupted by the user", signal.SIGINT)
    return replies, reason
