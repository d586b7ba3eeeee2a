"""What a cell's view says and leaves out (issue 43): every rank's lines in view with the failed
rank's marked so no filter hides them, a cell with nothing to report as its header line, "no GPU"
said once and plainly, a finished progress bar that is no error, a stopped hang's verdict and
stacks once."""

from __future__ import annotations

import io
from dataclasses import replace

from jupyter_mn.model.result import CellResult, RankOutcome
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.views import TextView
from jupyter_mn.views.filter import LogFilter
from jupyter_mn.views.summary import summary
from jupyter_mn.views.widget import ClusterWidget
from jupyter_mn.wire.events import (
    CellDone,
    CellOutcome,
    GangState,
    GpuSample,
    GpuStat,
    Hung,
    LogLines,
    RankError,
    RankState,
    RankStatus,
    RankTiming,
    Stacks,
    TransportReport,
)
from jupyter_mn.wire.rankwhere import RankWhere

SPEC = ClusterSpec(nodes=2, gpus=2)
NVML = "no GPU (NVML Shared Library Not Found)"


def drawn(widget: ClusterWidget, *events: object) -> ClusterWidget:
    for event in events:
        widget.state.apply(event)
    widget._draw(widget.state.take_dirty() | {"header", "gpu", "transport", "summary"})
    return widget


def quick(ok: bool = True) -> CellDone:
    ranks = tuple(RankTiming(r, r // 2, "ok", 0.01) for r in range(4))
    if ok:
        return CellDone(2, 0.02, ranks)
    return CellDone(2, 0.02, ranks, "rank 3: boom", outcome=CellOutcome.FAILED)


def cpu_gang() -> list[object]:
    """What a warm CPU gang sends for ``x = 1``: no line, no GPU, gloo."""
    return [
        GangState("RUNNING"),
        *(GpuSample(node, (), NVML) for node in range(2)),
        *(TransportReport(node, backend="gloo") for node in range(2)),
        GangState("READY"),
    ]


def test_every_nodes_lines_are_drawn_at_once_under_a_filter_that_shows_all():
    widget = drawn(
        ClusterWidget(SPEC, title="train"),
        LogLines(0, 1, ((0, "out", ("zero",)), (1, "out", ("one",)))),
        LogLines(1, 1, ((3, "out", ("three",)),)),
    )
    (found,) = [c for c in widget.box.children if isinstance(c, LogFilter)]
    assert found.nodes == [[0, 1], [2, 3]] and found.shown == [-1, -1]
    node0, node1 = (log.value for log in widget._logs)
    assert "node 0 · 2 lines" in node0 and "[rank 1] one" in node0
    assert "node 1 · 1 line" in node1 and "[rank 3] three" in node1
    one_rank = ClusterWidget(ClusterSpec(nodes=1, gpus=1))
    assert not [c for c in one_rank.box.children if isinstance(c, LogFilter)]  # nothing to pick


def test_the_rank_that_failed_is_marked_so_no_filter_hides_its_lines():
    widget = drawn(
        ClusterWidget(SPEC),
        LogLines(1, 1, ((2, "out", ("fine",)), (3, "err", ("about to fail",)))),
        RankState(1, 2, RankStatus.ERROR, "stopped", 1),  # a consequence: not marked
        RankState(1, 3, RankStatus.ERROR, "ValueError", 1, primary=True),
    )
    node1 = widget._logs[1].value
    assert node1.startswith('<div class="jp-mn-nodelog jp-mn-hasfailing" data-node="1">')
    assert '<span data-rank="3" class="jp-mn-err jp-mn-failing">' in node1
    assert '<span data-rank="2">' in node1
    assert "jp-mn-failing" not in widget._logs[0].value


def test_a_cell_with_nothing_to_report_is_its_header_line():
    widget = ClusterWidget(SPEC, title="cell 2")
    drawn(widget)
    assert [log.value for log in widget._logs] == ["", ""]  # no empty box, no "0 lines"
    assert widget._gpu.value == widget._transport.value == ""  # nothing sampled yet: no heading
    drawn(widget, *cpu_gang(), quick())
    assert widget._gpu.value == widget._transport.value == widget._notes.value == ""
    folded = widget.final_bundle()
    body = folded["text/html"].split('<div class="jp-mn-done">')[1]
    assert body.startswith('<span class="jp-mn-header">') and body.endswith("</span></div>")
    assert "cell 2 · DONE · 2×2 local · no GPU · " in folded["text/plain"]
    assert "lines" not in folded["text/plain"] and "NVML" not in folded["text/plain"]


def test_a_failed_cell_keeps_its_notes_and_a_long_one_its_panels():
    failed = drawn(ClusterWidget(SPEC), *cpu_gang(), quick(ok=False))
    assert "per-rank times" in failed._notes.value
    gpu = ClusterWidget(SPEC)
    sample = GpuSample(0, (GpuStat(0, "NVIDIA H100", 87, 40960, 81920),))
    ranks = quick().ranks
    drawn(gpu, sample, GpuSample(1, (), NVML), CellDone(2, 30.0, ranks))
    html = gpu.final_bundle()["text/html"]
    assert "jp-mn-gpu" in html and "87%" in html
    assert 'title="no GPU (NVML Shared Library Not Found)"' in html  # NVML's words: a tooltip
    assert "node 1</span>: no GPU</div>" in html


def test_no_gpu_is_said_once_in_text_too():
    out = io.StringIO()
    view = TextView(out, io.StringIO(), spec=SPEC, title="cell 1")
    for event in [*cpu_gang()[:-1], GangState("READY", "cpu (gloo)"), quick()]:
        view(event)
    text = out.getvalue()
    assert text.count("no GPU") == 1 and "NVML" not in text, text


def test_a_finished_progress_bar_is_no_error_and_its_line_is_counted():
    bar = "100%|##########| 10/10"
    widget = drawn(ClusterWidget(SPEC), LogLines(0, 1, (), ((0, "err", " 50%|#####"),)))
    assert "node 0 · 1 line" in widget._logs[0].value  # the bar being drawn is a line
    drawn(widget, LogLines(0, 2, ((0, "err", (bar, "Traceback: a real error")),)))
    node0 = widget._logs[0].value
    assert f'<span data-rank="0">[rank 0] {bar}</span>' in node0  # not red
    assert '<span data-rank="0" class="jp-mn-err">[rank 0] Traceback' in node0
    assert "node 0: 2 lines" in summary(widget.state)


WHERE = (
    RankWhere(0, 0, True, ("Cell In[2], line 4", "    dist.all_reduce(t)")),
    RankWhere(0, 1, True, ("Cell In[2], line 6", "    time.sleep(60)")),
)
VERDICT = "rank 1 (node 0) never entered all_reduce #7 (pg 0, float32[1]); …"


def hang_then_stop() -> list[object]:
    """The watchdog's verdict with its stacks, then the user's stop finding the same stacks."""
    return [
        Hung(VERDICT, 5.0),
        Stacks("no progress for 5 s", WHERE, VERDICT),
        Stacks("interrupted", tuple(replace(r, taken_ns=9) for r in WHERE), VERDICT, stop=True),
        CellDone(2, 8.0, outcome=CellOutcome.HUNG),
    ]


def stopped_hang() -> CellResult:
    """The result of ``hang_then_stop``: rank 1 asleep in its own code, rank 0 in all_reduce."""
    ranks = [
        RankOutcome(0, 0, 0, RankStatus.INTERRUPTED, error=RankError("KeyboardInterrupt", "")),
        RankOutcome(1, 0, 1, RankStatus.INTERRUPTED, error=RankError("KeyboardInterrupt", "")),
    ]
    return CellResult(ranks, interrupted="interrupted by the user", verdict=VERDICT, culprits=(1,))


def error_text(result: CellResult, view: ClusterWidget | TextView) -> str:
    return "\n".join(result.error(view.verdict_shown)._render_traceback_())


def test_under_the_widget_the_error_does_not_repeat_the_verdict_of_its_banner():
    widget = drawn(ClusterWidget(SPEC), *hang_then_stop())
    assert f"HUNG: {VERDICT}" in widget._header.value
    text = error_text(stopped_hang(), widget)
    assert VERDICT not in text
    assert text.startswith("CellInterrupted: interrupted by the user: the ranks hung (the verdict")
    assert "then rank 1 (node 0) was interrupted: KeyboardInterrupt" in text


def test_the_text_view_and_the_error_say_the_verdict_once_whoever_found_it():
    for events in (hang_then_stop(), hang_then_stop()[2:]):  # the watchdog's, the stop's alone
        err = io.StringIO()
        view = TextView(io.StringIO(), err, spec=SPEC)
        for event in events:
            view(event)
        both = err.getvalue() + error_text(stopped_hang(), view)
        assert both.count(VERDICT) == 1, both


def test_a_stopped_hang_shows_the_verdict_once_the_stacks_once_and_keeps_its_banner():
    widget = drawn(ClusterWidget(SPEC), *hang_then_stop())
    assert f"HUNG: {VERDICT}" in widget._header.value  # still there after the stop
    notes = widget._notes.value
    assert notes.count('<details class="jp-mn-stacks">') == 1  # collapsible, the newest look
    assert "where each rank is (interrupted)" in notes and "time.sleep(60)" in notes
    html = widget.final_bundle()["text/html"]
    assert html.count(VERDICT.split(";")[0]) == 1
    plain = summary(widget.state)
    assert plain.count("time.sleep(60)") == 1 and plain.count(VERDICT) == 1


def test_the_text_view_prints_stacks_that_did_not_change_once():
    err = io.StringIO()
    view = TextView(io.StringIO(), err, spec=SPEC)
    for event in hang_then_stop()[:3]:
        view(event)
    text = err.getvalue()
    assert text.count(VERDICT) == 1 and text.count("time.sleep(60)") == 1
    assert text.endswith("jupyter_mn: interrupted; every rank is where the stacks above show\n")
    view(Stacks("interrupted", WHERE[:1], VERDICT))  # they moved: new stacks, the same verdict
    assert err.getvalue().count("dist.all_reduce(t)") == 2
    assert err.getvalue().count(VERDICT) == 1


def test_a_background_cells_widget_is_shown_by_its_handle_not_by_its_events(capsys):
    """A ``--bg`` cell's events come from its own thread, where a display would land in
    whichever cell runs then: its handle shows the view, in the cell's own output."""
    widget = ClusterWidget(SPEC, title="cell 3", background=True)
    for event in cpu_gang():
        widget(event)
    assert widget.updates == 0 and widget.displays is None  # rank displays stay on the result
    widget.show()
    widget(quick())
    widget.close()
    assert widget.folded and "cell 3 · DONE" in widget.final_bundle()["text/plain"]
    assert capsys.readouterr().out.count("ClusterWidget object") == 1  # shown once, by show()
