"""Views: how a cell's events are shown — a widget where a frontend renders widgets, else text."""

from __future__ import annotations

from typing import Any

from ..spec import ClusterSpec
from .text import TextView

__all__ = ["TextView", "make_view", "widgets_rendered"]


def widgets_rendered() -> bool:
    """A frontend that renders ipywidgets is attached to this kernel.

    JupyterLab, Notebook 7 and VS Code open ipywidgets' ``jupyter.widget.control`` comm when
    they connect; papermill, nbclient and terminals never do.
    """
    try:
        from ipywidgets import Widget
    except ImportError:
        return False
    return getattr(Widget, "_control_comm", None) is not None


def make_view(spec: ClusterSpec, title: str = "cell") -> Any:
    """The view ``spec.view`` asks for (``auto``: widget if rendered, else text)."""
    choice = spec.view
    if choice == "auto":
        choice = "widget" if widgets_rendered() else "text"
    if choice == "widget":
        from .widget import ClusterWidget

        return ClusterWidget(spec, title)
    return TextView(spec=spec, title=title)
