"""Views: how a cell's events are shown — a widget where a frontend renders widgets, else text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..model.spec import ClusterSpec
from .displays import RankDisplays
from .text import TextView

if TYPE_CHECKING:
    from ..gang.base import Gang
    from .widget import ClusterWidget

__all__ = ["TextView", "View", "background_view", "make_view", "widgets_rendered"]


class View(Protocol):
    """What shows a cell: called with each of its events on the kernel's main thread."""

    #: rank 0's displays, shown while the cell runs (None: they stay on the result)
    displays: RankDisplays | None
    #: the hang verdict is on screen: the cell's error below it does not say it again
    verdict_shown: bool

    def __call__(self, event: Any) -> None: ...

    def follow(self, gang: Gang) -> None:
        """After the cell: keep showing the gang's state while it re-forms in the background."""

    def close(self) -> None:
        """The cell has ended: stop drawing."""


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


def _widget_chosen(spec: ClusterSpec) -> bool:
    """``spec.view`` asks for the widget (``auto``: where one is rendered)."""
    return spec.view == "widget" or (spec.view == "auto" and widgets_rendered())


def make_view(spec: ClusterSpec, title: str = "cell", cell_id: int | None = None) -> View:
    """The view ``spec.view`` asks for (``auto``: widget if rendered, else text); ``cell_id``:
    the notebook cell it shows, which a page reloaded meanwhile finds the job by."""
    if _widget_chosen(spec):
        from .widget import ClusterWidget

        return ClusterWidget(spec, title, cell_id)
    return TextView(spec=spec, title=title)


def background_view(spec: ClusterSpec, title: str, cell_id: int) -> ClusterWidget | None:
    """A ``--bg`` cell's live view, where ``make_view`` would choose the widget (None: its
    handle's text is its view)."""
    if not _widget_chosen(spec):
        return None
    from .widget import ClusterWidget

    return ClusterWidget(spec, title, cell_id, background=True)
