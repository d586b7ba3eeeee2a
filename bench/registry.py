"""Job registry costs, each beside a peer measured in the same run; prints tables of medians.

1. warm cell on a 2×1 local gang, recorded in the registry vs not recorded;
2. writing rank output to the per-node log files vs a plain file vs logging's RotatingFileHandler;
3. a follow-mode read (lines after a cursor) vs reading the whole file;
4. GET /jupyter-mn/api/jobs (20 jobs) vs the server's own GET /api/kernels and GET /api/status.

    python -m bench.registry          # about a minute on 2 cores
"""

from __future__ import annotations

import logging.handlers
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from jupyter_mn import Cluster
from jupyter_mn.jobs.joblogs import JobLogWriter, read_logs
from jupyter_mn.jobs.registry import JobModel, Registry
from jupyter_mn.kernel import recorder
from jupyter_mn.wire.events import LogLines

LINE = "step 1234/5000 loss 0.123456 lr 3.0e-04 grad-norm 1.2345 tokens/s 123456"


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def table(title: str, rows: list[tuple[str, float]], unit: str, base: float) -> None:
    print(f"\n{title}")
    print(f"  {'':44} {unit:>12} {'ratio':>8}")
    for name, value in rows:
        print(f"  {name:44} {value:12.3f} {value / base:8.3f}")


def cell_overhead() -> None:
    """Two warm gangs side by side, cells interleaved, so load on the machine hits both alike."""
    track = recorder.track
    recorder.track = lambda cluster, gang: None
    try:
        off = Cluster(nodes=2, gpus=1)
        off.up()
    finally:
        recorder.track = track
    on = Cluster(nodes=2, gpus=1)
    on.up()
    times: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for i in range(60):
            for name, cluster in (("off", off), ("on", on)):
                start = time.perf_counter()
                cluster.run(f"x = {i}\nx")
                if i >= 5:  # the first cells warm caches
                    times[name].append((time.perf_counter() - start) * 1e3)
    finally:
        off.close()
        on.close()
    base = statistics.median(times["off"])
    rows = [("not recorded", base), ("recorded in the registry", statistics.median(times["on"]))]
    table("1. warm cell, 2×1 local gang (median of 55, interleaved)", rows, "ms/cell", base)


def log_writes(tmp: Path) -> None:
    n = 20_000
    batch = LogLines(0, 1, ((0, "out", (LINE,) * 100),))

    def ours() -> None:
        w = JobLogWriter(tmp / uuid.uuid4().hex)
        for _ in range(n // 100):
            w.write(batch)
        w.close()

    def plain() -> None:
        with open(tmp / uuid.uuid4().hex, "w") as f:
            for _ in range(n):
                f.write(f"1\t0.0\t0\tout\t{LINE}\n")

    def rotating() -> None:
        handler = logging.handlers.RotatingFileHandler(tmp / uuid.uuid4().hex, maxBytes=8 << 20)
        for _ in range(n):
            handler.emit(logging.makeLogRecord({"msg": LINE}))
        handler.close()

    base = median_ms(plain, 5)
    rows = [
        ("plain file write", base),
        ("JobLogWriter (ours)", median_ms(ours, 5)),
        ("logging.RotatingFileHandler", median_ms(rotating, 5)),
    ]
    table(f"2. write {n} lines (median of 5)", rows, "ms", base)
    print(f"  → ours: {n / median_ms(ours, 3) * 1e3:,.0f} lines/s")


def follow_reads(tmp: Path) -> None:
    d = tmp / "follow"
    w = JobLogWriter(d)
    for _ in range(1000):
        w.write(LogLines(0, 1, ((0, "out", (LINE,) * 80),)))
    w.flush()
    _, cursor = read_logs(d, tail=0)
    w.write(LogLines(0, 1, ((0, "out", ("new",) * 10),)))
    w.flush()
    size = (d / "node-0.log").stat().st_size / 2**20

    def whole() -> None:
        lines = (d / "node-0.log").read_bytes().split(b"\n")
        [x for x in lines if x and int(x.split(b"\t", 1)[0]) > cursor[0]]

    base = median_ms(whole, 20)
    rows = [
        ("read the whole file, filter by seq", base),
        ("read_logs(after=cursor) (ours)", median_ms(lambda: read_logs(d, after=cursor), 20)),
    ]
    table(
        f"3. follow: 10 new lines after a cursor, {size:.1f} MB file (median of 20)",
        rows,
        "ms",
        base,
    )


def api_latency(tmp: Path) -> None:
    registry = Registry()
    for i in range(20):
        registry.save(
            JobModel(
                id=f"bench-{i}",
                name="b",
                gang="b",
                backend="local",
                shape="2×2",
                gpus=2,
                world_size=4,
                state="CLOSED",
                started=time.time(),
            )
        )
    token, port = uuid.uuid4().hex, 18000 + os.getpid() % 1000
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp}",
            "--ip=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def get(path: str) -> bytes:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"}
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.read()

        deadline = time.monotonic() + 60
        while True:
            try:
                get("/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        base = median_ms(lambda: get("/api/status"), 100)
        rows = [
            ("GET /api/status (server's own)", base),
            ("GET /api/kernels (server's own)", median_ms(lambda: get("/api/kernels"), 100)),
            (
                "GET /jupyter-mn/api/jobs, 20 jobs (ours)",
                median_ms(lambda: get("/jupyter-mn/api/jobs"), 100),
            ),
        ]
        table("4. REST latency (median of 100)", rows, "ms", base)
    finally:
        server.terminate()
        server.wait(15)


if __name__ == "__main__":  # (dask's spawned workers import this module as __mp_main__)
    os.environ["JUPYTER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="jmn-bench-")  # a private registry
    try:
        with tempfile.TemporaryDirectory() as tmp:
            python = sys.version.split()[0]
            print(f"jupyter_mn registry bench — {os.cpu_count()} CPUs, python {python}")
            log_writes(Path(tmp))
            follow_reads(Path(tmp))
            api_latency(Path(tmp))
            cell_overhead()
    finally:
        shutil.rmtree(os.environ["JUPYTER_RUNTIME_DIR"], ignore_errors=True)
