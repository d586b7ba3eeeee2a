"""Pending reasons while a Kubernetes gang comes up, in both views."""

from __future__ import annotations

import io

from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.views import TextView
from jupyter_mn.views.widget import ClusterWidget
from jupyter_mn.wire.events import GangState, NodesWaiting

SPEC = ClusterSpec(nodes=4, gpus=8, backend="kubernetes", kubernetes=KubeOptions(image="a:1"))
UNSCHEDULABLE = "0/12 nodes are available: 12 Insufficient nvidia.com/gpu."
EVENTS = [
    GangState("SCHEDULING", "4×8 kubernetes"),
    NodesWaiting((), "queued", "gang jmn-other (alice) is coming up first"),
    NodesWaiting((0, 1, 2, 3), "Pending", "not scheduled yet"),
    NodesWaiting((0, 1, 3), "Ready"),
    NodesWaiting((2,), "Unschedulable", UNSCHEDULABLE),
]


def test_text_view_prints_each_reason_with_its_nodes():
    out = io.StringIO()
    view = TextView(out, io.StringIO())
    for event in EVENTS:
        view(event)
    lines = out.getvalue().splitlines()
    assert lines[-3:] == [
        "jupyter_mn: nodes 0-3: Pending (not scheduled yet)",
        "jupyter_mn: nodes 0-1, 3: Ready",
        f"jupyter_mn: node 2: Unschedulable ({UNSCHEDULABLE})",
    ]


def test_widget_header_shows_the_current_reasons_until_the_gang_moves_on():
    widget = ClusterWidget(SPEC, title="train")
    for event in EVENTS:
        widget.state.apply(event)
    header = widget._header_html()
    assert "<li>gang: queued (gang jmn-other (alice) is coming up first)</li>" in header
    assert "<li>nodes 0-1, 3: Ready</li>" in header
    assert "<li>node 2: Unschedulable (0/12 nodes are available" in header
    assert "Pending" not in header  # superseded for every node
    widget.state.apply(GangState("RENDEZVOUS"))
    assert "jp-mn-waiting" not in widget._header_html()
