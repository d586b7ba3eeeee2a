"""The Kubernetes backend's own cost, next to the local backend, measured side by side in one run.

Both run a 2×2 gang on this machine through the Python API: ``local`` (a TLS LocalCluster) and
``kubernetes`` against the test suite's emulated cluster (kmock API server, scheduler and a
kubelet running each pod's container command as a local process). The kubernetes figures
therefore include the real client-side work (discovery, objects, watch, readiness, the
port-forward through the API server for every control message) but no image pull or real
scheduling. Rounds interleave the backends so load changes hit both alike.

* cold: ``Cluster(...).run("1")`` from nothing to the first value (gang up + first cell);
* warm: a trivial cell and an all-reduce cell on the warm gang (every cell's control traffic
  goes through the port-forward on kubernetes);
* down: ``close()`` until every process (and, on kubernetes, every object) is gone.

Run: ``.venv/bin/python -m bench.k8s_gang [--rounds N] [--warm N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from jupyter_mn import Cluster
from tests.support.kube.cluster import FakeCluster

TRIVIAL, REDUCE = "x = 1", "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
BACKENDS = ("local", "kubernetes")


def free_port() -> int:
    from tests.e2e.test_kubernetes import free_port as find

    return find()


def one_round(backend: str, warm: int, times: dict[str, list[float]]) -> None:
    options: dict = {"nodes": 2, "gpus": 2, "backend": backend}
    if backend == "kubernetes":
        options["kubernetes"] = {"image": "bench/agent:1", "dask_port": free_port()}
    started = time.perf_counter()
    cluster = Cluster(**options)
    assert cluster.run("1").value == 1
    times[f"{backend} cold"].append(time.perf_counter() - started)
    for label, code in (("trivial", TRIVIAL), ("all_reduce", REDUCE)):
        for _ in range(warm):
            t0 = time.perf_counter()
            assert cluster.run(code).ok
            times[f"{backend} warm {label}"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    cluster.close()
    times[f"{backend} down"].append(time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=20)
    args = parser.parse_args()
    times: dict[str, list[float]] = {
        f"{b} {what}": []
        for b in BACKENDS
        for what in ("cold", "warm trivial", "warm all_reduce", "down")
    }
    with tempfile.TemporaryDirectory() as root, FakeCluster(Path(root), processes=True) as fake:
        os.environ["KUBECONFIG"] = str(fake.kubeconfig)
        for _ in range(args.rounds):
            for backend in BACKENDS:
                one_round(backend, args.warm, times)
        assert fake.ours() == []
    print(f"2×2 gang, {args.rounds} rounds, {args.warm} warm cells each; medians (ms)")
    print(f"{'measure':<22}{'local':>12}{'kubernetes':>14}{'ratio':>9}")
    for what in ("cold", "warm trivial", "warm all_reduce", "down"):
        local = statistics.median(times[f"local {what}"]) * 1e3
        kube = statistics.median(times[f"kubernetes {what}"]) * 1e3
        print(f"{what:<22}{local:>12.1f}{kube:>14.1f}{kube / local:>8.2f}×")


if __name__ == "__main__":
    main()
