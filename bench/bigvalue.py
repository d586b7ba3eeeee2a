"""A 2 GiB value through a real kernel: its time, and the kernel's peak memory while it arrives.

A 1×1 local ``%%cluster`` gang holds a ``SIZE`` uint8 tensor; the cell returning it is timed
from execute request to idle reply, and the kernel's peak resident memory (``VmHWM``, reset by
``clear_refs`` just before) is read after it, beside its resident memory before. Needs about
twice ``SIZE`` free (rank and kernel; the agent relays a few MiB at a time): check ``free -g``
first. On a loaded
machine the agent may not answer the kernel's heartbeat while it relays the value (the node is
then judged unreachable after ``liveness_timeout``): ``JUPYTER_MN_LIVENESS_TIMEOUT=300`` measures
the value path alone.

Run: ``.venv/bin/python -m bench.bigvalue [--mib 2048]``.
"""

from __future__ import annotations

import argparse
import pathlib

import psutil

from bench.cells import Kernel

_MIB = 1 << 20


def _kernel_pid(kernel: Kernel) -> int:
    return kernel.km.provisioner.process.pid


def _status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` field, in bytes."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def measure(mib: int) -> dict[str, float]:
    kernel = Kernel("jupyter_mn")
    try:
        kernel.run(
            f"%%cluster --nodes 1 --gpus 1\nimport torch\nx = torch.ones({mib * _MIB}, "
            "dtype=torch.uint8)\nx[::4096] = 7",
            timeout=600,
        )
        kernel.run("import torch")  # the kernel's first tensor imports it: not the value's cost
        pid = _kernel_pid(kernel)
        before = psutil.Process(pid).memory_info().rss
        pathlib.Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        took = kernel.run("%%cluster\nx", timeout=600)
        peak = _status(pid, "VmHWM")
        kernel.run(f"assert _.numel() == {mib * _MIB} and int(_[::4096].sum()) == 7 * {mib * 256}")
        return {
            "seconds": took,
            "MiB/s": mib / took,
            "kernel RSS before, MiB": before / _MIB,
            "kernel peak RSS, MiB": peak / _MIB,
            "peak - before, × value": (peak - before) / (mib * _MIB),
        }
    finally:
        kernel.run("%cluster down")
        kernel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=2048)
    args = parser.parse_args()
    print(f"a {args.mib} MiB value, 1×1 local gang → a real kernel")
    for name, value in measure(args.mib).items():
        print(f"  {name:<28} {value:10.2f}")


if __name__ == "__main__":
    main()
