"""An executed notebook written whole: a fresh private file (0600) in the target's directory,
renamed over the target.

A reader meanwhile (``fetch``, the panel) sees the old text or the new, never half of one. And
the rename replaces whatever is at the path rather than writing through it: a symbolic link that
another user placed at ``-o /tmp/out.ipynb`` is replaced, its target untouched, and a file of
theirs in a sticky directory (``/tmp``) cannot be renamed over (``PermissionError``), so the
notebook, which holds the run's parameters, never lands in a file someone else can read.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
