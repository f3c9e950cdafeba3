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
4. probe pods are gone after each validation and never appear as workloads;
5. docs/validation.md's fix on ``validated=failed``, as written: a workload image from a registry
   (tests/support/registry.py) fails on R470, the fixed one is pushed under the same tag, the docs'
   ``kubectl run pull-fix`` brings it onto the tainted node (the real kubectl), the docs' delete of
   the validator pod gives the next attempt: it passes on the fixed image and the taint goes;
6. under NVIDIA's upgrade state machine (tests/upgrade_harness with validation enabled, the real
   DaemonSet controller running the driver DaemonSet): a rollback that breaks a workload fails
   validation, the controller marks the node ``upgrade-failed`` and uncordons it, and compat-hook's
   taint keeps a new GPU pod off it until the fixed driver validates;
7. the whole rolling upgrade: the real node and six kwok nodes (agents with the gate on), two at a
   time, a Deployment under a PodDisruptionBudget, one node held by its regressing workload.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import threading
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
REPO = pathlib.Path(__file__).resolve().parent.parent


class World:
    def __init__(self, cluster, node) -> None:
        self.cluster, self.node, self.admin = cluster, node, cluster.admin
        self.timings: dict = {}

    def validator(self) -> dict | None:
        pods = self.admin.get(f"/api/v1/namespaces/{NS}/pods",
                              labelSelector="app.kubernetes.io/name=compat-hook-validator",
                              fieldSelector=f"spec.nodeName={self.node.name}")
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
        w.layout = images.parent / "img"  # the OCI layout the tar was made of (its tags base, compat ...)
        cluster.admin.wait("the DaemonSet Ready", lambda: cluster.admin.get(
            f"/apis/apps/v1/namespaces/{NS}/daemonsets/compat-hook")["status"].get("numberReady") == 1,
            timeout=300, interval=0.5)
        node.restart_containerd()  # docs/engines.md: load the cuda-compat runtime
        yield w
    finally:
        left = nodemod.stop_all(cluster, node, work)
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


# ----------------------------------------------------------------------------- the documented fix

APP_REPO, APP_TAG = "apps/app", "1"


def docs_fix_commands(ref: str, node: str) -> tuple:
    """docs/validation.md's fix on ``validated=failed`` (its step 1), as an operator copies it: the
    fenced ``sh`` block (the one pull by a pod that tolerates the taint) and the inline command that
    deletes the node's validator pod, with ``REGISTRY/APP:TAG`` and ``NODE`` filled in."""
    import re
    import textwrap

    text = (REPO / "docs" / "validation.md").read_text()
    step = text[text.index("**On `validated=failed`**"):]
    step = step[:step.index("\n2. ")]
    block = re.search(r"```sh\n(.*?)\n\s*```", step, re.S)
    assert block, "docs/validation.md: no sh block in the fix"
    again = re.search(r"`(kubectl -n compat-hook delete pod -l [^`]+)`", step)
    assert again, "docs/validation.md: no command that deletes the validator pod"

    def fill(cmd: str) -> str:
        assert "REGISTRY/APP:TAG" in cmd or "NODE" in cmd, cmd
        return re.sub(r"\bNODE\b", node, cmd.replace("REGISTRY/APP:TAG", ref))

    return fill(textwrap.dedent(block.group(1))), fill(again.group(1))


def test_the_documented_fix_pushed_under_the_same_tag_reaches_the_node_and_passes(world, tmp_path):
    """docs/validation.md's step 1 on ``validated=failed``, run as written on the real node: a
    workload's image in a registry (tests/support/registry.py, plain HTTP, the node's containerd
    trusting it through ``config_path``) fails on R470; the fixed image is pushed under the same tag;
    the docs' ``kubectl run pull-fix ...`` (the real kubectl) brings it onto the tainted node; the
    docs' ``kubectl ... delete pod`` of the validator gives the next attempt at once. It passes, the
    taint goes, and the probe ran the fixed image: the tag's new digest, its compat driver.

    The story around it: the node was R470, failed on ``infer`` (``bb:base``). ``infer`` goes, the
    node passes on R555 where ``app:1`` starts (so the 555 record is ``train`` and ``app``), and the
    rollback to R470 fails on ``app`` alone. At the end ``infer`` runs again on R470, as the next
    test expects."""
    from tests.support import kubebuild
    from tests.support.kube import ADMIN_TOKEN
    from tests.support.registry import Registry, config_of

    w, a, node = world, world.admin, world.node
    t0 = time.monotonic()
    reg = Registry().start()
    try:
        ref = f"{reg.host}/{APP_REPO}:{APP_TAG}"
        # the app's two builds: bb's base (CUDA 12.4, no compat driver) and compat (with the compat 550
        # driver), each with a config of its own, so the node has neither before it pulls (only their layers)
        for build, of in (("app-broken", "base"), ("app-fixed", "compat")):
            subprocess.run(["umoci", "config", "--image", f"{w.layout}:{of}", "--tag", build,
                            "--config.label", f"compat-hook-test/app={build}"], check=True, capture_output=True)
        broken = reg.push(APP_REPO, APP_TAG, w.layout, "app-broken")
        node.trust_registry(reg.host)

        # the node on R555, validated, without infer (its workloads there: train and app). As in an
        # upgrade, infer goes while the module is unloaded: the agent records nothing without a driver,
        # so no pass can pair a pod list that still has infer (its informer's) with R555
        node.path("/proc/driver/nvidia/version").unlink()
        a.delete("/api/v1/namespaces/apps/pods/infer", gracePeriodSeconds="0")
        a.wait("infer gone", lambda: "infer" not in {
            x["metadata"]["name"] for x in a.get("/api/v1/namespaces/apps/pods")["items"]}, timeout=60, interval=0.5)
        time.sleep(RELOAD_S)
        node.set_driver(HOST_555)
        a.wait("validated=555", lambda: w.label() == HOST_555, timeout=300, interval=0.5)
        app = gpu_pod("app", node.name, ref)
        app["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"  # the workload's own pod pulls it
        a.create("/api/v1/namespaces/apps/pods", app)
        pod = wait_pod(a, "apps", "app", running, "Running (pulled from the registry)", timeout=180)
        assert pod["status"]["containerStatuses"][0]["imageID"].endswith(broken), pod["status"]
        assert reg.served(APP_REPO, config_of(w.layout, "app-broken")), reg.log
        w.wait_recorded(ref)
        assert {x["image"] for x in w.record()["workloads"]} == {COMPAT_IMAGE, ref}, w.record()

        # the rollback: app (CUDA 12.4, no compat driver) fails on R470, the node is tainted
        node.set_driver(HOST_470)
        a.wait("validated=failed", lambda: w.label() == "failed", timeout=300, interval=0.5)
        st = w.state()
        assert st["driver"] == HOST_470 and st["result"] == "fail", st
        bad = {r["image"]: r for r in st["images"] if not r["ok"]}
        assert list(bad) == [ref] and bad[ref]["code"] == "insufficient_driver", st["images"]
        taint = {"key": TAINT_KEY, "value": HOST_470, "effect": "NoSchedule"}
        assert taint in (a.get(f"/api/v1/nodes/{node.name}")["spec"].get("taints") or [])

        # the fix, pushed under the same tag: the node still has the broken one (the probe never pulls)
        fixed = reg.push(APP_REPO, APP_TAG, w.layout, "app-fixed")
        assert fixed != broken

        def on_node() -> str:
            (line,) = [ln for ln in node.ctr("images", "ls").stdout.splitlines() if ln.split()[:1] == [ref]]
            return line.split()[2]

        assert on_node() == broken
        pull, again = docs_fix_commands(ref, node.name)
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "kubectl").symlink_to(kubebuild.kubectl())
        env = dict(nodemod.ENV, PATH=f"{bindir}:{nodemod.ENV['PATH']}", HOME=str(tmp_path),
                   KUBECONFIG=str(w.cluster.kubeconfig(ADMIN_TOKEN, "admin")))
        t_fix = time.monotonic()
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", pull], env=env, capture_output=True, text=True,
                           timeout=180)
        assert p.returncode == 0, (pull, p.stdout, p.stderr)
        assert reg.served(APP_REPO, config_of(w.layout, "app-fixed")), reg.log  # the kubelet pulled it from here
        assert on_node() == fixed
        assert not [x for x in a.get(f"/api/v1/namespaces/{NS}/pods")["items"] if x["metadata"]["name"] == "pull-fix"]

        # the next attempt at once: the docs' delete of the node's validator pod; its probe runs the fix
        seen: dict = {}
        stop = threading.Event()

        def watch() -> None:  # the probe pod is deleted once it ends: its container's image read meanwhile
            while not stop.wait(0.2):
                for x in w.probe_pods():
                    for c in x.get("status", {}).get("containerStatuses") or []:
                        if c["name"] == "probe" and c.get("imageID") and c["image"] == ref:
                            seen[x["metadata"]["uid"]] = c["imageID"]

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            p = subprocess.run(["bash", "-euo", "pipefail", "-c", again], env=env, capture_output=True, text=True,
                               timeout=120)
            assert p.returncode == 0 and "deleted" in p.stdout, (again, p.stdout, p.stderr)
            a.wait("validated=470", lambda: w.label() == HOST_470, timeout=300, interval=0.5)
            w.wait_validator_ready("the validator Ready on 470", timeout=120)
        finally:
            stop.set()
            watcher.join(10)
        w.timings["documented_fix"] = time.monotonic() - t_fix
        assert _taint(a.get(f"/api/v1/nodes/{node.name}")) is None
        st = w.state()
        assert st["driver"] == HOST_470 and st["result"] == "pass", st
        (row,) = [r for r in st["images"] if r["image"] == ref]
        # the fixed image's compat driver (550, CUDA 12.4) over the R470 host's, as compat-hook decided
        assert row["ok"] and row["expected"] == "compat" and row["driver_api"] == 12040, row
        assert row["libcuda"].startswith("/usr/local/cuda-12.4/compat/libcuda.so."), row
        assert seen and all(v.endswith("@" + fixed) for v in seen.values()), seen

        # the story goes on as before: infer (CUDA 12.4, no compat) runs on R470 again
        a.delete("/api/v1/namespaces/apps/pods/app", gracePeriodSeconds="0")
        a.create("/api/v1/namespaces/apps/pods", gpu_pod("infer", node.name, PLAIN_IMAGE))
        wait_pod(a, "apps", "infer", running, "Running", timeout=180)
        w.wait_recorded(PLAIN_IMAGE)
    finally:
        reg.stop()
    w.timings["documented_fix_test"] = time.monotonic() - t0
    print(f"the documented fix: {w.timings['documented_fix']:.1f} s from the docs' pull to validated "
          f"(the whole test {w.timings['documented_fix_test']:.1f} s); registry requests {len(reg.log)}")


# ----------------------------------------------------------------------------- under NVIDIA's upgrade state machine

GPU_OPERATOR = "gpu-operator"
DRIVER_DS = "nvidia-driver-daemonset"
CLUSTER_POLICY = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
STATE = "nvidia.com/gpu-driver-upgrade-state"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
#: k8s-operator-libs (validation_manager.go): the Unix time the node entered validation-required; it
#: marks the node upgrade-failed once now > that + validationTimeoutSeconds (600, a constant).
VALIDATION_START = "nvidia.com/gpu-driver-upgrade-validation-start-time"
VALIDATION_TIMEOUT_S = 600
TAINT_KEY = "compat-hook.io/validation-failed"
#: the states k8s-operator-libs counts as an upgrade in progress (GetUpgradesInProgress)
IN_PROGRESS = {"cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
               "pod-restart-required", "validation-required", "uncordon-required", "upgrade-failed"}
#: Pods with this label are the only ones the upgrade policy's drain evicts.
DRAIN = "compat-hook-test/drain"
#: How long the driver container's module reload takes here (unload at the old pod's deletion, load
#: in the new pod): a real one takes far longer. The validator's readiness probe (every 2 s) sees the
#: module gone before the new driver pod can be Ready.
RELOAD_S = 3.0
#: The GPU Operator's default operand toleration (ClusterPolicy spec.daemonsets.tolerations).
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
#: What docs/validation.md adds there. Without it the DaemonSet controller stops counting a tainted
#: node (desiredNumberScheduled), k8s-operator-libs' BuildState then fails for the whole cluster
#: ("driver DaemonSet should not have Unscheduled pods"), and a deleted driver pod never comes back.
TAINT_TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def driver_daemonset(version: str) -> dict:
    """The GPU Operator's driver DaemonSet (OnDelete) as the real kubelet can run it: its container
    is Ready only while the node's kernel module is its own version (its readiness probe reads the
    node's /proc/driver/nvidia/version); kwok makes the pods on its nodes Ready as they are."""
    probe = ["/bin/sh", "-c", 'grep -q " $DRIVER_VERSION " /host-driver/nvidia/version']
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": DRIVER_DS, "namespace": GPU_OPERATOR, "labels": {"app": DRIVER_DS}},
        "spec": {"selector": {"matchLabels": {"app": DRIVER_DS}}, "updateStrategy": {"type": "OnDelete"},
                 "template": {
                     "metadata": {"labels": {"app": DRIVER_DS},
                                  "annotations": {"nvidia.com/driver-version": version}},
                     "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                              "tolerations": [GPU_TOLERATION, TAINT_TOLERATION],
                              "terminationGracePeriodSeconds": 1,
                              "containers": [{
                                  "name": "nvidia-driver-ctr", "image": f"{BB}:pause", "imagePullPolicy": "Never",
                                  "command": ["/bin/sh", "-c", "exec sleep 100000"],
                                  "env": [{"name": "DRIVER_VERSION", "valueFrom": {"fieldRef": {
                                      "fieldPath": "metadata.annotations['nvidia.com/driver-version']"}}}],
                                  "readinessProbe": {"exec": {"command": probe}, "periodSeconds": 1,
                                                     "failureThreshold": 1},
                                  "volumeMounts": [{"name": "driver", "mountPath": "/host-driver",
                                                    "readOnly": True}]}],
                              "volumes": [{"name": "driver", "hostPath": {"path": "/proc/driver",
                                                                          "type": "Directory"}}]}}}}


class DriverPlay(threading.Thread):
    """What the driver container does on each node, which the harness's driver pods cannot: the old
    pod's deletion unloads the kernel module (the real node's /proc/driver/nvidia/version goes), and
    the new pod loads its version ``RELOAD_S`` later (the real node: :meth:`Node.set_driver`, the
    host's libcuda too; a kwok node: its fake host root). ``loaders``: node -> fn(version | None)."""

    def __init__(self, admin, loaders: dict, loaded: dict) -> None:
        super().__init__(daemon=True)
        self.admin, self.loaders = admin, loaders
        self.loaded = dict(loaded)  # node -> (pod uid, version) of the module loaded now
        self.unloaded_at: dict = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                self.step()
        except BaseException as e:  # reported by the test (join_checked)
            self.error = e

    def step(self) -> None:
        pods = self.admin.get(f"/api/v1/namespaces/{GPU_OPERATOR}/pods", labelSelector=f"app={DRIVER_DS}")["items"]
        live = {p["spec"].get("nodeName"): p for p in pods if not p["metadata"].get("deletionTimestamp")}
        for node, load in list(self.loaders.items()):
            pod, had = live.get(node), self.loaded.get(node)
            if had is not None and (pod is None or pod["metadata"]["uid"] != had[0]):
                load(None)  # the old driver pod is going: its module is unloaded
                self.loaded[node] = None
                self.unloaded_at[node] = time.monotonic()
            if pod is not None and self.loaded.get(node) is None and \
                    time.monotonic() - self.unloaded_at.get(node, 0) >= RELOAD_S:
                version = pod["metadata"]["annotations"]["nvidia.com/driver-version"]
                load(version)
                self.loaded[node] = (pod["metadata"]["uid"], version)

    def join_checked(self) -> None:
        self.stop.set()
        self.join(10)
        if self.error is not None:
            raise self.error


class Operator:
    """The GPU Operator's side on this cluster: its namespace, the driver DaemonSet (run by the real
    DaemonSet controller), the ClusterPolicy, NVIDIA's upgrade state machine with validation enabled
    (tests/upgrade_harness: ``WithValidationEnabled("app=nvidia-operator-validator")``, the
    operator's call) and the driver play."""

    def __init__(self, world: World, version: str) -> None:
        self.w, self.admin = world, world.admin
        self.version = version
        self.play: DriverPlay | None = None

    def start(self, policy: dict) -> None:
        a = self.admin
        a.create("/api/v1/namespaces", {"metadata": {"name": GPU_OPERATOR}})
        a.wait("the default ServiceAccount of gpu-operator", lambda: a.get(
            f"/api/v1/namespaces/{GPU_OPERATOR}/serviceaccounts/default"), timeout=60)
        a.create(f"/apis/apps/v1/namespaces/{GPU_OPERATOR}/daemonsets", driver_daemonset(self.version))
        a.create("/apis/nvidia.com/v1/clusterpolicies", {
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {"driver": {"version": self.version, "upgradePolicy": policy}}})
        self.w.cluster.start_harness(validation="app=nvidia-operator-validator", daemonset_controller=False)
        node = self.w.node
        self.play = DriverPlay(a, {node.name: self.load_real}, {})
        self.play.start()

    def load_real(self, version: str | None) -> None:
        node = self.w.node
        if version is None:
            node.path("/proc/driver/nvidia/version").unlink(missing_ok=True)
        else:
            node.set_driver(version)

    def set_version(self, version: str) -> None:
        self.admin.merge(CLUSTER_POLICY, {"spec": {"driver": {"version": version}}})
        self.version = version

    def driver_pods(self) -> dict:
        pods = self.admin.get(f"/api/v1/namespaces/{GPU_OPERATOR}/pods", labelSelector=f"app={DRIVER_DS}")["items"]
        return {p["spec"].get("nodeName"): p for p in pods if not p["metadata"].get("deletionTimestamp")}

    def node(self, name: str) -> dict:
        return self.admin.get(f"/api/v1/nodes/{name}")

    def state(self, name: str) -> str | None:
        return (self.node(name)["metadata"].get("labels") or {}).get(STATE)

    def wait_state(self, name: str, state: str, timeout: float = 120) -> None:
        try:
            self.admin.wait(f"{name} {state}", lambda: self.state(name) == state, timeout=timeout, interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.harness_log()}") from None

    def harness_log(self) -> str:
        f = self.w.cluster.work / "harness.log"
        return "--- harness.log (tail)\n" + (f.read_text(errors="replace")[-3000:] if f.exists() else "")


def _taint(node: dict) -> dict | None:
    return next((t for t in (node["spec"].get("taints") or []) if t["key"] == TAINT_KEY), None)


@pytest.fixture(scope="module")
def operator(world):
    """Started by the first test that needs it, on the driver the node has validated."""
    op = Operator(world, HOST_535)
    yield op
    if op.play is not None:
        op.play.join_checked()


def test_a_failed_validation_keeps_the_node_out_after_nvidias_controller_uncordons_it(world, operator):
    """NVIDIA's upgrade state machine with validation enabled rolls the real node's driver back to
    R470, which breaks a running workload (CUDA 12.4, no compat driver): the node waits in
    ``validation-required`` while compat-hook's validator fails and taints it.

    k8s-operator-libs gives up after 600 s: ``handleTimeout`` writes the Unix time the wait began in
    the Node annotation ``nvidia.com/gpu-driver-upgrade-validation-start-time`` on its first round
    in that state and compares ``now > start + 600`` on each later round (the timeout itself is a
    constant, ``validationTimeoutSeconds``). The test does not wait 10 minutes: once the validation
    has failed it writes that annotation 601 s in the past (state on the Node, the library's only
    clock), and the next round marks the node ``upgrade-failed``; ``ProcessUpgradeFailedNodes`` then
    uncordons it as its driver pod is Ready. From there the real scheduler and kubelet decide: a new
    GPU pod for the node stays Pending on compat-hook's taint until a validation passes.

    The fix is the driver rolled forward again, through the same state machine: the driver
    DaemonSet tolerates the taint (the ClusterPolicy's ``daemonsets.tolerations``, as
    docs/validation.md says), so its pod comes back on the tainted node; the validator passes, the
    taint goes, the controller uncordons the node and the pod schedules."""
    w, op, a = world, operator, world.admin
    node = w.node.name
    t_start = time.monotonic()
    # where the story left the node: R470, failed. The fleet's driver before this test: R535, validated.
    w.node.set_driver(HOST_535)
    a.wait("validated=535", lambda: w.label() == HOST_535, timeout=180, interval=0.5)
    assert _taint(op.node(node)) is None
    op.start({"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": "100%",
              "drain": {"enable": True, "force": True, "podSelector": f"{DRAIN}=true", "timeoutSeconds": 0}})
    op.wait_state(node, "upgrade-done", timeout=120)  # the first round: in sync, validated

    seen: list = []

    def record(n: dict | None = None) -> dict:
        """The Node now (one read), its upgrade state appended to ``seen`` when it changed."""
        n = n or op.node(node)
        s = (n["metadata"].get("labels") or {}).get(STATE)
        if not seen or seen[-1] != s:
            seen.append(s)
        return n

    op.set_version(HOST_470)
    def failed_in_validation() -> bool:
        n = record()
        return (n["metadata"].get("labels") or {}).get(LABEL) == "failed" and seen[-1] == "validation-required"

    a.wait("validation-required, then the validator's failure", failed_in_validation, timeout=180, interval=0.2)
    assert w.node.driver == HOST_470 and not w.validator_ready()
    n = op.node(node)
    assert n["spec"].get("unschedulable") is True, n["spec"]
    assert _taint(n) == {"key": TAINT_KEY, "value": HOST_470, "effect": "NoSchedule"}, n["spec"]
    # the library's clock: written on its first round with the validator not Ready
    a.wait("the validation start time",
           lambda: VALIDATION_START in (op.node(node)["metadata"].get("annotations") or {}),
           timeout=30, interval=0.2)
    started = int(op.node(node)["metadata"]["annotations"][VALIDATION_START])
    assert abs(started - time.time()) < 60, started
    a.merge(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {
        VALIDATION_START: str(int(time.time()) - VALIDATION_TIMEOUT_S - 1)}}})
    def uncordoned() -> bool:
        n = record()
        return seen[-1] == "upgrade-done" and not n["spec"].get("unschedulable")

    a.wait("upgrade-failed, then uncordoned", uncordoned, timeout=60, interval=0.1)
    assert "upgrade-failed" in seen and seen[seen.index("upgrade-failed") - 1:] in (
        ["validation-required", "upgrade-failed", "upgrade-done"],
                         ["validation-required", "upgrade-failed", "uncordon-required", "upgrade-done"]), seen
    assert VALIDATION_START not in (op.node(node)["metadata"].get("annotations") or {})
    # uncordoned on a failed validation, exactly as NVIDIA's controller does; the taint stays
    n = op.node(node)
    assert _taint(n) is not None and w.label() == "failed", n["spec"]

    # the node lifecycle controller takes its cordon taint off a moment after the uncordon: then ours is the only one
    ours = [{"key": TAINT_KEY, "value": HOST_470, "effect": "NoSchedule"}]
    a.wait("compat-hook's taint the node's only one", lambda: op.node(node)["spec"].get("taints") == ours,
           timeout=30, interval=0.2)
    # a new GPU pod for this node: the real scheduler keeps it off
    late = gpu_pod("late", node, PLAIN_IMAGE)
    del late["spec"]["nodeName"]
    late["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    a.create("/api/v1/namespaces/apps/pods", late)

    def unschedulable():
        p = a.get("/api/v1/namespaces/apps/pods/late")
        c = {c["type"]: c for c in p["status"].get("conditions") or []}.get("PodScheduled")
        return c if c and c["status"] == "False" and c.get("reason") == "Unschedulable" else None

    cond = a.wait("late Unschedulable", unschedulable, timeout=60, interval=0.2)
    # the scheduler of v1.34 says "untolerated taint(s)" without naming it: the node's only taint is ours
    assert "1 node(s) had untolerated taint" in cond["message"], cond
    assert op.node(node)["spec"]["taints"] == ours
    evs = a.get("/api/v1/namespaces/apps/events", fieldSelector="involvedObject.name=late,reason=FailedScheduling")
    assert any("untolerated taint" in e["message"] for e in evs["items"]), evs["items"]
    for _ in range(10):  # and it stays so: uncordoned, tainted, nothing binds it
        p = a.get("/api/v1/namespaces/apps/pods/late")
        assert not p["spec"].get("nodeName") and p["status"]["phase"] == "Pending", p["status"]
        assert not op.node(node)["spec"].get("unschedulable")
        time.sleep(0.5)

    # the driver DaemonSet tolerates the taint (docs/validation.md): it still counts the node, so NVIDIA's
    # BuildState (desiredNumberScheduled == its pods) goes on, and the fix's driver pod can come back
    ds = a.get(f"/apis/apps/v1/namespaces/{GPU_OPERATOR}/daemonsets/{DRIVER_DS}")
    assert ds["status"]["desiredNumberScheduled"] == 1, ds["status"]

    # the fix: the driver rolled forward to R535 again
    k = len(seen)
    op.set_version(HOST_535)
    t_fix = time.monotonic()
    history: list = []

    def fixed():
        n, p = record(), a.get("/api/v1/namespaces/apps/pods/late")
        history.append((_taint(n) is not None, bool(n["spec"].get("unschedulable")), p["spec"].get("nodeName")))
        return running(p)

    a.wait("late Running on the fixed node", fixed, timeout=180, interval=0.2)
    # never bound while the taint was on; the taint went with the pass
    assert all(not bound for tainted, _, bound in history if tainted), history
    assert any(tainted for tainted, _, _ in history), history
    assert w.label() == HOST_535 and _taint(op.node(node)) is None
    assert "validation-required" in seen[k:], seen
    op.wait_state(node, "upgrade-done", timeout=60)
    a.delete("/api/v1/namespaces/apps/pods/late", gracePeriodSeconds="0")
    w.timings["harness_failed_validation"] = time.monotonic() - t_start
    w.timings["harness_fix"] = time.monotonic() - t_fix
    print("states:", seen)


# ----------------------------------------------------------------------------- the whole rolling upgrade

FLEET = "compat-hook-test/fleet"
KWOK_NODES = [f"kwok-{i}" for i in range(1, 7)]
#: the kwok node whose pod regresses on the new driver (the agents' gate holds it)
HELD = KWOK_NODES[-1]
REPLICAS, MIN_AVAILABLE = 6, 5


def _evictions(cluster) -> dict:
    """``{code: n}`` of the API server's own count of pod eviction requests (201 done, 429 refused by
    the PodDisruptionBudget)."""
    text = cluster.admin.request("GET", "/metrics", timeout=30).get("text", "")
    out: dict = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'subresource="eviction"' in line and 'verb="POST"' in line:
            code = line.split('code="')[1].split('"')[0]
            out[code] = out.get(code, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def test_the_whole_rolling_upgrade_under_nvidias_state_machine(world, operator, tmp_path):
    """R535 -> R555 over the real node and six kwok nodes, by NVIDIA's upgrade state machine with
    validation enabled and ``maxParallelUpgrades: 2``, the runbook's way (docs/cluster.md): the
    target announced first, the agents' verdicts in, then applied.

    * the real node runs the chart (agent, validator) on its kubelet; its validator really probes
      the node's workloads on the new driver;
    * each kwok node runs compat-hook's agent as a process with the gate on, its own fake host root
      (``/proc/driver/nvidia/version``) and the token of the chart's agent pod kwok runs there (so the
      chart's admission policies apply to it as to a real agent). kwok marks the chart's validator
      pods Ready as they are: on kwok nodes validation passes without probes, only NVIDIA's state
      machine's wait for them is real;
    * a Deployment of 6 GPU pods spread over the kwok nodes, with a PodDisruptionBudget of
      ``minAvailable: 5``, which the drain must respect;
    * one regressing workload on one kwok node (a compat 550 image whose pod names the compat dir on
      ``LD_LIBRARY_PATH`` through the NVIDIA runtime alone: the 550 compat library over a 555 kernel
      module). Its agent holds the node.

    The state labels and the Deployment's Ready pods are polled through the whole rollout: never
    more than 2 nodes upgrading, never fewer than 5 pods available. Every node but the held one ends
    on R555, validated; the held one stays on R535 with its hold."""
    from tests.support import debs
    from tests.support.gpucluster import build_store, gpu_node, ref, set_node_driver
    from tests.support.gpucluster import gpu_pod as kwok_gpu_pod
    from tests.support.hookenv import write_config
    from tests.support.kube import ADMIN_TOKEN
    from tests.support.toolkit import noted_compat_lib
    from tests.support.versions import COMPAT_550

    w, op, a, cluster = world, operator, world.admin, world.cluster
    real = w.node.name
    nodes = [real, *KWOK_NODES]
    t_setup = time.monotonic()
    if op.play is None:  # this test alone (-k): the operator as the previous test leaves it
        w.node.set_driver(HOST_535)
        op.start({"autoUpgrade": True, "maxParallelUpgrades": 2, "maxUnavailable": "100%",
                  "drain": {"enable": True, "force": True, "podSelector": f"{DRAIN}=true", "timeoutSeconds": 0}})
    a.merge(CLUSTER_POLICY, {"spec": {"driver": {"upgradePolicy": {"maxParallelUpgrades": 2}}}})
    op.wait_state(real, "upgrade-done", timeout=120)
    a.wait("validated=535", lambda: w.label() == HOST_535, timeout=180, interval=0.5)

    # the kwok fleet
    cluster.start_kwok(node_lease_s=40)  # the controller-manager's node lifecycle controller watches them
    store = build_store(tmp_path / "store", ["train", "infer"],
                        {"noted": noted_compat_lib(debs.libcuda(COMPAT_550), tmp_path / "noted")})
    a.create("/apis/node.k8s.io/v1/runtimeclasses", {"metadata": {"name": "nvidia"}, "handler": "nvidia"})
    hosts = {}
    for name in KWOK_NODES:
        n = gpu_node(name, deploy_driver=True)
        n["metadata"]["labels"].update({"kubernetes.io/os": "linux", FLEET: "kwok"})
        a.create("/api/v1/nodes", n)
        hosts[name] = set_node_driver(a, tmp_path / "hosts" / name, name, HOST_535)

    def kwok_loader(name):
        def load(version):
            if version is None:
                (hosts[name] / "proc/driver/nvidia/version").unlink(missing_ok=True)
            else:
                set_node_driver(a, hosts[name], name, version)
        return load

    for name in KWOK_NODES:
        op.play.loaders[name] = kwok_loader(name)

    def chart_pod(name: str, node: str) -> dict | None:
        pods = a.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"app.kubernetes.io/name={name}",
                      fieldSelector=f"spec.nodeName={node}")["items"]
        return next((p for p in pods if ready(p) and not p["metadata"].get("deletionTimestamp")), None)

    a.wait("the chart's agent and validator Ready on the kwok nodes (kwok's)", lambda: all(
        chart_pod("compat-hook", n) and chart_pod("compat-hook-validator", n) for n in KWOK_NODES),
        timeout=120, interval=0.5)
    for name in KWOK_NODES:
        op.wait_state(name, "upgrade-done", timeout=120)

    # the workloads: a Deployment under a PodDisruptionBudget, and the regressing pod
    a.create("/apis/apps/v1/namespaces/apps/deployments", {
        "metadata": {"name": "web"},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web", DRAIN: "true"}},
                              "spec": {"nodeSelector": {FLEET: "kwok"}, "runtimeClassName": "cuda-compat",
                                       "terminationGracePeriodSeconds": 0,
                                       "topologySpreadConstraints": [{
                                           "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "ScheduleAnyway",
                                           "labelSelector": {"matchLabels": {"app": "web"}}}],
                                       "containers": [{"name": "main", "image": ref("infer"),
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    a.create("/apis/policy/v1/namespaces/apps/poddisruptionbudgets", {
        "metadata": {"name": "web"}, "spec": {"minAvailable": MIN_AVAILABLE,
                                              "selector": {"matchLabels": {"app": "web"}}}})
    a.create("/api/v1/namespaces/apps/pods", kwok_gpu_pod(
        "legacy-train", HELD, ref("train"), runtime_class="nvidia",
        env=[("LD_LIBRARY_PATH", "/usr/local/cuda/compat")]))

    def web_pods() -> list:
        return a.get("/api/v1/namespaces/apps/pods", labelSelector="app=web")["items"]

    a.wait("the Deployment available", lambda: a.get("/apis/apps/v1/namespaces/apps/deployments/web")["status"].get(
        "availableReplicas") == REPLICAS, timeout=120, interval=0.5)
    a.wait("the PDB allows one disruption", lambda: a.get("/apis/policy/v1/namespaces/apps/poddisruptionbudgets/web")[
        "status"].get("disruptionsAllowed") == 1, timeout=60, interval=0.5)
    spread = sorted(p["spec"].get("nodeName") for p in web_pods())
    assert set(spread) <= set(KWOK_NODES) and len(set(spread)) >= 4, spread

    # the agents, one per kwok node, as the chart's agent pod there would run them
    config = write_config(tmp_path / "agent.yaml", host_root=tmp_path, log_file=tmp_path / "decisions.log", nvml="off",
                          cluster={"gate_upgrade": True})
    agents = {}
    try:
        for name in KWOK_NODES:
            pod = chart_pod("compat-hook", name)
            token = a.create(f"/api/v1/namespaces/{NS}/serviceaccounts/compat-hook/token", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600, "boundObjectRef": {
                    "kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"]}}})["status"]["token"]
            log = (tmp_path / f"agent-{name}.log").open("wb")
            agents[name] = subprocess.Popen(
                ["/usr/bin/python3", "-m", "compat_hook", "cluster", "agent", "--node", name, "--interval", "30",
                 "--kubeconfig", str(cluster.kubeconfig(token, f"agent-{name}")), "--store", f"oci:{store}",
                 "--host-root", str(hosts[name]), "--config", str(config),
                 "--state-dir", str(tmp_path / "state" / name)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def agent_logs() -> str:
            return "\n".join(f"--- agent {n}: " + (tmp_path / f"agent-{n}.log").read_text(errors="replace")[-1500:]
                             for n in KWOK_NODES)

        def labels(name: str) -> dict:
            return op.node(name)["metadata"].get("labels") or {}

        # 1. announce R555: every agent judges it; the regressing node is held
        a.merge(CLUSTER_POLICY, {"metadata": {"annotations": {"compat-hook.io/next-driver": HOST_555}}})
        try:
            a.wait("every node's verdict for 555, the held node held", lambda: all(
                labels(n).get("compat-hook.io/preflight.target-driver") == HOST_555 for n in nodes)
                and labels(HELD).get(SKIP) == "true", timeout=120, interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{agent_logs()}") from None
        verdicts = {n: labels(n).get("compat-hook.io/preflight") for n in nodes}
        assert verdicts[HELD] == "fail", verdicts
        assert all(v in ("pass", "warn") for n, v in verdicts.items() if n != HELD), verdicts
        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "status", "--json", "--kubeconfig",
                            str(cluster.kubeconfig(ADMIN_TOKEN, "admin")), "--config", str(config)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 3 and json.loads(p.stdout)["summary"]["held"] == 1, p.stdout + p.stderr
        setup_s = time.monotonic() - t_setup

        # 2. apply it, and watch the whole rollout
        ev0 = _evictions(cluster)
        t0 = time.monotonic()
        op.set_version(HOST_555)
        states: dict = {n: [] for n in nodes}
        max_parallel, min_ready, evicted = 0, REPLICAS, set()
        parallel_at: list = []
        timeline: list = []
        names_seen: set = set()

        def driver_of(n: str) -> str | None:
            if n == real:
                return w.node.driver
            f = hosts[n] / "proc/driver/nvidia/version"
            return f.read_text().split()[7] if f.exists() else None

        def not_done() -> list:
            """What is still missing: every node but the held one upgrade-done after a validation, its
            driver pod of R555 Ready and R555 loaded; the real node validated by its validator."""
            pods, left = op.driver_pods(), []
            for n in nodes:
                if n == HELD:
                    continue
                pod = pods.get(n) or {"metadata": {}}
                version = (pod["metadata"].get("annotations") or {}).get("nvidia.com/driver-version")
                if states[n][-1:] != ["upgrade-done"] or "validation-required" not in states[n]:
                    left.append((n, states[n][-1:]))
                elif version != HOST_555 or not ready(pod) or driver_of(n) != HOST_555:
                    left.append((n, version, ready(pod), driver_of(n)))
            if w.label() != HOST_555 or not w.validator_ready():
                left.append(("validator", w.label(), w.validator_ready()))
            return left

        deadline = time.monotonic() + 400
        while True:
            current = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(STATE)
                       for n in a.get("/api/v1/nodes")["items"] if n["metadata"]["name"] in states}
            for n, s in current.items():
                if states[n][-1:] != [s]:
                    states[n].append(s)
                    timeline.append((round(time.monotonic() - t0, 1), n, s))
            upgrading = sorted(n for n, s in current.items() if s in IN_PROGRESS)
            if len(upgrading) > max_parallel:
                max_parallel = len(upgrading)
            parallel_at.append(len(upgrading))
            pods = web_pods()
            live_ready = [p for p in pods if ready(p) and not p["metadata"].get("deletionTimestamp")]
            live_names = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
            evicted |= names_seen - live_names  # gone (terminationGracePeriodSeconds 0: at once)
            names_seen |= live_names
            min_ready = min(min_ready, len(live_ready))
            assert len(upgrading) <= 2, (upgrading, current)
            assert len(live_ready) >= MIN_AVAILABLE, (
                round(time.monotonic() - t0, 1), timeline[-6:],
                [(p["metadata"]["name"], p["spec"].get("nodeName"), p["metadata"]["creationTimestamp"],
                  p["metadata"].get("deletionTimestamp"), p["status"].get("phase"),
                  [(c["type"], c["status"], c.get("lastTransitionTime")) for c in p["status"].get("conditions") or []])
                 for p in pods],
                a.get("/apis/policy/v1/namespaces/apps/poddisruptionbudgets/web")["status"])
            assert current[HELD] in ("upgrade-done", "upgrade-required"), states[HELD]  # parked, never further
            assert op.play.error is None, op.play.error
            left = not_done()
            if not left:
                break
            assert time.monotonic() < deadline, f"rollout not done: {left} {states}\n{op.harness_log()}"
            time.sleep(0.3)
        took = time.monotonic() - t0
        ev = {code: n - ev0.get(code, 0) for code, n in _evictions(cluster).items()}

        # 3. where it ended
        held = op.node(HELD)
        assert states[HELD] == ["upgrade-done", "upgrade-required"], states[HELD]
        assert held["metadata"]["labels"][SKIP] == "true", held["metadata"]
        assert "compat-hook.io/holds-upgrade" in held["metadata"]["annotations"], held["metadata"]
        assert driver_of(HELD) == HOST_535 and not held["spec"].get("unschedulable")
        assert op.driver_pods()[HELD]["metadata"]["annotations"]["nvidia.com/driver-version"] == HOST_535
        for n in nodes:
            node = op.node(n)
            assert not node["spec"].get("unschedulable") and _taint(node) is None, (n, node["spec"])
        st = w.state()
        assert st["driver"] == HOST_555 and st["result"] == "pass", st  # the real node's probes ran on 555
        assert max_parallel == 2, parallel_at
        assert min_ready >= MIN_AVAILABLE and ev.get("201", 0) >= 1, (min_ready, ev)
        a.wait("the Deployment available again", lambda: a.get("/apis/apps/v1/namespaces/apps/deployments/web")[
            "status"].get("availableReplicas") == REPLICAS, timeout=60, interval=0.5)
        for n, proc in agents.items():
            assert proc.poll() is None, (n, agent_logs())
        w.timings["rolling_setup"] = setup_s
        w.timings["rolling_upgrade"] = took
        print(f"rolling upgrade {HOST_535} -> {HOST_555} over {len(nodes)} nodes ({len(nodes) - 1} upgraded, "
              f"{HELD} held): {took:.1f} s after the version was applied (setup {setup_s:.1f} s); "
              f"at most {max_parallel} nodes upgrading at once; evictions {ev.get('201', 0)} done, "
              f"{ev.get('429', 0)} refused by the PDB; pods evicted {len(evicted)}; "
              f"at least {min_ready}/{REPLICAS} Ready (max unavailable {REPLICAS - min_ready})")
        print("timeline (s after the version was applied, node, state):", timeline)
        print("validation timings (s):", {k: round(v, 1) for k, v in w.timings.items()})
    finally:
        for proc in agents.values():
            proc.terminate()
        for proc in agents.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
