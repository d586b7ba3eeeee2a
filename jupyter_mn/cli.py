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


def _add_doctor(sub: Any) -> None:
    from .magics import _spec_flags

    p = sub.add_parser(
        "doctor",
        help="check the nodes before a run: versions, GPUs, network, RDMA, /dev/shm, disk, paths",
    )
    _spec_flags(p)
    p.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    """Claim the nodes, print the doctor's table, release them; status 1 when a check fails."""
    from .cluster import Cluster
    from .doctor import doctor
    from .magics import spec_flags_of
    from .spec import ClusterSpec
    from .views import TextView

    with Cluster(ClusterSpec.build(spec_flags_of(args))) as cluster:
        report = doctor(cluster, TextView())
    print(report)
    return 0 if report.ok else 1


COMMANDS: tuple[Callable[[Any], None], ...] = (_add_config, _add_doctor)


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
