"""Rank 0's ``display()``, ``update_display`` and ``clear_output``, sent to its agent at once.

They are also kept for the cell's reply (the API's ``CellResult.displays``), and nothing is
printed for ``clear_output`` (IPython's default writes terminal escapes, which would land in the
logs). The agent batches what is sent and the kernel shows it in the running cell
(docs/architecture.md, "Progress bars and live output").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from IPython.core.displaypub import CapturingDisplayPublisher

from ..wire.events import DisplayOutput

#: matplotlib figures render as PNG without importing matplotlib up front (IPython's inline
#: default, registered by type name).
_FIGURE = ("matplotlib.figure", "Figure")


class LiveDisplayPublisher(CapturingDisplayPublisher):
    """Captures like IPython's, and hands each call to ``send`` when one is set (rank 0)."""

    send: Callable[[DisplayOutput], None] | None = None

    def publish(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        source: Any = None,
        *,
        transient: dict[str, Any] | None = None,
        update: bool = False,
    ) -> None:
        super().publish(data, metadata, source, transient=transient, update=update)
        if self.send is not None:
            self.send(
                DisplayOutput(
                    "update" if update else "display",
                    data,
                    metadata or {},
                    str((transient or {}).get("display_id", "")),
                )
            )

    def clear_output(self, wait: bool = False) -> None:
        self.outputs.clear()
        if self.send is not None:
            self.send(DisplayOutput("clear", wait=wait))


def figures_as_png(shell: Any) -> None:
    """Show a displayed matplotlib figure as a PNG, as a Jupyter kernel does."""
    from IPython.core.pylabtools import print_figure

    png = shell.display_formatter.formatters["image/png"]
    png.for_type_by_name(*_FIGURE, lambda fig: print_figure(fig, "png", bbox_inches="tight"))
