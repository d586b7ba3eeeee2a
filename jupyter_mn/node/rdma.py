"""``--rdma``: find this node's usable RDMA ports in sysfs and tell NCCL which to use.

Per HCA port, sysfs has ``state`` (``4: ACTIVE``), ``link_layer`` (``InfiniBand`` or
``Ethernet`` = RoCE) and a GID table (``gids/<i>``, ``gid_attrs/types/<i>``,
``gid_attrs/ndevs/<i>``). In a container, sysfs may show ports and GIDs whose network device is
not in this network namespace; RoCE cannot use those. So for RoCE we pick the RoCE v2 GID with an
IPv4-mapped address whose netdev exists here, and set ``NCCL_IB_GID_INDEX`` only when NCCL's own
auto-selection (simulated below, NCCL ≥ 2.21; index 0 before) would pick another one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_V4_PREFIX = ["0000"] * 5 + ["ffff"]
_NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
#: NCCL picks a RoCE v2 GID of the socket family by itself from this version on.
_AUTO_GID_SINCE = (2, 21)


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    version: int  # 1 (IB/RoCE v1), 2 (RoCE v2), 0 unknown
    ndev: str = ""

    @property
    def valid(self) -> bool:
        return self.gid != _ZERO_GID

    @property
    def ipv4(self) -> str | None:
        parts = self.gid.split(":")
        if len(parts) == 8 and parts[:6] == _V4_PREFIX:
            return str(ipaddress.IPv4Address(int(parts[6] + parts[7], 16)))
        return None


@dataclass(frozen=True)
class RdmaPort:
    hca: str
    port: int
    state: str
    link_layer: str
    gids: tuple[Gid, ...] = ()
    #: RoCE only: the GID index NCCL must use from this namespace
    gid_index: int | None = None
    problem: str = ""
    #: link rate from sysfs ("200 Gb/sec (4X HDR)" → 200.0), None when unreadable
    rate_gbps: float | None = None

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    @property
    def usable(self) -> bool:
        return not self.problem

    @property
    def label(self) -> str:
        name = f"{self.hca}:{self.port}"
        if self.problem:
            return f"{name} unusable: {self.problem}"
        if not self.roce:
            return f"{name} InfiniBand"
        gid = self.gids[self.gid_index or 0]
        return f"{name} RoCE v{gid.version} GID {gid.index} ({gid.ndev} {gid.ipv4})"


@dataclass
class RdmaPlan:
    """What ``--rdma`` found on a node and the NCCL environment it implies."""

    ports: list[RdmaPort] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def usable(self) -> list[RdmaPort]:
        return [p for p in self.ports if p.usable]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.ports) + tuple(self.notes)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # real sysfs answers EINVAL for the attributes of an empty GID slot
        return ""


def _gids(port_dir: Path) -> tuple[Gid, ...]:
    gid_dir = port_dir / "gids"
    if not gid_dir.is_dir():
        return ()
    indexes = sorted(int(n) for n in os.listdir(gid_dir) if n.isdigit())
    out = []
    for i in indexes:
        kind = _read(port_dir / "gid_attrs" / "types" / str(i))
        version = 2 if "v2" in kind else (1 if "v1" in kind else 0)
        out.append(
            Gid(
                i,
                _read(gid_dir / str(i)),
                version,
                _read(port_dir / "gid_attrs" / "ndevs" / str(i)),
            )
        )
    return tuple(out)


def _choose_gid(gids: tuple[Gid, ...], netdevs: set[str]) -> tuple[int | None, str]:
    """The RoCE GID to use here: v2 over v1, IPv4-mapped, netdev present in this namespace."""
    candidates = [g for g in gids if g.valid and g.ipv4]
    if not candidates:
        return None, "no GID with an IPv4 address (RoCE needs the rail's IP on its netdev)"
    here = [g for g in candidates if g.ndev in netdevs]
    if not here:
        missing = sorted({g.ndev or "?" for g in candidates})
        return None, f"netdev {', '.join(missing)} of its GIDs is not in this network namespace"
    best = max(here, key=lambda g: (g.version == 2, -g.index))
    return best.index, ""


def detect(root: str | os.PathLike[str] = "/") -> RdmaPlan:
    """Read ``<root>/sys/class/infiniband`` and ``<root>/sys/class/net``; never raises."""
    root = Path(root)
    plan = RdmaPlan()
    ib = root / "sys" / "class" / "infiniband"
    if not ib.is_dir():
        plan.notes.append("no RDMA device (/sys/class/infiniband is missing)")
        return plan
    net = root / "sys" / "class" / "net"
    netdevs = set(os.listdir(net)) if net.is_dir() else set()
    for hca in sorted(os.listdir(ib)):
        ports = ib / hca / "ports"
        for port in sorted(
            (int(p) for p in os.listdir(ports) if p.isdigit()) if ports.is_dir() else []
        ):
            plan.ports.append(_port(hca, port, ports / str(port), netdevs))
    if not plan.ports:
        plan.notes.append("no RDMA port under /sys/class/infiniband")
    uverbs = root / "dev" / "infiniband"
    if plan.ports and not (
        uverbs.is_dir() and any(n.startswith("uverbs") for n in os.listdir(uverbs))
    ):
        plan.notes.append("no /dev/infiniband/uverbs*: the RDMA devices are not mounted here")
        plan.ports = [_unusable(p, "no /dev/infiniband/uverbs*") for p in plan.ports]
    return plan


def _unusable(port: RdmaPort, problem: str) -> RdmaPort:
    return dataclasses.replace(port, gid_index=None, problem=problem)


def _port(hca: str, port: int, path: Path, netdevs: set[str]) -> RdmaPort:
    state, link = _read(path / "state"), _read(path / "link_layer")
    gids = _gids(path)
    rate = _read(path / "rate").split(" ")[0]
    found = RdmaPort(
        hca,
        port,
        state,
        link,
        gids,
        rate_gbps=float(rate) if rate.replace(".", "", 1).isdigit() else None,
    )
    if "ACTIVE" not in state:
        return _unusable(found, f"port state {state or 'unknown'}")
    if link not in ("InfiniBand", "Ethernet"):
        return _unusable(found, f"link layer {link or 'unknown'}")
    if link == "InfiniBand":
        return found
    index, problem = _choose_gid(gids, netdevs)
    if problem:
        return _unusable(found, problem)
    return dataclasses.replace(found, gid_index=index)


def nccl_auto_gid(gids: tuple[Gid, ...], nccl_version: tuple[int, int] | None = None) -> int:
    """The GID index NCCL picks by itself for a RoCE port (``NCCL_IB_GID_INDEX`` unset).

    Mirrors ``ncclIbGetGidIndex`` (NCCL ≥ 2.21, defaults AF_INET and RoCE v2): walk the table,
    prefer IPv4 over the current family, then a valid RoCE v2 GID. It does not look at netdevs,
    which is exactly where it fails in containers. Older NCCL uses index 0.
    """
    if not gids or (nccl_version is not None and nccl_version < _AUTO_GID_SINCE):
        return 0
    table = {g.index: g for g in gids}
    chosen = table.get(0, gids[0])
    for cand in gids:
        if cand.index == 0:
            continue
        v4, chosen_v4 = cand.ipv4 is not None, chosen.ipv4 is not None
        other_version = chosen.version != cand.version or not chosen.valid
        if (v4 and not chosen_v4) or (v4 and cand.valid and other_version and cand.version == 2):
            chosen = cand
    return chosen.index


def installed_nccl_version() -> tuple[int, int] | None:
    """NCCL's version from the wheel torch uses (None when NCCL is linked in some other way)."""
    for package in _NCCL_PACKAGES:
        try:
            major, minor = metadata.version(package).split(".")[:2]
            return int(major), int(minor)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None


def plan(
    root: str | os.PathLike[str] = "/", nccl_version: tuple[int, int] | None = None
) -> RdmaPlan:
    """Detect ports and derive ``NCCL_IB_HCA`` (exact names) and, if needed, the GID index."""
    found = detect(root)
    usable = found.usable
    if not usable:
        if found.ports:
            found.notes.append("no usable RDMA port: NCCL would fall back to TCP sockets")
        return found
    found.env["NCCL_IB_HCA"] = "=" + ",".join(f"{p.hca}:{p.port}" for p in usable)
    roce = [p for p in usable if p.roce]
    wanted = {p.gid_index for p in roce}
    needs_index = [p for p in roce if nccl_auto_gid(p.gids, nccl_version) != p.gid_index]
    if needs_index and len(wanted) == 1:
        found.env["NCCL_IB_GID_INDEX"] = str(wanted.pop())
    elif needs_index:
        found.notes.append(
            "RoCE ports need different GID indexes "
            f"({', '.join(f'{p.hca}: {p.gid_index}' for p in roce)}); NCCL_IB_GID_INDEX not set"
        )
    return found
