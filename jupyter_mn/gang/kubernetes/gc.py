"""Find and delete gangs a kernel left behind, by label (for ``jupyter mn gc``).

Pods of a dead kernel exit by themselves (``--orphan-timeout``), a finished Job is deleted by its
TTL, and ``activeDeadlineSeconds`` caps the rest; this removes what is still there at once: the
Job (in the foreground, with its pods and owned objects) and the Service, Secret and
NetworkPolicy, in case an ownerReference never got attached.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from .discovery import load_api
from .manifests import GANG_LABEL, MANAGED_BY, MANAGER, OWNER_ANNOTATION
from .rollout import BUILTIN_KINDS, api_errors

_KINDS = tuple(BUILTIN_KINDS.values())
_CLASS = {plural: cls for cls, plural in _KINDS}


@dataclass(frozen=True)
class Leftover:
    """One gang's objects in a namespace."""

    gang: str
    namespace: str
    owner: str = ""
    objects: tuple[tuple[str, str], ...] = field(default=())  # (kind plural, name)


def find(namespace: str | None = None, api: Any = None) -> list[Leftover]:
    """Every jupyter_mn gang with objects in ``namespace`` (default: the kubeconfig's)."""
    from kubernetes import client

    own_api = api is None
    if own_api:
        api, default = load_api()
        namespace = namespace or default
    namespace = namespace or "default"
    found: dict[str, dict[str, Any]] = {}
    try:
        with api_errors(f"listing jupyter_mn objects in {namespace}"):
            for cls, plural in _KINDS:
                lister = getattr(getattr(client, cls)(api), f"list_namespaced_{plural}")
                listed = lister(
                    namespace, label_selector=f"{MANAGED_BY}={MANAGER}", _preload_content=False
                )
                for item in json.loads(listed.data)["items"]:
                    meta = item["metadata"]
                    gang = (meta.get("labels") or {}).get(GANG_LABEL, "")
                    entry = found.setdefault(gang, {"owner": "", "objects": []})
                    entry["objects"].append((plural, meta["name"]))
                    entry["owner"] = entry["owner"] or (meta.get("annotations") or {}).get(
                        OWNER_ANNOTATION, ""
                    )
    finally:
        if own_api:
            api.close()
    return [
        Leftover(gang, namespace, e["owner"], tuple(e["objects"]))
        for gang, e in sorted(found.items())
    ]


def delete(leftovers: Collection[Leftover], api: Any = None) -> None:
    """Delete each gang's objects (the Job in the foreground, with its pods)."""
    from kubernetes import client
    from kubernetes.client import ApiException

    own_api = api is None
    api = load_api()[0] if own_api else api
    try:
        for left in leftovers:
            for plural, name in left.objects:
                remove = getattr(
                    getattr(client, _CLASS[plural])(api), f"delete_namespaced_{plural}"
                )
                kw = {"propagation_policy": "Foreground"} if plural == "job" else {}
                with api_errors(f"deleting {plural} {name}"):
                    try:
                        remove(name, left.namespace, **kw)
                    except ApiException as exc:
                        if exc.status != 404:  # 404: gone with its Job already
                            raise
    finally:
        if own_api:
            api.close()


def collect(
    namespace: str | None = None,
    keep: Collection[str] = (),
    only: Collection[str] | None = None,
    dry_run: bool = False,
) -> list[Leftover]:
    """Delete the gangs in ``namespace`` named in ``only`` (default: all) except ``keep``.

    ``keep``: gangs of live kernels; ``only``: e.g. one dead kernel's gang (its ``Gang.id``, the
    registry's ``JobModel.gang``). Returns what was deleted (with ``dry_run``: what would be).
    """
    doomed = [
        left
        for left in find(namespace)
        if left.gang not in set(keep) and (only is None or left.gang in set(only))
    ]
    if not dry_run:
        delete(doomed)
    return doomed
