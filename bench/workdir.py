"""What the notebook's directory costs a gang on nodes that do not see it (needs root).

Two test hosts (``tests/support/hosts.py``), a dask worker each; host 2's mount namespace hides the
notebook's directory (50 files, 5 MB). Per round, side by side: a cold gang with ``--no-workdir``
(nothing travels), one whose node 1 has an empty file cache (the first time), one whose cache
holds every file (the second time), and on that warm gang a cell after one file was edited and
a cell with nothing changed. Medians of the cold starts (to the first cell's value), the time
spent asking the nodes, listing and sending (``FileSync.decide`` and ``refresh``), the bytes sent.

    sudo .venv/bin/python -m bench.workdir [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_mn import Cluster
from jupyter_mn.gang.files import FileSync
from tests.support.daskcli import DaskCLI
from tests.support.hosts import HostNet

FILES, SIZE = 50, 100_000  # 50 files, 5 MB
spent: dict[str, float] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding its time to ``spent[name]``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

    return wrapper


def notebook(folder: Path) -> Path:
    for i in range(FILES):
        body = f"# module {i}\n" + "x = 1  # padding to a realistic size\n" * (SIZE // 36)
        (folder / f"mod{i:02d}.py").write_text(body[:SIZE])
    return folder


def cold(options: dict[str, Any]) -> tuple[float, dict[str, float], int, Cluster]:
    """A new gang to its first value: seconds, time in FileSync, bytes sent; the open cluster."""
    spent.clear()
    cluster = Cluster(**options)
    started = time.perf_counter()
    cluster.run("import mod00\nmod00.x")
    took = time.perf_counter() - started
    return took, dict(spent), sum(cluster.gang.files.moved.values()), cluster


def warm_cell(cluster: Cluster, edit: Path | None) -> float:
    if edit is not None:
        edit.write_text(edit.read_text() + "y = 2\n")
    started = time.perf_counter()
    cluster.run("import mod00\nmod00.x")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    FileSync.decide = timed("decide", FileSync.decide)  # type: ignore[method-assign]
    FileSync.refresh = timed("refresh", FileSync.refresh)  # type: ignore[method-assign]
    folder = Path(tempfile.mkdtemp(prefix="jmn-bench-workdir-"))
    nb = notebook(Path(tempfile.mkdtemp(prefix="notebook-", dir=folder)))
    rows: dict[str, list[tuple[float, dict[str, float], int]]] = {}
    edited, unchanged = [], []
    with HostNet.create(2) as net:
        hidden = {net.hosts[1].hostname: [str(nb)]}
        with DaskCLI.on_hosts(folder / "dask", net, hidden) as cli:
            cache = cli.folder / f"files-{net.hosts[1].hostname}"
            base = {"backend": "dask", "scheduler": cli.address, "nodes": 2, "gpus": 1}
            base |= {"preflight": False, "workdir": str(nb)}
            for _ in range(rounds):
                for name in ("--no-workdir", "first time", "second time"):
                    if name == "first time":
                        shutil.rmtree(cache, ignore_errors=True)
                    options = {**base, "send_workdir": name != "--no-workdir"}
                    took, inside, moved, cluster = cold(options)
                    rows.setdefault(name, []).append((took, inside, moved))
                    if name == "second time":
                        edited.append(warm_cell(cluster, nb / "mod00.py"))
                        unchanged.append(warm_cell(cluster, None))
                    cluster.close()
    shutil.rmtree(folder, ignore_errors=True)
    baseline = statistics.median(t for t, _, _ in rows["--no-workdir"])
    print(f"{FILES} files, {FILES * SIZE / 1e6:.0f} MB; node 1 does not see them; {rounds} rounds")
    print("| cold gang | to the first value | × --no-workdir | asking + sending | bytes sent |")
    print("|---|---|---|---|---|")
    for name, runs in rows.items():
        took = statistics.median(t for t, _, _ in runs)
        inside = statistics.median(sum(i.values()) for _, i, _ in runs)
        moved = statistics.median(m for _, _, m in runs)
        print(f"| {name} | {took:.2f} s | {took / baseline:.2f} | {inside * 1e3:.0f} ms | "
              f"{moved:,.0f} |")  # fmt: skip
    print(
        f"warm cell after editing one file: {statistics.median(edited) * 1e3:.1f} ms; "
        f"nothing changed: {statistics.median(unchanged) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
