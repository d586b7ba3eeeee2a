"""The agent's end of the cell stream: the kernel's requests to run a cell, and their replies, on
one connection per node beside dask (docs/architecture.md, "The cell stream").

A dask actor call costs ~0.8 ms a round trip here (serialization, the client's loop thread, the
worker's handler); a cell's request and reply on a connection of their own cost ~0.1 ms. The
connection has dask's security: TLS with the gang's certificates when the worker uses TLS. Each
request (``(payload, run_id)``) runs as ``NodeAgent.run`` does for an actor call, concurrently
with others; its reply is ``(run_id, packed NodeReply, None)`` or ``(run_id, None, error)``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from .frames import Frames, Undecodable, encode

Run = Callable[[Any, int], Awaitable[bytes]]


class CellServer:
    """Listens on the worker's host; serves the kernel's connection (one at a time)."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: the kernel's connections, each with the task serving it
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}
        self.port = 0

    async def start(self, host: str, context: ssl.SSLContext | None) -> None:
        """Listen (on ``self.port``)."""
        self._server = await asyncio.start_server(self._serve, host, 0, ssl=context)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = Frames()
        serving = asyncio.current_task()
        assert serving is not None
        self._connections[writer] = serving
        try:
            while data := await reader.read(1 << 16):
                for request in frames.feed(data):
                    if isinstance(request, Undecodable):
                        continue  # only the kernel writes here; it sends what the agent reads
                    task = asyncio.ensure_future(self._answer(writer, *request))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except (ConnectionError, ssl.SSLError):
            pass  # the kernel went away: its runs still end, their replies go nowhere
        finally:
            self._connections.pop(writer, None)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, payload: Any, run_id: int) -> None:
        try:
            reply: tuple[int, bytes | None, str | None] = (
                run_id,
                await self._run(payload, run_id),
                None,
            )
        except Exception as exc:
            reply = (run_id, None, f"{type(exc).__name__}: {exc}")
        if not writer.is_closing():
            writer.write(encode(reply))

    async def close(self, grace: float = 0.0) -> None:
        """Stop listening; give the runs in progress ``grace`` seconds to answer (the agent has
        stopped their ranks) and their replies to go out, then drop the kernel's connection (a
        request still waiting gets ``StreamLost`` there); return once it is closed."""
        if self._server is not None:
            self._server.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace)
        connections = dict(self._connections)
        for writer in connections:
            writer.close()  # after what is written: the replies
            try:
                await asyncio.wait_for(writer.wait_closed(), grace)
            except (asyncio.TimeoutError, ConnectionError, ssl.SSLError):
                writer.transport.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *connections.values(), return_exceptions=True)
