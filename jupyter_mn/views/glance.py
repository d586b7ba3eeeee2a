"""The widget's GPU and transport panels, drawn to be read at a glance.

GPUs: per node, a utilization bar with the last minute as a sparkline and a memory bar (used of
total). Transport: a badge per path NCCL uses, green for RDMA, red for a TCP socket fallback, grey
for gloo on CPU; nodes that look the same share one row, so a large gang stays a few lines. The
text view and the widget's ``text/plain`` keep the full lines (``summary.py``); this is HTML only.
Every value that comes from a node is escaped: the panels are text in the page, never markup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass

from ..wire.events import NO_NETWORK, GpuStat, TransportReport
from .cellstate import HISTORY, CellState
from .summary import cpu_only, evidence, gpu_note, nodes_label, transport_line

#: Sparkline size in CSS pixels: two pixels per sample, utilization 0–100 % over 18 pixels.
SPARK_W, SPARK_H = 2 * (HISTORY - 1), 20

GLANCE_STYLE = """<style>
.jp-mn-panels { display: flex; flex-wrap: wrap; gap: 4px 24px; font-size: 12px; }
.jp-mn-gpu { max-height: 16em; overflow-y: auto; }
.jp-mn-gpunode { display: flex; gap: 8px; align-items: flex-start; margin: 2px 0; }
.jp-mn-nodename { color: var(--jp-ui-font-color2, #555); white-space: nowrap; }
.jp-mn-nogpu { margin: 2px 0; }
.jp-mn-gpurow { display: flex; gap: 6px; align-items: center; height: 22px; }
.jp-mn-bar { position: relative; display: inline-flex; align-items: center; width: 6em;
  height: 16px; background: #e8eaed; border-radius: 3px; overflow: hidden; }
.jp-mn-bar.jp-mn-mem { width: 9em; }
.jp-mn-bar > i { position: absolute; left: 0; top: 0; bottom: 0; background: #8ab4f8; }
.jp-mn-bar.jp-mn-mem > i { background: #d7aefb; }
.jp-mn-bar > span { position: relative; padding-left: 4px; font-size: 11px; color: #202124; }
.jp-mn-spark { background: var(--jp-layout-color2, #f1f3f4); border-radius: 2px; }
.jp-mn-spark polyline { fill: none; stroke: #1a73e8; stroke-width: 1.5; }
.jp-mn-gpuextra { color: var(--jp-ui-font-color2, #666); font-size: 11px; white-space: nowrap; }
.jp-mn-trow { margin: 2px 0; }
.jp-mn-badge { display: inline-block; padding: 0 6px; margin-right: 4px; border-radius: 9px;
  border: 1px solid; font-size: 11px; line-height: 16px; }
.jp-mn-good { background: #e6f4ea; color: #137333; border-color: #81c995; }
.jp-mn-neutral { background: #e8f0fe; color: #1967d2; border-color: #aecbfa; }
.jp-mn-bad { background: #fce8e6; color: #c5221f; border-color: #f28b82; font-weight: bold; }
.jp-mn-off { background: #f1f3f4; color: #5f6368; border-color: #dadce0; }
</style>"""


@dataclass(frozen=True)
class Badge:
    """One transport fact: ``tone`` is good (RDMA, GPU peer-to-peer), neutral, bad (TCP sockets
    where RDMA was possible or asked for) or off (gloo on CPU, nothing known yet)."""

    text: str
    tone: str
    title: str = ""

    @property
    def html(self) -> str:
        title = f' title="{html.escape(self.title)}"' if self.title else ""
        return f'<span class="jp-mn-badge jp-mn-{self.tone}"{title}>{html.escape(self.text)}</span>'


#: NCCL network plugins that move data by RDMA ("NET/IB" also carries RoCE).
RDMA_NETS = {"IB": "IB", "AWS Libfabric": "EFA"}


def transport_badges(report: TransportReport) -> list[Badge]:
    """The badges for a node's report, inter-node paths first, without repeats."""
    if report.backend == "gloo":
        return [Badge("gloo (CPU)", "off", "the ranks have no GPU: gloo over TCP on CPU")]
    if not (report.network or report.inter_node or report.intra_node or report.one_node):
        return [Badge("NCCL: no transport lines yet", "off")]
    badges = [_net_badge(path, report) for path in report.inter_node]
    if report.one_node and not report.inter_node:
        badges.append(Badge(NO_NETWORK, "off", "every rank is on this node: no network is used"))
    if report.gdr:
        badges.append(Badge("GPUDirect", "good", "GPUDirect RDMA: the NIC reads GPU memory"))
    if not report.inter_node and report.network:
        # NCCL chose a network, no path across nodes uses it yet (one node, or still setting up)
        socket = report.network == "Socket"
        tone = "bad" if report.fallback else "off" if socket else "neutral"
        badges.append(Badge(f"net {report.network}", tone, "; ".join(report.reasons)))
    badges += [_local_badge(path) for path in report.intra_node]
    if report.nvls and "NVLS" not in report.intra_node:
        badges.append(_local_badge("NVLS"))
    return list(dict.fromkeys(badges))


def _net_badge(path: str, report: TransportReport) -> Badge:
    plugin = path.split("/")[1] if path.startswith("NET/") else path
    if plugin == "Socket":
        why = "; ".join(report.reasons) or "NCCL sends over TCP sockets between nodes"
        return Badge("TCP socket", "bad", f"{path}: {why}")
    if plugin in RDMA_NETS:
        network = report.network if report.network in ("IB", "RoCE", "EFA") else RDMA_NETS[plugin]
        return Badge(f"RDMA {network}", "good", path)
    return Badge(report.network or plugin, "neutral", path)


def _local_badge(path: str) -> Badge:
    kind = path.split("/")[0]
    if kind == "NVLS":
        return Badge("NVLink SHARP", "good", "NVLS: reductions in the NVSwitch")
    if kind == "P2P":
        return Badge(path, "good", "GPU peer-to-peer within the node (NVLink or PCIe)")
    if kind == "SHM":
        return Badge(path, "neutral", "through host shared memory within the node")
    return Badge(path, "neutral")


def transport_html(state: CellState) -> str:
    """One row per group of nodes with the same badges: badges, the alarm, NCCL's proof line."""
    groups: dict[tuple[tuple[Badge, ...], str], list[int]] = {}
    for node in sorted(state.transport):
        report = state.transport[node]
        alarm = ""
        if state.alarm(node):
            why = "ranks run gloo on CPU" if report.backend == "gloo" else "NCCL uses TCP sockets"
            alarm = f"⚠ --rdma was asked for, but {why}"
        groups.setdefault((tuple(transport_badges(report)), alarm), []).append(node)
    rows = []
    for (badges, alarm), nodes in groups.items():
        report = state.transport[nodes[0]]
        text = _nodes(nodes) + ": " + "".join(b.html for b in badges)
        if alarm:
            text += f'<div class="jp-mn-alarm">{html.escape(alarm)}</div>'
        proof = evidence(report)
        if proof:
            text += f'<div class="jp-mn-evidence">{html.escape(proof)}</div>'
        title = html.escape(transport_line(report) + "".join(f"\nrdma: {h}" for h in report.hcas))
        rows.append(f'<div class="jp-mn-trow" title="{title}">{text}</div>')
    if not rows or (cpu_only(state) and not any(alarm for _, alarm in groups)):
        return ""  # nothing known yet, or gloo on CPU, which the header's "no GPU" says
    return f'<div class="jp-mn-transport"><b>Transport</b>{"".join(rows)}</div>'


def _nodes(nodes: list[int]) -> str:
    return f'<span class="jp-mn-nodename">{nodes_label(nodes)}</span>'


def sparkline(values: Iterable[int]) -> str:
    """The last ``HISTORY`` utilization samples as an SVG line, newest at the right edge."""
    values = list(values)[-HISTORY:]
    right = SPARK_W - 2 * (len(values) - 1)
    points = " ".join(
        f"{right + 2 * i},{SPARK_H - 1 - round(v * (SPARK_H - 2) / 100)}"
        for i, v in enumerate(values)
    )
    return (
        f'<svg class="jp-mn-spark" width="{SPARK_W}" height="{SPARK_H}">'
        f'<polyline points="{points}"/></svg>'
    )


def bar(fraction: float, label: str, kind: str) -> str:
    """A horizontal bar filled to ``fraction`` (clamped to 0–1) with its label on it."""
    width = round(100 * min(max(fraction, 0.0), 1.0), 1)
    return (
        f'<span class="jp-mn-bar jp-mn-{kind}"><i style="width:{width:g}%"></i>'
        f"<span>{html.escape(label)}</span></span>"
    )


def gpu_row(state: CellState, node: int, g: GpuStat) -> str:
    """One GPU: utilization bar and sparkline, memory bar; peaks, power and ranks as a tooltip."""
    peak_util, peak_mem = state.peaks.get((node, g.index), (g.util, g.mem_used))
    extras = [f"{g.power_w:.0f} W" if g.power_w is not None else ""]
    extras.append(f"{g.temp_c}°C" if g.temp_c is not None else "")
    extras.append("ranks " + (",".join(str(r) for r in g.ranks) or "-"))
    title = f"{g.name} · peak {peak_util}%, {peak_mem / 1024:.1f} GiB"
    history = state.history.get((node, g.index), [g.util])
    return (
        f'<div class="jp-mn-gpurow" title="{html.escape(title)}">'
        f'<span class="jp-mn-gpuname">GPU {g.index}</span>'
        + bar(g.util / 100, f"{g.util}%", "util")
        + sparkline(history)
        + bar(
            g.mem_used / g.mem_total if g.mem_total else 0.0,
            f"{g.mem_used / 1024:.1f}/{g.mem_total / 1024:.1f} GiB",
            "mem",
        )
        + f'<span class="jp-mn-gpuextra">{html.escape(" ".join(e for e in extras if e))}</span>'
        + "</div>"
    )


def gpu_html(state: CellState) -> str:
    """Per node its GPUs' rows; nodes without a GPU share one line per reason. Nothing before
    the first sample, nor where no node has a GPU (the header says so)."""
    rows, none = [], {}
    if cpu_only(state):
        return ""
    for node in sorted(state.gpus):
        sample = state.gpus[node]
        if not sample.gpus:
            none.setdefault((gpu_note(sample), sample.note), []).append(node)
            continue
        gpus = "".join(gpu_row(state, node, g) for g in sample.gpus)
        rows.append(f'<div class="jp-mn-gpunode">{_nodes([node])}<div>{gpus}</div></div>')
    for (note, why), nodes in none.items():
        title = html.escape(why)  # NVML's own words, for whoever wants them
        rows.append(
            f'<div class="jp-mn-nogpu" title="{title}">{_nodes(nodes)}: {html.escape(note)}</div>'
        )
    if not rows:
        return ""
    return f'<div class="jp-mn-gpu"><b>GPUs</b>{"".join(rows)}</div>'
