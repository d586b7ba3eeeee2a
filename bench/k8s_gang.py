"""The Kubernetes backend at scale, on a real control plane with 256 simulated nodes × 8 GPUs.

The control plane is the test suite's real one (``tests/support/kube/real.py``: etcd,
kube-apiserver, controller-manager, scheduler and Kueue, built from Go modules); its nodes are
simulated as kwok does (``tests/support/kube/simnodes.py``: Leases renewed every 10 s, pods
reported Running the moment they are bound, no processes). Each gang is brought up by the code
a ``%%cluster --backend kubernetes`` cell runs (``KubernetesProvisioner.bring_up``: discovery,
objects, the watch until every pod is Running and Ready), through Kueue and through the
scheduler's native gang scheduling, then released (every object deleted, pods gone):

* up: from the cell's start to every pod bound and Running;
* down: ``release()`` until no pod of the gang is left;
* requests: the backend's API requests, counted from the API server's side (its audit log,
  the backend authenticating as a user of its own): while the gang comes up (how many, how many
  of them watches), and per node per minute while the gang is up and a cell would run
  (``--hold`` seconds; the cell's own traffic goes through pod 0's port-forward, one stream).

No image pull, no container start, no rendezvous: what is measured is the control plane's and
the backend's share of a cell's start. Run: ``.venv/bin/python -m bench.k8s_gang [--rounds N]``
(root, for Kueue; about two minutes to start the plane on a loaded machine).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from tests.support.kube import real

NODES, GPUS = 256, 8
SIZES = (8, 32, 64)
POLICIES = ("kueue", "native")
USER = "jupyter-mn-bench"
#: The default grace period: many simulated nodes renew at the kubelet's 10 s, under load.
NODE_GRACE_S = 50


def _stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def requests_between(audit: Path, start: float, end: float) -> Counter[str]:
    """The backend's requests received in [start, end], by verb (``watch`` among them)."""
    verbs: Counter[str] = Counter()
    with audit.open() as log:
        for line in log:
            event = json.loads(line)
            if start <= _stamp(event["requestReceivedTimestamp"]) <= end:
                verbs[event["verb"]] += 1
    return verbs


def one_gang(policy: str, nodes: int, tag: str, hold: float) -> tuple[float, float, float]:
    """Bring one gang up, keep it ``hold`` seconds, release it: (seconds up, seconds down,
    wall-clock start)."""
    from distributed.security import Security

    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    spec = ClusterSpec(
        nodes=nodes,
        gpus=GPUS,
        backend="kubernetes",
        kubernetes=KubeOptions(image="bench/agent:1", gang=policy, schedule_timeout=300),
    )
    provisioner = KubernetesProvisioner()
    wall, started = time.time(), time.perf_counter()
    try:
        _, _, pods = provisioner.bring_up(spec, f"jmn-bench-{tag}", Security.temporary())
        up = time.perf_counter() - started
        assert len(pods) == nodes
        time.sleep(hold)  # the gang as a running cell has it; nothing to wait for
    finally:
        released = time.perf_counter()
        provisioner.release()
    return up, time.perf_counter() - released, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds each gang stays up")
    args = parser.parse_args()
    simulated = {f"sim-{i:03d}": GPUS for i in range(NODES)}
    results: dict[tuple[str, int], list[tuple[float, float, Counter[str], int]]] = {}
    loads = [os.getloadavg()[0]]
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory() as root,
        real.ControlPlane(
            Path(root),
            nodes={},
            simulated=simulated,
            node_grace_s=NODE_GRACE_S,
            audit_users=(USER,),
            bin_dir=real.cached() or real.binaries(),
        ) as plane,
    ):
        plane_s = time.perf_counter() - started
        pair = plane.pki.client("bench", USER, "system:masters")
        config = real.kubeconfig(Path(root) / "bench.kubeconfig", plane.server, plane.ca, pair)
        os.environ["KUBECONFIG"] = str(config)
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        audit = plane.root / "logs" / "audit.log"
        for round_ in range(args.rounds):
            for policy in POLICIES:
                for nodes in SIZES:
                    tag = f"{policy[:3]}{nodes}r{round_}"
                    up, down, wall = one_gang(policy, nodes, tag, args.hold)
                    verbs = requests_between(audit, wall, wall + up)
                    held = requests_between(audit, wall + up, wall + up + args.hold)
                    results.setdefault((policy, nodes), []).append(
                        (up, down, verbs, sum(held.values()))
                    )
                    loads.append(os.getloadavg()[0])
        trouble = plane.trouble()
        assert not trouble, trouble
    print(
        f"{NODES} simulated nodes × {GPUS} GPUs, Kubernetes {real.KUBERNETES}, Kueue {real.KUEUE};"
        f" plane up in {plane_s:.0f} s; {args.rounds} round(s); medians;"
        f" 1-min load {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} CPUs"
    )
    header = ("gang", "policy", "up s", "down s", "up: requests", "watches", "held: /node/min")
    print(f"{header[0]:<7}{header[1]:<8}" + "".join(f"{h:>16}" for h in header[2:]))
    for (policy, nodes), runs in results.items():
        up = statistics.median(r[0] for r in runs)
        down = statistics.median(r[1] for r in runs)
        total = statistics.median(sum(r[2].values()) for r in runs)
        watches = statistics.median(r[2]["watch"] for r in runs)
        rate = statistics.median(r[3] for r in runs) / nodes / (args.hold / 60)
        print(
            f"{f'{nodes}×{GPUS}':<7}{policy:<8}{up:>16.2f}{down:>16.2f}{total:>16.0f}"
            f"{watches:>16.0f}{rate:>16.2f}"
        )
    by_verb = sum((r[2] for runs in results.values() for r in runs), Counter())
    print("requests by verb while gangs came up:", dict(by_verb.most_common()))


if __name__ == "__main__":
    main()
