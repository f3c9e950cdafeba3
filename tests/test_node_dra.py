"""A GPU that comes from a ResourceClaim (DRA) on a real Kubernetes node whose containerd 2.x runs NRI.

Dynamic Resource Allocation is GA in Kubernetes 1.34 (``resource.k8s.io/v1``, on by default in
the API server, the scheduler, the controller-manager's claim controller and the kubelet).
NVIDIA's DRA driver for GPUs publishes a node's GPUs as a ResourceSlice; the scheduler allocates
a pod's claim from it, and the kubelet asks the driver's kubelet plugin to prepare the claim. The
plugin writes a per-claim CDI spec and answers with its CDI name
(``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0``), which the kubelet passes in the CRI's
``CDI_devices``. containerd before 2.3 applies the CDI edits before NRI, so compat-hook's NRI
plugin sees the GPU's ``/dev/nvidia*`` device node. The pod names no ``nvidia.com/gpu`` and no
RuntimeClass: only the NRI plugin brings compat-hook's hook to it.

One real single-node cluster for the module (tests/support/node.py), as test_node_cdi.py sets it
up: kubelet v1.34.2 on Debian sid's containerd 2.1.9 with ``enable_cdi``, plain runc as the
default runtime and NRI on; a **GeForce** on the 535 driver (the fake ``/proc/driver/nvidia``, the
only fake). The DRA driver is tests/support/draplugin.py (driver ``gpu.nvidia.com``, four devices
``gpu-0`` ... ``gpu-3``: two for the workloads, two free for the validator's probes, as on a node the
upgrade drained): its claim spec carries what the toolkit generates for the GPU (the device node, the
driver root's real Debian ``libcuda.so.<driver>``, ``NVIDIA_VISIBLE_DEVICES=void``, the toolkit's real
v1.20.2 ``nvidia-cdi-hook`` hooks). The chart is installed with its defaults, the gate on and
``validator.deviceClass=gpu.nvidia.com`` (docs/validation.md: the validator's probe pods get their GPU
from a claim too), with a ClusterPolicy whose driver the GPU Operator upgrades (so a hold can hold).

The story (the tests share the cluster and run in file order):

1. a pod whose container uses a claim from a ResourceClaimTemplate (DeviceClass ``gpu.nvidia.com``),
   with a CUDA 12.4 image that carries the compat 550 driver: the kubelet asked the plugin to
   prepare exactly that claim, and the container loads the host's 535 library (a GeForce cannot
   use a compat driver; the toolkit's ``enable-cuda-compat`` turned it on all the same): the
   node's decision log has the decision of the hook the NRI plugin added;
2. a second claimed pod, a CUDA 12.4 image without a compat driver (it runs on 535), and a
   rollback to R520 (CUDA 11.8) announced on the ClusterPolicy: the agent counts the claimed
   pods as GPU workloads, its preflight fails for that image and pod, and it holds the node;
3. a driver change, 535 -> 555: the validator probes both claimed pods' images on the new driver; each
   probe pod gets its GPU from a claim of the chart's ResourceClaimTemplate, which the scheduler
   allocated on the node, and the probe loads the host's library (compat-hook's decision): the node
   says ``validated=555`` and carries no taint. (Without ``validator.deviceClass`` a probe pod gets no
   GPU there and the validation fails closed, saying how to give it one: tests/test_validator.py.)

What a container really loads is what tests/support/probe.c, run in it, says.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support import draplugin, engines
from tests.support import node as nodemod
from tests.support import toolkit as tks
from tests.support.node import probe_result, running, wait_pod
from tests.support.versions import COMPAT_550, HOST_535

pytestmark = [pytest.mark.containers, pytest.mark.slow]

NS = nodemod.RELEASE_NAMESPACE
PREFIX = "compat-hook.io"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
BB = "docker.io/library/bb"
COMPAT_IMAGE, PLAIN_IMAGE = f"{BB}:compat", f"{BB}:base"
GEFORCE = "NVIDIA GeForce RTX 4090"
#: The DRA driver's name, and the DeviceClass's (the chart's validator.deviceClass).
DRIVER = "gpu.nvidia.com"
GPUS = 4
DEVICES = [f"gpu-{i}" for i in range(GPUS)]
#: The host's library as the claim's CDI spec mounts it.
HOST_LIB = f"/{nodemod.HOST_LIB_DIR}/libcuda.so.{HOST_535}"
#: cuDriverGetVersion of Debian's builds (tests/support/debs.py EXPECTED_CUDA).
CUDA = {HOST_535: "12020", COMPAT_550: "12040"}
#: The announced rollback: R520 gives CUDA 11.8, below what the image needs (12.4), and a GeForce cannot use
#: the image's compat 550 driver: the claimed pod would fail there (error 35).
TARGET = "520.61.05"
CP_PATH = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
RESOURCE = "/apis/resource.k8s.io/v1"


def gpu_edits(tk: tks.Toolkit, driver: str = HOST_535) -> dict:
    """The GPU's CDI edits as nvidia-ctk generates them for the node's ``driver`` (test_node_cdi.py's spec,
    its device's and its global edits in one): what the DRA plugin writes into each claim's spec."""
    lib = f"{nodemod.DRIVER_ROOT}/{nodemod.HOST_LIB_DIR}/libcuda.so.{driver}"
    return {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}],
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": tks.cdi_mounts(lib, driver), "hooks": tks.cdi_hooks(tk, driver)}


def claimed_pod(name: str, node: str, image: str) -> dict:
    """A pod whose one container gets its GPU from a claim of the ``gpu`` template: no ``nvidia.com/gpu``, no
    RuntimeClass, and no ``nodeName`` (the scheduler allocates the claim when it places the pod)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "apps"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", "probe; exec sleep 100000"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def _workloads(world) -> list:
    """The GPU workloads the agent recorded on the node (its workloads.json)."""
    f = world.node.path("/var/lib/compat-hook-agent/workloads.json")
    return json.loads(f.read_text())["workloads"] if f.exists() else []


class World:
    def __init__(self, cluster, node, plugin, timings, tk) -> None:
        self.cluster, self.node, self.admin, self.plugin = cluster, node, cluster.admin, plugin
        self.timings, self.tk = timings, tk

    def labels(self) -> dict:
        return self.admin.get(f"/api/v1/nodes/{self.node.name}")["metadata"].get("labels") or {}

    def annotations(self) -> dict:
        return self.admin.get(f"/api/v1/nodes/{self.node.name}")["metadata"].get("annotations") or {}

    def decisions(self) -> list:
        f = self.node.path("/var/log/compat-hook.log")
        return [json.loads(ln) for ln in f.read_text().splitlines() if ln.startswith("{")] if f.exists() else []

    def logs(self) -> str:
        """The tails of the release's containers' logs (the agent's, the validator's)."""
        logs = sorted(self.node.path("/var/log/pods").glob(f"{NS}_*/*/*.log"))
        return "\n".join(f"{f.parent.parent.name}/{f.parent.name}: {f.read_text(errors='replace')[-1500:]}"
                         for f in logs)

    def validated(self):
        return self.labels().get(f"{PREFIX}/validated")

    def validation(self) -> dict:
        return json.loads(self.node.path("/var/lib/compat-hook-validator/validation.json").read_text())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("node-dra")
    timings = {}
    t0 = time.monotonic()
    image = nodemod.project_image()
    images = nodemod.workload_images(work / "images")
    tk = tks.ensure()
    timings["images"] = time.monotonic() - t0
    cluster = nodemod.Cluster(work / "cp")
    node = nodemod.Node(work / "node", cluster, pause_image=f"{BB}:pause", containerd_bin=engines.containerd2(),
                        gpu_model=GEFORCE)
    plugin = left = code = None
    try:
        t = time.monotonic()
        cluster.start()
        node.start(HOST_535)
        timings["cluster"] = time.monotonic() - t
        node.import_image(images, BB)
        node.import_image(image, "localhost/compat-hook")
        cluster.host_network_shim()
        a = cluster.admin
        plugin = draplugin.Plugin(node, work / "draplugin", gpu_edits(tk), driver=DRIVER, gpus=GPUS)
        a.create(f"{RESOURCE}/deviceclasses", {"metadata": {"name": DRIVER}, "spec": {"selectors": [
            {"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
        a.create(f"{RESOURCE}/namespaces/apps/resourceclaimtemplates", {"metadata": {"name": "gpu"}, "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}})
        a.create("/apis/nvidia.com/v1/clusterpolicies", {
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            # the operator's driver, upgraded by its controller (else a hold could do nothing: cannot-hold)
            "spec": {"driver": {"enabled": True, "version": HOST_535, "upgradePolicy": {"autoUpgrade": True}}}})
        t = time.monotonic()
        # docs/cluster.md "Install", the gate on (docs/cluster.md "Hold"); a short agent interval; the
        # validator's probe pods claim a GPU of the node's DeviceClass (docs/validation.md)
        node.helm("install", "compat-hook", nodemod.CHART, "-n", NS, "--create-namespace",
                  "--set", "agent.interval=5", "--set", "agent.gate=true", "--set", f"validator.deviceClass={DRIVER}")
        a.wait("the DaemonSet Ready", lambda: a.get(f"/apis/apps/v1/namespaces/{NS}/daemonsets/compat-hook")[
            "status"].get("numberReady") == 1, timeout=300, interval=0.5)
        node.restart_containerd()  # docs/engines.md: containerd starts the NRI plugin at its start
        w = World(cluster, node, plugin, timings, tk)
        a.wait("registration=nri", lambda: w.labels().get(f"{PREFIX}/registration") == "nri", timeout=90,
               interval=0.5)
        # the validator's first pass (no GPU workload yet) before any claimed pod: 535 stays validated
        a.wait("validated=535", lambda: w.validated() == HOST_535, timeout=120, interval=0.5)
        timings["ready"] = time.monotonic() - t0
        yield w
    finally:
        try:
            code = plugin.stop() if plugin else 0
        finally:
            left = nodemod.stop_all(cluster, node, work, ("node/kubelet.log", "node/containerd.log",
                                                          "draplugin/draplugin.log"), timings, t0, "node-dra")
    assert code == 0, plugin.text()[-2000:]  # the DRA plugin ended on SIGTERM
    assert left is not None and left["mounts"] == [] and left["processes"] == [] and not left["bridge"], left


def test_a_claimed_gpu_gets_the_decision_through_nri(world):
    a = world.admin
    t = time.monotonic()
    a.create("/api/v1/namespaces/apps/pods", claimed_pod("train", world.node.name, COMPAT_IMAGE))
    pod = wait_pod(a, "apps", "train", running, "Running", timeout=180)
    got = a.wait("train's probe output", lambda: probe_result(world.node.pod_log("apps", "train")).get("libcuda")
                 and probe_result(world.node.pod_log("apps", "train")), timeout=60)
    world.timings["claimed_pod"] = time.monotonic() - t
    # the scheduler allocated the claim from the plugin's slice, and the kubelet asked the plugin to prepare it
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = a.get(f"{RESOURCE}/namespaces/apps/resourceclaims/{status['resourceClaimName']}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, world.node.name) and result["device"] in DEVICES
    uid = claim["metadata"]["uid"]
    assert world.plugin.prepared() == [(f"apps/{claim['metadata']['name']}",
                                        f"k8s.gpu.nvidia.com/claim={uid}-{result['device']}")], world.plugin.text()
    assert world.node.path(f"/run/cdi/k8s.gpu.nvidia.com-claim_{uid}.json").is_file()
    # what the container loads: the host's library (compat-hook's decision), not the compat one
    assert got == {"cuDriverGetVersion": CUDA[HOST_535], "libcuda": HOST_LIB}, got
    (cs,) = pod["status"]["containerStatuses"]
    cid = cs["containerID"].split("//", 1)[1]
    recs = [r for r in world.decisions() if r.get("container_id") == cid]
    assert [(r["event"], r.get("via"), r["decision"], r["reason"], r["effect"]) for r in recs] == \
        [("hook", "nri", "skip", "device_consumer", "host")], recs
    (rec,) = recs
    assert (rec["pod"], rec["namespace"], rec["maps"]) == ("train", "apps", HOST_LIB), rec
    assert [g for g in rec["gpus_checked"]["gpus"] if GEFORCE in g], rec["gpus_checked"]
    assert [d for d in rec["compat_dropins"] if d.endswith("(nvidia-toolkit)")], rec["compat_dropins"]


def test_the_agent_preflights_the_claimed_pod_and_holds_the_node(world):
    """A second claimed pod, a CUDA 12.4 image without a compat driver: on the 535 driver it runs (minor-version
    compatibility), on R520 (CUDA 11.8) it would fail. The agent counts it and holds the node for it."""
    a = world.admin
    a.create("/api/v1/namespaces/apps/pods", claimed_pod("infer", world.node.name, PLAIN_IMAGE))
    wait_pod(a, "apps", "infer", running, "Running", timeout=180)
    got = a.wait("infer's probe output", lambda: probe_result(world.node.pod_log("apps", "infer")).get("libcuda")
                 and probe_result(world.node.pod_log("apps", "infer")), timeout=60)
    assert got == {"cuDriverGetVersion": CUDA[HOST_535], "libcuda": HOST_LIB}, got
    (one, two) = world.plugin.prepared()  # each pod its own device
    assert one[1].rsplit("-", 1)[1] != two[1].rsplit("-", 1)[1], world.plugin.text()
    a.wait("the agent's record of both pods", lambda: len(_workloads(world)) == 2, timeout=60, interval=0.5)
    t = time.monotonic()
    a.merge(CP_PATH, {"metadata": {"annotations": {f"{PREFIX}/next-driver": TARGET}}})
    try:
        a.wait("the node held", lambda: (lambda l: l.get(f"{PREFIX}/preflight") == "fail" and l.get(SKIP) == "true"
                                         and l.get(f"{PREFIX}/preflight.target-driver") == TARGET)(world.labels())
               and f"{PREFIX}/holds-upgrade" in world.annotations(), timeout=120, interval=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}: {world.annotations().get(f'{PREFIX}/preflight')}\n{world.logs()}") from None
    world.timings["held"] = time.monotonic() - t
    cm = a.get(f"/api/v1/namespaces/{NS}/configmaps/{world.node.name}")
    regressions = {r["image"]: r for r in json.loads(cm["data"]["preflight.json"])["regressions"]}
    assert regressions[PLAIN_IMAGE]["error"] == 35 and regressions[PLAIN_IMAGE]["pods"] == ["apps/infer"], \
        regressions
    a.merge(CP_PATH, {"metadata": {"annotations": {f"{PREFIX}/next-driver": None}}})


def test_the_validator_proves_the_claimed_pods_images_with_probe_pods_that_claim_a_gpu(world):
    """A driver change, 535 -> 555: the validator takes both claimed pods' images from the agent's record and
    probes each on the new driver, expecting compat-hook's decision (the host's library).

    With ``validator.deviceClass`` each probe pod claims one device of that class from the chart's
    ResourceClaimTemplate: it is pinned to the node by node affinity (not bound by ``spec.nodeName``),
    so the scheduler allocates its claim from the node's slice, the kubelet asks the DRA plugin to
    prepare it, and the probe runs with the claim's CDI edits, as the workloads do. The DRA plugin
    now hands out the new driver's library (as a real driver does once its driver root changed). Every
    probe loads the host's 555 library: ``validated=555``, no taint, a Normal Event; the probe pods
    and their claims are gone afterwards."""
    from tests.support.versions import HOST_555

    a = world.admin
    assert world.validated() == HOST_535
    probes_before = len(world.plugin.prepared())
    t = time.monotonic()
    world.node.set_driver(HOST_555)
    world.plugin.set_edits(gpu_edits(world.tk, HOST_555))
    try:
        a.wait("the validation of 555", lambda: world.validated() in (HOST_555, "failed") and
               world.validation()["driver"] == HOST_555, timeout=240, interval=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{world.logs()}") from None
    world.timings["validated"] = time.monotonic() - t
    st = world.validation()
    assert world.validated() == HOST_555 and st["result"] == "pass", (st, world.plugin.text()[-2000:])
    rows = {r["image"]: r for r in st["images"]}
    assert sorted(rows) == [PLAIN_IMAGE, COMPAT_IMAGE], rows
    lib = f"/{nodemod.HOST_LIB_DIR}/libcuda.so.{HOST_555}"
    for image, pod in ((COMPAT_IMAGE, "apps/train"), (PLAIN_IMAGE, "apps/infer")):
        row = rows[image]
        assert row["pods"] == [pod] and row["expected"] == "host" and row["needs"] == "12.4", row
        # what the probe's own loader took: the host's library, the claim's, on the new driver (CUDA 12.5)
        assert row["ok"] and row["code"] == "ok" and row["libcuda"] == lib and row["driver_api"] == 12050, row
    # each probe's claim was prepared on this node by the DRA plugin, a device the workloads do not hold
    probes = [(claim, cdi) for claim, cdi in world.plugin.prepared()[probes_before:] if claim.startswith(f"{NS}/")]
    assert len(probes) == 2, world.plugin.text()
    held = {cdi.rsplit("-", 1)[1] for _, cdi in world.plugin.prepared()[:probes_before]}  # gpu-<i>
    assert not held & {cdi.rsplit("-", 1)[1] for _, cdi in probes}, world.plugin.text()
    evs = a.get("/api/v1/events", fieldSelector=f"involvedObject.name={world.node.name},"
                                                 "reason=CompatHookValidation")["items"]
    (ev,) = [e for e in evs if HOST_555 in e["message"]]
    assert ev["type"] == "Normal" and "2 workload image(s) validated" in ev["message"], ev
    taints = a.get(f"/api/v1/nodes/{world.node.name}")["spec"].get("taints") or []
    assert not [t for t in taints if t["key"] == f"{PREFIX}/validation-failed"], taints
    # the probe pods are deleted, and with them their claims (the devices are free again)
    a.wait("no probe pod and no claim left", lambda: not a.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=(
        "app.kubernetes.io/component=validation-probe"))["items"] and not a.get(
        f"{RESOURCE}/namespaces/{NS}/resourceclaims")["items"], timeout=90, interval=0.5)
    print("node-dra timings (s):", {k: round(v, 1) for k, v in world.timings.items()})
