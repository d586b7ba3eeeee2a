"""A rank's pdb, answered from the kernel (docs/architecture.md, "Debugging a rank").

The rank's pdb prompts through its node agent (``NodeAgent.debug``); here the kernel shows what
pdb wrote and asks the user for the next line with ``input()``, which in a notebook is the
frontend's own input box (ipykernel's ``input_request``), and in a script reads stdin.
Which rank a post-mortem debugs is chosen from the last cell's outcome (``LastCell``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from IPython.core.error import StdinNotImplementedError

from ..errors import DebugUnavailable
from ..model.result import LOST, OK, CellResult
from ..wire.debugwire import DebugAnswer, DebugEnded, DebugLine, DebugPrompt, DebugStart
from .core import GangCore

if TYPE_CHECKING:
    from .base import Gang

#: Asks the user for a line, showing a prompt (``input``).
Prompt = Callable[[str], str]
#: Shows pdb's output (``sys.stdout.write``).
Write = Callable[[str], object]


def can_prompt() -> bool:
    """Whether ``input()`` can be answered here: in a kernel, whether its frontend allows stdin
    (papermill and nbclient do not); elsewhere, whether there is a stdin."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is not None:
        return bool(kernel.get_parent().get("content", {}).get("allow_stdin", False))
    return sys.stdin is not None and not sys.stdin.closed


def converse(
    core: GangCore,
    rank: int,
    opening: DebugStart | None,
    prompt: Prompt,
    write: Write,
) -> DebugEnded:
    """Relay the user's lines to rank ``rank``'s pdb and its output back, until it lets go.

    ``opening``: ``DebugStart`` for a post-mortem; None for a rank already paused at a
    breakpoint. End of input (or a frontend that cannot prompt) answers ``q``. A Ctrl-C at
    the prompt raises: at a breakpoint the cell is then interrupted as always; a post-mortem
    (its rank runs no cell a signal could stop) is closed first.
    """
    node = rank // core.spec.gpus
    answer = _ask(core, node, rank, opening)
    while isinstance(answer, DebugPrompt):
        write(answer.output)
        try:
            line = prompt(answer.prompt)
        except (EOFError, StdinNotImplementedError):
            line = "q"
        except KeyboardInterrupt:
            if opening is not None:
                _ask(core, node, rank, DebugLine("q"))
            raise
        answer = _ask(core, node, rank, DebugLine(line))
    write(answer.output)
    return answer


def _ask(
    core: GangCore, node: int, rank: int, message: DebugStart | DebugLine | None
) -> DebugAnswer:
    """The agent relays ``message``; what the rank's pdb says next (a lost agent: it ended)."""
    future = core.nodes.ask(node, lambda agent: agent.debug(rank, message))
    try:
        return future.result()
    except Exception as exc:  # the agent was lost: so was the session
        return DebugEnded(rank, error=f"node {node} did not answer: {exc}")


def post_mortem(gang: Gang, rank: int, prompt: Prompt, write: Write) -> DebugEnded:
    """pdb on rank ``rank``'s last exception; the gang is busy meanwhile (no cell runs) and
    READY after it, the other ranks untouched."""
    with gang.running():
        return converse(gang.core, rank, DebugStart(), prompt, write)


def post_mortem_of(
    last: LastCell | None, gang: Gang | None, rank: int | None, prompt: Prompt, write: Write
) -> None:
    """``Cluster.debug``: pdb on the failed rank of the ``last`` cell (``rank``, else its root
    cause's), or ``DebugUnavailable`` saying why there is none."""
    if last is None:
        raise DebugUnavailable("no cell has run on this cluster: there is nothing to debug")
    rank = last.rank_to_debug(gang, rank)
    assert gang is not None  # rank_to_debug: the gang that ran the cell is up
    ended = post_mortem(gang, rank, prompt, write)
    if ended.error:
        raise DebugUnavailable(ended.error)


@dataclass(frozen=True)
class LastCell:
    """A cluster's last cell: its number, its outcome and the gang it ran on."""

    cell_id: int
    result: CellResult
    gang_id: str

    def rank_to_debug(self, gang: Gang | None, rank: int | None) -> int:
        """The rank to debug (``rank``, else the root cause's), or ``DebugUnavailable`` saying
        why there is none (nothing launched, nothing changed)."""
        cell, result = self.cell_id, self.result
        if result.ok:
            raise DebugUnavailable(f"the last cell (In[{cell}]) did not fail: nothing to debug")
        if gang is None or gang.core.id != self.gang_id:
            raise DebugUnavailable(f"the gang that ran In[{cell}] is gone, and its tracebacks")
        failed = [o for o in result.ranks if o.status != OK]
        cause = result.root_cause
        if rank is None and cause is not None:
            rank = cause.rank
        outcome = next((o for o in result.ranks if o.rank == rank), None)
        if outcome is None:
            raise DebugUnavailable(f"there is no rank {rank} (ranks 0-{len(result.ranks) - 1})")
        if outcome.status == OK:
            which = ", ".join(str(o.rank) for o in failed)
            raise DebugUnavailable(f"rank {rank} did not fail in In[{cell}] (failed: {which})")
        if outcome.status == LOST:
            raise DebugUnavailable(
                f"rank {rank} was lost in In[{cell}] and restarted: its traceback is gone"
            )
        return outcome.rank
