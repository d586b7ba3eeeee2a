"""How soon a shell command's line reaches the notebook: ``%cluster exec`` next to its peers.

A command prints its own wall-clock time on each line (``T=<seconds>``) every 0.3 s; the delay
is when the line arrives on the kernel's IOPub channel minus that time (one machine, one clock).
Side by side in one run, rounds interleaved:

* plain ipykernel ``!cmd`` (the floor: a local shell command in the notebook's kernel);
* jupyter_mn ``%cluster exec --all-nodes -- cmd`` on a warm 2-node gang;
* ipyparallel ``%%px --stream`` with ``!cmd`` on 2 engines.

Run: ``.venv/bin/python -m bench.exec_stream [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from typing import Any

from bench.cells import Kernel, table

LINES = 8
COMMAND = f"for i in $(seq {LINES}); do echo T=$(date +%s.%N); sleep 0.3; done"
PLAIN = "plain ipykernel !cmd"
MN = "jupyter_mn %cluster exec, 2 nodes"
IPP = "ipyparallel %%px --stream !cmd, 2 engines"
_STAMP = re.compile(r"T=(\d+\.\d+)")


def delays(kernel: Kernel, code: str) -> list[float]:
    """Seconds from each line's printing to its arrival in an IOPub stream message."""
    found: dict[str, float] = {}

    def hook(msg: dict[str, Any]) -> None:
        now, content = time.time(), msg["content"]
        # ipyparallel streams as display_data, then update_display_data with all lines so far
        text = content.get("text") or content.get("data", {}).get("text/plain", "")
        for stamp in _STAMP.findall(text):
            found.setdefault(stamp, now - float(stamp))

    reply = kernel.kc.execute_interactive(code, timeout=120, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")
    return list(found.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="commands per tool")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    plain, mn, ipp = Kernel("python3"), Kernel("jupyter_mn"), Kernel("python3")
    try:
        mn.run("%%cluster --nodes 2 --gpus 1\n0", timeout=600)
        ipp.run(
            "import ipyparallel as ipp\n"
            "ipp_cluster = ipp.Cluster(n=2, log_level=40)\n"
            "rc = ipp_cluster.start_and_connect_sync()\ndv = rc[:]\ndv.block = True\ndv.activate()",
            timeout=600,
        )
        tools = {
            PLAIN: lambda: delays(plain, f"!{COMMAND}"),
            MN: lambda: delays(mn, f"%cluster exec --all-nodes -- {COMMAND}"),
            IPP: lambda: delays(ipp, f"%%px --stream\n!{COMMAND}"),
        }
        samples: dict[str, list[float]] = {name: [] for name in tools}
        for _ in range(args.rounds):
            for name, measure in tools.items():
                samples[name].extend(measure())
        title = f"Line delay, command to notebook ({LINES} lines per node per round)"
        print(table(title, samples, 1000, "ms", {MN: IPP}), flush=True)
    finally:
        ipp.run("ipp_cluster.stop_cluster_sync()")
        for kernel in (plain, mn, ipp):
            kernel.close()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
