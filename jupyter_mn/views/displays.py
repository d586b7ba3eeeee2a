"""Rank 0's display outputs, shown in the running cell while it runs.

The cell's own output holds the view (the widget, or the text view's lines), so a rank's
``clear_output`` must not clear the cell. Each rank display gets a slot instead: a display of
its own with a kernel-made ``display_id``. A ``clear`` frees the slots and the next displays
are drawn into them again (``update_display_data``), so a plot redrawn with
``clear_output(wait=True); display(fig)`` redraws in place rather than piling up; freed slots
that nothing reuses are blanked (docs/architecture.md, "Progress bars and live output").
"""

from __future__ import annotations

import uuid
from typing import Any

from ..wire.events import DisplayOutput, Displays

_BLANK = {"text/plain": ""}


class RankDisplays:
    """Shows ``Displays`` events in the running cell (call it on the kernel's main thread)."""

    def __init__(self) -> None:
        self._slots: list[str] = []
        #: slots drawn since the last clear, and slots that hold something
        self._used = 0
        self._filled = 0
        #: a ``clear_output(wait=True)`` waits for the next output to blank the rest
        self._waiting = False
        #: the rank's display ids → the slots showing them
        self._ids: dict[str, list[str]] = {}
        #: something was shown (the cell's final displays need not be shown again)
        self.shown = False

    def __call__(self, event: Displays) -> None:
        publish = _publisher()
        if publish is None:  # not in IPython: the API's CellResult.displays has them
            return
        for out in event.outputs:
            self._apply(out, publish)
        if not self._waiting and self._filled > self._used:
            for slot in self._slots[self._used : self._filled]:
                publish(_BLANK, {}, transient={"display_id": slot}, update=True)
            self._filled = self._used

    def _apply(self, out: DisplayOutput, publish: Any) -> None:
        if out.kind == "clear":
            self._used, self._ids, self._waiting = 0, {}, out.wait
        elif out.kind == "update":
            for slot in self._ids.get(out.display_id, ()):
                publish(out.data, out.metadata, transient={"display_id": slot}, update=True)
        else:
            self._waiting = False
            if self._used < len(self._slots):
                slot = self._slots[self._used]
                publish(out.data, out.metadata, transient={"display_id": slot}, update=True)
            else:
                slot = f"jupyter-mn-{uuid.uuid4().hex}"
                self._slots.append(slot)
                publish(out.data, out.metadata, transient={"display_id": slot})
            self._used += 1
            self._filled = max(self._filled, self._used)
            self.shown = True
            if out.display_id:
                self._ids.setdefault(out.display_id, []).append(slot)


def _publisher() -> Any:
    """The running IPython's display publisher, or None outside IPython."""
    from IPython.core.interactiveshell import InteractiveShell

    if not InteractiveShell.initialized():
        return None
    return InteractiveShell.instance().display_pub.publish
