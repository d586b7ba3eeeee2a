"""``jupyter mn <command>``: terminal and batch access to what the notebook magics do.

Each command is one ``_add_<name>(subparsers)`` function that registers its parser and handler;
``main`` wires them. Handlers return an exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn


def _seconds(text: str) -> float:
    """An argparse type: a finite number ≥ 0 (``float`` alone lets ``nan`` and ``inf`` through)."""
    from .model.specvalues import is_number

    try:
        value = float(text)
    except ValueError:
        value = None
    if not is_number(value, low=0):
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {text!r}")
    return value


def _add_config(sub: Any) -> None:
    p = sub.add_parser("config", help="print the effective defaults (JUPYTER_MN_* environment)")
    p.set_defaults(func=_config)


def _config(args: argparse.Namespace) -> int:
    from .model.spec import ClusterSpec, masked_env

    spec = ClusterSpec.build()
    print(json.dumps({**dataclasses.asdict(spec), "env": masked_env(spec.env)}, indent=2))
    return 0


def _add_manifests(sub: Any) -> None:
    from .model.kubespec import add_flags

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
    from .model.kubespec import from_args
    from .model.spec import ClusterSpec, parse_env_pairs

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


# ---- jobs in the registry (the same ones the Multi-node jobs panel shows)
FOLLOW_POLL_S = 0.5


def _add_list(sub: Any) -> None:
    p = sub.add_parser("list", help="jobs of this user: state, shape, age, cells, notebook")
    p.add_argument("--json", action="store_true", help="print the job models as JSON")
    p.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    import time

    from .jobs.registry import Registry

    registry = Registry()
    jobs = [_refreshed(registry, job) for job in registry.jobs()]
    if args.json:
        print(json.dumps([job.to_json() for job in jobs], indent=2))
        return 0
    if not jobs:
        print("no jobs (a %%cluster cell or Cluster(...).up() starts one)")
        return 0
    now = time.time()
    head = ("JOB", "STATE", "SHAPE", "BACKEND", "AGE", "DURATION", "CELLS", "USAGE")
    rows = [(*head, "NOTEBOOK / LAUNCHER")]
    rows += [
        (
            job.id,
            job.state,
            job.shape,
            job.backend,
            _duration(now - job.started),  # since it started, as kubectl's AGE
            _duration((job.ended or now) - job.started),
            f"{job.cells}/{job.cells_total}" if job.submitted else str(job.cells),
            job.usage or "-",
            job.notebook or job.launcher,
        )
        for job in jobs
    ]
    print("\n".join(_printable(line) for line in _columns(rows)))
    return 0


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` as lines of aligned columns (the last one as it is: a path, a long command)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]


def _refreshed(registry: Any, job: Any) -> Any:
    """A run in a Kubernetes driver pod, as its cluster says now (``jobs/kuberun.py``); its
    row as last seen when the cluster cannot be asked."""
    if not job.in_cluster:
        return job
    from .errors import JupyterMNError
    from .jobs import kuberun

    try:
        return kuberun.refresh(registry, job)
    except JupyterMNError as exc:
        job.detail = f"not refreshed: {exc}"
        return job


def _add_usage(sub: Any) -> None:
    p = sub.add_parser("usage", help="GPU-hours (rank-hours on CPUs) by notebook and by job")
    p.add_argument("--since", help="only what was used in this last span: 7d, 12h, 30m, 2w")
    p.add_argument("--json", action="store_true", help="print the totals as JSON")
    p.set_defaults(func=_usage)


def _usage(args: argparse.Namespace) -> int:
    import time

    from .jobs.registry import Registry
    from .model import usage

    since = time.time() - usage.parse_since(args.since) if args.since is not None else 0.0
    jobs = Registry().jobs()
    names = {job.id: job.name for job in jobs}
    tables = {
        "notebook": usage.totals(jobs, lambda j: j.notebook or j.launcher or "-", since),
        "job": usage.totals(jobs, lambda j: j.id, since),
    }
    if args.json:
        print(json.dumps({k: [dataclasses.asdict(t) for t in v] for k, v in tables.items()}))
        return 0
    if not tables["job"]:
        print("no GPU-hours recorded" + (f" in the last {args.since}" if args.since else ""))
        return 0
    heads = {"notebook": ("NOTEBOOK / LAUNCHER", "JOBS"), "job": ("JOB", "NAME")}
    for title, totals in tables.items():
        print(f"by {title}:")
        rows = [(*heads[title], "USAGE")] + [
            (
                t.key,
                ("" if names[t.key] == t.key else names[t.key]) if title == "job" else str(t.jobs),
                usage.text(t.hours, t.unit),
            )
            for t in totals
        ]
        print("\n".join(_printable(f"  {line}") for line in _columns(rows)))
    for unit in sorted({t.unit for t in tables["job"]}):
        total = sum(t.hours for t in tables["job"] if t.unit == unit)
        print(f"total: {usage.text(total, unit)}")
    return 0


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _add_logs(sub: Any) -> None:
    p = sub.add_parser("logs", help="a job's rank-labelled output, as in the notebook")
    p.add_argument("job", help="job id, unique id prefix or name")
    p.add_argument("--node", type=int, help="only this node")
    p.add_argument("--rank", type=int, help="only this (global) rank")
    p.add_argument("--tail", type=int, default=200, help="last lines to show (default 200)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument(
        "--raw", action="store_true", help="write control characters as the ranks wrote them"
    )
    p.set_defaults(func=_logs)


def _logs(args: argparse.Namespace) -> int:
    import time

    from .jobs.joblogs import Marks
    from .jobs.logsources import read, sources
    from .jobs.registry import Registry

    registry = Registry()
    job = registry.resolve(args.job)
    if job.in_cluster:  # the driver pod's log, through the API server
        from .jobs import kuberun

        if args.follow:

            def write(text: str) -> None:
                print(_out(args, text), flush=True)

            kuberun.follow(registry, job, max(args.tail, 0), write)
        else:
            log = kuberun.read_log(registry, job)
            lines = log.lines if log is not None and args.tail > 0 else []
            for text in lines[-args.tail :]:
                print(_out(args, text))
        return 0
    found = sources(registry, job, args.node, args.rank)  # a node or rank it lacks: refused
    cursors: dict = {}
    lines = read(found, max(args.tail, 0), cursors)
    marks = Marks()
    try:
        while True:
            for line in marks.fresh(lines):
                print(line.labelled if args.raw else _printable(line.labelled), flush=True)
            if not args.follow or (registry.job(job.id).finished and not lines):
                return 0
            time.sleep(FOLLOW_POLL_S)  # follow mode: poll the files like `tail -f`
            found = sources(registry, job, args.node, args.rank)  # a run's new gangs join
            lines = read(found, 10_000, cursors)
    except KeyboardInterrupt:
        return 0


def _out(args: argparse.Namespace, text: str) -> str:
    return text if args.raw else _printable(text)


#: What a terminal would act on rather than show: C0 and C1 controls (ESC starts colour, cursor,
#: title and clipboard sequences), DEL, and the bidirectional overrides that reorder a line.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _printable(text: str) -> str:
    """``text`` with every control character written as its escape (``\\x1b``): a rank's
    output reaches a terminal that would otherwise obey it (retitle, clear, write the
    clipboard)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def _add_request(sub: Any, action: str, help: str) -> None:
    p = sub.add_parser(action, help=help)
    p.add_argument("job", help="job id, unique id prefix or name")
    p.add_argument(
        "--wait",
        type=_seconds,
        help="seconds to wait for the kernel's answer (default 30); for a run in a driver pod,"
        " until nothing of it is left (default: until its driver is told)",
    )
    p.set_defaults(func=_request)


def _add_cancel(sub: Any) -> None:
    _add_request(
        sub, "cancel", "stop the job's running cell (the gang stays up); stop a submitted run"
    )


def _add_release(sub: Any) -> None:
    _add_request(sub, "release", "stop the job's gang now and free its GPUs")


def _request(args: argparse.Namespace) -> int:
    """Leave the request for the owning kernel (it polls), then report what it did."""
    import time

    from .jobs.launch import stop_unanswered
    from .jobs.registry import Registry

    registry = Registry()
    job = registry.resolve(args.job)
    slurm_run = job.submitted and job.backend == "slurm"
    before = job.state
    if args.command == "cancel" and (stopped := stop_unanswered(registry, job, args.wait)):
        print(f"{job.id}: {stopped.state}")
        if stopped.in_cluster and args.wait is None and before != stopped.state == "CANCELLED":
            from .jobs.kuberun import GRACE_S

            print(
                f"its driver pod is stopping: it interrupts the cell and releases its gangs"
                f" within {GRACE_S} s (--wait S waits until nothing of the run is left)",
                file=sys.stderr,
            )
        return 0
    wait = 30.0 if args.wait is None else args.wait
    request = registry.request(job.id, args.command, "cli")
    deadline = time.monotonic() + wait
    outcome = registry.outcome(request)
    ends = args.command == "release" or job.submitted  # a submitted run ends when cancelled
    while outcome is None or (ends and not registry.job(job.id).finished):
        if time.monotonic() > deadline:
            state = registry.job(job.id).state
            if slurm_run:  # its runner does not answer: Slurm stops it, and leaves nothing
                from .jobs.slurmrun import cancel_job

                cancel_job(job)
                print(f"{job.id}: no answer within {wait:g} s; its Slurm job is cancelled")
                return 0
            print(
                f"{job.id}: no confirmation within {wait:g} s ({outcome or 'not answered'};"
                f" state {state})",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.1)  # the kernel answers within its poll interval
        outcome = registry.outcome(request)
    if slurm_run:
        from .jobs.slurmrun import cancel_job

        cancel_job(job)
    if job.submitted:
        outcome = registry.job(job.id).state
    elif args.command == "release":
        outcome = "released"
    print(f"{job.id}: {outcome}")
    return 0


# ---- detached runs (jobs/submit.py, jobs/runner.py)
def _add_submit(sub: Any) -> None:
    from .model.flags import add_spec_flags

    p = sub.add_parser(
        "submit",
        help="run a notebook detached (papermill, the jupyter_mn kernel); prints its job id",
        description="Run NOTEBOOK in a process of its own that outlives this shell. Shape and "
        "backend flags are the defaults of its %%%%cluster cells; a cell's own flags win.",
    )
    p.add_argument("notebook", help="the notebook to run")
    p.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="a value for a name of the notebook's parameters cell (repeatable)",
    )
    p.add_argument("-o", "--output", help="the executed notebook (default: kept for fetch)")
    add_spec_flags(p)
    p.set_defaults(func=_submit)


def _submit(args: argparse.Namespace) -> int:
    from .jobs.launch import launch
    from .jobs.registry import Registry
    from .jobs.submit import prepare
    from .model.credentials import mask_argv
    from .model.flags import spec_flags

    prepared = prepare(
        args.notebook,
        args.output,
        [tuple(pair) for pair in args.parameter],
        args.name,
        spec_flags(args),
        " ".join(mask_argv(["jupyter mn", *sys.argv[1:]]))[:300],
    )
    job = launch(prepared, Registry())
    print(job.id)
    queued = f" ({job.detail})" if job.backend == "slurm" else ""
    print(
        f"follow: jupyter mn logs {job.id} -f | fetch: jupyter mn fetch {job.id} | "
        f"stop: jupyter mn cancel {job.id}{queued}",
        file=sys.stderr,
    )
    return 0


def _add_fetch(sub: Any) -> None:
    p = sub.add_parser("fetch", help="write a submitted run's executed notebook (also mid-run)")
    p.add_argument("job", help="job id, unique id prefix or name")
    p.add_argument("out", nargs="?", help="where to write it (default: <job id>.ipynb here)")
    p.set_defaults(func=_fetch)


def _fetch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .jobs.fetch import fetch
    from .jobs.registry import Registry

    registry = Registry()
    job = _refreshed(registry, registry.resolve(args.job))
    out = Path(args.out or f"{job.id}.ipynb")  # the id is path-safe; a name may not be
    fetch(registry, job, out)
    print(f"{out}: {_progress(job)}")
    return 0


def _progress(job: Any) -> str:
    """How far a run got: ``SUCCEEDED, 3 cells run``, ``RUNNING at cell 2 of 3``."""
    from .wire.plural import counted

    if job.state == "SUCCEEDED":
        return f"SUCCEEDED, {counted(job.cells_total, 'cell')} run"
    return f"{job.state} at cell {job.cells} of {job.cells_total}" if job.cells else job.state


def _add_gc(sub: Any) -> None:
    p = sub.add_parser("gc", help="clean up after dead kernels and forget old finished jobs")
    p.add_argument(
        "--older-than",
        type=_seconds,
        default=7.0,
        metavar="DAYS",
        help="forget finished jobs that ended this many days ago (default 7)",
    )
    p.add_argument("--dry-run", action="store_true", help="only say what would be done")
    p.set_defaults(func=_gc)


def _gc(args: argparse.Namespace) -> int:
    from .jobs.gc import collect
    from .jobs.registry import Registry

    report = collect(Registry(), keep_s=args.older_than * 86400, dry_run=args.dry_run)
    print("\n".join(report) if report else "nothing to clean up")
    return 0


def _add_doctor(sub: Any) -> None:
    from .model.flags import add_spec_flags

    p = sub.add_parser(
        "doctor",
        help="check the nodes before a run: versions, GPUs, network, RDMA, /dev/shm, disk, paths",
    )
    add_spec_flags(p)
    p.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    """Claim the nodes, print the doctor's table, release them; status 1 when a check fails."""
    from .doctor import doctor
    from .kernel.cluster import Cluster
    from .model.flags import spec_flags
    from .model.spec import ClusterSpec
    from .views import TextView

    with Cluster(ClusterSpec.build(spec_flags(args))) as cluster:
        report = doctor(cluster, TextView())
    print(report)
    return 0 if report.ok else 1


COMMANDS: tuple[Callable[[Any], None], ...] = (
    _add_config,
    _add_list,
    _add_usage,
    _add_logs,
    _add_submit,
    _add_fetch,
    _add_cancel,
    _add_release,
    _add_gc,
    _add_doctor,
    _add_manifests,
)


class _Parser(argparse.ArgumentParser):
    """A command's parser whose usage error is one line, like every other error here."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} -h)\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="jupyter mn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for add in COMMANDS:
        add(sub)
    args = parser.parse_args(argv)
    from .errors import JupyterMNError

    try:
        return args.func(args)
    except JupyterMNError as exc:
        print(f"jupyter mn {args.command}: {exc}", file=sys.stderr)
        return 2
    except (sqlite3.Error, OSError) as exc:  # the registry's database or files: say which
        print(f"jupyter mn {args.command}: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"jupyter mn {args.command}: interrupted", file=sys.stderr)
        return 130  # as a shell reports SIGINT


def _describe(exc: BaseException) -> str:
    """One line for an environment error: what failed on which file, not a traceback."""
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or exc}: {exc.filename}"
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
