"""A second local user, for the tests that play an attacker on a shared host.

The user is made by the test (``useradd``), acted as with ``setpriv`` (its uid, its group, no
other groups) and removed however the test ends; the place it attacks is a directory every user
may write, as ``/tmp`` (mode 1777), removed with it. Needs root: elsewhere the test is skipped.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class OtherUser:
    """A local user who is not the one running the tests, and a shared place it can write."""

    name: str
    uid: int
    gid: int
    #: a directory every user may write (mode 1777, as ``/tmp``)
    shared: Path

    def sh(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``script`` run by ``sh`` as this user, in the shared directory."""
        argv = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        done = subprocess.run(
            [*argv, "sh", "-c", script],
            cwd=self.shared,
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"as {self.name}: {script!r}: {done.stderr.strip()}")
        return done


@contextlib.contextmanager
def other_user() -> Iterator[OtherUser]:
    """A throwaway local user and a world-writable directory; both gone afterwards."""
    if os.geteuid() != 0 or not (shutil.which("useradd") and shutil.which("setpriv")):
        pytest.skip("needs root, useradd and setpriv to play a second local user")
    name = f"jmn-other-{secrets.token_hex(4)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    shared = Path(tempfile.mkdtemp(prefix="jmn-shared-"))
    try:
        shared.chmod(0o1777)
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid, shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        subprocess.run(["userdel", name], check=False, capture_output=True)
