"""``KubernetesProvisioner``: a gang's dask cluster as one gang-scheduled Indexed Job.

Discover the server (version, gang schedulers) → build the objects with fresh TLS certificates →
take the namespace's admission Lease for client-side gangs → create, watch until every pod is
Ready (see ``rollout.py``) → connect the dask client to pod 0's scheduler by cluster DNS when the
kernel runs in the cluster, else through a port-forward. ``release`` deletes every object.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import warnings
from typing import Any

from ...errors import JupyterMNError
from ...model.spec import ClusterSpec
from ...wire.events import NodesWaiting, OnEvent
from .discovery import KUEUE_GROUP, SA_NAMESPACE, choose, discover, load_api
from .gangs import Target
from .lease import AdmissionLease
from .manifests import build, labels
from .portforward import PortForward, pod_stream
from .rollout import Rollout, api_errors

_CONNECT_TIMEOUT_S = 30
_POLICY = {
    "none": "all-or-nothing by jupyter_mn: one gang at a time per namespace",
    "kueue": "gang-admitted by Kueue",
    "volcano": "gang-scheduled by Volcano",
    "coscheduling": "gang-scheduled by scheduler-plugins coscheduling",
    "native": "gang-scheduled by the Kubernetes scheduler (Workload API)",
}


class KubernetesProvisioner:
    backend = "kubernetes"

    def __init__(self) -> None:
        #: Set by ``make_gang``: shows pending reasons while the pods come up.
        self.notify: OnEvent = lambda event: None
        #: Where the gang's objects are, once chosen (the job registry records it for ``gc``).
        self.namespace = ""
        self._api: Any = None
        self._rollout: Rollout | None = None
        self._lease: AdmissionLease | None = None
        self._forward: PortForward | None = None
        self._client: Any = None

    def provision(self, spec: ClusterSpec, gang_id: str) -> tuple[Any, list[str]]:
        from distributed.security import Security

        security = Security.temporary()
        spec, namespace, pods = self.bring_up(spec, gang_id, security)
        self._client = self._connect(spec, namespace, pods[0], security)
        workers = self._client.scheduler_info(n_workers=-1)["workers"]
        return self._client, sorted(workers, key=lambda a: int(workers[a]["name"]))

    def bring_up(
        self, spec: ClusterSpec, gang_id: str, security: Any
    ) -> tuple[ClusterSpec, str, dict[int, dict[str, Any]]]:
        """Everything up to "all pods Ready": the spec as resolved, the namespace, node → pod."""
        from kubernetes import client

        opts = spec.kubernetes
        deadline = time.monotonic() + opts.schedule_timeout
        self._api, namespace = load_api()
        namespace = self.namespace = opts.namespace or namespace
        with api_errors("asking the API server what it offers"):
            facts = discover(self._api, namespace)
            job_owner = _kernel_pod(client.CoreV1Api(self._api), namespace)
        policy, queue = choose(spec, facts)
        spec = spec.replace(kubernetes=opts.replace(queue=queue))
        tls = {
            "ca.crt": security.tls_ca_file,
            "tls.crt": security.tls_worker_cert,
            "tls.key": security.tls_worker_key,
        }
        owner = f"{socket.gethostname()} pid {os.getpid()}"
        objects = build(
            spec,
            gang_id,
            Target(facts.minor, policy, namespace),
            tls=tls,
            owner=owner,
            job_owner=job_owner,
        )
        self.notify(
            NodesWaiting(
                (), f"creating {spec.nodes} pod(s) in namespace {namespace}", _POLICY[policy]
            )
        )
        self._rollout = Rollout(
            self._api,
            gang_id,
            objects,
            spec.nodes,
            policy,
            self.notify,
            kueue_version=(facts.groups.get(KUEUE_GROUP) or ("v1beta1",))[0],
        )
        if policy == "none":
            self._lease = AdmissionLease(
                client.CoordinationV1Api(self._api),
                namespace,
                f"{gang_id} ({owner})",
                labels(gang_id),
            )
            with api_errors("taking the namespace's admission Lease"):
                self._lease.acquire(deadline, self._waiting_for)
        try:
            self._rollout.create()
            pods = self._rollout.wait_ready(deadline, opts.schedule_timeout)
        finally:
            self._give_back_lease()
        return spec, namespace, pods

    def _waiting_for(self, holder: str) -> None:
        self.notify(NodesWaiting((), "queued", f"gang {holder} is coming up first"))

    def _connect(
        self, spec: ClusterSpec, namespace: str, pod0: dict[str, Any], security: Any
    ) -> Any:
        """Pod 0's scheduler by cluster DNS from inside the cluster, else via a port-forward."""
        from distributed import Client
        from kubernetes import client

        assert self._rollout is not None
        port = spec.kubernetes.dask_port
        host = f"{self._rollout.names.host(0)}.{namespace}.svc"
        if os.environ.get("KUBERNETES_SERVICE_HOST") and _resolves(host):
            address = f"tls://{host}:{port}"
        else:
            name = pod0["metadata"]["name"]
            self._forward = PortForward(
                pod_stream(client.CoreV1Api(self._api), namespace, name, port)
            )
            address = f"tls://127.0.0.1:{self._forward.port}"
        dask_client = Client(
            address,
            security=security,
            direct_to_workers=False,  # workers are not reachable through a port-forward
            set_as_default=False,
            timeout=_CONNECT_TIMEOUT_S,
        )
        dask_client.wait_for_workers(spec.nodes, timeout=spec.start_timeout)
        return dask_client

    def launch_options(self) -> dict[str, Any]:
        return {}

    def release(self) -> None:
        """Close the client and the forward, delete every object; warn if the API is unreachable."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        if self._forward is not None:
            self._forward.close()
        self._client = self._forward = None
        self._give_back_lease()
        if self._rollout is not None:
            rollout, self._rollout = self._rollout, None
            try:
                rollout.delete()
            except JupyterMNError as exc:
                warnings.warn(
                    f"jupyter_mn: could not delete gang {rollout.names.job} ({exc}); its pods "
                    "exit by themselves after --orphan-timeout; `jupyter mn gc` removes the rest",
                    stacklevel=2,
                )
        if self._api is not None:
            self._api.close()
            self._api = None

    def _give_back_lease(self) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            with contextlib.suppress(Exception):  # it expires by itself within its duration
                lease.release()


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return False
    return True


def _kernel_pod(core: Any, namespace: str) -> dict[str, Any] | None:
    """An ownerReference to the notebook's own pod (same namespace only), or None."""
    from kubernetes.client import ApiException

    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    try:
        with open(SA_NAMESPACE) as f:
            if f.read().strip() != namespace:
                return None
        pod = core.read_namespaced_pod(socket.gethostname(), namespace)
    except (OSError, ApiException):  # not a pod we can read: TTL and the deadline still apply
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}
