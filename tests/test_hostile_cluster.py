"""Hostile input on a real API server: a Node annotation no parser should take, a probe output a tenant's
image wrote.

The control plane is real (etcd and kube-apiserver, tests/support/kube.py), and so are the commands:
``cluster status`` and ``cluster agent`` run as processes, the validator's loop in this process
against the API server. No kubelet runs the nodes here: where a probe pod must end, the test
reports its container's state as the kubelet does (the probe's JSON as its termination message).
The same inputs through the loops without a server, as properties, are
tests/test_hostile_cluster_input.py.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import threading
import time

import pytest

from compat_hook.cluster.overview import fleet

from compat_hook.cluster.api import kube

from compat_hook.cluster.node import validate

from compat_hook.cluster.workload import workloads
from tests.support import hookenv
from tests.support.gpucluster import CASE, R535, agent_rbac, build_store, gpu_node, gpu_pod, ref, runtime_classes
from tests.support.kube import ADMIN_TOKEN, AGENT_TOKEN, ControlPlane
from tests.support.versions import HOST_535, HOST_555

pytestmark = [pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parent.parent
PREFIX = "compat-hook.io"
DOC = f"{PREFIX}/preflight"
#: The issue's annotation: 100000 ``[`` (too large for a preflight doc), and one that fits but nests 5000 deep.
TOO_LARGE, TOO_DEEP = "[" * 100000, "[" * 5000 + "]" * 5000


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("hostile")
    cp = ControlPlane(work / "cp")
    try:
        cp.start()
        agent_rbac(cp)
        runtime_classes(cp.admin)
        store = build_store(work / "store", ["infer", "legacy"])
        yield cp, work, store
    finally:
        cp.stop()
        log = work / "cp" / "apiserver.log"
        if log.exists():
            print("--- apiserver.log (tail)\n" + log.read_text(errors="replace")[-2000:])


def _node(cp: ControlPlane, name: str, case: str, annotation: str | None, verdict: str | None = "pass") -> None:
    n = gpu_node(name, deploy_driver=False, case=case)
    n["metadata"]["annotations"] = {DOC: annotation} if annotation is not None else {}
    if verdict:
        n["metadata"]["labels"][DOC] = verdict
    cp.admin.create("/api/v1/nodes", n)


def _cluster(cp: ControlPlane, work: pathlib.Path, *args, token=ADMIN_TOKEN) -> subprocess.CompletedProcess:
    config = hookenv.write_config(work / "c.yaml", host_root=work, log_file=work / "decisions.log", nvml="off")
    kc = cp.kubeconfig(token, "admin" if token == ADMIN_TOKEN else "agent")
    p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", *args, "--kubeconfig", str(kc),
                        "--config", str(config)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    return p


def test_status_the_fleet_and_the_agent_go_on_past_a_deeply_nested_preflight_annotation(world):
    cp, work, store = world
    case = "hostile-annotation"
    _node(cp, "deep-large", case, TOO_LARGE)
    _node(cp, "deep-nested", case, TOO_DEEP)
    _node(cp, "plain", case, json.dumps({"v": 2, "target": R535}), verdict=None)
    # `cluster status`: one line per node, the two saying why they have no verdict; exit 2 (unknown)
    p = _cluster(cp, work, "status", "-l", f"{CASE}={case}")
    lines = p.stdout.splitlines()
    assert p.returncode == 2 and len(lines) == 1 + 3 + 1, p.stdout + p.stderr
    rows = {ln.split()[0]: ln for ln in lines[1:-1]}
    assert "preflight annotation unreadable: too_large" in rows["deep-large"], p.stdout
    assert "preflight annotation unreadable: too_deep" in rows["deep-nested"], p.stdout
    assert rows["deep-large"].split()[4] == "unknown" and rows["deep-nested"].split()[4] == "unknown", p.stdout
    p = _cluster(cp, work, "status", "--json", "-l", f"{CASE}={case}")
    doc = {r["name"]: r for r in json.loads(p.stdout)["nodes"]}
    assert p.returncode == 2 and {n: (r["verdict"], r["note"].split(";")[0]) for n, r in doc.items()} == {
        "deep-large": ("unknown", "unknown: preflight annotation unreadable: too_large"),
        "deep-nested": ("unknown", "unknown: preflight annotation unreadable: too_deep"),
        "plain": (None, "no preflight published: is its agent running?")}, doc
    # the fleet's reconcile over the Nodes as the API server lists them: judged, and the two block the version
    nodes = cp.admin.get("/api/v1/nodes", labelSelector=f"{CASE}={case}")["items"]
    policy = {"metadata": {"name": "cluster-policy"}, "spec": {"driver": {"version": R535}}}
    data = fleet.reconcile(fleet.Snapshot(nodes=tuple(nodes), policies=(policy,), now=time.time()), PREFIX)
    for key in (f"clusterpolicy_cluster-policy_{R535}", f"driver_{R535}"):
        value = data[key]
        assert value.startswith("not judged on 3 of 3 node(s)") and "deep-large (" in value, value
    # the agent of the node whose doc nests 5000 deep: a pass, and its own doc replaces the hostile one
    host = work / "hosts" / "deep-nested"
    hookenv.set_host_version(host, R535)
    cp.admin.create("/api/v1/namespaces/apps/pods", gpu_pod("infer-deep", "deep-nested", ref("infer")))
    p = _cluster(cp, work, "agent", "--node", "deep-nested", "--once", "--store", f"oci:{store}", "--host-root",
                 str(host), "--state-dir", str(work / "state"), token=AGENT_TOKEN)
    assert p.returncode == 0, p.stdout + p.stderr
    ann = cp.admin.get("/api/v1/nodes/deep-nested")["metadata"]["annotations"][DOC]
    assert json.loads(ann)["v"] == 2, ann


def _kubelet(cp: ControlPlane, node: str, messages: dict, done: threading.Event) -> None:
    """Ends each probe pod on ``node`` as the kubelet would, its message the one for its image."""
    seen: set = set()
    while not done.is_set():
        pods = cp.admin.get("/api/v1/namespaces/compat-hook/pods",
                            labelSelector="app.kubernetes.io/name=compat-hook-probe")["items"]
        for p in pods:
            name, image = p["metadata"]["name"], p["spec"]["containers"][0]["image"]
            if p["spec"].get("nodeName") != node or (name, p["metadata"]["uid"]) in seen:
                continue
            seen.add((name, p["metadata"]["uid"]))
            cp.admin.request("PATCH", f"/api/v1/namespaces/compat-hook/pods/{name}/status", {"status": {
                "phase": "Succeeded", "containerStatuses": [{
                    "name": "probe", "ready": False, "restartCount": 0, "image": image, "imageID": "",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": messages[image]}}}]}},
                content_type="application/merge-patch+json")
        time.sleep(0.2)


def _validated_node(cp, name: str, tmp_path) -> tuple:
    """A GPU Node ``name`` with no annotation, its host root on R555, the config and the agent's record dir."""
    from compat_hook.core.config import from_mapping

    node = gpu_node(name, deploy_driver=False)
    node["metadata"]["annotations"] = {}
    cp.admin.create("/api/v1/nodes", node)
    host = hookenv.fake_host(tmp_path / "host", HOST_555)
    return host, from_mapping({"host_root": str(host), "nvml": "off", "log_file": None}), tmp_path / "agent"


def test_a_probe_output_of_nested_json_still_fails_the_node_and_taints_it(world, tmp_path):
    """Two workloads: one whose libcuda does not load, one whose image makes the probe's message a JSON
    document nested 3000 deep. The validator judges both, fails the node, labels and taints it."""
    cp, work, store = world
    host, cfg, rec = _validated_node(cp, "gpu-v", tmp_path)
    pods = [{"metadata": {"namespace": "ml", "name": n, "labels": {}},
             "spec": {"runtimeClassName": "cuda-compat", "containers": [{"name": "c", "image": ref(n), "env": [
                 {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}, "status": {"phase": "Running"}}
            for n in ("infer", "legacy")]
    workloads.record(str(rec), pods, driver=HOST_535,
                     sources={f"oci:{store}:{ref(n)}": [ref(n)] for n in ("infer", "legacy")})
    messages = {ref("infer"): '{"probe": 1, "maps": ' + "[" * 3000 + "]" * 3000 + "}",
                ref("legacy"): json.dumps({"probe": 1, "libcuda": None, "glibc": "2.35",
                                           "error": "libcuda.so.1: cannot open shared object file"})}
    done = threading.Event()
    t = threading.Thread(target=_kubelet, args=(cp, "gpu-v", messages, done))
    t.start()
    try:
        k = kube.connect(str(cp.kubeconfig(ADMIN_TOKEN, "admin")))
        opts = validate.ValidatorOptions("gpu-v", publish_namespace="compat-hook", probe_image="localhost/c:1",
                                         workloads_dir=str(rec), state_dir=str(tmp_path / "st"), once=True,
                                         probe_timeout=30, deadline=90, ready_file=str(tmp_path / "ready"))
        assert validate.run(lambda: k, cfg, opts, PREFIX) == validate.EXIT_FAILED
    finally:
        done.set()
        t.join()
    st = json.loads((tmp_path / "st" / validate.STATE_FILE).read_text())
    codes = {r["image"]: r["code"] for r in st["images"]}
    assert codes == {ref("infer"): "probe_failed", ref("legacy"): "no_libcuda"}, st["images"]
    assert "the probe gave no result" in next(r["message"] for r in st["images"] if r["image"] == ref("infer"))
    got = cp.admin.get("/api/v1/nodes/gpu-v")
    assert got["metadata"]["labels"][f"{PREFIX}/validated"] == "failed"
    mine = [(t["key"], t.get("value"), t["effect"]) for t in got["spec"]["taints"] if t["key"].startswith(PREFIX)]
    assert mine == [(f"{PREFIX}/validation-failed", HOST_555, "NoSchedule")], got["spec"]
    assert not (tmp_path / "ready").exists()


def test_a_probe_pod_the_api_server_refuses_fails_its_workload(world, tmp_path):
    """The probe pods' namespace is gone (the API server answers 404 to each create): no workload is
    proven, so the node fails and is tainted at once, not retried while the upgrade controller's
    600 s run out and it uncordons the node."""
    cp, work, store = world
    host, cfg, rec = _validated_node(cp, "gpu-w", tmp_path)
    pod = {"metadata": {"namespace": "ml", "name": "p", "labels": {}},
           "spec": {"containers": [{"name": "c", "image": ref("infer"), "env": [
               {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}, "status": {"phase": "Running"}}
    workloads.record(str(rec), [pod], driver=HOST_535, sources={f"oci:{store}:{ref('infer')}": [ref("infer")]})
    k = kube.connect(str(cp.kubeconfig(ADMIN_TOKEN, "admin")))
    opts = validate.ValidatorOptions("gpu-w", publish_namespace="no-such-namespace", probe_image="localhost/c:1",
                                     workloads_dir=str(rec), state_dir=str(tmp_path / "st"), once=True,
                                     probe_timeout=30, deadline=90)
    assert validate.run(lambda: k, cfg, opts, PREFIX) == validate.EXIT_FAILED
    st = json.loads((tmp_path / "st" / validate.STATE_FILE).read_text())
    [row] = st["images"]
    assert (row["image"], row["ok"], row["code"]) == (ref("infer"), False, "probe_refused"), row
    assert "404" in row["message"], row
    got = cp.admin.get("/api/v1/nodes/gpu-w")
    assert got["metadata"]["labels"][f"{PREFIX}/validated"] == "failed"
    assert [t["key"] for t in got["spec"]["taints"] if t["key"].startswith(PREFIX)] == [f"{PREFIX}/validation-failed"]
