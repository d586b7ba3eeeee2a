"""Views from events: the text table, the widget's parts and its text/plain, straggler hints."""

from __future__ import annotations

import io

from test_nccl import FIXTURES

from jupyter_mn.events import (
    CellDone,
    GangState,
    GpuSample,
    GpuStat,
    LogLines,
    RankTiming,
    TransportReport,
)
from jupyter_mn.node.nccl import NcclLog
from jupyter_mn.spec import ClusterSpec
from jupyter_mn.views import TextView, make_view, widgets_rendered
from jupyter_mn.views.state import TAIL_LINES
from jupyter_mn.views.straggler import hints
from jupyter_mn.views.summary import summary
from jupyter_mn.views.widget import ClusterWidget

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
            True,
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
    table = text[text.index("jupyter_mn: train · READY") :]
    assert "node 0 GPU 0 (NVIDIA H100): 87% (peak 87%), 40.0/80.0 GiB" in table
    assert "node 1: no GPU (NVML Shared Library Not Found)" in table
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


def test_auto_view_is_text_without_a_widget_frontend():
    assert not widgets_rendered()
    assert isinstance(make_view(SPEC), TextView)
    assert isinstance(make_view(SPEC.replace(view="widget")), ClusterWidget)


def test_text_view_prints_the_table_only_when_it_says_something():
    """A warm trivial cell ends quietly; a cold start, a failure or a long cell gets the table."""
    from jupyter_mn.events import CellDone, GangState, RankTiming
    from jupyter_mn.views.text import TABLE_AFTER_S, TextView

    ok = (RankTiming(0, 0, "ok", 0.01), RankTiming(1, 0, "ok", 0.01))

    def shown(*events) -> str:
        out = io.StringIO()
        view = TextView(out, io.StringIO(), spec=ClusterSpec(nodes=1, gpus=2))
        for event in events:
            view(event)
        return out.getvalue()

    assert shown(CellDone(1, True, 0.02, ok)) == ""
    assert " rank  node  status" in shown(
        GangState("READY", "cpu (gloo)"), CellDone(1, True, 3, ok)
    )
    assert " rank  node  status" in shown(CellDone(1, False, 0.02, ok, "rank 1: boom"))
    assert " rank  node  status" in shown(CellDone(1, True, TABLE_AFTER_S, ok))


def test_the_widget_header_follows_a_background_re_form_to_ready():
    """A rank dies: the cell fails while its node restarts; the header then turns READY."""
    from polling import wait_until

    from jupyter_mn import Cluster

    with Cluster(nodes=1, gpus=2) as cluster:
        widget = ClusterWidget(ClusterSpec(nodes=1, gpus=2), title="crash")
        kill = "import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), 9)\n"
        result = cluster.run(kill + "dist.barrier()", on_event=widget)
        widget.close()
        assert not result.ok and widget.state.state == "RENDEZVOUS"
        widget.follow(cluster.gang)
        wait_until(lambda: "READY" in widget._header.value, 60, "the header to say READY")
        assert "failed" in widget._header.value
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
