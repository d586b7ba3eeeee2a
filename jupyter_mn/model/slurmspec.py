"""``SlurmOptions``: the Slurm part of a ``ClusterSpec`` (``spec.slurm``), validated once.

Kept out of ``spec.py`` like ``kubespec.py``; nothing here runs a Slurm command. Every value is
checked when the options are built, so a typo in ``--time`` or an ``--sbatch-arg`` that would
fight the gang's own shape is a ``SpecError`` before anything is submitted. Environment
variables are ``JUPYTER_MN_SLURM_<OPTION>`` (``--sbatch-arg``s comma-separated); config is
``c.ClusterMagics.default_slurm = {"partition": "gpu"}``. ``--schedule-timeout`` and
``--orphan-timeout`` are shared with the Kubernetes backend (one flag, both backends' options).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .specvalues import check_names, is_number, options_from_environ

ENV_PREFIX = "JUPYTER_MN_SLURM_"
#: argparse destinations of the Slurm flags are ``slurm_<field>``.
FLAG_PREFIX = "slurm_"
#: flags shared with the Kubernetes backend: their argparse destination there
SHARED_FLAGS = {"schedule_timeout": "k8s_schedule_timeout", "orphan_timeout": "k8s_orphan_timeout"}

#: Patterns are used with ``fullmatch``: ``$`` would let a trailing newline through.
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_NAMES = re.compile(r"[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*")
#: sbatch's --time: minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or UNLIMITED)
_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.\-\[\]&|*:!()]+")
_GRES = re.compile(r"auto|none|gpu(:[A-Za-z0-9_.\-]+)?")
#: sbatch options the gang sets itself (its shape, where its output goes, its name), or that
#: would break it (``--export``: the certificate travels in the environment; one job, no array)
_OWN = (
    "--export",
    "--export-file",
    "-a",
    "--array",
    "-N",
    "--nodes",
    "-n",
    "--ntasks",
    "--ntasks-per-node",
    "-J",
    "--job-name",
    "-o",
    "--output",
    "-e",
    "--error",
    "-W",
    "--wait",
    "--wrap",
)


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how the gang's batch job runs (``--backend slurm``).

    >>> SlurmOptions(partition="gpu", time="4:00:00").time
    '4:00:00'
    """

    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = ""
    constraint: str = ""
    exclusive: bool = False
    sbatch_args: tuple[str, ...] = ()
    #: ``auto``: ``--gres gpu:G`` where the partition declares GPUs, none on CPU-only nodes;
    #: ``gpu`` or ``gpu:TYPE``: always; ``none``: never
    gres: str = "auto"
    schedule_timeout: float = 600.0
    orphan_timeout: int = 120

    def __post_init__(self) -> None:
        for flag, value, rule in (
            ("--partition", self.partition, _NAMES),
            ("--account", self.account, _NAME),
            ("--qos", self.qos, _NAME),
            ("--constraint", self.constraint, _CONSTRAINT),
        ):
            if value and not rule.fullmatch(value):
                raise SpecError(f"{flag} {value!r} is not a valid Slurm name")
        if self.time and not _TIME.fullmatch(self.time):
            raise SpecError(
                f"--time {self.time!r}: expected MINUTES, H:M:S or D-H:M:S (as sbatch reads it)"
            )
        if not isinstance(self.exclusive, bool):
            raise SpecError(f"--exclusive must be true or false, got {self.exclusive!r}")
        if not _GRES.fullmatch(self.gres):
            raise SpecError(f"--gpu-gres {self.gres!r}: choose auto, none, gpu or gpu:TYPE")
        for arg in self.sbatch_args:
            _check_sbatch_arg(arg)
        if not is_number(self.schedule_timeout, low=0, strict=True):
            raise SpecError(
                f"--schedule-timeout must be positive seconds, got {self.schedule_timeout!r}"
            )
        value = self.orphan_timeout
        if isinstance(value, bool) or not isinstance(value, int) or value < 5:
            raise SpecError(f"--orphan-timeout must be an integer ≥ 5, got {value!r}")

    def replace(self, **changes: Any) -> SlurmOptions:
        return dataclasses.replace(self, **_normalize(changes))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SlurmOptions:
        check_names(cls, values, "Slurm")
        return cls(**_normalize(dict(values)))


def _check_sbatch_arg(arg: Any) -> None:
    if not isinstance(arg, str) or not arg.startswith("-") or "\n" in arg or "\0" in arg:
        raise SpecError(f"--sbatch-arg {arg!r}: expected one sbatch option, e.g. --mem=64G")
    name = arg.split("=", 1)[0]
    if (
        name in _OWN
        or (len(name) > 2 and name[:2] in _OWN and not name.startswith("--"))
        or (len(name) > 2 and name.startswith("--") and any(o.startswith(name) for o in _OWN))
    ):  # sbatch takes any unambiguous abbreviation of a long option: --expo is --export
        raise SpecError(
            f"--sbatch-arg {arg!r}: the gang sets {name} itself (use --nodes, --name, …)"
        )


def _normalize(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    if isinstance(out.get("sbatch_args"), (list, str)):
        args = out["sbatch_args"]
        out["sbatch_args"] = (args,) if isinstance(args, str) else tuple(args)
    return out


def from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """``JUPYTER_MN_SLURM_PARTITION=gpu`` and friends, typed like the fields."""
    return options_from_environ(SlurmOptions, ENV_PREFIX, environ)


def add_flags(parser: Any) -> Any:
    """The Slurm flags, on an argparse parser (the magic's or the CLI's)."""
    group = parser.add_argument_group("slurm (--backend slurm)")
    add = group.add_argument
    add("--partition", dest="slurm_partition", help="Slurm partition(s) (a,b)")
    add("--account", dest="slurm_account", help="Slurm account to charge")
    add("--qos", dest="slurm_qos", help="Slurm quality of service")
    add("--time", dest="slurm_time", help="Slurm time limit of the job (e.g. 4:00:00)")
    add("--constraint", dest="slurm_constraint", help="Slurm node features (e.g. a100&ib)")
    add(
        "--exclusive",
        dest="slurm_exclusive",
        action="store_const",
        const=True,
        help="Slurm: whole nodes, shared with no other job",
    )
    add(
        "--sbatch-arg",
        dest="slurm_sbatch_args",
        action="append",
        metavar="OPTION",
        help="one more sbatch option, e.g. --sbatch-arg=--mem=64G (repeatable)",
    )
    add("--gpu-gres", dest="slurm_gres", help="Slurm: auto, none, gpu or gpu:TYPE")
    return parser


def from_args(args: Any) -> dict[str, Any]:
    """The Slurm options given as flags (only those given)."""
    given: dict[str, Any] = {}
    for f in dataclasses.fields(SlurmOptions):
        value = getattr(args, SHARED_FLAGS.get(f.name, FLAG_PREFIX + f.name), None)
        if value is not None:
            given[f.name] = tuple(value) if isinstance(value, list) else value
    return given
