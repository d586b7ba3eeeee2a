"""What a Kubernetes driver pod's log carries: the one channel out of the pod that every
cluster keeps, that its submitter reads through the API server (``pods/log``) and that holds no
object of its own (a ConfigMap caps at 1 MiB; ``kubectl cp`` needs ``pods/exec`` and a running
pod).

Its lines are the cells' output, as ``jupyter mn logs`` prints them, and records marked
``MARK``: the run's progress (a ``Progress``) and, after each save, the executed notebook
(gzip, base64), so the last such line is the notebook as far as it ran.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
from dataclasses import dataclass

MARK = "\x1ejupyter-mn "


@dataclass(frozen=True)
class Progress:
    state: str
    cells: int
    cells_total: int
    detail: str = ""
    error: str | None = None


def progress_line(progress: Progress) -> str:
    return f"{MARK}progress {json.dumps(dataclasses.asdict(progress))}"


def notebook_line(text: str) -> str:
    packed = base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()
    return f"{MARK}notebook {packed}"


@dataclass(frozen=True)
class PodLog:
    """A driver's log, read: its output lines, its last progress and last notebook."""

    lines: list[str]
    progress: Progress | None
    notebook: str | None

    @classmethod
    def parse(cls, text: str) -> PodLog:
        lines: list[str] = []
        progress, notebook = None, None
        for line in text.split("\n"):  # not splitlines: it splits at MARK's \x1e too
            if not line.startswith(MARK):
                lines.append(line)
                continue
            kind, _, value = line[len(MARK) :].partition(" ")
            if kind == "progress":
                progress = Progress(**json.loads(value))
            elif kind == "notebook":
                notebook = gzip.decompress(base64.b64decode(value)).decode()
        if lines and not lines[-1]:
            lines.pop()  # the text's final newline
        return cls(lines, progress, notebook)
