"""``python -m jupyter_mn.node.probe < OPTIONS_JSON``: what a node looks like to its ranks, as JSON.

It runs as a fresh process with the ranks' environment and working directory, so it sees what
they will see (PYTHONPATH shadowing, CUDA_VISIBLE_DEVICES, NCCL_* variables, mounts). It only
gathers facts; the doctor (kernel side, ``jupyter_mn/doctor.py``) judges them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from .netif import interfaces, route

PACKAGES = ("jupyter_mn", "cloudpickle", "torch")
#: Variables that decide which GPUs, interface and transport NCCL and gloo use.
ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
)


def machine_id() -> str:
    """Same value for processes of one machine (and one PID namespace), distinct across nodes."""
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    pidns = ""
    with contextlib.suppress(OSError):
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    return f"{socket.gethostname()}/{boot}/{pidns}"


def packages() -> dict[str, dict[str, str | None]]:
    """Version and location of each package as this interpreter imports it (not as pip says)."""
    found: dict[str, dict[str, str | None]] = {}
    for name in PACKAGES:
        try:
            module = importlib.import_module(name)
            found[name] = {
                "version": str(getattr(module, "__version__", "unknown")),
                "path": str(Path(module.__file__ or "").parent),
                "error": None,
            }
        except Exception as exc:
            found[name] = {"version": None, "path": None, "error": f"{type(exc).__name__}: {exc}"}
    return found


def accelerator() -> dict[str, Any]:
    """CUDA and NCCL versions of the torch build, and the GPUs this process can see."""
    try:
        import torch
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "gpus": 0}
    nccl = None
    with contextlib.suppress(Exception):
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    gpus = torch.cuda.device_count()
    names = []
    with contextlib.suppress(Exception):
        names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    return {"cuda": torch.version.cuda, "nccl": nccl, "gpus": gpus, "names": names, "error": None}


def hostname_ips() -> list[str]:
    """What this host's name resolves to: gloo binds there unless GLOO_SOCKET_IFNAME is set."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos})


def reach(addr: str, port: int, timeout: float) -> dict[str, Any]:
    """Open a TCP connection to ``addr:port``, retrying until ``timeout`` (the listener may be
    a moment late); close it from this side first, so the listener's port is not held."""
    deadline = time.monotonic() + timeout
    started = time.perf_counter()
    error = ""
    while True:
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, timeout / 3)) as conn:
                conn.shutdown(socket.SHUT_WR)
            return {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 1)}
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            return {"ok": False, "error": error}
        time.sleep(0.1)  # retry until the deadline: node 0's listener may start a moment later


def rdma_ports(root: str = "/") -> list[dict[str, Any]]:
    """The node's InfiniBand / RoCE ports as ``node/rdma.py`` judges them, as plain data."""
    from .rdma import detect

    return [
        {
            "device": p.hca,
            "port": str(p.port),
            "state": p.state.partition(":")[2].strip() or p.state,
            "link_layer": p.link_layer or "InfiniBand",
            "rate_gbps": p.rate_gbps,
            "problem": p.problem,
        }
        for p in detect(root).ports
    ]


def space(path: str) -> dict[str, Any] | None:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return {"path": os.path.abspath(path), "total": usage.total, "free": usage.free}


def facts(options: dict[str, Any]) -> dict[str, Any]:
    """Everything the doctor checks, for this node."""
    nics = interfaces()
    master = options.get("master") or {}
    result: dict[str, Any] = {
        "host": socket.gethostname(),
        "machine": machine_id(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "packages": packages(),
        "accelerator": accelerator(),
        "interfaces": nics,
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "hostname_ips": hostname_ips(),
        "rdma": rdma_ports(),
        "shm": space("/dev/shm"),
        "disk": space("."),
        "paths": {p: os.path.exists(p) for p in options.get("paths", [])},
    }
    if master:
        result["route"] = route(master["addr"], nics)
        result["master"] = reach(master["addr"], master["port"], options.get("reach_timeout", 5))
    return result


def main() -> None:
    print(json.dumps(facts(json.load(sys.stdin))))


if __name__ == "__main__":
    main()
