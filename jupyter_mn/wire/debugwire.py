"""The messages of a debug session on a rank: kernel → node agent → rank pdb, and back.

A rank's pdb reads its commands from, and writes its output to, a line channel over the
rank's control socket (``rank/debugger.py``); its node agent relays each line and each answer
(``NodeAgent.debug``); the kernel prompts the user (``gang/debugger.py``). Both ends import
this module, so every message is one of these types, pickled as it is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DebugStart:
    """Kernel → rank: open pdb on the rank's last exception (a post-mortem)."""


@dataclass(frozen=True)
class DebugLine:
    """Kernel → rank: one line the user typed at the rank's prompt."""

    text: str


@dataclass(frozen=True)
class DebugPrompt:
    """Rank → kernel: pdb waits for a line; ``output`` is what it wrote since the last one."""

    rank: int
    output: str
    prompt: str
    #: where pdb stands, in the notebook's terms (``Cell In[4], line 7``)
    where: str = ""


@dataclass(frozen=True)
class DebugEnded:
    """Rank → kernel: pdb let go (``c``, ``q``, the post-mortem is over) or could not start."""

    rank: int
    output: str = ""
    #: why no session could be opened or went on ("": it ended as the user asked)
    error: str = ""


DebugAnswer = DebugPrompt | DebugEnded
