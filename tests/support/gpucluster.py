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
from tests.support.kube import AGENT_USER, NAMESPACE, Api, ControlPlane

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
RENDERED = REPO / "packaging" / "kubernetes" / "compat-hook.yaml"
R535, R570, R470 = "535.261.03", "570.195.03", "470.256.02"
H100 = "NVIDIA H100 80GB HBM3"
STATE = "nvidia.com/gpu-driver-upgrade-state"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
DS = "nvidia-driver-daemonset"
CP = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
#: image -> its CUDA_VERSION: a compat image (with a compat driver), a CUDA 11.8 one, a CUDA 12.4 one without compat
IMAGES = {"train": "12.4.1", "legacy": "11.8.0", "infer": "12.4.1"}


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


def agent_rbac(cp: ControlPlane) -> None:
    """The agent's ServiceAccount, ClusterRole and binding from the rendered manifests (the tests' agent
    token authenticates as that ServiceAccount)."""
    for d in rendered_docs():
        if "validator" in d["metadata"]["name"]:  # the validator's own account (tests/test_validator.py)
            continue
        if d["kind"] == "ServiceAccount":
            cp.admin.create(f"/api/v1/namespaces/{d['metadata']['namespace']}/serviceaccounts", d)
        elif d["kind"] == "ClusterRole":
            cp.admin.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", d)
        elif d["kind"] == "ClusterRoleBinding":
            assert d["subjects"] == [{"kind": "ServiceAccount", "name": "compat-hook", "namespace": "compat-hook"}]
            assert AGENT_USER == "system:serviceaccount:compat-hook:compat-hook"
            cp.admin.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", d)


def gpu_node(name: str, deploy_driver: bool = True) -> dict:
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": H100.replace(" ", "-"),
              "nvidia.com/cuda.driver-version.full": R535, "kubernetes.io/hostname": name}
    if deploy_driver:
        labels["nvidia.com/gpu.deploy.driver"] = "true"
    return {"metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {},
            "status": {"capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
                       "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}}}


def gpu_pod(name: str, node: str, image: str, ns: str = "apps") -> dict:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": image,
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def gpu_operator(admin: Api, version: str = R535) -> None:
    """The driver DaemonSet (OnDelete, as the GPU Operator makes it) and the ClusterPolicy on ``version``
    with an upgrade policy that upgrades every node at once, without a drain."""
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
            "drain": {"enable": False}}}}})


def set_node_driver(admin: Api, host: pathlib.Path, node: str, version: str) -> pathlib.Path:
    """The node's kernel driver (what the driver container's module reload changes on a real node), its
    GPU, and GPU Feature Discovery's label for the driver."""
    from tests.support import hookenv

    hookenv.set_host_version(host, version)
    info = host / "proc/driver/nvidia/gpus/0000:17:00.0/information"
    info.parent.mkdir(parents=True, exist_ok=True)
    info.write_text(f"Model: \t\t {H100}\nBus Location: \t 0000:17:00.0\n")
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
