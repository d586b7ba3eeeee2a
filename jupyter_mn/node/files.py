"""A node's copy of the notebook's working directory, for nodes that do not see it.

The copy is a directory of the gang (removed with it): the ranks' working directory, so first
on their ``sys.path``. Files arrive by content (``manifest.py``) into a cache that outlives the
gang, so a second gang, or a file edited back, moves no bytes: only names. The cache is
``JUPYTER_MN_FILE_CACHE``, else ``~/.cache/jupyter_mn/files`` (the temporary directory where the
home is not writable, as in many pods).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from ..wire.manifest import FileUpdate, content_digest, safe_path, stamp_here

CACHE_ENV = "JUPYTER_MN_FILE_CACHE"
#: The most bytes the cache keeps: the contents used longest ago go first ...
CACHE_LIMIT = 2 << 30
#: ... but none used within this many seconds (another gang may be about to place it).
KEPT_S = 600.0


def sees(root: str, paths: Iterable[str], expected: str) -> bool:
    """Whether this node sees the kernel's directory ``root`` itself: the same files at the
    same path, with the same sizes and times (a shared filesystem)."""
    return os.path.isdir(root) and stamp_here(root, paths) == expected


def cache_dir() -> Path:
    """Where file contents are kept between gangs (made on first use)."""
    chosen = os.environ.get(CACHE_ENV)
    candidates = [Path(chosen)] if chosen else []
    candidates += [
        Path.home() / ".cache" / "jupyter_mn" / "files",
        Path(tempfile.gettempdir()) / f"jupyter-mn-files-{os.getuid()}",
    ]
    for path in candidates:
        with contextlib.suppress(OSError):
            path.mkdir(parents=True, exist_ok=True)
            if os.access(path, os.W_OK):
                return path
    raise OSError(f"no writable place for the file cache (tried {', '.join(map(str, candidates))})")


class NodeFiles:
    """This gang's copy of the directory on this node, and the node's cache of contents."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._folder: str | None = None
        self._cache: Path | None = None

    @property
    def folder(self) -> str:
        """The copy (made on first use: the ranks' working directory)."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix=f"jupyter-mn-{self.job}-")
        return self._folder

    @property
    def cache(self) -> Path:
        if self._cache is None:
            self._cache = cache_dir()
        return self._cache

    def missing(self, digests: Iterable[str]) -> list[str]:
        """The contents among ``digests`` this node does not hold yet (those it holds count as
        used now: they are the last to leave the cache)."""
        lacking = []
        for digest in digests:
            try:
                os.utime(self.cache / digest)
            except FileNotFoundError:
                lacking.append(digest)
        return lacking

    def apply(self, update: FileUpdate) -> None:
        """Make the copy match: new contents into the cache, files placed from it, removed
        paths deleted."""
        for digest, data in update.blobs.items():
            if content_digest(data) != digest:
                raise ValueError(f"a file's content does not match its digest {digest}")
            self._keep(digest, data)
        folder = Path(self.folder)
        for entry in update.files:
            target = folder / safe_path(entry.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.jupyter-mn")
            shutil.copyfile(self.cache / entry.digest, partial)  # a copy: ranks may edit theirs
            partial.chmod(0o755 if entry.executable else 0o644)
            partial.replace(target)  # a rank importing meanwhile reads the old or the new file
        for path in update.removed:
            with contextlib.suppress(FileNotFoundError):
                (folder / safe_path(path)).unlink()
        if update.blobs:
            self._trim()

    def _trim(self) -> None:
        """Keep the cache within ``CACHE_LIMIT``: the contents used longest ago go first."""
        held = []
        for path in self.cache.iterdir():
            with contextlib.suppress(FileNotFoundError):  # another gang's trim took it
                st = path.stat()
                held.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in held)
        recent = time.time() - KEPT_S
        for used, size, path in sorted(held):
            if total <= CACHE_LIMIT or used > recent:
                return
            path.unlink(missing_ok=True)
            total -= size

    def _keep(self, digest: str, data: bytes) -> None:
        target = self.cache / digest
        if target.is_file():
            return
        fd, partial = tempfile.mkstemp(dir=self.cache, prefix=f".{digest}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(partial, target)

    def remove(self) -> None:
        """The gang is over: its copy goes (the cache stays for the next gang)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
