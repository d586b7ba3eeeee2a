"""What the gang's run protocol drives: a cell, a script, a node command or the doctor's probes.

Each is a ``Job``: they differ in what they start on the nodes, how they are stopped and when
they are done. Waiting, interrupt requests (Cancel, ``--max-runtime``), ``--timeout``, Ctrl-C and
showing events as they arrive are the same for all of them and live in one loop, ``Gang.run``
(docs/architecture.md, "The run protocol").
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from ..wire.events import LogLines, NodeReply, OnEvent, RankState, RunStarted
from .core import GangCore
from .inbox import Message, Reply

T = TypeVar("T")

#: The reason ``Gang.run`` gives a job stopped by Ctrl-C.
INTERRUPTED_BY_USER = "interrupted by the user"
#: How long the loop sleeps between ticks (timeouts and escalation are checked then).
TICK_S = 0.25
#: After the replies, how long the lines written before them may take to arrive (events travel
#: another path than replies), counted from the last batch that came: a wide gang's backlog
#: (64 nodes × 8 ranks printing, bench/scale.py) takes longer in all, but keeps coming.
LOG_DRAIN_S = 5.0


class Job(Generic[T]):
    """One run on the gang's nodes. ``Gang.run`` calls ``start``, feeds ``take`` everything that
    arrives, ``stop``s it on a failure or a request, ``tick``s it, and returns ``finish()``.

    The default suits node agents answering one ``NodeReply`` each: the job is done when every
    node has answered, and a failed rank (its reply, or its primary-failure event, which comes
    first) stops the others.
    """

    tick_s = TICK_S

    def __init__(self, core: GangCore, on_event: OnEvent | None) -> None:
        self.core = core
        self.on_event = on_event
        #: set by ``Gang.run``: the id that interrupt requests and the agents' events name
        self.run_id = 0
        self.replies: dict[int, Reply] = {}
        #: why the user (Ctrl-C, Cancel, ``--timeout``, ``--max-runtime``) stopped it; "" if not
        self.reason = ""
        #: how long it waited for the user at a rank's breakpoint (``--timeout`` does not count it)
        self.paused_for = 0.0

    def what(self) -> RunStarted:
        """What runs, as the logs and the registry are told when it starts."""
        return RunStarted(self.run_id, type(self).__name__)

    def start(self) -> None:
        """Start the work on the nodes; what they answer reaches the gang's inbox."""
        raise NotImplementedError

    def done(self) -> bool:
        return len(self.replies) >= self.core.nodes.count

    def take(self, item: Any) -> bool:
        """One thing from the inbox; True when it says a rank failed (the others then stop)."""
        if isinstance(item, Reply):
            if item.node in self.replies:  # a node declared unreachable that answers after all
                return False
            if item.error is None:
                item = Reply(item.node, NodeReply.of(item.value))
            self.replies[item.node] = item
            return item.error is not None or item.value.failed
        if not self.core.hub.inbox.is_event(item):
            return False  # a message for a job that is over
        self.core.hub.consume(item, self.on_event)
        return isinstance(item, RankState) and item.primary and item.run == self.run_id

    def stop(self, reason: str, by_user: bool, again: bool = False) -> None:
        """Stop the work: ``by_user`` for a request (``reason`` says which), else because a rank
        failed; ``again`` when the user asks once more (a second Ctrl-C: no more waiting)."""
        raise NotImplementedError

    def tick(self, now: float) -> bool:
        """Escalate when due; True to stop waiting (the nodes no longer answer)."""
        return False

    def settle(self) -> None:
        """Once done, while the gang is still RUNNING: what must happen before it is READY again
        (a failed cell re-forms the group, a lost node closes the gang)."""

    def finish(self) -> T:
        """The outcome, once the run is over."""
        raise NotImplementedError

    def drain_logs(self) -> None:
        """Show every line the ranks wrote before their reply (events travel another path);
        give up once none has come for ``LOG_DRAIN_S``."""
        wanted = {n: r.value.seq for n, r in self.replies.items() if r.error is None}
        deadline = time.monotonic() + LOG_DRAIN_S
        while any(self.core.hub.seen(n) < seq for n, seq in wanted.items()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                item = self.core.hub.inbox.get(timeout=remaining)
            except queue.Empty:
                return
            if self.core.hub.inbox.is_event(item):  # a late reply or request is dropped
                self.core.hub.consume(item, self.on_event)
                if isinstance(item, LogLines):
                    deadline = time.monotonic() + LOG_DRAIN_S


class WorkerCall(Job[dict[str, Any]]):
    """A function run on chosen nodes' dask workers with ``client.run`` (no task slot taken):
    the doctor's probes, a node command. Done when every worker answered (their answers by
    worker address, an exception standing for a failed one); its completion reaches the loop
    through the inbox like a reply."""

    def __init__(
        self,
        core: GangCore,
        on_event: OnEvent | None,
        nodes: Sequence[int],
        fn: Callable[..., Any],
        *args: Any,
    ) -> None:
        super().__init__(core, on_event)
        self.workers = [core.addresses[n] for n in nodes]
        self.fn, self.args = fn, args
        self.answers: dict[str, Any] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="jupyter-mn-call")

    def start(self) -> None:
        future = self._pool.submit(
            self.core.nodes.client.run, self.fn, *self.args, workers=self.workers, on_error="return"
        )
        future.add_done_callback(lambda f: self.core.hub.inbox.put_reply(Message((self, f))))

    def done(self) -> bool:
        return self.answers is not None

    def take(self, item: Any) -> bool:
        if isinstance(item, Message) and isinstance(item.body, tuple) and item.body[0] is self:
            self.answers = item.body[1].result()
        elif self.core.hub.inbox.is_event(item):
            self.core.hub.consume(item, self.on_event)
        return False

    def settle(self) -> None:
        self._pool.shutdown(wait=False)

    def finish(self) -> dict[str, Any]:
        return self.answers or {}
