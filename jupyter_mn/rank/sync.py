"""What a rank does before each reply: flush Python's buffers into its pipes. The agent reads the
pipes to empty when the reply arrives (``node/pipes.py``, ``catch_up``), so no line of the cell
arrives after its result."""

from __future__ import annotations

import contextlib
import sys


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
