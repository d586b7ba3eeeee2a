"""``jupyter mn submit``: hand a notebook to a detached run and return at once.

Everything a user can get wrong is checked here, before anything starts: the notebook, its
parameters (papermill's reading of its ``parameters`` cell), the flags (a ``ClusterSpec`` built
from them) and the kernel. The flags travel as ``JUPYTER_MN_*`` variables in the run's
environment, the layer every cell's spec is built over (``model/spec.py``), so a cell's own
flags win. The run is ``runner.py``, in a session of its own (``--backend slurm``: the batch
step of one Slurm job, ``slurmrun.py``): it outlives the terminal, the shell and the Jupyter
server that submitted it. It is recorded in the registry before it reads its ``Submission``, so
the runner always finds its row.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..rank.env import JOB
from .registry import JobModel, Registry, open_private
from .runstate import RunState

#: The kernel a submitted notebook runs with (``kernels/jupyter_mn``).
KERNEL = "jupyter_mn"
#: The cell magic whose flags give a notebook submitted from JupyterLab its shape.
CELL_MAGIC = "%%cluster"
#: The tag of the cell papermill injects with a run's parameters.
INJECTED = "injected-parameters"
#: Spec fields that describe the run rather than its cells' defaults.
_RUN_FIELDS = ("name",)
#: The spec fields given to ``submit`` that are backend options, by their variables' prefix.
_OPTION_PREFIXES = {"kubernetes": "JUPYTER_MN_K8S_", "slurm": "JUPYTER_MN_SLURM_"}


@dataclass(frozen=True)
class Submission:
    """What the runner is told on its stdin (as JSON; the end of it says the job is recorded)."""

    job: str
    notebook: str
    output: str
    #: ``-p`` values as given: papermill types them as its own ``-p`` does
    parameters: dict[str, str]
    #: ``--retries``: how often a Slurm requeue may start the run over (``slurmrun.py``)
    retries: int = 0
    #: variables the runner gives its kernel that hold secrets (``ENV_VARIABLE``): they travel
    #: here (a pipe, or the registry's 0600 file on Slurm), never in a Slurm job's environment
    secrets: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Submission:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Prepared:
    """A checked submission: its row, and the environment its runner starts with (less the
    secrets, which travel in the ``Submission``)."""

    submission: Submission
    model: JobModel
    environ: dict[str, str]
    #: the flags as one spec (``kuberun`` reads the driver's image, namespace and account)
    spec: Any = None
    #: ``--backend slurm``: the run's batch script (``slurmrun.py``); "" for a local run
    script: str = ""


def prepare(
    notebook: str,
    output: str | None,
    parameters: list[tuple[str, str]],
    name: str | None,
    flags: Mapping[str, Any],
    launcher: str,
) -> Prepared:
    """Check everything and build the run's row; raises ``SpecError`` with a one-line reason."""
    from ..model.gangids import gang_id
    from ..model.spec import ENV_VARIABLE, ClusterSpec

    path, cells = _notebook(notebook)
    _parameters(path, cells, parameters)
    spec = ClusterSpec.build(flags)  # a bad value: SpecError, nothing started
    defaults = {k: v for k, v in flags.items() if k not in _RUN_FIELDS}
    if spec.backend == "kubernetes" and "kubernetes" in defaults:  # the driver's, not the gangs'
        options = defaults["kubernetes"]
        defaults["kubernetes"] = {k: v for k, v in options.items() if k != "service_account"}
    environ = defaults_environ(defaults)
    secrets = {ENV_VARIABLE: environ.pop(ENV_VARIABLE)} if ENV_VARIABLE in environ else {}
    _kernel_exists()
    _backend_reachable(spec.backend)
    job_id = gang_id(name or path.stem)
    target = _output(output) if output else Registry().log_dir(job_id) / "output.ipynb"
    if output and not target.parent.is_dir():
        raise SpecError(f"-o {output}: no directory {target.parent}")
    now = time.time()
    model = JobModel(
        id=job_id,
        name=name or path.stem,
        gang=job_id,
        backend=spec.backend if spec.backend in ("kubernetes", "slurm") else "local",
        shape=spec.shape,
        gpus=spec.gpus,
        world_size=spec.world_size,
        state=RunState.SUBMITTED.value,
        started=now,
        heartbeat=now,
        notebook=str(path),
        launcher=launcher,
        output=str(target),
        cells_total=_code_cells(cells),
    )
    submission = Submission(job_id, str(path), str(target), dict(parameters), spec.retries, secrets)
    prepared = Prepared(submission, model, environ, spec)
    if model.backend != "slurm":
        return prepared
    from . import slurmrun

    log_dir = Registry().log_dir(job_id)
    script = slurmrun.batch_script(spec, job_id, log_dir, path.parent)
    slurmrun.check(spec, script, slurmrun.environ(_run_environ(prepared)))
    return dataclasses.replace(prepared, script=script)


def _output(output: str) -> Path:
    """``-o OUT`` as an absolute path, its directory resolved but not its name: what is at OUT
    when the runner writes (``wholefile.py``) counts, not a link someone placed there now."""
    path = Path(os.path.abspath(output))
    return path.parent.resolve() / path.name


def _run_environ(prepared: Prepared) -> dict[str, str]:
    """The variables the runner needs beyond this environment."""
    return {
        **prepared.environ,
        JOB: prepared.model.id,  # its processes' mark (``gc``, like a gang's)
        "JPY_SESSION_NAME": prepared.submission.notebook,  # its gangs' notebook
    }


def start(prepared: Prepared, registry: Registry) -> JobModel:
    """Start the run: its Slurm job (``slurmrun.py``), or a runner in a session of its own
    here, recorded before it is told its submission (a driver pod: ``launch.py``)."""
    if prepared.script:
        from . import slurmrun

        environ = slurmrun.environ(_run_environ(prepared))
        submission = prepared.submission.to_json()
        return slurmrun.start(prepared.model, submission, registry, environ, prepared.script)
    model, submission = prepared.model, prepared.submission
    log_dir = registry.log_dir(model.id)
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    runner_log = open_private(log_dir / "runner.log")
    environ = {**os.environ, **_run_environ(prepared)}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_mn.jobs.runner"],
            stdin=subprocess.PIPE,
            stdout=runner_log,
            stderr=runner_log,
            cwd=Path(submission.notebook).parent,
            env=environ,
            start_new_session=True,
        )
    finally:
        os.close(runner_log)
    assert proc.stdin is not None
    try:
        # its start after the runner's: ``kernel_alive`` takes a process started later for
        # another one that reuses the pid
        model.pid, model.started = proc.pid, time.time()
        registry.save(model)
        proc.stdin.write(submission.to_json().encode())
        proc.stdin.close()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return model


def defaults_environ(flags: Mapping[str, Any]) -> dict[str, str]:
    """The ``JUPYTER_MN_*`` variables that make ``flags`` (a ``spec_flags`` layer) every cell's
    defaults; a value the variables cannot carry (a comma inside an ``--env`` value) is refused,
    since the cells would run with another. They are read together, as the cells read them
    (``--backend kubernetes`` needs its ``--image``)."""
    from ..model.spec import ClusterSpec, from_environ

    wanted = ClusterSpec.build(flags)
    each = {name: _variables(name, value) for name, value in flags.items()}
    environ = {key: text for variables in each.values() for key, text in variables.items()}
    try:
        together = ClusterSpec.build(from_environ(environ))
    except SpecError:
        together = None
    for name, variables in each.items():
        if together is not None and getattr(together, name) == getattr(wanted, name):
            continue
        try:
            alone = getattr(ClusterSpec.build(from_environ(variables)), name)
        except SpecError:
            alone = None
        if together is not None or alone != getattr(wanted, name):
            flag = name.replace("_", "-")
            raise SpecError(f"--{flag}: this value cannot be passed on to the notebook's cells")
    if together is None:
        raise SpecError("these flags cannot be passed on to the notebook's cells together")
    return environ


def _variables(name: str, value: Any) -> dict[str, str]:
    from ..model.spec import ENV_PREFIX

    if name in _OPTION_PREFIXES:
        prefix = _OPTION_PREFIXES[name]
        return {prefix + option.upper(): _text(option, item) for option, item in value.items()}
    return {ENV_PREFIX + name.upper(): _text(name, value)}


def _text(name: str, value: Any) -> str:
    """A value as its ``JUPYTER_MN_*`` variable spells it (``spec.from_environ`` reads it)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if name == "check_paths":
        return os.pathsep.join(value)
    if name == "env":
        return ",".join(f"{key}={item}" for key, item in value)
    if isinstance(value, (tuple, list)):
        return ",".join(str(item) for item in value)
    return str(value)


def _notebook(notebook: str) -> tuple[Path, list[dict[str, Any]]]:
    """The notebook's absolute path and its cells, read as JSON: importing nbformat (and so
    papermill) costs seconds, and ``submit`` answers within two."""
    path = Path(notebook).resolve()
    if not path.is_file():
        raise SpecError(f"no notebook {notebook}")
    try:
        cells = json.loads(path.read_text())["cells"]
        if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise SpecError(f"{notebook} is not a notebook (a .ipynb file)") from None
    return path, cells


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _tags(cell: dict[str, Any]) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _parameters(path: Path, cells: list[dict[str, Any]], given: list[tuple[str, str]]) -> None:
    """Refuse a ``-p`` name that the notebook's ``parameters`` cell does not assign (papermill
    would only warn and run on). Papermill types the values in the runner."""
    if not given:
        return
    found = [c for c in cells if "parameters" in _tags(c)]
    if not found:
        raise SpecError(
            f"-p {given[0][0]}: {path.name} has no parameters cell (a cell tagged 'parameters')"
        )
    try:
        known = _assigned(_source(found[0]))
    except SyntaxError as exc:
        raise SpecError(f"{path.name}'s parameters cell does not parse: {exc.msg}") from None
    for name, _ in given:
        if name not in known:
            raise SpecError(
                f"-p {name}: unknown parameter; {path.name}'s parameters cell assigns "
                + (", ".join(known) or "nothing")
            )


def _assigned(source: str) -> dict[str, str]:
    """The names a cell assigns at its top level (``a = 1``, ``b: int = 2``), each with the
    source of its value."""
    names: dict[str, str] = {}
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and target.id not in names:
                names[target.id] = ast.get_source_segment(source, node.value) or ""
    return names


@dataclass(frozen=True)
class NotebookForm:
    """What submitting a notebook from JupyterLab asks and takes from it: the parameters of its
    ``parameters`` cell (each with its value there) and its first ``%%cluster`` cell's flags."""

    parameters: dict[str, str]
    #: the spec fields of the first ``%%cluster`` cell's flags (its ``--name`` names its gang,
    #: not the run): ``submit``'s defaults for every cell
    flags: dict[str, Any]
    #: that cell's flags as written ("" without a ``%%cluster`` cell)
    line: str


def notebook_form(notebook: str) -> NotebookForm:
    """Read ``notebook``'s form; a flag that does not parse or a parameters cell that does not
    is a ``SpecError`` naming it, as ``submit`` would say."""
    import shlex

    from IPython.core.error import UsageError

    from ..model.flags import cell_parser, spec_flags

    path, cells = _notebook(notebook)
    found = [c for c in cells if "parameters" in _tags(c)]
    try:
        parameters = _assigned(_source(found[0])) if found else {}
    except SyntaxError as exc:
        raise SpecError(f"{path.name}'s parameters cell does not parse: {exc.msg}") from None
    heads = (_source(c).lstrip().partition("\n")[0] for c in cells if c.get("cell_type") == "code")
    line = next((h[len(CELL_MAGIC) :].strip() for h in heads if h.split()[:1] == [CELL_MAGIC]), "")
    try:
        flags = spec_flags(cell_parser().parse_args(shlex.split(line)))
    except (UsageError, ValueError) as exc:
        raise SpecError(f"{path.name}'s first %%cluster cell: {exc}") from None
    flags.pop("name", None)
    return NotebookForm(parameters, flags, line)


def _code_cells(cells: list[dict[str, Any]]) -> int:
    """The notebook's code cells a run counts: those a person wrote, not papermill's injected
    parameters (an earlier run's, or the one it injects for ``-p``)."""
    return sum(1 for c in cells if counted_cell(c))


def counted_cell(cell: dict[str, Any]) -> bool:
    """A code cell with code that is not papermill's injected parameters (``cell k of n``)."""
    return (
        cell.get("cell_type") == "code"
        and bool(_source(cell).strip())
        and INJECTED not in _tags(cell)
    )


def _backend_reachable(backend: str) -> None:
    """Refuse a backend whose cells could not start from here (a dask scheduler's address is
    checked by the spec; whether it answers, by the first cell)."""
    if backend == "slurm":
        from ..gang.slurm.commands import available

        if not available():
            raise SpecError("--backend slurm: no sbatch here (Slurm's client commands)")
    elif backend == "kubernetes":
        from ..gang.kubernetes.discovery import load_api

        load_api()  # no cluster configured: a SchedulingError saying so


def _kernel_exists() -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        raise SpecError(
            f"no {KERNEL!r} kernel spec (pip install jupyter_mn installs it; "
            "jupyter kernelspec list shows those found)"
        ) from None
