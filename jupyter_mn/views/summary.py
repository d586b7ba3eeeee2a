"""A cell's gang as plain text: the text view's final table and the widget's ``text/plain``.

Saved notebooks and papermill outputs keep only this text (widgets need a live kernel), so it
says everything the widget shows: state, per-node log tail, GPUs, transport with NCCL's evidence
line, the per-rank table and straggler hints.
"""

from __future__ import annotations

from ..model import usage
from ..wire.events import CellDone, GpuSample, TransportReport, number_ranges
from ..wire.plural import counted
from .cellstate import CellState
from .stacktext import format_stacks
from .straggler import hints

MAX_TABLE_RANKS = 32
#: A wait this long before a cell ran (the gang starting) is said beside the cell's time.
START_SHOWN_S = 1.0


NO_GPU = "no GPU"


def header(state: CellState) -> str:
    """``train · RUNNING · 2×2 local · 3.1 s``; once the cell ended, its outcome in the state's
    place, its time on the ranks (what the panel and ``jupyter mn list`` say of it) with the wait
    for the gang before it, the gang's state after it and the GPU-hours of the cell and of the
    gang so far: ``train · FAILED · 2×2 local · 3.1 s (+4.2 s start) · gang READY · 0.03
    GPU-hours (gang 0.12)``. A gang with no GPU anywhere says so once, here: ``2×2 local · no
    GPU``."""
    done = state.done
    word = state.label if done is None else done.outcome
    where = f"{state.shape} {state.backend}" + (f" · {NO_GPU}" if cpu_only(state) else "")
    if done is None:
        return f"{state.title} · {word} · {where} · {state.elapsed:.1f} s"
    wait = state.elapsed - done.elapsed
    took = f"{done.elapsed:.1f} s" + (f" (+{wait:.1f} s start)" if wait >= START_SHOWN_S else "")
    text = f"{state.title} · {word} · {where} · {took} · gang {state.label}"
    if not done.gang_hours:  # nodes claimed for one job, or a gang that never got its nodes
        return text
    return f"{text} · {usage.text(done.hours, done.unit)} (gang {usage.number(done.gang_hours)})"


def gpu_note(sample: GpuSample) -> str:
    """A node's lack of GPUs in plain words: NVML's reason (its library not found, no driver)
    says nothing more to a user than ``no GPU``; a missing nvidia-ml-py hides GPUs that may be
    there."""
    if "nvidia-ml-py" in sample.note:
        return "GPUs not sampled (nvidia-ml-py is not installed)"
    return NO_GPU


def cpu_only(state: CellState) -> bool:
    """Every node has said it has no GPU: the header says it, no GPU panel or line does."""
    samples = state.gpus.values()
    return bool(samples) and all(not s.gpus and gpu_note(s) == NO_GPU for s in samples)


def gpu_lines(state: CellState) -> list[str]:
    """Per GPU a line; nodes without one share a line per reason (none if no node has one)."""
    out, none = [], {}
    if cpu_only(state):
        return out
    for node in sorted(state.gpus):
        sample = state.gpus[node]
        if not sample.gpus:
            none.setdefault(gpu_note(sample), []).append(node)
        for g in sample.gpus:
            peak_util, peak_mem = state.peaks.get((node, g.index), (g.util, g.mem_used))
            extras = [f"{g.power_w:.0f} W" if g.power_w is not None else ""]
            extras.append(f"{g.temp_c}°C" if g.temp_c is not None else "")
            ranks = ",".join(str(r) for r in g.ranks) or "-"
            out.append(
                f"node {node} GPU {g.index} ({g.name}): {g.util}% (peak {peak_util}%), "
                f"{g.mem_used / 1024:.1f}/{g.mem_total / 1024:.1f} GiB (peak "
                f"{peak_mem / 1024:.1f}) {' '.join(e for e in extras if e)} · ranks {ranks}"
            )
    return out + [f"{nodes_label(nodes)}: {note}" for note, nodes in none.items()]


def nodes_label(nodes: list[int]) -> str:
    """``node 3``, ``nodes 0-2,5``."""
    return ("node " if len(nodes) == 1 else "nodes ") + number_ranges(nodes)


def transport_line(report: TransportReport) -> str:
    text = report.summary
    if report.inter_node:
        text += " · GPUDirect RDMA" if report.gdr else " · no GPUDirect"
    return text


def evidence(report: TransportReport) -> str:
    """The NCCL line that proves the inter-node path (else, on one node, that NCCL sees one
    node; else the network NCCL chose)."""
    wanted = [f"via {'/'.join(p.split('/')[:2])}" for p in report.inter_node[:1]]
    if report.one_node:
        wanted.append("nNodes 1 ")
    wanted.append(f"Using network {report.network}" if report.network else "Using network")
    for needle in wanted:
        line = next((e for e in report.evidence if needle in e), "")
        if line:
            return line
    return report.evidence[0] if report.evidence else ""


def transport_lines(state: CellState) -> list[str]:
    out = []
    for node in sorted(state.transport):
        report = state.transport[node]
        out.append(f"node {node}: {transport_line(report)}")
        if state.alarm(node):
            why = "ranks run gloo on CPU" if report.backend == "gloo" else "NCCL uses TCP sockets"
            out.append(f"  WARNING: --rdma was asked for but {why}")
        proof = evidence(report)
        if proof:
            out.append(f"  evidence: {proof}")
        out += [f"  rdma: {hca}" for hca in report.hcas]
    return out


def rank_table(done: CellDone) -> list[str]:
    rows = [" rank  node  status       cell s  last collective             entered s  waited s"]
    for t in done.ranks[:MAX_TABLE_RANKS]:
        rows.append(
            f"{t.rank:5d} {t.node:5d}  {t.status:<11} {_s(t.cell_s)}  {t.collective or '-':<26}"
            f" {_s(t.entered_s)} {_s(t.waited_s)}"
        )
    if len(done.ranks) > MAX_TABLE_RANKS:
        rows.append(f"  … {len(done.ranks) - MAX_TABLE_RANKS} more ranks")
    return rows


def _s(value: float | None) -> str:
    return f"{value:8.2f}" if value is not None else "       -"


def final(state: CellState) -> list[str]:
    """The end-of-cell table: GPUs, transport, per-rank times, straggler hints."""
    lines = gpu_lines(state) + transport_lines(state)
    if state.done is not None:
        lines += rank_table(state.done) + hints(state.done.ranks)
    return lines


def summary(state: CellState, tail: int = 3) -> str:
    """Everything in a few dozen lines (the widget's ``text/plain``): each rank's last lines."""
    with state.lock:
        lines = [f"jupyter_mn: {header(state)}"]
        for node, log in sorted(state.logs.items()):
            if not log.shown:
                continue
            lines.append(f"node {node}: {counted(log.shown, 'line')}, last:")
            for rank in sorted(log.ranks):
                lines += [f"  [rank {rank}] {entry[3]}" for entry in list(log.ranks[rank])[-tail:]]
        stacks = [format_stacks(state.stacks)] if state.stacks is not None else []
        return "\n".join(lines + state.notices + stacks + final(state))
