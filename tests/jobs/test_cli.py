import contextlib
import io
import json
import os
import signal
import subprocess
import sys
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
from tests.support.jobs import make_job
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
