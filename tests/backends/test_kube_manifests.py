"""Every manifest set the builders emit, validated like the API server would (per version).

Built-in kinds go through ``kubernetes-validate --strict`` for each Kubernetes minor 1.28–1.37
where the kind exists; custom kinds through the small schemas in ``kube/schemas.py``; names
through the DNS rules kubernetes-validate does not check.
"""

from __future__ import annotations

import base64
import re

import jsonschema
import pytest

from jupyter_mn.errors import SpecError
from jupyter_mn.gang.kubernetes import gangs
from jupyter_mn.gang.kubernetes.gangs import LATEST_MINOR, MIN_MINOR, Target
from jupyter_mn.gang.kubernetes.manifests import (
    AGENT_UID,
    COMPLETION_INDEX,
    GANG_LABEL,
    NAME_KEY,
    Names,
    build,
    selector,
)
from jupyter_mn.model.gangids import gang_id
from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from tests.support.driverjob import driver_job
from tests.support.kube.podsecurity import violations
from tests.support.kube.schemas import KUEUE_JOB, validate

MINORS = range(MIN_MINOR, LATEST_MINOR + 1)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
GANG = "jmn-5f3a9c2e"
FULL = KubeOptions(
    image="registry.example/jupyter-mn-agent:1.0",
    namespace="research",
    queue="team-a",
    service_account="trainer",
    node_selector=(("nvidia.com/gpu.product", "H100-SXM"),),
    tolerations=("nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute", "spot"),
    priority_class="high",
    volumes=("datasets:/data:ro", "checkpoints:/ckpt"),
    cpu="96",
    memory="900Gi",
    rdma_networks="rdma-net-0,rdma-net-1",
    shm_size="64Gi",
)


def spec_for(nodes: int, rdma: bool, **options: object) -> ClusterSpec:
    opts = FULL.replace(**options) if rdma else KubeOptions(image="agent:1", **options)
    env = (("NCCL_DEBUG", "WARN"),) if rdma else ()
    return ClusterSpec(
        nodes=nodes, gpus=8, backend="kubernetes", rdma=rdma, env=env, kubernetes=opts
    )


def job_of(objects: list[dict]) -> dict:
    return next(o for o in objects if o["kind"] == "Job")


def pod_of(objects: list[dict]) -> dict:
    return job_of(objects)["spec"]["template"]


@pytest.mark.parametrize("nodes", [1, 4])
@pytest.mark.parametrize("rdma", [False, True])
@pytest.mark.parametrize("policy", gangs.POLICIES)
def test_every_manifest_set_validates_for_every_version(policy, rdma, nodes):
    spec = spec_for(nodes, rdma, queue="team-a")
    checked = 0
    for minor in MINORS:
        target = Target(minor, policy, "research")
        if policy == "native" and minor < gangs.NATIVE_MIN_MINOR:
            with pytest.raises(SpecError, match=r"needs Kubernetes 1\.35 or newer"):
                build(spec, GANG, target)
            continue
        tls = {"ca.crt": "CA", "tls.crt": "CERT", "tls.key": "KEY"}
        objects = build(spec, GANG, target, tls=tls, owner="host pid 1")
        for obj in objects:
            validate(obj, minor)
            assert DNS_LABEL.match(obj["metadata"]["name"]), obj["metadata"]["name"]
            assert obj["metadata"]["labels"][GANG_LABEL] == GANG
            checked += 1
        if policy == "kueue":
            jsonschema.validate(job_of(objects), KUEUE_JOB)
    assert checked >= 4 * 3  # at least three minors for every policy


@pytest.mark.parametrize("name", [None, "My_Sweep_03", "2024 run", "x" * 128, "ünïcødé ☃"])
def test_any_name_makes_objects_within_dns_limits_and_keeps_the_name(name):
    """The gang id (from the user's name) names the objects; the name itself rides along."""
    gang = gang_id(name)
    names = Names.of(gang)
    assert DNS_LABEL.match(names.service) and len(names.service) <= 63
    pod_name = f"{names.job}-{65535}-abcde"  # the Job controller's pod names
    assert len(pod_name) <= 63 and len(names.host(65535).split(".")[0]) <= 63
    spec = spec_for(2, rdma=False).replace(name=name)
    objects = build(spec, gang, Target())
    for obj in objects:
        validate(obj, LATEST_MINOR)
        assert DNS_LABEL.match(obj["metadata"]["name"]), obj["metadata"]["name"]
    job, pod = job_of(objects), pod_of(objects)
    if name is None:
        assert NAME_KEY not in job["metadata"].get("annotations", {})
        return
    assert job["metadata"]["annotations"][NAME_KEY] == name
    assert pod["metadata"]["annotations"][NAME_KEY] == name
    label = job["metadata"]["labels"].get(NAME_KEY)
    assert label == pod["metadata"]["labels"].get(NAME_KEY)
    assert label is None or (len(label) <= 63 and LABEL_VALUE.match(label)), label


def test_ids_not_made_by_gang_id_are_refused():
    with pytest.raises(SpecError, match="at most 44 characters"):
        Names.of("a" * 45)
    with pytest.raises(SpecError, match="not a DNS label"):
        Names.of("My_Sweep")


def test_job_shape_is_one_pod_per_node_all_or_nothing():
    objects = build(spec_for(4, rdma=False), GANG, Target())
    job = job_of(objects)["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (4, 4, "Indexed")
    assert job["suspend"] is True and job["backoffLimit"] == 0
    assert job["activeDeadlineSeconds"] == 12 * 3600 and job["ttlSecondsAfterFinished"] > 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == GANG
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "jupyter_mn.node.pod"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e for e in container["env"]}
    assert COMPLETION_INDEX in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["JUPYTER_MN_SCHEDULER"]["value"] == f"tls://{GANG}-0.{GANG}:8786"
    assert not any(name.startswith("NCCL_") for name in env)
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    service = next(o for o in objects if o["kind"] == "Service")["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert service["selector"].items() <= job["template"]["metadata"]["labels"].items()
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == {GANG_LABEL: GANG}
    assert policy["ingress"][0]["from"][0]["podSelector"] == policy["podSelector"]
    assert selector(GANG) == f"app.kubernetes.io/managed-by=jupyter-mn,{GANG_LABEL}={GANG}"


def test_rdma_and_every_option_reach_the_pod():
    pod = pod_of(build(spec_for(2, rdma=True), GANG, Target(namespace="research")))
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net-0,rdma-net-1"
    container = spec["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert spec["securityContext"]["runAsUser"] == 0  # only root holds an added capability
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert limits["rdma/rdma_shared_device_a"] == requests["rdma/rdma_shared_device_a"] == "1"
    assert (requests["cpu"], requests["memory"], limits["memory"]) == ("96", "900Gi", "900Gi")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and "NCCL_DEBUG" in env  # --env: a Secret's key
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": "64Gi"}
    claims = [v["persistentVolumeClaim"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [
        {"claimName": "datasets", "readOnly": True},
        {"claimName": "checkpoints", "readOnly": False},
    ]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True and "/dev/shm" in mounts
    assert spec["serviceAccountName"] == "trainer" and spec["automountServiceAccountToken"]
    assert spec["priorityClassName"] == "high"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "H100-SXM"}
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
        {"key": "spot", "operator": "Exists"},
    ]


@pytest.mark.parametrize(("grace", "seconds"), [(None, 130), (0.5, 11), (600, 610)])
def test_pods_are_given_the_grace_period_and_the_nodes_stop_before_it_ends(grace, seconds):
    spec = spec_for(2, rdma=False).replace(grace=grace) if grace else spec_for(2, rdma=False)
    objects = build(spec, GANG, Target())
    assert pod_of(objects)["spec"]["terminationGracePeriodSeconds"] == seconds
    validate(job_of(objects), LATEST_MINOR)


def test_cpu_pods_and_custom_resource_names():
    spec = spec_for(2, rdma=True, gpu_resource="", rdma_resource="nvidia.com/hostdev")
    container = pod_of(build(spec, GANG, Target()))["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert container["resources"]["limits"]["nvidia.com/hostdev"] == "1"


@pytest.mark.parametrize(
    ("policy", "check"),
    [
        (
            "kueue",
            lambda objs, pod: (
                job_of(objs)["metadata"]["labels"][gangs.KUEUE_QUEUE_LABEL] == "team-a"
            ),
        ),
        (
            "volcano",
            lambda objs, pod: (
                pod["metadata"]["annotations"][gangs.VOLCANO_GROUP_ANNOTATION] == GANG
                and pod["spec"]["schedulerName"] == "volcano"
                and objs[-1]["spec"]
                == {"minMember": 4, "minResources": {"nvidia.com/gpu": "32"}, "queue": "team-a"}
            ),
        ),
        (
            "coscheduling",
            lambda objs, pod: (
                pod["metadata"]["labels"][gangs.COSCHEDULING_LABEL] == GANG
                and pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
                and objs[-1]["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 600}
            ),
        ),
        ("none", lambda objs, pod: len(objs) == 4 and "schedulerName" not in pod["spec"]),
    ],
)
def test_each_policy_marks_the_pods_for_its_scheduler(policy, check):
    objects = build(spec_for(4, rdma=False, queue="team-a"), GANG, Target(policy=policy))
    assert check(objects, pod_of(objects))


@pytest.mark.parametrize(
    ("minor", "api", "pod_field", "kinds"),
    [
        (35, "v1alpha1", {"workloadRef": {"name": GANG, "podGroup": "ranks"}}, ["Workload"]),
        (36, "v1alpha2", {"schedulingGroup": {"podGroupName": GANG}}, ["Workload", "PodGroup"]),
        (37, "v1beta1", {"schedulingGroup": {"podGroupName": GANG}}, ["Workload", "PodGroup"]),
    ],
)
def test_native_gang_follows_the_api_of_each_release(minor, api, pod_field, kinds):
    objects = build(spec_for(4, rdma=False), GANG, Target(minor, "native"))
    extra = objects[4:]
    assert [o["kind"] for o in extra] == kinds
    assert {o["apiVersion"] for o in extra} == {f"scheduling.k8s.io/{api}"}
    assert pod_field.items() <= pod_of(objects)["spec"].items()
    gang = extra[-1]["spec"].get("schedulingPolicy") or extra[0]["spec"]["podGroups"][0]["policy"]
    assert gang == {"gang": {"minCount": 4}}


def test_secret_carries_the_certificates_and_dry_runs_never_show_keys():
    tls = {"ca.crt": "CA PEM", "tls.crt": "CERT PEM", "tls.key": "KEY PEM"}
    secret = build(spec_for(1, rdma=False), GANG, Target(), tls=tls)[2]
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["tls.key"]).decode() == "KEY PEM"
    dry = build(spec_for(1, rdma=False), GANG, Target())[2]
    assert "data" not in dry and set(dry["stringData"]) == set(tls)
    assert "PEM" not in str(dry)


def test_env_values_reach_the_pods_through_a_secret_and_never_show_in_the_job():
    token = "hf_" + "Zq7" * 12
    spec = spec_for(2, rdma=False).replace(env={"HF_TOKEN": token, "NCCL_DEBUG": "WARN"})
    tls = {"ca.crt": "CA", "tls.crt": "CERT", "tls.key": "KEY"}
    for minor in (MIN_MINOR, LATEST_MINOR):
        objects = build(spec, GANG, Target(minor), tls=tls)
        for obj in objects:
            validate(obj, minor)
        secret = objects[-1]
        assert (secret["kind"], secret["metadata"]["name"]) == ("Secret", f"{GANG}-env")
        assert base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == token
        assert token not in str(job_of(objects))
        env = {e["name"]: e for e in pod_of(objects)["spec"]["containers"][0]["env"]}
        assert env["HF_TOKEN"]["valueFrom"] == {
            "secretKeyRef": {"name": f"{GANG}-env", "key": "HF_TOKEN"}
        }
    dry = build(spec, GANG, Target())
    assert token not in str(dry) and set(dry[-1]["stringData"]) == {"HF_TOKEN", "NCCL_DEBUG"}
    assert [o["kind"] for o in build(spec_for(1, rdma=False), GANG, Target())].count("Secret") == 1


def test_env_may_not_override_what_the_pods_are_told_by_jupyter_mn():
    for name in ("NODE_RANK", "NNODES", "JUPYTER_MN_SCHEDULER", "JUPYTER_MN_ANYTHING"):
        spec = spec_for(2, rdma=False).replace(env={name: "0"})
        with pytest.raises(SpecError, match=f"--env {name}: set by jupyter_mn in every pod"):
            build(spec, GANG, Target())
    rdma = spec_for(2, rdma=True).replace(env={"NCCL_SOCKET_IFNAME": "ib0"})
    assert build(rdma, GANG, Target())  # NCCL's settings stay the user's to choose


def test_owner_annotation_and_kernel_pod_owner():
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "jupyter-alice", "uid": "u-1"}
    job = job_of(build(spec_for(1, rdma=False), GANG, Target(), owner="nb pid 7", job_owner=owner))
    assert job["metadata"]["annotations"]["jupyter-mn.io/owner"] == "nb pid 7"
    assert job["metadata"]["ownerReferences"] == [owner]
    validate(job, LATEST_MINOR)


def test_targets_refuse_old_servers_and_unknown_policies():
    with pytest.raises(SpecError, match=r"1\.27 is too old"):
        Target(minor=27)
    with pytest.raises(SpecError, match="gang policy 'slurm'"):
        Target(policy="slurm")
    with pytest.raises(SpecError, match="--gang kueue needs --queue"):
        build(spec_for(2, rdma=False), GANG, Target(policy="kueue"))


def test_the_validators_do_reject_bad_objects():
    """Guards the checks above: unknown fields and per-version drift are caught."""
    job = job_of(build(spec_for(1, rdma=False), GANG, Target()))
    with pytest.raises(jsonschema.ValidationError):
        validate({**job, "spec": {**job["spec"], "backoffLimits": 0}}, LATEST_MINOR)
    rule = {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}
    drifted = {**job, "spec": {**job["spec"], "podFailurePolicy": {"rules": [rule]}}}
    validate(drifted, 37)  # 1.37 made the condition status optional; 1.30 requires it
    with pytest.raises(jsonschema.ValidationError, match="status"):
        validate(drifted, 30)
    group = build(spec_for(2, rdma=False), GANG, Target(policy="volcano"))[-1]
    with pytest.raises(jsonschema.ValidationError, match="minMembers"):
        validate({**group, "spec": {"minMembers": 2}}, LATEST_MINOR)


@pytest.mark.parametrize("policy", gangs.POLICIES)
@pytest.mark.parametrize("rdma", [False, True])
def test_pods_pass_restricted_pod_security_and_rdma_pods_baseline_plus_ipc_lock(policy, rdma):
    spec = spec_for(2, rdma, queue="team-a", volumes=("datasets:/data:ro",))
    pod = pod_of(build(spec, GANG, Target(LATEST_MINOR, policy)))
    if not rdma:
        assert violations(pod, "restricted") == []
        assert pod["spec"]["securityContext"]["runAsUser"] == AGENT_UID
        return
    assert violations(pod, "baseline", allow_capabilities=("IPC_LOCK",)) == []
    assert violations(pod, "baseline") == [  # IPC_LOCK is the one exemption it needs
        "capabilities: containers[agent].securityContext.capabilities.add has ['IPC_LOCK']"
    ]


def test_a_detached_runs_driver_pod_passes_restricted_pod_security(tmp_path):
    pod = driver_job(tmp_path, "default")["spec"]["template"]
    assert violations(pod, "restricted") == []
    assert pod["spec"]["securityContext"]["runAsUser"] == AGENT_UID


def test_the_pod_security_checker_rejects_what_the_standards_forbid():
    """Guards the check above: a default pod is baseline, not restricted; a bad one is neither."""
    default = {"spec": {"containers": [{"name": "c", "image": "x"}]}}
    assert violations(default, "baseline") == []
    assert [v.split(":")[0] for v in violations(default, "restricted")] == [
        "privilege escalation",
        "running as non-root",
        "seccomp",
        "capabilities",
    ]
    bad = {
        "metadata": {
            "annotations": {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}
        },
        "spec": {
            "hostNetwork": True,
            "securityContext": {
                "runAsUser": 0,
                "runAsNonRoot": True,
                "seccompProfile": {"type": "Unconfined"},
                "sysctls": [{"name": "kernel.msgmax", "value": "1"}],
            },
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "ports": [{"containerPort": 80, "hostPort": 80}],
                    "securityContext": {
                        "privileged": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
                    },
                }
            ],
            "volumes": [
                {"name": "root", "hostPath": {"path": "/"}},
                {"name": "share", "nfs": {"server": "nfs", "path": "/"}},
            ],
        },
    }
    controls = {v.split(":")[0] for v in violations(bad, "baseline")}
    assert controls == {
        "host namespaces",
        "privileged",
        "seccomp",
        "capabilities",
        "sysctls",
        "HostPath volumes",
        "host ports",
        "AppArmor",
    }
    restricted = {v.split(":")[0] for v in violations(bad, "restricted")}
    assert restricted - controls == {"volume types", "running as non-root user"}


def test_the_agent_image_runs_as_the_pods_user():
    from pathlib import Path

    dockerfile = (Path(__file__).parents[2] / "docs" / "agent.Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users == [f"{AGENT_UID}:{AGENT_UID}"]  # numeric: the kubelet can verify runAsNonRoot


def test_the_documented_agent_image_runs_what_the_pods_run():
    """docs/agent.Dockerfile: same entrypoint as the pods, jupyter_mn and the verbs libraries in."""
    import json
    from pathlib import Path

    dockerfile = (Path(__file__).parents[2] / "docs" / "agent.Dockerfile").read_text()
    cmd = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    container = pod_of(build(spec_for(1, rdma=False), GANG, Target()))["spec"]["containers"][0]
    assert json.loads(cmd[4:]) == container["command"]
    assert "pip install --no-cache-dir /src/jupyter_mn" in dockerfile
    assert "libibverbs1" in dockerfile and "ibverbs-providers" in dockerfile
