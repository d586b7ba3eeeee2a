"""A cell rank's pdb as the kernel reaches it through the agent (``debugwire.py``).

The rank's pdb answers on its control socket (a prompt, or that it let go); the kernel asks
with one actor call per line (``NodeAgent.debug``) and gets the next answer. A prompt that
nobody waits for is a breakpoint the kernel must hear of.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from ..wire.debugwire import DebugAnswer, DebugEnded, DebugPrompt


class PdbRelay:
    """Rank ``rank``'s pdb answers, to the kernel call waiting for them or kept until one
    asks; ``paused(where)`` hears of a prompt nobody waited for."""

    def __init__(self, rank: int, paused: Callable[[str], None]) -> None:
        self.rank = rank
        self._paused = paused
        #: what the rank's pdb said that no kernel call waited for (a breakpoint's first prompt)
        self._pending: deque[DebugAnswer] = deque()
        #: the kernel call waiting for the pdb's next answer (``ask``)
        self._waiter: asyncio.Future[DebugAnswer] | None = None

    def answer(self, answer: DebugAnswer) -> None:
        """From the rank's pdb (on the loop's read of its control socket)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)
            return
        self._pending.append(answer)
        if isinstance(answer, DebugPrompt):
            self._paused(answer.where)

    def over(self, why: str) -> None:
        """The cell ended or the rank exited: its pdb is gone (a pause nobody answered, or one
        stepped past the cell's end), and a kernel call still waiting for it hears so."""
        self._pending.clear()
        self.answer(DebugEnded(self.rank, error=why))
        self._pending.clear()

    async def ask(self, message: object, send: Callable[[object], Awaitable[bool]]) -> DebugAnswer:
        """``send`` the kernel's ``message`` (``DebugStart``, a ``DebugLine``, or None: a paused
        rank's prompt) and return what the pdb says next: a prompt, or that it let go."""
        if message is None and self._pending:
            return self._pending.popleft()
        self._waiter = asyncio.get_running_loop().create_future()
        if message is not None:
            await send(message)
        return await self._waiter
