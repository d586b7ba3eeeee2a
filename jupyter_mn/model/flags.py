"""The command-line flags of a ``ClusterSpec``, shared by ``%%cluster``, ``%cluster VERB`` and
``jupyter mn``.

One list of flags, one way back from parsed flags to a spec: the magics and the CLI parse the same
words into the same spec. Flags are parsed with IPython's argparse wrapper in the notebook (a bad
flag is a short ``UsageError``) and plain argparse in the CLI; values are checked by
``ClusterSpec``.
"""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from IPython.core.magic_arguments import MagicArgumentParser

from . import kubespec, slurmspec
from .spec import ClusterSpec, parse_env_pairs, spec_fields

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)

#: one positional or optional argument of a verb: ``(("--node",), {"type": int})``
Argument = tuple[tuple[str, ...], dict[str, Any]]


def add_spec_flags(parser: Parser) -> Parser:
    """Flags that shape the gang or set its cells' defaults, with the preflight, Kubernetes and
    Slurm flags; returns ``parser``."""
    add = parser.add_argument
    add("--nodes", type=int, help="number of nodes (one agent each)")
    add("--gpus", type=int, help="ranks per node (one per GPU; CPU ranks without)")
    add("--backend", help="local (default), dask, kubernetes or slurm")
    add("--scheduler", help="dask scheduler address for --backend dask")
    add(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a plain tcp:// scheduler on another host (unencrypted pickles)",
    )
    add(
        "--env",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="environment variable for every rank (repeatable)",
    )
    add("--name", help="job name (lowercase, digits, '-')")
    add("--timeout", type=float, help="seconds before the cell is interrupted")
    add(
        "--hang-timeout",
        type=float,
        help="say which rank holds the others up when no rank progressed for S seconds while "
        "some wait in a collective (default 300; 0: off)",
    )
    add("--retries", type=int, help="re-run the cell this often if a rank is lost")
    add("--seed", type=int, help="seed every rank with SEED + rank")
    add("--idle-timeout", type=float, help="release the gang after S idle seconds")
    add("--start-timeout", type=float, help="seconds allowed to bring the gang up")
    add("--max-runtime", type=float, help="tear the gang down after S seconds (a cost cap)")
    add(
        "--max-gpu-hours",
        type=float,
        help="tear the gang down once nodes × GPUs × hours reach H (rank-hours on CPUs)",
    )
    add("--local-limit", type=int, help="local backend: most ranks a gang may have (512)")
    add("--grace", type=float, help="seconds a preempted node keeps running (default 120)")
    add("--memory-limit", help="kill a rank whose resident memory exceeds this (e.g. 8GB)")
    add("--rdma", action="store_true", default=None, help="use the RDMA fabric (IB/RoCE/EFA)")
    add(
        "--require-rdma",
        action="store_true",
        default=None,
        help="fail the gang if NCCL would use TCP sockets between nodes",
    )
    add(
        "--debug",
        action="store_true",
        default=None,
        help="NCCL_DEBUG=INFO and torch.distributed debug output in the logs",
    )
    add("--view", choices=["auto", "widget", "text"], help="how to show the cell")
    add("--ranks", help="show only these ranks' lines (0,3); all still go to the logs")
    add(
        "--max-value",
        metavar="SIZE",
        help="refuse, on the rank, a value or --pull name larger than this (default 4GiB)",
    )
    return slurmspec.add_flags(kubespec.add_flags(_add_workdir_flags(_add_preflight_flags(parser))))


def _add_preflight_flags(parser: Parser) -> Parser:
    """Where nodes come from on a dask cluster, and what the preflight doctor checks."""
    add = parser.add_argument
    add(
        "--same-host",
        dest="same_host",
        action="store_const",
        const=True,
        help="dask: several workers of one host may be nodes",
    )
    add(
        "--no-preflight",
        dest="preflight",
        action="store_const",
        const=False,
        help="skip the checks before a new gang",
    )
    add(
        "--preflight",
        dest="preflight",
        action="store_const",
        const=True,
        help="run the checks before a new gang (default on remote backends)",
    )
    add(
        "--check-path",
        dest="check_paths",
        action="append",
        default=None,
        metavar="PATH",
        help="preflight: this path must exist on every node (repeatable)",
    )
    add("--min-shm-gb", type=float, help="preflight: least /dev/shm size (GiB)")
    add("--min-disk-gb", type=float, help="preflight: least free disk (GiB)")
    return parser


def _add_workdir_flags(parser: Parser) -> Parser:
    """What of the notebook's directory travels to nodes that do not see it."""
    add = parser.add_argument
    add("--workdir", metavar="DIR", help="send this directory, not the kernel's working one")
    add(
        "--no-workdir",
        dest="send_workdir",
        action="store_const",
        const=False,
        help="send no files; ranks run in the workers' own directory",
    )
    add(
        "--workdir-exclude",
        action="append",
        default=None,
        metavar="PATTERNS",
        help="gitignore-style patterns (a,b) of files not to send (repeatable)",
    )
    add("--workdir-limit", metavar="SIZE", help="the most bytes sent (default 100MiB)")
    return parser


def cell_parser() -> MagicArgumentParser:
    """The flags of a ``%%cluster`` cell: the spec's, and how this one cell runs."""
    parser = add_spec_flags(MagicArgumentParser(prog="%%cluster", add_help=False))
    add = parser.add_argument
    add("--all", action="store_true", help="return every rank's value (a list)")
    add("--pull", help="copy these names (a,b) from rank 0 into the notebook")
    add("--push", help="send these notebook names (a,b) even if skipped")
    add("--bg", action="store_true", help="run in the background; returns a handle at once")
    add(
        "--dry-run",
        action="store_true",
        help="print the Kubernetes objects or the Slurm batch script instead of running",
    )
    add("--k8s-version", help="with --dry-run: build for 1.MINOR, ask no cluster")
    return parser


def verb_parser(verb: str, *arguments: Argument) -> MagicArgumentParser:
    """The parser of ``%cluster VERB`` with these arguments (no spec flags: see
    ``add_spec_flags``)."""
    parser = MagicArgumentParser(prog=f"%cluster {verb}", add_help=False)
    for flags, kwargs in arguments:
        parser.add_argument(*flags, **kwargs)
    return parser


def spec_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The spec fields given as flags (parsed by ``add_spec_flags``): a layer for
    ``ClusterSpec.build``, with ``--env`` pairs split and the Kubernetes options given as a
    mapping (``build`` merges it into the other layers' options)."""
    given = {
        name: getattr(args, name, None)
        for name in spec_fields()
        if getattr(args, name, None) is not None
    }
    if "env" in given:
        given["env"] = parse_env_pairs(given["env"])
    for name, read in (("kubernetes", kubespec.from_args), ("slurm", slurmspec.from_args)):
        options = read(args)
        if options:
            given[name] = options
    return given


def spec_from_flags(args: argparse.Namespace, base: ClusterSpec) -> ClusterSpec:
    """``base`` with the spec fields given as flags over it (its Kubernetes options kept where
    no flag sets them)."""
    given = spec_flags(args)
    for name in ("kubernetes", "slurm"):
        if name in given:
            given[name] = getattr(base, name).replace(**given[name])
    return base.replace(**given)
