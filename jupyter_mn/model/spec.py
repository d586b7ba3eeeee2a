"""``ClusterSpec``: what a gang should look like and how its cells run, validated once.

Values come from four layers, later ones winning: built-in defaults, ``JUPYTER_MN_*`` environment
variables, traitlets config (``c.ClusterMagics.default_nodes = 2``), and the cell's own flags.
Every check happens here, so a bad value raises ``SpecError`` before anything is launched.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import reprlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import SpecError
from .credentials import MASK
from .gangids import name_problem
from .kubespec import KubeOptions
from .kubespec import from_environ as kube_from_environ
from .slurmspec import SlurmOptions
from .slurmspec import from_environ as slurm_from_environ
from .specvalues import is_number

BACKENDS = ("local", "dask", "kubernetes", "slurm")
#: spec fields that hold a backend's options (merged across layers, read from their own env)
_OPTIONS = {"kubernetes": KubeOptions, "slurm": SlurmOptions}
VIEWS = ("auto", "widget", "text")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
ENV_PREFIX = "JUPYTER_MN_"
#: The variable that carries ``--env`` into a kernel (submitted runs' defaults): the values it
#: holds are secrets, whatever their names, so it travels only where secrets do (a Kubernetes
#: Secret, a 0600 file), never in a Slurm job's environment or a pod's spec.
ENV_VARIABLE = ENV_PREFIX + "ENV"
#: Patterns are used with ``fullmatch``: ``$`` would let a trailing newline through.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_WORLD_SIZE = 65536
#: The most bytes of the notebook's directory sent to a node (``--workdir-limit``).
WORKDIR_LIMIT = 100 << 20
#: The largest value a rank sends back (``--max-value``): generous, a guard against a value that
#: would fill the kernel's memory by mistake, not a tuning knob.
MAX_VALUE = 4 << 30
#: The most ranks a local gang has unless ``local_limit`` says otherwise: every rank (and every
#: node's agent) is a process on this machine, started at once.
LOCAL_LIMIT = 512
#: The longest any timeout or cap may be (two weeks): the selectors, timers and waits that
#: carry them overflow from ~24.8 days on (epoll's milliseconds in a C int).
MAX_SECONDS = 14 * 24 * 3600.0
#: numpy takes seeds below 2**32, and rank r is seeded with SEED + r.
SEED_LIMIT = 2**32
#: Seconds a node takes after its grace period to stop its ranks (3 s before a kill) and close.
STOP_MARGIN_S = 10
_SCHEDULER = re.compile(r"(tcp|tls)://(\[[0-9a-fA-F:]+\]|[^\s/:\[\]]+):\d{1,5}")


def _gang(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A field that shapes the gang: changing it means a different gang (no warm reuse)."""
    return field(default=default, metadata={"gang": True}, **kw)


def _cap(default: Any) -> Any:
    """A limit on the gang's life: kept by every later cell or verb that does not set it."""
    return field(default=default, metadata={"cap": True})


@dataclass(frozen=True)
class ClusterSpec:
    """Immutable description of a gang and of the defaults its cells run with.

    >>> ClusterSpec(nodes=2, gpus=2).world_size
    4
    """

    nodes: int = _gang(1)
    gpus: int = _gang(1)
    backend: str = _gang("local")
    env: tuple[tuple[str, str], ...] = _gang(())
    scheduler: str | None = _gang(None)
    #: allow a plaintext ``tcp://`` scheduler off this machine (pickles cross the network)
    insecure: bool = _gang(False)
    #: bytes of resident memory a rank may use before its agent kills it (``"4GB"`` is accepted)
    memory_limit: int | None = _gang(None)
    #: use the RDMA fabric (IB/RoCE/EFA): pods get the RDMA resource, NCCL gets the HCAs
    rdma: bool = _gang(False)
    #: fail the gang when NCCL would use TCP sockets instead of RDMA (implies ``rdma``)
    require_rdma: bool = _gang(False)
    #: NCCL_DEBUG=INFO and torch.distributed debug output in the node tabs
    debug: bool = _gang(False)
    #: seconds a preempted node keeps running after its SIGTERM (pods'
    #: terminationGracePeriodSeconds, Slurm's ``--signal=TERM@S``) for a checkpoint
    grace: float = _gang(120.0)
    #: dask backend: several workers of one host may be nodes (default: one node per host)
    same_host: bool = _gang(False)
    kubernetes: KubeOptions = _gang(KubeOptions())  # noqa: RUF009 (frozen, and _gang is a field)
    slurm: SlurmOptions = _gang(SlurmOptions())  # noqa: RUF009 (frozen, and _gang is a field)
    #: the directory whose files travel to nodes that do not see it, and where the ranks run
    #: (None: the kernel's working directory when the gang starts)
    workdir: str | None = _gang(None)
    #: False: nothing travels, and the ranks run where the backend puts them (``--no-workdir``)
    send_workdir: bool = _gang(True)
    #: gitignore-style patterns of files that never travel (``--workdir-exclude``)
    workdir_exclude: tuple[str, ...] = ()
    #: the most bytes that travel (``"200MB"`` is accepted)
    workdir_limit: int = WORKDIR_LIMIT
    #: the most bytes a rank's value (or a ``--pull`` name) may pickle to: a larger one is
    #: refused on the rank before anything is sent (``"512MiB"`` is accepted)
    max_value: int = MAX_VALUE
    name: str | None = None
    #: how the cell shows its gang: a widget where a frontend renders widgets, else text
    view: str = "auto"
    #: the ranks whose lines the cell shows (empty: all), as torchrun's ``--local-ranks-filter``;
    #: every line still goes to the logs and the Multi-node jobs panel
    ranks: tuple[int, ...] = ()
    timeout: float | None = None
    #: show the hang verdict live when no rank has completed a collective or ended the cell for
    #: this long while some wait in one (0: off); the cell keeps running
    hang_timeout: float = 300.0
    retries: int = 0
    seed: int | None = None
    idle_timeout: float = _cap(1800.0)
    start_timeout: float = 180.0
    pg_timeout: float = 1800.0
    #: a gang's whole life, counted from its start: a cost cap (the gang is torn down)
    max_runtime: float | None = _cap(None)
    #: a gang's whole count of nodes × GPUs × hours (rank-hours on CPUs): a cost cap as above
    max_gpu_hours: float | None = _cap(None)
    #: local backend: the most ranks a gang may have (each a process on this machine)
    local_limit: int = _cap(LOCAL_LIMIT)
    #: agents stop their ranks when the kernel has been silent this long (it died)
    heartbeat_timeout: float = 15.0
    #: a node whose agent has not answered the kernel's heartbeat this long is lost (a cut link,
    #: a frozen host): the running cell ends with NodeLost naming it
    liveness_timeout: float = 10.0
    #: preflight checks (doctor.py) before a new gang's first cell; None: on for remote backends
    preflight: bool | None = None
    check_paths: tuple[str, ...] = ()
    min_shm_gb: float = 1.0
    min_disk_gb: float = 1.0

    def __post_init__(self) -> None:
        _check_int("nodes", self.nodes, minimum=1)
        _check_int("gpus", self.gpus, minimum=1)
        _check_int("retries", self.retries, minimum=0)
        _check_int("local_limit", self.local_limit, minimum=1)
        if self.nodes * self.gpus > MAX_WORLD_SIZE:
            raise SpecError(f"nodes × gpus = {self.nodes * self.gpus} exceeds {MAX_WORLD_SIZE}")
        if self.seed is not None:
            check_seed(self.seed, self.world_size)
        if self.backend == "local" and self.world_size > self.local_limit:
            raise SpecError(
                f"a local {self.shape} gang runs {self.world_size} rank processes on this "
                f"machine (limit {self.local_limit}); raise it with --local-limit "
                f"{self.world_size} (JUPYTER_MN_LOCAL_LIMIT) if this machine can take it"
            )
        if self.backend not in BACKENDS:
            raise SpecError(
                f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}"
            )
        for name in ("rdma", "require_rdma", "debug", "same_host", "insecure", "send_workdir"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.require_rdma and not self.rdma:
            object.__setattr__(self, "rdma", True)  # frozen: normalized once, here
        if self.view not in VIEWS:
            raise SpecError(f"unknown view {self.view!r}; choose one of {', '.join(VIEWS)}")
        for rank in self.ranks:
            _check_int("ranks", rank, minimum=0)
            if rank >= self.world_size:
                raise SpecError(
                    f"--ranks {rank}: a {self.shape} gang has ranks 0–{self.world_size - 1}"
                )
        if self.backend == "dask" and not self.scheduler:
            raise SpecError("backend 'dask' needs --scheduler ADDRESS (e.g. tls://host:8786)")
        if self.scheduler is not None and not _SCHEDULER.fullmatch(self.scheduler):
            raise SpecError(
                f"--scheduler {self.scheduler!r}: expected PROTOCOL://HOST:PORT "
                "with tcp or tls (e.g. tls://10.0.0.5:8786)"
            )
        _check_plaintext(self)
        _check_preflight(self)
        if self.backend == "kubernetes" and not self.kubernetes.image:
            raise SpecError(
                "backend 'kubernetes' needs --image: an image with jupyter_mn and torch "
                "(recipe: docs/agent.Dockerfile)"
            )
        if self.memory_limit is not None:
            _check_int("memory_limit", self.memory_limit, minimum=1)
        _check_workdir(self)
        _check_int("max_value", self.max_value, minimum=1)
        for name in (
            "timeout",
            "idle_timeout",
            "start_timeout",
            "pg_timeout",
            "max_runtime",
            "heartbeat_timeout",
            "liveness_timeout",
            "grace",
        ):
            value = getattr(self, name)
            if value is not None:
                check_seconds(name, value)
        if self.max_gpu_hours is not None:
            _check_gpu_hours(self.max_gpu_hours, self.world_size)
        if not is_number(self.hang_timeout, low=0):
            raise SpecError(
                f"hang_timeout must be 0 (off) or a positive number of seconds, "
                f"got {self.hang_timeout!r}"
            )
        if self.hang_timeout:
            check_seconds("hang_timeout", self.hang_timeout)
        problem = name_problem(self.name) if self.name is not None else None
        if problem:
            raise SpecError(f"name {reprlib.repr(self.name)} {problem}")
        for key, value in self.env:
            if not _ENV_NAME.fullmatch(key):
                raise SpecError(f"--env {key!r}: not a valid environment variable name")
            if not isinstance(value, str):
                raise SpecError(f"--env {key}: value must be a string, got {type(value).__name__}")
            if "\0" in value:
                raise SpecError(f"--env {key}: a value cannot hold a NUL character")

    def __repr__(self) -> str:
        """The dataclass's repr with the ``--env`` values masked: ``%cluster config`` output is
        saved with the notebook."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        shown["env"] = masked_env(self.env)
        return f"ClusterSpec({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def runs_preflight(self) -> bool:
        """Whether a new gang is checked first: always on remote nodes; on the local backend
        (this machine, this interpreter) only when a check was asked for."""
        if self.preflight is not None:
            return self.preflight
        return self.backend != "local" or bool(self.check_paths)

    @property
    def kill_after(self) -> int:
        """Whole seconds a scheduler must wait after a node's SIGTERM before it kills it (pods'
        terminationGracePeriodSeconds, Slurm's ``--signal=TERM@S``): the grace period, then
        the node's own stop."""
        return math.ceil(self.grace) + STOP_MARGIN_S

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus

    @property
    def shape(self) -> str:
        return f"{self.nodes}×{self.gpus}"

    def gang_key(self) -> tuple[Any, ...]:
        """The fields that decide whether a running gang can serve this spec."""
        return tuple(getattr(self, name) for name in gang_fields())

    def replace(self, **changes: Any) -> ClusterSpec:
        return dataclasses.replace(self, **_normalize(changes))

    @classmethod
    def build(cls, *layers: Mapping[str, Any]) -> ClusterSpec:
        """Defaults ← environment ← each layer in order (``None`` values are skipped)."""
        values: dict[str, Any] = from_environ(os.environ)
        for layer in layers:
            for key, value in layer.items():
                if key in _OPTIONS and isinstance(value, Mapping):
                    value = {**values.get(key, {}), **value}  # options merge across layers
                if value is not None:
                    values[key] = value
        return cls(**_normalize(values))


@functools.cache
def spec_fields() -> Mapping[str, dataclasses.Field]:
    """The spec's fields by name (computed once: every cell's flags are read through it)."""
    return MappingProxyType({f.name: f for f in dataclasses.fields(ClusterSpec)})


@functools.cache
def gang_fields() -> tuple[str, ...]:
    """The names of the fields that shape the gang (``gang_key``)."""
    return tuple(name for name, f in spec_fields().items() if f.metadata.get("gang"))


@functools.cache
def cap_fields() -> tuple[str, ...]:
    """The names of the fields that limit a gang's life (idle release, the cost cap)."""
    return tuple(name for name, f in spec_fields().items() if f.metadata.get("cap"))


def from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """Read ``JUPYTER_MN_<FIELD>`` variables, e.g. ``JUPYTER_MN_NODES=2``."""
    values: dict[str, Any] = {}
    for name, read in (("kubernetes", kube_from_environ), ("slurm", slurm_from_environ)):
        options = read(environ)
        if options:
            values[name] = options
    for name, f in spec_fields().items():
        if name in _OPTIONS:
            continue
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None or raw == "":
            continue
        values[name] = _parse_env(ENV_PREFIX + name.upper(), raw, f)
    return values


def masked_env(env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The ``--env`` names with their values masked, for what is shown or printed."""
    return tuple((key, MASK) for key, _ in env)


def parse_env_pairs(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``["A=1", "B=x=y"]`` → ``(("A", "1"), ("B", "x=y"))``."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"--env {item!r}: expected KEY=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


def _parse_env(var: str, raw: str, f: dataclasses.Field) -> Any:
    kind = str(f.type)
    if f.name in _SIZES:
        return raw  # "4GB": parsed with the other layers' values
    if kind.startswith("bool"):
        if raw.lower() not in _TRUE + _FALSE:
            raise SpecError(f"{var}={raw!r} is not a boolean (use 1/0, true/false)")
        return raw.lower() in _TRUE
    if f.name == "check_paths":
        return tuple(p for p in raw.split(os.pathsep) if p)
    if f.name == "workdir_exclude":
        return _patterns(raw)
    try:
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
    except ValueError:
        raise SpecError(f"{var}={raw!r} is not a number") from None
    if f.name == "env":
        return parse_env_pairs([p for p in raw.split(",") if p])
    return raw


def _normalize(values: dict[str, Any]) -> dict[str, Any]:
    for name in _SIZES:
        if isinstance(values.get(name), str):
            values = {**values, name: _bytes(name, values[name])}
    exclude = values.get("workdir_exclude")
    if isinstance(exclude, (str, list)):
        items = [exclude] if isinstance(exclude, str) else exclude
        values = {**values, "workdir_exclude": tuple(p for i in items for p in _patterns(i))}
    if isinstance(values.get("check_paths"), (list, str)):
        paths = values["check_paths"]
        values = {**values, "check_paths": (paths,) if isinstance(paths, str) else tuple(paths)}
    if isinstance(values.get("ranks"), str):
        values = {**values, "ranks": _ranks(values["ranks"])}
    elif isinstance(values.get("ranks"), list):
        values = {**values, "ranks": tuple(values["ranks"])}
    for name, options in _OPTIONS.items():
        if isinstance(values.get(name), Mapping):
            values = {**values, name: options.from_mapping(values[name])}
    env = values.get("env")
    if isinstance(env, Mapping):
        values = {**values, "env": tuple(sorted((str(k), v) for k, v in env.items()))}
    elif isinstance(env, list):
        values = {**values, "env": tuple(tuple(p) for p in env)}
    return values


#: Fields given as a size (``"4GB"``, ``"512MiB"``), or bytes.
_SIZES = ("memory_limit", "workdir_limit", "max_value")


def _patterns(text: str) -> tuple[str, ...]:
    """``"data/, *.ckpt"`` → ``("data/", "*.ckpt")``."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _check_workdir(spec: ClusterSpec) -> None:
    _check_int("workdir_limit", spec.workdir_limit, minimum=0)
    if spec.workdir is not None and (not isinstance(spec.workdir, str) or not spec.workdir.strip()):
        raise SpecError(f"--workdir needs a directory, got {spec.workdir!r}")
    for pattern in spec.workdir_exclude:
        if not isinstance(pattern, str) or "\0" in pattern:
            raise SpecError(f"--workdir-exclude needs patterns, got {pattern!r}")


def _ranks(text: str) -> tuple[int, ...]:
    """``"0,3"`` → ``(0, 3)``."""
    try:
        return tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise SpecError(f"--ranks {text!r}: expected rank numbers, e.g. 0,3") from None


def _check_plaintext(spec: ClusterSpec) -> None:
    """Dask sends pickles both ways (the cell's code to the workers, values into the kernel): over
    plain TCP whoever reaches the port can read or replace them and run code on the workers and,
    through replies, in this kernel. Loopback is no exception: on a login node or a JupyterHub
    host every local user reaches it. Only a scheduler of this very process (a ``LocalCluster``
    made in the notebook), or when asked for."""
    found = _SCHEDULER.match(spec.scheduler or "")
    if not found or found.group(1) != "tcp" or spec.insecure or _own_scheduler(spec.scheduler):
        return
    raise SpecError(
        f"--scheduler {spec.scheduler} is plain TCP: pickled code and values would travel "
        "unencrypted, and whoever reaches the port (any user of this machine, on loopback) runs "
        "code in this kernel. Use tls:// (TLS files in dask's config), or --insecure "
        "(JUPYTER_MN_INSECURE=1) where you trust every user and the network"
    )


def _own_scheduler(address: str | None) -> bool:
    """Whether a dask scheduler running in this process listens at ``address``."""
    scheduler = sys.modules.get("distributed.scheduler")  # none runs unless it was imported
    if scheduler is None:
        return False
    return any(address in (s.address, s.listen_address) for s in scheduler.Scheduler._instances)


def _check_preflight(spec: ClusterSpec) -> None:
    if spec.preflight is not None and not isinstance(spec.preflight, bool):
        raise SpecError(f"preflight must be true, false or unset, got {spec.preflight!r}")
    for name in ("min_shm_gb", "min_disk_gb"):
        value = getattr(spec, name)
        if not is_number(value, low=0):
            raise SpecError(f"{name} must be a number of GiB ≥ 0, got {value!r}")
    for path in spec.check_paths:
        if not isinstance(path, str) or not path.strip() or "\0" in path:
            raise SpecError(f"--check-path needs a path, got {path!r}")


def check_seconds(name: str, value: Any) -> None:
    """A timeout: a positive number of seconds, at most ``MAX_SECONDS``."""
    if not is_number(value, low=0, strict=True):
        raise SpecError(f"{name} must be a positive number of seconds, got {value!r}")
    if value > MAX_SECONDS:
        raise SpecError(f"{name} {value:g} s is more than {MAX_SECONDS:g} s (two weeks)")


def _check_gpu_hours(value: Any, slots: int) -> None:
    """A GPU-hours cap: a positive number whose wall time on ``slots`` GPUs fits a cap."""
    if not is_number(value, low=0, strict=True):
        raise SpecError(f"max_gpu_hours must be a positive number of hours, got {value!r}")
    if value * 3600 / slots > MAX_SECONDS:
        raise SpecError(
            f"max_gpu_hours {value:g} on {slots} GPU(s) is {value / slots:g} h of wall time, "
            f"more than any cap may be ({MAX_SECONDS / 3600:g} h, two weeks)"
        )


def check_seed(seed: Any, world_size: int) -> None:
    """A seed every rank can take: rank r is seeded with ``seed + r``, below ``SEED_LIMIT``."""
    _check_int("seed", seed, minimum=0)
    if seed + world_size > SEED_LIMIT:
        raise SpecError(
            f"seed {seed}: rank r is seeded with SEED + r, which must stay below 2**32 "
            f"(at most {SEED_LIMIT - world_size} for {world_size} ranks)"
        )


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{name} must be ≥ {minimum}, got {value}")


def _bytes(name: str, text: str) -> int:
    from dask.utils import parse_bytes

    try:
        return int(parse_bytes(text))
    except (ValueError, OverflowError):  # "1e400": parse_bytes gives inf
        raise SpecError(f"{name} {text!r} is not a size (e.g. 4GB, 512MiB)") from None
