"""``%%cluster`` (run a cell on the gang) and ``%cluster VERB`` — a thin shell over ``Cluster``.

Flags are declared in ``flags.py`` and parsed with IPython's argparse wrapper (a bad flag is a
short ``UsageError``); values are checked by ``ClusterSpec``; everything else is the Python API in
``cluster.py``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.display import publish_display_data
from traitlets import Bool, Dict, Float, Integer, Unicode

from ..model.flags import add_spec_flags, cell_parser, spec_from_flags, verb_parser
from ..model.spec import ENV_PREFIX, ClusterSpec, cap_fields, gang_fields, spec_fields
from .node_magics import node_verbs
from .statustext import StatusReport

if TYPE_CHECKING:
    from .background import BackgroundCell

#: How many specs ``spec_from`` remembers (a notebook uses a few).
_SPECS_KEPT = 64


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


@magics_class
class ClusterMagics(Magics):
    """Defaults come from config (``c.ClusterMagics.default_nodes = 2``) or ``JUPYTER_MN_*``."""

    default_nodes = Integer(None, allow_none=True, config=True, help="nodes when not given")
    default_gpus = Integer(None, allow_none=True, config=True, help="ranks per node")
    default_backend = Unicode(
        None, allow_none=True, config=True, help="local | dask | kubernetes | slurm"
    )
    default_scheduler = Unicode(None, allow_none=True, config=True, help="dask scheduler address")
    default_timeout = Float(None, allow_none=True, config=True, help="per-cell timeout (s)")
    default_idle_timeout = Float(None, allow_none=True, config=True, help="idle release (s)")
    default_env = Dict(None, allow_none=True, config=True, help="env for every rank")
    default_kubernetes = Dict(
        None, allow_none=True, config=True, help="Kubernetes options, e.g. {'image': …}"
    )
    default_slurm = Dict(
        None, allow_none=True, config=True, help="Slurm options, e.g. {'partition': 'gpu'}"
    )
    default_rdma = Bool(None, allow_none=True, config=True, help="use the RDMA fabric")
    default_view = Unicode(None, allow_none=True, config=True, help="auto | widget | text")

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._parser = cell_parser()
        self._verbs: dict[str, tuple[MagicArgumentParser, Callable[[Any], Any]]] = {
            "status": (verb_parser("status"), self._status),
            "up": (add_spec_flags(verb_parser("up")), self._up),
            "down": (verb_parser("down"), self._down),
            "auto": (verb_parser("auto", (("mode",), {"choices": ["on", "off"]})), self._auto),
            "config": (verb_parser("config"), self._config),
            "stacks": (verb_parser("stacks"), self._stacks),
            "last": (verb_parser("last"), self._last),
            "debug": (verb_parser("debug", (("--rank",), {"type": int})), self._debug),
            "launch": (add_spec_flags(verb_parser("launch")), self._launch),
            **node_verbs(self.spec_from),
        }
        #: verbs whose text after `` -- `` is kept verbatim (a shell command, a Python call)
        self._raw_verbs = {"exec", "launch"}
        self._auto_on = False
        #: specs already built, by what they were built from (see ``spec_from``)
        self._specs: dict[str, ClusterSpec] = {}
        #: the newest ``--bg`` cell's handle (``%cluster last``): ``_`` moves on with any value
        self._last_bg: BackgroundCell | None = None

    # ---- spec from config + flags
    def _config_layer(self) -> dict[str, Any]:
        """The configured defaults. An unset ``Dict`` trait reads ``{}``, which counts as unset:
        it would hide ``JUPYTER_MN_ENV`` (and ``jupyter mn submit``'s ``--env``)."""
        values = {name: getattr(self, f"default_{name}", None) for name in spec_fields()}
        return {name: None if value == {} else value for name, value in values.items()}

    def spec_from(self, args: Any) -> ClusterSpec:
        """Flags given on this cell, over the running gang's shape and caps (``--idle-timeout``,
        ``--max-runtime``: a verb or cell that does not set them keeps them), over configured
        defaults.

        Remembered by everything it is made of (config, ``JUPYTER_MN_*`` variables, the running
        gang's shape, the flags): building and validating a spec takes ~0.6 ms, and a notebook
        repeats the same few lines."""
        from . import cluster

        layer = self._config_layer()
        running = cluster.current()
        kept = (*gang_fields(), *cap_fields())
        shape = [getattr(running.spec, k) for k in kept] if running is not None else None
        environ = [(k, os.environ[k]) for k in os.environ if k.startswith(ENV_PREFIX)]
        given = [(k, v) for k, v in vars(args).items() if v is not None]
        key = repr(([(k, v) for k, v in layer.items() if v is not None], environ, shape, given))
        spec = self._specs.get(key)
        if spec is None:
            base = ClusterSpec.build(layer)
            if running is not None:
                base = base.replace(**{k: getattr(running.spec, k) for k in kept})
            spec = spec_from_flags(args, base)
            if len(self._specs) >= _SPECS_KEPT:
                self._specs.clear()
            self._specs[key] = spec
        return spec

    # ---- the magic
    @line_cell_magic
    def cluster(self, line: str, cell: str | None = None) -> Any:
        """%%cluster [--nodes N] [--gpus G] …: run this cell on every rank; %cluster VERB …"""
        if cell is not None:
            return self._run(self._parser.parse_args(_words(line)), cell)
        raw = None
        verb = (line.split() or [""])[0]
        call = line.strip().removeprefix(verb).strip()
        if verb == "launch" and not call.startswith("-"):  # no flags: no ``--`` needed
            line, raw = verb, call
        elif verb in self._raw_verbs:
            line, raw = _split_command(line)
        words = _words(line)
        if not words or words[0] not in self._verbs:
            raise UsageError(
                f"%cluster needs a verb: {' | '.join(self._verbs)} (use %%cluster to run a cell)"
            )
        parser, handler = self._verbs[words[0]]
        args = parser.parse_args(words[1:])
        if raw is not None:
            args.command = raw.strip()
        return handler(args)

    def _run(self, args: Any, cell: str) -> Any:
        from ..views import make_view
        from . import cluster

        spec = self.spec_from(args)
        if args.dry_run:
            return self._dry_run(spec, args.k8s_version)
        if args.k8s_version:
            raise UsageError("--k8s-version only shapes a --dry-run; the cluster says its version")
        target = cluster.session(spec)
        cell_id = _cell_number(self.shell)
        options = {
            "namespace": self.shell.user_ns,
            "cell_id": cell_id,
            "return_all": args.all,
            "pull": _names(args.pull),
            "push": _names(args.push),
        }
        if args.bg:  # its output, pulled names and displays stay on the handle
            self._last_bg = target.submit(cell, **options)
            return self._last_bg
        view = make_view(spec, title=spec.name or f"cell {cell_id}", cell_id=cell_id)
        try:
            result = target.run(cell, on_event=view, **options)
        finally:
            view.close()
        if target.gang is not None:  # the widget's header tracks a background re-form
            view.follow(target.gang)
        if result.ok:  # on failure the notes are part of the error
            for note in result.notes:
                print(f"jupyter_mn: {note}")
        if view.displays is None or not view.displays.shown:  # else shown while the cell ran
            for bundle in result.displays:
                publish_display_data(bundle["data"], bundle["metadata"])
        if result.ok and result.pulled:
            self.shell.user_ns.update(result.pulled)
        return result.unwrap(verdict_shown=view.verdict_shown)

    def _dry_run(self, spec: ClusterSpec, k8s_version: str | None) -> None:
        if spec.backend == "slurm":
            from ..gang.slurm.provision import dry_run as slurm_dry_run

            print(slurm_dry_run(spec))
            return
        if spec.backend != "kubernetes":
            raise UsageError(
                "--dry-run prints Kubernetes objects or a Slurm batch script: "
                "add --backend kubernetes or --backend slurm"
            )
        from ..gang.kubernetes.discovery import dry_run

        print(dry_run(spec, k8s_version))

    # ---- verbs
    def _status(self, args: Any) -> StatusReport | None:
        from . import cluster

        running = cluster.current()
        if running is None:
            print("jupyter_mn: no cluster (the next %%cluster cell starts one)")
            return None
        return StatusReport(running.status())

    def _up(self, args: Any) -> StatusReport:
        from ..views import TextView
        from . import cluster

        spec = self.spec_from(args)
        target = cluster.session(spec)
        target.up(TextView(spec=spec, title=spec.name or "up"))
        return StatusReport(target.status())

    def _stacks(self, args: Any) -> None:
        from ..views.stacktext import format_stacks
        from . import cluster

        running = cluster.current()
        if running is None or running.gang is None:
            print("jupyter_mn: no gang is up")
            return
        print(format_stacks(running.stacks()))

    def _last(self, args: Any) -> BackgroundCell:
        """``h = %cluster last``: the newest ``%%cluster --bg`` cell's handle."""
        if self._last_bg is None:
            raise UsageError("no %%cluster --bg cell has run in this kernel")
        return self._last_bg

    def _debug(self, args: Any) -> None:
        """``%cluster debug [--rank R]``: pdb on a rank of the last, failed cell."""
        from ..errors import DebugUnavailable
        from ..gang.debugger import can_prompt
        from . import cluster

        running = cluster.current()
        if running is None:
            raise DebugUnavailable("no cluster has run a cell: there is nothing to debug")
        if not can_prompt():
            raise DebugUnavailable(
                "this frontend cannot answer a prompt (no stdin: papermill, nbclient); "
                "debug in a notebook, or with Cluster.debug() in a terminal"
            )
        running.debug(args.rank)

    def _launch(self, args: Any) -> Any:
        """``%cluster launch [flags --] train(cfg, lr=0.1)``: an existing function on every rank;
        the arguments are evaluated in the notebook."""
        from . import cluster
        from .runfunction import parse_call

        fn, fargs, fkwargs = parse_call(args.command, self.shell.user_ns)
        return cluster.session(self.spec_from(args)).launch(fn, *fargs, **fkwargs)

    def _down(self, args: Any) -> None:
        from . import cluster

        cluster.shutdown()
        print("jupyter_mn: cluster released")

    def _config(self, args: Any) -> ClusterSpec:
        return self.spec_from(self._parser.parse_argstring(""))

    def _auto(self, args: Any) -> None:
        transformers = self.shell.input_transformers_cleanup
        if args.mode == "on" and not self._auto_on:
            transformers.append(_auto_cluster)
        elif args.mode == "off" and self._auto_on:
            transformers.remove(_auto_cluster)
        self._auto_on = args.mode == "on"
        print(
            f"jupyter_mn: auto mode {args.mode}"
            + (": every cell runs on the cluster" if self._auto_on else "")
        )


def _words(line: str) -> list[str]:
    """The line split as a POSIX shell would; an unbalanced quote is a ``UsageError``."""
    try:
        return shlex.split(line)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise UsageError(f"%cluster: {exc} in {line!r}") from None


def _split_command(line: str) -> tuple[str, str]:
    """``exec --node 1 -- ls -l | head`` → (``exec --node 1``, ``ls -l | head``)."""
    head, *rest = re.split(r"\s--(?:\s|$)", line, maxsplit=1)
    return head, rest[0] if rest else ""


def _cell_number(shell: Any) -> int:
    """The ``In[N]`` of the cell running now, as the notebook shows it.

    IPython counts the cell before running it (``shell.execution_count`` is already N + 1 inside
    cell N), so the count is the running cell's own ``ExecutionResult``'s, which the display hook
    holds while the cell runs; outside a cell the shell's count is the next cell's.
    """
    running = getattr(shell.displayhook, "exec_result", None)
    return shell.execution_count if running is None else running.execution_count


def _auto_cluster(lines: list[str]) -> list[str]:
    """Input transformer for ``%cluster auto on``: every cell becomes a ``%%cluster`` cell."""
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first or first.startswith(("%cluster", "%%cluster")):
        return lines
    return ["%%cluster\n", *lines]


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(ClusterMagics)
    if getattr(ipython, "kernel", None) is not None:
        import ipywidgets  # noqa: F401  (registers the comm a widget frontend opens on connect)

        from .kernelshutdown import close_gangs_first

        close_gangs_first(ipython.kernel)
