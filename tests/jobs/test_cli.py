import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_mn.cli import main
from jupyter_mn.jobs.joblogs import OUTPUT_RANK, JobLogWriter
from jupyter_mn.jobs.registry import Registry
from jupyter_mn.wire.events import LogLines
from tests.support.jobs import SCIENTIFIC, make_job
from tests.support.polling import wait_until


def test_config_prints_effective_defaults_from_the_environment(monkeypatch):
    env = {"JUPYTER_MN_NODES": "3", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_mn.cli", "config"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["nodes"] == 3


def test_bad_environment_gives_a_short_error_and_status_2():
    env = {"JUPYTER_MN_GPUS": "0", "PATH": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_mn.cli", "config"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "jupyter mn config: gpus must be ≥ 1, got 0"


def test_doctor_takes_the_kubernetes_flags_into_its_spec(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none"), "PATH": ""}
    flags = ["--backend", "kubernetes", "--image", "agent:1", "--nodes", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_mn.cli", "doctor", *flags],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("jupyter mn doctor: no Kubernetes cluster configured"), (
        proc.stderr
    )


# ---- environment errors and odd input: a short message and a status, never a traceback
MN = [sys.executable, "-m", "jupyter_mn.cli"]


def _mn(*args: str, runtime: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": runtime}
    return subprocess.run([*MN, *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_registry_it_may_not_create_is_one_line_and_status_1():
    proc = _mn("list", runtime=f"/sys/jmn-test-{uuid.uuid4().hex[:8]}")  # EPERM, even for root
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("jupyter mn list: Operation not permitted: /sys/jmn-test-")
    assert len(proc.stderr.splitlines()) == 1


def test_a_sqlite_error_is_one_line_and_status_1(tmp_path: Path):
    (tmp_path / "jupyter-mn" / "jobs.sqlite-wal").mkdir(parents=True)  # SQLite cannot open it
    proc = _mn("list", runtime=str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == "jupyter mn list: OperationalError: disk I/O error\n"


def test_ctrl_c_while_waiting_for_a_kernel_is_status_130_without_traceback(tmp_path: Path):
    registry = Registry(tmp_path / "jupyter-mn")
    registry.save(make_job("cli-wait"))  # live (this process), but no kernel answers
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [*MN, "release", "cli-wait", "--wait", "60"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(lambda: registry.job("cli-wait").pending, 30, "the release request")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        registry.close()
    assert proc.returncode == 130
    assert err == "jupyter mn release: interrupted\n"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "x"])
def test_seconds_must_be_finite(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["gc", "--dry-run", "--older-than", value])
    assert info.value.code == 2
    assert f"--older-than: expected a number ≥ 0, got '{value}'" in capsys.readouterr().err


CLI_WORDS = [
    "--nodes", "--gpus", "--rdma", "--name", "--env", "--image", "--namespace", "--cpu",
    "--volume", "--toleration", "--node-selector", "--schedule-timeout", "--lifetime",
    "--node", "--rank", "--tail", "--json", "-f", "nan", "inf", "1e400", "-1", "0", "x=1",
    "a\n", "img:1", "'", "--", "-h",
]  # fmt: skip
TOKENS = st.one_of(st.sampled_from(CLI_WORDS), st.text(max_size=12))
COMMANDS = [["manifests", "--k8s-version", "1.30"], ["logs"], ["list"], ["config"]]


@pytest.fixture(scope="module")
def private_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    saved = os.environ["JUPYTER_RUNTIME_DIR"]
    os.environ["JUPYTER_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("fuzz-runtime"))
    yield
    os.environ["JUPYTER_RUNTIME_DIR"] = saved


@settings(
    max_examples=150,
    deadline=2000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(command=st.sampled_from(COMMANDS), args=st.lists(TOKENS, max_size=8))
def test_any_command_line_is_done_or_a_short_error(private_runtime, command, args):
    """Commands that read or print only (no gang, no request to a kernel)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            status = main([*command, *args])
        except SystemExit as exc:  # argparse: usage error (2) or --help (0)
            status = exc.code
    assert status in (0, 1, 2), status
    assert "Traceback" not in err.getvalue()
    assert status == 0 or "jupyter mn" in err.getvalue()  # usage, or "jupyter mn CMD: …"


def test_logs_of_a_run_for_a_node_or_rank_are_its_gangs_lines(capsys):
    """A run has no nodes: its ranks' lines are in the logs of the gangs its kernel made."""
    tag = uuid.uuid4().hex[:8]
    registry = Registry()
    run = make_job(f"run-{tag}", output="out.ipynb", nodes=[])
    first = make_job(f"first-{tag}", run=run.id, started=run.started + 1)
    wide = make_job(f"wide-{tag}", run=run.id, started=run.started + 2, world_size=4, shape="4×1")
    for job in (run, first, wide):
        registry.save(job)
    own = JobLogWriter(registry.log_dir(run.id))
    own.mark(1, "cell 2 of 2 started", now=1.0)
    own.write(LogLines(0, 1, ((OUTPUT_RANK, "out", ("[node 1 rank 1] as the cell showed",)),)), 2)
    for at, gang in ((3.0, first), (4.0, wide)):
        logs = JobLogWriter(registry.log_dir(gang.id))
        logs.write(LogLines(0, 1, ((0, "out", (f"{gang.name} rank 0",)),)), at)
        logs.write(LogLines(1, 1, ((1, "out", (f"{gang.name} rank 1",)),)), at)
        logs.close()
    own.close()
    try:
        for flag in ("--rank", "--node"):
            assert main(["logs", run.id, flag, "1"]) == 0
            assert capsys.readouterr().out.splitlines() == [
                "──── cell 2 of 2 started ────",
                f"[node 1 rank 1] first-{tag} rank 1",
                f"[node 1 rank 1] wide-{tag} rank 1",
            ]
        assert main(["logs", run.id, "--rank", "3"]) == 0  # only the wide gang has it: no lines
        assert capsys.readouterr().out == "──── cell 2 of 2 started ────\n"
        assert main(["logs", run.id, "--rank", "4"]) == 2
        assert capsys.readouterr().err == (
            f"jupyter mn logs: --rank 4: no gang of run {run.id} has it "
            f"(first-{tag} has ranks 0–1, wide-{tag} has ranks 0–3)\n"
        )
    finally:
        registry.close()


def test_list_says_a_jobs_age_and_how_long_it_ran_and_usage_without_e_notation(capsys):
    """AGE is how long ago a job started (as kubectl's), DURATION how long it ran; hours read as
    a person writes them."""
    tag = uuid.uuid4().hex[:8]
    now = time.time()
    job = make_job(
        f"aged-{tag}",
        state="CLOSED",
        started=now - 7200,
        up=now - 7200,
        ended=now - 7200 + 5,
        unit="rank-hours",
    )
    registry = Registry()
    registry.save(job)
    try:
        assert main(["list"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split()[4:8] == ["AGE", "DURATION", "CELLS", "USAGE"]
        (row,) = [line.split() for line in lines if line.startswith(job.id)]
        assert row[4:9] == ["2h00m", "0m05s", "0", "<", "0.01"] and row[9] == "rank-hours"
        assert not SCIENTIFIC.search("\n".join(lines))
    finally:
        registry.forget(job.id)


def test_usage_by_job_has_headers_and_names_a_job_once(capsys):
    tag = uuid.uuid4().hex[:8]
    now = time.time()
    unnamed = make_job(f"jmn-{tag}", state="CLOSED", up=now - 90, ended=now, unit="rank-hours")
    named = make_job(
        f"train-{tag}", name="train", state="CLOSED", up=now - 900, ended=now, unit="rank-hours"
    )
    registry = Registry()
    for job in (unnamed, named):
        registry.save(job)
    try:
        assert main(["usage"]) == 0
        out = capsys.readouterr().out.splitlines()
        by_job = out[out.index("by job:") + 1 :]
        assert by_job[0].split() == ["JOB", "NAME", "USAGE"]
        assert [line.split() for line in by_job if tag in line] == [
            [named.id, "train", "0.50", "rank-hours"],
            [unnamed.id, "0.05", "rank-hours"],  # its name is its id: said once
        ]
        assert out[out.index("by notebook:") + 1].split() == [
            "NOTEBOOK",
            "/",
            "LAUNCHER",
            "JOBS",
            "USAGE",
        ]
    finally:
        for job in (unnamed, named):
            registry.forget(job.id)


@pytest.mark.parametrize(
    ("state", "cells", "said"),
    [("SUCCEEDED", 3, "SUCCEEDED, 3 cells run"), ("RUNNING", 2, "RUNNING at cell 2 of 3"),
     ("SUBMITTED", 0, "SUBMITTED")],
)  # fmt: skip
def test_fetch_says_how_far_the_run_got(tmp_path, capsys, state, cells, said):
    import nbformat

    source = tmp_path / "executed.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), source)
    run = make_job(
        f"fetched-{uuid.uuid4().hex[:8]}",
        state=state,
        output=str(source),
        cells=cells,
        cells_total=3,
        nodes=[],
    )
    registry = Registry()
    registry.save(run)
    try:
        assert main(["fetch", run.id, str(tmp_path / "copy.ipynb")]) == 0
        assert capsys.readouterr().out == f"{tmp_path / 'copy.ipynb'}: {said}\n"
    finally:
        registry.save(make_job(run.id, state="CLOSED"))
        registry.forget(run.id)


def test_a_renamed_notebooks_jobs_show_its_new_path(capsys):
    """The server records a kernel's notebook renamed since it started: every reader sees it."""
    tag = uuid.uuid4().hex[:8]
    job = make_job(f"moved-{tag}", kernel_id=f"k-{tag}", notebook="/nb/Untitled.ipynb")
    registry = Registry()
    registry.save(job)
    try:
        registry.notebook_moved(f"k-{tag}", f"/nb/tour-{tag}.ipynb")
        assert registry.job(job.id).notebook == f"/nb/tour-{tag}.ipynb"
        assert main(["list"]) == 0
        (row,) = [line for line in capsys.readouterr().out.splitlines() if tag in line]
        assert row.endswith(f"/nb/tour-{tag}.ipynb")
    finally:
        registry.save(make_job(job.id, state="CLOSED"))
        registry.forget(job.id)
