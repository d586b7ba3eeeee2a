"""The job registry: one ``JobModel`` per gang, written by kernels, read by the server and the CLI.

SQLite (in WAL mode, or with a rollback journal on a network file system, where WAL does not
work: ``netfs.py``) under the Jupyter runtime dir (``jupyter --runtime-dir``/jupyter-mn), so the
sidebar and ``jupyter mn list`` see the jobs of every kernel of this user — interactive and
papermill — without a daemon. The directory is 0700 and every file in it 0600: job names,
notebook paths and logs are private. Cancel/release travel the other way, as rows in
``requests`` that the owning kernel polls (``recorder.py``). A kernel knows its notebook by the
name it started with (``JPY_SESSION_NAME``); where the notebook was renamed since, the Jupyter
server writes its new path into ``notebooks`` (``server/renames.py``), for every reader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import JupyterMNError
from ..model import usage
from .netfs import on_network_fs
from .runstate import RUN_ENDED, RunState

log = logging.getLogger(__name__)
#: How often a kernel writes its live jobs' heartbeat into the registry; a live job whose kernel
#: has not written one for ORPHAN_AFTER_S is ORPHANED.
JOB_HEARTBEAT_S = 5.0
ORPHAN_AFTER_S = 30.0
ORPHANED = "ORPHANED"
#: A running job whose cell the hang watchdog found hung (``--hang-timeout``), until it ends.
HUNG = "HUNG"
#: psutil's process start times are rounded (clock ticks, boot time): this much later than the
#: job's start still counts as "started before the job".
_START_SLACK_S = 2.0
#: Gang states (gang/lifecycle.py) after which nothing of the job runs any more, plus ORPHANED
#: and the end states of a submitted run (``runstate.py``).
FINISHED = frozenset({"CLOSED", ORPHANED, *(state.value for state in RUN_ENDED)})
#: SQL placeholders for the FINISHED states
_FINISHED = ",".join("?" * len(FINISHED))
ACTIONS = ("cancel", "release")
HOST = socket.gethostname()

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
    heartbeat REAL NOT NULL, model TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, action TEXT NOT NULL,
    source TEXT NOT NULL, created REAL NOT NULL, handled REAL, outcome TEXT);
CREATE INDEX IF NOT EXISTS requests_open ON requests (job) WHERE handled IS NULL;
CREATE TABLE IF NOT EXISTS notebooks (kernel_id TEXT PRIMARY KEY, path TEXT NOT NULL);
"""


class RegistryError(JupyterMNError):
    """A job reference or request the registry cannot serve (unknown job, finished job, …)."""


class JobNotFound(RegistryError, LookupError):
    pass


@dataclass
class NodeModel:
    """One node of a job as the sidebar shows it."""

    node: int
    host: str = ""
    #: state of each of the node's ranks, by local rank ("started", "ready", "error", "lost", …)
    ranks: list[str] = field(default_factory=list)
    #: rank process ids (this node's host), so ``gc`` can clean up after a dead kernel
    pids: list[int] = field(default_factory=list)
    gpu_util: float | None = None
    transport: str = ""


@dataclass
class JobModel:
    """The one JSON shape of a job (mirrored by ``labextension/src/model.ts``)."""

    id: str
    name: str
    gang: str
    backend: str
    shape: str
    gpus: int
    world_size: int
    state: str
    started: float
    detail: str = ""
    ended: float | None = None
    heartbeat: float = 0.0
    host: str = HOST
    pid: int = 0
    #: Kubernetes: the namespace of the job's objects (``jupyter mn gc`` deletes there)
    namespace: str = ""
    kernel_id: str | None = None
    notebook: str | None = None
    launcher: str = ""
    cells: int = 0
    #: what the gang runs now (``In[7]``, ``%cluster run train.py``); "" while it runs nothing
    running: str = ""
    last_cell: dict[str, Any] | None = None
    error: str | None = None
    nodes: list[NodeModel] = field(default_factory=list)
    #: requested actions the kernel has not answered yet (filled when read)
    pending: list[str] = field(default_factory=list)
    #: the notebook's path relative to the Jupyter server's root (filled by the server)
    link: str | None = None
    #: when the backend handed over the nodes (None: not yet, or never); with ``ended``, what
    #: ``gpu_hours`` counts
    up: float | None = None
    #: ``HoursUnit``'s value: GPU-hours, or rank-hours for CPU ranks
    unit: str = ""
    #: nodes × GPUs × seconds held, in hours (``model/usage.py``; a live job's, filled when read;
    #: a submitted run's: its gangs' total in ``unit``, once it has ended)
    gpu_hours: float = 0.0
    #: ``gpu_hours`` in ``unit`` as a person reads it (``0.03 rank-hours``, ``usage.text``),
    #: filled when read: "" until the unit is known
    usage: str = ""
    #: a submitted run (``jupyter mn submit``): the executed notebook it writes, cell by cell
    output: str | None = None
    #: a submitted run: the code cells it runs (``cells`` counts those started)
    cells_total: int = 0
    #: a submitted run: ``output`` relative to the Jupyter server's root (filled by the server)
    output_link: str | None = None
    #: a gang a submitted run's kernel made: the run's id (its ranks' lines are in the gang's
    #: logs, not the run's)
    run: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def in_cluster(self) -> bool:
        """A submitted run whose kernel is a Kubernetes driver pod (``kuberun.py``)."""
        return self.submitted and self.backend == "kubernetes"

    @property
    def submitted(self) -> bool:
        """A submitted run (a notebook's whole execution), not a gang."""
        return self.output is not None

    def node_of(self, rank: int) -> int:
        """The node whose log file holds ``rank``'s lines (ranks fill nodes in order), so a
        rank filter reads one node's files, not every node's."""
        return rank // max(self.gpus, 1)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, for serializing at once: a shallow copy (``dataclasses.asdict`` deep-copies
        every node's lists, which at 64 nodes cost the recorder milliseconds a cell)."""
        return {**vars(self), "nodes": [dict(vars(n)) for n in self.nodes]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobModel:
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        node_names = {f.name for f in dataclasses.fields(NodeModel)}
        known["nodes"] = [
            NodeModel(**{k: v for k, v in n.items() if k in node_names})
            for n in known.get("nodes", [])
        ]
        return cls(**known)


@dataclass(frozen=True)
class Request:
    id: int
    job: str
    action: str
    source: str


def default_root() -> Path:
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "jupyter-mn"


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it 0700 even if it existed with wider bits."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT) -> int:
    """Open (creating 0600) a file in the registry; returns the descriptor."""
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


class Registry:
    """Access to the registry directory; one SQLite connection, safe to share between threads."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = private_dir(Path(root) if root else default_root())
        self.logs_root = private_dir(self.root / "logs")
        self._lock = threading.Lock()
        self._db = _connect_or_recreate(self.root / "jobs.sqlite")
        #: ids of rows that could not be read, warned about once
        self._unreadable: set[str] = set()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (disk full) leaves the transaction open, or SQLite has already
                # rolled it back: either way end it, or the write lock is held for everyone.
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def log_dir(self, job_id: str) -> Path:
        return self.logs_root / job_id

    # ---- written by the owning kernel
    def save(self, job: JobModel) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO jobs (id, state, host, pid, heartbeat, model) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    job.id,
                    job.state,
                    job.host,
                    job.pid,
                    job.heartbeat,
                    json.dumps(job.to_json()),
                ),
            )

    def beat(self, job_ids: list[str], now: float | None = None) -> None:
        if not job_ids:
            return
        with self._tx() as db:
            db.executemany(
                "UPDATE jobs SET heartbeat = ? WHERE id = ? AND state != ?",
                [(now or time.time(), j, ORPHANED) for j in job_ids],
            )

    def open_requests(self, job_ids: list[str]) -> list[Request]:
        if not job_ids:
            return []
        marks = ",".join("?" * len(job_ids))
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, job, action, source FROM requests "
                f"WHERE handled IS NULL AND job IN ({marks}) ORDER BY id",
                job_ids,
            ).fetchall()
        return [Request(*row) for row in rows]

    def answer(self, request_id: int, outcome: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE requests SET handled = ?, outcome = ? WHERE id = ?",
                (time.time(), outcome, request_id),
            )

    # ---- written by the Jupyter server
    def notebook_moved(self, kernel_id: str, path: str) -> None:
        """The notebook of ``kernel_id``'s jobs is now ``path`` (absolute): renamed or moved."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO notebooks (kernel_id, path) VALUES (?, ?)",
                (kernel_id, path),
            )

    # ---- read by the server and the CLI
    def jobs(self) -> list[JobModel]:
        """Every job, live ones first, newest first; stale live jobs are marked ORPHANED."""
        self.reap()
        with self._lock:
            rows = self._db.execute("SELECT model, heartbeat FROM jobs").fetchall()
            known = self._known()
        jobs = [job for row in rows if (job := self._load(*row, known)) is not None]
        return sorted(jobs, key=lambda j: (j.finished, -j.started))

    def job(self, job_id: str) -> JobModel:
        self.reap()
        with self._lock:
            row = self._db.execute(
                "SELECT model, heartbeat FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
            known = self._known()
        job = None if row is None else self._load(*row, known)
        if job is None:
            raise JobNotFound(f"no job {job_id!r} (jupyter mn list shows the jobs)")
        return job

    def resolve(self, ref: str) -> JobModel:
        """A job by id, by name (its newest job, live ones first) or by unique id prefix."""
        jobs = self.jobs()  # live first, newest first
        for match in ([j for j in jobs if j.id == ref], [j for j in jobs if j.name == ref]):
            if match:
                return match[0]
        matches = [j for j in jobs if j.id.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise JobNotFound(f"no job {ref!r} (jupyter mn list shows the jobs)")
        raise RegistryError(
            f"{ref!r} matches {len(matches)} jobs ({', '.join(j.id for j in matches[:5])}); "
            "use the full id"
        )

    def request(self, job_id: str, action: str, source: str) -> int:
        """Ask the job's kernel to ``cancel`` or ``release``; returns the request id."""
        if action not in ACTIONS:
            raise RegistryError(f"unknown action {action!r}; choose {' or '.join(ACTIONS)}")
        job = self.job(job_id)
        if job.finished:
            raise RegistryError(f"job {job.id} is {job.state}: nothing to {action}")
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO requests (job, action, source, created) VALUES (?, ?, ?, ?)",
                (job.id, action, source, time.time()),
            )
        return int(cur.lastrowid or 0)

    def outcome(self, request_id: int) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT outcome FROM requests WHERE id = ? AND handled IS NOT NULL", (request_id,)
            ).fetchone()
        return row[0] if row else None

    def forget(self, job_id: str) -> None:
        """Drop a finished job and its logs (a live job must be released first)."""
        job = self.job(job_id)
        if not job.finished:
            raise RegistryError(f"job {job.id} is {job.state}; release it before forgetting it")
        with self._tx() as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job.id,))
            db.execute("DELETE FROM requests WHERE job = ?", (job.id,))
        shutil.rmtree(self.log_dir(job.id), ignore_errors=True)

    def forget_finished(self) -> list[str]:
        """Drop every finished job and its logs (the panel's "Clear finished"); live jobs stay.
        Returns the ids forgotten."""
        done = [job.id for job in self.jobs() if job.finished]
        for job_id in done:  # a finished job never comes back to life: no race with its kernel
            self.forget(job_id)
        return done

    def reap(self, now: float | None = None) -> list[str]:
        """Mark live jobs ORPHANED whose kernel died (on this host, where its process can be
        seen: a kernel busy in C code stops beating but is not gone) or, on another host,
        stopped beating. A run queued in Slurm has no process yet: Slurm holds it."""
        now = now or time.time()
        with self._lock:
            rows = self._db.execute(
                "SELECT id, host, pid, heartbeat, model FROM jobs "
                f"WHERE state NOT IN ({_FINISHED})",
                tuple(FINISHED),
            ).fetchall()
        dead = [
            (job_id, job)
            for job_id, host, pid, beat, model in rows
            if (job := self._load(model, beat, _Known())) is not None and not queued_in_slurm(job)
            if not job.in_cluster  # its driver's state is the cluster's (``kuberun.refresh``)
            if (not kernel_alive(pid, job.started) if host == HOST else now - beat > ORPHAN_AFTER_S)
        ]
        for job_id, job in dead:  # it ended with its last heartbeat, not when that was seen
            job.state, job.ended = ORPHANED, job.ended or min(now, job.heartbeat or now)
            job.detail = f"its kernel (pid {job.pid} on {job.host}) stopped without closing it"
            with self._tx() as db:
                db.execute(
                    "UPDATE jobs SET state = ?, model = ? "
                    f"WHERE id = ? AND state NOT IN ({_FINISHED})",
                    (job.state, json.dumps(job.to_json()), job_id, *FINISHED),
                )
        return [job_id for job_id, _ in dead]

    def _load(self, model: str, heartbeat: float, known: _Known) -> JobModel | None:
        """The row's job, or None for a row no version of ``JobModel`` can read: one bad row
        (written by hand, or by a newer jupyter_mn) must not hide every other job."""
        try:
            job = JobModel.from_json(json.loads(model))
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            if model not in self._unreadable:
                self._unreadable.add(model)
                log.warning("jupyter_mn: skipping an unreadable job in the registry (%s)", exc)
            return None
        job.heartbeat = heartbeat
        job.pending = known.pending.get(job.id, [])
        job.notebook = known.notebooks.get(job.kernel_id or "", job.notebook)
        if not job.submitted:  # a run's is its gangs' total, written by its runner at its end
            job.gpu_hours = usage.job_hours(job, time.time())
        job.usage = usage.text(job.gpu_hours, job.unit) if job.unit else ""
        return job

    def _known(self) -> _Known:
        known = _Known(notebooks=dict(self._db.execute("SELECT kernel_id, path FROM notebooks")))
        for job, action in self._db.execute(
            "SELECT job, action FROM requests WHERE handled IS NULL ORDER BY id"
        ):
            known.pending.setdefault(job, []).append(action)
        return known


@dataclass
class _Known:
    """What rows are read with: the requests not answered yet, by job, and the notebooks
    renamed since their kernels started, by kernel."""

    pending: dict[str, list[str]] = field(default_factory=dict)
    notebooks: dict[str, str] = field(default_factory=dict)


def queued_in_slurm(job: JobModel) -> bool:
    """A submitted Slurm run whose job waits in the queue (or again, requeued)."""
    return job.backend == "slurm" and job.state == RunState.SUBMITTED.value


def kernel_alive(pid: int, job_started: float) -> bool:
    """Whether a job's kernel process (on this host) still runs: its pid exists and started
    before the job did, so a pid recycled after the kernel died does not count."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return (
            proc.status() != psutil.STATUS_ZOMBIE
            and proc.create_time() <= job_started + _START_SLACK_S
        )
    except psutil.NoSuchProcess:
        return False


def _connect_or_recreate(db: Path) -> sqlite3.Connection:
    """Open the registry; a file SQLite calls corrupt is moved aside and a new one made, since
    a registry only lists jobs: losing it must not stop the server extension or the CLI."""
    try:
        return _connect(db)
    except sqlite3.OperationalError:
        raise  # locked, disk I/O, full: the file may be fine, so leave it alone
    except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed"
        aside = db.with_name(f"{db.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{db}{suffix}", f"{aside}{suffix}")
        log.warning(
            "jupyter_mn: the job registry %s was unreadable (%s); moved it to %s and started "
            "a new one (jobs recorded before are no longer listed)",
            db,
            exc,
            aside.name,
        )
        return _connect(db)


def _private_file(db: Path) -> None:
    """Make the database file 0600 (SQLite gives -wal/-shm its bits) without opening one that
    exists: closing any descriptor of a file drops every POSIX lock this process holds on it,
    and SQLite's WAL mode rests on the shared lock each open connection holds. Without it the
    next process to close its connection thinks it was the last, checkpoints and resets the WAL,
    and this process's older connections read a snapshot that no longer changes."""
    try:
        os.close(os.open(db, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        os.chmod(db, 0o600)


def _connect(db: Path) -> sqlite3.Connection:
    _private_file(db)
    conn = sqlite3.connect(db, timeout=10, check_same_thread=False, isolation_level=None)
    try:
        conn.execute(f"PRAGMA journal_mode={'DELETE' if on_network_fs(db) else 'WAL'}")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        (check,) = conn.execute("PRAGMA quick_check(1)").fetchone()
        if check != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {check}")
    except BaseException:
        conn.close()
        raise
    return conn
