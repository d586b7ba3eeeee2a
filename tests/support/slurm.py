"""A real Slurm (Debian's slurmctld, slurmd and munge) on the test hosts of ``hosts.py``.

One ``slurmd -N node-K`` per test host, inside its namespace with its hostname, so batch scripts
and job steps run "on" that host (its address, its hostname); ``slurmctld`` listens on the
bridge's address. munged runs with a key generated here and its own socket; slurm.conf names that
socket, so nothing of the machine's own munge or Slurm (``/etc``) is used. No cgroups:
``proctrack/linuxproc`` and ``task/none`` work in a container. Every name, port and directory is
this instance's own, so test sessions run side by side; ``close`` kills every daemon by PID
(what their jobs left runs in the hosts' namespaces, which ``HostNet`` kills).

Clients (``sbatch``, ``squeue``, a kernel using ``--backend slurm``) find this cluster through
``SLURM_CONF``: see ``env``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support.hosts import Host, HostNet

#: Daemons started here must not carry the test session's mark: they are not leftovers of a
#: test (``procs.ours``), they are this fixture's, and it kills them itself.
_UNMARKED = ("JUPYTER_MN_TEST_TOKEN",)
_BINARIES = (
    "nsenter",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scancel",
    "scontrol",
    "srun",
    "munged",
)
#: CPUs each test node declares (config_overrides: more than the container has is fine)
NODE_CPUS = 4


def missing() -> str | None:
    """Why a real Slurm cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "a test Slurm needs root (slurmd, network namespaces)"
    absent = [b for b in _BINARIES if shutil.which(b) is None]
    if absent:
        return f"a test Slurm needs {', '.join(absent)} (apt-get install slurmctld slurmd munge)"
    return None


def on_host(host: Host, argv: list[str], hosts: Path) -> list[str]:
    """``argv`` on ``host`` with the machine's /sys: ``ip netns exec`` (``Host.command``) mounts
    a sysfs of the namespace, without /sys/fs/cgroup, and slurmd 22.05 refuses to start without
    its cgroup plugin even when no cgroup is used; ``nsenter`` joins only the network, so the
    files ``ip netns exec`` would mount over /etc are mounted here, in a mount namespace of its
    own: the host's ``resolv_conf`` (its loopback, refused at once: the machine's nameserver is
    out of reach and c10d's reverse lookups would wait 20 s) and ``hosts``, which names every
    node, as a cluster's nodes resolve each other (torchrun needs its own name to resolve).
    """
    return [
        "nsenter",
        f"--net=/run/netns/{host.netns}",
        "unshare",
        "--uts",
        "--mount",
        "sh",
        "-c",
        'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts'
        ' && hostname "$0" && shift 2 && exec "$@"',
        host.hostname,
        str(host.resolv_conf),
        str(hosts),
        *argv,
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


@dataclass
class SlurmCluster:
    """The daemons of one test Slurm and the configuration its clients read."""

    root: Path
    net: HostNet
    name: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    @property
    def nodes(self) -> list[str]:
        return [h.hostname for h in self.net.hosts]

    @classmethod
    @contextlib.contextmanager
    def start(cls, net: HostNet, root: Path, timeout: float = 60.0) -> Iterator[SlurmCluster]:
        """slurmctld on ``net``'s bridge, a slurmd on each of its hosts, all nodes idle; every
        daemon killed however the body ends."""
        cluster = cls(root=root, net=net, name=f"jmn{net.tag}")
        try:
            cluster._munge()
            cluster._write_conf()
            cluster._spawn(["slurmctld", "-D", "-i", "-f", str(cluster.conf)], "slurmctld")
            hosts = root / "hosts"
            names = "".join(f"{h.ip} {h.hostname}\n" for h in net.hosts)
            hosts.write_text(f"127.0.0.1 localhost\n{names}")
            for host in net.hosts:
                (root / f"spool-{host.hostname}").mkdir()
                argv = ["slurmd", "-D", "-N", host.hostname, "-f", str(cluster.conf)]
                cluster._spawn(on_host(host, argv, hosts), f"slurmd-{host.hostname}")
            cluster.wait_idle(timeout)
            yield cluster
        finally:
            cluster.close()

    def _spawn(self, argv: list[str], log: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _UNMARKED}
        env.update(self.env)
        with open(self.root / f"{log}.out", "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def _munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            "munged",
        )
        deadline = time.monotonic() + 10
        while not Path(self.munge_socket).exists():
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self.log('munged')}")
            time.sleep(0.05)

    @property
    def munge_socket(self) -> str:
        return str(self.root / "munge" / "munge.socket")

    def _write_conf(self) -> None:
        nodes = "\n".join(
            f"NodeName={h.hostname} NodeAddr={h.ip} CPUs={NODE_CPUS} State=UNKNOWN"
            for h in self.net.hosts
        )
        names = ",".join(self.nodes)
        state = self.root / "state"
        state.mkdir()
        self.conf.write_text(
            f"""ClusterName={self.name}
SlurmctldHost=localhost({self.net.gateway})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={state}
SlurmdSpoolDir={self.root}/spool-%n
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd-%n.pid
SlurmctldLogFile={self.root}/slurmctld.log
SlurmdLogFile={self.root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
MessageTimeout=10
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""
        )

    # ---- what tests ask
    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        """A Slurm client command against this cluster; its stdout."""
        done = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> list[str]:
        """Every job squeue still lists (id state reason)."""
        return self.run("squeue", "-h", "-o", "%i %T %r").split("\n")[:-1]

    def wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited: {proc.args}\n{self.logs()}")
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle: {states}\n{self.logs()}")
            time.sleep(0.2)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.out"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Kill every daemon (by PID, slurmd before slurmctld before munged)."""
        procs = [psutil.Process(p.pid) for p in reversed(self.procs) if p.poll() is None]
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        for p in self.procs:
            p.wait(timeout=1)
        self.procs = []
