"""A node's file cache on a shared host: another local user (``otheruser.py``) cannot take it
over, swap what it holds or point it at the user's files, and the cache trims only its own."""

from __future__ import annotations

import os
import shlex
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_mn.node import files as node_files
from jupyter_mn.node.files import NodeFiles, sees
from jupyter_mn.wire.manifest import FileEntry, FileUpdate, content_digest, stamp
from tests.support.otheruser import OtherUser, other_user

MODEL = b"def train():\n    return 'the user's code'\n"
EVIL = b"import os\nos.system('id > /tmp/owned')\n"
#: ``EVIL`` as the other user's shell writes it
WRITE_EVIL = f"printf %s {shlex.quote(EVIL.decode())}"
ENTRY = FileEntry("model.py", content_digest(MODEL), len(MODEL))


@pytest.fixture
def other(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[OtherUser]:
    """A second local user; this process's cache falls back to the temporary directory, which
    is the shared one the other user may write (a home that cannot be written, as in a pod)."""
    with other_user() as user:
        monkeypatch.delenv(node_files.CACHE_ENV, raising=False)
        (tmp_path / "home").write_text("")  # not a directory: ~/.cache cannot be made
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setattr(tempfile, "tempdir", str(user.shared))
        monkeypatch.setattr(node_files, "_private", None, raising=False)
        yield user


def _fallback(user: OtherUser) -> Path:
    """Where the cache goes when the home cannot be written (``cache_places``)."""
    return user.shared / f"jupyter-mn-files-{os.getuid()}"


def _place(job: str) -> NodeFiles:
    node = NodeFiles(job)
    lacking = node.missing([ENTRY.digest])
    node.apply(FileUpdate((ENTRY,), (), {d: MODEL for d in lacking}))
    return node


def test_a_cache_directory_another_user_made_first_is_not_used(other, caplog):
    planted = _fallback(other)
    other.sh(f"mkdir -m 777 {planted}")
    node = _place("gang-a")
    try:
        assert f"{planted}: owned by uid {other.uid}, mode 777" in caplog.text
        assert list(planted.iterdir()) == []  # nothing of the user's went into it
        st = node.cache.stat()
        assert node.cache != planted and st.st_uid == os.getuid()
        assert stat.S_IMODE(st.st_mode) == 0o700
        assert (Path(node.folder) / "model.py").read_bytes() == MODEL
    finally:
        node.remove()


def test_a_blob_another_user_swaps_is_not_what_the_next_gang_runs(other):
    planted = _fallback(other)
    other.sh(f"mkdir -m 777 {planted}")
    first = _place("gang-a")
    cache = first.cache
    first.remove()
    # the other user replaces the content the next gang would place (the digest is public:
    # the hash of the user's code), where the cache was and where it is now
    other.sh(f"rm -f {planted}/{ENTRY.digest}; {WRITE_EVIL} > {planted}/{ENTRY.digest}")
    other.sh(f"{WRITE_EVIL} > {cache}/{ENTRY.digest}", check=False)
    second = NodeFiles("gang-b")
    try:
        assert second.missing([ENTRY.digest]) == []  # the user's own copy is still cached
        second.apply(FileUpdate((ENTRY,)))
        assert (Path(second.folder) / "model.py").read_bytes() == MODEL
    finally:
        second.remove()
    refused = other.sh(f"printf x > {cache}/{ENTRY.digest}", check=False)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr


def test_a_link_another_user_plants_at_the_cache_leaves_the_users_files_alone(
    other, monkeypatch, tmp_path
):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "epoch-9.pt").write_bytes(b"\0" * 4096)
    hour_ago = time.time() - 3600
    os.utime(checkpoints / "epoch-9.pt", (hour_ago, hour_ago))  # used longest ago: trimmed first
    other.sh(f"ln -s {checkpoints} {_fallback(other)}")
    monkeypatch.setattr(node_files, "CACHE_LIMIT", len(MODEL))
    node = _place("gang-a")
    try:
        assert (checkpoints / "epoch-9.pt").stat().st_size == 4096
        assert sorted(p.name for p in checkpoints.iterdir()) == ["epoch-9.pt"]
        assert node.cache.resolve() != checkpoints
    finally:
        node.remove()


def test_a_users_own_files_in_the_cache_directory_are_never_trimmed(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "model.ckpt").write_bytes(b"\0" * 4096)
    day_ago = time.time() - 86400
    os.utime(scratch / "model.ckpt", (day_ago, day_ago))
    monkeypatch.setenv(node_files.CACHE_ENV, str(scratch))
    monkeypatch.setattr(node_files, "CACHE_LIMIT", 150)
    blobs = [bytes([i]) * 100 for i in range(3)]
    node = NodeFiles("gang")
    try:
        for data in blobs:
            node.apply(FileUpdate((), (), {content_digest(data): data}))
            past = time.time() - 3600
            os.utime(node.cache / content_digest(data), (past, past))
        assert (scratch / "model.ckpt").stat().st_size == 4096  # the user's: never trimmed
        assert node.cache.parent == scratch and node.cache.name.startswith("jupyter-mn-files-")
        assert node.missing([content_digest(b) for b in blobs[:2]]) == [
            content_digest(b) for b in blobs[:2]
        ]  # the cache's own, used longest ago, went
    finally:
        node.remove()


def test_a_cached_content_altered_since_is_dropped_and_sent_again(tmp_path, monkeypatch):
    monkeypatch.setenv(node_files.CACHE_ENV, str(tmp_path))
    first = _place("gang-a")
    blob = first.cache / ENTRY.digest
    first.remove()
    blob.write_bytes(EVIL)  # a disk's error, or a cache another user could write before
    second = NodeFiles("gang-b")
    try:
        assert second.missing([ENTRY.digest]) == [ENTRY.digest]
        assert not blob.exists()
        second.apply(FileUpdate((ENTRY,), (), {ENTRY.digest: MODEL}))
        assert (Path(second.folder) / "model.py").read_bytes() == MODEL
        blob.write_bytes(EVIL)  # altered between the kernel's question and the update
        with pytest.raises(ValueError, match="was altered, after the kernel asked"):
            second.apply(FileUpdate((FileEntry("again.py", ENTRY.digest, ENTRY.size),)))
        assert not (Path(second.folder) / "again.py").exists()
    finally:
        second.remove()


def test_digests_sizes_and_free_disk_are_checked_before_a_byte_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(node_files.CACHE_ENV, str(tmp_path))
    node = NodeFiles("gang")
    try:
        for bad in ("../../../etc/passwd", "A" * 32, ENTRY.digest + "0", ""):
            with pytest.raises(ValueError, match="not a content digest"):
                node.missing([bad])
            with pytest.raises(ValueError, match="not a content digest"):
                node.apply(FileUpdate((FileEntry("x.py", bad, 1),)))
        lying = FileEntry("model.py", ENTRY.digest, ENTRY.size + 1)
        with pytest.raises(ValueError, match="not the size its file was listed with"):
            node.apply(FileUpdate((lying,), (), {ENTRY.digest: MODEL}))
        monkeypatch.setattr(node_files, "DISK_RESERVE", 1 << 62, raising=False)
        with pytest.raises(ValueError, match=r"\d+ bytes of files would not fit in .* free"):
            node.apply(FileUpdate((ENTRY,), (), {ENTRY.digest: MODEL}))
        assert not (node.cache / ENTRY.digest).exists()
        assert not (Path(node.folder) / "model.py").exists()
    finally:
        node.remove()


def test_a_look_alike_tree_another_user_made_is_not_taken_for_the_notebooks(other, tmp_path):
    """The kernel's ``/tmp/proj`` and, on a node, a ``/tmp/proj`` someone else made with the same
    names, sizes and times: the node gets a copy rather than running theirs."""
    mtime_ns = 1_700_000_000_123_456_789
    expected = stamp([("model.py", len(EVIL), mtime_ns)])
    look_alike = other.shared / "proj"
    when = f"@{mtime_ns // 10**9}.{mtime_ns % 10**9:09d}"
    other.sh(
        f"mkdir -m 755 {look_alike} && {WRITE_EVIL} > {look_alike}/model.py && "
        f"touch -d {when} {look_alike}/model.py"
    )
    assert (look_alike / "model.py").stat().st_mtime_ns == mtime_ns  # the same stamp
    assert not sees(str(look_alike), ["model.py"], expected)
    own = tmp_path / "proj"
    own.mkdir()
    (own / "model.py").write_bytes(EVIL)
    os.utime(own / "model.py", ns=(mtime_ns, mtime_ns))
    assert sees(str(own), ["model.py"], expected)  # the user's own tree is seen
