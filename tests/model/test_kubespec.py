"""Kubernetes options: every value checked before anything reaches a cluster."""

from __future__ import annotations

import argparse

import pytest

from jupyter_mn.errors import SpecError
from jupyter_mn.model import kubespec
from jupyter_mn.model.kubespec import KubeOptions, Volume, parse_toleration
from jupyter_mn.model.spec import ClusterSpec


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gang": "slurm"}, "--gang 'slurm': choose one of auto, kueue"),
        ({"image": "has space"}, "--image 'has space' is not an image reference"),
        ({"namespace": "Team_A"}, "--namespace 'Team_A' is not a valid Kubernetes name"),
        ({"cpu": "lots"}, "--cpu 'lots' is not a quantity"),
        ({"memory": "12 GB"}, "--memory '12 GB' is not a quantity"),
        ({"shm_size": ""}, "--shm-size '' is not a quantity"),
        ({"node_selector": (("bad key!", "x"),)}, "--node-selector bad key!=x: not a valid label"),
        ({"tolerations": ("gpu:Never",)}, "effect must be one of NoSchedule"),
        ({"tolerations": ("=x:NoSchedule",)}, "expected KEY[=VALUE][:EFFECT]"),
        ({"volumes": ("data",)}, "expected CLAIM:/mount/path[:ro]"),
        ({"volumes": ("data:relative",)}, "mount path must be absolute"),
        ({"volumes": ("data:/dev/shm",)}, "outside /dev/shm, /etc/jupyter-mn"),
        ({"volumes": ("a:/x", "b:/x")}, "two volumes mount at the same path"),
        ({"volumes": ("Data:/x",)}, "'Data' is not a valid claim name"),
        ({"rdma_networks": "net a"}, "comma-separated NAD names"),
        ({"gpu_resource": "nvidia.com/"}, "--gpu-resource 'nvidia.com/' is not a valid"),
        ({"schedule_timeout": 0}, "--schedule-timeout must be positive"),
        ({"lifetime": 10}, "--lifetime must be an integer ≥ 60"),
        ({"dask_port": 80}, "--dask-port must be an integer ≥ 1024"),
        ({"dask_port": 65535}, "--dask-port must be ≤ 65534"),
    ],
)
def test_bad_options_raise_a_short_spec_error(options, message):
    with pytest.raises(SpecError) as info:
        KubeOptions(**options)
    assert message in str(info.value) and len(str(info.value)) < 120


def test_kubernetes_backend_needs_an_image():
    with pytest.raises(SpecError, match="backend 'kubernetes' needs --image"):
        ClusterSpec(backend="kubernetes")
    assert ClusterSpec(backend="kubernetes", kubernetes=KubeOptions(image="a:1")).kubernetes.image


def test_parsers():
    assert parse_toleration("k=v:NoExecute") == {
        "key": "k",
        "operator": "Equal",
        "value": "v",
        "effect": "NoExecute",
    }
    assert parse_toleration("nvidia.com/gpu") == {"key": "nvidia.com/gpu", "operator": "Exists"}
    assert Volume.parse("ckpt:/ckpt:ro") == Volume("ckpt", "/ckpt", True)


def test_layers_environment_then_config_then_flags(monkeypatch):
    monkeypatch.setenv("JUPYTER_MN_K8S_IMAGE", "env/agent:1")
    monkeypatch.setenv("JUPYTER_MN_K8S_NAMESPACE", "from-env")
    monkeypatch.setenv("JUPYTER_MN_K8S_NODE_SELECTOR", "pool=a100,zone=b")
    monkeypatch.setenv("JUPYTER_MN_K8S_TOLERATIONS", "gpu:NoSchedule,spot")
    monkeypatch.setenv("JUPYTER_MN_K8S_SCHEDULE_TIMEOUT", "90")
    monkeypatch.setenv("JUPYTER_MN_RDMA", "1")
    spec = ClusterSpec.build(
        {"kubernetes": {"namespace": "from-config"}}, {"backend": "kubernetes"}
    )
    opts = spec.kubernetes
    assert (opts.image, opts.namespace, opts.schedule_timeout, spec.rdma) == (
        "env/agent:1",
        "from-config",
        90.0,
        True,
    )
    assert opts.node_selector == (("pool", "a100"), ("zone", "b"))
    assert opts.tolerations == ("gpu:NoSchedule", "spot")


def test_bad_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("JUPYTER_MN_K8S_LIFETIME", "soon")
    with pytest.raises(SpecError, match="JUPYTER_MN_K8S_LIFETIME='soon' is not a number"):
        ClusterSpec.build()


def test_unknown_config_option_is_named():
    with pytest.raises(SpecError, match="unknown Kubernetes option\\(s\\): imgae"):
        ClusterSpec.build({"kubernetes": {"imgae": "x"}})


def test_flags_give_only_what_was_given():
    parser = kubespec.add_flags(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            "--image",
            "a:1",
            "--node-selector",
            "k=v",
            "--toleration",
            "t",
            "--volume",
            "d:/d",
            "--lifetime",
            "600",
        ]
    )
    assert kubespec.from_args(args) == {
        "image": "a:1",
        "node_selector": (("k", "v"),),
        "tolerations": ("t",),
        "volumes": ("d:/d",),
        "lifetime": 600,
    }
    with pytest.raises(SpecError, match="--node-selector 'kv': expected KEY=VALUE"):
        kubespec.from_args(parser.parse_args(["--node-selector", "kv"]))


def test_kubernetes_options_decide_the_gang():
    a = ClusterSpec(backend="kubernetes", kubernetes=KubeOptions(image="a:1"))
    assert a.gang_key() != a.replace(kubernetes=a.kubernetes.replace(image="a:2")).gang_key()
    assert a.gang_key() != a.replace(rdma=True).gang_key()
    assert a.gang_key() == a.replace(timeout=5).gang_key()
