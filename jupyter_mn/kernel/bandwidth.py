"""``%cluster bench``: all-reduce algbw and busbw across the gang, next to the expected link rate.

The formulas are nccl-tests' (PERFORMANCE.md): ``algbw = size / time`` and, for all-reduce,
``busbw = algbw × 2(n−1)/n``, which is comparable with the link's bandwidth whatever ``n`` is.
Scopes: all ranks; with several nodes of several GPUs also intra-node (every node at once, the
slowest shown) and inter-node (one rank per node). On CPU the numbers are gloo's, and say so.

A collective runs at its slowest link's pace without saying whose it is, so with several nodes
each node's link is measured too (one rank per node sends to the next, one pair at a time), and a
node whose link is under a third of the others' (a port at a lower speed, a bad cable) is named.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    from .cluster import Cluster

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"256M"`` → 268435456 bytes (binary multiples, as nccl-tests' ``-b``/``-e``)."""
    found = _SIZE.match(str(text))
    if not found:
        raise SpecError(f"--size {text!r}: expected a size like 256M, 1G or 4096")
    size = int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    if size < 4:
        raise SpecError(f"--size {text!r}: at least 4 bytes (one float32)")
    return size - size % 4


def algbw(size: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10⁹ bytes/s, as nccl-tests)."""
    return size / seconds / 1e9


def busbw(size: int, seconds: float, ranks: int) -> float:
    """All-reduce bus bandwidth in GB/s: ``algbw × 2(n−1)/n``."""
    return algbw(size, seconds) * 2 * (ranks - 1) / ranks


def human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


@dataclass
class BenchRow:
    scope: str
    ranks: int
    size: int
    seconds: float
    expected: float | None = None  # GB/s of the link this scope crosses, when known

    @property
    def algbw(self) -> float:
        return algbw(self.size, self.seconds)

    @property
    def busbw(self) -> float:
        return busbw(self.size, self.seconds, self.ranks)


ONE_RANK = (
    "nothing to measure: an all-reduce over one rank moves no data (the gang has one rank; "
    "bench a gang of 2 or more: --nodes/--gpus)"
)
#: A node whose link moved less than this share of the other nodes' (their median) is slow.
SLOW_SHARE = 1 / 3


@dataclass(frozen=True)
class NodeLink:
    """What one node's link moved: the better of its two transfers (in from the previous node,
    out to the next), so that only a node whose own link is slow looks slow."""

    node: int
    host: str
    rate: float  # GB/s


def node_links(hosts: list[str], size: int, seconds: list[float]) -> list[NodeLink]:
    """``seconds[k]``: the transfer of ``size`` bytes from node k to node k+1 (in a ring)."""
    rates = [algbw(size, t) if t > 0 else 0.0 for t in seconds]
    return [NodeLink(k, hosts[k], max(rates[k - 1], rates[k])) for k in range(len(rates))]


def slow_links(links: list[NodeLink]) -> list[tuple[NodeLink, float]]:
    """The nodes whose link is under ``SLOW_SHARE`` of the others' median, with that median.
    Two nodes share both transfers, so a slow one cannot be told from its peer: none."""
    if len(links) < 3:
        return []
    slow = []
    for link in links:
        others = statistics.median(o.rate for o in links if o is not link)
        if link.rate < others * SLOW_SHARE:
            slow.append((link, others))
    return slow


@dataclass
class BenchReport:
    device: str
    iters: int
    warmup: int
    rows: list[BenchRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    links: list[NodeLink] = field(default_factory=list)
    link_size: int = 0

    @property
    def slow(self) -> list[tuple[NodeLink, float]]:
        return slow_links(self.links)

    def __str__(self) -> str:
        if not (self.rows or self.links):
            return "\n".join(self.notes)
        head = ("scope", "ranks", "size", "time", "algbw GB/s", "busbw GB/s", "expected GB/s")
        table = [head] + [
            (
                r.scope,
                str(r.ranks),
                human(r.size),
                f"{r.seconds * 1e3:.3f} ms",
                f"{r.algbw:.3f}",
                f"{r.busbw:.3f}",
                f"{r.expected:g}" if r.expected else "—",
            )
            for r in self.rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines = [
            f"all-reduce on {self.device}: float32, mean of {self.iters} iterations after "
            f"{self.warmup} warm-up; algbw = size / time, busbw = algbw × 2(n−1)/n (nccl-tests)"
        ]
        for scope, *numbers in table:  # the scope left-aligned, the numbers right-aligned
            cells = [v.rjust(w) for v, w in zip(numbers, widths[1:], strict=True)]
            lines.append("  ".join([scope.ljust(widths[0]), *cells]))
        return "\n".join(lines + self._link_lines() + self.notes)

    def _link_lines(self) -> list[str]:
        if not self.links:
            return []
        lines = [
            f"each node's link (one rank per node sends {human(self.link_size)} to the next, one "
            "pair at a time): "
            + ", ".join(f"node {k.node} ({k.host}) {k.rate:.4g} GB/s" for k in self.links)
        ]
        for link, others in self.slow:
            lines.append(
                f"✘ node {link.node} ({link.host}) has a slow link: {link.rate:.4g} GB/s, the "
                f"other nodes' {others:.4g} GB/s (median)"
            )
        if len(self.links) == 2:
            lines.append(
                "(two nodes share both transfers: a slow link cannot be told from its peer)"
            )
        return lines

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def _scope_label(scope: str, groups: int, nnodes: int) -> str:
    if scope == "all ranks":
        return "all ranks" + (" (inter-node)" if nnodes > 1 else " (intra-node)")
    if scope == "intra-node":
        return f"intra-node (slowest of {groups} nodes)"
    return "inter-node (one rank per node)"


def link_rates(facts: list[dict[str, Any]]) -> float | None:
    """The inter-node rate a gang can expect (GB/s): its slowest node's usable RDMA ports
    together, else the speed of the interface it reaches the master by; None when unknown."""
    rates = []
    for f in facts:
        active = [p["rate_gbps"] or 0 for p in f["rdma"] if not p["problem"]]
        speeds = {i["name"]: i["speed_mbps"] for i in f["interfaces"]}
        nic = speeds.get((f.get("route") or {}).get("interface") or "", 0)
        rates.append(sum(active) / 8 if active else nic / 8000)
    return min(rates) if rates and min(rates) > 0 else None


def bench(
    cluster: Cluster, size: int, iters: int = 10, warmup: int = 2, on_event: Any = None
) -> BenchReport:
    """Measure all-reduce on ``cluster``'s gang (brought up if needed); a gang of one rank has
    nothing to measure and is not brought up."""
    from ..node.workerfuncs import link_facts

    if cluster.spec.world_size == 1:
        return BenchReport(device="one rank", iters=iters, warmup=warmup, notes=[ONE_RANK])

    gang = cluster.up(on_event)
    code = (
        "__import__('jupyter_mn.rank.allreduce', fromlist=['measure'])"
        f".measure({size}, {iters}, {warmup})"
    )
    rows = cluster.run(code, on_event=on_event).unwrap()
    core = gang.core
    facts = core.nodes.client.run(link_facts, core.master[0], workers=core.addresses)
    inter = link_rates([facts[a] for a in core.addresses])
    nnodes = core.spec.nodes
    report = BenchReport(device=core.device, iters=iters, warmup=warmup)
    for row in rows:
        if row["scope"] == "links":
            report.links = node_links(core.hosts, row["size"], row["seconds"])
            report.link_size = row["size"]
            continue
        crosses_nodes = row["scope"] == "inter-node" or (row["scope"] == "all ranks" and nnodes > 1)
        report.rows.append(
            BenchRow(
                _scope_label(row["scope"], row["groups"], nnodes),
                row["ranks"],
                row["size"],
                row["seconds"],
                inter if crosses_nodes else None,
            )
        )
    if "cuda" not in core.device:
        report.notes.append(
            "gloo on CPU: these numbers measure host memory copies and TCP (loopback when the "
            "gang is on one machine), not a GPU interconnect"
        )
    if nnodes > 1 and inter is None:
        report.notes.append("expected: unknown (no RDMA port ACTIVE, no link speed reported)")
    return report
