"""Small JSON Schemas for the custom-resource objects and marks the gang code emits.

``kubernetes-validate`` knows only built-in kinds (and would check a Volcano ``PodGroup`` against
the core ``scheduling.k8s.io`` one), so the CRD kinds are checked here, written from the
projects' API types: volcano-sh/apis ``scheduling/v1beta1`` PodGroupSpec, kubernetes-sigs/
scheduler-plugins ``scheduling/v1alpha1`` PodGroupSpec, and Kueue's Job integration (the queue
label on a suspended Job). Unknown fields are errors, as with ``--strict``.
"""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"}
INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}

_META = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": DNS_SUBDOMAIN, "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "ownerReferences": {"type": "array"},
    },
    "additionalProperties": False,
}


def _object(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _META,
            "spec": spec,
        },
        "additionalProperties": False,
    }


VOLCANO_PODGROUP = _object(
    "scheduling.volcano.sh/v1beta1",
    "PodGroup",
    {
        "type": "object",
        "properties": {
            "minMember": INT32,
            "minTaskMember": {"type": "object", "additionalProperties": INT32},
            "queue": {"type": "string"},
            "priorityClassName": {"type": "string"},
            "minResources": {"type": "object", "additionalProperties": QUANTITY},
            "networkTopology": {"type": "object"},
        },
        "additionalProperties": False,
    },
)

COSCHEDULING_PODGROUP = _object(
    "scheduling.x-k8s.io/v1alpha1",
    "PodGroup",
    {
        "type": "object",
        "required": ["minMember"],
        "properties": {
            "minMember": INT32,
            "minResources": {"type": "object", "additionalProperties": QUANTITY},
            "scheduleTimeoutSeconds": INT32,
        },
        "additionalProperties": False,
    },
)

#: Kueue manages a batch/v1 Job that carries a queue label and is created suspended.
KUEUE_JOB = {
    "type": "object",
    "required": ["metadata", "spec"],
    "properties": {
        "metadata": {
            "type": "object",
            "required": ["labels"],
            "properties": {
                "labels": {
                    "type": "object",
                    "required": ["kueue.x-k8s.io/queue-name"],
                    "properties": {
                        "kueue.x-k8s.io/queue-name": {"type": "string", "pattern": DNS_SUBDOMAIN}
                    },
                }
            },
        },
        "spec": {
            "type": "object",
            "required": ["suspend"],
            "properties": {"suspend": {"const": True}},
        },
    },
}

CRDS = {
    "scheduling.volcano.sh/v1beta1": VOLCANO_PODGROUP,
    "scheduling.x-k8s.io/v1alpha1": COSCHEDULING_PODGROUP,
}


# kubernetes-validate re-reads and re-parses its schema files on every call (about 3 s per
# manifest set across ten versions); the files never change, so read each one once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)


def validate(obj: dict[str, Any], minor: int) -> None:
    """Custom kinds against the schemas above, built-in kinds with kubernetes-validate --strict."""
    schema = CRDS.get(obj["apiVersion"])
    if schema is not None:
        jsonschema.validate(obj, schema)
    else:
        kubernetes_validate.validate(obj, f"1.{minor}.0", strict=True)
