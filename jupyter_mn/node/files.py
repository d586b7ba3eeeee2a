"""A node's copy of the notebook's working directory, for nodes that do not see it.

The copy is a directory of the gang (removed with it): the ranks' working directory, so first
on their ``sys.path``. Files arrive by content (``manifest.py``) into a cache that outlives the
gang, so a second gang, or a file edited back, moves no bytes: only names.

The cache runs code as its user, so it trusts nothing it did not make: its folder is
``jupyter-mn-files-<uid>`` in ``JUPYTER_MN_FILE_CACHE`` (never that directory itself: only the
cache's own names are ever trimmed), else ``~/.cache/jupyter_mn/files``, else
``jupyter-mn-files-<uid>`` in the temporary directory (where the home is not writable, as in many
pods); the first that is a directory (not a link) owned by this user and writable by no one else
(made 0700), else a private ``mkdtemp``. It is used through one open descriptor, so a folder
renamed or replaced after the check is not followed; a cached content is hashed again before it
is placed, and one that no longer matches its digest is dropped and sent again.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from ..wire.manifest import FileUpdate, content_digest, safe_path, stamp_here

log = logging.getLogger("jupyter_mn.agent")

CACHE_ENV = "JUPYTER_MN_FILE_CACHE"
#: The most bytes the cache keeps: the contents used longest ago go first ...
CACHE_LIMIT = 2 << 30
#: ... but none used within this many seconds (another gang may be about to place it).
KEPT_S = 600.0
#: Free bytes an update must leave on the cache's and the copy's filesystems.
DISK_RESERVE = 64 << 20
#: What ``content_digest`` names: nothing else names a file in the cache.
_DIGEST = re.compile(r"[0-9a-f]{32}")
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The private cache of this process, where no shared place could be trusted.
_private: Path | None = None


class UntrustedCache(OSError):
    """A place for the cache that another user could write, or that is not a directory."""


def sees(root: str, paths: Iterable[str], expected: str) -> bool:
    """Whether this node sees the kernel's directory ``root`` itself: the same files at the
    same path, with the same sizes and times (a shared filesystem), owned by this user (or
    root) and not writable by every user: a look-alike tree someone else made in a shared
    place (``/tmp/proj``) is not run."""
    paths = list(paths)
    if not os.path.isdir(root):
        return False
    for path in ("", *paths):
        try:
            st = os.stat(os.path.join(root, path))
        except OSError:
            return False
        if st.st_uid not in (os.getuid(), 0) or st.st_mode & 0o002:
            return False
    return stamp_here(root, paths) == expected


def check_digest(digest: str) -> str:
    """``digest`` if ``content_digest`` could have made it; else ValueError (it names a file)."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"not a content digest: {str(digest)[:80]!r}")
    return digest


def cache_places() -> list[Path]:
    """Where the cache may be, in order of preference."""
    own = f"jupyter-mn-files-{os.getuid()}"
    chosen = os.environ.get(CACHE_ENV)
    places = [Path(chosen) / own] if chosen else []
    return [
        *places,
        Path.home() / ".cache" / "jupyter_mn" / "files",
        Path(tempfile.gettempdir()) / own,
    ]


def open_trusted(path: Path) -> int:
    """A descriptor of the directory ``path``, made 0700 if absent; ``UntrustedCache`` unless it
    is a directory (not a link) owned by this user that no other user may write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, _OPEN | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UntrustedCache(f"{path}: a link or not a directory") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        os.close(fd)
        raise UntrustedCache(f"{path}: owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}")
    return fd


def open_cache() -> tuple[Path, int]:
    """The cache's folder and a descriptor of it: the first trusted place (``cache_places``),
    else a private temporary folder for this process (removed when it exits)."""
    global _private
    refused = []
    for path in cache_places():
        try:
            return path, open_trusted(path)
        except OSError as exc:
            refused.append(str(exc))
    if _private is None:
        _private = Path(tempfile.mkdtemp(prefix=f"jupyter-mn-files-{os.getuid()}-"))
        atexit.register(shutil.rmtree, _private, ignore_errors=True)
        log.warning(
            "file cache: none of its places can be trusted (%s); using %s until this process exits",
            "; ".join(refused),
            _private,
        )
    return _private, os.open(_private, _OPEN | os.O_DIRECTORY)


class NodeFiles:
    """This gang's copy of the directory on this node, and the node's cache of contents."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._folder: str | None = None
        self._cache: tuple[Path, int] | None = None

    @property
    def folder(self) -> str:
        """The copy (made on first use: the ranks' working directory)."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix=f"jupyter-mn-copy-{self.job}-")
        return self._folder

    @property
    def cache(self) -> Path:
        """The cache's folder, as it was when it was opened (``open_cache``)."""
        return self._opened()[0]

    def _opened(self) -> tuple[Path, int]:
        if self._cache is None:
            self._cache = open_cache()
        return self._cache

    @property
    def _fd(self) -> int:
        return self._opened()[1]

    def missing(self, digests: Iterable[str]) -> list[str]:
        """The contents among ``digests`` this node does not hold intact (those it holds count as
        used now: they are the last to leave the cache; one altered is dropped)."""
        lacking = []
        for digest in map(check_digest, digests):
            held = self._read(digest)
            if held is None:
                lacking.append(digest)
                continue
            os.utime(digest, dir_fd=self._fd, follow_symlinks=False)
        return lacking

    def _read(self, digest: str) -> bytes | None:
        """The cached content ``digest``; None where it is absent, not this user's regular file,
        or no longer matches its digest (then it is dropped)."""
        try:
            fd = os.open(digest, _OPEN, dir_fd=self._fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ELOOP):
                raise
            if exc.errno == errno.ELOOP:
                self._drop(digest)
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            ours = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
            data = f.read() if ours else b""
        if ours and content_digest(data) == digest:
            return data
        self._drop(digest)
        return None

    def _drop(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(digest, dir_fd=self._fd)

    def apply(self, update: FileUpdate) -> None:
        """Make the copy match: new contents into the cache, files placed from it (each one
        hashed again), removed paths deleted. ValueError for a name that is no digest or no
        path inside the copy, a content that does not match its digest or the size of the entry
        naming it, or an update the disks cannot hold (``DISK_RESERVE``)."""
        self._check(update)
        for digest, data in update.blobs.items():
            self._keep(digest, data)
        folder = Path(self.folder)
        for entry in update.files:
            data = update.blobs.get(entry.digest)
            if data is None:
                data = self._read(entry.digest)
            if data is None:
                raise ValueError(
                    f"{entry.path}: its content {entry.digest} left this node's cache, or was "
                    "altered, after the kernel asked; it is sent again with the next cell"
                )
            target = folder / safe_path(entry.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.jupyter-mn")
            partial.write_bytes(data)  # a copy: ranks may edit theirs
            partial.chmod(0o755 if entry.executable else 0o644)
            partial.replace(target)  # a rank importing meanwhile reads the old or the new file
        for path in update.removed:
            with contextlib.suppress(FileNotFoundError):
                (folder / safe_path(path)).unlink()
        if update.blobs:
            self._trim()

    def _check(self, update: FileUpdate) -> None:
        """Refuse an update that is malformed or that the disks cannot hold, before any byte
        of it is written."""
        sizes = {}
        for entry in update.files:
            safe_path(entry.path)
            sizes[check_digest(entry.digest)] = entry.size
        for digest, data in update.blobs.items():
            if content_digest(data) != check_digest(digest):
                raise ValueError(f"a file's content does not match its digest {digest}")
            if sizes.get(digest, len(data)) != len(data):
                raise ValueError(f"the content {digest} is not the size its file was listed with")
        _room(self.cache, sum(len(data) for data in update.blobs.values()))
        _room(Path(self.folder), sum(e.size for e in update.files))

    def _trim(self) -> None:
        """Keep the cache within ``CACHE_LIMIT``: the contents used longest ago go first. Only
        the cache's own names (digests) are looked at."""
        held = []
        with os.scandir(self._fd) as entries:
            for entry in entries:
                if not _DIGEST.fullmatch(entry.name):
                    continue
                with contextlib.suppress(FileNotFoundError):  # another gang's trim took it
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        held.append((st.st_mtime, st.st_size, entry.name))
        total = sum(size for _, size, _ in held)
        recent = time.time() - KEPT_S
        for used, size, name in sorted(held):
            if total <= CACHE_LIMIT or used > recent:
                return
            self._drop(name)
            total -= size

    def _keep(self, digest: str, data: bytes) -> None:
        if self._read(digest) is not None:
            return
        partial = f".{digest}.{os.getpid()}.{time.monotonic_ns()}"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600, dir_fd=self._fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(partial, digest, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except BaseException:  # a full disk: no partial file is left (trimming skips its name)
            self._drop(partial)
            raise

    def remove(self) -> None:
        """The gang is over: its copy goes (the cache stays for the next gang)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        cache, self._cache = self._cache, None
        if cache is not None:
            os.close(cache[1])


def _room(where: Path, incoming: int) -> None:
    """ValueError unless ``incoming`` more bytes leave ``DISK_RESERVE`` free under ``where``."""
    if not incoming:
        return
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    if incoming + DISK_RESERVE > free:
        raise ValueError(
            f"{incoming} bytes of files would not fit in {where} ({free} bytes free, "
            f"{DISK_RESERVE} kept free)"
        )
