"""``/jupyter-mn/api/submit`` on a real Jupyter server: a notebook's form, a refusal that is
``jupyter mn submit``'s one line with nothing submitted, and the server's own rules on who may
run a notebook and which notebooks are there."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

from jupyter_mn.jobs.registry import Registry
from tests.support.lab import jupyter_server
from tests.support.polling import wait_until

SUBMIT = "/jupyter-mn/api/submit"
JOBS = "/jupyter-mn/api/jobs"
ROOT = Path(__file__).resolve().parents[2]


def post(lab, body: object) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{lab.url}{SUBMIT}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def form_nb(lab) -> str:
    parameters = nbformat.v4.new_code_cell("steps = 2", metadata={"tags": ["parameters"]})
    cells = [parameters, nbformat.v4.new_code_cell("%%cluster --nodes 2 --gpus 0\nprint(1)")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), lab.root / "form.ipynb")
    return "form.ipynb"


def test_the_form_names_the_parameters_and_the_first_cluster_cells_flags(lab, form_nb):
    form = lab.api(f"{SUBMIT}?path={form_nb}")
    assert form == {"parameters": {"steps": "2"}, "cluster": "--nodes 2 --gpus 0"}


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({"path": "form.ipynb"}, 400, "gpus must be ≥ 1, got 0"),
        (
            {"path": "form.ipynb", "parameters": {"stpes": "3"}},
            400,
            "-p stpes: unknown parameter; form.ipynb's parameters cell assigns steps",
        ),
        ({"path": "missing.ipynb"}, 400, "no notebook"),
        ({"path": "../outside.ipynb"}, 403, "is outside the server's root"),
        ({"path": "form.ipynb", "parameters": {"steps": 3}}, 400, "parameters: an object"),
    ],
)
def test_a_refusal_is_the_clis_one_line_and_nothing_is_submitted(lab, form_nb, body, code, message):
    before = {job.id for job in Registry().jobs()}
    status, reply = post(lab, body)
    assert status == code
    assert message in reply["message"] and "\n" not in reply["message"]
    assert {job.id for job in Registry().jobs()} == before


def test_a_submitted_runs_env_values_show_masked_in_the_panels_jobs(lab):
    """The run's launcher is its first ``%%cluster`` line: its ``--env`` value is the panel's
    and the registry's ``***``."""
    value = "v" + uuid.uuid4().hex
    lab.notebook("env.ipynb", [f"%%cluster --nodes 1 --gpus 1 --env WANDB_API_KEY={value}\n1"])
    status, reply = post(lab, {"path": "env.ipynb"})
    assert status == 201, reply
    assert reply["launcher"] == "JupyterLab: submit --nodes 1 --gpus 1 --env WANDB_API_KEY=***"
    listed = json.dumps(lab.api(JOBS))
    assert reply["id"] in listed and value not in listed
    wait_until(lambda: Registry().job(reply["id"]).finished, 120, "the run to end")


def test_a_user_who_may_not_execute_in_kernels_may_not_submit(tmp_path, monkeypatch):
    """Submitting runs the notebook's code: the server's ``execute`` on ``kernels`` decides, as
    for a kernel of its own."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    authorizer = "--ServerApp.authorizer_class=tests.support.authz.NoKernels"
    with jupyter_server(tmp_path, authorizer, module="jupyter_server") as server:
        nbformat.write(
            nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), tmp_path / "nb.ipynb"
        )
        before = {job.id for job in Registry().jobs()}
        status, reply = post(server, {"path": "nb.ipynb"})
        assert status == 403, reply
        assert "jobs" in server.api(JOBS)  # the panel itself is allowed
        assert {job.id for job in Registry().jobs()} == before


def test_a_hidden_notebook_is_not_there_for_the_form_or_submit(lab):
    """As the contents manager (``allow_hidden`` off): ``.hidden/`` is neither read nor run."""
    (lab.root / ".hidden").mkdir(exist_ok=True)
    cells = [
        nbformat.v4.new_code_cell("token = 'x'", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("%%cluster --nodes 1 --gpus 0\n1"),  # a run would be refused
    ]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), lab.root / ".hidden" / "nb.ipynb")
    with pytest.raises(urllib.error.HTTPError) as form:
        lab.api(f"{SUBMIT}?path=.hidden/nb.ipynb")
    assert form.value.code == 404
    before = {job.id for job in Registry().jobs()}
    status, reply = post(lab, {"path": ".hidden/nb.ipynb"})
    assert (status, reply["message"]) == (
        404,
        "no notebook .hidden/nb.ipynb (hidden files are not served)",
    )
    assert {job.id for job in Registry().jobs()} == before
