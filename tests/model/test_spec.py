import pytest

from jupyter_mn.errors import SpecError
from jupyter_mn.model.flags import cell_parser, spec_from_flags
from jupyter_mn.model.spec import ClusterSpec, from_environ, parse_env_pairs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, "nodes must be ≥ 1, got 0"),
        ({"gpus": -1}, "gpus must be ≥ 1, got -1"),
        ({"nodes": "2"}, "nodes must be an integer"),
        ({"nodes": True}, "nodes must be an integer"),
        ({"backend": "pbs"}, "unknown backend 'pbs'"),
        ({"backend": "dask"}, "needs --scheduler"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"retries": -1}, "retries must be ≥ 0"),
        ({"name": "  "}, "name '  ' is empty"),
        ({"name": "a\tb"}, "contains control characters"),
        ({"name": "x" * 129}, "longer than 128 characters"),
        ({"env": (("1BAD", "x"),)}, "not a valid environment variable name"),
        ({"nodes": 1000, "gpus": 1000}, "exceeds"),
        ({"max_runtime": -5}, "max_runtime must be a positive number"),
        ({"grace": 0}, "grace must be a positive number"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout must be a positive number"),
        ({"memory_limit": "lots"}, "memory_limit 'lots' is not a size"),
        ({"memory_limit": 0}, "memory_limit must be ≥ 1"),
        ({"view": "html"}, "unknown view 'html'"),
        ({"rdma": "yes"}, "rdma must be true or false"),
        ({"nodes": 2, "gpus": 2, "ranks": "0,4"}, "--ranks 4: a 2×2 gang has ranks 0–3"),
        ({"ranks": "0,x"}, "--ranks '0,x': expected rank numbers, e.g. 0,3"),
        ({"ranks": (-1,)}, "ranks must be ≥ 0, got -1"),
        ({"timeout": float("nan")}, "timeout must be a positive number"),
        ({"hang_timeout": -1}, "hang_timeout must be 0 .off. or a positive number of seconds"),
        ({"hang_timeout": float("inf")}, "hang_timeout must be 0 .off. or a positive number"),
        ({"idle_timeout": float("inf")}, "idle_timeout must be a positive number"),
        ({"min_disk_gb": float("nan")}, "min_disk_gb must be a number of GiB"),
        ({"memory_limit": "1e400"}, "memory_limit '1e400' is not a size"),
        ({"name": "train\n"}, "name 'train.n' contains control characters"),
        ({"backend": "dask", "scheduler": "tcp://h:1\n"}, "expected PROTOCOL://HOST:PORT"),
        ({"env": (("A", "x\0"),)}, "cannot hold a NUL"),
        ({"kubernetes": {"namespace": "ns\n"}}, "--namespace 'ns.n' is not a valid"),
        ({"kubernetes": {"schedule_timeout": float("nan")}}, "--schedule-timeout must be"),
        ({"workdir_limit": "lots"}, "workdir_limit 'lots' is not a size"),
        ({"workdir_limit": -1}, "workdir_limit must be ≥ 0"),
        ({"workdir": " "}, "--workdir needs a directory"),
        ({"max_value": "2 apples"}, "max_value '2 apples' is not a size"),
        ({"max_value": 0}, "max_value must be ≥ 1"),
        ({"send_workdir": "no"}, "send_workdir must be true or false"),
    ],
)
def test_bad_values_raise_a_short_spec_error(kwargs, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")) as info:
        ClusterSpec.build(kwargs)
    assert len(str(info.value)) < 120


def test_layers_environment_then_config_then_flags(monkeypatch):
    monkeypatch.setenv("JUPYTER_MN_NODES", "3")
    monkeypatch.setenv("JUPYTER_MN_GPUS", "2")
    monkeypatch.setenv("JUPYTER_MN_ENV", "A=1,B=x=y")
    spec = ClusterSpec.build({"gpus": 4, "nodes": None}, {"timeout": 9.5})
    assert (spec.nodes, spec.gpus, spec.timeout) == (3, 4, 9.5)
    assert dict(spec.env) == {"A": "1", "B": "x=y"}


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("JUPYTER_MN_NODES", "two")
    with pytest.raises(SpecError, match="JUPYTER_MN_NODES='two' is not a number"):
        ClusterSpec.build()


def test_gang_key_ignores_per_cell_settings():
    a = ClusterSpec(nodes=2, gpus=2, timeout=5, seed=1)
    assert a.gang_key() == ClusterSpec(nodes=2, gpus=2, retries=3).gang_key()
    assert a.gang_key() != ClusterSpec(nodes=2, gpus=1).gang_key()
    assert a.gang_key() != a.replace(env={"X": "1"}).gang_key()
    assert (a.world_size, a.shape) == (4, "2×2")


def test_env_pairs_need_an_equals_sign():
    assert parse_env_pairs(["A=1"]) == (("A", "1"),)
    with pytest.raises(SpecError, match="expected KEY=VALUE"):
        parse_env_pairs(["A"])


def test_from_environ_ignores_unrelated_and_empty():
    assert from_environ({"JUPYTER_MN_NODES": "", "NODES": "3", "JUPYTER_MN_BACKEND": "dask"}) == {
        "backend": "dask"
    }


def test_memory_limit_takes_sizes_from_flags_and_environment(monkeypatch):
    assert ClusterSpec.build({"memory_limit": "512MiB"}).memory_limit == 512 * 2**20
    monkeypatch.setenv("JUPYTER_MN_MEMORY_LIMIT", "2GB")
    spec = ClusterSpec.build()
    assert spec.memory_limit == 2_000_000_000
    assert spec.gang_key() != spec.replace(memory_limit="3GB").gang_key()


def test_rdma_flags_shape_the_gang_and_require_implies_rdma(monkeypatch):
    strict = ClusterSpec(require_rdma=True)
    assert strict.rdma and strict.gang_key() != ClusterSpec().gang_key()
    assert ClusterSpec(debug=True).gang_key() != ClusterSpec().gang_key()
    assert ClusterSpec(view="text").gang_key() == ClusterSpec().gang_key()  # display only
    monkeypatch.setenv("JUPYTER_MN_RDMA", "true")
    monkeypatch.setenv("JUPYTER_MN_VIEW", "text")
    assert (ClusterSpec.build().rdma, ClusterSpec.build().view) == (True, "text")
    monkeypatch.setenv("JUPYTER_MN_DEBUG", "maybe")
    with pytest.raises(SpecError, match="JUPYTER_MN_DEBUG='maybe' is not a boolean"):
        ClusterSpec.build()


def test_dask_and_preflight_fields_are_checked_and_read_from_the_environment():
    with pytest.raises(SpecError, match="expected PROTOCOL://HOST:PORT"):
        ClusterSpec(backend="dask", scheduler="10.0.0.5")
    assert ClusterSpec(backend="dask", scheduler="tls://[::1]:8786").scheduler == "tls://[::1]:8786"
    with pytest.raises(SpecError, match="min_shm_gb must be a number of GiB ≥ 0"):
        ClusterSpec(min_shm_gb=-1)
    with pytest.raises(SpecError, match="--check-path needs a path"):
        ClusterSpec(check_paths=("",))
    env = {"JUPYTER_MN_PREFLIGHT": "0", "JUPYTER_MN_CHECK_PATHS": "/data:/ckpt"}
    spec = ClusterSpec.build(from_environ(env))
    assert spec.preflight is False and spec.check_paths == ("/data", "/ckpt")
    with pytest.raises(SpecError, match="JUPYTER_MN_SAME_HOST='maybe'"):
        from_environ({"JUPYTER_MN_SAME_HOST": "maybe"})
    # preflight by default on remote nodes; locally only when a check was asked for
    assert ClusterSpec(backend="dask", scheduler="tls://h:1").runs_preflight
    assert not ClusterSpec().runs_preflight
    assert ClusterSpec(check_paths=("/data",)).runs_preflight


def test_ranks_to_show_come_from_flags_and_the_environment(monkeypatch):
    assert ClusterSpec.build({"nodes": 2, "gpus": 2, "ranks": "0, 3"}).ranks == (0, 3)
    monkeypatch.setenv("JUPYTER_MN_RANKS", "1")
    assert ClusterSpec.build({"nodes": 2}).ranks == (1,)
    assert ClusterSpec.build({"nodes": 2}).gang_key() == ClusterSpec(nodes=2).gang_key()


def test_what_of_the_notebooks_directory_travels_comes_from_flags_and_the_environment(
    monkeypatch,
):
    flags = "--workdir src --workdir-exclude data/,*.ckpt --workdir-exclude logs/"
    args = cell_parser().parse_args([*flags.split(), "--workdir-limit", "20MiB"])
    spec = spec_from_flags(args, ClusterSpec())
    assert (spec.workdir, spec.workdir_exclude) == ("src", ("data/", "*.ckpt", "logs/"))
    assert spec.workdir_limit == 20 << 20 and spec.send_workdir
    assert spec.gang_key() != ClusterSpec().gang_key()  # the ranks run elsewhere: a new gang
    assert spec.replace(workdir=None, workdir_limit=1).gang_key() == ClusterSpec().gang_key()
    off = spec_from_flags(cell_parser().parse_args(["--no-workdir"]), ClusterSpec())
    assert not off.send_workdir
    monkeypatch.setenv("JUPYTER_MN_WORKDIR_EXCLUDE", "a,b/")
    monkeypatch.setenv("JUPYTER_MN_WORKDIR_LIMIT", "1GB")
    monkeypatch.setenv("JUPYTER_MN_SEND_WORKDIR", "0")
    spec = ClusterSpec.build({})
    assert (spec.workdir_exclude, spec.workdir_limit) == (("a", "b/"), 10**9)
    assert not spec.send_workdir


def test_max_value_is_a_size_from_the_flag_or_the_environment_and_keeps_the_gang(monkeypatch):
    assert ClusterSpec().max_value == 4 << 30
    spec = spec_from_flags(cell_parser().parse_args(["--max-value", "512MiB"]), ClusterSpec())
    assert spec.max_value == 512 << 20
    assert spec.gang_key() == ClusterSpec().gang_key()  # a cell's limit: the warm gang serves
    monkeypatch.setenv("JUPYTER_MN_MAX_VALUE", "2GiB")
    assert ClusterSpec.build({}).max_value == 2 << 30


def test_env_values_are_masked_where_the_spec_is_shown():
    token = "hf_" + "Qw3" * 12
    spec = ClusterSpec.build({"env": {"HF_TOKEN": token, "OMP_NUM_THREADS": "4"}})
    assert spec.env == (("HF_TOKEN", token), ("OMP_NUM_THREADS", "4"))  # the ranks get them
    assert token not in repr(spec) and "('HF_TOKEN', '***')" in repr(spec)
    assert "local_limit=512" in repr(spec)  # every other field as the dataclass shows it
