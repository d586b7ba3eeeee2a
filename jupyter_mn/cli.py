"""``jupyter mn <command>``: terminal and batch access to what the notebook magics do.

Each command is one ``_add_<name>(subparsers)`` function that registers its parser and handler;
``main`` wires them. Handlers return an exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any


def _add_config(sub: Any) -> None:
    p = sub.add_parser("config", help="print the effective defaults (JUPYTER_MN_* environment)")
    p.set_defaults(func=_config)


def _config(args: argparse.Namespace) -> int:
    from .spec import ClusterSpec

    print(json.dumps(dataclasses.asdict(ClusterSpec.build()), indent=2))
    return 0


def _add_manifests(sub: Any) -> None:
    from .kubespec import add_flags

    p = sub.add_parser(
        "manifests", help="print the Kubernetes objects a gang would be made of (a dry run)"
    )
    p.add_argument("--nodes", type=int, help="number of nodes (pods)")
    p.add_argument("--gpus", type=int, help="GPUs (ranks) per node")
    p.add_argument("--rdma", action="store_true", default=None, help="use the RDMA fabric")
    p.add_argument("--name", help="gang name (default: a fresh jmn-… id)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="env for every rank")
    p.add_argument("--k8s-version", help="build for 1.MINOR instead of asking the cluster")
    add_flags(p)
    p.set_defaults(func=_manifests)


def _manifests(args: argparse.Namespace) -> int:
    from .gang.kubernetes.discovery import dry_run
    from .kubespec import from_args
    from .spec import ClusterSpec, parse_env_pairs

    spec = ClusterSpec.build(
        {
            "backend": "kubernetes",
            "nodes": args.nodes,
            "gpus": args.gpus,
            "rdma": args.rdma,
            "name": args.name,
            "env": parse_env_pairs(args.env) if args.env else None,
            "kubernetes": from_args(args),
        }
    )
    sys.stdout.write(dry_run(spec, args.k8s_version))
    return 0


COMMANDS: tuple[Callable[[Any], None], ...] = (_add_config, _add_manifests)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter mn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    args = parser.parse_args(argv)
    from .errors import JupyterMNError

    try:
        return args.func(args)
    except JupyterMNError as exc:
        print(f"jupyter mn {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
