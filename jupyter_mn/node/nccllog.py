"""NCCL ``NCCL_DEBUG=INFO`` lines → ``TransportReport``: what NCCL really uses, with proof.

NCCL says which network plugin it chose (``Using network IB``), which devices it opened
(``NET/IB : Using [0]mlx5_0:1/RoCE``), and, when a channel connects, the path of every hop
(``Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA``). The parser keeps the first line
that proves each fact, so a user can see *why* a badge says what it says. It accepts lines in
any order and from many ranks or files, and is fed incrementally by the node agent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..wire.events import TransportReport

_MARK = re.compile(r"NCCL (?:INFO|WARN) (?P<msg>.*?)\s*$")
_NETWORK = re.compile(r"^Using network (?P<name>.+)$")
_PATH = re.compile(
    r"^(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[[0-9a-fA-Fx]+\])? -> \d+(?:\[[0-9a-fA-Fx]+\])?"
    r"(?: \[(?:send|receive)\])? via (?P<path>.+)$"
)
_IB_USING = re.compile(r"^NET/IB ?: Using (?P<devs>.*)")
_IB_DEV = re.compile(r"\[\d+\](?P<dev>[^:\s]+):\d+/(?P<link>IB|RoCE)")
_SOCKET_USING = re.compile(r"^NET/Socket ?: Using \[\d+\]")
_OFI_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is (?P<prov>\S+)")
_NVLS_SUPPORT = re.compile(r"^NVLS multicast support is (?P<not>not )?available on dev")
_NVLS_CHANNELS = re.compile(r"\b(?P<n>\d+) nvls channels\b")
_NVLS_COMM = re.compile(r"^NVLS comm 0x")
_NODES = re.compile(r"\bnRanks \d+ nNodes (?P<n>\d+)\b")
_GDR_SUMMARY = re.compile(r"use ring PXN \d+ GDR (?P<gdr>\d)")
#: Lines that explain why NCCL could not use an RDMA network.
_REASONS = re.compile(
    r"NET/IB ?: No device found|Failed to open libibverbs|NCCL_IB_DISABLE set by environment "
    r"to 1|NET/IB ?: Unable to open device|ibv_open_device failed|Could not find any optimal "
    r"provider|NCCL_NET set by environment to Socket|NET/IB ?: No IP interface found"
)
_DEVICE_INDEX = re.compile(r"/\d+(?=/|$)")
MAX_EVIDENCE = 24


def normalize_path(path: str) -> str:
    """``NET/IB/3/GDRDMA`` → ``NET/IB/GDRDMA``: the kind of path, not the NIC it went through."""
    path = path.strip()
    if path == "direct shared memory":  # NCCL < 2.5
        return "SHM/direct"
    return _DEVICE_INDEX.sub("", path)


def is_inter_node(path: str) -> bool:
    return path.startswith(("NET/", "COLLNET"))


class NcclLog:
    """Accumulates NCCL lines; ``report()`` says what they prove so far."""

    def __init__(self) -> None:
        self.lines = 0
        self.plugins: list[str] = []
        self.links: dict[str, str] = {}
        self.ofi_provider = ""
        self.paths: dict[str, str] = {}
        self.socket_seen = False
        self.nvls_available: bool | None = None
        self.nvls_channels: int | None = None
        self.nvls_comm = False
        self.gdr_summary: bool | None = None
        #: how many nodes NCCL's communicators span (its ``comm … nNodes N`` line), when said
        self.nodes: int | None = None
        self.reasons: dict[str, str] = {}
        self._evidence: dict[str, str] = {}

    def feed_all(self, lines: Iterable[str]) -> NcclLog:
        for line in lines:
            self.feed(line)
        return self

    def feed(self, line: str) -> bool:
        """Take one line (anything; non-NCCL lines are ignored). True when it told us something."""
        found = _MARK.search(line)
        if found is None:
            return False
        self.lines += 1
        msg, line = found.group("msg"), line.strip()
        return any(check(msg, line) for check in self._checks())

    def _checks(self) -> tuple:
        return (
            self._network,
            self._path,
            self._ib_devices,
            self._socket,
            self._ofi,
            self._nvls,
            self._nodes,
            self._gdr,
            self._reason,
        )

    def _keep(self, key: str, line: str) -> bool:
        if key in self._evidence:
            return False
        self._evidence[key] = line
        return True

    def _network(self, msg: str, line: str) -> bool:
        m = _NETWORK.match(msg)
        if not m:
            return False
        name = m.group("name").strip()
        if name not in self.plugins:
            self.plugins.append(name)
        return self._keep(f"network {name}", line)

    def _path(self, msg: str, line: str) -> bool:
        m = _PATH.match(msg)
        if not m:
            return False
        path = normalize_path(m.group("path"))
        if path in self.paths:
            return False
        self.paths[path] = line
        return self._keep(f"path {path}", line)

    def _ib_devices(self, msg: str, line: str) -> bool:
        m = _IB_USING.match(msg)
        if not m:
            return False
        for dev in _IB_DEV.finditer(m.group("devs")):
            self.links[dev.group("dev")] = dev.group("link")
        return self._keep("ib devices", line)

    def _socket(self, msg: str, line: str) -> bool:
        if not _SOCKET_USING.match(msg):
            return False
        self.socket_seen = True
        return self._keep("socket devices", line)

    def _ofi(self, msg: str, line: str) -> bool:
        m = _OFI_PROVIDER.match(msg)
        if not m:
            return False
        self.ofi_provider = m.group("prov")
        return self._keep("ofi provider", line)

    def _nvls(self, msg: str, line: str) -> bool:
        if m := _NVLS_SUPPORT.match(msg):
            self.nvls_available = not m.group("not")
            return self._keep(f"nvls support {self.nvls_available}", line)
        if m := _NVLS_CHANNELS.search(msg):
            self.nvls_channels = max(self.nvls_channels or 0, int(m.group("n")))
            return self._keep(f"nvls channels {self.nvls_channels > 0}", line)
        if _NVLS_COMM.match(msg):
            self.nvls_comm = True
            return self._keep("nvls comm", line)
        return False

    def _nodes(self, msg: str, line: str) -> bool:
        m = _NODES.search(msg)
        if not m:
            return False
        self.nodes = max(self.nodes or 0, int(m.group("n")))
        return self._keep(f"nodes {self.nodes}", line)

    def _gdr(self, msg: str, line: str) -> bool:
        m = _GDR_SUMMARY.search(msg)
        if not m:
            return False
        self.gdr_summary = bool(self.gdr_summary) or m.group("gdr") == "1"
        return self._keep(f"gdr {self.gdr_summary}", line)

    def _reason(self, msg: str, line: str) -> bool:
        m = _REASONS.search(msg)
        if not m or m.group(0) in self.reasons:
            return False
        self.reasons[m.group(0)] = msg
        return self._keep(f"reason {m.group(0)}", line)

    # ---- conclusions
    @property
    def network(self) -> str:
        plugin = self.plugins[-1] if self.plugins else self._plugin_from_paths()
        if not plugin:
            return ""
        if plugin == "Socket":
            return "Socket"
        if plugin.startswith("IB"):
            links = set(self.links.values())
            return "RoCE" if links == {"RoCE"} else "IB"
        if "Libfabric" in plugin or "OFI" in plugin or self.ofi_provider:
            return "EFA" if self.ofi_provider.startswith("efa") or "AWS" in plugin else plugin
        return plugin

    def _plugin_from_paths(self) -> str:
        for path in self.paths:
            if path.startswith("NET/"):
                return path.split("/")[1]
        return ""

    def report(
        self, node: int = -1, hcas: tuple[str, ...] = (), nnodes: int | None = None
    ) -> TransportReport:
        """What the lines prove. ``nnodes``: the gang's node count (else NCCL's ``nNodes``); on
        one node no network is used, so nothing falls back, whatever plugin NCCL loaded."""
        inter = tuple(p for p in self.paths if is_inter_node(p))
        intra = [p for p in self.paths if not is_inter_node(p)]
        nvls = bool(self.nvls_channels) or self.nvls_comm
        if nvls:
            intra.append("NVLS")
        one_node = (nnodes or self.nodes) == 1
        network = self.network if inter or not one_node else ""
        gdr = any("GDRDMA" in p for p in inter) or bool(self.gdr_summary)
        fallback = not one_node and (
            network == "Socket" or any(p.startswith("NET/Socket") for p in inter)
        )
        return TransportReport(
            node=node,
            backend="nccl",
            network=network,
            inter_node=inter,
            intra_node=tuple(intra),
            gdr=gdr,
            nvls=nvls,
            fallback=fallback,
            reasons=() if one_node else tuple(self.reasons.values()),
            evidence=tuple(self._evidence.values())[:MAX_EVIDENCE],
            hcas=hcas,
            one_node=one_node,
        )
