"""The notebook's working directory as it travels to nodes: a manifest of files by content.

A leaf both sides import: the kernel lists the directory (``workdir.py``) and sends changes
(``gang/files.py``); a node agent keeps a copy (``node/files.py``). Files are addressed by a
digest of their content, so a node that holds a file's bytes already (an earlier gang, the
same file under another name) is sent only its name.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


def content_digest(data: bytes) -> str:
    """The name of a file's content in a node's cache."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def stamp(listing: Iterable[tuple[str, int, int]]) -> str:
    """A digest of ``(path, size, mtime_ns)`` rows: equal on a node that sees the same files
    (a shared filesystem keeps both), without reading their content."""
    h = hashlib.blake2b(digest_size=16)
    for path, size, mtime_ns in listing:
        h.update(f"{path}\0{size}\0{mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def stamp_here(root: str, paths: Iterable[str]) -> str | None:
    """``stamp`` of ``paths`` under ``root`` as this machine sees them (None: one is missing)."""
    rows = []
    for path in paths:
        try:
            st = os.stat(os.path.join(root, path))
        except OSError:
            return None
        rows.append((path, st.st_size, st.st_mtime_ns))
    return stamp(rows)


def safe_path(path: str) -> str:
    """``path`` if it stays inside the directory it is relative to; else ValueError."""
    norm = posixpath.normpath(path)
    if norm != path or norm.startswith(("/", "../")) or norm in ("", ".", ".."):
        raise ValueError(f"not a relative path inside the directory: {path!r}")
    return path


@dataclass(frozen=True)
class FileEntry:
    """One file of the directory: where it goes, what it holds, whether it is executable."""

    path: str
    digest: str
    size: int
    executable: bool = False


@dataclass(frozen=True)
class FileUpdate:
    """What a node's copy of the directory needs to match the kernel's: files to place (their
    bytes for the digests the node lacked), paths to remove."""

    files: tuple[FileEntry, ...] = ()
    removed: tuple[str, ...] = ()
    blobs: Mapping[str, bytes] = field(default_factory=dict)


def changes(
    old: Mapping[str, FileEntry], new: Mapping[str, FileEntry]
) -> tuple[tuple[FileEntry, ...], tuple[str, ...]]:
    """The entries of ``new`` that ``old`` lacks or holds with other content, and the paths
    ``new`` no longer has (both by path, in path order)."""
    placed = tuple(e for path, e in sorted(new.items()) if old.get(path) != e)
    removed = tuple(sorted(set(old) - set(new)))
    return placed, removed
