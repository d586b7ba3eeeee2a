"""The log filter, done in the browser: every rank's lines are in view by default; choosing a
node or a rank costs no kernel round trip and no IOPub byte.

A node's log is drawn as runs of one rank's consecutive lines, each run a block tagged with its
rank (about 30 bytes a run, not a line), inside a block tagged with its node. The filter is a row
of buttons, ``all`` (the default) then one per node, and a ``<select>`` over the chosen node's
ranks; it writes one CSS rule that hides the other nodes' and ranks' runs inside its own cell,
so it also holds for every later redraw of a log without a script watching it. A run of a rank
that failed (``jp-mn-failing``) is never hidden: the cause stays in view whatever is chosen.

The choice is the model's ``shown`` trait, saved like a tab's selection: every view of the
widget in the page shows the same filter, and the kernel gets it once the cell has ended.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from itertools import groupby

import anywidget
import traitlets

FILTER_ESM = """
export default {
  render({ model, el }) {
    const nodes = model.get("nodes");  // each node's shown ranks
    const row = document.createElement("div");
    row.className = "jp-mn-filter";
    const style = document.createElement("style");
    const scope = "f" + Math.random().toString(36).slice(2);
    const buttons = ["all", ...nodes.map((_, n) => "node " + n)].map((text, i) => {
      const b = document.createElement("button");
      b.className = "jp-mn-filterbutton";
      b.textContent = text;
      b.addEventListener("click", () => { model.set("shown", [i - 1, -1]); model.save_changes(); });
      return b;
    });
    const select = document.createElement("select");
    select.addEventListener("change", () => {
      model.set("shown", [model.get("shown")[0], Number(select.value)]);
      model.save_changes();
    });
    const hide = (node, rank) => {  // numbers from the model: -1 is "all"
      const keep = ":not(.jp-mn-failing)";
      const rules = [];
      if (node >= 0) {
        rules.push(`.jp-mn-nodelog:not([data-node="${node}"]):not(.jp-mn-hasfailing)`);
        rules.push(`.jp-mn-nodelog:not([data-node="${node}"]) [data-rank]${keep}`);
      }
      if (rank >= 0) {
        rules.push(`.jp-mn-nodelog:not(:has([data-rank="${rank}"])):not(.jp-mn-hasfailing)`);
        rules.push(`[data-rank]:not([data-rank="${rank}"])${keep}`);
      }
      return rules.map(r => `[data-mn-filter="${scope}"] ${r} { display: none; }`).join("\\n");
    };
    const sync = () => {
      const [node, rank] = model.get("shown").map(Number);
      buttons.forEach((b, i) => b.classList.toggle("jp-mod-active", i - 1 === node));
      const ranks = node >= 0 ? nodes[node] || [] : nodes.flat();
      select.replaceChildren(new Option("all ranks", "-1"),
        ...ranks.map(r => new Option("rank " + r, String(r))));
      select.value = String(ranks.includes(rank) ? rank : -1);
      select.style.display = ranks.length > 1 ? "" : "none";
      const cell = el.closest(".jp-mn-cell");
      if (cell) { cell.setAttribute("data-mn-filter", scope); }
      style.textContent = hide(node, ranks.includes(rank) ? rank : -1);
    };
    model.on("change:shown", sync);
    row.append(...(nodes.length > 1 ? buttons : []), select, style);
    el.appendChild(row);
    sync();
  }
};
"""

#: Each run is a block, so a hidden run leaves no empty line; the filter row shows only once
#: there are lines to filter, and an empty part of the widget takes no room.
FILTER_STYLE = """<style>
.jp-mn-log pre > span[data-rank] { display: block; }
.jp-mn-cell:not(:has(.jp-mn-nodelog)) .jp-mn-filter { display: none; }
.jp-mn-filter { display: flex; gap: 2px; align-items: center; font-size: 12px; }
.jp-mn-filterbutton { border: 1px solid var(--jp-border-color2, #ddd); padding: 0 8px;
  background: var(--jp-layout-color1, #fff); color: var(--jp-ui-font-color1, #222);
  cursor: pointer; line-height: 18px; }
.jp-mn-filterbutton.jp-mod-active { background: var(--jp-brand-color1, #1976d2); color: #fff; }
.jp-mn-cell .widget-html:has(> .widget-html-content:empty) { display: none; }
</style>"""


class LogFilter(anywidget.AnyWidget):
    """``all`` or one node, all ranks or one: buttons and a ``<select>`` over the cell's logs."""

    _esm = FILTER_ESM
    #: per node, the ranks whose lines it shows
    nodes = traitlets.List(traitlets.List(traitlets.Int())).tag(sync=True)
    #: (node, rank) chosen; -1 for all
    shown = traitlets.List(traitlets.Int(), default_value=[-1, -1]).tag(sync=True)


def node_ranks(node: int, gpus: int, shown: Iterable[int] = ()) -> list[int]:
    """The global ranks of ``node`` (``node × gpus + local``), only those ``--ranks`` shows."""
    keep = set(shown)
    return [r for r in range(node * gpus, (node + 1) * gpus) if not keep or r in keep]


def rank_runs(lines: Iterable[tuple[int, str, str]], failing: frozenset[int] = frozenset()) -> str:
    """``(rank, stream, text)`` lines as tagged runs: ``<span data-rank=R>`` per run of one rank
    and stream (stderr in red, a finished progress bar not), a failed rank's runs marked so no
    filter hides them; every line labelled ``[rank R]`` and escaped (text, not HTML)."""
    runs = []
    for (rank, stream), group in groupby(lines, key=lambda line: (line[0], line[1])):
        body = "\n".join(f"[rank {rank}] {html.escape(text)}" for _, _, text in group)
        classes = " ".join(
            c
            for c, on in (("jp-mn-err", stream == "err"), ("jp-mn-failing", rank in failing))
            if on
        )
        attr = f' class="{classes}"' if classes else ""
        runs.append(f'<span data-rank="{rank}"{attr}>{body}</span>')
    return "".join(runs)
