"""Slurm options and the batch script: every value checked, and the script built from them,
before anything reaches sbatch."""

from __future__ import annotations

import re

import pytest

from jupyter_mn.errors import SpecError
from jupyter_mn.gang.slurm.provision import dry_run, job_environ, output_dir, write_tls
from jupyter_mn.gang.slurm.sbatch import Batch, batch_script, gres, srun_argv
from jupyter_mn.model.flags import cell_parser, spec_from_flags
from jupyter_mn.model.slurmspec import SlurmOptions, from_environ
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.node.slurm import read_tls


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partition": "gpu a"}, "--partition 'gpu a' is not a valid Slurm name"),
        ({"account": "a;b"}, "--account 'a;b' is not a valid Slurm name"),
        ({"qos": "x y"}, "--qos 'x y' is not a valid Slurm name"),
        ({"time": "4 hours"}, "--time '4 hours': expected MINUTES, H:M:S or D-H:M:S"),
        ({"constraint": "a100 ib"}, "--constraint 'a100 ib' is not a valid Slurm name"),
        ({"gres": "tpu:1"}, "--gpu-gres 'tpu:1': choose auto, none, gpu or gpu:TYPE"),
        ({"sbatch_args": ("mem=4G",)}, "expected one sbatch option, e.g. --mem=64G"),
        ({"sbatch_args": ("--nodes=8",)}, "the gang sets --nodes itself"),
        ({"sbatch_args": ("-N8",)}, "the gang sets -N8 itself"),
        ({"sbatch_args": ("--job-name=x",)}, "the gang sets --job-name itself"),
        ({"sbatch_args": ("--export=NONE",)}, "the gang sets --export itself"),
        ({"sbatch_args": ("--expo=NONE",)}, "the gang sets --expo itself"),
        ({"sbatch_args": ("--out=/tmp/x",)}, "the gang sets --out itself"),
        ({"sbatch_args": ("--export-file=/tmp/e",)}, "the gang sets --export-file itself"),
        ({"sbatch_args": ("--job=x",)}, "the gang sets --job itself"),
        ({"sbatch_args": ("--mem=4G\n#SBATCH --nodes=9",)}, "expected one sbatch option"),
        ({"schedule_timeout": 0}, "--schedule-timeout must be positive"),
        ({"orphan_timeout": 1}, "--orphan-timeout must be an integer ≥ 5"),
    ],
)
def test_bad_options_raise_a_short_spec_error(options, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        SlurmOptions(**options)


def test_flags_env_and_config_merge_into_the_slurm_options(monkeypatch):
    monkeypatch.setenv("JUPYTER_MN_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("JUPYTER_MN_SLURM_SBATCH_ARGS", "--mem=64G,--mail-type=END")
    base = ClusterSpec.build({"backend": "slurm", "slurm": {"account": "lab", "qos": "low"}})
    args = cell_parser().parse_args(
        [
            "--nodes=4",
            "--qos=high",
            "--time=4:00:00",
            "--exclusive",
            "--schedule-timeout=30",
            "--sbatch-arg=--reservation=r1",
        ]
    )
    spec = spec_from_flags(args, base)
    assert spec.slurm == SlurmOptions(
        partition="gpu",
        account="lab",
        qos="high",
        time="4:00:00",
        exclusive=True,
        sbatch_args=("--reservation=r1",),
        schedule_timeout=30.0,
    )


def test_a_bad_environment_value_is_named():
    with pytest.raises(SpecError, match="JUPYTER_MN_SLURM_ORPHAN_TIMEOUT='soon' is not a number"):
        from_environ({"JUPYTER_MN_SLURM_ORPHAN_TIMEOUT": "soon"})


@pytest.mark.parametrize(
    ("choice", "has_gpus", "expected"),
    [
        ("auto", True, "gpu:8"),
        ("auto", False, ""),
        ("none", True, ""),
        ("gpu", False, "gpu:8"),
        ("gpu:a100", False, "gpu:a100:8"),
    ],
)
def test_gpus_are_asked_as_gres_only_where_the_cluster_has_them(choice, has_gpus, expected):
    spec = ClusterSpec(nodes=2, gpus=8, backend="slurm", slurm=SlurmOptions(gres=choice))
    assert gres(spec, has_gpus) == expected


def test_the_batch_script_is_one_task_per_node_running_the_node_entrypoint():
    options = SlurmOptions(
        partition="gpu", time="1:00:00", exclusive=True, sbatch_args=("--mem=0",)
    )
    spec = ClusterSpec(nodes=4, gpus=8, backend="slurm", slurm=options, grace=295.5)
    batch = Batch("jmn-1234abcd", "/opt/py/bin/python", 23456, "/home/u/out/%x-%j.out", "gpu:8")
    script = batch_script(spec, batch)
    sbatch = [line.removeprefix("#SBATCH ") for line in script.splitlines() if "#SBATCH" in line]
    assert sbatch == [
        "--job-name=jmn-1234abcd",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--output=/home/u/out/%x-%j.out",
        "--signal=TERM@306",  # the grace period, rounded up, and 10 s for the nodes to stop
        "--gres=gpu:8",
        "--partition=gpu",
        "--time=1:00:00",
        "--exclusive",
        "--mem=0",
    ]
    assert "export JUPYTER_MN_DASK_PORT=23456" in script
    assert "TLS" not in script.replace("TLS dask", "")  # the certificate is never in the script
    assert script.splitlines()[-1] == (
        "exec srun --nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=1 "
        "/opt/py/bin/python -m jupyter_mn.node.slurm"
    )


def test_a_step_inside_an_allocation_names_its_nodes_and_overlaps_the_kernels_step():
    assert srun_argv("python", 2, "n1,n2")[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--nodelist=n1,n2",
        "--overlap",
    ]


def test_dry_run_without_a_reachable_slurm_asks_gpus_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))
    script = dry_run(ClusterSpec(nodes=2, gpus=4, backend="slurm"))
    assert "# sinfo did not answer" in script
    assert "#SBATCH --gres=gpu:4" in script


def test_an_unknown_config_option_is_named():
    with pytest.raises(SpecError, match="unknown Slurm option\\(s\\): partion"):
        SlurmOptions.from_mapping({"partion": "gpu"})


def test_the_job_gets_an_allowlist_of_the_kernels_environment_and_the_key_in_files(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    kept = {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/opt/cuda/lib64",
        "CUDA_HOME": "/opt/cuda",
        "NCCL_IB_HCA": "mlx5",
        "MODULEPATH": "/etc/modulefiles",
        "LMOD_CMD": "/usr/share/lmod/lmod",
        "CONDA_PREFIX": "/opt/conda/envs/ml",
        "VIRTUAL_ENV": "/home/me/.venv",
        "PYTHONPATH": "/home/me/lib",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "LC_ALL": "C.UTF-8",
    }
    environ = {
        **kept,
        "JUPYTERHUB_API_TOKEN": "abc",
        "AWS_SECRET_ACCESS_KEY": "xyz",
        "DATABASE_URL": "postgres://me:pw@db/x",
        "MYSQL_PWD": "hunter2",  # a credential's name no filter foresaw
        "WANDB_ENTITY": "team",  # nothing secret, but not the job's business
        "CUDA_TOKEN": "abc",  # an allowed prefix does not let a credential through
        "NCCL_DEBUG_FILE": "ya29." + "a0AfH6SMB" * 3,
    }
    assert job_environ(environ) == kept
    folder = write_tls("jmn-1234abcd", ("CA", "CERT", "-----BEGIN PRIVATE KEY-----"))
    assert folder.parent == output_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert [(f.name, f.stat().st_mode & 0o777) for f in sorted(folder.iterdir())] == [
        ("ca.crt", 0o600),
        ("tls.crt", 0o600),
        ("tls.key", 0o600),
    ]
    assert read_tls(str(folder)) == ("CA", "CERT", "-----BEGIN PRIVATE KEY-----")
    with pytest.raises(SystemExit, match="must be on a file system the nodes share"):
        read_tls(str(tmp_path / "elsewhere"))
