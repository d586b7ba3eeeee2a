"""A node's network interfaces, and the one its ranks' collectives should use.

gloo without ``GLOO_SOCKET_IFNAME`` listens on the address the host's name resolves to: on a
cluster that is often loopback or nothing at all (a container's hostname), and NCCL's own pick
can be a docker bridge. The interface that carries this node's address toward ``MASTER_ADDR``
is the one the other nodes reach it by, so the agent sets both variables to it unless the user
did (docs/architecture.md, "Rank environment").
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import psutil


def interfaces() -> list[dict[str, Any]]:
    """Every interface: name, up, loopback, its addresses (no link-local ones), speed."""
    stats = psutil.net_if_stats()
    out = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        ips = [
            a.address.split("%")[0]
            for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)
            and not a.address.lower().startswith("fe80")
        ]
        stat = stats.get(name)
        out.append(
            {
                "name": name,
                "up": bool(stat and stat.isup),
                "loopback": any(ipaddress.ip_address(ip).is_loopback for ip in ips),
                "ips": ips,
                "speed_mbps": stat.speed if stat else 0,
            }
        )
    return out


def route(master_addr: str, nics: list[dict[str, Any]]) -> dict[str, Any]:
    """The interface this node uses to reach the master (the kernel's routing decides): the
    local address of a UDP socket connected toward it (no packet is sent), matched to an
    interface. On node 0 that is its own address, so a gang on one host gets loopback."""
    try:
        family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((master_addr, 9))
            local = sock.getsockname()[0]
    except OSError as exc:
        return {"ip": None, "interface": None, "error": f"{type(exc).__name__}: {exc}"}
    name = next((n["name"] for n in nics if local in n["ips"]), None)
    return {"ip": local, "interface": name, "error": None}


def socket_ifname(master_addr: str) -> str | None:
    """The interface for this node's ranks' sockets toward ``master_addr`` (None: unknown)."""
    return route(master_addr, interfaces())["interface"]
