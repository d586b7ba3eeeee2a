"""``DoctorReport``: the ✔/✘ table (check × node) with a fix per ✘, as text or HTML.

Values and fixes are shown as text: in HTML they are escaped, never interpreted.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from .checks import Cell, Check


@dataclass
class DoctorReport:
    """The doctor's table; ``ok`` when no cell is ✘. Shown as text or as an HTML table."""

    target: str
    nodes: list[str]
    checks: list[Check]
    elapsed: float = 0.0
    facts: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def failures(self) -> list[tuple[str, int, Cell]]:
        """(check, node, cell) for every ✘."""
        return [
            (check.name, node, cell)
            for check in self.checks
            for node, cell in enumerate(check.cells)
            if cell.ok is False
        ]

    def summary(self) -> str:
        bad = self.failures()
        if not bad:
            return (
                f"{len(self.checks)} checks ✔ on {len(self.nodes)} node(s) in {self.elapsed:.1f} s"
            )
        where = ", ".join(f"{name} on node {node}" for name, node, _ in bad[:6])
        return f"{len(bad)} ✘ ({where}{', …' if len(bad) > 6 else ''})"

    def __str__(self) -> str:
        return render_text(self)

    def _repr_html_(self) -> str:
        return render_html(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(render_text(self))


MARKS = {True: "✔", False: "✘", None: "–"}
_WIDTH = 30


def _mark(cell: Cell) -> str:
    """The cell as text; what comes before a closing ``(…)`` (the variable that chose the value,
    shown whole) is cut to ``_WIDTH``."""
    text = f"{MARKS[cell.ok]} {cell.value}"
    head, paren, note = text.rpartition(" (")
    if not (paren and note.endswith(")")):
        head, note = text, ""
    if len(head) > _WIDTH:
        head = head[: _WIDTH - 1] + "…"
    return head + (f" ({note}" if note else "")


def render_text(report: DoctorReport) -> str:
    head = ["check", *report.nodes]
    rows = [head] + [[check.name, *(_mark(c) for c in check.cells)] for check in report.checks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        f"jupyter_mn doctor: {report.target} ({'ok' if report.ok else 'FAILED'}, "
        f"{report.elapsed:.1f} s)",
    ]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    for name, node, cell in report.failures():
        lines.append(f"✘ {name} on node {node}: {cell.fix}")
    return "\n".join(lines)


def render_html(report: DoctorReport) -> str:
    esc = html.escape
    color = {True: "#1a7f37", False: "#cf222e", None: "#6e7781"}
    head = "".join(f"<th>{esc(h)}</th>" for h in ["check", *report.nodes])
    rows = "".join(
        f"<tr><td>{esc(check.name)}</td>"
        + "".join(
            f'<td style="color:{color[c.ok]}">{MARKS[c.ok]} {esc(c.value)}</td>'
            for c in check.cells
        )
        + "</tr>"
        for check in report.checks
    )
    fixes = "".join(
        f"<li><b>{esc(name)}</b> on node {node}: {esc(cell.fix)}</li>"
        for name, node, cell in report.failures()
    )
    state = "ok" if report.ok else "FAILED"
    return (
        f"<div><p>jupyter_mn doctor: {esc(report.target)} ({state}, {report.elapsed:.1f} s)</p>"
        f"<table><tr>{head}</tr>{rows}</table>"
        + (f"<p>Fixes:</p><ul>{fixes}</ul>" if fixes else "")
        + "</div>"
    )
