"""The node verbs of ``%cluster``: ``doctor``, ``exec``, ``run`` and ``bench``.

Each parses its flags (the gang flags too, so ``%cluster doctor --backend dask --scheduler …``
works before any cell), takes the kernel's cluster for that spec, and calls the Python API:
``doctor.doctor``, ``gang.shell.run_on_nodes``, ``gang.script.run_script``, ``bandwidth.bench``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..model.flags import Argument, add_spec_flags, verb_parser
from ..model.spec import ClusterSpec

if TYPE_CHECKING:
    from IPython.core.magic_arguments import MagicArgumentParser


#: Seconds a ``%cluster exec`` command may run when no --timeout is given.
EXEC_TIMEOUT_S = 600.0


def node_verbs(
    spec_from: Callable[[Any], ClusterSpec],
) -> dict[str, tuple[MagicArgumentParser, Callable]]:
    """The node verbs' parsers and handlers; ``spec_from``: the magic's flags → a spec."""

    def parser(verb: str, *arguments: Argument) -> MagicArgumentParser:
        return add_spec_flags(verb_parser(verb, *arguments))

    verbs = NodeVerbs(spec_from)
    return {
        "doctor": (parser("doctor"), verbs.doctor),
        "exec": (
            parser(
                "exec",
                (("--node",), {"type": int, "action": "append", "help": "node index"}),
                (("--all-nodes",), {"action": "store_true", "help": "every node"}),
            ),
            verbs.exec,
        ),
        "run": (
            parser(
                "run",
                (("-m", "--module"), {"action": "store_true", "help": "SCRIPT is a module"}),
                (("script",), {"help": "the training script, e.g. train.py"}),
                (("script_args",), {"nargs": argparse.REMAINDER, "help": "its arguments"}),
            ),
            verbs.run,
        ),
        "bench": (
            parser(
                "bench",
                (("--size",), {"default": "256M", "help": "buffer size, e.g. 64M, 1G"}),
                (("--iters",), {"type": int, "default": 10, "help": "timed iterations"}),
                (("--warmup",), {"type": int, "default": 2, "help": "warm-up iterations"}),
            ),
            verbs.bench,
        ),
    }


class NodeVerbs:
    """Handlers: flags → the kernel's cluster for them → the Python API → what is shown."""

    def __init__(self, spec_from: Callable[[Any], ClusterSpec]) -> None:
        self._spec_from = spec_from

    def _cluster(self, args: Any) -> Any:
        from . import cluster

        return cluster.session(self._spec_from(args))

    def doctor(self, args: Any) -> Any:
        from ..doctor import doctor
        from ..views import TextView

        return doctor(self._cluster(args), TextView())

    def exec(self, args: Any) -> None:
        from ..errors import SpecError
        from ..gang.shell import check_nodes, run_on_nodes
        from ..views import TextView

        target = self._cluster(args)
        if args.all_nodes == bool(args.node):
            raise SpecError("%cluster exec needs --node N (repeatable) or --all-nodes")
        nodes = list(range(target.spec.nodes)) if args.all_nodes else args.node
        check_nodes(nodes, target.spec.nodes)
        with target.nodes(TextView(), preflight=False, files=False) as gang:
            outputs = run_on_nodes(
                gang,
                args.command or "",
                nodes,
                target.spec.timeout or EXEC_TIMEOUT_S,
                lambda node, line: print(f"[node {node}] {line}"),
                sys.stdout.flush,
            )
        for out in outputs:
            if status := out.status():
                print(f"[node {out.node}] {status}")

    def run(self, args: Any) -> int | None:
        from ..gang.script import run_script
        from ..views import TextView

        target = self._cluster(args)
        view = TextView()
        with target.nodes(view) as gang:
            result = run_script(
                gang,
                args.script,
                args.script_args,
                view,
                target.spec.timeout,
                module=args.module,
            )
        value = result.unwrap()
        for note in result.notes:
            print(f"jupyter_mn: {note}")
        print(
            f"jupyter_mn: {args.script} finished on {len(result.ranks)} rank(s) in "
            f"{result.elapsed:.1f} s"
        )
        return value

    def bench(self, args: Any) -> Any:
        from ..views import TextView
        from .bandwidth import bench, parse_size

        size = parse_size(args.size)
        return bench(self._cluster(args), size, args.iters, args.warmup, TextView())
