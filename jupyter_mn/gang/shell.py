"""``%cluster exec --node N -- CMD``: a shell command on chosen nodes, with its output and status.

The command runs through the node's dask worker (``client.run``, no task slot taken) in the
ranks' environment and working directory, in its own session, with a timeout; Ctrl-C in the
kernel stops it on every node.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import SpecError
from ..rank.worker import run_command, stop_command
from .base import Gang


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

    def lines(self) -> list[str]:
        """The output labelled ``[node N] …``, then the status when it is not success."""
        prefix = f"[node {self.node}] "
        out = [prefix + line for line in self.output.splitlines()]
        if self.error:
            out.append(f"{prefix}could not run: {self.error}")
        elif self.timed_out:
            out.append(f"{prefix}timed out: stopped")
        elif self.exit_code:
            out.append(f"{prefix}exit code {self.exit_code}")
        return out


def check_nodes(nodes: Sequence[int], count: int) -> None:
    """Before anything runs: every requested node exists."""
    bad = [n for n in nodes if not 0 <= n < count]
    if bad or not nodes:
        raise SpecError(
            f"--node {', '.join(map(str, bad)) or '?'}: the gang has nodes 0..{count - 1}"
        )


def run_on_nodes(
    gang: Gang, command: str, nodes: Sequence[int], timeout: float
) -> list[NodeOutput]:
    """Run ``command`` on ``nodes`` at once; their outputs in node order."""
    if not command.strip():
        raise SpecError("%cluster exec needs a command after --, e.g. -- nvidia-smi")
    check_nodes(nodes, len(gang.addresses))
    token = uuid.uuid4().hex
    addresses = [gang.addresses[n] for n in nodes]
    cwd = gang.provisioner.launch_options().get("cwd")
    try:
        answers = gang.client.run(
            run_command,
            command,
            dict(gang.spec.env),
            cwd,
            timeout,
            token,
            workers=addresses,
            on_error="return",
        )
    except KeyboardInterrupt:
        gang.client.run(stop_command, token, workers=addresses, on_error="ignore")
        raise
    results = []
    for node, address in zip(nodes, addresses, strict=True):
        answer = answers.get(address)
        host = gang.hosts[node]
        if isinstance(answer, dict):
            results.append(NodeOutput(node, host, **answer))
        else:
            results.append(NodeOutput(node, host, None, "", error=repr(answer)))
    return results
