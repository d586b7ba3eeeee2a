"""The dask backend, the preflight doctor and ``%cluster run``, side by side in one run.

* cold start of a 2×1 gang (READY with the process group formed): local backend without and
  with preflight, and on a CLI-started TLS dask cluster (two workers on two loopback "hosts")
  with and without preflight — what the doctor costs before a new gang's first cell;
* warm trivial cell (``x = 1``) on the local and on the dask backend;
* ``%cluster run`` of a script that initializes gloo and runs a barrier on a warm 2×2 gang's
  nodes vs ``torchrun --nproc-per-node 4`` of the same script (its peer);
* ``%cluster bench`` busbw at 4 MiB on the 2×2 gang (gloo on CPU).

Rounds interleave the variants so load changes hit all of them alike; medians are printed.
Run: ``.venv/bin/python -m bench.dask_backend [--cold N] [--warm N] [--script N]``.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dask

from jupyter_mn import Cluster
from jupyter_mn.gang.script import run_script
from jupyter_mn.kernel.bandwidth import bench
from tests.support.daskcli import DaskCLI, tls_config

SCRIPT = """
import torch.distributed as dist
dist.init_process_group()
dist.barrier()
dist.destroy_process_group()
"""


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def cold(options: dict) -> float:
    cluster = Cluster(nodes=2, gpus=1, **options)
    try:
        return timed(cluster.up)
    finally:
        cluster.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def table(results: dict[str, list[float]], unit: str, scale: float, base: str | None) -> None:
    width = max(len(k) for k in results)
    ref = statistics.median(results[base]) if base else None
    print(f"{'variant'.ljust(width)}  {'n':>3}  {'median':>10}  {'min':>10}  ratio")
    for name, values in results.items():
        med = statistics.median(values)
        ratio = f"{med / ref:5.2f}×" if ref else ""
        print(
            f"{name.ljust(width)}  {len(values):>3}  {med * scale:>8.1f} {unit}"
            f"  {min(values) * scale:>8.1f} {unit}  {ratio}"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--warm", type=int, default=30)
    parser.add_argument("--script", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="jmn-bench-"))
    cli = DaskCLI.start(folder, {"w0": "127.0.0.1", "w1": "127.0.0.2"})
    try:
        with dask.config.set(tls_config(cli.certs)):
            run_all(args, cli.address, folder)
    finally:
        cli.stop()


def run_all(args: argparse.Namespace, address: str, folder: Path) -> None:
    dask_opts = {"backend": "dask", "scheduler": address}
    variants = {
        "local, no preflight (default)": {},
        "local, --preflight": {"preflight": True},
        "dask TLS, --no-preflight": {**dask_opts, "preflight": False},
        "dask TLS, preflight (default)": dask_opts,
    }
    results: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.cold):
        for name, options in variants.items():
            results[name].append(cold(options))
    print("cold start of a 2×1 gang (nodes claimed, ranks up, process group formed)")
    table(results, "s", 1, "local, no preflight (default)")

    warm = {"local 2×2, x = 1": Cluster(nodes=2, gpus=2), "dask 2×2, x = 1": None}
    warm["dask 2×2, x = 1"] = Cluster(nodes=2, gpus=2, **dask_opts)
    try:
        for cluster in warm.values():
            cluster.run("x = 1")
        results = {k: [] for k in warm}
        for _ in range(args.warm):
            for name, cluster in warm.items():
                results[name].append(timed(lambda c=cluster: c.run("x = 1")))
        print("warm trivial cell, Python API round trip")
        table(results, "ms", 1e3, "local 2×2, x = 1")
        run_scripts(args, warm["local 2×2, x = 1"], folder)
        report = bench(warm["local 2×2, x = 1"], 4 << 20, iters=10, warmup=2)
        print(report, end="\n\n")
    finally:
        for cluster in warm.values():
            cluster.close()


def run_scripts(args: argparse.Namespace, cluster: Cluster, folder: Path) -> None:
    script = folder / "barrier.py"
    script.write_text(SCRIPT)
    torchrun = Path(sys.executable).parent / "torchrun"
    results: dict[str, list[float]] = {"%cluster run, 2×2 warm nodes": [], "torchrun 4 procs": []}

    def ours() -> None:
        with cluster.nodes() as gang:
            run_script(gang, str(script), [], None).unwrap()

    def peer() -> None:
        subprocess.run(
            [str(torchrun), "--nproc-per-node", "4", f"--master-port={free_port()}", str(script)],
            check=True,
            capture_output=True,
        )

    for _ in range(args.script):
        results["%cluster run, 2×2 warm nodes"].append(timed(ours))
        results["torchrun 4 procs"].append(timed(peer))
    print("script: init_process_group (env://) + barrier on 4 ranks, launch to exit")
    table(results, "s", 1, "torchrun 4 procs")


if __name__ == "__main__":
    main()
