"""Cold start of a 2-node gang on a real Slurm, next to ``srun torchrun`` of a trivial script.

Both run on the test suite's Slurm (``tests/support/slurm.py``: Debian's slurmctld and one slurmd
per test host, a network namespace each; needs root), 1 rank per node, CPU (gloo), interleaved so
load changes hit both alike:

* gang: ``Cluster(nodes=2, gpus=1, backend="slurm").run(all_reduce)`` from nothing to the value:
  sbatch, the job starting, task 0's scheduler and both workers, the kernel connecting back,
  agents, rank processes, process group, the cell; then ``close()`` (scancel);
* srun torchrun: ``srun --nodes 2 --ntasks-per-node 1 torchrun --nnodes 2 … script`` with the same
  all_reduce (c10d rendezvous on node 0), from the command to its exit;
* warm cell: the same all_reduce again on the warm gang (what a notebook pays from then on).

Run: ``.venv/bin/python -m bench.slurm_start [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from jupyter_mn import Cluster
from tests.support.hosts import HostNet, missing
from tests.support.slurm import SlurmCluster
from tests.support.slurm import missing as slurm_missing

REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
SCRIPT = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "t = torch.ones(1)\ndist.all_reduce(t)\nassert t.item() == 2\n"
    "dist.destroy_process_group()\n"
)


def gang(times: dict[str, list[float]]) -> None:
    started = time.perf_counter()
    cluster = Cluster(nodes=2, gpus=1, backend="slurm", preflight=False)
    assert cluster.run(REDUCE).unwrap() == 2.0
    times["gang cold (sbatch → value)"].append(time.perf_counter() - started)
    t0 = time.perf_counter()
    assert cluster.run(REDUCE).unwrap() == 2.0
    times["gang warm cell"].append(time.perf_counter() - t0)
    cluster.close()


def torchrun(slurm: SlurmCluster, script: Path, times: dict[str, list[float]]) -> None:
    master = slurm.net.hosts[0].ip
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = ["srun", "--nodes=2", "--ntasks-per-node=1", torchrun, "--nnodes=2"]
    argv += ["--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={master}:29517"]
    started = time.perf_counter()
    slurm.run(*argv, "--rdzv-id=bench", str(script), timeout=300)
    times["srun torchrun (command → exit)"].append(time.perf_counter() - started)


def _fresh(folder: Path) -> Path:
    folder.mkdir()
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = missing() or slurm_missing()
    if reason:
        sys.exit(f"bench/slurm_start.py: {reason}")
    times: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="jmn-bench-slurm-") as tmp:
        root = Path(tmp)
        script = root / "reduce.py"
        script.write_text(SCRIPT)
        with HostNet.create(2) as net, SlurmCluster.start(net, _fresh(root / "slurm")) as slurm:
            os.environ.update(slurm.env)
            for _ in range(args.rounds):
                gang(times)
                slurm.wait_idle(60)
                torchrun(slurm, script, times)
                slurm.wait_idle(60)
    print(f"2 nodes x 1 rank (CPU, gloo) on a test Slurm, {args.rounds} round(s), median s:")
    width = max(len(k) for k in times)
    for label, values in times.items():
        print(f"  {label:<{width}}  {statistics.median(values):7.2f}")
    ratio = statistics.median(times["gang cold (sbatch → value)"]) / statistics.median(
        times["srun torchrun (command → exit)"]
    )
    print(f"  {'gang cold / srun torchrun':<{width}}  {ratio:7.2f}x")


if __name__ == "__main__":
    main()
