import json
import subprocess
import sys


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
