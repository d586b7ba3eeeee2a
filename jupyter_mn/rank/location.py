"""Where a rank's code is, in the notebook's own terms (``Cell In[5], line 3``).

Used for two things: the stack of a rank that hangs (asked for from the control thread while the
main thread is busy or blocked in a collective), and the one-line location of a secondary error
(a peer went away), which needs no full traceback.
"""

from __future__ import annotations

import re
import sys
import threading
import traceback
from typing import Any

_SITE = "site-packages/"
#: A cell's frame as ``faulthandler`` prints it (IPython names cells ``<ipython-input-N-hash>``).
_CRASH_FRAME = re.compile(r'File "<ipython-input-(\d+)-[0-9a-f]+>", line (\d+)')
CRASH_START = "Fatal Python error:"


def where(entries: list[traceback.FrameSummary], shell: Any, cells_only: bool = False) -> list[str]:
    """Format frames from the first cell frame on (the runtime and IPython above it are noise).

    ``cells_only``: skip library frames too (reading torch's sources costs a loaded core ~0.1 s).
    """
    names = [shell.compile.format_code_name(e.filename) for e in entries]
    first = next((i for i, name in enumerate(names) if name), None)
    if first is None:
        return []
    lines = []
    for entry, name in zip(entries[first:], names[first:], strict=True):
        if cells_only and not name:
            continue
        if name:
            lines.append(f"{name[0]} {name[1]}, line {entry.lineno}")
        else:
            path = entry.filename
            path = path.split(_SITE, 1)[1] if _SITE in path else path
            lines.append(f"File {path}:{entry.lineno}, in {entry.name}")
        if entry.line:
            lines.append(f"    {entry.line.strip()}")
    return lines


def main_thread(shell: Any) -> list[str]:
    """The main thread's stack (the cell's part of it); empty when it runs no cell code."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None:
        return []
    return where(traceback.extract_stack(frame), shell)


def raised_at(tb: Any, shell: Any) -> list[str]:
    """The cell lines an exception passed through, cheaply (no context, no library frames)."""
    entries = traceback.StackSummary.extract(traceback.walk_tb(tb), lookup_lines=False)
    return where(list(entries), shell, cells_only=True)


def crash_summary(report: list[str]) -> list[str]:
    """A ``faulthandler`` report (innermost frame first) cut to its error and the cell lines."""
    if not report:
        return []
    cells = [m for line in report if (m := _CRASH_FRAME.search(line))]
    return [report[0], *(f"  at Cell In[{m[1]}], line {m[2]}" for m in cells)]
