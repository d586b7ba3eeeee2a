"""Big values both ways, jupyter_mn beside ipyparallel and a memcpy, in one run.

Through real kernels (execute request → idle reply): a 2×2 ``%%cluster`` gang returns rank 0's
``SIZE`` float32 tensor to the notebook (the cell's value), and takes a notebook array of the
same size to every rank (a name the cell reads); ipyparallel pulls the same array from one
engine and pushes it to four. A memcpy of the bytes in the benchmark's own process is the floor.
Rounds interleave the tools, so load changes hit all of them alike. The notebook kernel's peak
memory while it receives the value (its high-water mark, reset before the cell, less its
resident size then) is printed against the value's size.

Run: ``.venv/bin/python -m bench.values [--mib 256] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from bench.cells import Kernel, interleave, ipyparallel_kernel, summarize


def rows(mib: int, rounds: int) -> tuple[dict[str, list[float]], list[int]]:
    """Each tool's times, and the kernel's peak growth (bytes) while receiving each value."""
    n = mib * 2**20 // 4
    mn, ipp = Kernel("jupyter_mn"), ipyparallel_kernel()
    make = f"import numpy as np, torch\nbig = np.ones({n}, dtype=np.float32)"
    growth: list[int] = []

    def value() -> float:
        pid = mn.km.provisioner.pid  # type: ignore[union-attr]
        before = _reset_peak(pid)
        took = mn.run("%%cluster\nx", timeout=600)
        growth.append(_peak(pid) - before)
        return took

    try:
        mn.run(f"%%cluster --nodes 2 --gpus 2\nx = torch.ones({n})", timeout=600)
        mn.run(make)
        ipp.run(make)
        ipp.run(f"%%px\nimport torch\nx = torch.ones({n}).numpy()")
        tools = {
            f"jupyter_mn value, {mib} MiB tensor → notebook": value,
            f"ipyparallel pull, {mib} MiB array ← 1 engine": lambda: ipp.run(
                "v = rc[0].pull('x', block=True)", timeout=600
            ),
            f"jupyter_mn push, {mib} MiB → 4 ranks": lambda: (
                changed(mn) or mn.run("%%cluster\ny = big.sum()", timeout=600)
            ),
            f"ipyparallel push, {mib} MiB → 4 engines": lambda: (
                changed(ipp) or ipp.run("dv.push({'big': big}, block=True)", timeout=600)
            ),
            f"memcpy {mib} MiB (this process)": lambda: memcpy(n),
        }
        for measure in tools.values():  # warm-up, not recorded
            measure()
        growth.clear()
        return interleave(tools, rounds), growth
    finally:
        ipp.run("ipp_cluster.stop_cluster_sync()")
        mn.run("%cluster down")
        for kernel in (mn, ipp):
            kernel.close()


def changed(kernel: Kernel) -> None:
    """A new value of ``big`` (its digest changes), so that the ranks do not hold it already."""
    kernel.run("big[0] += 1")


def _status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` size (``VmRSS``, ``VmHWM``) in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def _reset_peak(pid: int) -> int:
    """Reset the process's peak resident size to its current one (``clear_refs`` 5); that size."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")
    return _status(pid, "VmRSS")


def _peak(pid: int) -> int:
    return _status(pid, "VmHWM")


def memcpy(n: int) -> float:
    source = np.ones(n, dtype=np.float32)
    started = time.perf_counter()
    source.copy()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    samples, growth = rows(args.mib, args.rounds)
    medians = {name: summarize(values)[0] for name, values in samples.items()}
    names = list(medians)
    print(f"{'':52} {'median':>9} {'p95':>9}  ratio")
    for name in names:
        ratio = ""
        if name.startswith("jupyter_mn"):
            peer = names[names.index(name) + 1]
            ratio = f"{medians[name] / medians[peer]:.2f}× ipyparallel"
        p95 = summarize(samples[name])[1]
        print(f"{name:52} {medians[name]:8.3f}s {p95:8.3f}s  {ratio}")
    peak = statistics.median(growth) / 2**20
    print(f"\nkernel's peak growth while receiving the value: median {peak:.0f} MiB, most ", end="")
    print(f"{max(growth) / 2**20:.0f} MiB ({max(growth) / (args.mib * 2**20):.2f}× the value)")
    print(f"load average (1 min) at the start {load:.1f}, at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
