"""Whether a path is on a network file system: SQLite's WAL mode needs shared memory between
the processes that open the database, which NFS, GPFS, Lustre and their kin do not give across
hosts (a home directory on a cluster often is one), so the registry uses a rollback journal
there."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

#: File system types (as ``/proc/mounts`` names them) shared over a network.
NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "panfs",
        "wekafs",
    }
)


def on_network_fs(path: Path, mounts: Iterable[tuple[str, str]] | None = None) -> bool:
    """Whether ``path`` lies on a network file system, by the mount that holds it (the longest
    mount point above it). ``mounts``: (mount point, type) pairs; default, this machine's."""
    if mounts is None:
        import psutil

        mounts = [(p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True)]
    resolved = os.path.realpath(path)
    holding = [
        (len(point), kind)
        for point, kind in mounts
        if resolved == point or resolved.startswith(point.rstrip("/") + "/")
    ]
    return bool(holding) and max(holding)[1] in NETWORK_FS
