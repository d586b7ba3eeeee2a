"""``KubeOptions``: the Kubernetes part of a ``ClusterSpec`` (``spec.kubernetes``), validated once.

Kept out of ``spec.py`` so the core spec stays small; nothing here imports the ``kubernetes``
client. Every value is checked when the options are built, so a typo in a toleration or a
quantity is a ``SpecError`` before any object is sent to a cluster. The same flag definitions
serve ``%%cluster`` and ``jupyter mn manifests``; environment variables are
``JUPYTER_MN_K8S_<OPTION>`` (lists comma-separated, ``KEY=VALUE`` pairs for the node selector).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .specvalues import check_names, env_value, is_number, options_from_environ

GANG_POLICIES = ("auto", "kueue", "volcano", "coscheduling", "native", "none")
ENV_PREFIX = "JUPYTER_MN_K8S_"
#: argparse destinations of the Kubernetes flags are ``k8s_<field>``.
FLAG_PREFIX = "k8s_"

#: Patterns are used with ``fullmatch``: ``$`` would let a trailing newline through.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_QUALIFIED = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")
_QUANTITY = re.compile(r"([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_IMAGE = re.compile(r"[^\s]+")
_NETWORK = re.compile(r"[a-z0-9]([-a-z0-9/]*[a-z0-9])?")
#: Paths the pod uses itself; a volume mounted there would hide them.
RESERVED_MOUNTS = ("/dev/shm", "/etc/jupyter-mn")


@dataclass(frozen=True)
class Volume:
    """A PersistentVolumeClaim mounted into every pod (like shared volumes on a cluster)."""

    claim: str
    path: str
    read_only: bool = False

    @classmethod
    def parse(cls, text: str) -> Volume:
        """``CLAIM:/mount/path[:ro]``."""
        claim, _, rest = text.partition(":")
        path, _, mode = rest.partition(":")
        if not claim or not path or mode not in ("", "ro", "rw"):
            raise SpecError(f"--volume {text!r}: expected CLAIM:/mount/path[:ro]")
        if not _DNS_SUBDOMAIN.fullmatch(claim):
            raise SpecError(f"--volume {text!r}: {claim!r} is not a valid claim name")
        if not path.startswith("/") or any(
            path == m or path.startswith(m + "/") for m in RESERVED_MOUNTS
        ):
            raise SpecError(
                f"--volume {text!r}: mount path must be absolute and outside "
                + ", ".join(RESERVED_MOUNTS)
            )
        return cls(claim, path, mode == "ro")


def parse_toleration(text: str) -> dict[str, str]:
    """``key=value:Effect``, ``key:Effect`` (any value) or ``key`` (any value, any effect)."""
    head, _, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, eq, value = head.partition("=")
    if not key or not _QUALIFIED.fullmatch(key) or (eq and not _LABEL_VALUE.fullmatch(value)):
        raise SpecError(f"--toleration {text!r}: expected KEY[=VALUE][:EFFECT]")
    if effect and effect not in _EFFECTS:
        raise SpecError(f"--toleration {text!r}: effect must be one of {', '.join(_EFFECTS)}")
    tol = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        tol["value"] = value
    if effect:
        tol["effect"] = effect
    return tol


@dataclass(frozen=True)
class KubeOptions:
    """How the gang's pods look on Kubernetes (``--backend kubernetes``).

    >>> KubeOptions(image="registry.example/agent:1", gang="none").gang
    'none'
    """

    image: str = ""
    namespace: str = ""
    gang: str = "auto"
    queue: str = ""
    scheduler_name: str = ""
    service_account: str = ""
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()
    priority_class: str = ""
    volumes: tuple[str, ...] = ()
    cpu: str = ""
    memory: str = ""
    gpu_resource: str = "nvidia.com/gpu"
    rdma_resource: str = "rdma/rdma_shared_device_a"
    rdma_networks: str = ""
    shm_size: str = "8Gi"
    schedule_timeout: float = 600.0
    lifetime: int = 12 * 3600
    orphan_timeout: int = 120
    dask_port: int = 8786

    def __post_init__(self) -> None:
        if self.gang not in GANG_POLICIES:
            raise SpecError(f"--gang {self.gang!r}: choose one of {', '.join(GANG_POLICIES)}")
        if self.image and not _IMAGE.fullmatch(self.image):
            raise SpecError(f"--image {self.image!r} is not an image reference")
        for flag, value, rule in (
            ("--namespace", self.namespace, _DNS_LABEL),
            ("--queue", self.queue, _DNS_SUBDOMAIN),
            ("--scheduler-name", self.scheduler_name, _DNS_SUBDOMAIN),
            ("--service-account", self.service_account, _DNS_SUBDOMAIN),
            ("--priority-class", self.priority_class, _DNS_SUBDOMAIN),
            ("--gpu-resource", self.gpu_resource, _QUALIFIED),
            ("--rdma-resource", self.rdma_resource, _QUALIFIED),
        ):
            if value and not rule.fullmatch(value):
                raise SpecError(f"{flag} {value!r} is not a valid Kubernetes name")
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory)):
            if value and not _QUANTITY.fullmatch(value):
                raise SpecError(f"{flag} {value!r} is not a quantity (e.g. 8, 500m, 64Gi)")
        if not self.shm_size or not _QUANTITY.fullmatch(self.shm_size):
            raise SpecError(f"--shm-size {self.shm_size!r} is not a quantity (e.g. 16Gi)")
        for key, value in self.node_selector:
            if not _QUALIFIED.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
                raise SpecError(f"--node-selector {key}={value}: not a valid label")
        for text in self.tolerations:
            parse_toleration(text)
        paths = [Volume.parse(text).path for text in self.volumes]
        if len(set(paths)) != len(paths):
            raise SpecError("--volume: two volumes mount at the same path")
        if any(not _NETWORK.fullmatch(n) for n in self.networks):
            raise SpecError(f"--rdma-networks {self.rdma_networks!r}: comma-separated NAD names")
        if not is_number(self.schedule_timeout, low=0, strict=True):
            raise SpecError(
                f"--schedule-timeout must be positive seconds, got {self.schedule_timeout!r}"
            )
        for flag, value, low in (
            ("--lifetime", self.lifetime, 60),
            ("--orphan-timeout", self.orphan_timeout, 5),
            ("--dask-port", self.dask_port, 1024),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SpecError(f"{flag} must be an integer ≥ {low}, got {value!r}")
        if self.dask_port > 65534:
            raise SpecError(f"--dask-port must be ≤ 65534, got {self.dask_port}")

    @property
    def networks(self) -> list[str]:
        return [n.strip() for n in self.rdma_networks.split(",") if n.strip()]

    def replace(self, **changes: Any) -> KubeOptions:
        return dataclasses.replace(self, **_normalize(changes))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> KubeOptions:
        check_names(cls, values, "Kubernetes")
        return cls(**_normalize(dict(values)))


def _normalize(values: dict[str, Any]) -> dict[str, Any]:
    """Lists and dicts (from config, JSON or argparse) become the tuples the frozen spec holds."""
    out = dict(values)
    if isinstance(out.get("node_selector"), Mapping):
        out["node_selector"] = tuple(sorted(out["node_selector"].items()))
    for name in ("node_selector", "tolerations", "volumes"):
        if isinstance(out.get(name), list):
            out[name] = tuple(tuple(v) if isinstance(v, list) else v for v in out[name])
    return out


def from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """``JUPYTER_MN_K8S_IMAGE=…`` and friends, typed like the fields."""
    return options_from_environ(KubeOptions, ENV_PREFIX, environ, _parse)


def _parse(var: str, raw: str, f: dataclasses.Field[Any]) -> Any:
    if f.name == "node_selector":
        return pairs([p for p in raw.split(",") if p], "--node-selector")
    return env_value(var, raw, f)


def pairs(items: list[str] | tuple[str, ...], flag: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r}: expected KEY=VALUE")
        out.append((key, value))
    return tuple(out)


def add_flags(parser: Any) -> Any:
    """The Kubernetes flags, on an argparse parser (the magic's or the CLI's)."""
    group = parser.add_argument_group("kubernetes (--backend kubernetes)")
    add = group.add_argument
    add("--image", dest="k8s_image", help="container image with jupyter_mn and torch installed")
    add("--namespace", dest="k8s_namespace", help="namespace (default: the kubeconfig's)")
    add("--gang", dest="k8s_gang", choices=GANG_POLICIES, help="gang scheduling policy")
    add("--queue", dest="k8s_queue", help="Kueue LocalQueue or Volcano queue")
    add("--scheduler-name", dest="k8s_scheduler_name", help="pod schedulerName override")
    add("--service-account", dest="k8s_service_account", help="pod service account")
    add("--node-selector", dest="k8s_node_selector", action="append", metavar="KEY=VALUE")
    add("--toleration", dest="k8s_tolerations", action="append", metavar="KEY[=VALUE][:EFFECT]")
    add("--priority-class", dest="k8s_priority_class", help="priorityClassName of the pods")
    add("--volume", dest="k8s_volumes", action="append", metavar="CLAIM:PATH[:ro]")
    add("--cpu", dest="k8s_cpu", help="CPU request per pod (e.g. 32)")
    add("--memory", dest="k8s_memory", help="memory request and limit per pod (e.g. 256Gi)")
    add("--gpu-resource", dest="k8s_gpu_resource", help="GPU resource name (empty: CPU pods)")
    add("--rdma-resource", dest="k8s_rdma_resource", help="RDMA device resource for --rdma")
    add("--rdma-networks", dest="k8s_rdma_networks", help="Multus networks for --rdma (a,b)")
    add("--shm-size", dest="k8s_shm_size", help="size limit of /dev/shm (memory emptyDir)")
    add(
        "--schedule-timeout",
        dest="k8s_schedule_timeout",
        type=float,
        help="s to get all pods (Slurm: for the job to start)",
    )
    add("--lifetime", dest="k8s_lifetime", type=int, help="hard cap on the pods' lifetime (s)")
    add(
        "--orphan-timeout",
        dest="k8s_orphan_timeout",
        type=int,
        help="pods (Slurm: the job) outlive the kernel (s)",
    )
    add("--dask-port", dest="k8s_dask_port", type=int, help="dask scheduler port in pod 0")
    return parser


def from_args(args: Any) -> dict[str, Any]:
    """The Kubernetes options given as flags (only those given)."""
    given: dict[str, Any] = {}
    for f in dataclasses.fields(KubeOptions):
        value = getattr(args, FLAG_PREFIX + f.name, None)
        if value is None:
            continue
        if f.name == "node_selector":
            value = pairs(value, "--node-selector")
        elif isinstance(value, list):
            value = tuple(value)
        given[f.name] = value
    return given
