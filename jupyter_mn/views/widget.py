"""The cell's live widget: header with Cancel, GPU and transport panels, every node's log in
view (labelled by rank) under a filter whose ``all`` is the default.

Events update a ``CellState`` on the kernel's main thread; a drawing thread redraws one changed
part per frame, at most 10 frames a second and within a byte budget, because Jupyter drops
IOPub messages past 1000 msg/s or 1 MB/s (docs/architecture.md, "Views and the IOPub budget")
and every update of a log resends the whole bounded tail. One part per frame keeps a 64-node gang
whose ranks all print at 10 messages a second: each node's log is redrawn in turn. The GPU panel,
which changes with every node's ~1 Hz sample, gets at most a quarter of the byte budget. Its
``text/plain`` is the text summary, so a saved notebook or a papermill output stays readable
without a kernel.

A part with nothing to show is empty and takes no room (no heading, no "0 lines"): a cell with
nothing to report is its header line. A gang with no GPU anywhere says so once, in the header.

Once the cell has ended the view folds: its output becomes plain HTML (header, the nodes' last
lines, and where the cell has something to report the GPU and transport panels and the notes),
which a saved notebook shows without a kernel, and the widget's parts are closed: a 2×2 cell's
live view is 34 models (its widgets with their layouts and styles), a finished one keeps one.
That one is the root, an ``Output`` whose one output is the live box and then the folded HTML
(data, not models): a page reloaded while the cell ran shows the root, and Lab applies the
display's update only to outputs it received itself, so the root stays to show the fold there.
Roots share one layout.
"""

from __future__ import annotations

import functools
import html
import threading
import time
from typing import Any

import anywidget
import ipywidgets as W
import traitlets
from IPython.display import display

from ..model.kernelid import current_kernel_id
from ..model.spec import ClusterSpec
from ..wire.events import CellOutcome, Displays, GangState, GangStatus
from ..wire.plural import counted
from .cellstate import CellState
from .displays import RankDisplays
from .filter import FILTER_STYLE, LogFilter, node_ranks, rank_runs
from .glance import GLANCE_STYLE, gpu_html, transport_html
from .stacktext import format_stacks
from .straggler import hints
from .summary import header, rank_table, summary

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
FRAME_S = 0.1
#: IOPub data budget for this widget (Jupyter's limit is 1 MB/s averaged over 3 s).
BYTES_PER_S = 400_000
#: The GPU panel's share: it is redrawn at most once a second, less often when it is large.
GPU_BYTES_PER_S = BYTES_PER_S // 4
#: A cell's job, by its kernel and cell: the Lab extension renders the job from the server in
#: its place while the widget cannot be shown (a page reloaded while the kernel runs the cell
#: cannot ask the kernel for the widget's state until the cell ends).
JOB_MIME = "application/vnd.jupyter-mn.job+json"
#: a paused rank, a preempted node: the cell waits for something
_WAITING_COLOR = "#e37400"
_RED, _GREEN = "#d93025", "#188038"
_STATE_COLORS = {GangStatus.RUNNING: "#1a73e8", GangStatus.READY: _GREEN, GangStatus.BROKEN: _RED}
_OUTCOME_COLORS = {
    CellOutcome.DONE: _GREEN,
    CellOutcome.FAILED: _RED,
    CellOutcome.LOST: _RED,
    CellOutcome.HUNG: _RED,
    CellOutcome.INTERRUPTED: _WAITING_COLOR,
    CellOutcome.PREEMPTED: _WAITING_COLOR,
}

STYLE = """<style>
.jp-mn-log { max-height: 22em; overflow-y: auto; display: flex; flex-direction: column-reverse;
  border: 1px solid var(--jp-border-color2, #ddd); }
.jp-mn-log pre { margin: 0; padding: 4px; flex-shrink: 0; overflow: visible;
  font-size: var(--jp-code-font-size, 12px); }
.jp-mn-nodehead { font-size: 11px; color: var(--jp-ui-font-color2, #666); }
.jp-mn-log .jp-mn-err { color: var(--jp-error-color1, #d32f2f); }
.jp-mn-log .jp-mn-live { font-weight: bold; }
.jp-mn-log .jp-mn-failing { border-left: 3px solid var(--jp-error-color1, #d32f2f); }
.jp-mn-cell pre, .jp-mn-done pre, .jp-mn-alarm { word-break: normal; overflow-wrap: anywhere; }
.jp-mn-table { border-collapse: collapse; font-size: 12px; }
.jp-mn-table td, .jp-mn-table th { padding: 1px 8px; text-align: left; }
.jp-mn-alarm { background: #fdecea; color: #b71c1c; padding: 2px 6px; }
.jp-mn-evidence { font-family: var(--jp-code-font-family, monospace); font-size: 11px;
  color: var(--jp-ui-font-color2, #666); }
</style>"""

CANCEL_ESM = """
function pageConfig() {
  const el = document.getElementById("jupyter-config-data");
  try { return el ? JSON.parse(el.textContent) : {}; } catch (e) { return {}; }
}
function xsrf() {
  const m = document.cookie.match(/(?:^|;\\s*)_xsrf=([^;]*)/);
  return m ? decodeURIComponent(m[1]) : "";
}
export default {
  render({ model, el }) {
    const button = document.createElement("button");
    button.className = "jupyter-button jp-mn-cancel";
    button.textContent = "Cancel";
    const sync = () => {  // only while the cell runs: no inactive button left on a done cell
      const live = model.get("running") && model.get("kernel_id");
      button.disabled = !live;
      button.style.display = live ? "" : "none";
    };
    sync();
    model.on("change:running", sync);
    button.addEventListener("click", async () => {
      // The kernel is busy running the cell, so a comm message would wait for it to finish:
      // interrupt through the Jupyter server instead, like the toolbar's stop button does.
      button.disabled = true;
      button.textContent = "Cancelling…";
      const config = pageConfig();
      const base = (config.baseUrl || "/").replace(/\\/?$/, "/");
      const headers = { "X-XSRFToken": xsrf() };
      if (config.token) { headers["Authorization"] = "token " + config.token; }
      try {
        const id = encodeURIComponent(model.get("kernel_id"));  // a name, never a path
        const url = base + "api/kernels/" + id + "/interrupt";
        const reply = await fetch(url, { method: "POST", headers, credentials: "same-origin" });
        button.textContent = reply.ok ? "Cancelled" : "Cancel failed (" + reply.status + ")";
      } catch (e) {
        button.textContent = "Cancel failed";
      }
    });
    el.appendChild(button);
  }
};
"""


def _models(widget: W.Widget) -> list[W.Widget]:
    """``widget``, its children's trees, and the layout and style models each one holds."""
    found = [widget]
    for name in ("layout", "style"):
        if isinstance(part := getattr(widget, name, None), W.Widget):
            found.append(part)
    for child in getattr(widget, "children", ()):
        found += _models(child)
    return found


@functools.cache
def _shared_layout() -> W.Layout:
    """The roots' layout: one model for every cell of the kernel rather than one each."""
    return W.Layout()


def _view(widget: W.Widget) -> dict[str, Any]:
    """The mime bundle that shows ``widget``."""
    return {WIDGET_VIEW: widget._repr_mimebundle_()[WIDGET_VIEW]}


def _output(bundle: dict[str, Any]) -> dict[str, Any]:
    """``bundle`` as one of an ``Output`` widget's outputs."""
    return {"output_type": "display_data", "data": bundle, "metadata": {}}


def job_reference(kernel_id: str, cell_id: int) -> dict[str, Any]:
    """The output that stands for the cell's job where the widget cannot be drawn (no text:
    elsewhere it shows nothing)."""
    return {JOB_MIME: {"kernel_id": kernel_id, "cell": cell_id}, "text/plain": ""}


class CancelButton(anywidget.AnyWidget):
    """Interrupts the kernel (and so the cell's ranks); shown only while the cell runs."""

    _esm = CANCEL_ESM
    running = traitlets.Bool(False).tag(sync=True)
    kernel_id = traitlets.Unicode("").tag(sync=True)


class ClusterWidget:
    """One per ``%%cluster`` cell; call it with events, ``show()`` it, ``close()`` it."""

    def __init__(
        self,
        spec: ClusterSpec,
        title: str = "cell",
        cell_id: int | None = None,
        background: bool = False,
    ) -> None:
        """``background``: a ``--bg`` cell's view, shown by its handle (on the kernel's main
        thread, in the cell's output) rather than by the first event, which comes from the
        cell's own thread; rank 0's displays stay on the handle's result."""
        self._cell_id = cell_id
        self._background = background
        self.state = CellState(
            title, spec.shape, spec.backend, spec.nodes, spec.rdma, ranks=spec.ranks
        )
        self._header = W.HTML()
        self._cancel = CancelButton(kernel_id=current_kernel_id() or "", running=True)
        self._logs = [W.HTML() for _ in range(spec.nodes)]
        nodes = [node_ranks(node, spec.gpus, spec.ranks) for node in range(spec.nodes)]
        self._gpu = W.HTML()
        self._transport = W.HTML()
        panels = W.HBox([self._gpu, self._transport], _dom_classes=["jp-mn-panels"])
        self._notes = W.HTML()
        parts: list[W.Widget] = [W.HTML(STYLE + GLANCE_STYLE + FILTER_STYLE)]
        parts += [W.HBox([self._header, self._cancel]), panels]
        if len(nodes) > 1 or len(nodes[0]) > 1:  # one rank: nothing to filter
            parts.append(LogFilter(nodes=nodes))
        parts += [W.VBox(self._logs), self._notes]
        # classes given at construction: a later add_class is one more comm message each
        self.box = W.VBox(parts, _dom_classes=["jp-mn-cell"])  # the filter's scope
        self.root = W.Output(layout=_shared_layout(), outputs=(_output(_view(self.box)),))
        #: widget updates sent, and their bytes (the IOPub budget's two measures)
        self.updates = 0
        self.sent_bytes = 0
        #: parts changed but not redrawn yet, oldest first
        self._pending: dict[str, None] = {}
        #: rank 0's displays, shown below the widget while the cell runs
        self.displays = None if background else RankDisplays()
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn_at = 0.0
        self._gpu_due = 0.0
        self._draw_lock = threading.Lock()
        #: the cell has ended: the output is ``final_bundle()``, the parts' models are closed
        self.folded = False

    @property
    def verdict_shown(self) -> bool:
        """The HUNG banner keeps the verdict after the stop."""
        return bool(self.state.hung)

    # ---- display
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        if self.folded:
            return self.final_bundle()
        return {**_view(self.root), "text/plain": summary(self.state)}

    def final_bundle(self) -> dict[str, Any]:
        """What stays of the cell: its parts as they were last drawn, as HTML, and the text
        summary."""
        logs = "".join(log.value for log in self._logs)
        panels = self._gpu.value + self._transport.value
        if panels and self.state.notable():
            logs = f'<div class="jp-mn-panels">{panels}</div>{logs}'
        body = self._header.value + logs + self._notes.value
        return {
            "text/html": f'{STYLE}{GLANCE_STYLE}{FILTER_STYLE}<div class="jp-mn-done">{body}</div>',
            "text/plain": summary(self.state),
        }

    def show(self) -> None:
        self._draw({"header", "gpu", "transport"} | {f"log{n}" for n in range(len(self._logs))})
        self._handle = display(self, display_id=True)
        kernel_id = self._cancel.kernel_id
        if self._cell_id is not None and kernel_id:
            display(job_reference(kernel_id, self._cell_id), raw=True)
        self._thread = threading.Thread(target=self._loop, daemon=True, name="jupyter-mn-widget")
        self._thread.start()

    def __call__(self, event: Any) -> None:
        self.state.apply(event)  # before the first show: it appears with the phase it is in
        if self._thread is None and not self._background:  # refused input shows no widget
            self.show()
        if isinstance(event, Displays) and self.displays is not None:
            self.displays(event)

    def close(self) -> None:
        """Final draw of everything and the text summary, then fold: the output becomes
        ``final_bundle()``, the root's one output too, and every other model is closed (the
        Cancel button goes with them)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self.state.ended = self.state.ended or time.monotonic()
        self._draw({*self._pending, *self.state.take_dirty(), "header", "summary"})
        self._pending.clear()
        self.folded = True
        self._show_final()
        for model in _models(self.box):
            model.close()

    def _show_final(self) -> None:
        self.root.outputs = (_output(self.final_bundle()),)
        if self._handle is not None:
            self._handle.update(self)

    def follow(self, gang: Any) -> None:
        """After a failed cell whose gang re-forms in the background, keep listening until it is
        READY (or BROKEN), so the header does not stay on RENDEZVOUS."""
        if self.state.state != GangStatus.RENDEZVOUS:
            return
        once = threading.Lock()  # the dask thread and this one may both see it settle

        def settled(event: Any) -> None:
            if isinstance(event, GangState) and event.state != GangStatus.RENDEZVOUS:
                if not once.acquire(blocking=False):
                    return
                unsubscribe()
                self.state.apply(event)
                self._draw({"header", "summary"})
                self._show_final()

        core = gang.core
        unsubscribe = core.hub.subscribe(settled)
        if core.status != GangStatus.RENDEZVOUS:  # it settled before we listened
            settled(GangState(core.status, core.detail))

    # ---- drawing thread
    def _loop(self) -> None:
        delay = FRAME_S
        while not self._stop.wait(delay):
            self._pending.update(dict.fromkeys(sorted(self.state.take_dirty())))
            if time.monotonic() - self._drawn_at >= 1.0:
                self._pending["header"] = None  # the elapsed time ticks
            part = self._next_part()
            sent = self._draw({part}) if part else 0
            delay = max(FRAME_S, sent / BYTES_PER_S)

    def _next_part(self) -> str | None:
        """The part to redraw in this frame: the header first (state, elapsed time), then the
        part that has waited longest; the GPU panel only when its share of the budget allows."""
        due = [p for p in self._pending if p != "gpu" or time.monotonic() >= self._gpu_due]
        if not due:
            return None
        part = "header" if "header" in due else due[0]
        del self._pending[part]
        return part

    def _draw(self, dirty: set[str]) -> int:
        """Redraw the parts named in ``dirty``; return the bytes it sent."""
        if not dirty:
            return 0
        with self._draw_lock, self.state.lock:
            changes: list[tuple[W.HTML, str]] = []
            if "header" in dirty:
                changes.append((self._header, self._header_html()))
                self._drawn_at = time.monotonic()
            for node, widget in enumerate(self._logs):
                if f"log{node}" in dirty:
                    changes.append((widget, self._log_html(node)))
            if "gpu" in dirty:
                gpus = gpu_html(self.state)
                changes.append((self._gpu, gpus))
                self._gpu_due = time.monotonic() + max(1.0, len(gpus) / GPU_BYTES_PER_S)
            if "transport" in dirty:
                changes.append((self._transport, transport_html(self.state)))
            if "summary" in dirty:
                changes.append((self._notes, self._notes_html()))
        sent = 0
        for widget, value in changes:
            if widget.value != value:
                widget.value = value
                sent += len(value)
                self.updates += 1
        self.sent_bytes += sent
        return sent

    def _header_html(self) -> str:
        state = self.state
        label = state.label
        color = _STATE_COLORS.get(state.state, "#5f6368")
        if label != state.state:  # paused at a breakpoint, or preempting
            color = _WAITING_COLOR
        if state.done is not None:  # the cell's outcome in its colour; the gang's state after it
            label, color = state.done.outcome, _OUTCOME_COLORS[state.done.outcome]
        text = html.escape(header(state))
        badge = f'<b style="color:{color}" class="jp-mn-state">{html.escape(label)}</b>'
        waiting = "".join(f"<li>{html.escape(line)}</li>" for line in state.waiting_lines())
        hung = html.escape(state.hung)
        return (
            f'<span class="jp-mn-header">{text.replace(html.escape(label), badge, 1)}</span>'
            + (f'<ul class="jp-mn-waiting">{waiting}</ul>' if waiting else "")
            + (f'<div class="jp-mn-alarm jp-mn-hung">HUNG: {hung}</div>' if hung else "")
        )

    def _log_html(self, node: int) -> str:
        """The node's lines under a ``node N · 12 lines`` heading; nothing while it has none."""
        log, failing = self.state.logs[node], self.state.failing
        if not log.shown:
            return ""
        lines = log.lines
        live = "".join(  # progress bars: redrawn in place, last
            f'<span class="jp-mn-live{" jp-mn-failing" if rank in failing else ""}" '
            f'data-rank="{rank}">[rank {rank}] {html.escape(text)}</span>'
            for rank, _stream, text in log.live
        )
        kept = len(lines) + len(log.live)
        count = f"last {kept} of {log.shown} lines" if log.shown > kept else counted(kept, "line")
        body = rank_runs(lines, failing) + live
        has = " jp-mn-hasfailing" if any(r in failing for r in log.ranks) else ""
        return (
            f'<div class="jp-mn-nodelog{has}" data-node="{node}">'
            f'<div class="jp-mn-nodehead">node {node} · {count}</div>'
            f'<div class="jp-mn-log"><pre data-node="{node}">{body}</pre></div></div>'
        )

    def _notes_html(self) -> str:
        notices = "".join(f"<pre>{html.escape(text)}</pre>" for text in self.state.notices)
        if (stacks := self.state.stacks) is not None:  # folded: the verdict is in the header
            text = html.escape(format_stacks(stacks, verdict=not self.state.hung))
            why = html.escape(stacks.reason)
            notices += (
                f'<details class="jp-mn-stacks"><summary>where each rank is ({why})</summary>'
                f"<pre>{text}</pre></details>"
            )
        done = self.state.done
        if done is None:
            return f'<div class="jp-mn-notes">{notices}</div>' if notices else ""
        if not self.state.notable():  # a cell with nothing to report: its header says it all
            return f'<div class="jp-mn-notes">{notices}</div>' if notices else ""
        items = "".join(f"<li><b>{html.escape(line)}</b></li>" for line in hints(done.ranks))
        table = html.escape("\n".join(rank_table(done)))
        return (
            f'<div class="jp-mn-notes">{notices}<ul>{items}</ul><details><summary>per-rank times'
            f"</summary><pre>{table}</pre></details></div>"
        )
