"""The doctor's checks: each judges every node's probe facts (and the kernel's versions).

Pure functions of the facts, so each can be made to fail on purpose in tests; the fix for every
✘ says what to change, on which node.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..model.spec import ClusterSpec

GIB = 1 << 30


@dataclass(frozen=True)
class Cell:
    """One check on one node: ✔ (True), ✘ (False) or not checked (None)."""

    ok: bool | None
    value: str
    fix: str = ""


@dataclass(frozen=True)
class Check:
    name: str
    cells: tuple[Cell, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.cells)


Judge = Callable[["ClusterSpec", Sequence[dict[str, Any]], dict[str, Any], tuple[str, int]], Check]


def judge(
    spec: ClusterSpec,
    facts: Sequence[dict[str, Any]],
    kernel: dict[str, Any],
    master: tuple[str, int],
) -> list[Check]:
    """Every check, in checklist order (a node whose probe failed shows "?" in each row)."""
    checks = [fn(spec, facts, kernel, master) for fn in CHECKS]
    if spec.check_paths:
        checks.append(check_paths(spec, facts, kernel, master))
    if any("error" in f for f in facts):
        checks.insert(
            0,
            Check(
                "probe",
                tuple(
                    Cell(False, "no answer", f"the probe failed on node {n}: {f['error']}")
                    if "error" in f
                    else Cell(True, f.get("host", ""))
                    for n, f in enumerate(facts)
                ),
            ),
        )
    return checks


def _per_node(
    facts: Sequence[dict[str, Any]], cell: Callable[[int, dict[str, Any]], Cell]
) -> tuple[Cell, ...]:
    return tuple(Cell(None, "?") if "error" in f else cell(n, f) for n, f in enumerate(facts))


def _majority(values: Sequence[Any]) -> Any:
    """The most common value (the earliest node's among equals)."""
    counts = Counter(values)
    return max(values, key=lambda v: (counts[v], -values.index(v)))


def _base(version: str | None) -> str:
    return (version or "").split("+")[0]


def _version_of(name: str) -> Callable[[dict[str, Any]], str | None]:
    """The version of ``name`` a node's interpreter imports (None when it cannot)."""
    return lambda f: f["packages"][name]["version"]


def _version_check(
    name: str,
    value: Callable[[dict[str, Any]], str | None],
    facts: Sequence[dict[str, Any]],
    kernel_value: str | None,
    fix: Callable[[int, dict[str, Any], str], str],
    key: Callable[[str | None], str] = lambda v: v or "none",
) -> Check:
    """✘ where a node differs from the kernel's value, or (without one) from most nodes.
    ``key`` picks what must be equal (e.g. torch's version without the local part)."""
    live = [key(value(f)) for f in facts if "error" not in f]
    wanted = key(kernel_value) if kernel_value is not None else (_majority(live) if live else None)

    def cell(n: int, f: dict[str, Any]) -> Cell:
        mine = value(f)
        if key(mine) != wanted:
            return Cell(False, mine or "none", fix(n, f, wanted or "none"))
        return Cell(True, mine or "none")

    return Check(name, _per_node(facts, cell))


def check_python(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    return _version_check(
        "python",
        lambda f: f["python"],
        facts,
        kernel["python"],
        lambda n, f, want: (
            f"node {n} runs Python {f['python']} ({f['executable']}); cells and notebook "
            f"functions are pickled by a Python {want} kernel: use Python {want} there"
        ),
        key=lambda v: ".".join((v or "").split(".")[:2]),
    )


def _package_fix(name: str) -> Callable[[int, dict[str, Any], str], str]:
    def fix(n: int, f: dict[str, Any], want: str) -> str:
        found = f["packages"][name]
        where = f"loads {found['path']}" if found["path"] else found["error"]
        return (
            f"node {n} {where}; install {name}=={want} in its environment "
            f"({f['executable']}), or remove what shadows it (PYTHONPATH)"
        )

    return fix


def check_torch(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    version, fix = _version_of("torch"), _package_fix("torch")
    by_kernel = _version_check("torch", version, facts, kernel["torch"], fix, key=_base)
    across = _version_check("torch", version, facts, None, fix)  # the build, e.g. +cu128
    pairs = zip(by_kernel.cells, across.cells, strict=True)
    return Check("torch", tuple(a if a.ok is False else b for a, b in pairs))


def _package_check(name: str) -> Judge:
    def check(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
        return _version_check(name, _version_of(name), facts, kernel[name], _package_fix(name))

    return check


def _build_check(name: str, field_name: str) -> Judge:
    def check(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
        return _version_check(
            name,
            lambda f: f["accelerator"].get(field_name),
            facts,
            None,
            lambda n, f, want: (
                f"node {n} has {name} {f['accelerator'].get(field_name) or 'none'}, most nodes "
                f"{want}: install the same torch build (CUDA/NCCL) on every node"
            ),
        )

    return check


def check_gpus(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    counts = [f["accelerator"].get("gpus", 0) for f in facts if "error" not in f]
    any_gpu = any(counts)

    def cell(n: int, f: dict[str, Any]) -> Cell:
        count = f["accelerator"].get("gpus", 0)
        visible = f["env"].get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        if not any_gpu:
            return Cell(True, "none: CPU ranks (gloo)")
        if count == 0:
            return Cell(
                False,
                "none",
                f"node {n} sees no GPU{shown} while other nodes do; every node needs GPUs "
                "(nccl) or none does (gloo): check the driver and CUDA_VISIBLE_DEVICES there",
            )
        if count < spec.gpus:
            return Cell(
                False,
                f"{count} of {spec.gpus}",
                f"node {n} sees {count} GPU(s){shown}, --gpus {spec.gpus} needs one per rank: "
                f"use --gpus {count}, or make more GPUs visible",
            )
        used = f", {spec.gpus} used" if count > spec.gpus else ""
        return Cell(True, f"{count}{used}{shown}")  # the node's own GPUs, where it has a list

    return Check("GPUs", _per_node(facts, cell))


def check_master(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    addr, port = master

    def cell(n: int, f: dict[str, Any]) -> Cell:
        reach = f.get("master") or {}
        if reach.get("ok"):
            return Cell(True, f"{addr}:{port} {reach['ms']:g} ms")
        return Cell(
            False,
            f"{addr}:{port} unreachable",
            f"node {n} cannot open TCP to MASTER_ADDR:PORT {addr}:{port} "
            f"({reach.get('error', 'not tested')}): allow TCP between the nodes (firewall, "
            "security group), or give node 0's worker an address the others reach "
            "(dask worker --host / --contact-address)",
        )

    return Check("master", _per_node(facts, cell))


def ifname_matches(value: str, names: Sequence[str]) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME selects: comma-separated prefixes, ``=`` for exact
    names, a leading ``^`` to exclude (NCCL's rules)."""
    exclude = value.startswith("^")
    value = value[1:] if exclude else value
    exact = value.startswith("=")
    value = value[1:] if exact else value
    parts = [p for p in value.split(",") if p]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in parts)

    return [n for n in names if hit(n) != exclude]


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def check_interface(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    """The interface the collectives use: the user's NCCL_SOCKET_IFNAME (GPUs) or
    GLOO_SOCKET_IFNAME (CPU), else the one the agent chooses toward the master."""
    live = [f for f in facts if "error" not in f]
    machines = len({f["machine"] for f in live})
    gpus = any(f["accelerator"].get("gpus") for f in live)
    addr = master[0]

    def cell(n: int, f: dict[str, Any]) -> Cell:
        up = {i["name"]: i for i in f["interfaces"] if i["up"] and i["ips"]}
        variable = "NCCL_SOCKET_IFNAME" if gpus else "GLOO_SOCKET_IFNAME"
        value = f["env"].get(variable)
        if value is not None:
            chosen = (
                ifname_matches(value, list(up))
                if gpus
                else [v for v in value.split(",") if v in up]
            )
            if not chosen or (not gpus and len(chosen) < len(value.split(","))):
                return Cell(
                    False,
                    f"{variable}={value}: no match",
                    f"{variable}={value} names no interface that is up on node {n} "
                    f"(up: {', '.join(up) or 'none'}); set it to the nodes' shared network",
                )
            if machines > 1 and all(up[c]["loopback"] for c in chosen):
                return Cell(
                    False,
                    f"{variable}={value}: loopback",
                    f"{variable}={value} selects only loopback on node {n}, but the gang spans "
                    f"{machines} machines: name the nodes' shared network interface",
                )
            return Cell(True, f"{','.join(chosen)} ({variable})")
        if machines > 1 and _loopback(addr):
            return Cell(
                False,
                f"master {addr} is loopback",
                f"MASTER_ADDR {addr} is a loopback address, but the gang spans {machines} "
                "machines: start node 0's dask worker on a reachable address (--host)",
            )
        route = f.get("route") or {}
        if route.get("interface"):  # the agent sets both variables to it (node/netif.py)
            speed = up.get(route["interface"], {}).get("speed_mbps") or 0
            rate = f", {speed / 1000:g} Gb/s" if speed else ""
            return Cell(True, f"{route['interface']} {route['ip']}{rate} ({variable}, chosen)")
        ips = f["hostname_ips"]
        if machines > 1 and not gpus and all(_loopback(ip) for ip in ips):
            found = (
                f"resolves to {', '.join(ips)}, so gloo would listen on loopback"
                if ips
                else "resolves to no address, so gloo has none to listen on"
            )
            return Cell(
                False,
                f"gloo: hostname {'is loopback' if ips else 'unresolved'}",
                f"node {n}'s hostname {f['host']} {found}: --env GLOO_SOCKET_IFNAME=<interface>",
            )
        return Cell(
            False,
            "no route to master",
            f"node {n} has no route to MASTER_ADDR {addr} ({route.get('error')})",
        )

    return Check("interface", _per_node(facts, cell))


def check_rdma(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    def cell(n: int, f: dict[str, Any]) -> Cell:
        ports = f["rdma"]
        active = [p for p in ports if not p["problem"]]
        shown = ", ".join(
            f"{p['device']}/{p['port']} {p['link_layer']} {p['rate_gbps'] or '?'} Gb/s"
            for p in active
        )
        if not spec.rdma:
            return Cell(None, shown or "not requested")
        if active:
            return Cell(True, shown)
        if ports:
            states = ", ".join(f"{p['device']}/{p['port']} {p['problem']}" for p in ports)
            return Cell(
                False,
                "no usable port",
                f"node {n} has RDMA ports but none usable ({states}): check the link "
                "(ibstat, cabling, subnet manager) and the devices in /dev/infiniband, "
                "or drop --rdma to use sockets",
            )
        return Cell(
            False,
            "no RDMA device",
            f"--rdma, but node {n} has no InfiniBand/RoCE device in /sys/class/infiniband: "
            "install the driver (rdma-core / MLNX_OFED), expose the device to the container, "
            "or drop --rdma",
        )

    return Check("RDMA", _per_node(facts, cell))


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB"


def check_shm(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    def cell(n: int, f: dict[str, Any]) -> Cell:
        shm = f["shm"]
        if shm is None:
            return Cell(False, "missing", f"node {n} has no /dev/shm: NCCL and DataLoader need it")
        if shm["total"] < spec.min_shm_gb * GIB:
            return Cell(
                False,
                _size(shm["total"]),
                f"/dev/shm on node {n} is {_size(shm['total'])} (< {spec.min_shm_gb:g} GiB): "
                "NCCL's shared-memory transport and DataLoader workers fail; docker: "
                "--shm-size=16g or --ipc=host; Kubernetes: an emptyDir (medium: Memory) at "
                "/dev/shm; or lower --min-shm-gb",
            )
        return Cell(True, _size(shm["total"]))

    return Check("/dev/shm", _per_node(facts, cell))


def check_disk(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    def cell(n: int, f: dict[str, Any]) -> Cell:
        disk = f["disk"]
        if disk["free"] < spec.min_disk_gb * GIB:
            return Cell(
                False,
                f"{_size(disk['free'])} free",
                f"only {_size(disk['free'])} free at {disk['path']} on node {n} "
                f"(< {spec.min_disk_gb:g} GiB) for checkpoints: free space, write checkpoints "
                "elsewhere, or lower --min-disk-gb",
            )
        return Cell(True, f"{_size(disk['free'])} free")

    return Check("disk", _per_node(facts, cell))


def check_paths(spec: Any, facts: Sequence[dict], kernel: dict, master: Any) -> Check:
    def cell(n: int, f: dict[str, Any]) -> Cell:
        missing = [p for p, present in f["paths"].items() if not present]
        if missing:
            return Cell(
                False,
                f"{len(missing)} missing",
                f"missing on node {n} (cwd {f['cwd']}): {', '.join(missing)}; mount or copy "
                "them there",
            )
        return Cell(True, f"{len(f['paths'])} present")

    return Check("paths", _per_node(facts, cell))


CHECKS: tuple[Judge, ...] = (
    check_python,
    check_torch,
    _build_check("CUDA", "cuda"),
    _build_check("NCCL", "nccl"),
    _package_check("jupyter_mn"),
    _package_check("cloudpickle"),
    check_gpus,
    check_master,
    check_interface,
    check_rdma,
    check_shm,
    check_disk,
)
