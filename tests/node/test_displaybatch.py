"""What waits to be sent of rank 0's displays: a clear or an update makes earlier calls moot."""

from __future__ import annotations

from jupyter_mn.node.displaybatch import DisplayBatch
from jupyter_mn.wire.events import DisplayOutput


def frame(n: int, display_id: str = "") -> DisplayOutput:
    return DisplayOutput("display", {"image/png": "A" * n}, {}, display_id)


def test_a_plot_redrawn_many_times_before_a_send_leaves_only_its_last_frame():
    batch = DisplayBatch()
    batch.add(frame(10))
    for n in (20, 30, 40):
        batch.add(DisplayOutput("clear", wait=True))
        batch.add(frame(n))
    assert [o.kind for o in batch.outputs] == ["clear", "display"]
    assert batch.outputs[0].wait and batch.size == 40


def test_an_update_replaces_earlier_data_of_its_id_and_still_goes_out_for_older_outputs():
    batch = DisplayBatch()
    batch.add(frame(1, "table"))
    batch.add(frame(2))
    batch.add(DisplayOutput("update", {"text/html": "v2"}, {}, "table"))
    batch.add(DisplayOutput("update", {"text/html": "v3"}, {}, "table"))
    kinds = [(o.kind, o.display_id, o.data) for o in batch.outputs]
    assert kinds == [
        ("display", "table", {"text/html": "v3"}),
        ("display", "", {"image/png": "AA"}),
        ("update", "table", {"text/html": "v3"}),
    ]
