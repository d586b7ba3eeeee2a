"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager,
scheduler and Kueue, with nodes whose kubelet is ours (``node.py``: pods run as processes).

Why: kmock and the controllers in tests/support/kube/ encode our reading of Kubernetes; the real API
server's validation, admission (PodSecurity, ServiceAccount, NodeRestriction), RBAC, garbage
collector and node lifecycle are what a user's cluster runs. The binaries come from Go modules
(``gobuild/build.sh``, cached by version); every component listens on 127.0.0.1 at a free port,
so two control planes run side by side; the flags follow envtest's and kwok's, and kubeadm's
identities (each component its own client certificate, bound by the bootstrap RBAC policy).

    python -m tests.support.kube.real up DIR  # DIR/kubeconfig once ready; stops on SIGTERM/SIGINT

``ControlPlane`` is the same thing as a context manager, for the pytest fixture. Everything it
writes is in DIR; stopping it (a ``finally``) leaves no process and no port behind.
"""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.kube import kueue
from tests.support.kube.kubelet import ClusterDns
from tests.support.kube.node import Nodes, RealNode
from tests.support.kube.pki import Authority, KeyPair, signing_key
from tests.support.kube.processes import Process, StartError, child_env, free_ports
from tests.support.kube.rest import Rest
from tests.support.kube.simnodes import SimulatedNodes

BUILD = Path(__file__).with_name("gobuild") / "build.sh"
KUBERNETES, ETCD, KUEUE = "v1.37.2", "v3.7.3", "v0.17.0"
#: Native gang scheduling (KEP-4671): beta and off by default in 1.37, API included.
GATES = "GenericWorkload=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
SERVICE_RANGE = "10.0.0.0/24"
#: A node whose Lease is this old is NotReady, then tainted (default 50 s): tests of a lost
#: node wait seconds, not minutes; the kubelet renews its Lease well within it.
NODE_GRACE_S = 10
START_TIMEOUT_S = 120.0


def binaries() -> Path:
    """The folder of built binaries, building what is missing (minutes cold, seconds warm)."""
    out = subprocess.run(["bash", str(BUILD)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def cached() -> Path | None:
    """The folder of built binaries if every one is there (None: a build is needed)."""
    out = subprocess.run(["bash", str(BUILD), "--cached"], stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip()) if out.returncode == 0 else None


def kubeconfig(
    path: Path, server: str, ca: Path, user: KeyPair | str, namespace: str = "default"
) -> Path:
    """A kubeconfig for one identity: a client certificate, or a bearer token (a
    ServiceAccount's). JSON is YAML: no dependency to write it."""
    credentials = (
        {"token": user}
        if isinstance(user, str)
        else {"client-certificate": str(user.cert), "client-key": str(user.key)}
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "real", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": credentials}],
        "contexts": [
            {"name": "real", "context": {"cluster": "real", "user": "user", "namespace": namespace}}
        ],
        "current-context": "real",
    }
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler, in DIR.

    ``kubeconfig`` (DIR/kubeconfig, the cluster admin) exists once every component is ready.
    """

    def __init__(
        self,
        root: Path,
        *,
        nodes: dict[str, int] | None = None,
        with_kueue: bool = True,
        bin_dir: Path | None = None,
        simulated: dict[str, int] | None = None,
        node_grace_s: int = NODE_GRACE_S,
        audit_users: tuple[str, ...] = (),
    ) -> None:
        """``nodes``: name → GPUs of each node our kubelet registers (default: two of 4);
        ``with_kueue``: install and start Kueue, its ClusterQueue's GPU quota all the nodes'
        GPUs; ``bin_dir``: the binaries' folder (default: build or reuse them);
        ``simulated``: name → GPUs of nodes that only report their pods Running
        (``simnodes.py``); ``node_grace_s``: how long a node's Lease may go unrenewed (many
        simulated nodes renew at the kubelet's 10 s, so they need the default 50 s);
        ``audit_users``: whose requests the API server logs to ``DIR/logs/audit.log``."""
        self.root = root.resolve()
        self.node_gpus = {"node-a": 4, "node-b": 4} if nodes is None else nodes
        self.simulated = simulated or {}
        self.node_grace_s, self.audit_users = node_grace_s, audit_users
        self.with_kueue, self.bin_dir = with_kueue, bin_dir
        self.kubeconfig = self.root / "kubeconfig"
        self.procs: list[Process] = []
        self.nodes: Nodes | None = None
        self.server = ""
        self.ca: Path
        self.admin: KeyPair
        self.pki: Authority
        self.rest: Rest

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- starting
    def start(self) -> None:
        bins = self.bin_dir = self.bin_dir or binaries()
        for sub in ("pki", "logs", "etc"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.pki = Authority(self.root / "pki")
        self.ca = self.pki.cert
        self.admin = self.pki.client("admin", "kubernetes-admin", "system:masters")
        env = child_env(self.root)
        etcd_port, peer_port, api_port, kcm_port, sched_port, hook, health = free_ports(7)
        self.server = f"https://127.0.0.1:{api_port}"
        self.rest = Rest(self.server, self._client_context())
        self._etcd(bins, env, etcd_port, peer_port)
        self._apiserver(bins, env, etcd_port, api_port)
        self._controller_manager(bins, env, kcm_port)
        self._scheduler(bins, env, sched_port)
        if self.with_kueue:
            self._kueue(bins, env, hook, health)
        # pods are admitted only once the namespace's ServiceAccount exists
        self.rest.wait(
            "/api/v1/namespaces/default/serviceaccounts/default",
            bool,
            START_TIMEOUT_S,
            "the default ServiceAccount",
        )
        self._nodes()
        kubeconfig(self.kubeconfig, self.server, self.ca, self.admin)

    def _run(self, name: str, argv: list[str], env: dict[str, str]) -> Process:
        proc = Process(name, argv, self.root / "logs" / f"{name}.log", env)
        self.procs.append(proc)
        return proc

    def _client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(self.admin.cert, self.admin.key)
        return context

    def _etcd(self, bins: Path, env: dict[str, str], port: int, peer: int) -> None:
        client, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        proc = self._run(
            "etcd",
            [
                str(bins / f"etcd-{ETCD}" / "etcd"),
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",  # a test cluster's data need not survive a power cut
                "--log-level=warn",
            ],
            env,
        )
        proc.wait_ready(f"{client}/health", None, START_TIMEOUT_S)

    def _apiserver(self, bins: Path, env: dict[str, str], etcd: int, port: int) -> None:
        serving = self.pki.serving(
            "apiserver",
            ["127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default.svc"],
        )
        to_kubelet = self.pki.client("apiserver-kubelet", "kube-apiserver", "system:masters")
        sa = signing_key(self.root / "pki")
        proc = self._run(
            "kube-apiserver",
            [
                str(bins / f"kubernetes-{KUBERNETES}" / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.root / 'pki' / 'apiserver-generated'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca}",
                f"--kubelet-client-certificate={to_kubelet.cert}",
                f"--kubelet-client-key={to_kubelet.key}",
                f"--kubelet-certificate-authority={self.ca}",
                # a node's Hostname address is its name, which resolves nowhere here
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",  # kubeadm's addition to the default
                # the "kubernetes" Service's endpoints cannot be a loopback address (kwok does so)
                "--endpoint-reconciler-type=none",
                f"--feature-gates={GATES}",
                f"--runtime-config={RUNTIME_CONFIG}",
                "--profiling=false",
                *self._audit(),
            ],
            env,
        )
        proc.wait_ready(f"{self.server}/readyz", self._client_context(), START_TIMEOUT_S)

    def _component_kubeconfig(self, name: str, user: str) -> Path:
        pair = self.pki.client(name, user)
        return kubeconfig(self.root / "etc" / f"{name}.kubeconfig", self.server, self.ca, pair)

    def _controller_manager(self, bins: Path, env: dict[str, str], port: int) -> None:
        config = self._component_kubeconfig("controller-manager", "system:kube-controller-manager")
        sa = self.root / "pki" / "sa.key"
        proc = self._run(
            "kube-controller-manager",
            [
                str(bins / f"kubernetes-{KUBERNETES}" / "kube-controller-manager"),
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",  # kubeadm: an SA each
                f"--root-ca-file={self.ca}",
                f"--service-account-private-key-file={sa}",
                "--node-monitor-period=1s",
                f"--node-monitor-grace-period={self.node_grace_s}s",
                f"--feature-gates={GATES}",
                "--profiling=false",
            ],
            env,
        )
        insecure = ssl._create_unverified_context()  # its serving certificate is self-signed
        proc.wait_ready(f"https://127.0.0.1:{port}/healthz", insecure, START_TIMEOUT_S)

    def _scheduler(self, bins: Path, env: dict[str, str], port: int) -> None:
        config = self._component_kubeconfig("scheduler", "system:kube-scheduler")
        proc = self._run(
            "kube-scheduler",
            [
                str(bins / f"kubernetes-{KUBERNETES}" / "kube-scheduler"),
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                f"--feature-gates={GATES}",
                "--profiling=false",
            ],
            env,
        )
        insecure = ssl._create_unverified_context()
        proc.wait_ready(f"https://127.0.0.1:{port}/readyz", insecure, START_TIMEOUT_S)

    def _kueue(self, bins: Path, env: dict[str, str], webhook: int, health: int) -> None:
        setup = kueue.Kueue(self.root / "kueue", KUEUE, self.rest, self.pki)
        setup.install(webhook)
        config = kubeconfig(
            self.root / "etc" / "kueue.kubeconfig", self.server, self.ca, self.admin
        )
        argv = setup.argv(bins / f"kueue-{KUEUE}" / "kueue", config, webhook, health)
        proc = self._run("kueue", argv, env)
        proc.wait_ready(f"http://127.0.0.1:{health}/readyz", None, START_TIMEOUT_S)
        setup.create_queues(sum(self.node_gpus.values()) + sum(self.simulated.values()))

    def _nodes(self) -> None:
        """Our kubelet's nodes, awaited until the node lifecycle controller has lifted the
        not-ready taint it puts on every new node (else nothing schedules there)."""
        folder = self.root / "nodes"
        folder.mkdir(exist_ok=True)
        dns = ClusterDns(folder / "hosts.json")
        nodes: list[RealNode | SimulatedNodes] = [
            RealNode(n, self.server, self.pki, folder, g, dns) for n, g in self.node_gpus.items()
        ]
        if self.simulated:
            nodes.append(SimulatedNodes(self.server, self._client_context(), self.simulated))
        self.nodes = Nodes(nodes)
        self.nodes.__enter__()
        names = {*self.node_gpus, *self.simulated}
        self.rest.wait(
            "/api/v1/nodes",
            lambda listed: (
                names
                <= {n["metadata"]["name"] for n in listed["items"] if not n["spec"].get("taints")}
            ),
            START_TIMEOUT_S + len(names) / 4,
            f"{len(names)} nodes untainted",
        )

    def _audit(self) -> list[str]:
        """Flags for an audit log of ``audit_users``' requests only (one line per request)."""
        if not self.audit_users:
            return []
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived", "ResponseStarted"],
            "rules": [
                {"level": "Metadata", "users": list(self.audit_users)},
                {"level": "None"},
            ],
        }
        path = self.root / "etc" / "audit-policy.json"
        path.write_text(json.dumps(policy))
        return [
            f"--audit-policy-file={path}",
            f"--audit-log-path={self.root / 'logs' / 'audit.log'}",
            "--audit-log-format=json",
        ]

    def restart(self, component: str) -> None:
        """Restart one component (e.g. ``kube-apiserver``), as an upgrade or a crash does;
        return once it is ready again. Its clients reconnect by themselves."""
        proc = next(p for p in self.procs if p.name == component)
        proc.restart(START_TIMEOUT_S)

    def trouble(self) -> list[str]:
        """What no longer runs: a component that exited, a node whose kubelet ended. A test
        sharing this control plane checks it first, so a plane an earlier test left broken is
        named at once instead of showing as every later test's timeout."""
        exited = [
            f"{p.name} exited ({p.popen.returncode}):\n{p.tail(10)}"
            for p in self.procs
            if p.popen.poll() is not None
        ]
        return exited + (self.nodes.dead() if self.nodes is not None else [])

    # ---- stopping
    def stop(self) -> None:
        """Stop the nodes (their pods' processes), then every component, the last started
        first (etcd outlives its API server)."""
        if self.nodes is not None:
            self.nodes.__exit__()
            self.nodes = None
        while self.procs:
            self.procs.pop().stop()


def _up(plane: ControlPlane) -> None:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    start = time.monotonic()
    with plane:
        took = time.monotonic() - start
        kubectl = plane.bin_dir / f"kubernetes-{KUBERNETES}" / "kubectl"
        print(f"ready in {took:.1f} s: KUBECONFIG={plane.kubeconfig} {kubectl}", flush=True)
        done.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("build", help="build the binaries or find them cached; print their folder")
    up = sub.add_parser("up", help="start a control plane in DIR, until SIGTERM or SIGINT")
    up.add_argument("dir", type=Path)
    up.add_argument("--nodes", type=int, default=2, help="nodes our kubelet registers")
    up.add_argument("--gpus", type=int, default=4, help="GPUs of each node")
    up.add_argument("--no-kueue", action="store_true", help="without Kueue")
    args = parser.parse_args(argv)
    if args.verb == "build":
        print(binaries())
        return 0
    nodes = {f"node-{i}": args.gpus for i in range(args.nodes)}
    try:
        _up(ControlPlane(args.dir, nodes=nodes, with_kueue=not args.no_kueue))
    except StartError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
