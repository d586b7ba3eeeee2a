"""What a Kubernetes driver pod's log carries: the one channel out of the pod that every
cluster keeps, that its submitter reads through the API server (``pods/log``) and that holds no
object of its own (a ConfigMap or a Secret caps at 1 MiB; ``kubectl cp`` needs ``pods/exec``
and a running pod).

Its lines are the cells' output, as ``jupyter mn logs`` prints them, and records marked
``MARK``: the run's progress (a ``Progress``) and, after each save, the executed notebook, so
the last such record is the notebook as far as it ran. Every record is sealed with the run's
key (Fernet: AES with an HMAC, ``cryptography``), which the submitter makes and keeps in its
private registry and gives the driver in the run's Secret (``driverref.py``, ``kuberun.py``).
So a reader of the namespace's pod logs (Kubernetes' ``view`` role, a log shipper) reads the
cells' output but neither the notebook nor its parameters, and a line the notebook itself
prints, shaped like a record, is no record: it fails the HMAC and reads as the output line it
is. Nothing in a log, however malformed, makes ``parse`` raise.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from dataclasses import dataclass
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

MARK = "\x1ejupyter-mn "


@dataclass(frozen=True)
class Progress:
    state: str
    cells: int
    cells_total: int
    detail: str = ""
    error: str | None = None


def new_key() -> str:
    """A fresh key for one run's records."""
    return Fernet.generate_key().decode()


def progress_line(key: str, progress: Progress) -> str:
    return _sealed(key, {"progress": dataclasses.asdict(progress)})


def notebook_line(key: str, text: str) -> str:
    return _sealed(key, {"notebook": text})


def _sealed(key: str, record: dict[str, Any]) -> str:
    packed = gzip.compress(json.dumps(record).encode(), mtime=0)
    return MARK + Fernet(key.encode()).encrypt(packed).decode()


def _opened(key: str, line: str) -> tuple[Progress | None, str | None] | None:
    """The record ``line`` holds, or None when it is none of this run's (forged, malformed)."""
    try:
        record = json.loads(gzip.decompress(Fernet(key.encode()).decrypt(line[len(MARK) :])))
        if not isinstance(record, dict):
            return None
        if "progress" in record:
            return Progress(**record["progress"]), None
        if isinstance(record.get("notebook"), str):
            return None, record["notebook"]
    except (InvalidToken, ValueError, TypeError, OSError):  # OSError: gzip's BadGzipFile
        pass
    return None


@dataclass(frozen=True)
class PodLog:
    """A driver's log, read: its output lines, its last progress and last notebook."""

    lines: list[str]
    progress: Progress | None
    notebook: str | None

    @classmethod
    def parse(cls, text: str, key: str) -> PodLog:
        lines: list[str] = []
        progress, notebook = None, None
        for line in text.split("\n"):  # not splitlines: it splits at MARK's \x1e too
            record = _opened(key, line) if line.startswith(MARK) else None
            if record is None:
                lines.append(line)
                continue
            progress = record[0] or progress
            notebook = record[1] if record[1] is not None else notebook
        if lines and not lines[-1]:
            lines.pop()  # the text's final newline
        return cls(lines, progress, notebook)
