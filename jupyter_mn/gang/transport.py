"""``--require-rdma``: the gang fails, with NCCL's own line as evidence, when it would use TCP.

A gang of one node passes with a note: its ranks talk over P2P or shared memory, never a network.

Checked when the gang comes up (NCCL has chosen its network by then: the process group is
initialized eagerly) and after every cell (a new communicator may connect differently).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import TransportError
from ..wire.events import Note, TransportReport, from_msg
from .core import GangCore

_ASK_TIMEOUT_S = 30.0
ONE_NODE = (
    "--require-rdma: the gang has one node, so its ranks use no network and nothing can fall "
    "back to TCP (RDMA is checked once the gang spans nodes)"
)


def violation(reports: Iterable[TransportReport]) -> str | None:
    """Why these nodes do not use RDMA, with the line that shows it; None when they do."""
    for report in sorted(reports, key=lambda r: r.node):
        if report.one_node:
            continue  # no network to require
        where = f"node {report.node}"
        if report.backend == "gloo":
            return f"{where}: the ranks run gloo on CPU (RDMA needs CUDA ranks with NCCL)"
        if report.fallback:
            proof = next((line for line in report.evidence if "Socket" in line), "")
            why = f" ({'; '.join(report.reasons)})" if report.reasons else ""
            return f"{where}: NCCL uses TCP sockets{why}" + (f"\n  {proof}" if proof else "")
    return None


def require_rdma(core: GangCore) -> None:
    """Ask every node what NCCL chose (while the gang starts); raise ``TransportError`` on a
    socket fallback."""
    replies = core.nodes.ask_all(
        lambda node, agent: agent.transport(), _ASK_TIMEOUT_S, core.watcher
    )
    failed = next((r.error for r in replies if r.error is not None), None)
    if failed is not None:
        raise TransportError(f"--require-rdma: could not ask the nodes: {failed}")
    reports = [from_msg(r.value) for r in replies]
    for report in reports:
        core.notify(report)
    problem = violation(reports)
    if problem:
        raise TransportError(f"--require-rdma: {problem}")
    if core.spec.nodes == 1:
        core.notify(Note(ONE_NODE))
