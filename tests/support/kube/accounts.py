"""ServiceAccounts with a Role of their own on the real control plane: a notebook's or a
detached run's driver's only credential, as the tests and benchmarks give them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.kube import real

#: The Role docs/backends.md lists ("Permissions"), rule by rule.
DOCUMENTED_ROLE = [
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "patch", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["services", "secrets"],
        "verbs": ["create", "list", "delete"],
    },
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["create", "list", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "patch", "delete"],
    },
    {
        "apiGroups": ["scheduling.k8s.io"],
        "resources": ["podgroups", "workloads"],
        "verbs": ["create", "get", "delete"],
    },
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": ["list"]},
]


def service_account_kubeconfig(
    control: real.ControlPlane, name: str, rules: list[dict[str, Any]] | str
) -> Path:
    """A ServiceAccount bound in ``default`` to a Role of ``rules``, or to the ClusterRole
    ``rules`` names (``view``); a kubeconfig whose only credential is its token (as a
    notebook's pod has)."""
    rest, base = control.rest, "/apis/rbac.authorization.k8s.io/v1/namespaces/default"
    rest.create("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": name}})
    role = {"kind": "ClusterRole", "name": rules} if isinstance(rules, str) else None
    if role is None:
        rest.create(f"{base}/roles", {"metadata": {"name": name}, "rules": rules})
        role = {"kind": "Role", "name": name}
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", **role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    }
    rest.create(f"{base}/rolebindings", binding)
    token = rest.create(
        f"/api/v1/namespaces/default/serviceaccounts/{name}/token",
        {"spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    return real.kubeconfig(control.root / f"{name}.kubeconfig", control.server, control.ca, token)
