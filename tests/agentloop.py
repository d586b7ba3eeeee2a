"""Run a coroutine as a node agent's code runs: on an event loop of a thread of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def on_loop_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh loop in a thread of its own, as the agent's loop runs on its
    worker's thread (and whatever an earlier test left on the main thread cannot interfere)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
