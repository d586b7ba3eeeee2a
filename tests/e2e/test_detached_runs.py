"""``jupyter mn submit`` with real processes: a run outlives the shell that submitted it, is
followed, fetched mid-run and at its end, cancelled, and fails when its kernel is killed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest

from jupyter_mn.jobs.registry import JobModel
from jupyter_mn.model import usage
from jupyter_mn.wire.events import HoursUnit
from tests.support.polling import wait_until
from tests.support.runs import JUPYTER_MN, mn, submit_in_a_shell

#: A submitted run starts a kernel and a gang, under whatever else this machine runs.
RUN_S = 240


def notebook(path: Path, *cells: str) -> Path:
    """A notebook whose first cell is its parameters cell."""
    first, *rest = cells
    parameters = nbformat.v4.new_code_cell(first)
    parameters.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[parameters, *map(nbformat.v4.new_code_cell, rest)])
    nbformat.write(nb, path)
    return path


def submit(*args: str) -> str:
    return mn("submit", *args).stdout.strip()


def jobs() -> list[JobModel]:
    """The registry as ``jupyter mn list`` reads it, in a process of its own."""
    return [JobModel.from_json(j) for j in json.loads(mn("list", "--json").stdout)]


def job(job_id: str) -> JobModel:
    (found,) = [j for j in jobs() if j.id == job_id]
    return found


def ended(job_id: str) -> JobModel:
    return wait_until(lambda: (j := job(job_id)).finished and j, RUN_S, f"{job_id} to end")


def running_cell(job_id: str, text: str) -> None:
    """Wait until the run's log shows ``text`` (its ranks are in the cell)."""
    wait_until(lambda: text in mn("logs", job_id).stdout, RUN_S, f"{text!r} in the logs")


def outputs(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


def gangs_of(run: JobModel) -> list[JobModel]:
    return [j for j in jobs() if j.run == run.id]


TRAIN = (
    "%%cluster\nimport time\nfor i in range(steps):\n"
    "    print('step', i, 'of', dist.get_world_size(), flush=True)\n    time.sleep(pause)"
)


@pytest.mark.slow
def test_a_run_outlives_the_shell_that_submitted_it_and_fetch_gives_every_cell(
    tmp_path, no_leftovers
):
    nb = notebook(tmp_path / "train.ipynb", "steps = 2\npause = 0.2", TRAIN, "print('done', steps)")
    job_id, said = submit_in_a_shell(str(nb), "-p steps 3 --nodes 2")
    assert "follow: jupyter mn logs" in said
    follow = subprocess.run(
        [*JUPYTER_MN, "logs", job_id, "-f"], capture_output=True, text=True, timeout=RUN_S
    )  # returns once the run has ended
    run = ended(job_id)
    # papermill's injected parameters are no cell of the notebook's
    assert (run.state, run.cells, run.cells_total, run.error) == ("SUCCEEDED", 3, 3, None)
    assert "[node 1 rank 1] step 2 of 2" in follow.stdout  # submit's --nodes 2: the cell's default
    assert "──── cell 3 of 3 started" in follow.stdout and "──── SUCCEEDED" in follow.stdout
    mn("fetch", job_id, cwd=tmp_path)  # to <job id>.ipynb here
    cells = nbformat.read(tmp_path / f"{job_id}.ipynb", 4).cells
    assert [c["metadata"]["papermill"]["status"] for c in cells] == ["completed"] * 4
    assert "[node 0 rank 0] step 0 of 2" in outputs(cells[2]) and outputs(cells[3]) == "done 3\n"
    assert [g.state for g in gangs_of(run)] == ["CLOSED"]  # closed by the kernel's shutdown


@pytest.mark.slow
def test_fetch_mid_run_gives_the_finished_cells_and_cancel_leaves_no_process(
    tmp_path, no_leftovers
):
    nb = notebook(
        tmp_path / "long.ipynb",
        "steps = 10_000\npause = 0.2",
        "print('first cell done')",
        TRAIN,
        "print('never')",
    )
    job_id = submit(str(nb), "--nodes", "2", "--name", "long")
    running_cell(job_id, "[node 1 rank 1] step 1 of 2")
    mn("fetch", "long", str(tmp_path / "mid.ipynb"))
    cells = nbformat.read(tmp_path / "mid.ipynb", 4).cells
    status = [c["metadata"]["papermill"]["status"] for c in cells]
    assert status == ["completed", "completed", "running", "pending"]
    assert outputs(cells[1]) == "first cell done\n"
    assert mn("cancel", job_id, "--wait", "60").stdout == f"{job_id}: CANCELLED\n"
    run = job(job_id)
    cancelled = ("CANCELLED", "cancelled at cell 3 of 4", None)
    assert (run.state, run.detail, run.error) == cancelled, run
    assert [g.state for g in gangs_of(run)] == ["CLOSED"]  # released by the kernel, not orphaned


@pytest.mark.slow
def test_a_killed_kernel_fails_the_run_with_its_cause_and_releases_its_gang(tmp_path, no_leftovers):
    nb = notebook(tmp_path / "doomed.ipynb", "steps = 10_000\npause = 0.2", TRAIN)
    job_id = submit(str(nb), "--nodes", "2")
    running_cell(job_id, "[node 1 rank 1] step 1 of 2")
    (kernel,) = [
        p
        for p in psutil.Process(job(job_id).pid).children()
        if "ipykernel" in " ".join(p.cmdline())
    ]
    kernel.kill()
    run = ended(job_id)
    assert run.state == "FAILED"
    assert run.error == "the kernel died (killed by SIGKILL)"
    (gang,) = gangs_of(run)
    assert gang.finished  # ORPHANED; what it left is cleaned up (no_leftovers checks)


README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.slow
def test_the_readme_example_works_pasted_into_a_shell(tmp_path, no_leftovers):
    section = README.read_text().split("## Detached runs\n", 1)[1]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M)[1]
    (tmp_path / "notebooks").mkdir()
    shutil.copy(README.parent / "notebooks" / "03-papermill.ipynb", tmp_path / "notebooks")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # jupyter, jupyter-mn
    shell = subprocess.run(
        ["bash", "-e", "-c", block],
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    assert shell.returncode == 0, shell.stderr
    assert "[node 1 rank 1] step 30/30" in shell.stdout and "──── SUCCEEDED" in shell.stdout
    cells = nbformat.read(tmp_path / "out.ipynb", 4).cells
    assert "mean final loss over the ranks" in "".join(map(outputs, cells))


def test_a_cell_that_raises_fails_the_run_with_its_cause(tmp_path, no_leftovers):
    nb = notebook(tmp_path / "bad.ipynb", "limit = 1", "raise ValueError(f'limit {limit} too low')")
    run = ended(submit(str(nb), "-p", "limit", "0"))
    assert (run.state, run.error) == ("FAILED", "cell 2 of 2: ValueError: limit 0 too low")


@pytest.mark.slow
def test_the_fetched_notebook_and_the_runs_row_hold_what_its_gangs_used(tmp_path, no_leftovers):
    nb = notebook(tmp_path / "count.ipynb", "steps = 2\npause = 0.2", TRAIN)
    job_id = submit(str(nb), "--nodes", "2", "--gpus", "1")
    run = ended(job_id)
    assert run.state == "SUCCEEDED", run.error
    (gang,) = gangs_of(run)
    rank_1 = mn("logs", job_id, "--rank", "1").stdout  # its gang's lines of rank 1
    assert "[node 1 rank 1] step 1 of 2" in rank_1 and "rank 0]" not in rank_1
    mn("fetch", job_id, str(tmp_path / "out.ipynb"))
    meta = nbformat.read(tmp_path / "out.ipynb", 4).metadata["jupyter_mn"]
    assert (meta["job"], meta["state"]) == (job_id, "SUCCEEDED")
    assert meta["gangs"] == [
        {
            "id": gang.id,
            "shape": "2×1",
            "backend": "local",
            "unit": gang.unit,
            "gpu_hours": gang.gpu_hours,
        }
    ]
    assert gang.unit in {u.value for u in HoursUnit} and gang.gpu_hours > 0
    assert meta["gpu_hours"] == {gang.unit: gang.gpu_hours}
    assert (run.unit, run.gpu_hours) == (gang.unit, gang.gpu_hours)
    (row,) = [line for line in mn("list").stdout.splitlines() if line.startswith(job_id)]
    assert usage.text(gang.gpu_hours, gang.unit) in row
