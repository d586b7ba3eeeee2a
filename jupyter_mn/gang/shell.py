"""``%cluster exec --node N -- CMD``: a shell command on chosen nodes, with its output and status.

The command runs through the node's dask worker (``client.run``, no task slot taken) in the
ranks' environment and working directory, in its own session, with a timeout; Ctrl-C in the
kernel stops it on every node. Its lines stream back as dask events on the gang's exec topic
while it runs (``pip install`` or ``nvidia-smi dmon`` are worth watching), labelled by node.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..node.workerfuncs import run_command, split_lines, stop_command
from ..wire.events import RunStarted
from .base import Gang
from .core import GangCore
from .inbox import Message
from .job import INTERRUPTED_BY_USER, WorkerCall

_TICK_S = 0.1
#: How long to wait for the scheduler to confirm the exec topic's subscription.
_SUBSCRIBE_S = 2.0
#: After the commands end, how long their last lines (dask events) may take to arrive; lines
#: still missing then are taken from the output the command's reply carries.
_LAST_LINES_S = 2.0


@dataclass(frozen=True)
class NodeOutput:
    node: int
    host: str
    exit_code: int | None
    output: str
    timed_out: bool = False
    error: str = ""
    #: why the command was stopped on request (Cancel, ``--max-runtime``); "" if it was not
    stopped: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error

    def status(self) -> str:
        """How the command ended, when that is not plain success ("" then)."""
        if self.error:
            return f"could not run: {self.error}"
        if self.timed_out:
            return "timed out: stopped"
        if self.stopped:
            return f"stopped: {self.stopped}"
        return f"exit code {self.exit_code}" if self.exit_code else ""


def check_nodes(nodes: Sequence[int], count: int) -> None:
    """Before anything runs: every requested node exists."""
    bad = [n for n in nodes if not 0 <= n < count]
    if bad or not nodes:
        raise SpecError(
            f"--node {', '.join(map(str, bad)) or '?'}: the gang has nodes 0..{count - 1}"
        )


def run_on_nodes(
    gang: Gang,
    command: str,
    nodes: Sequence[int],
    timeout: float,
    on_line: Callable[[int, str], None] = lambda node, line: None,
    flush: Callable[[], None] = lambda: None,
) -> list[NodeOutput]:
    """Run ``command`` on ``nodes`` at once, ``on_line(node, line)`` for each line as it comes
    and ``flush()`` once no more have arrived (on this thread); their outputs in node order.
    Ctrl-C stops every node's command, shows what it wrote until then, raises KeyboardInterrupt;
    a request (Cancel, ``--max-runtime``) stops them too, and each output says so."""
    if not command.strip():
        raise SpecError("%cluster exec needs a command after --, e.g. -- nvidia-smi")
    check_nodes(nodes, len(gang.core.addresses))
    job = _Exec(gang.core, command, nodes, timeout, on_line, flush)
    answers = gang.run(job)
    if job.reason == INTERRUPTED_BY_USER:
        raise KeyboardInterrupt
    results = []
    for node, address in zip(nodes, job.workers, strict=True):
        answer = answers.get(address)
        host = gang.core.hosts[node]
        if isinstance(answer, dict):
            answer.pop("lines")
            results.append(NodeOutput(node, host, **answer, stopped=job.reason))
        else:
            results.append(NodeOutput(node, host, None, "", error=repr(answer)))
    return results


class _Exec(WorkerCall):
    """The command on the nodes, its lines shown as they arrive (dask events on the gang's exec
    topic, put into the inbox as messages), stopped on every node when the run is stopped."""

    def __init__(
        self,
        core: GangCore,
        command: str,
        nodes: Sequence[int],
        timeout: float,
        on_line: Callable[[int, str], None],
        flush: Callable[[], None],
    ) -> None:
        self.token = uuid.uuid4().hex
        self.command = command
        cwd = core.provisioner.launch_options().get("cwd")
        env = dict(core.spec.env)
        args = (command, env, cwd, timeout, self.token, core.exec_topic)
        super().__init__(core, None, nodes, run_command, *args)
        self.lines = _Lines(dict(zip(self.workers, nodes, strict=True)), on_line, flush)
        self.tick_s = _TICK_S

    def what(self) -> RunStarted:
        return RunStarted(self.run_id, f"%cluster exec {self.command}")

    def start(self) -> None:
        token, inbox = self.token, self.core.hub.inbox
        probes: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()

        def receive(event: tuple[float, dict[str, Any]]) -> None:  # on the client's event loop
            msg = event[1]
            if msg.get("token") != token:
                return
            if "worker" in msg:
                inbox.put_reply(Message(msg))
            else:  # our own probe: the subscription is in place
                probes.put(msg)

        try:
            _subscribe(self.core.nodes.client, self.core.exec_topic, receive, token, probes)
            super().start()
        except BaseException:
            self._unsubscribe()
            raise

    def take(self, item: Any) -> bool:
        if isinstance(item, Message) and isinstance(item.body, dict):
            if item.body.get("token") == self.token:
                self.lines.show(item.body)
                if self.core.hub.inbox.empty():  # now, not at ipykernel's next flush (0.2 s)
                    self.lines.flush()
            return False
        return super().take(item)

    def stop(self, reason: str, by_user: bool, again: bool = False) -> None:
        if not self.reason:
            self.reason = reason
            client = self.core.nodes.client
            client.run(stop_command, self.token, workers=self.workers, on_error="ignore")

    def settle(self) -> None:
        try:
            self.lines.finish(self.finish(), self._late_lines)
        finally:
            self._unsubscribe()
            super().settle()

    def _late_lines(self, until: float) -> None:
        """Show the lines that arrive until ``until`` (monotonic), then return."""
        while (remaining := until - time.monotonic()) > 0:
            try:
                item = self.core.hub.inbox.get(timeout=min(remaining, _TICK_S))
            except queue.Empty:
                return
            self.take(item)
            if self.lines.complete():
                return

    def _unsubscribe(self) -> None:
        with contextlib.suppress(Exception):
            self.core.nodes.client.unsubscribe_topic(self.core.exec_topic)


def _subscribe(
    client: Any,
    topic: str,
    receive: Callable[[Any], None],
    token: str,
    arrived: queue.SimpleQueue[dict[str, Any]],
) -> None:
    """Subscribe to ``topic`` and wait (briefly) until the scheduler has the subscription: it
    travels on another connection than ``client.run``, and lines logged before it would be
    kept on the scheduler but never sent to us. Our own probe coming back proves it."""
    client.subscribe_topic(topic, receive)
    deadline = time.monotonic() + _SUBSCRIBE_S
    while time.monotonic() < deadline:
        client.log_event(topic, {"token": token})
        with contextlib.suppress(queue.Empty):
            arrived.get(timeout=_TICK_S / 4)
            return


class _Lines:
    """Commands' lines in the order each node wrote them, each shown once. Lines are numbered
    per node, so an event that never came leaves a known gap, filled from the reply's output."""

    def __init__(
        self,
        nodes: dict[str, int],
        on_line: Callable[[int, str], None],
        flush: Callable[[], None] = lambda: None,
    ) -> None:
        self.nodes = nodes
        self.on_line = on_line
        self.flush = flush
        #: per worker: the number of the last line shown, and the lines skipped before it
        self.shown = dict.fromkeys(nodes, 0)
        self.gaps: dict[str, list[range]] = {worker: [] for worker in nodes}
        #: per worker: how many lines its command wrote in all (known once it answered)
        self.total: dict[str, int] = {}

    def show(self, msg: dict[str, Any]) -> None:
        """Show the lines of one event."""
        worker = msg["worker"]
        if worker not in self.shown:
            return
        first = msg["upto"] - len(msg["lines"]) + 1
        if first > self.shown[worker] + 1:
            self.gaps[worker].append(range(self.shown[worker] + 1, first))
        for n, line in enumerate(msg["lines"], first):
            self.on_line(self.nodes[worker], line)
            self.shown[worker] = n

    def complete(self) -> bool:
        return all(self.shown[w] >= n for w, n in self.total.items())

    def finish(self, answers: dict[str, Any], wait: Callable[[float], None]) -> None:
        """``wait`` for the lines still on their way; any that do not come in time are taken
        from the replies."""
        self.total = {
            w: a["lines"] for w, a in answers.items() if isinstance(a, dict) and w in self.shown
        }
        if not self.complete():
            wait(time.monotonic() + _LAST_LINES_S)
        for worker, n in self.total.items():
            lines = split_lines(answers[worker]["output"])
            kept_from = n - len(lines) + 1  # the reply keeps only the output's last MiB
            for k in itertools.chain(*self.gaps[worker], range(self.shown[worker] + 1, n + 1)):
                if k >= kept_from:
                    self.on_line(self.nodes[worker], lines[k - kept_from])
            self.gaps[worker], self.shown[worker] = [], n
        self.flush()
