"""A submitted run's last cell, in the shape of a gang's ``last_cell`` (``kernel/recorder.py``),
so the panel and a run's View say how a run ended as they say how a cell did: its value (the
executed notebook's ``Out[]``), or its error with its traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..wire.events import CellOutcome
from .submit import counted_cell

#: Characters of a value or a traceback kept in the registry (the notebook keeps them whole).
TEXT_MAX = 8000


def succeeded(output: Path, elapsed: float) -> dict[str, Any] | None:
    """The executed notebook's last counted cell, DONE, with its ``Out[]`` as text (None: the
    notebook cannot be read, or no cell ran)."""
    import nbformat

    try:
        cells = [c for c in nbformat.read(output, as_version=4).cells if counted_cell(c)]
    except (OSError, ValueError):
        return None
    if not cells:
        return None
    results = [o for o in cells[-1].get("outputs", []) if o.get("output_type") == "execute_result"]
    value = results[-1].get("data", {}).get("text/plain", "") if results else ""
    return _cell(cells[-1].get("execution_count"), elapsed, CellOutcome.DONE, value=_cut(value))


def failed(error: Any, elapsed: float) -> dict[str, Any]:
    """The cell that raised (a ``PapermillExecutionError``), FAILED, with its traceback."""
    from papermill.exceptions import strip_color

    traceback = strip_color("\n".join(error.traceback))
    return _cell(
        error.exec_count,
        elapsed,
        CellOutcome.FAILED,
        error=f"{error.ename}: {error.evalue}",
        traceback=_cut(traceback),
    )


def _cell(number: Any, elapsed: float, outcome: CellOutcome, **texts: str) -> dict[str, Any]:
    return {"id": number or 0, "elapsed": elapsed, "outcome": outcome.value, **texts}


def _cut(text: Any) -> str:
    text = "".join(text) if isinstance(text, list) else str(text)
    return text if len(text) <= TEXT_MAX else "…" + text[-(TEXT_MAX - 1) :]
