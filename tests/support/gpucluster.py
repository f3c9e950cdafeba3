"""GPU nodes, their pods and image stores, and the GPU Operator's objects, on the test control plane.

Shared by the cluster tests (tests/test_cluster.py, tests/test_cluster_runbook.py): what a GPU
cluster holds for NVIDIA's upgrade state machine (tests/upgrade_harness) to act on - the driver
DaemonSet, the ClusterPolicy, GPU nodes labelled the way GPU Feature Discovery labels them, GPU
pods - and the node side the agent reads: a store of real OCI image layouts and a host root whose
``/proc/driver/nvidia/version`` names the node's driver.
"""

from __future__ import annotations

import hashlib
import io
import pathlib
import shutil
import tarfile

import yaml

from tests.support import rootfs
from tests.support.images import Layout, gz
from tests.support.kube import AGENT_USER, NAMESPACE, RELEASE_USER, Api, ControlPlane

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
RENDERED = REPO / "packaging" / "kubernetes" / "compat-hook.yaml"
R535, R570, R470 = "535.261.03", "570.195.03", "470.256.02"
R580, R590 = "580.95.05", "590.44.01"
H100 = "NVIDIA H100 80GB HBM3"
#: The nodes' GPU unless a test says otherwise: an Ampere part every branch from R470 to R590 drives.
A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-16GB"
STATE = "nvidia.com/gpu-driver-upgrade-state"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
DS = "nvidia-driver-daemonset"
CP = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
#: image -> its CUDA_VERSION: a compat image (with a compat driver), a CUDA 11.8 one, a CUDA 12.4 one without
#: compat, and a CUDA 13.0 one without compat (broken on R535 already, and on anything before R580)
IMAGES = {"train": "12.4.1", "legacy": "11.8.0", "infer": "12.4.1", "future": "13.0.0"}
#: The test's own label on every object it makes: ``cluster status -l`` shows only those.
CASE = "compat-hook-test/case"
#: Pods with this label are the only ones the upgrade policy's drain evicts.
DRAIN = "compat-hook-test/drain"


def tar_dir(root: pathlib.Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for p in sorted(root.rglob("*")):
            tf.add(p, arcname=str(p.relative_to(root)), recursive=False)
    return buf.getvalue()


def ref(name: str) -> str:
    return f"registry.test/apps/{name}:1"


def build_store(dest: pathlib.Path, names, libs=None) -> pathlib.Path:
    """An OCI layout holding ``names``, each a one-layer image of a real rootfs (CUDA_VERSION in its env);
    ``train`` carries ``libs["noted"]`` as its compat driver."""
    lay = Layout(dest)
    for name in names:
        r = rootfs.build_rootfs(dest.parent / f"{dest.name}-{name}-root",
                                compat_lib=libs["noted"] if name == "train" else None)
        desc = lay.image([gz(tar_dir(r))], env=[f"CUDA_VERSION={IMAGES[name]}", "PATH=/usr/bin:/bin"])
        lay.tag(desc, ref(name))
        shutil.rmtree(r)
    return dest


def revision_hash(version: str) -> str:
    """The harness names a driver template's ControllerRevision by this."""
    return hashlib.sha256(version.encode()).hexdigest()[:10]


def rendered_docs() -> list:
    return [d for d in yaml.safe_load_all(RENDERED.read_text()) if d]


#: What the agent reads and writes, and nothing more (docs/cluster.md, "Permissions"): the tests' agent
#: runs with exactly this, so a request outside it fails them.
def _chart_rules(kind: str, name: str) -> list:
    """The rules of the chart's ``kind``/``name`` as its defaults render them (packaging/kubernetes)."""
    rendered = pathlib.Path(__file__).resolve().parents[2] / "packaging/kubernetes/compat-hook.yaml"
    for doc in yaml.safe_load_all(rendered.read_text()):
        if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
            return doc["rules"]
    raise AssertionError(f"{kind} {name} is not in {rendered}")


#: The chart's own ClusterRole of the agent: the tests' agent token has exactly what an installed one has.
AGENT_CLUSTER_RULES = _chart_rules("ClusterRole", "compat-hook-agent")
AGENT_NAMESPACE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]},
]
#: In ``default``, where Events about a Node go.
AGENT_EVENT_RULES = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
RELEASE_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]}]


def agent_rbac(cp: ControlPlane) -> None:
    """The agent's and the release Job's ServiceAccounts with exactly the permissions listed above (the
    tests' agent and release tokens authenticate as those ServiceAccounts)."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    assert AGENT_USER == "system:serviceaccount:compat-hook:compat-hook"
    assert RELEASE_USER == "system:serviceaccount:compat-hook:compat-hook-release"
    for sa, rules in (("compat-hook", AGENT_CLUSTER_RULES), ("compat-hook-release", RELEASE_RULES)):
        cp.admin.create("/api/v1/namespaces/compat-hook/serviceaccounts", {"metadata": {"name": sa}})
        cp.admin.create(f"{rbac}/clusterroles", {"metadata": {"name": sa}, "rules": rules})
        cp.admin.create(f"{rbac}/clusterrolebindings", {
            "metadata": {"name": sa}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "compat-hook"}]})
    for ns, rules in (("compat-hook", AGENT_NAMESPACE_RULES), ("default", AGENT_EVENT_RULES)):
        cp.admin.create(f"{rbac}/namespaces/{ns}/roles", {"metadata": {"name": "compat-hook"}, "rules": rules})
        cp.admin.create(f"{rbac}/namespaces/{ns}/rolebindings", {
            "metadata": {"name": "compat-hook"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                             "name": "compat-hook"},
            "subjects": [{"kind": "ServiceAccount", "name": "compat-hook", "namespace": "compat-hook"}]})


def runtime_classes(admin: Api) -> None:
    """The chart's RuntimeClass (through compat-hook) and the GPU Operator's (the NVIDIA toolkit alone)."""
    for name in ("cuda-compat", "nvidia"):
        admin.create("/apis/node.k8s.io/v1/runtimeclasses", {"metadata": {"name": name}, "handler": name})


def gpu_node(name: str, deploy_driver: bool = True, gpu: str = A100, case: str | None = None) -> dict:
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": gpu.replace(" ", "-"),
              "nvidia.com/cuda.driver-version.full": R535, "kubernetes.io/hostname": name}
    if case:
        labels[CASE] = case
    if deploy_driver:
        labels["nvidia.com/gpu.deploy.driver"] = "true"
    return {"metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {},
            "status": {"capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
                       "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}}}


def gpu_pod(name: str, node: str, image: str, ns: str = "apps", *, runtime_class: str | None = "cuda-compat",
            env: list | None = None, labels: dict | None = None) -> dict:
    """A pod with one container asking for a GPU, on ``runtime_class`` (the chart's by default)."""
    c = {"name": "main", "image": image, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env]
    spec = {"nodeName": node, "containers": [c]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"metadata": {"name": name, "namespace": ns, "labels": dict(labels or {})}, "spec": spec}


def gpu_operator(admin: Api, version: str = R535) -> None:
    """The driver DaemonSet (OnDelete, as the GPU Operator makes it) and the ClusterPolicy on ``version``
    with an upgrade policy that upgrades every node at once; its drain evicts only pods labelled
    :data:`DRAIN` (and waits for ever on one a PodDisruptionBudget protects)."""
    admin.create(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets", {
        "metadata": {"name": DS, "labels": {"app": DS}},
        "spec": {"selector": {"matchLabels": {"app": DS}}, "updateStrategy": {"type": "OnDelete"},
                 "template": {"metadata": {"labels": {"app": DS}},
                              "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                                       "containers": [{"name": "nvidia-driver-ctr",
                                                       "image": "nvcr.io/nvidia/driver:535"}]}}}})
    admin.create("/apis/nvidia.com/v1/clusterpolicies", {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"version": version, "upgradePolicy": {
            "autoUpgrade": True, "maxParallelUpgrades": 0, "maxUnavailable": "100%",
            "drain": {"enable": True, "force": True, "podSelector": f"{DRAIN}=true", "timeoutSeconds": 0}}}}})


def set_node_driver(admin: Api, host: pathlib.Path, node: str, version: str, gpu: str = A100) -> pathlib.Path:
    """The node's kernel driver (what the driver container's module reload changes on a real node), its
    GPU, and GPU Feature Discovery's label for the driver."""
    from tests.support import hookenv

    hookenv.set_host_version(host, version)
    info = host / "proc/driver/nvidia/gpus/0000:17:00.0/information"
    info.parent.mkdir(parents=True, exist_ok=True)
    info.write_text(f"Model: \t\t {gpu}\nBus Location: \t 0000:17:00.0\n")
    admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"nvidia.com/cuda.driver-version.full": version}}})
    return host


def driver_pods(admin: Api) -> dict:
    """``{node: pod}`` of the driver DaemonSet's live pods."""
    pods = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"app={DS}")["items"]
    return {p["spec"]["nodeName"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def labels(admin: Api, node: str) -> dict:
    return admin.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}


def wait_upgraded(admin: Api, nodes, version: str, timeout: float = 120) -> None:
    """Until NVIDIA's controller has every node of ``nodes`` in ``upgrade-done`` with a running driver
    pod of ``version``'s template."""
    want = revision_hash(version)

    def done():
        pods = driver_pods(admin)
        return all(labels(admin, n).get(STATE) == "upgrade-done" and n in pods
                   and pods[n]["metadata"]["labels"].get("controller-revision-hash") == want
                   and pods[n].get("status", {}).get("phase") == "Running" for n in nodes)

    admin.wait(f"{list(nodes)} upgrade-done on {version}", done, timeout=timeout, interval=0.5)
