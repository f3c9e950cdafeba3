"""The chart with its defaults on a real Kubernetes node whose containerd 2.x runs the GPU Operator's CDI mode.

Since gpu-operator v25.10 the NVIDIA Container Toolkit runs in CDI mode: ``nvidia`` is not
containerd's default runtime, the device plugin answers with CDI device names, containerd applies
the CDI spec itself and the pod runs on plain runc. A pod that only requests ``nvidia.com/gpu``
names no RuntimeClass, so only an NRI plugin brings compat-hook's hook to it.

One real single-node cluster for the module (tests/support/node.py): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and a kubelet v1.34.2 on Debian sid's containerd 2.1.9, then
the whole story again on upstream's v2.4.2 (``CONTAINERDS``, ``containerd_bin``), set up as the operator sets it up in CDI mode: ``enable_cdi``, the default
runtime plain runc, NRI on (2.x's default). Its GPU is a **GeForce** (the fake
``/proc/driver/nvidia``, the only fake) on the 535 driver. The CDI spec for ``nvidia.com/gpu``
in ``/var/run/cdi`` carries what the toolkit generates: the device node, the driver's real Debian
``libcuda.so.535`` mounted from the driver root, ``NVIDIA_VISIBLE_DEVICES=void`` and the
toolkit's real v1.20.2 ``nvidia-cdi-hook`` hooks (create-symlinks, enable-cuda-compat,
update-ldcache: tests/support/toolkit.py). A minimal device plugin (tests/support/deviceplugin.py)
registers ``nvidia.com/gpu`` with the kubelet and answers ``Allocate`` with the CDI name
``nvidia.com/gpu=0`` only.

The story, in order (the tests share the cluster and run in file order):

1. without compat-hook, a pod that requests ``nvidia.com/gpu: 1`` with a CUDA 12.4 image that
   carries the compat 550 driver loads the compat library: the toolkit's ``enable-cuda-compat``
   turns it on without looking at the GPU's brand (a GeForce cannot use it);
2. ``helm install`` with the chart's defaults (docs/cluster.md): the installer sees that the
   node's containerd runs NRI and installs the plugin from its payload. The Node label says
   ``nri-not-connected`` (``cluster status``: ``nri (not connected)``) until containerd's
   restart (the docs' step) starts the plugin, then ``nri``;
3. the same pod, still with no ``runtimeClassName``, gets compat-hook's decision: the hook the
   plugin added ran after the toolkit's and the container loads the host's library
   (``device_consumer``), as the node's decision log says;
4. the plugin killed: the label says ``nri-not-connected`` again and a GPU pod starts without
   compat-hook (fail-open: the compat library); containerd's restart starts the plugin again, the
   label says ``nri`` and the next pod gets the decision;
5. on containerd 2.2 and later, ``registration.nriRequire=per-pod``: with the plugin killed, a GPU pod that
   requires it is refused with a Warning Event, the others start, and it starts once the plugin is back;
6. uninstalled as docs/engines.md says (``registration.uninstallOnStop=true``, ``helm uninstall``,
   containerd's restart), the plugin is gone and the same pod loads the compat library again.

What a container really loads is what tests/support/probe.c, run in it, says.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.support import deviceplugin, engines, kubebuild
from tests.support import node as nodemod
from tests.support import toolkit as tks
from tests.support.node import probe_result, ready, wait_pod
from tests.support.versions import COMPAT_550, HOST_535

pytestmark = [pytest.mark.containers, pytest.mark.slow]

NS = nodemod.RELEASE_NAMESPACE
PREFIX = "compat-hook.io"
BB = "docker.io/library/bb"
COMPAT_IMAGE = f"{BB}:compat"
GEFORCE = "NVIDIA GeForce RTX 4090"
COMPAT_LIB = f"/usr/local/cuda-12.4/compat/libcuda.so.{COMPAT_550}"
#: The host's library as the CDI spec mounts it (libcuda.so.1 is the toolkit's create-symlinks link to it).
HOST_LIB = f"/{nodemod.HOST_LIB_DIR}/libcuda.so.{HOST_535}"
#: cuDriverGetVersion of Debian's builds (tests/support/debs.py EXPECTED_CUDA).
CUDA = {HOST_535: "12020", COMPAT_550: "12040"}
#: Where the toolkit writes its generated spec on a GPU Operator node (containerd's default CDI dirs).
CDI_SPEC = "/var/run/cdi/nvidia.json"
PLUGIN = "/opt/nri/plugins/90-compat-hook"


def cdi_spec(tk: tks.Toolkit) -> dict:
    """``nvidia.com/gpu=0`` as nvidia-ctk generates it for the node's 535 driver (the driver root's libcuda)."""
    lib = f"{nodemod.DRIVER_ROOT}/{nodemod.HOST_LIB_DIR}/libcuda.so.{HOST_535}"
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "0", "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]}}],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                               "mounts": tks.cdi_mounts(lib, HOST_535), "hooks": tks.cdi_hooks(tk, HOST_535)}}


class World:
    def __init__(self, cluster, node, plugin, timings) -> None:
        self.cluster, self.node, self.admin, self.plugin = cluster, node, cluster.admin, plugin
        self.timings = timings

    def labels(self) -> dict:
        return self.admin.get(f"/api/v1/nodes/{self.node.name}")["metadata"].get("labels") or {}

    def ds_pod(self) -> dict:
        pods = self.admin.get(f"/api/v1/namespaces/{NS}/pods", labelSelector="app.kubernetes.io/name=compat-hook")
        live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == 1, [p["metadata"]["name"] for p in live]
        return live[0]

    def decisions(self) -> list:
        """compat-hook's decision log on the node (the chart's config: /var/log/compat-hook.log)."""
        f = self.node.path("/var/log/compat-hook.log")
        if not f.exists():
            return []
        return [json.loads(ln) for ln in f.read_text().splitlines() if ln.startswith("{")]

    def registration(self, want: str, timeout: float = 90) -> None:
        """Wait for the Node label to say ``want`` (the installer checks every 30 s, the agent passes every 10 s)."""
        key = f"{PREFIX}/registration"
        try:
            self.admin.wait(f"{key}={want}", lambda: self.labels().get(key) == want, timeout=timeout, interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}: {self.labels().get(key)}") from None

    def status(self) -> tuple:
        """``compat-hook cluster status --json`` as the cluster admin: ``(exit status, this node's row)``."""
        import subprocess

        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "status", "--json", "--kubeconfig",
                            str(self.cluster.kubeconfig(nodemod.ADMIN_TOKEN, "admin")),
                            "--config", str(nodemod.REPO / "config" / "compat-hook.yaml")],
                           cwd=nodemod.REPO, capture_output=True, text=True, timeout=120, env=nodemod.ENV)
        assert "Traceback" not in p.stderr, p.stderr
        (row,) = [n for n in json.loads(p.stdout)["nodes"] if n["name"] == self.node.name]
        return p.returncode, row

    def plugin_pids(self) -> list:
        """The node's processes of the NRI plugin: containerd starts it with its path as argv[0]."""
        out = []
        for pid in self.node.processes():
            try:
                if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0] == PLUGIN.encode():
                    out.append(pid)
            except OSError:
                pass
        return out

    def plugin_starts(self) -> int:
        """How often containerd has registered compat-hook's pre-registered NRI plugin (one line of its log each;
        the PID there is containerd's own, the peer of the socket pair it hands the plugin)."""
        text = (self.node.work / "containerd.log").read_text(errors="replace")
        return len(re.findall(r'pre-connected:90-compat-hook\[\d+\]\\?" registered as', text))

    def gpu_pod(self, name: str) -> tuple:
        """A pod that requests ``nvidia.com/gpu: 1`` and names no RuntimeClass, runs the probe and ends:
        ``(probe output, its container's id, the device plugin's allocations for it)``."""
        before = len(self.plugin.allocations())
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "apps"},
               "spec": {"nodeName": self.node.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": COMPAT_IMAGE, "imagePullPolicy": "Never",
                                        "command": ["probe"],
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        self.admin.create("/api/v1/namespaces/apps/pods", pod)
        done = wait_pod(self.admin, "apps", name, lambda p: (p.get("status") or {}).get("phase") in
                        ("Succeeded", "Failed"), "ended", timeout=180)
        log = self.node.pod_log("apps", name)
        assert done["status"]["phase"] == "Succeeded", (done["status"], log)
        (cs,) = done["status"]["containerStatuses"]
        self.admin.delete(f"/api/v1/namespaces/apps/pods/{name}", gracePeriodSeconds="0")
        return probe_result(log), cs["containerID"].split("//", 1)[1], self.plugin.allocations()[before:]


#: Debian sid's containerd 2.1.9, and upstream's newest 2.x (since 2.3 it hands an NRI plugin the CDI names
#: and applies their edits after NRI): the chart's defaults reach a plain GPU pod on both.
CONTAINERDS = ("sid-2.1", kubebuild.CONTAINERD_RELEASES[-1])


@pytest.fixture(scope="module", params=CONTAINERDS)
def world(request, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"node-cdi-{request.param}")
    timings = {}
    t0 = time.monotonic()
    image = nodemod.project_image()
    images = nodemod.workload_images(work / "images")
    tk = tks.ensure()
    timings["images"] = time.monotonic() - t0
    cluster = nodemod.Cluster(work / "cp")
    bin_dir = engines.containerd2() if request.param == "sid-2.1" else kubebuild.containerd_release(request.param)
    node = nodemod.Node(work / "node", cluster, pause_image=f"{BB}:pause", containerd_bin=bin_dir, gpu_model=GEFORCE)
    plugin = left = code = None
    try:
        t = time.monotonic()
        cluster.start()
        node.start(HOST_535)
        timings["cluster"] = time.monotonic() - t
        node.import_image(images, BB)
        node.import_image(image, "localhost/compat-hook")  # docs/engines.md: on each node, no registry
        cluster.host_network_shim()
        spec = node.path("/run/cdi/nvidia.json")  # (/var/run is a link: followed here it would leave the node)
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(json.dumps(cdi_spec(tk), indent=2) + "\n")
        plugin = deviceplugin.Plugin(node, work / "deviceplugin")
        cluster.admin.wait("nvidia.com/gpu allocatable", lambda: cluster.admin.get(f"/api/v1/nodes/{node.name}")[
            "status"].get("allocatable", {}).get("nvidia.com/gpu") == "1", timeout=60, interval=0.3)
        timings["ready"] = time.monotonic() - t0
        yield World(cluster, node, plugin, timings)
    finally:
        try:
            code = plugin.stop() if plugin else 0
        finally:
            left = nodemod.stop_all(cluster, node, work, ("node/kubelet.log", "node/containerd.log",
                                                          "deviceplugin/deviceplugin.log"), timings, t0, "node-cdi")
    assert code == 0, plugin.text()[-2000:]  # the device plugin ended on SIGTERM
    # nothing of the node outlives it: no mount under the test's dir, no process, no bridge
    assert left is not None and left["mounts"] == [] and left["processes"] == [] and not left["bridge"], left


def test_the_node_runs_containerd_2_in_cdi_mode(world):
    version = world.node.run("containerd", "--version").stdout.split()[2]
    assert version.lstrip("v").startswith("2."), version
    dump = world.node.run("containerd", "--config", "/etc/containerd/config.toml", "config", "dump").stdout
    import tomllib

    cfg = tomllib.loads(dump)["plugins"]
    runtime = cfg["io.containerd.cri.v1.runtime"]
    # (2.4 has no switch: CDI is always on, its own default config names only cdi_spec_dirs)
    assert runtime.get("enable_cdi", True) is True and runtime["containerd"]["default_runtime_name"] == "runc"
    assert cfg["io.containerd.nri.v1.nri"]["disable"] is False  # 2.x's default
    assert CDI_SPEC.rsplit("/", 1)[0] in runtime["cdi_spec_dirs"], runtime["cdi_spec_dirs"]


def test_without_compat_hook_the_toolkits_hook_turns_compat_on_blindly(world):
    """A GeForce cannot use a compat driver; the toolkit's enable-cuda-compat turns it on all the same."""
    got, cid, allocated = world.gpu_pod("toolkit-alone")
    assert allocated == [["nvidia.com/gpu=0"]], allocated  # the GPU came from the device plugin, as a CDI name
    assert got == {"cuDriverGetVersion": CUDA[COMPAT_550], "libcuda": COMPAT_LIB}, got
    assert [r for r in world.decisions() if r.get("container_id") == cid] == []
    assert not world.node.path(PLUGIN).exists()


def test_helm_install_with_defaults_takes_the_nri_path(world):
    t = time.monotonic()
    # docs/cluster.md "Install" (a short agent interval so that the label comes within seconds)
    world.node.helm("install", "compat-hook", nodemod.CHART, "-n", NS, "--create-namespace",
                    "--set", "agent.interval=10")
    world.admin.wait("the DaemonSet Ready", lambda: world.admin.get(
        f"/apis/apps/v1/namespaces/{NS}/daemonsets/compat-hook")["status"].get("numberReady") == 1,
        timeout=300, interval=0.5)
    world.timings["install_to_ready"] = time.monotonic() - t
    pod = world.ds_pod()
    assert ready(pod)
    log = world.node.pod_log(NS, pod["metadata"]["name"], "installer")
    # registration.path=auto (the default): the node's containerd 2.x runs NRI, the plugin comes from the payload
    assert "RuntimeClass path" not in log, log
    assert "ready: NRI plugin 90-compat-hook and runtime 'cuda-compat'" in log, log
    plugin = world.node.path(PLUGIN)
    assert plugin.is_file() and plugin.stat().st_mode & 0o111
    conf = json.loads(world.node.path("/etc/nri/conf.d/90-compat-hook.conf").read_text())
    assert conf["hook"]["args"][-2:] == ["--via", "nri"], conf
    # containerd reads its plugin dir at start only: the docs' restart (registration.restartContainerd is off)
    assert "containerd not restarted (RESTART_CONTAINERD=false)" in log, log
    assert world.plugin_starts() == 0
    # installed, not yet running: the label says so until containerd's restart, and so does cluster status
    world.registration("nri-not-connected")
    log = world.node.pod_log(NS, pod["metadata"]["name"], "installer")
    assert f"warning: no process of the NRI plugin {PLUGIN} runs" in log, log
    rc, row = world.status()
    assert rc == 2 and row["path"] == "nri (not connected)", row
    world.node.restart_containerd()
    world.admin.wait("containerd started the plugin", lambda: world.plugin_starts() == 1, timeout=30, interval=0.2)
    world.registration("nri")
    assert f"the NRI plugin {PLUGIN} runs: connected again" in world.node.pod_log(
        NS, pod["metadata"]["name"], "installer")
    rc, row = world.status()
    assert row["path"] == "nri", row


def _decided_by_compat_hook(world, name: str, got: dict, cid: str) -> None:
    """The probe loaded the host's library, and the node's log has the one decision of the hook the plugin
    added to pod ``name``'s container: the GeForce's, after the toolkit's hook had turned compat on."""
    assert got == {"cuDriverGetVersion": CUDA[HOST_535], "libcuda": HOST_LIB}, got
    recs = [r for r in world.decisions() if r.get("container_id") == cid]
    assert [(r["event"], r.get("via"), r["decision"], r["reason"], r["effect"]) for r in recs] == \
        [("hook", "nri", "skip", "device_consumer", "host")], recs
    (rec,) = recs
    assert (rec["pod"], rec["namespace"], rec["maps"]) == (name, "apps", HOST_LIB), rec
    assert [g for g in rec["gpus_checked"]["gpus"] if GEFORCE in g], rec["gpus_checked"]
    # the toolkit's enable-cuda-compat ran first (its drop-in); compat-hook's is read before it
    assert [d for d in rec["compat_dropins"] if d.endswith("(nvidia-toolkit)")], rec["compat_dropins"]


def test_a_gpu_pod_without_runtime_class_gets_the_decision(world):
    """The toolkit's hook still turns compat on; compat-hook's, after it, has the last word: the host's library."""
    got, cid, allocated = world.gpu_pod("routed")
    assert allocated == [["nvidia.com/gpu=0"]], allocated
    _decided_by_compat_hook(world, "routed", got, cid)


def test_a_killed_plugin_shows_as_not_connected_until_containerd_restarts(world):
    """containerd drops a plugin that died until its own restart; GPU containers start without compat-hook
    meanwhile (fail-open), and the Node label says so."""
    (pid,) = world.plugin_pids()
    os.kill(pid, signal.SIGKILL)
    world.registration("nri-not-connected")
    rc, row = world.status()
    assert rc == 2 and row["path"] == "nri (not connected)", row
    got, cid, _ = world.gpu_pod("plugin-killed")
    assert got == {"cuDriverGetVersion": CUDA[COMPAT_550], "libcuda": COMPAT_LIB}, got  # the toolkit's alone
    assert [r for r in world.decisions() if r.get("container_id") == cid] == []


def test_after_a_containerd_restart_the_next_pod_gets_the_decision_again(world):
    world.node.restart_containerd()
    world.admin.wait("containerd started the plugin again", lambda: world.plugin_starts() == 2, timeout=30,
                     interval=0.2)
    world.registration("nri")
    got, cid, allocated = world.gpu_pod("after-restart")
    assert allocated == [["nvidia.com/gpu=0"]], allocated
    _decided_by_compat_hook(world, "after-restart", got, cid)


#: containerd's NRI validator (2.2 and later): this pod may not start while compat-hook's plugin is missing.
REQUIRED = {"required-plugins.noderesource.dev/pod": "[compat-hook]"}


def _pod(world, name: str, *, gpu: bool, annotations=None, command=("probe",)) -> dict:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "apps",
                                                           "annotations": dict(annotations or {})},
           "spec": {"nodeName": world.node.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": COMPAT_IMAGE, "imagePullPolicy": "Never",
                                    "command": list(command)}]}}
    if gpu:
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return world.admin.create("/api/v1/namespaces/apps/pods", pod)


def test_fail_closed_where_containerd_can_require_the_plugin(world):
    """docs/engines.md "Fail-closed": ``registration.nriRequire=per-pod`` on containerd 2.2 and later. With the
    plugin killed, a GPU pod that requires it is refused (the kubelet's Warning Event and the container's
    CreateContainerError name compat-hook), while a GPU pod that does not and a pod without a GPU start; once
    containerd starts the plugin again, the refused pod starts on the kubelet's next try and gets the decision.
    containerd 2.1 has no validator: the installer's command refuses the requirement with one line."""
    version = world.node.run("containerd", "--version").stdout.split()[2].lstrip("v")
    if tuple(int(x) for x in version.split(".")[:2]) < (2, 2):
        # the installer's own command (compat-hook-k8s.sh install_nri), with the copy it installed on the node
        p = world.node.run("/opt/compat-hook/bin/compat-hook", "install", "containerd", "--via", "nri",
                           "--engine-config", "/etc/containerd/config.toml", "--nri-plugin", PLUGIN,
                           "--nri-require", "per-pod", "--dry-run", check=False)
        assert p.returncode == 1 and f"containerd {version.rsplit('.', 1)[0]} cannot require an NRI plugin" in p.stderr, \
            (p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        return
    world.node.helm("upgrade", "compat-hook", nodemod.CHART, "-n", NS, "--reuse-values",
                    "--set", "registration.nriRequire=per-pod", "--wait", "--timeout", "3m", timeout=240)
    starts = world.plugin_starts()
    world.node.restart_containerd()  # the docs' step: containerd reads the requirement at start
    world.admin.wait("containerd started the plugin", lambda: world.plugin_starts() == starts + 1
                     and len(world.plugin_pids()) == 1, timeout=30, interval=0.2)
    (pid,) = world.plugin_pids()
    os.kill(pid, signal.SIGKILL)
    # not required: a GPU pod starts without compat-hook (the toolkit's hook alone), a pod without a GPU starts
    # (first: the node has one GPU, which the refused pod below keeps)
    got, cid, _ = world.gpu_pod("not-required")
    assert got == {"cuDriverGetVersion": CUDA[COMPAT_550], "libcuda": COMPAT_LIB}, got
    _pod(world, "no-gpu", gpu=False, command=("sh", "-c", "exit 0"))
    wait_pod(world.admin, "apps", "no-gpu", lambda p: (p.get("status") or {}).get("phase") == "Succeeded", "ended")
    world.admin.delete("/api/v1/namespaces/apps/pods/no-gpu", gracePeriodSeconds="0")
    _pod(world, "required", gpu=True, annotations=REQUIRED)
    refused = wait_pod(world.admin, "apps", "required", lambda p: any(
        (c.get("state") or {}).get("waiting", {}).get("reason") == "CreateContainerError"
        for c in (p.get("status") or {}).get("containerStatuses") or []), "refused", timeout=120)
    (cs,) = refused["status"]["containerStatuses"]
    assert 'required plugin "compat-hook" not present' in cs["state"]["waiting"].get("message", ""), cs
    events = world.admin.get("/api/v1/namespaces/apps/events",
                             fieldSelector="involvedObject.kind=Pod,involvedObject.name=required")["items"]
    assert any(e["type"] == "Warning" and 'required plugin "compat-hook" not present' in e.get("message", "")
               for e in events), \
        [(e["reason"], e.get("message")) for e in events]
    # the plugin back: the refused pod starts on the kubelet's next try, through compat-hook
    world.node.restart_containerd()
    world.admin.wait("containerd started the plugin again", lambda: world.plugin_starts() == starts + 2, timeout=30,
                     interval=0.2)
    done = wait_pod(world.admin, "apps", "required", lambda p: (p.get("status") or {}).get("phase") in
                    ("Succeeded", "Failed"), "ended", timeout=180)
    log = world.node.pod_log("apps", "required")
    assert done["status"]["phase"] == "Succeeded", (done["status"], log)
    cid = done["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    world.admin.delete("/api/v1/namespaces/apps/pods/required", gracePeriodSeconds="0")
    _decided_by_compat_hook(world, "required", probe_result(log), cid)


def test_uninstalled_as_the_docs_say_the_toolkits_hook_stands_alone_again(world):
    """docs/engines.md "Uninstall": ``registration.uninstallOnStop=true`` and its rollout, ``helm uninstall``
    (each pod's preStop takes the plugin off), containerd's restart. Then the same pod loads the compat
    library again, with no compat-hook decision."""
    t = time.monotonic()
    world.node.helm("upgrade", "compat-hook", nodemod.CHART, "-n", NS, "--reuse-values",
                    "--set", "registration.uninstallOnStop=true", "--wait", "--timeout", "3m", timeout=240)
    world.node.helm("uninstall", "compat-hook", "-n", NS, "--wait", "--timeout", "3m", timeout=240)
    world.admin.wait("the DaemonSet's pods gone", lambda: not world.admin.get(
        f"/api/v1/namespaces/{NS}/pods", labelSelector="app.kubernetes.io/name=compat-hook")["items"],
        timeout=120, interval=0.5)
    world.timings["uninstall"] = time.monotonic() - t
    assert not world.node.path(PLUGIN).exists()
    assert not world.node.path("/etc/nri/conf.d/90-compat-hook.conf").exists()
    assert f"{PREFIX}/registration" not in world.labels(), world.labels()
    starts = world.plugin_starts()
    world.node.restart_containerd()
    time.sleep(1)
    assert world.plugin_starts() == starts  # none started this time
    got, cid, allocated = world.gpu_pod("uninstalled")
    assert allocated == [["nvidia.com/gpu=0"]], allocated
    assert got == {"cuDriverGetVersion": CUDA[COMPAT_550], "libcuda": COMPAT_LIB}, got
    assert [r for r in world.decisions() if r.get("container_id") == cid] == []
    print("node-cdi timings (s):", {k: round(v, 1) for k, v in world.timings.items()})
