"""The validator on a real Kubernetes node: a driver change, then the node proves its workloads.

One real single-node cluster for the module (tests/support/node.py: kubelet v1.34.2 on Debian's
containerd, the fake kernel driver in the node's /proc/driver, Debian's real libcuda builds as the
host driver's and the image's compat library), the chart installed with helm with its defaults
(the validator is on with the agent) and containerd restarted as the docs say. The story:

1. the validator is Ready on R535 and the node says ``validated=535.261.03``; a CUDA 12.4 pod
   with compat 550 runs through ``cuda-compat`` and the agent records it;
2. a compatible driver change, 535 -> 555: the validator probes that image (its probe pod
   really ran: the host's 555 libcuda, driver API 12.5), is Ready again and the node says
   ``validated=555.58.02``;
3. an incompatible one: a CUDA 12.4 pod without compat runs, and the driver rolls back to R470
   (Debian bookworm's ``libnvidia-tesla-470-cuda1``, CUDA 11.4): the validator is not Ready, the
   node says ``validated=failed`` and a Warning Event names the image and its pod;
4. probe pods are gone after each validation and never appear as workloads.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support import node as nodemod
from tests.support.node import gpu_pod, ready, running, wait_pod
from tests.support.versions import HOST_470, HOST_535, HOST_555

pytestmark = [pytest.mark.containers, pytest.mark.slow]

NS = nodemod.RELEASE_NAMESPACE
LABEL = "compat-hook.io/validated"
BB = "docker.io/library/bb"
COMPAT_IMAGE, PLAIN_IMAGE = f"{BB}:compat", f"{BB}:base"
HOST_LIB = f"/{nodemod.HOST_LIB_DIR}/libcuda.so.1"
PROBES = "app.kubernetes.io/name=compat-hook-probe"


class World:
    def __init__(self, cluster, node) -> None:
        self.cluster, self.node, self.admin = cluster, node, cluster.admin
        self.timings: dict = {}

    def validator(self) -> dict | None:
        pods = self.admin.get(f"/api/v1/namespaces/{NS}/pods", labelSelector="app.kubernetes.io/name=compat-hook-validator")
        live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        return live[0] if live else None

    def validator_ready(self) -> bool:
        p = self.validator()
        return p is not None and ready(p)

    def wait_validator_ready(self, what: str, timeout: float) -> None:
        """Until the validator's pod is Ready; else fail with its status and log (what it said)."""
        try:
            self.admin.wait(what, self.validator_ready, timeout=timeout, interval=0.5)
        except AssertionError as e:
            p = self.validator() or {}
            raise AssertionError(f"{e}\nstatus: {json.dumps(p.get('status', {}).get('containerStatuses'))}"
                                 f"\n{self.logs()}") from None

    def logs(self) -> str:
        """The tails of the release's containers' logs (the agent's, the validator's), as the kubelet keeps them."""
        logs = sorted(self.node.path("/var/log/pods").glob(f"{NS}_*/*/*.log"))
        return "\n".join(f"{f.parent.parent.name}/{f.parent.name}: {f.read_text(errors='replace')[-1500:]}"
                         for f in logs)

    def label(self):
        return self.admin.get(f"/api/v1/nodes/{self.node.name}")["metadata"].get("labels", {}).get(LABEL)

    def record(self) -> dict | None:
        f = self.node.path("/var/lib/compat-hook-agent/workloads.json")
        return json.loads(f.read_text()) if f.exists() else None

    def state(self) -> dict:
        return json.loads(self.node.path("/var/lib/compat-hook-validator/validation.json").read_text())

    def wait_recorded(self, image: str) -> None:
        try:
            self.admin.wait(f"the agent's record of {image}", lambda: (r := self.record()) is not None and any(
                w["image"] == image for w in r["workloads"]), timeout=180, interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None

    def probe_pods(self) -> list:
        return self.admin.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=PROBES)["items"]

    def events(self) -> list:
        evs = self.admin.get("/api/v1/events", fieldSelector=f"involvedObject.name={self.node.name},"
                                                              "reason=CompatHookValidation")["items"]
        return sorted(evs, key=lambda e: e["metadata"]["creationTimestamp"] + e["metadata"]["name"])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("node-validator")
    image = nodemod.project_image()
    images = nodemod.workload_images(work / "images")
    cluster = nodemod.Cluster(work / "cp")
    node = nodemod.Node(work / "node", cluster, pause_image=f"{BB}:pause")
    left = None
    try:
        cluster.start()
        node.start(HOST_535)
        node.import_image(images, BB)
        node.import_image(image, "localhost/compat-hook")
        cluster.host_network_shim()
        node.helm("install", "compat-hook", nodemod.CHART, "-n", NS, "--create-namespace", "--set", "agent.interval=5")
        w = World(cluster, node)
        cluster.admin.wait("the DaemonSet Ready", lambda: cluster.admin.get(
            f"/apis/apps/v1/namespaces/{NS}/daemonsets/compat-hook")["status"].get("numberReady") == 1,
            timeout=300, interval=0.5)
        node.restart_containerd()  # docs/engines.md: load the cuda-compat runtime
        yield w
    finally:
        try:
            left = node.stop()
        finally:
            cluster.stop()
        for name in ("node/kubelet.log", "node/containerd.log"):
            f = work / name
            if f.exists():
                print(f"--- {name} (tail)\n" + f.read_text(errors="replace")[-2000:])
    assert left is not None and left["mounts"] == [] and not left["bridge"], left


def test_the_validator_pod_is_what_the_upgrade_controller_waits_for(world):
    world.wait_validator_ready("the validator Ready", timeout=300)
    labels = world.validator()["metadata"]["labels"]
    # app=nvidia-operator-validator (the controller's hard-coded selector), and never the operator's own
    assert labels["app"] == "nvidia-operator-validator"
    assert "app.kubernetes.io/part-of" not in labels or labels["app.kubernetes.io/part-of"] != "gpu-operator"
    world.admin.wait("validated=535", lambda: world.label() == HOST_535, timeout=120, interval=0.5)


def test_a_compatible_driver_change_is_validated(world):
    world.admin.create("/api/v1/namespaces/apps/pods", gpu_pod("train", world.node.name, COMPAT_IMAGE))
    wait_pod(world.admin, "apps", "train", running, "Running", timeout=180)
    world.wait_recorded(COMPAT_IMAGE)
    t0 = time.monotonic()
    world.node.set_driver(HOST_555)
    world.admin.wait("validated=555", lambda: world.label() == HOST_555, timeout=300, interval=0.5)
    world.wait_validator_ready("the validator Ready on 555", timeout=120)
    world.timings["compatible"] = time.monotonic() - t0
    st = world.state()
    assert st["driver"] == HOST_555 and st["result"] == "pass", st
    (row,) = [r for r in st["images"] if r["image"] == COMPAT_IMAGE]
    # its probe pod really ran in that image: the host's 555 library (newer than the compat 550), CUDA 12.5
    assert row["ok"] and row["libcuda"] == HOST_LIB and row["driver_api"] == 12050, row
    assert row["expected"] == "host" and row["needs"] == "12.4", row
    # Ready because its ready file names the driver loaded now (what its readiness probe compares)
    pod = world.validator()
    ready_file = world.node.path(f"/var/lib/kubelet/pods/{pod['metadata']['uid']}/volumes/kubernetes.io~empty-dir/"
                                 "ready/ready")
    assert ready_file.read_text().strip() == world.node.path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    (ev,) = [e for e in world.events() if HOST_555 in e["message"]]
    assert ev["type"] == "Normal" and "1 workload image(s) validated" in ev["message"], ev
    assert world.probe_pods() == []


def test_an_incompatible_rollback_fails_validation_and_names_the_image(world):
    world.admin.create("/api/v1/namespaces/apps/pods", gpu_pod("infer", world.node.name, PLAIN_IMAGE))
    wait_pod(world.admin, "apps", "infer", running, "Running", timeout=180)
    world.wait_recorded(PLAIN_IMAGE)
    t0 = time.monotonic()
    world.node.set_driver(HOST_470)
    world.admin.wait("validated=failed", lambda: world.label() == "failed", timeout=300, interval=0.5)
    world.timings["incompatible"] = time.monotonic() - t0
    st = world.state()
    assert st["driver"] == HOST_470 and st["result"] == "fail", st
    (row,) = [r for r in st["images"] if r["image"] == PLAIN_IMAGE]
    # CUDA 12.4 without a compat driver on R470 (CUDA 11.4): the host's 470 library, error 35
    assert not row["ok"] and row["code"] == "insufficient_driver" and row["driver_api"] == 11040, row
    assert row["libcuda"] == HOST_LIB
    ev = [e for e in world.events() if HOST_470 in e["message"]]
    assert ev and ev[-1]["type"] == "Warning", ev
    assert PLAIN_IMAGE in ev[-1]["message"] and "apps/infer" in ev[-1]["message"], ev[-1]["message"]
    # compat-hook's own taint, set by the validator's pod-bound token through the chart's admission policy
    taints = world.admin.get(f"/api/v1/nodes/{world.node.name}")["spec"].get("taints") or []
    assert {"key": "compat-hook.io/validation-failed", "value": HOST_470, "effect": "NoSchedule"} in taints, taints
    # not Ready, and it stays so: the upgrade controller would hold the node, then mark it upgrade-failed
    for _ in range(4):
        assert not world.validator_ready()
        time.sleep(2.5)
    assert world.probe_pods() == []


def test_probe_pods_are_never_workloads(world):
    rec = world.record()
    for w in rec["workloads"] + (rec.get("previous") or {}).get("workloads", []):
        assert not any(p.startswith(f"{NS}/compat-hook-probe-") for p in w["pods"]), w
    assert {w["image"] for w in rec["workloads"]} <= {COMPAT_IMAGE, PLAIN_IMAGE}
    print("validation timings (s):", {k: round(v, 1) for k, v in world.timings.items()})
