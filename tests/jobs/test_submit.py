"""``jupyter mn submit``'s checks and defaults, without starting a run: every bad input is one
line before anything is recorded or started, and the flags become every cell's defaults."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from jupyter_mn.cli import main
from jupyter_mn.errors import SpecError
from jupyter_mn.jobs.registry import Registry
from jupyter_mn.jobs.slurmrun import batch_script
from jupyter_mn.jobs.submit import defaults_environ, notebook_form
from jupyter_mn.model.flags import cell_parser, spec_flags
from jupyter_mn.model.slurmspec import SlurmOptions
from jupyter_mn.model.spec import ClusterSpec


@pytest.fixture
def private_runtime(tmp_path: Path) -> Iterator[Path]:
    saved = os.environ["JUPYTER_RUNTIME_DIR"]
    os.environ["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    yield tmp_path
    os.environ["JUPYTER_RUNTIME_DIR"] = saved


@pytest.fixture
def nb(tmp_path: Path) -> Path:
    parameters = nbformat.v4.new_code_cell("steps = 2\nrate: float = 0.1")
    parameters.metadata["tags"] = ["parameters"]
    cells = [parameters, nbformat.v4.new_code_cell("%%cluster\nprint(steps)")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / "nb.ipynb")
    return tmp_path / "nb.ipynb"


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            status = main(["submit", *argv])
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue()


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["missing.ipynb"], "no notebook missing.ipynb"),
        (
            ["{nb}", "-p", "stesp", "3"],
            "-p stesp: unknown parameter; nb.ipynb's parameters cell assigns steps, rate",
        ),
        (["{plain}", "-p", "steps", "3"], "-p steps: plain.ipynb has no parameters cell"),
        (["{text}"], "is not a notebook (a .ipynb file)"),
        (["{nb}", "--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
        (["{nb}", "-p", "steps"], "argument -p/--parameter: expected 2 arguments"),
        (["{nb}", "--gpus", "0"], "gpus must be ≥ 1, got 0"),
        (["{nb}", "--backend", "moon"], "unknown backend 'moon'"),
        (["{nb}", "--backend", "dask"], "backend 'dask' needs --scheduler"),
        (["{nb}", "--backend", "slurm"], "--backend slurm: no sbatch here"),
        (["{nb}", "--env", "A=1,2"], "--env: this value cannot be passed on to the notebook's"),
        (["{nb}", "-o", "nowhere/out.ipynb"], "-o nowhere/out.ipynb: no directory"),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_submitted(
    private_runtime, nb, monkeypatch, argv, error
):
    monkeypatch.chdir(private_runtime)
    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch: Slurm cannot start from here
    plain = nb.with_name("plain.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), plain)
    nb.with_name("text.ipynb").write_text("steps = 2\n")
    names = {"nb": nb, "plain": plain, "text": nb.with_name("text.ipynb")}
    status, err = run(*(a.format(**names) for a in argv))
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("jupyter mn submit: "), err
    assert error in err
    assert Registry().jobs() == []
    assert not (private_runtime / "runtime" / "jupyter-mn" / "logs").exists() or not any(
        (private_runtime / "runtime" / "jupyter-mn" / "logs").iterdir()
    )


def test_submit_flags_are_the_cells_defaults_and_a_cells_own_flags_win(shell, monkeypatch):
    given = "--nodes 3 --gpus 2 --env A=x=y --env B=2 --timeout 5 --check-path /a --rdma"
    args = cell_parser().parse_args(given.split())
    for key, value in defaults_environ(spec_flags(args)).items():
        monkeypatch.setenv(key, value)
    magics = shell.magics_manager.registry["ClusterMagics"]
    spec = magics.spec_from(cell_parser().parse_args([]))
    assert (spec.nodes, spec.gpus, spec.env, spec.timeout) == (3, 2, (("A", "x=y"), ("B", "2")), 5)
    assert (spec.check_paths, spec.rdma) == (("/a",), True)
    own = magics.spec_from(cell_parser().parse_args(["--nodes", "1", "--timeout", "9"]))
    assert (own.nodes, own.gpus, own.timeout) == (1, 2, 9)


def test_a_default_the_environment_cannot_carry_is_refused():
    with pytest.raises(SpecError, match="--env: this value cannot be passed on"):
        defaults_environ({"env": (("A", "1,2"),)})


def test_defaults_that_need_each_other_are_read_together():
    """``--backend kubernetes`` alone does not build (it needs ``--image``): the variables are
    checked as the cells read them, all at once."""
    flags = {"backend": "kubernetes", "kubernetes": {"image": "agent:1", "gang": "none"}}
    assert defaults_environ(flags) == {
        "JUPYTER_MN_BACKEND": "kubernetes",
        "JUPYTER_MN_K8S_IMAGE": "agent:1",
        "JUPYTER_MN_K8S_GANG": "none",
    }


def test_a_notebooks_form_is_its_parameters_with_their_values_and_its_first_cluster_cells_flags(
    nb,
):
    cells = nbformat.read(nb, as_version=4).cells
    cells[1].source = "%%cluster   --nodes 2 --name gang --backend local\nprint(steps)"
    cells.append(nbformat.v4.new_code_cell("%%cluster --nodes 5\nprint(1)"))
    nbformat.write(nbformat.v4.new_notebook(cells=cells), nb)
    form = notebook_form(str(nb))
    assert form.parameters == {"steps": "2", "rate": "0.1"}
    assert form.line == "--nodes 2 --name gang --backend local"
    assert form.flags == {"nodes": 2, "backend": "local"}  # --name names the gang, not the run


def test_a_notebook_without_parameters_or_cluster_cells_has_an_empty_form(tmp_path):
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%%clusters\n1")]),
        tmp_path / "plain.ipynb",
    )
    form = notebook_form(str(tmp_path / "plain.ipynb"))
    assert (form.parameters, form.flags, form.line) == ({}, {}, "")


def test_a_first_cluster_cell_whose_flags_do_not_parse_is_one_line(nb):
    cells = nbformat.read(nb, as_version=4).cells
    cells[1].source = "%%cluster --nodes two\nprint(steps)"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), nb)
    with pytest.raises(SpecError, match=r"nb.ipynb's first %%cluster cell: .*--nodes: invalid int"):
        notebook_form(str(nb))


@pytest.mark.parametrize(("retries", "requeue"), [(0, "--no-requeue"), (2, "--requeue")])
def test_a_slurm_runs_batch_script_asks_its_nodes_and_requeues_only_with_retries(
    tmp_path, retries, requeue
):
    spec = ClusterSpec(
        nodes=3,
        gpus=2,
        backend="slurm",
        retries=retries,
        slurm=SlurmOptions(partition="gpu", time="1:00:00", gres="gpu"),
    )
    script = batch_script(spec, "train-1234", tmp_path / "logs", tmp_path)
    options = [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert options == [
        "--job-name=train-1234",
        "--nodes=3",
        f"--chdir={tmp_path}",
        f"--output={tmp_path / 'logs' / 'runner.log'}",
        "--open-mode=append",
        requeue,
        "--gres=gpu:2",
        "--partition=gpu",
        "--time=1:00:00",
    ]
    assert script.endswith(
        f" -m jupyter_mn.jobs.runner < {tmp_path / 'logs' / 'submission.json'}\n"
    )
