"""The messages on a cell rank's control socket: node agent ↔ rank, and what the agent hands on.

A leaf that the kernel, the node agent and the rank may all import (as ``debugwire.py`` is for a
rank's pdb), since each of them unpickles some of these: every message is one of these frozen
types, pickled as it is, and each side dispatches on the type, never on a tag.

- Agent → rank: ``RunCell``, ``LeaveGroup``, ``Reform``, ``Stop`` (and ``debugwire``'s
  ``DebugStart`` / ``DebugLine``).
- Rank → agent: ``RankReady`` or ``StartFailed`` once, then a ``DisplayOutput`` for each of rank
  0's display calls while a cell runs, a ``RankReply`` (``events.py``) per cell, a ``Reformed``
  per ``Reform`` (and ``debugwire``'s ``DebugPrompt`` / ``DebugEnded``).
- The agent hands ``RankReady`` (``NodeAgent.start``) and ``Reformed`` (``reinit``,
  ``relaunch``) to the kernel as they are, and the ``RankReply`` in its ``NodeReply``.

A rank's stacks socket carries ``rankwhere.py``'s ``WhereRequest`` / ``AbortRequest`` /
``RankWhere`` and the ``Preemption`` notice.
"""

from __future__ import annotations

from dataclasses import dataclass

from .payload import CellPayload


@dataclass(frozen=True)
class RunCell:
    """Agent → rank: run this cell (packed once for all the node's ranks: it may be large)."""

    payload: CellPayload
    #: the kernel is on this host: a big value goes to it as a file (``valuefiles.py``)
    values_by_file: bool = False


@dataclass(frozen=True)
class LeaveGroup:
    """Agent → rank: an interrupt found this rank idle: leave group ``generation`` (not a later
    one: the request may arrive late), so that peers blocked on it are released."""

    generation: int


@dataclass(frozen=True)
class Reform:
    """Agent → rank: join group ``generation`` (namespaces survive); ``reconnect``: rank 0 was
    restarted, so its c10d store is a new one."""

    generation: int
    reconnect: bool = False


@dataclass(frozen=True)
class Stop:
    """Agent → rank: leave the group and exit."""


@dataclass(frozen=True)
class RankReady:
    """Rank → agent → kernel: the rank joined the process group."""

    rank: int
    local_rank: int
    pid: int
    #: ``cuda:N`` or ``cpu``
    device: str
    #: the group's backend (``nccl``, ``gloo``)
    backend: str
    host: str


@dataclass(frozen=True)
class StartFailed:
    """Rank → agent: the rank could not join (the exception, as ``Type: message``); it exits."""

    error: str


@dataclass(frozen=True)
class Reformed:
    """Rank → agent → kernel: the answer to a ``Reform`` (``rank`` -1: a node whose fresh ranks
    did not start)."""

    rank: int
    ok: bool
    error: str = ""
