"""A small real filesystem that can be filled up (a tmpfs), for disk-full tests."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(parent: Path, size: str = "256k") -> Iterator[Path]:
    """Mount a tmpfs of ``size`` on a fresh directory under ``parent``; always unmounted."""
    where = parent / f"tmpfs-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mount.stderr.strip()}")
    try:
        yield where
    finally:
        # lazily if a file is still open in it (a thread of the test's process holding it)
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its filesystem is full; returns the file."""
    path = directory / "filler"
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return path
