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


COMMANDS: tuple[Callable[[Any], None], ...] = (_add_config,)


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
