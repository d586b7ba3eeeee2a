from pathlib import Path

from jupyter_mn.jobs.netfs import on_network_fs
from jupyter_mn.jobs.registry import Registry

MOUNTS = [
    ("/", "ext4"),
    ("/home", "nfs4"),
    ("/home/scratch", "xfs"),
    ("/gpfs", "gpfs"),
    ("/homework", "ext4"),
]


def test_the_mount_that_holds_a_path_decides():
    assert on_network_fs(Path("/home/alice/.local/share/jupyter/runtime"), MOUNTS)
    assert on_network_fs(Path("/gpfs/projects/x"), MOUNTS)
    assert not on_network_fs(Path("/home/scratch/alice"), MOUNTS)  # a local mount inside NFS
    assert not on_network_fs(Path("/homework/alice"), MOUNTS)  # a prefix, not a parent
    assert not on_network_fs(Path("/tmp"), MOUNTS)


def test_a_registry_on_a_local_disk_keeps_wal(tmp_path):
    assert not on_network_fs(tmp_path)  # this machine's own mount table
    registry = Registry(tmp_path / "reg")
    try:
        assert registry._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        registry.close()
