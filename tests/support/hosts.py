"""Test hosts: network namespaces on a bridge, each with its own address and hostname.

What a real cluster's nodes have and 127.0.0.x "hosts" do not: a non-loopback interface (``eth0``)
with an address of its own, a hostname that resolves to nothing (set with ``unshare --uts``, seen
only by the processes started on the host), and a link that can be cut or shaped (``tc``). The
machine's nameserver is out of a host's reach (nothing is routed off the bridge), so a host's
resolver asks its own loopback, which refuses at once: ``ip netns exec`` mounts
``/etc/netns/<netns>/resolv.conf`` over ``/etc/resolv.conf``. Without it every lookup (c10d's
reverse lookups of its peers, say) waits for the resolver's timeout. The namespaces share the
filesystem and the process table, so a process on a host runs this checkout's code with the same
interpreter.

Every instance takes its own names and /24 (``10.231.X.0``), so test sessions run side by side;
``close`` kills what runs inside (by PID, from ``ip netns pids``) and deletes namespaces and
bridge. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; ``missing()`` says why not.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

#: Only addresses inside bridges these tests make: never routed anywhere else.
_PREFIX = "10.231"
#: Where ``ip netns exec`` finds the files it mounts over /etc for a namespace's processes.
_NETNS_ETC = Path("/etc/netns")


def missing() -> str | None:
    """Why test hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "test hosts need root (ip netns, veth, bridge)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"test hosts need {tool} (iproute2, util-linux)"
    return None


def _ip(*args: str) -> None:
    _ip_tool("ip", *args)


def _ip_tool(*argv: str) -> None:
    """An iproute2 command (``ip``, ``tc``); its stderr in the error when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    """One test host: ``netns`` holds its ``eth0`` with ``ip``; processes get ``hostname``."""

    hostname: str
    netns: str
    ip: str
    #: the bridge's end of its link (in the root namespace): its egress is the host's ingress
    veth: str = ""

    def command(self, argv: list[str], hidden: Sequence[str] = ()) -> list[str]:
        """``argv`` run on this host: in its namespace, with its hostname (every exec replaces
        the one before, so the process started is ``argv``'s own). ``hidden`` directories are
        empty there (a tmpfs over each, in a mount namespace of the host's own): the host does
        not see them, as a machine whose filesystem is not the kernel's."""
        mounts = "".join(f"mount -t tmpfs jmn-hidden {shlex.quote(d)} && " for d in hidden)
        private = ["--mount", "--propagation", "private"] if hidden else []
        return [
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--uts",
            *private,
            "sh",
            "-c",
            f'hostname "$0" && {mounts}exec "$@"',
            self.hostname,
            *argv,
        ]

    @property
    def resolv_conf(self) -> Path:
        """The host's resolver settings: its own loopback, refused at once (see the module)."""
        return _NETNS_ETC / self.netns / "resolv.conf"

    def run(self, *argv: str) -> None:
        """A quick command in the namespace (``ip link``, ``tc``)."""
        _ip("netns", "exec", self.netns, *argv)

    def pids(self) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    def _tc(self, egress_of_host: bool, *args: str) -> None:
        """``tc`` on one end of the host's link: ``eth0`` (what the host sends) or the bridge's
        veth (what it receives)."""
        if egress_of_host:
            self.run("tc", *args)
        else:
            _ip_tool("tc", *args)

    def _devices(self) -> list[tuple[bool, str]]:
        return [(True, "eth0"), (False, self.veth)]

    def shape(self, rate: str, latency: str = "50ms") -> None:
        """Limit the link to ``rate`` (tc's units: ``200mbit``) both ways, as a slower port
        would (a token bucket: packets wait up to ``latency``, then drop)."""
        for mine, dev in self._devices():
            burst = "64kb"  # ≥ rate / HZ for every rate used here, small next to a message
            qdisc = ("tbf", "rate", rate, "burst", burst, "latency", latency)
            self._tc(mine, "qdisc", "add", "dev", dev, "root", *qdisc)

    def drop(self, peer: str | None = None, loss: int = 0) -> None:
        """Drop packets both ways: every packet to and from ``peer`` (an address: a cut between
        two machines only), or TCP segments ``loss``/32 of the time (a lossy link).

        This kernel has neither netem nor tc actions (gact, police), so packets are classified
        (u32) into an HTB class whose queue holds nothing (``pfifo limit 0``). What u32 can
        match that varies like chance: the TCP timestamp (a millisecond clock, offset at random
        per connection; its low byte at 47 after a 20-byte IP header and NOP, NOP, TS); so each
        connection loses what it sends in ``loss`` of every 32 milliseconds, bursts as on a
        congested link, and a retransmission (≥ 200 ms later) gets through as often as not.
        (The checksum is not computed yet at the qdisc, and the IP ID of DF packets is 0.)
        """
        for mine, dev in self._devices():
            tc = functools.partial(self._tc, mine)
            tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
            for cls in ("1:1", "1:2"):
                tc("class", "add", "dev", dev, "parent", "1:", "classid", cls, "htb", "rate",
                   "100gbit")  # fmt: skip
            tc("qdisc", "add", "dev", dev, "parent", "1:2", "pfifo", "limit", "0")
            rules: list[tuple[str, ...]] = []
            if peer is not None:  # the host sends to peer; receives from it
                rules.append(("match", "ip", "dst" if mine else "src", f"{peer}/32"))
            for value in range(loss):
                rules.append(("match", "ip", "protocol", "6", "0xff", "match", "u8",
                              str(value), "0x1f", "at", "47"))  # fmt: skip
            for rule in rules:
                tc("filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "u32", *rule,
                   "flowid", "1:2")  # fmt: skip

    def dropped(self) -> int:
        """Packets dropped so far by what ``shape`` or ``drop`` added, both ways."""
        total = 0
        for mine, dev in self._devices():
            argv = ["tc", "-s", "qdisc", "show", "dev", dev, "root"]
            if mine:
                argv = ["ip", "netns", "exec", self.netns, *argv]
            shown = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            found = re.search(r"\(dropped (\d+),", shown)  # the root qdisc's own counter
            total += int(found.group(1)) if found else 0
        return total

    def heal(self) -> None:
        """Remove what ``shape`` or ``drop`` added: the link is plain again."""
        for mine, dev in self._devices():
            with contextlib.suppress(OSError):
                self._tc(mine, "qdisc", "del", "dev", dev, "root")


@dataclass
class HostNet:
    """A bridge (``gateway`` is its address, where a scheduler listens) and hosts on it."""

    tag: str
    subnet: str
    hosts: list[Host] = field(default_factory=list)
    _made: int = 0

    @property
    def bridge(self) -> str:
        return f"jmb{self.tag}"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    @classmethod
    @contextlib.contextmanager
    def create(cls, count: int) -> Iterator[HostNet]:
        """``count`` hosts node-1 … node-N at 10.231.X.11 …, torn down however the body ends."""
        net = cls(tag=uuid.uuid4().hex[:6], subnet=_free_subnet())
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            for _ in range(count):
                net.add()
            yield net
        finally:
            net.close()

    def add(self, hostname: str = "") -> Host:
        """One more host (``hostname``: else node-N), with its own address on the bridge."""
        if self._made >= 240:
            raise OSError(f"no address left in {self.subnet}.0/24")
        self._made += 1
        i = self._made
        veth = f"jmv{self.tag}{i}"
        host = Host(hostname or f"node-{i}", f"jmn-{self.tag}-{i}", f"{self.subnet}.{10 + i}", veth)
        _ip("netns", "add", host.netns)
        self.hosts.append(host)  # from here on, close() removes it
        host.resolv_conf.parent.mkdir(parents=True)
        host.resolv_conf.write_text("nameserver 127.0.0.1\n")
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        host.run("ip", "addr", "add", f"{host.ip}/24", "dev", "eth0")
        host.run("ip", "link", "set", "eth0", "up")
        host.run("ip", "link", "set", "lo", "up")
        host.run("ip", "route", "add", "default", "via", self.gateway)
        return host

    def remove(self, host: Host) -> None:
        """Kill what runs on ``host`` (by PID), then delete its namespace (and veth pair)."""
        procs = []
        for pid in host.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
                os.kill(pid, signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)
        with contextlib.suppress(OSError):
            _ip("netns", "del", host.netns)
        shutil.rmtree(host.resolv_conf.parent, ignore_errors=True)
        self.hosts.remove(host)

    def close(self) -> None:
        """Remove every host, then the bridge."""
        for host in list(self.hosts):
            self.remove(host)
        with contextlib.suppress(OSError):
            _ip("link", "del", self.bridge)


def _free_subnet() -> str:
    """A 10.231.X /24 that no interface here uses (another session's bridge)."""
    used = {
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET
    }
    taken = {str(ipaddress.ip_address(a)).rsplit(".", 1)[0] for a in used}
    start = os.getpid() % 250
    for k in range(250):
        subnet = f"{_PREFIX}.{(start + k) % 250 + 1}"
        if subnet not in taken:
            return subnet
    raise OSError(f"no free /24 left in {_PREFIX}.0.0/16")
