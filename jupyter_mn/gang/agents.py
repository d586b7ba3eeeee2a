"""The kernel's calls to a gang's node agents: one dask actor per node.

Placed one per worker; then called on every node at once (``call_each``: each outcome reaches
the inbox as that node's ``Reply``), on every node while the gang starts (``ask_all``: replies
collected, events shown meanwhile), on one node beside a running job (``ask``: a future of its
own), and sent cells on each agent's cell stream where the kernel reaches it (``cellstream.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import time
from collections.abc import Callable
from typing import Any

from ..errors import RendezvousError
from ..wire.events import OnEvent
from ..wire.rankwhere import RankWhere
from .cellstream import CellStream
from .hub import EventHub
from .inbox import Reply


class NodeAgents:
    """A gang's node agents and its ``distributed.Client``, in node order."""

    def __init__(self, hub: EventHub, job: str, topic: str) -> None:
        self._hub, self._job, self._topic = hub, job, topic
        #: the gang's ``distributed.Client`` (None before it is provisioned and once closed)
        self.client: Any = None
        self.agents: list[Any] = []
        self._futures: list[Any] = []
        #: cells' requests and replies, beside dask (cellstream.py)
        self._cells = CellStream(hub.inbox)

    @property
    def count(self) -> int:
        return len(self.agents)

    def place(self, addresses: list[str]) -> list[str]:
        """One node agent (a dask actor) per worker, in node order; return the workers' hosts."""
        from ..node.agent import NodeAgent

        client = self.client
        with client.as_current():
            self._futures = [
                client.submit(
                    NodeAgent,
                    self._job,
                    self._topic,
                    node,
                    actor=True,
                    workers=[addr],
                    allow_other_workers=False,
                    pure=False,
                    key=f"jupyter-mn-agent-{self._job}-{node}",
                )
                for node, addr in enumerate(addresses)
            ]
            self.agents = client.gather(self._futures)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        return [workers[a]["host"] for a in addresses]

    def open_cells(self, hosts: list[str]) -> None:
        """A cell stream to every agent the kernel can reach (not through a port-forward, which
        carries dask's scheduler connection alone); the others get their cells as actor calls."""
        client = self.client
        if client.direct_to_workers is False:
            return
        context = client.security.get_connection_args("client").get("ssl_context")
        ends = [agent.serve_cells() for agent in self.agents]
        agents = zip(range(self.count), hosts, ends, strict=True)
        self._cells.open_all([(node, host, at.result()) for node, host, at in agents], context)

    def on_this_host(self) -> bool:
        """Whether every agent has a cell stream from this host that takes shared names."""
        return self.count > 0 and self._cells.local(range(self.count))

    def stream_cell(self, payload: Any, run_id: int) -> list[int]:
        """Send ``(payload, run_id)`` on every node's cell stream; return the nodes it did not
        reach (no stream), whose cell goes as an actor call."""
        request = self._cells.request(payload, run_id)
        return [node for node in range(self.count) if not self._cells.send(node, request)]

    def send_cell(self, payload: Any, run_id: int) -> None:
        """Start ``agent.run(payload, run_id)`` on every node: on its cell stream where it has
        one, else as an actor call; each node's reply reaches the inbox."""
        rest = self.stream_cell(payload, run_id)
        if rest:
            self.call_each(lambda node, agent: agent.run(payload, run_id), rest)

    def ask_all(
        self, call: Callable[[int, Any], Any], timeout: float, on_event: OnEvent | None
    ) -> list[Reply]:
        """``call(node, agent)`` on every agent at once (while the gang starts: no job runs);
        the replies from the inbox, showing events meanwhile on ``on_event``, until all
        answered or one failed."""
        inbox = self._hub.inbox
        self.call_each(call)
        replies: dict[int, Reply] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < len(self.agents):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RendezvousError(f"no answer from node agents within {timeout:.0f} s")
            try:
                item = inbox.get(timeout=remaining)
            except queue.Empty:
                continue
            if isinstance(item, Reply):
                replies[item.node] = item
                if item.error is not None:
                    break
            elif inbox.is_event(item):
                self._hub.consume(item, on_event)
        return list(replies.values())

    def call_each(self, call: Callable[[int, Any], Any], nodes: list[int] | None = None) -> None:
        """Start ``call(node, agent)`` (an actor call) for every node, all with one wake-up of
        the client's loop (one per node cost a thread switch each on the cell's path); each
        outcome reaches the inbox as that node's reply. The actor proxy raises at once when its
        worker is already known lost: that is the reply then."""
        inbox = self._hub.inbox
        agents = list(self.agents)
        chosen = range(len(agents)) if nodes is None else nodes

        async def one(node: int, agent: Any) -> None:
            try:
                value = await call(node, agent)
            except BaseException as exc:
                inbox.put_reply(Reply(node, error=exc))
            else:
                inbox.put_reply(Reply(node, value=value))

        async def go() -> None:
            await asyncio.gather(*(one(node, agents[node]) for node in chosen))

        self.client.loop.add_callback(go)

    def ask(self, node: int, method: Callable[[Any], Any]) -> Any:
        """``method(agent)`` for node ``node``, answered by a future of its own rather than the
        inbox (stacks, teardown and re-forming run beside a cell); failed at once if the agent
        is known lost."""
        try:
            return method(self.agents[node])
        except Exception as exc:  # "Worker holding Actor was lost"
            failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
            failed.set_exception(exc)
            return failed

    def stacks(self, timeout: float = 3.0, stack: bool = True) -> list[RankWhere]:
        """Where every rank is (direct calls, no inbox): its main thread's stack in the cell's
        line numbers (unless ``stack`` is False) and its latest collectives; each node's answer
        or why there is none."""
        futures = [self.ask(node, lambda agent: agent.stacks(stack)) for node in range(self.count)]
        deadline = time.monotonic() + timeout
        out: list[RankWhere] = []
        for node, future in enumerate(futures):
            try:
                out += future.result(timeout=max(deadline - time.monotonic(), 0.1))
            except Exception as exc:
                out.append(RankWhere(node, -1, False, answered=False, note=str(exc)))
        return out

    def stop(self, timeout: float) -> dict[int, Any]:
        """Stop every agent (its ranks, its output); what each answered (its last log sequence
        number), within ``timeout`` s. The cell streams close after them: a run's reply comes
        first."""
        stops = [self.ask(node, lambda agent: agent.stop()) for node in range(self.count)]
        deadline = time.monotonic() + timeout
        last = {}
        for node, future in enumerate(stops):
            with contextlib.suppress(Exception):  # a lost agent: its worker goes with the cluster
                last[node] = future.result(timeout=max(deadline - time.monotonic(), 0.1))
        self._cells.close("the gang was torn down")
        return last

    def forget(self) -> None:
        """The dask cluster is going: no agent, no client."""
        self.agents, self._futures = [], []
        self.client = None
