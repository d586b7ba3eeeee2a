"""The log tabs' rank filter, done in the browser: choosing a rank costs no kernel round trip and
no IOPub byte.

A node's log is drawn as runs of one rank's consecutive lines, each run a block tagged with its
rank (about 30 bytes a run, not a line). The filter is a ``<select>`` per node tab whose choice
stays in the browser (never synced to the kernel, which is busy running the cell anyway); it
writes one CSS rule that hides the other ranks' runs inside its own tab, so it also holds for
every later redraw of the log without a script watching it.
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
    const ranks = model.get("ranks");
    if (ranks.length < 2) { return; }
    const label = document.createElement("label");
    label.className = "jp-mn-filter";
    label.textContent = "show ";
    const select = document.createElement("select");
    select.add(new Option("all ranks", ""));
    for (const rank of ranks) { select.add(new Option("rank " + rank, String(rank))); }
    const style = document.createElement("style");
    const scope = "f" + Math.random().toString(36).slice(2);
    select.addEventListener("change", () => {
      const tab = el.closest(".jp-mn-node");
      if (!tab) { return; }
      tab.setAttribute("data-mn-filter", scope);
      const rank = select.value;  // one of the options above: digits or ""
      style.textContent = rank === "" ? "" :
        `[data-mn-filter="${scope}"] [data-rank]:not([data-rank="${rank}"]) { display: none; }`;
    });
    label.appendChild(select);
    el.append(label, style);
  }
};
"""

#: The log box is a flex column; each run is a block, so a hidden run leaves no empty line.
FILTER_STYLE = "<style>.jp-mn-log pre > span[data-rank] { display: block; }</style>"


class RankFilter(anywidget.AnyWidget):
    """All ranks or one: a ``<select>`` over a node tab's ranks (nothing shown for one rank)."""

    _esm = FILTER_ESM
    ranks = traitlets.List(traitlets.Int()).tag(sync=True)


def node_ranks(node: int, gpus: int, shown: Iterable[int] = ()) -> list[int]:
    """The global ranks of ``node`` (``node × gpus + local``), only those ``--ranks`` shows."""
    keep = set(shown)
    return [r for r in range(node * gpus, (node + 1) * gpus) if not keep or r in keep]


def rank_runs(lines: Iterable[tuple[int, str, str]]) -> str:
    """``(rank, stream, text)`` lines as tagged runs: ``<span data-rank=R>`` per run of one rank
    and stream (stderr in red); every line labelled ``[rank R]`` and escaped (text, not HTML)."""
    runs = []
    for (rank, stream), group in groupby(lines, key=lambda line: (line[0], line[1])):
        body = "\n".join(f"[rank {rank}] {html.escape(text)}" for _, _, text in group)
        err = ' class="jp-mn-err"' if stream == "err" else ""
        runs.append(f'<span data-rank="{rank}"{err}>{body}</span>')
    return "".join(runs)
