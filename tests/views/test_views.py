"""Views from events: the text table, the widget's parts and its text/plain, straggler hints."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.node.nccllog import NcclLog
from jupyter_mn.views import TextView, View, make_view, widgets_rendered
from jupyter_mn.views.cellstate import TAIL_LINES
from jupyter_mn.views.straggler import hints
from jupyter_mn.views.summary import summary
from jupyter_mn.views.widget import CANCEL_ESM, ClusterWidget
from jupyter_mn.wire.events import (
    CellDone,
    CellOutcome,
    GangState,
    GangStatus,
    GpuSample,
    GpuStat,
    Hung,
    LogLines,
    NodesWaiting,
    Note,
    PreemptCause,
    Preemption,
    RankPaused,
    RankResumed,
    RankTiming,
    Stacks,
    TransportReport,
)
from jupyter_mn.wire.rankwhere import Collective, RankWhere
from tests.node.test_nccl import FIXTURES

SPEC = ClusterSpec(nodes=2, gpus=2)


def timing(rank: int, cell: float, entered: float | None = None, waited: float | None = None):
    return RankTiming(
        rank, rank // 2, "ok", cell, "nccl:all_reduce" if entered else "", entered, waited
    )


def test_late_arrival_at_the_last_collective_is_the_straggler():
    late = (
        timing(0, 2.0, 0.5, 1.5),
        timing(1, 2.0, 0.5, 1.5),
        timing(2, 2.0, 0.6, 1.4),
        timing(3, 2.0, 2.0, 0.0),
    )
    assert hints(late) == [
        "straggler: rank 3 (node 1) reached nccl:all_reduce after 2.00 s, the median rank "
        "after 0.55 s; the others waited up to 1.50 s"
    ]


def test_slow_cell_without_collectives_and_no_hint_for_noise():
    slow = (timing(0, 0.3), timing(1, 0.3), timing(2, 0.3), timing(3, 1.2))
    assert hints(slow) == [
        "straggler: rank 3 (node 1) ran the cell for 1.20 s, the median rank for 0.30 s"
    ]
    tiny = (timing(0, 0.001), timing(1, 0.001), timing(2, 0.001), timing(3, 0.01))  # 10×, 9 ms
    assert hints(tiny) == []
    assert hints((timing(0, 5.0),)) == []


def test_a_failed_rank_is_never_the_straggler():
    """The rank that raised ran its cell longer than the ones it broke; that is no slowness."""
    failed = (
        RankTiming(0, 0, "ok", 0.0),
        RankTiming(1, 0, "ok", 0.0),
        RankTiming(2, 1, "error", 0.08),
        RankTiming(3, 1, "interrupted", 0.0),
    )
    assert hints(failed) == []
    late = (*(timing(r, 2.0, 0.5, 1.5) for r in range(3)), RankTiming(3, 1, "lost", 2.0, "x", 4.0))
    assert hints(late) == []


def events() -> list:
    nvlink = NcclLog().feed_all((FIXTURES / "socket_fallback.log").read_text().splitlines())
    return [
        GangState("RUNNING"),
        LogLines(
            0, 1, ((0, "out", tuple(f"line {i}" for i in range(500))), (1, "err", ("oops <b>",)))
        ),
        LogLines(1, 1, ((2, "out", ("hello from 2",)),)),
        GpuSample(0, (GpuStat(0, "NVIDIA H100", 87, 40960, 81920, 301.5, 61, (0,)),)),
        GpuSample(1, (), "no GPU (NVML Shared Library Not Found)"),
        TransportReport(0, backend="gloo"),
        nvlink.report(node=1),
        GangState("READY"),
        CellDone(
            3,
            2.5,
            (
                timing(0, 2.0, 0.2, 1.8),
                timing(1, 2.0, 0.2, 1.8),
                timing(2, 2.0, 0.2, 1.8),
                timing(3, 2.0, 2.0, 0.0),
            ),
        ),
    ]


def test_text_view_prints_lines_as_they_come_and_a_table_at_the_end():
    out, err = io.StringIO(), io.StringIO()
    view = TextView(out, err, spec=SPEC.replace(rdma=True), title="train")
    for event in events():
        view(event)
    text = out.getvalue()
    assert "[node 0 rank 0] line 499" in text and "[node 0 rank 1] oops <b>" in err.getvalue()
    table = text[text.index("jupyter_mn: train · DONE") :]
    assert "node 0 GPU 0 (NVIDIA H100): 87% (peak 87%), 40.0/80.0 GiB" in table
    assert "node 1: no GPU\n" in table  # plainly: NVML's reason is jargon here
    assert "node 0: gloo (CPU)" in table and "node 1: inter-node NET/Socket" in table
    proof = "ws-1:1697708:1698247 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0"
    assert f"evidence: {proof}" in table
    assert "straggler: rank 3 (node 1)" in table
    assert "    3     1  ok" in table  # the per-rank row
    warnings = err.getvalue()  # --rdma asked for, sockets used: said at once, on stderr
    assert "WARNING node 1: --rdma was asked for but NCCL uses TCP sockets" in warnings


def test_widget_parts_and_its_text_plain_carry_the_same_facts():
    widget = ClusterWidget(SPEC.replace(rdma=True), title="train")
    for event in events():
        widget.state.apply(event)
    widget._draw(widget.state.take_dirty())
    node0 = widget._logs[0].value
    assert "[rank 0] line 499" in node0 and "[rank 0] line 0\n" not in node0  # bounded tail
    assert f"last {TAIL_LINES + 1} of 501 lines" in node0  # rank 1's line kept beside rank 0's
    assert "node 1 · 1 line</div>" in widget._logs[1].value  # one line, said as one
    assert "oops &lt;b&gt;" in node0 and "<b>" not in node0.split("<pre")[1]  # text, not HTML
    assert "READY" in widget._header.value
    assert "no GPU" in widget._gpu.value and "87%" in widget._gpu.value
    assert "gloo (CPU)" in widget._transport.value
    assert 'class="jp-mn-alarm"' in widget._transport.value  # red: --rdma but sockets
    assert "straggler: rank 3" in widget._notes.value
    plain = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in plain
    text = plain["text/plain"]
    assert text == summary(widget.state)
    assert "[rank 0] line 499" in text and "node 1: inter-node NET/Socket" in text
    assert "node 1: 1 line, last:" in text


def test_an_ended_cell_folds_into_one_plain_output_and_leaves_no_widget_model(monkeypatch):
    """A thousand cells of 39 models each stayed alive before: now the root alone stays (for a
    page reloaded while the cell ran) and holds the folded view as data, which is also the output
    that replaces the widget: every node's lines, the panels and the table."""
    from ipywidgets.widgets import widget as ipywidget

    from jupyter_mn.views import widget as module

    shown: list = []
    monkeypatch.setattr(module, "display", lambda obj, **kw: _Handle(shown, obj))
    ClusterWidget(SPEC, title="warm").close()  # the roots' shared layout exists from here on
    before = len(ipywidget._instances)
    widget = ClusterWidget(SPEC, title="train")
    assert len(ipywidget._instances) - before == 34  # live: its widgets, layouts and styles
    for event in events():
        widget(event)
    widget.close()
    assert len(ipywidget._instances) - before == 1  # the root
    assert widget.root.model_id in ipywidget._instances
    (output,) = widget.root.outputs
    assert output["data"] == widget.final_bundle()
    assert shown[-1] == widget.final_bundle()
    folded = shown[-1]["text/html"]
    assert "[rank 0] line 499" in folded and "[rank 2]" in folded  # node 1's lines too
    assert "jp-mn-state" in folded and "gloo (CPU)" in folded and "straggler: rank 3" in folded
    assert "application/vnd.jupyter.widget-view+json" not in widget._repr_mimebundle_()
    assert shown[-1]["text/plain"] == summary(widget.state)


class _Handle:
    """What ``display(obj, display_id=True)`` returns: updates go to ``shown``, as bundles."""

    def __init__(self, shown: list, obj: object) -> None:
        self.shown = shown
        self.update(obj)

    def update(self, obj: object) -> None:
        bundle = getattr(obj, "_repr_mimebundle_", None)
        self.shown.append(bundle() if bundle else obj)


def test_both_views_count_down_a_preemption_until_the_cell_is_done():
    notice = Preemption(2, PreemptCause.SLURM, time.time() + 94.4)
    out, err = io.StringIO(), io.StringIO()
    text_view = TextView(out, err, spec=SPEC, title="train")
    widget = ClusterWidget(SPEC, title="train")
    for event in (GangState("RUNNING"), notice, LogLines(0, 1, ((0, "out", ("step 9",)),))):
        text_view(event)
        widget.state.apply(event)
    assert err.getvalue() == (
        "jupyter_mn: PREEMPTING node 2 (94 s left): Slurm sent SIGTERM (preemption, requeue or "
        "time limit); checkpoint.preempted() returns True on every rank from its next call\n"
    )
    widget._draw(widget.state.take_dirty())
    assert ">PREEMPTING node 2 (94 s left)</b>" in widget._header.value
    assert "train · PREEMPTING node 2 (94 s left) · 2×2" in summary(widget.state)
    widget.state.apply(CellDone(1, 3.0, outcome=CellOutcome.PREEMPTED))
    text = summary(widget.state)  # the cell's outcome, then the gang's state
    assert "train · PREEMPTED · 2×2" in text and "s · gang RUNNING" in text


@pytest.mark.parametrize(
    ("outcome", "color"),
    [
        (CellOutcome.DONE, "#188038"),
        (CellOutcome.FAILED, "#d93025"),
        (CellOutcome.LOST, "#d93025"),
        (CellOutcome.HUNG, "#d93025"),
        (CellOutcome.INTERRUPTED, "#e37400"),
    ],
)
def test_a_finished_cell_says_its_outcome_in_its_colour_and_the_gang_apart(outcome, color):
    widget = ClusterWidget(SPEC, title="train")
    widget.state.apply(GangState("READY"))
    widget.state.apply(CellDone(4, 2.0, outcome=outcome))
    widget._draw(widget.state.take_dirty())
    assert f'<b style="color:{color}" class="jp-mn-state">{outcome}</b>' in widget._header.value
    assert f"train · {outcome} · 2×2" in summary(widget.state).splitlines()[0]
    assert summary(widget.state).splitlines()[0].endswith("s · gang READY")


def test_auto_view_is_text_without_a_widget_frontend():
    assert not widgets_rendered()
    assert isinstance(make_view(SPEC), TextView)
    assert isinstance(make_view(SPEC.replace(view="widget")), ClusterWidget)


def test_text_view_prints_the_table_only_when_it_says_something():
    """A warm trivial cell ends quietly; a cold start, a failure or a long cell gets the table."""
    from jupyter_mn.views.cellstate import TABLE_AFTER_S
    from jupyter_mn.views.text import TextView
    from jupyter_mn.wire.events import CellDone, GangState, RankTiming

    ok = (RankTiming(0, 0, "ok", 0.01), RankTiming(1, 0, "ok", 0.01))

    def shown(*events) -> str:
        out = io.StringIO()
        view = TextView(out, io.StringIO(), spec=ClusterSpec(nodes=1, gpus=2))
        for event in events:
            view(event)
        return out.getvalue()

    assert shown(CellDone(1, 0.02, ok)) == ""
    assert " rank  node  status" in shown(GangState("READY", "cpu (gloo)"), CellDone(1, 3, ok))
    failed = CellDone(1, 0.02, ok, "rank 1: boom", outcome=CellOutcome.FAILED)
    assert " rank  node  status" in shown(failed)
    assert " rank  node  status" in shown(CellDone(1, TABLE_AFTER_S, ok))


def test_text_view_prints_a_line_written_in_pieces_once_and_a_standing_bar_now_and_then(
    monkeypatch,
):
    """A line whose first piece arrived alone (the agent sent it as unfinished) is printed once,
    finished; a line unfinished for ``PARTIAL_AFTER_S`` is a bar, printed every
    ``PARTIAL_EVERY_S``."""
    from jupyter_mn.views import text

    clock = [100.0]
    monkeypatch.setattr(text.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    view = text.TextView(out, io.StringIO(), spec=ClusterSpec(nodes=1, gpus=1))
    view(LogLines(0, 1, (), ((0, "out", "line"),)))
    clock[0] += 0.01
    view(LogLines(0, 2, ((0, "out", ("line 6",)),)))
    assert out.getvalue() == "[node 0 rank 0] line 6\n"

    bar = "[node 0 rank 0] {}%|\n".format
    for step, pct in enumerate((10, 20, 30, 40, 50, 60)):
        view(LogLines(0, 3 + step, (), ((0, "out", f"{pct}%|"),)))
        clock[0] += 0.5 if step == 0 else text.PARTIAL_EVERY_S / 2
    view(LogLines(0, 9, ((0, "out", ("100%|",)),)))
    # each event first prints the held state when due: 20 % at 3 s, 40 % at 8 s, 60 % at 13 s
    assert out.getvalue() == "[node 0 rank 0] line 6\n" + bar(20) + bar(40) + bar(60) + bar(100)


def test_the_widget_header_follows_a_background_re_form_to_ready():
    """A rank dies: the cell fails while its node restarts; the header then turns READY."""
    from jupyter_mn import Cluster
    from tests.support.polling import wait_until

    with Cluster(nodes=1, gpus=2) as cluster:
        widget = ClusterWidget(ClusterSpec(nodes=1, gpus=2), title="crash")
        kill = "import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), 9)\n"
        result = cluster.run(kill + "dist.barrier()", on_event=widget)
        widget.close()
        assert not result.ok and widget.state.state == "RENDEZVOUS"
        widget.follow(cluster.gang)
        wait_until(lambda: "READY" in widget._header.value, 60, "the header to say READY")
        assert '<b style="color:#d93025" class="jp-mn-state">LOST</b>' in widget._header.value
        assert "READY" in widget._repr_mimebundle_()["text/plain"].splitlines()[0]


def test_ranks_filter_keeps_only_those_ranks_lines_in_both_views():
    out, err = io.StringIO(), io.StringIO()
    view = TextView(out, err, spec=SPEC.replace(ranks=(1, 2)), title="train")
    widget = ClusterWidget(SPEC.replace(ranks=(1, 2)), title="train")
    for event in events():
        view(event)
        widget.state.apply(event)
    assert "[node 0 rank 0]" not in out.getvalue() + err.getvalue()
    assert "[node 0 rank 1] oops <b>" in err.getvalue()
    assert "[node 1 rank 2] hello from 2" in out.getvalue()
    assert "    0     0  ok" in out.getvalue()  # the per-rank table still has every rank
    widget._draw(widget.state.take_dirty())
    node0 = widget._logs[0].value
    assert "oops &lt;b&gt;" in node0 and "line 499" not in node0


def gpu_samples(count: int) -> list[GpuSample]:
    """A node with two GPUs over ``count`` seconds: GPU 0 ramps up, GPU 1 stays idle."""
    return [
        GpuSample(
            0,
            (
                GpuStat(0, "NVIDIA H100", min(100, i), 1024 * (8 + i % 8), 81920, 300.0, 60, (0,)),
                GpuStat(1, "NVIDIA H100", 0, 512, 81920, 70.0, 35, (1,)),
            ),
        )
        for i in range(count)
    ]


def points(svg: str) -> list[tuple[int, int]]:
    text = svg.split('points="')[1].split('"')[0]
    return [tuple(int(v) for v in p.split(",")) for p in text.split()]


def test_gpu_bars_and_a_sparkline_of_the_last_minute_per_gpu():
    from jupyter_mn.views.cellstate import HISTORY, CellState
    from jupyter_mn.views.glance import SPARK_H, SPARK_W, gpu_html

    state = CellState("train", "2×2", "local", 2, False)
    for event in gpu_samples(75):
        state.apply(event)
    state.apply(GpuSample(1, (), "no GPU (NVML Shared Library Not Found)"))
    assert list(state.history[(0, 0)]) == [min(100, i) for i in range(15, 75)]  # the last 60
    panel = gpu_html(state)
    gpu0, gpu1 = panel.split('class="jp-mn-gpurow"')[1:]
    assert '<i style="width:74%"></i><span>74%</span>' in gpu0  # utilization now
    assert "<span>10.0/80.0 GiB</span>" in gpu0 and "width:12.5%" in gpu0  # 10 of 80 GiB
    line = points(gpu0)
    assert len(line) == HISTORY and line[-1][0] == SPARK_W  # newest at the right edge
    assert line[0] == (0, SPARK_H - 1 - round(15 * (SPARK_H - 2) / 100))
    assert line[-1][1] < line[0][1]  # higher utilization is drawn higher
    assert {y for _, y in points(gpu1)} == {SPARK_H - 1}  # idle: flat on the floor
    assert "peak 74%" in gpu0 and "300 W 60°C ranks 0" in gpu0
    assert "node 1</span>: no GPU</div>" in panel  # plainly; NVML's words in its title


def test_a_new_gpu_draws_a_one_point_sparkline_and_no_gpu_nodes_share_a_line():
    from jupyter_mn.views.cellstate import CellState
    from jupyter_mn.views.glance import SPARK_W, gpu_html

    state = CellState("train", "3×1", "local", 3, False)
    state.apply(gpu_samples(1)[0])
    for node in (1, 2):
        state.apply(GpuSample(node, (), "no GPU (nvidia-ml-py is not installed)"))
    panel = gpu_html(state)
    assert points(panel) == [(SPARK_W, 19)]
    assert "nodes 1-2</span>: GPUs not sampled (nvidia-ml-py is not installed)" in panel


ONE = "no network (one node)"
BADGES = {  # fixture: the badges (text, tone) its transport report shows
    "ib_gdrdma": [("RDMA IB", "good"), ("GPUDirect", "good"), ("P2P/IPC/read", "good")],
    "ib_no_gdr": [("RDMA IB", "good")],
    "roce": [("RDMA RoCE", "good"), ("GPUDirect", "good")],
    "efa_ofi": [("RDMA EFA", "good"), ("GPUDirect", "good"), ("P2P/CUMEM", "good")],
    "socket_fallback": [("TCP socket", "bad"), ("P2P/CUMEM", "good")],
    # one node (NCCL's nNodes 1): no network, whatever plugin NCCL loaded
    "p2p_ipc": [(ONE, "off"), ("P2P/IPC/read", "good"), ("P2P/IPC", "good")],
    "shm": [(ONE, "off"), ("SHM/direct/direct", "neutral")],
    "one_rank": [(ONE, "off")],
    "nvls_on": [
        (ONE, "off"),
        ("P2P/CUMEM/read", "good"),
        ("NVLink SHARP", "good"),
    ],
}


def test_transport_badges_green_for_rdma_red_for_sockets_grey_for_gloo():
    from jupyter_mn.views.glance import transport_badges

    for name, expected in BADGES.items():
        report = NcclLog().feed_all((FIXTURES / f"{name}.log").read_text().splitlines()).report(0)
        got = [(b.text, b.tone) for b in transport_badges(report)]
        assert got == expected, name
    assert [(b.text, b.tone) for b in transport_badges(TransportReport(0, "gloo"))] == [
        ("gloo (CPU)", "off")
    ]
    assert transport_badges(TransportReport(0))[0].tone == "off"  # NCCL, nothing logged yet
    fallback = NcclLog().feed_all((FIXTURES / "socket_fallback.log").read_text().splitlines())
    socket = transport_badges(fallback.report(0))[0]
    assert "NET/IB : No device found." in socket.title  # why, on hover


def test_transport_panel_groups_alike_nodes_and_keeps_the_loud_warning():
    from jupyter_mn.views.cellstate import CellState
    from jupyter_mn.views.glance import transport_html

    def report(name: str, node: int) -> TransportReport:
        return NcclLog().feed_all((FIXTURES / f"{name}.log").read_text().splitlines()).report(node)

    state = CellState("train", "3×8", "slurm", 3, rdma=True)
    for node, name in enumerate(["ib_gdrdma", "ib_gdrdma", "socket_fallback"]):
        state.apply(report(name, node))
    panel = transport_html(state)
    rows = panel.split('class="jp-mn-trow"')[1:]
    assert len(rows) == 2
    assert (
        "nodes 0-1</span>: " in rows[0] and 'jp-mn-good" title="NET/IB/GDRDMA">RDMA IB' in rows[0]
    )
    assert "jp-mn-alarm" not in rows[0] and "via NET/IB/3/GDRDMA" in rows[0]  # NCCL's proof
    assert "node 2</span>: " in rows[1] and 'class="jp-mn-badge jp-mn-bad"' in rows[1]
    assert '<div class="jp-mn-alarm">⚠ --rdma was asked for, but NCCL uses TCP sockets' in rows[1]


def test_log_filter_lists_each_nodes_shown_ranks_and_tags_every_line_with_its_rank():
    from jupyter_mn.views.filter import LogFilter, node_ranks, rank_runs

    assert node_ranks(1, 4) == [4, 5, 6, 7]
    assert node_ranks(1, 4, (0, 5, 7)) == [5, 7]  # --ranks 0,5,7
    widget = ClusterWidget(SPEC.replace(ranks=(0, 1, 2)), title="train")
    (found,) = [c for c in widget.box.children if isinstance(c, LogFilter)]
    assert found.nodes == [[0, 1], [2]] and found.shown == [-1, -1]  # all, by default
    assert "jp-mn-cell" in widget.box._dom_classes  # the filter's scope
    lines = [(0, "out", "a"), (0, "out", "b"), (1, "err", "<x>"), (0, "out", "c")]
    assert rank_runs(lines) == (
        '<span data-rank="0">[rank 0] a\n[rank 0] b</span>'
        '<span data-rank="1" class="jp-mn-err">[rank 1] &lt;x&gt;</span>'
        '<span data-rank="0">[rank 0] c</span>'
    )
    for event in events():
        widget.state.apply(event)
    widget._draw(widget.state.take_dirty())
    runs = widget._logs[0].value.split("<span")[1:]
    assert runs and all(
        run.startswith(f' data-rank="{rank}"') and f"[rank {1 - rank}]" not in run
        for run in runs
        for rank in [int(run.split('"')[1])]
    )


def test_a_large_gpu_panel_is_redrawn_less_often_within_its_share_of_the_budget():
    """2 GPUs once a second; 64 nodes × 8 GPUs (over 200 kB) every few seconds."""
    import time

    from jupyter_mn.views.widget import GPU_BYTES_PER_S

    for nodes, gpus in ((1, 2), (64, 8)):
        widget = ClusterWidget(ClusterSpec(nodes=nodes, gpus=gpus), title="big")
        for node in range(nodes):
            stats = tuple(GpuStat(g, "H100", 50, 4096, 81559, ranks=(g,)) for g in range(gpus))
            widget.state.apply(GpuSample(node, stats))
        before = time.monotonic()
        widget._draw({"gpu"})
        wait = widget._gpu_due - before
        assert wait >= 1.0
        assert wait >= len(widget._gpu.value) / GPU_BYTES_PER_S
    assert wait > 2.0  # the 512-GPU panel


def test_both_views_answer_the_view_protocol():
    """The magic calls a view without probing it: each has every member of ``View``."""
    members = [m for m in View.__dict__ if not m.startswith("_") or m == "__call__"]
    members += list(View.__annotations__)
    data = {"displays", "verdict_shown"}
    assert {"__call__", "follow", "close"} | data <= set(members)
    for view in (TextView(), ClusterWidget(SPEC, title="protocol")):
        assert all(callable(getattr(view, m)) for m in members if m not in data)
        assert all(hasattr(view, m) for m in data)


def test_text_view_prints_the_notes_and_waiting_nodes_it_is_sent():
    out = io.StringIO()
    view = TextView(out, out)
    view(Note("preflight passed"))
    view(NodesWaiting((1,), "Unschedulable", "0/3 nodes are available"))
    text = out.getvalue()
    assert "preflight passed" in text
    assert "node 1: Unschedulable (0/3 nodes are available)" in text


def test_the_widget_header_says_which_rank_is_paused_and_where_until_it_goes_on():
    widget = ClusterWidget(SPEC, title="debug")
    widget.state.apply(GangState(GangStatus.RUNNING))
    widget.state.apply(RankPaused(node=0, rank=1, run=3, where="Cell In[4], line 7"))
    widget._draw(widget.state.take_dirty())
    assert ">PAUSED at rank 1, Cell In[4], line 7</b>" in widget._header.value
    assert "PAUSED at rank 1" in summary(widget.state)  # the text/plain too
    widget.state.apply(RankResumed(node=0, rank=1, run=3))
    widget._draw(widget.state.take_dirty())
    assert ">RUNNING</b>" in widget._header.value and "PAUSED" not in widget._header.value


HUNG_RANKS = (
    RankWhere(
        0,
        0,
        True,
        ("Cell In[2], line 4", "    dist.all_reduce(t)"),
        (Collective("0", "default_pg", 7, "all_reduce", ((1,),), ("float32",), 1, False),),
        taken_ns=3_000_000_000,
    ),
    RankWhere(0, 1, True, ("Cell In[2], line 6", "    time.sleep(60)")),
    RankWhere(1, 2, True, answered=False, note="no answer (native code holding the GIL?)"),
)
VERDICT = "rank 1 (node 0) never entered all_reduce #7 (pg 0, float32[1]); …"


def test_stacks_come_after_the_verdict_with_the_collective_each_rank_is_inside():
    err = io.StringIO()
    TextView(io.StringIO(), err)(Stacks("--timeout 3 s reached", HUNG_RANKS, VERDICT))
    assert err.getvalue() == (
        f"jupyter_mn: hang: {VERDICT}\n"
        "jupyter_mn: --timeout 3 s reached; where each rank is (innermost last):\n"
        "[node 0 rank 0] running, inside all_reduce #7 (pg 0)\n"
        "    Cell In[2], line 4\n        dist.all_reduce(t)\n"
        "[node 0 rank 1] running\n    Cell In[2], line 6\n        time.sleep(60)\n"
        "[node 1 rank 2] no answer (native code holding the GIL?)\n"
    )
    err = io.StringIO()
    TextView(io.StringIO(), err)(Stacks("stacks on request", HUNG_RANKS[1:2]))
    assert err.getvalue().startswith("jupyter_mn: stacks on request;")  # no verdict, no line


def test_the_widget_shows_a_hung_banner_while_the_cell_runs():
    widget = ClusterWidget(SPEC, title="train")
    widget.state.apply(Hung(VERDICT, 300.0))
    widget._draw(widget.state.take_dirty())
    assert f'<div class="jp-mn-alarm jp-mn-hung">HUNG: {VERDICT}</div>' in widget._header.value
    widget.state.apply(Hung(VERDICT, 300.0, over=True))  # the ranks moved on
    widget._draw(widget.state.take_dirty())
    assert "HUNG" not in widget._header.value
    widget.state.apply(Hung(VERDICT, 300.0))
    widget.state.apply(CellDone(2, 310.0, outcome=CellOutcome.FAILED))
    widget._draw(widget.state.take_dirty())
    assert "HUNG" not in widget._header.value


#: The Cancel button's module in a page of its own (node): a click, and the URL it posts to.
_CANCEL_PAGE = """
const posted = [];
let click;
globalThis.document = {
  cookie: "_xsrf=x",
  getElementById: () => null,
  createElement: () => ({ style: {}, addEventListener: (kind, fn) => { click = fn; } }),
};
globalThis.fetch = async (url) => { posted.push(url); return { ok: true }; };
const { default: widget } = await import(process.argv[2]);
const model = { get: (k) => ({ running: true, kernel_id: process.argv[3] })[k], on: () => {} };
widget.render({ model, el: { appendChild: () => {} } });
await click();
console.log(posted.join("\\n"));
"""


def test_the_cancel_button_posts_to_its_own_kernel_whatever_the_id_holds(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("needs node to run the widget's module")
    (tmp_path / "cancel.mjs").write_text(CANCEL_ESM)
    (tmp_path / "page.mjs").write_text(_CANCEL_PAGE)
    posted = subprocess.run(
        [node, str(tmp_path / "page.mjs"), str(tmp_path / "cancel.mjs"), "../../api/contents/x?"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert posted == "/api/kernels/..%2F..%2Fapi%2Fcontents%2Fx%3F/interrupt"


def test_a_job_reference_is_drawn_live_only_in_a_trusted_notebook():
    """The renderer polls the server's jobs and offers Cancel: JupyterLab may use it for
    trusted outputs only (an untrusted notebook's reference shows its plain text)."""
    source = (Path(__file__).parents[2] / "labextension" / "src" / "jobview.ts").read_text()
    factory = re.search(
        r"rendererFactory: IRenderMime\.IRendererFactory = \{(.*?)\n\}", source, re.S
    )
    assert factory and re.search(r"^\s*safe: false,$", factory[1], re.M)
