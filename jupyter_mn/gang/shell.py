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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..node.worker import run_command, split_lines, stop_command
from .base import Gang

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

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error

    def status(self) -> str:
        """How the command ended, when that is not plain success ("" then)."""
        if self.error:
            return f"could not run: {self.error}"
        if self.timed_out:
            return "timed out: stopped"
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
    Ctrl-C stops every node's command, shows what it wrote until then, raises KeyboardInterrupt."""
    if not command.strip():
        raise SpecError("%cluster exec needs a command after --, e.g. -- nvidia-smi")
    check_nodes(nodes, len(gang.addresses))
    token = uuid.uuid4().hex
    addresses = [gang.addresses[n] for n in nodes]
    cwd = gang.provisioner.launch_options().get("cwd")
    lines = _Lines(dict(zip(addresses, nodes, strict=True)), on_line, flush)

    def receive(event: tuple[float, dict[str, Any]]) -> None:  # on the client's event loop
        if event[1].get("token") == token:
            lines.arrived.put(event[1])

    interrupted = False
    try:
        _subscribe(gang.client, gang.exec_topic, receive, token, lines.arrived)
        with ThreadPoolExecutor(1, thread_name_prefix="jupyter-mn-exec") as pool:
            future: Future[dict[str, Any]] = pool.submit(
                gang.client.run,
                run_command,
                command,
                dict(gang.spec.env),
                cwd,
                timeout,
                token,
                gang.exec_topic,
                workers=addresses,
                on_error="return",
            )
            while not future.done():
                try:
                    lines.show(_TICK_S)
                except KeyboardInterrupt:
                    interrupted = True
                    gang.client.run(stop_command, token, workers=addresses, on_error="ignore")
            answers = future.result()
        lines.finish(answers)
    finally:
        with contextlib.suppress(Exception):
            gang.client.unsubscribe_topic(gang.exec_topic)
    if interrupted:
        raise KeyboardInterrupt
    results = []
    for node, address in zip(nodes, addresses, strict=True):
        answer = answers.get(address)
        host = gang.hosts[node]
        if isinstance(answer, dict):
            answer.pop("lines")
            results.append(NodeOutput(node, host, **answer))
        else:
            results.append(NodeOutput(node, host, None, "", error=repr(answer)))
    return results


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
        #: the dask events of this command, put there by the client's event loop
        self.arrived: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        #: per worker: the number of the last line shown, and the lines skipped before it
        self.shown = dict.fromkeys(nodes, 0)
        self.gaps: dict[str, list[range]] = {worker: [] for worker in nodes}

    def show(self, wait: float) -> None:
        """Show the lines of one event, waiting up to ``wait`` seconds for it."""
        try:
            msg = self.arrived.get(timeout=wait)
        except queue.Empty:
            return
        worker = msg.get("worker")
        if worker not in self.shown:  # a probe (_subscribe)
            return
        first = msg["upto"] - len(msg["lines"]) + 1
        if first > self.shown[worker] + 1:
            self.gaps[worker].append(range(self.shown[worker] + 1, first))
        for n, line in enumerate(msg["lines"], first):
            self.on_line(self.nodes[worker], line)
            self.shown[worker] = n
        if self.arrived.empty():  # show it now, not at ipykernel's next timed flush (0.2 s)
            self.flush()

    def finish(self, answers: dict[str, Any]) -> None:
        """The lines still on their way; any that do not come in time from the replies."""
        total = {
            w: a["lines"] for w, a in answers.items() if isinstance(a, dict) and w in self.shown
        }
        deadline = time.monotonic() + _LAST_LINES_S
        while any(self.shown[w] < n for w, n in total.items()) and time.monotonic() < deadline:
            self.show(_TICK_S)
        for worker, n in total.items():
            lines = split_lines(answers[worker]["output"])
            kept_from = n - len(lines) + 1  # the reply keeps only the output's last MiB
            for k in itertools.chain(*self.gaps[worker], range(self.shown[worker] + 1, n + 1)):
                if k >= kept_from:
                    self.on_line(self.nodes[worker], lines[k - kept_from])
            self.gaps[worker], self.shown[worker] = [], n
        self.flush()
