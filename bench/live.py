"""Live output rates through a real kernel: how often a progress bar and a redrawn plot reach
the notebook while the cell runs (docs/architecture.md, "Progress bars and live output").

* a tqdm bar on rank 0 updated 100 times a second for ``SECONDS``: distinct states the widget
  showed per second, and how many lines the text view printed (and their spacing);
* a figure's PNG redisplayed 20 times a second with ``clear_output(wait=True); display(...)``:
  frames shown per second and the bytes per second they cost on IOPub (the PNG is rendered once:
  on a loaded machine matplotlib's own rendering would set the pace).

Run: ``.venv/bin/python -m bench.live``.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Any

from bench.cells import Kernel

SECONDS = 6
SHAPE = "--nodes 1 --gpus 2"
BAR = f"""%%cluster {SHAPE} --view {{view}}
import time
from tqdm import tqdm
if dist.get_rank() == 0:
    for _ in tqdm(range({SECONDS * 100}), mininterval=0, ncols=60):
        time.sleep(0.01)
"""
PLOT = f"""%%cluster {SHAPE} --view text
import io, time
import matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt
from IPython.display import Image, clear_output, display
if dist.get_rank() == 0:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(200), [1 / (s + 1) for s in range(200)], "b.")
    png = io.BytesIO()
    fig.savefig(png, format="png")  # rendered once: the frames measure the path, not matplotlib
    for step in range({SECONDS * 20}):
        clear_output(wait=True)
        display(Image(data=png.getvalue()))
        time.sleep(0.05)
"""
LIVE = re.compile(r'<span class="jp-mn-live"[^>]*>([^<]*)</span>')  # tagged with its rank


def iopub(kernel: Kernel, code: str) -> list[dict[str, Any]]:
    msg_id = kernel.kc.execute(code)
    seen = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=300)
        msg["received"] = time.monotonic()
        seen.append(msg)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return seen


def span(times: list[float]) -> float:
    return max(times[-1] - times[0], 1e-9) if len(times) > 1 else float("nan")


def main() -> None:
    kernel = Kernel("jupyter_mn")
    try:
        kernel.run(f"%%cluster {SHAPE} --view text\nimport tqdm, matplotlib")
        states, last = [], None
        for m in iopub(kernel, BAR.format(view="widget")):
            value = m["content"].get("data", {}).get("state", {}).get("value", "")
            rows = LIVE.findall(value) if m["msg_type"] == "comm_msg" else []
            if rows and rows != last:
                states.append(m["received"])
                last = rows
        print(
            f"widget: {len(states)} bar states in {span(states):.1f} s "
            f"= {(len(states) - 1) / span(states):.1f} updates/s (bar: 100 updates/s)"
        )
        prints = [
            m["received"]
            for m in iopub(kernel, BAR.format(view="text"))
            if m["msg_type"] == "stream" and "%|" in m["content"]["text"]
        ]
        gaps = [round(b - a, 1) for a, b in itertools.pairwise(prints)]
        print(f"text view: {len(prints)} bar lines in {span(prints):.1f} s, gaps {gaps} s")
        frames = [
            (m["received"], len(json.dumps(m["content"])))
            for m in iopub(kernel, PLOT)
            if m["msg_type"] in ("display_data", "update_display_data")
            and "image/png" in m["content"]["data"]
        ]
        took = span([t for t, _ in frames])
        print(
            f"plot: {len(frames)} frames in {took:.1f} s = {(len(frames) - 1) / took:.1f} "
            f"frames/s, {sum(b for _, b in frames) / took / 1000:.0f} KB/s "
            f"(rank 0 drew 20 frames/s of {frames[0][1] / 1000:.0f} KB)"
        )
    finally:
        kernel.run("%cluster down")
        kernel.close()


if __name__ == "__main__":
    main()
