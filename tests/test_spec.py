import pytest

from jupyter_mn.errors import SpecError
from jupyter_mn.spec import ClusterSpec, from_environ, parse_env_pairs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, "nodes must be ≥ 1, got 0"),
        ({"gpus": -1}, "gpus must be ≥ 1, got -1"),
        ({"nodes": "2"}, "nodes must be an integer"),
        ({"nodes": True}, "nodes must be an integer"),
        ({"backend": "slurm"}, "unknown backend 'slurm'"),
        ({"backend": "dask"}, "needs --scheduler"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"retries": -1}, "retries must be ≥ 0"),
        ({"name": "Bad_Name"}, "name 'Bad_Name'"),
        ({"env": (("1BAD", "x"),)}, "not a valid environment variable name"),
        ({"nodes": 1000, "gpus": 1000}, "exceeds"),
        ({"view": "html"}, "unknown view 'html'"),
        ({"rdma": "yes"}, "rdma must be true or false"),
    ],
)
def test_bad_values_raise_a_short_spec_error(kwargs, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")) as info:
        ClusterSpec(**kwargs)
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
