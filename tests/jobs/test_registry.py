"""The registry on disk: one JSON shape, private files, orphan detection, requests, forgetting."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_mn.jobs.joblogs import JobLogWriter
from jupyter_mn.jobs.registry import (
    ORPHAN_AFTER_S,
    JobModel,
    JobNotFound,
    NodeModel,
    Registry,
    RegistryError,
)
from jupyter_mn.wire.events import LogLines
from tests.support.jobs import make_job
from tests.support.tmpfs import fill, small_tmpfs

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = Registry(tmp_path / "reg")
    yield reg
    reg.close()


def test_directory_is_0700_and_every_file_0600(registry: Registry):
    registry.save(make_job())
    writer = JobLogWriter(registry.log_dir("jmn-1"))
    writer.write(LogLines(0, 1, ((0, "out", ("hello",)),)))
    writer.close()
    files = [p for p in registry.root.rglob("*")]
    assert {p.name for p in files} >= {
        "jobs.sqlite",
        "jobs.sqlite-wal",
        "jobs.sqlite-shm",
        "node-0.log",
    }
    for path in [registry.root, *files]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"


def test_a_wider_existing_directory_is_narrowed(tmp_path: Path):
    root = tmp_path / "open"
    root.mkdir(mode=0o755)
    Registry(root).close()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_job_round_trips_through_json_and_lists_live_first(registry: Registry):
    old = make_job("jmn-old", state="CLOSED", started=time.time() - 100, ended=time.time())
    new = make_job("jmn-new", last_cell={"id": 3, "ok": True, "elapsed": 0.5})
    registry.save(old)
    registry.save(new)
    jobs = registry.jobs()
    assert [j.id for j in jobs] == ["jmn-new", "jmn-old"]
    assert jobs[0] == new
    assert registry.job("jmn-old").nodes[1] == NodeModel(1, ranks=["ready"])


def test_typescript_interface_mirrors_the_job_model():
    source = (ROOT / "labextension" / "src" / "model.ts").read_text()

    def fields(interface: str) -> set[str]:
        body = re.search(rf"interface {interface} \{{(.*?)\n\}}", source, re.S)
        assert body, f"{interface} not found in model.ts"
        return set(re.findall(r"^\s+(\w+)\??:", body[1], re.M))

    import dataclasses

    assert fields("IJobModel") == {f.name for f in dataclasses.fields(JobModel)}
    assert fields("INodeModel") == {f.name for f in dataclasses.fields(NodeModel)}


def test_a_job_whose_kernel_died_is_orphaned_at_once(registry: Registry):
    registry.save(make_job("jmn-dead", pid=_dead_pid()))
    registry.save(make_job("jmn-alive"))
    states = {j.id: j.state for j in registry.jobs()}
    assert states == {"jmn-dead": "ORPHANED", "jmn-alive": "READY"}
    assert "stopped without closing it" in registry.job("jmn-dead").detail


def test_a_run_in_a_kubernetes_driver_pod_is_not_reaped_by_pid_or_heartbeat(registry: Registry):
    """Its kernel is in the cluster: its state is its driver's (``kuberun.refresh``)."""
    old = time.time() - ORPHAN_AFTER_S - 1
    run = make_job("nb-run", pid=0, backend="kubernetes", output="", state="RUNNING", heartbeat=old)
    registry.save(run)
    assert registry.reap() == []
    assert registry.job("nb-run").state == "RUNNING"


def test_a_run_queued_in_slurm_has_no_process_yet_and_is_not_orphaned(registry: Registry):
    queued = {"state": "SUBMITTED", "output": "out.ipynb", "pid": 0}
    registry.save(make_job("jmn-queued", backend="slurm", **queued))
    registry.save(make_job("jmn-local", backend="local", **{**queued, "pid": _dead_pid()}))
    assert registry.reap() == ["jmn-local"]
    assert registry.job("jmn-queued").state == "SUBMITTED"


def test_a_job_without_heartbeat_is_orphaned_after_the_timeout(registry: Registry):
    registry.save(
        make_job("jmn-quiet", host="elsewhere", heartbeat=time.time() - ORPHAN_AFTER_S - 1)
    )
    registry.save(make_job("jmn-beating", host="elsewhere"))
    registry.beat(["jmn-beating"])
    assert registry.reap() == ["jmn-quiet"]
    assert registry.job("jmn-beating").state == "READY"


def test_requests_go_to_live_jobs_only_and_carry_an_outcome(registry: Registry):
    registry.save(make_job("jmn-live"))
    registry.save(make_job("jmn-done", state="CLOSED"))
    with pytest.raises(RegistryError, match="jmn-done is CLOSED: nothing to cancel"):
        registry.request("jmn-done", "cancel", "cli")
    with pytest.raises(RegistryError, match="unknown action 'stop'"):
        registry.request("jmn-live", "stop", "cli")
    with pytest.raises(JobNotFound, match="no job 'nope'"):
        registry.request("nope", "cancel", "cli")
    rid = registry.request("jmn-live", "release", "panel")
    assert registry.job("jmn-live").pending == ["release"]
    assert [(r.job, r.action, r.source) for r in registry.open_requests(["jmn-live"])] == [
        ("jmn-live", "release", "panel")
    ]
    assert registry.outcome(rid) is None
    registry.answer(rid, "releasing the gang")
    assert registry.outcome(rid) == "releasing the gang"
    assert registry.job("jmn-live").pending == []
    assert registry.open_requests(["jmn-live"]) == []


def test_resolve_by_id_name_or_prefix(registry: Registry):
    now = time.time()
    registry.save(make_job("train-a1b2", name="train", state="CLOSED", started=now))
    registry.save(make_job("train-c3d4", name="train", started=now - 1))
    registry.save(make_job("jmn-12345678"))
    assert registry.resolve("jmn-1").id == "jmn-12345678"
    assert registry.resolve("train").id == "train-c3d4"  # a name means its live job first
    assert registry.resolve("train-a1b2").id == "train-a1b2"
    registry.forget("train-a1b2")
    registry.save(make_job("train-e5f6", name="train", state="CLOSED", started=now))
    registry.save(make_job("train-c3d4", name="train", state="CLOSED", started=now - 10))
    assert registry.resolve("train").id == "train-e5f6"  # … else its newest
    with pytest.raises(RegistryError, match="'train-' matches 2 jobs"):
        registry.resolve("train-")
    with pytest.raises(JobNotFound, match="no job 'x'"):
        registry.resolve("x")


def test_forget_removes_a_finished_job_and_its_logs_but_refuses_a_live_one(registry: Registry):
    registry.save(make_job("jmn-live"))
    registry.save(make_job("jmn-done", state="CLOSED"))
    JobLogWriter(registry.log_dir("jmn-done")).close()
    with pytest.raises(RegistryError, match="release it before forgetting it"):
        registry.forget("jmn-live")
    registry.forget("jmn-done")
    assert [j.id for j in registry.jobs()] == ["jmn-live"]
    assert not registry.log_dir("jmn-done").exists()


def test_forget_finished_drops_every_finished_job_and_no_live_one(registry: Registry):
    registry.save(make_job("jmn-up"))
    for job_id, state in (("jmn-closed", "CLOSED"), ("jmn-orphan", "ORPHANED")):
        registry.save(make_job(job_id, state=state))
        JobLogWriter(registry.log_dir(job_id)).close()
    assert sorted(registry.forget_finished()) == ["jmn-closed", "jmn-orphan"]
    assert [j.id for j in registry.jobs()] == ["jmn-up"]
    assert not registry.log_dir("jmn-closed").exists()


def test_two_processes_share_the_registry(registry: Registry):
    registry.save(make_job("jmn-here"))
    code = (
        "import sys; from jupyter_mn.jobs.registry import Registry; r = Registry(sys.argv[1]);"
        "print(','.join(j.id for j in r.jobs())); r.request('jmn-here', 'cancel', 'cli')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(registry.root)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "jmn-here"
    assert registry.job("jmn-here").pending == ["cancel"]


# ---- faults: a full disk, a corrupt file, a bad row
@pytest.mark.parametrize(
    "size",
    [200_000, 3_000_000],
    ids=["fails-at-commit", "fails-mid-statement"],  # the second spills SQLite's page cache
)
def test_a_write_that_fails_on_a_full_disk_says_so_and_releases_the_lock(tmp_path: Path, size):
    with small_tmpfs(tmp_path) as disk:
        registry = Registry(disk / "reg")
        try:
            registry.save(make_job("jmn-before"))
            filler = fill(disk)
            with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
                registry.save(make_job("jmn-big", detail="x" * size))
            other = sqlite3.connect(registry.root / "jobs.sqlite", timeout=0.5)
            other.execute("BEGIN IMMEDIATE")  # "database is locked" if the failed one held on
            other.execute("ROLLBACK")
            other.close()
            filler.unlink()
            registry.save(make_job("jmn-after"))
            assert {j.id for j in registry.jobs()} == {"jmn-before", "jmn-after"}
        finally:
            registry.close()


def test_a_corrupt_file_is_moved_aside_and_a_new_registry_made(tmp_path: Path, caplog):
    root = tmp_path / "reg"
    old = Registry(root)
    old.save(make_job("jmn-lost"))
    old.close()
    (root / "jobs.sqlite").write_bytes(b"this is not a database " * 200)
    registry = Registry(root)
    try:
        (aside,) = root.glob("jobs.sqlite.corrupt-*")
        assert aside.read_bytes().startswith(b"this is not a database")
        assert f"moved it to {aside.name} and started a new one" in caplog.text
        assert registry.jobs() == []
        registry.save(make_job("jmn-new"))
        assert [j.id for j in registry.jobs()] == ["jmn-new"]
    finally:
        registry.close()


def test_the_cli_lists_from_a_new_registry_and_says_why(tmp_path: Path):
    root = tmp_path / "jupyter-mn"
    Registry(root).close()
    (root / "jobs.sqlite").write_bytes(os.urandom(8192))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_mn.cli", "list"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no jobs")
    assert "was unreadable" in proc.stderr and "Traceback" not in proc.stderr


def test_one_unreadable_row_does_not_hide_the_others(registry: Registry, caplog):
    registry.save(make_job("jmn-good"))
    with sqlite3.connect(registry.root / "jobs.sqlite") as db:
        db.execute(
            "INSERT INTO jobs VALUES ('jmn-bad', 'READY', 'h', 1, ?, '{not json')", (time.time(),)
        )
        db.execute(
            "INSERT INTO jobs VALUES ('jmn-odd', 'READY', 'h', 1, ?, '[1, 2]')", (time.time(),)
        )
    assert [j.id for j in registry.jobs()] == ["jmn-good"]
    assert [j.id for j in registry.jobs()] == ["jmn-good"]
    with pytest.raises(JobNotFound):
        registry.job("jmn-bad")
    warnings = [r for r in caplog.records if "unreadable job" in r.getMessage()]
    assert len(warnings) == 2  # once per bad row, not once per listing


def test_a_registry_sees_other_processes_writes_after_another_opened_here(tmp_path):
    """A second ``Registry`` in one process (a kernel's recorder and its CLI call, the server's
    handlers) must not cost the first its view: opening the database file to set its mode and
    closing it dropped this process's SQLite locks, so the next process to close its connection
    reset the WAL and the first registry read a frozen snapshot from then on."""
    mine = Registry(tmp_path)
    mine.save(make_job("jmn-a", state="READY"))
    writer = (
        "import sys\nfrom jupyter_mn.jobs.registry import Registry\n"
        "from tests.support.jobs import make_job\n"
        "r = Registry(sys.argv[1])\n"
        "r.save(make_job('jmn-a', state=sys.argv[2], pid=int(sys.argv[3])))\nr.close()\n"
    )
    seen = []
    for state in ("CLOSED", "READY", "CANCELLED", "BROKEN"):
        Registry(tmp_path).close()
        subprocess.run(
            [sys.executable, "-c", writer, str(tmp_path), state, str(os.getpid())], check=True
        )
        (row,) = mine.jobs()
        seen.append((state, row.state))
    assert all(wrote == read for wrote, read in seen), seen
