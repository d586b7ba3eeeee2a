"""The widget stays inside Jupyter's IOPub limits on a loud cell, and its last update has it all.

jupyter-server drops IOPub messages past 1000 msg/s or 1 MB/s (averaged over 3 s); a dropped
widget update leaves the browser showing stale logs. Measured on the kernel's IOPub stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.kernels import Kernel, module_kernel

LOUD = (
    "%%cluster --nodes 2 --gpus 2 --view widget\nimport time\nfor i in range(2000):\n"
    "    print(f'rank {dist.get_rank()} line {i}')\n"
    "    if i % 250 == 0:\n        time.sleep(0.25)\n"
)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with module_kernel() as k:
        yield k


def window_peak(times_sizes: list[tuple[float, int]], window: float) -> tuple[int, int]:
    """Most messages and most bytes inside any ``window`` seconds."""
    peak_n = peak_b = 0
    for i, (start, _) in enumerate(times_sizes):
        inside = [size for t, size in times_sizes[i:] if t - start < window]
        peak_n, peak_b = max(peak_n, len(inside)), max(peak_b, sum(inside))
    return peak_n, peak_b


def test_loud_cell_widget_updates_stay_under_the_iopub_limits(kernel):
    kernel.run("%%cluster --nodes 2 --gpus 2 --view text\n0")  # warm gang: time only the cell
    msgs = kernel.iopub_during(LOUD)
    comms = [m for m in msgs if m["msg_type"] == "comm_msg"]
    sized = [(m["received"], len(json.dumps(m["content"]))) for m in comms]
    per_s, _ = window_peak(sized, 1.0)
    _, per_3s_bytes = window_peak(sized, 3.0)
    assert per_s < 100, f"{per_s} widget messages in one second"  # Jupyter's limit: 1000
    assert per_3s_bytes / 3 < 500_000, f"{per_3s_bytes / 3:.0f} B/s"  # Jupyter's limit: 1 MB/s
    last: dict[str, str] = {}
    for m in comms:
        state = m["content"]["data"].get("state", {})
        if "value" in state:
            last[m["content"]["comm_id"]] = state["value"]
        for output in state.get("outputs", ()):  # the root's, an Output's: the folded view
            last[m["content"]["comm_id"]] = output["data"].get("text/html", "")
    logs = [v for v in last.values() if v.startswith('<div class="jp-mn-nodelog')]  # a node's
    assert len(logs) == 2
    (folded,) = [v for v in last.values() if "jp-mn-done" in v]  # the view once the cell ended
    assert all(f"[rank {rank}] rank {rank} line 1999" in folded for rank in range(4))
    for rank in range(4):
        assert any(f"[rank {rank}] rank {rank} line 1999" in v for v in logs)
    streams = [m for m in msgs if m["msg_type"] == "stream"]
    assert not any("rate exceeded" in m["content"]["text"] for m in streams)
    displays = [m for m in msgs if m["msg_type"] == "update_display_data"]
    assert "[rank 3] rank 3 line 1999" in displays[-1]["content"]["data"]["text/plain"]
