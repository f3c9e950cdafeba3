"""``compat-hook cluster agent|status|release`` on a real control plane running NVIDIA's own upgrade state machine.

The control plane is real: etcd (Debian's etcd-server) and kube-apiserver v1.34 built from the
``k8s.io/kubernetes`` module, with a token file and RBAC; kwok plays the kubelets; the GPU
Operator's upgrade controller is NVIDIA's own code (``k8s-operator-libs/pkg/upgrade``,
``SetDriverName("gpu")``, BuildState/ApplyState) in tests/upgrade_harness, which also plays the
operator and the DaemonSet controller the control plane lacks (tests/support/kube.py).

Every command runs as its own process, with each of the two Kubernetes clients (the ``client``
fixture): Debian's python3-kubernetes and the newest release from PyPI. The agent's token has
exactly the permissions docs/cluster.md lists (tests/support/gpucluster.py).

The nodes' images are real OCI image layouts (Debian's real libcuda 550 with NVIDIA's note as the
compat driver in one of them); each node's host root has ``/proc/driver/nvidia/version`` and its
GPU: the only things faked are the kernel driver and the GPU. Each test makes its own nodes
(labelled with its case, which ``cluster status -l`` selects), so none depends on another having run.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time

import pytest
import yaml

from tests.support import debs, hookenv, rootfs
from tests.support.gpucluster import (A100, CASE, CP, DRAIN, DS, H100, R470, R535, R570, R580, R590, SKIP, STATE,
                                      V100, agent_rbac, build_store, gpu_node, gpu_operator, gpu_pod, ref,
                                      revision_hash, runtime_classes, tar_dir)
from tests.support.images import Layout, gz, skopeo
from tests.support.kube import (ADMIN_TOKEN, AGENT_TOKEN, NAMESPACE, NOBODY_TOKEN, RELEASE_TOKEN, ApiError,
                                ControlPlane, FaultProxy, client_version, clients)
from tests.support.toolkit import noted_compat_lib

pytestmark = [pytest.mark.containers, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parent.parent
PREFIX = "compat-hook.io"
HOLDS = f"{PREFIX}/holds-upgrade"
OVERRIDE = f"{PREFIX}/allow-upgrade"
#: node -> the image of its GPU pod: a compat image, a CUDA 11.8 one, a CUDA 12.4 one without compat
NODES = {"gpu-a": "train", "gpu-b": "legacy", "gpu-c": "infer"}
CLIENTS = ["debian", "latest"]


class World:
    def __init__(self, cp: ControlPlane, work: pathlib.Path, libs) -> None:
        self.cp, self.work = cp, work
        self.admin = cp.admin
        self.agent_kc = cp.kubeconfig(AGENT_TOKEN, "agent")
        self.admin_kc = cp.kubeconfig(ADMIN_TOKEN, "admin")
        self.release_kc = cp.kubeconfig(RELEASE_TOKEN, "release")
        self.store = build_store(work / "store", ["train", "legacy", "infer", "future"], libs)
        self.hosts: dict = {}
        self.pythons = clients()
        # hold_quiet_s 0: a hold lifts on the first pass that finds its workloads gone, so that these tests
        # can delete a pod and look at once; the quiet time itself has tests of its own (own configs)
        self.config = hookenv.write_config(work / "agent.yaml", host_root=work, log_file=work / "decisions.log",
                                           nvml="off", cluster={"gate_upgrade": True, "hold_quiet_s": 0})

    # -- nodes -----------------------------------------------------------------
    def set_driver(self, node: str, version: str, gpu: str = A100) -> None:
        """The node's kernel driver and GPU (what the driver container's module reload changes on a real
        node), and GPU Feature Discovery's label for the driver."""
        h = self.work / "hosts" / node
        hookenv.set_host_version(h, version)
        info = h / "proc/driver/nvidia/gpus/0000:17:00.0/information"
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(f"Model: \t\t {gpu}\nBus Location: \t 0000:17:00.0\n")
        self.hosts[node] = h
        self.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"nvidia.com/cuda.driver-version.full": version}}})

    def add_node(self, name: str, *, image: str | None = None, driver: str = R535, gpu: str = A100,
                 labels=None, annotations=None, deploy_driver: bool = False, **pod) -> None:
        """A GPU node of this test's own (case ``name``): by default one the driver DaemonSet does not
        select, so NVIDIA's controller leaves it alone, and no kwok (its pods stay Pending)."""
        node = gpu_node(name, deploy_driver=deploy_driver, gpu=gpu, case=name)
        node["metadata"]["labels"].update(labels or {})
        node["metadata"]["annotations"] = dict(annotations or {})
        if deploy_driver:
            node["metadata"]["annotations"]["kwok.x-k8s.io/node"] = "fake"
        self.admin.create("/api/v1/nodes", node)
        self.set_driver(name, driver, gpu)
        if image:
            self.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"{image}-{name}", name, ref(image), **pod))

    def node(self, name: str) -> dict:
        return self.admin.get(f"/api/v1/nodes/{name}")

    def labels(self, name: str) -> dict:
        return self.node(name)["metadata"].get("labels") or {}

    def annotations(self, name: str) -> dict:
        return self.node(name)["metadata"].get("annotations") or {}

    def details(self, name: str) -> dict:
        cm = self.admin.get(f"/api/v1/namespaces/compat-hook/configmaps/{name}")
        return json.loads(cm["data"]["preflight.json"])

    def events(self, node: str) -> list:
        # where `kubectl describe node` looks: in default, about the Node (no namespace in the reference)
        evs = self.admin.get("/api/v1/namespaces/default/events",
                             fieldSelector=f"involvedObject.kind=Node,involvedObject.name={node},"
                                           "involvedObject.namespace=,reason=CompatHookPreflight")["items"]
        return sorted(evs, key=lambda e: e["metadata"]["creationTimestamp"] + e["metadata"]["name"])

    def forget(self, nodes) -> None:
        """What earlier agents published on ``nodes`` goes (labels, annotations, Leases, ConfigMaps, Events)."""
        for n in nodes:
            self.admin.merge(f"/api/v1/nodes/{n}", {"metadata": {
                "labels": {f"{PREFIX}/preflight": None, f"{PREFIX}/preflight.broken": None,
                           f"{PREFIX}/preflight.target-driver": None, SKIP: None},
                "annotations": {f"{PREFIX}/preflight": None, HOLDS: None}}})
            for kind in ("apis/coordination.k8s.io/v1/namespaces/compat-hook/leases",
                         "api/v1/namespaces/compat-hook/configmaps"):
                try:
                    self.admin.delete(f"/{kind}/{n}")
                except ApiError as e:
                    assert e.status == 404, e
            for ev in self.events(n):
                self.admin.delete(f"/api/v1/namespaces/default/events/{ev['metadata']['name']}")

    # -- the commands ----------------------------------------------------------
    def agent(self, node: str, *extra, client: str = "debian", kubeconfig=None, check=True, timeout=120,
              config=None, store=None) -> dict:
        argv = [self.pythons[client], "-m", "compat_hook", "cluster", "agent", "--node", node, "--once",
                "--kubeconfig", str(kubeconfig or self.agent_kc), "--store", store or f"oci:{self.store}",
                "--host-root", str(self.hosts[node]), "--config", str(config or self.config),
                "--state-dir", str(self.work / "state" / node), *extra]
        p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
        if check:
            assert p.returncode == 0, p.stdout + p.stderr
        lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
        return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr, "last": lines[-1] if lines else None}

    def spawn(self, node: str, *extra, client: str = "debian", kubeconfig=None, config=None) -> subprocess.Popen:
        argv = [self.pythons[client], "-m", "compat_hook", "cluster", "agent", "--node", node,
                "--kubeconfig", str(kubeconfig or self.agent_kc), "--store", f"oci:{self.store}",
                "--host-root", str(self.hosts[node]), "--config", str(config or self.config),
                "--state-dir", str(self.work / "state" / node), *extra]
        log = (self.work / f"agent-{node}.log").open("wb")
        return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log(self, node: str) -> list:
        text = (self.work / f"agent-{node}.log").read_text()
        assert "Traceback" not in text, text
        return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]

    def passes(self, node: str) -> list:
        return [r for r in self.log(node) if r["event"] == "cluster_pass"]

    def run(self, *args, client: str = "debian", kubeconfig=None) -> subprocess.CompletedProcess:
        p = subprocess.run([self.pythons[client], "-m", "compat_hook", "cluster", *args, "--kubeconfig",
                            str(kubeconfig or self.admin_kc), "--config", str(self.config)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
        return p

    def status(self, case: str, *extra, client: str = "debian", kubeconfig=None) -> tuple:
        p = self.run("status", "-l", f"{CASE}={case}", *extra, client=client, kubeconfig=kubeconfig)
        return p.returncode, p.stdout, p.stderr

    def status_json(self, case: str, client: str = "debian") -> tuple:
        rc, out, err = self.status(case, "--json", client=client)
        assert rc in (0, 2, 3, 5), err
        doc = json.loads(out)
        return rc, {n["name"]: n for n in doc["nodes"]}, doc["summary"]

    # -- the operator ----------------------------------------------------------
    def driver_pods(self) -> dict:
        pods = self.admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"app={DS}")["items"]
        return {p["spec"]["nodeName"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}

    def wait_upgraded(self, nodes, version: str, timeout: float = 120) -> None:
        want = revision_hash(version)

        def done():
            pods = self.driver_pods()
            return all(self.labels(n).get(STATE) == "upgrade-done" and n in pods
                       and pods[n]["metadata"]["labels"].get("controller-revision-hash") == want
                       and pods[n].get("status", {}).get("phase") == "Running" for n in nodes)

        self.admin.wait(f"{list(nodes)} upgrade-done on {version}", done, timeout=timeout, interval=0.5)
        for n in nodes:
            self.set_driver(n, version)

    def set_target(self, version: str | None = None, *, announce: str | None = None, remove_announce=False) -> None:
        patch: dict = {}
        if version is not None:
            patch["spec"] = {"driver": {"version": version}}
        if announce is not None or remove_announce:
            patch["metadata"] = {"annotations": {f"{PREFIX}/next-driver": announce}}
        self.admin.merge(CP, patch)


def _table(out: str) -> dict:
    """``cluster status``'s text table as ``{node: {column: value}}`` (columns by the header's positions)."""
    lines = out.splitlines()
    header = lines[0]
    cols = ["NODE", "DRIVER", "TARGET", "UPGRADE STATE", "PREFLIGHT", "BROKEN", "HELD", "VALIDATED", "PATH", "NOTE"]
    starts = [header.index(c) for c in cols]
    rows = {}
    for ln in lines[1:-1]:
        cells = [ln[s:e].strip() for s, e in zip(starts, starts[1:] + [None])]
        rows[cells[0]] = dict(zip(cols, cells))
    return rows


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    libs = {"noted": noted_compat_lib(debs.libcuda("550.163.01"), work / "noted")}
    cp = ControlPlane(work / "cp")
    try:
        cp.start()  # inside the try: a failed start still stops what it started
        cp.start_kwok()
        agent_rbac(cp)
        a = cp.admin
        runtime_classes(a)
        for n in NODES:
            a.create("/api/v1/nodes", gpu_node(n, case="scenario"))
        gpu_operator(a, R535)
        for n, image in NODES.items():
            a.create("/api/v1/namespaces/apps/pods", gpu_pod(f"{image}-{n}", n, ref(image)))
        w = World(cp, work, libs)
        for n in NODES:
            w.set_driver(n, R535)
        cp.start_harness()
        w.wait_upgraded(list(NODES), R535, timeout=180)  # first reconcile: unknown -> upgrade-done
        yield w
    finally:
        cp.stop()
        for name in ("harness.log", "kwok.log", "apiserver.log"):
            f = work / "cp" / name
            if f.exists():
                print(f"--- {name} (tail)\n" + f.read_text(errors="replace")[-3000:])


@pytest.fixture(params=CLIENTS)
def client(request, world):
    """The Kubernetes client the commands run with: Debian's python3-kubernetes or the newest from PyPI."""
    print(f"kubernetes client {request.param}: {client_version(world.pythons[request.param])}")
    return request.param


def test_the_newest_client_is_what_the_cluster_extra_allows(world):
    """The venv holds the newest release, and pyproject's bounds take it and Debian's (what CI runs)."""
    import re

    text = (REPO / "pyproject.toml").read_text()
    [bounds] = re.findall(r'cluster = \["kubernetes>=([0-9.]+),<([0-9]+)"\]', text)
    low, high = tuple(map(int, bounds[0].split("."))), int(bounds[1])
    for c in CLIENTS:
        v = tuple(int(x) for x in client_version(world.pythons[c]).split(".")[:2])
        assert low <= v and v[0] < high, (c, v, bounds)


# ----------------------------------------------------------------------------- the scenario


def _plan_reason(w: World, image: str, now: str, target: str) -> str:
    """What ``compat-hook plan`` says of ``image`` on ``target`` (the agent must say the same)."""
    p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "plan", f"oci:{w.store}:{ref(image)}", "--driver",
                        target, "--from-driver", now, "--host-root", str(w.hosts["gpu-c"]), "--config",
                        str(w.config), "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    [row] = json.loads(p.stdout)["images"]
    return row["after"]["reason"]


def test_scenario_gate_holds_the_regressing_node_under_nvidias_state_machine(world, client):
    w = world
    # this test's starting point, whatever ran before: every node on R535, nothing announced or published
    w.set_target(R535, remove_announce=True)
    w.wait_upgraded(list(NODES), R535, timeout=180)
    w.forget(NODES)
    for n, image in NODES.items():
        try:
            w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"{image}-{n}", n, ref(image)))
        except ApiError as e:
            assert e.status == 409
    rc, nodes, summary = w.status_json("scenario", client)
    assert rc == 2 and summary["no_preflight"] == 3, (nodes, summary)  # no agent has run: not all clear

    # 1. a newer branch, announced before it is applied: every image keeps working (some change outcome)
    w.set_target(announce=R570)
    for n in NODES:
        r = w.agent(n, client=client)["last"]
        assert (r["target"], r["target_from"]) == (R570, f"ClusterPolicy cluster-policy annotation {PREFIX}/next-driver"), r
        assert r["regressions"] == 0 and r["gate"] == "clear" and r["complete"], r
    rc, nodes, _ = w.status_json("scenario", client)
    # compat -> host (gpu-a) and host-minor -> host (gpu-c) change outcome; gpu-b's CUDA 11.8 image stays on the host
    assert rc == 2 and {n: v["preflight"] for n, v in nodes.items()} == {"gpu-a": "warn", "gpu-b": "pass", "gpu-c": "warn"}
    assert all(v["target"] == R570 and v["driver"] == R535 and v["hold"] == "-" for v in nodes.values()), nodes
    w.set_target(R570)
    w.wait_upgraded(list(NODES), R570)
    for n in NODES:
        r = w.agent(n, client=client)["last"]
        assert (r["now"], r["target"], r["preflight"]) == (R570, R570, "pass"), r
    rc, nodes, summary = w.status_json("scenario", client)
    assert rc == 0 and summary["pass"] == 3, (nodes, summary)

    # 2. a rollback to R470 that breaks gpu-c's image (CUDA 12.4, no compat driver): announce it first
    w.set_target(announce=R470)
    results = {n: w.agent(n, client=client)["last"] for n in NODES}
    assert (results["gpu-c"]["preflight"], results["gpu-c"]["regressions"], results["gpu-c"]["gate"]) == ("fail", 1, "held")
    # gpu-a: host on R570, its compat driver 550 on R470; gpu-b: CUDA 11.8 on R470's 11.4 (host-minor)
    assert (results["gpu-a"]["preflight"], results["gpu-b"]["preflight"]) == ("warn", "warn"), results
    labels = w.labels("gpu-c")
    assert labels[SKIP] == "true" and labels[f"{PREFIX}/preflight"] == "fail", labels
    assert labels[f"{PREFIX}/preflight.broken"] == "1" and labels[f"{PREFIX}/preflight.target-driver"] == R470
    [reg] = w.details("gpu-c")["regressions"]
    assert {k: reg[k] for k in ("image", "pods", "now", "after", "error", "cuda", "needs")} == {
        "image": ref("infer"), "pods": ["apps/infer-gpu-c"], "now": "host", "after": "broken", "error": 35,
        "cuda": "11.4", "needs": "12.4"}, reg
    assert reg["reason"] == _plan_reason(w, "infer", R570, R470), reg
    hold = w.annotations("gpu-c")[HOLDS]
    # the workloads by what they are: the pods behind them (replaced under new names) are in the details
    assert hold == f"1 workload(s) regress on driver {R470}: {ref('infer')}", hold
    rc, out, _ = w.status("scenario", client=client)
    assert rc == 3, out
    table = _table(out)
    assert (table["gpu-c"]["PREFLIGHT"], table["gpu-c"]["HELD"]) == ("fail", "yes"), out
    assert table["gpu-a"]["HELD"] == table["gpu-b"]["HELD"] == "-", out
    # a second pass with the same result: no second Event, no write
    again = w.agent("gpu-c", client=client)["last"]
    assert (again["node_write"], again["details_written"], again["event_sent"]) == ("unchanged", False, False), again
    warnings = [e for e in w.events("gpu-c") if e["type"] == "Warning"]
    assert len(warnings) == 1 and f"{ref('infer')} (apps/infer-gpu-c)" in warnings[0]["message"], warnings

    # the operator applies the rollback: NVIDIA's controller upgrades gpu-a and gpu-b; gpu-c stays parked
    w.set_target(R470)
    w.wait_upgraded(["gpu-a", "gpu-b"], R470)
    for _ in range(6):  # several reconciles later it is still parked in upgrade-required
        assert w.labels("gpu-c").get(STATE) == "upgrade-required"
        time.sleep(0.5)
    assert w.driver_pods()["gpu-c"]["metadata"]["labels"]["controller-revision-hash"] == revision_hash(R570)
    rc, nodes, summary = w.status_json("scenario", client)
    assert rc == 3 and nodes["gpu-c"]["held"] and nodes["gpu-c"]["upgrade_state"] == "upgrade-required", nodes
    assert nodes["gpu-a"]["upgrade_state"] == nodes["gpu-b"]["upgrade_state"] == "upgrade-done", nodes
    assert summary["held"] == 1 and summary["fail"] == 1, summary

    # 3. the breaking pod goes away: the hold lifts, and NVIDIA's controller upgrades gpu-c too
    w.admin.delete("/api/v1/namespaces/apps/pods/infer-gpu-c", gracePeriodSeconds="0")
    r = w.agent("gpu-c", client=client)["last"]
    assert (r["preflight"], r["gate"], r["regressions"]) == ("pass", "clear", 0), r
    assert SKIP not in w.labels("gpu-c") and HOLDS not in w.annotations("gpu-c")
    w.wait_upgraded(["gpu-c"], R470)
    for n in NODES:
        w.agent(n, client=client)
    rc, nodes, summary = w.status_json("scenario", client)
    assert rc == 0 and summary["held"] == 0, (nodes, summary)
    assert {n: (v["driver"], v["target"], v["preflight"]) for n, v in nodes.items()} == {
        n: (R470, R470, "pass") for n in NODES}, nodes
    # Events: one per change of verdict or gate on gpu-c (warn 570, pass 570, fail 470, pass after the fix)
    msgs = [e["message"].split(":")[0] for e in w.events("gpu-c")]
    assert msgs == [f"preflight warn for driver {R570}", f"preflight pass for driver {R570}",
                    f"preflight fail for driver {R470}", f"preflight pass for driver {R470}"], msgs
    w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod("infer-gpu-c", "gpu-c", ref("infer")))


# ----------------------------------------------------------------------------- a hold only a complete pass lifts


def _held(w: World, node: str, client: str, **kw) -> dict:
    w.add_node(node, image="infer", **kw)
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["gate"], r["complete"]) == ("fail", "held", True), r
    assert w.labels(node)[SKIP] == "true" and HOLDS in w.annotations(node)
    return r


def _still_held(w: World, node: str) -> None:
    labels, anns = w.labels(node), w.annotations(node)
    assert labels.get(SKIP) == "true" and HOLDS in anns, (labels, anns)
    assert json.loads(anns[f"{PREFIX}/preflight"])["gate"] == "held", anns


def test_a_held_node_keeps_its_hold_through_a_containerd_outage_a_missing_driver_and_api_errors(world, client, tmp_path):
    w = world
    node = f"transient-{client}"
    _held(w, node, client)

    # containerd restarting: its socket is not there (k3s/RKE2 with the default path looks the same)
    r = w.agent(node, "--driver", R470, "--address", str(tmp_path / "containerd.sock"), client=client,
                store="containerd:")["last"]
    assert (r["gate"], r["complete"], r["not_in_store"]) == ("held", False, 1), r
    assert "store_unreachable" in r["reasons"] and "containerd" in r["problem"], r
    _still_held(w, node)

    # the driver container restarting: /proc/driver/nvidia/version is gone for a moment
    version = w.hosts[node] / "proc/driver/nvidia/version"
    saved = version.read_text()
    version.unlink()
    try:
        r = w.agent(node, "--driver", R470, client=client)["last"]
    finally:
        version.write_text(saved)
    assert (r["preflight"], r["gate"], r["complete"]) == ("unknown", "held", False), r
    assert "driver_unknown" in r["reasons"], r
    _still_held(w, node)

    proxy = FaultProxy(w.cp.url)
    try:
        kc = proxy.kubeconfig(tmp_path / "proxy.kubeconfig", AGENT_TOKEN)
        # the API server fails one read of the pass: the pass fails, nothing is written
        proxy.fail("GET", r"^/api/v1/pods\?", 500)
        r = w.agent(node, "--driver", R470, client=client, kubeconfig=kc, check=False)
        assert r["rc"] == 1 and r["last"]["event"] == "cluster_error" and r["last"]["status"] == 500, r
        # the last result published: the previous pass's, which kept the hold
        assert r["last"]["last_result"].startswith(f"unknown for {R470} since "), r["last"]
        assert r["last"]["last_result"].endswith("(gate held)"), r["last"]
        _still_held(w, node)
        # the ClusterPolicy CRD answers 404 (gone, or the operator not installed yet): no operator to hold
        # against, and no complete pass either: the hold stays
        proxy.clear()
        proxy.fail("GET", r"^/apis/nvidia\.com/", 404)
        w.admin.delete(f"/api/v1/namespaces/apps/pods/infer-{node}", gracePeriodSeconds="0")  # nothing breaks now
        w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"x-{node}", node, "registry.test/apps/missing:1"))
        r = w.agent(node, "--driver", R470, client=client, kubeconfig=kc)["last"]
        assert (r["preflight"], r["gate"], r["complete"]) == ("warn", "cannot-hold", False), r
        assert "no ClusterPolicy" in r["gate_message"], r
        assert w.labels(node)[SKIP] == "true" and HOLDS in w.annotations(node)
    finally:
        proxy.close()
    # a complete pass with no regression lifts it
    w.admin.delete(f"/api/v1/namespaces/apps/pods/x-{node}", gracePeriodSeconds="0")
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["gate"], r["complete"]) == ("pass", "clear", True), r
    assert SKIP not in w.labels(node) and HOLDS not in w.annotations(node)


def test_a_watching_agent_keeps_its_hold_while_its_watches_fail(world, client, tmp_path):
    """The API server fails the agent's pod reads and its watch breaks: the cache is not current, so no
    pass lifts the hold, although the breaking pod is gone; once the watch is back, one does."""
    w = world
    node = f"watchfail-{client}"
    w.add_node(node, image="infer")
    proxy = FaultProxy(w.cp.url)
    agent = None
    try:
        kc = proxy.kubeconfig(tmp_path / "proxy.kubeconfig", AGENT_TOKEN)
        agent = w.spawn(node, "--driver", R470, "--interval", "1", client=client, kubeconfig=kc)
        w.admin.wait("held", lambda: w.labels(node).get(SKIP) == "true" and w.passes(node), timeout=60)
        proxy.fail("GET", r"^/api/v1/pods\?", 500)
        proxy.cut()  # every open stream (the watches) breaks
        w.admin.delete(f"/api/v1/namespaces/apps/pods/infer-{node}", gracePeriodSeconds="0")
        n0 = len(w.passes(node))
        w.admin.wait("two passes while the pods' watch fails", lambda: len(w.passes(node)) >= n0 + 2, timeout=30)
        late = w.passes(node)[n0:]
        assert all(p["gate"] == "held" and not p["complete"] and "cache_not_current" in p["reasons"] for p in late), late
        _still_held(w, node)
        proxy.clear()
        w.admin.wait("released once the watch is back", lambda: w.passes(node)[-1]["gate"] == "clear", timeout=60)
        last = w.passes(node)[-1]
        assert (last["complete"], last["workloads"]) == (True, 0), last
        assert SKIP not in w.labels(node) and HOLDS not in w.annotations(node)
        assert agent.poll() is None
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(10)
        proxy.close()


def test_a_silent_watch_marks_its_cache_unhealthy_and_comes_back(world, tmp_path):
    """A half-open connection (the proxy stops passing anything on): the watch is silent, no event and
    no bookmark, so after the idle time the cache is unhealthy (a pass would be incomplete), and it is
    current again once a new watch opens. Watches ask for 5 to 10 minutes and for bookmarks."""
    from compat_hook.cluster.api import kube, reflector

    w = world
    proxy = FaultProxy(w.cp.url)
    r = None
    try:
        k = kube.connect(str(proxy.kubeconfig(tmp_path / "proxy.kubeconfig", ADMIN_TOKEN)))
        r = reflector.Reflector(k, "/api/v1/nodes", query={"fieldSelector": "metadata.name=gpu-a"}, name="node",
                                idle_s=3).start()
        w.admin.wait("the cache current", lambda: r.synced.is_set() and r.healthy, timeout=30, interval=0.1)
        watches = [p for m, p in proxy.seen if "watch=true" in p]
        assert watches and all("allowWatchBookmarks=true" in p for p in watches), watches
        seconds = [int(p.split("timeoutSeconds=")[1].split("&")[0]) for p in watches]
        assert all(300 <= s <= 600 for s in seconds), seconds
        proxy.frozen.set()
        t0 = time.monotonic()
        w.admin.wait("unhealthy", lambda: not r.healthy, timeout=30, interval=0.1)
        took = time.monotonic() - t0
        assert 2.5 <= took < 10, took
        time.sleep(4)  # still silent: the watches made meanwhile never open
        assert not r.healthy and r.error, r.error
        proxy.frozen.clear()
        w.admin.wait("current again", lambda: r.healthy, timeout=60, interval=0.1)
        [node] = r.objects()
        assert node["metadata"]["name"] == "gpu-a"
        print(f"unhealthy {took:.1f} s after the stream went silent (idle time 3 s)")
    finally:
        if r is not None:
            r.stop.set()
        proxy.frozen.clear()
        proxy.close()


def test_a_held_node_the_controller_moved_past_upgrade_required_gets_no_skip_label_back(world, client):
    w = world
    node = f"drain-{client}"
    # a node the driver DaemonSet runs on, with a breaking GPU pod the drain must evict and a
    # PodDisruptionBudget that never lets it: the node stays in drain-required
    w.add_node(node, image="infer", deploy_driver=True)
    w.admin.merge(f"/api/v1/namespaces/apps/pods/infer-{node}", {"metadata": {"labels": {DRAIN: "true", "app": node}}})
    w.admin.create("/apis/policy/v1/namespaces/apps/poddisruptionbudgets", {
        "metadata": {"name": node}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": node}}}})
    try:
        w.admin.wait(f"{node} upgrade-done", lambda: w.labels(node).get(STATE) == "upgrade-done", timeout=60)
        r = w.agent(node, "--driver", R470, client=client)["last"]
        assert (r["preflight"], r["gate"]) == ("fail", "held"), r
        # something makes the node due (the controller's own annotation): the skip label parks it
        w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {
            "nvidia.com/gpu-driver-upgrade-requested": "true"}}})
        w.admin.wait("upgrade-required", lambda: w.labels(node).get(STATE) == "upgrade-required", timeout=60)
        time.sleep(2)
        assert w.labels(node).get(STATE) == "upgrade-required"
        # an admin pushes it through by taking the label off; NVIDIA's controller moves it on
        w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {SKIP: None}}})
        w.admin.wait("drain-required", lambda: w.labels(node).get(STATE) == "drain-required", timeout=60)
        for _ in range(2):
            r = w.agent(node, "--driver", R470, client=client)["last"]
            assert (r["preflight"], r["gate"]) == ("fail", "too-late"), r
            assert "drain-required" in r["gate_message"], r
            assert SKIP not in w.labels(node) and HOLDS not in w.annotations(node)
        [warn] = [e for e in w.events(node) if e["type"] == "Warning" and "too late" in e["message"]]
        assert "drain-required" in warn["message"], warn
        rc, nodes, _ = w.status_json(node, client)
        assert (nodes[node]["hold"], nodes[node]["held"], nodes[node]["upgrade_state"]) == ("too-late", False, "drain-required")
    finally:
        w.admin.delete(f"/apis/policy/v1/namespaces/apps/poddisruptionbudgets/{node}")
        w.admin.delete(f"/api/v1/namespaces/apps/pods/infer-{node}", gracePeriodSeconds="0")


def test_the_override_annotation_releases_the_hold_within_seconds(world, client):
    w = world
    node = f"override-{client}"
    w.add_node(node, image="infer")
    agent = w.spawn(node, "--driver", R470, "--interval", "300", client=client)  # a pass only on a change
    try:
        w.admin.wait("held", lambda: w.labels(node).get(SKIP) == "true", timeout=60)
        t0 = time.monotonic()
        w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {OVERRIDE: "true"}}})
        w.admin.wait("released", lambda: SKIP not in w.labels(node) and HOLDS not in w.annotations(node), timeout=120)
        took = time.monotonic() - t0
        # the watch's event, not the 300 s interval (seconds on a quiet machine; the bound leaves room for load)
        assert took < 120, (took, w.log(node))
        rc, nodes, _ = w.status_json(node, client)
        assert (nodes[node]["verdict"], nodes[node]["hold"], nodes[node]["held"]) == ("fail", "override", False), nodes
        # the override is gone: the hold is back
        w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {OVERRIDE: None}}})
        w.admin.wait("held again", lambda: w.labels(node).get(SKIP) == "true", timeout=30)
        # the pass logs its line after its Event and Lease, a moment after the Node shows the hold
        w.admin.wait("the third pass logged", lambda: len(w.passes(node)) >= 3, timeout=10, interval=0.1)
        assert agent.poll() is None
        assert [p["gate"] for p in w.passes(node)][:3] == ["held", "override", "held"], w.passes(node)
    finally:
        agent.terminate()
        agent.wait(10)


def test_cluster_release_removes_compat_hooks_holds_and_leaves_an_operators_own(world, client):
    w = world
    mine = [f"release-{client}-{i}" for i in range(2)]
    theirs = f"release-{client}-theirs"
    for n in mine:
        _held(w, n, client)
    w.add_node(theirs, labels={SKIP: "true"})
    # an old agent's hold under another prefix
    w.admin.merge(f"/api/v1/nodes/{mine[1]}", {"metadata": {"annotations": {"old.example.com/holds-upgrade": "x"}}})
    p = w.run("release", "--node", mine[0], client=client, kubeconfig=w.release_kc)
    assert p.returncode == 0 and f"released the hold on {mine[0]}" in p.stdout, p.stdout + p.stderr
    assert SKIP not in w.labels(mine[0]) and HOLDS not in w.annotations(mine[0])
    # the agent's last word goes with the hold (its labels stay): an agent installed again starts fresh
    assert f"{PREFIX}/preflight" not in w.annotations(mine[0]) and w.labels(mine[0])[f"{PREFIX}/preflight"] == "fail"
    assert w.labels(mine[1])[SKIP] == "true"
    # the chart's registration label (the agent's, from its installer), held node or not: --all takes it off
    for n in (mine[0], theirs):
        w.admin.merge(f"/api/v1/nodes/{n}", {"metadata": {"labels": {f"{PREFIX}/registration": "nri"}}})
    p = w.run("release", "--all", "--prefix", "old.example.com", client=client, kubeconfig=w.release_kc)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"released the hold on {mine[1]}" in p.stdout, p.stdout
    assert f"removed the label {PREFIX}/registration from {theirs}" in p.stdout, p.stdout
    assert f"{PREFIX}/registration" not in w.labels(mine[0]) and f"{PREFIX}/registration" not in w.labels(theirs)
    assert w.labels(mine[0])[f"{PREFIX}/preflight"] == "fail"  # the agent's other labels stay
    anns = w.annotations(mine[1])
    assert SKIP not in w.labels(mine[1]) and HOLDS not in anns and "old.example.com/holds-upgrade" not in anns, anns
    assert w.labels(theirs)[SKIP] == "true"  # never ours: left alone
    # a token that may not patch nodes: exit 1, one line
    p = w.run("release", "--all", client=client, kubeconfig=w.cp.kubeconfig(NOBODY_TOKEN, "nobody"))
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "403" in p.stderr, p.stderr


def test_a_release_while_the_agent_runs_is_not_undone(world, client):
    """`helm uninstall` runs `cluster release --all` (its pre-delete Job) while the agents still run: an
    agent that saw its hold released holds no more for the same target and regressions, so no hold
    outlives the agents stopped right after. An agent installed again (`helm install`) starts fresh:
    the node whose upgrade breaks a workload is held again."""
    w = world
    node = f"release-running-{client}"
    w.add_node(node, image="infer")
    agent = w.spawn(node, "--driver", R470, "--interval", "300", client=client)  # a pass only on a change
    try:
        w.admin.wait("held", lambda: w.labels(node).get(SKIP) == "true" and HOLDS in w.annotations(node), timeout=60)
        n0 = len(w.passes(node))
        p = w.run("release", "--node", node, client=client, kubeconfig=w.release_kc)
        assert p.returncode == 0 and f"released the hold on {node}" in p.stdout, p.stdout + p.stderr
        # the agent watches its Node: the release starts a pass at once
        w.admin.wait("a pass after the release", lambda: len(w.passes(node)) > n0, timeout=30)
        time.sleep(2)
        last = w.passes(node)[-1]
        assert (last["preflight"], last["gate"]) == ("fail", "released-by-other"), last
        assert SKIP not in w.labels(node) and HOLDS not in w.annotations(node)
        assert json.loads(w.annotations(node)[f"{PREFIX}/preflight"])["gate"] == "released-by-other"
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(10)
    assert SKIP not in w.labels(node)
    r = w.agent(node, "--driver", R470, client=client)["last"]  # installed again
    assert (r["preflight"], r["gate"]) == ("fail", "held"), r
    assert w.labels(node)[SKIP] == "true" and HOLDS in w.annotations(node)


def _bound_agent(w: World, node: str, installation: str) -> tuple:
    """A kubeconfig whose token is bound to a pod of the agent's DaemonSet ``installation`` on ``node`` (as
    the kubelet's projected token is), and that DaemonSet's uid (no controller runs it: its pod stays
    Pending)."""
    import uuid

    uid = str(uuid.uuid4())
    pod = w.admin.create("/api/v1/namespaces/compat-hook/pods", {
        "metadata": {"name": f"{installation}-{node}", "namespace": "compat-hook", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": installation, "uid": uid, "controller": True}]},
        "spec": {"nodeName": node, "serviceAccountName": "compat-hook", "containers": [{"name": "agent", "image": "x"}]}})
    token = w.admin.create("/api/v1/namespaces/compat-hook/serviceaccounts/compat-hook/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"]}}})["status"]["token"]
    return w.cp.kubeconfig(token, f"agent-{installation}-{node}"), uid


def test_a_release_binds_a_restarted_agent_of_the_same_installation_only(world, client):
    """A release a running agent saw is on the Node, bound to the agent's installation (the DaemonSet of
    the pod its token names): the same installation's agent restarted does not hold again, one
    installed again (another DaemonSet) does."""
    w = world
    node = f"release-restart-{client}"
    w.add_node(node, image="infer")
    kc1, ds1 = _bound_agent(w, node, "compat-hook-one")
    kc2, _ = _bound_agent(w, node, "compat-hook-two")
    agent = w.spawn(node, "--driver", R470, "--interval", "300", client=client, kubeconfig=kc1)
    try:
        w.admin.wait("held", lambda: w.labels(node).get(SKIP) == "true" and HOLDS in w.annotations(node), timeout=60)
        n0 = len(w.passes(node))
        p = w.run("release", "--node", node, client=client, kubeconfig=w.release_kc)
        assert p.returncode == 0, p.stdout + p.stderr
        w.admin.wait("the release seen", lambda: len(w.passes(node)) > n0 and w.passes(node)[-1]["gate"]
                     == "released-by-other" and f"{PREFIX}/preflight" in w.annotations(node), timeout=30)
        doc = json.loads(w.annotations(node)[f"{PREFIX}/preflight"])
        assert (doc["gate"], doc["released_by"], doc["agent"]) == ("released-by-other", "release", ds1), doc
    finally:
        agent.terminate()
        agent.wait(10)
    r = w.agent(node, "--driver", R470, client=client, kubeconfig=kc1)["last"]  # restarted
    assert (r["preflight"], r["gate"], r["node_write"]) == ("fail", "released-by-other", "unchanged"), r
    assert SKIP not in w.labels(node) and HOLDS not in w.annotations(node)
    r = w.agent(node, "--driver", R470, client=client, kubeconfig=kc2)["last"]  # installed again
    assert (r["preflight"], r["gate"]) == ("fail", "held"), r
    assert w.labels(node)[SKIP] == "true" and HOLDS in w.annotations(node)


def test_pods_replaced_under_new_names_leave_the_node_and_a_released_hold_alone(world, client):
    """A Job's or a Deployment's pods come back under new names: the same workloads, so the Node is not
    written, no Event is sent, and a hold someone released does not come back."""
    w = world
    node = f"renamed-{client}"
    w.add_node(node)

    def replace(old: str | None, new: str) -> None:
        if old:
            w.admin.delete(f"/api/v1/namespaces/apps/pods/{old}", gracePeriodSeconds="0")
        w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(new, node, ref("infer")))

    replace(None, f"job-{node}-1")
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["gate"], r["node_write"]) == ("fail", "held", "written"), r
    before = w.node(node)["metadata"]
    assert f"job-{node}-1" not in before["annotations"][HOLDS] + before["annotations"][f"{PREFIX}/preflight"]
    events = len(w.events(node))
    replace(f"job-{node}-1", f"job-{node}-2")
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["gate"], r["node_write"], r["event_sent"]) == ("held", "unchanged", False), r
    assert w.node(node)["metadata"]["resourceVersion"] == before["resourceVersion"]
    assert len(w.events(node)) == events
    assert w.details(node)["regressions"][0]["pods"] == [f"apps/job-{node}-2"]  # the details name them
    # an admin pushes the node through: the next pods are the same workloads, so no hold comes back
    w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {SKIP: None}}})
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert r["gate"] == "released-by-other", r
    replace(f"job-{node}-2", f"job-{node}-3")
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["gate"], r["node_write"]) == ("released-by-other", "unchanged"), r
    assert SKIP not in w.labels(node) and HOLDS not in w.annotations(node)


# ----------------------------------------------------------------------------- holds keyed by workload
# (a hold through the pod churn of a real StatefulSet and a real Job: tests/test_cluster_churn.py)


def _quiet_config(w: World, node: str, tmp_path, quiet: float, **cluster) -> pathlib.Path:
    return hookenv.write_config(tmp_path / f"quiet-{node}.yaml", host_root=w.hosts[node], log_file=tmp_path / "d.log",
                                nvml="off", cluster={"gate_upgrade": True, "hold_quiet_s": quiet, **cluster})


def test_a_restarted_agent_counts_an_absent_workload_from_the_node(world, client, tmp_path):
    """Each ``--once`` pass is a new agent process: what it knows of a workload no pod runs now is what
    the Node says (the ``held`` record of its annotation), so it agrees with the one before."""
    w = world
    node = f"restart-{client}"
    quiet = 8
    w.add_node(node, image="infer")
    conf = _quiet_config(w, node, tmp_path, quiet)
    r = w.agent(node, "--driver", R470, client=client, config=conf)["last"]
    assert (r["preflight"], r["gate"], r["regressions"], r["absent_regressions"]) == ("fail", "held", 1, 0), r
    [rec] = json.loads(w.annotations(node)[f"{PREFIX}/preflight"])["held"]["w"].values()
    assert rec == [ref("infer"), None], rec
    w.admin.delete(f"/api/v1/namespaces/apps/pods/infer-{node}", gracePeriodSeconds="0")
    r = w.agent(node, "--driver", R470, client=client, config=conf)["last"]
    assert (r["preflight"], r["gate"], r["regressions"], r["absent_regressions"]) == ("fail", "held", 0, 1), r
    doc = json.loads(w.annotations(node)[f"{PREFIX}/preflight"])
    [[image, gone]] = doc["held"]["w"].values()
    assert image == ref("infer") and abs(gone - time.time()) < 10, doc
    assert "run by no pod now" in w.annotations(node)[HOLDS] and w.labels(node)[SKIP] == "true"
    rc, nodes, _ = w.status_json(node, client)
    assert (rc, nodes[node]["preflight"], nodes[node]["held"]) == (3, "fail", True), nodes
    r = w.agent(node, "--driver", R470, client=client, config=conf)["last"]  # another process: the same clock
    assert (r["gate"], r["absent_regressions"], r["node_write"]) == ("held", 1, "unchanged"), r
    time.sleep(max(0.0, gone + quiet - time.time()) + 1)
    r = w.agent(node, "--driver", R470, client=client, config=conf)["last"]
    assert (r["preflight"], r["gate"], r["absent_regressions"]) == ("pass", "clear", 0), r
    assert SKIP not in w.labels(node) and HOLDS not in w.annotations(node)
    assert "held" not in json.loads(w.annotations(node)[f"{PREFIX}/preflight"])


def test_a_known_regression_is_held_beside_a_pod_the_agent_cannot_read(world, client):
    """Completeness per regressing workload: a pod whose envFrom may set what decides cannot be
    judged, but the regressing pod beside it was: the node is held, and the unknown pod is reported."""
    w = world
    node = f"envfrom-{client}"
    w.add_node(node, image="infer")
    pod = gpu_pod(f"cfg-{node}", node, ref("legacy"))
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "gpu-env"}}]
    w.admin.create("/api/v1/namespaces/apps/pods", pod)
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["gate"], r["complete"]) == ("fail", "held", False), r
    assert (r["regressions"], r["unknown_workloads"]) == (1, 1), r
    assert "not judged" in r["gate_message"] and "envFrom configMapRef gpu-env" in r["gate_message"], r
    assert w.labels(node)[SKIP] == "true" and w.annotations(node)[HOLDS].endswith(ref("infer"))
    [unk] = w.details(node)["unknown_workloads"]
    assert unk["pods"] == [f"apps/cfg-{node}"], unk
    rc, nodes, _ = w.status_json(node, client)
    assert (rc, nodes[node]["hold"]) == (3, "yes"), nodes
    # the regressing pod goes: what is left cannot be judged, so the pass is incomplete and keeps the hold
    w.admin.delete(f"/api/v1/namespaces/apps/pods/infer-{node}", gracePeriodSeconds="0")
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["gate"], r["complete"]) == ("warn", "held", False), r
    assert w.labels(node)[SKIP] == "true"


def test_status_exits_5_for_a_regression_nothing_holds(world, client, tmp_path):
    """``fail`` and not held (here: the gate off) is its own exit status: the upgrade will break it."""
    w = world
    node = f"unheld-{client}"
    w.add_node(node, image="infer")
    off = _quiet_config(w, node, tmp_path, 0, gate_upgrade=False)
    r = w.agent(node, "--driver", R470, client=client, config=off)["last"]
    assert (r["preflight"], r["gate"]) == ("fail", "off"), r
    rc, out, err = w.status(node, client=client)
    assert rc == 5, (out, err)
    assert (_table(out)[node]["PREFLIGHT"], _table(out)[node]["HELD"]) == ("fail", "-"), out
    r = w.agent(node, "--driver", R470, client=client)["last"]  # the gate on: held, and status says 3
    assert r["gate"] == "held", r
    rc, out, err = w.status(node, client=client)
    assert rc == 3 and _table(out)[node]["HELD"] == "yes", (out, err)


def test_a_changed_label_prefix_leaves_no_hold_unsaid(world, client, tmp_path):
    w = world
    node = f"prefix-{client}"
    w.add_node(node, image="infer")
    old = hookenv.write_config(tmp_path / "old.yaml", host_root=w.hosts[node], log_file=tmp_path / "d.log", nvml="off",
                               cluster={"gate_upgrade": True, "label_prefix": "old.example.com"})
    r = w.agent(node, "--driver", R470, client=client, config=old)["last"]
    assert r["gate"] == "held" and "old.example.com/holds-upgrade" in w.annotations(node), r
    r = w.agent(node, "--driver", R470, client=client)["last"]  # the new prefix: the old hold is said, not hidden
    assert (r["preflight"], r["gate"]) == ("fail", "skipped-by-other") and "former_prefix_hold" in r["reasons"], r
    assert f"compat-hook cluster release --node {node} --prefix old.example.com" in r["problem"], r
    p = w.run("release", "--node", node, "--prefix", "old.example.com", client=client, kubeconfig=w.release_kc)
    assert p.returncode == 0 and f"released the hold on {node}" in p.stdout, p.stdout + p.stderr
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert r["gate"] == "held" and "former_prefix_hold" not in r["reasons"] and HOLDS in w.annotations(node), r


def test_status_never_passes_on_a_stale_verdict(world, client):
    w = world
    node = f"stale-{client}"
    w.add_node(node, image="legacy")
    r = w.agent(node, "--interval", "2", client=client)["last"]  # the target from the ClusterPolicy
    assert r["preflight"] in ("pass", "warn") and r["target_from"].startswith("ClusterPolicy cluster-policy"), r
    target = r["target"]
    rc, nodes, _ = w.status_json(node, client)
    assert nodes[node]["preflight"] == r["preflight"] and nodes[node]["stale"] is None, nodes
    # the agent stops: after twice its interval the Lease has expired
    time.sleep(4.5)
    rc, out, _ = w.status(node, client=client)
    row = _table(out)[node]
    assert rc == 2 and row["PREFLIGHT"] == "stale" and "no heartbeat" in row["NOTE"], out
    # fresh again, then a new target is announced: the verdict is for the old one
    w.agent(node, "--interval", "300", client=client)
    rc, nodes, _ = w.status_json(node, client)
    assert nodes[node]["stale"] is None, nodes
    announced = R580 if target != R580 else R590
    w.set_target(announce=announced)
    try:
        rc, out, _ = w.status(node, client=client)
        row = _table(out)[node]
        assert rc == 2 and row["PREFLIGHT"] == "stale", out
        assert row["NOTE"] == f"verdict for {target}, the target now is {announced}", out
    finally:
        w.set_target(remove_announce=True)


def test_status_marks_a_hold_whose_agent_stopped_renewing_it(world, client):
    w = world
    node = f"stalehold-{client}"
    w.add_node(node, image="infer")
    # its Lease lasts two intervals (8 s): long enough for the first status to see it fresh on a loaded machine
    r = w.agent(node, "--driver", R470, "--interval", "4", client=client)["last"]
    renewed = time.monotonic()
    assert r["gate"] == "held", r
    rc, nodes, _ = w.status_json(node, client)
    assert (nodes[node]["hold"], nodes[node]["preflight"]) == ("yes", "fail"), nodes
    # three intervals without a renewal: the verdict is stale once the Lease ran out, the hold at 1.5 Leases
    time.sleep(max(0.0, renewed + 3 * 4 + 1.5 - time.monotonic()))
    rc, out, _ = w.status(node, client=client)
    row = _table(out)[node]
    assert rc == 2 and (row["HELD"], row["PREFLIGHT"]) == ("stale", "stale") and "no heartbeat" in row["NOTE"], out


def test_status_shows_what_the_validator_published(world, client):
    """The validator's ``compat-hook.io/validated`` (a driver version, or ``failed``) in its own column, in
    ``--json`` and counted in the summary; a node it never validated shows ``-``."""
    w = world
    case = f"validated-{client}"
    nodes = {f"{case}-{k}": v for k, v in (("ok", R535), ("failed", "failed"), ("none", None))}
    for n, value in nodes.items():
        w.add_node(n, image="legacy", labels={CASE: case})
        if value is not None:  # what `compat-hook cluster validate` publishes on its Node
            w.admin.merge(f"/api/v1/nodes/{n}", {"metadata": {"labels": {f"{PREFIX}/validated": value}}})
        w.agent(n, client=client)
    rc, out, _ = w.status(case, client=client)
    rows = _table(out)
    assert {n: rows[n]["VALIDATED"] for n in nodes} == {n: v or "-" for n, v in nodes.items()}, out
    assert out.splitlines()[-1].endswith("; 1 failed validation"), out
    rc_json, doc, summary = w.status_json(case, client)
    assert {n: doc[n]["validated"] for n in nodes} == nodes and summary["validation_failed"] == 1, (doc, summary)
    assert rc == rc_json


def test_status_says_when_the_validation_taint_stops_nvidias_controller(world, client):
    """A node with compat-hook's validation-failed taint that the operator's DaemonSets do not tolerate: the
    real DaemonSet controller counts it out while its driver pod runs, and NVIDIA's upgrade controller then
    refuses the DaemonSet for every node (tests/test_node_validator.py). ``cluster status`` names it in the
    NOTE, counts it and exits 2; with the toleration in ``spec.daemonsets.tolerations`` the note is gone."""
    w = world
    case = f"taint-{client}"
    node = f"{case}-a"
    w.add_node(node, image="legacy", labels={CASE: case})
    w.agent(node, client=client)
    cp = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
    key = f"{PREFIX}/validation-failed"
    w.admin.merge(f"/api/v1/nodes/{node}", {"spec": {"taints": [{"key": key, "value": R535, "effect": "NoSchedule"}]}})
    try:
        rc, doc, summary = w.status_json(case, client)
        assert rc == 2 and doc[node]["taint_not_tolerated"] and summary["taint_not_tolerated"] == 1, (rc, doc)
        assert doc[node]["note"].startswith(f"{key} not tolerated by ClusterPolicy cluster-policy "
                                            "spec.daemonsets.tolerations"), doc[node]
        rc_text, out, _ = w.status(case, client=client)
        assert rc_text == 2 and "driver DaemonSet does not tolerate" in out.splitlines()[-1], out
        w.admin.merge(cp, {"spec": {"daemonsets": {"tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": key, "operator": "Exists", "effect": "NoSchedule"}]}}})
        rc, doc, summary = w.status_json(case, client)
        assert not doc[node]["taint_not_tolerated"] and summary["taint_not_tolerated"] == 0, doc
        assert key not in (doc[node]["note"] or ""), doc[node]
    finally:
        w.admin.merge(cp, {"spec": {"daemonsets": {"tolerations": None}}})
        w.admin.merge(f"/api/v1/nodes/{node}", {"spec": {"taints": None}})


def test_the_registration_path_is_a_node_label_and_a_status_column(world, client, tmp_path):
    """What the chart's installer wrote (--registration-file) becomes ``compat-hook.io/registration``; a
    pass that finds it unchanged writes nothing; ``cluster status`` shows it (PATH, ``path`` in --json),
    and a node whose NRI plugin is not connected makes it exit 2 although its preflight passes. A file
    that says something else, or none, leaves the label as it is."""
    w = world
    node = f"regpath-{client}"
    w.add_node(node, image="legacy", gpu=H100, driver=R535)
    word = tmp_path / "registration"
    word.write_text("nri\n")
    r = w.agent(node, "--driver", R580, "--registration-file", str(word), client=client)["last"]
    assert r["preflight"] == "pass" and w.labels(node)[f"{PREFIX}/registration"] == "nri", r
    r = w.agent(node, "--driver", R580, "--registration-file", str(word), client=client)["last"]
    assert r["node_write"] == "unchanged", r
    rc, out, _ = w.status(node, client=client)
    assert rc == 0 and _table(out)[node]["PATH"] == "nri", out
    word.write_text("nri-not-connected\n")
    r = w.agent(node, "--driver", R580, "--registration-file", str(word), client=client)["last"]
    assert r["node_write"] == "written" and w.labels(node)[f"{PREFIX}/registration"] == "nri-not-connected", r
    rc, out, _ = w.status(node, client=client)
    row = _table(out)[node]
    assert rc == 2 and (row["PREFLIGHT"], row["PATH"]) == ("pass", "nri (not connected)"), out
    assert out.splitlines()[-1].endswith("; 1 with the NRI plugin not connected"), out
    rc_json, nodes, summary = w.status_json(node, client)
    assert rc_json == 2 and nodes[node]["path"] == "nri (not connected)" and summary["nri_not_connected"] == 1
    for junk in ("wrapper\n", None):  # not a path the installer writes; no file: the label stays
        if junk is None:
            word.unlink()
        else:
            word.write_text(junk)
        r = w.agent(node, "--driver", R580, "--registration-file", str(word), client=client)["last"]
        assert r["node_write"] == "unchanged" and w.labels(node)[f"{PREFIX}/registration"] == "nri-not-connected"
    word.write_text("runtimeclass\n")
    w.agent(node, "--driver", R580, "--registration-file", str(word), client=client)
    rc, out, _ = w.status(node, client=client)
    assert rc == 0 and _table(out)[node]["PATH"] == "runtimeclass", out
    # A running agent says it once: after `cluster release --all` (helm uninstall's pre-delete Job) took the
    # label off, its later passes leave it off; a new word from the installer is written again.
    key = f"{PREFIX}/registration"
    agent = w.spawn(node, "--driver", R580, "--interval", "1", "--registration-file", str(word), client=client)
    try:
        w.admin.wait("a pass", lambda: len(w.passes(node)) >= 1, timeout=60)
        p = w.run("release", "--all", client=client, kubeconfig=w.release_kc)
        assert p.returncode == 0 and f"removed the label {key} from {node}" in p.stdout, p.stdout + p.stderr
        n0 = len(w.passes(node))
        w.admin.wait("three more passes", lambda: len(w.passes(node)) >= n0 + 3, timeout=60)
        assert key not in w.labels(node), w.labels(node)
        word.write_text("nri\n")
        w.admin.wait("the new word", lambda: w.labels(node).get(key) == "nri", timeout=30)
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(10)


def test_backoff_honours_retry_after(world, client, tmp_path):
    w = world
    node = f"retryafter-{client}"
    w.add_node(node, image="legacy")
    proxy = FaultProxy(w.cp.url)
    agent = w.spawn(node, "--driver", R470, "--interval", "1", "--no-watch", client=client,
                    kubeconfig=proxy.kubeconfig(tmp_path / "proxy.kubeconfig", AGENT_TOKEN))
    try:
        proxy.fail("GET", rf"^/api/v1/nodes/{node}", 429, retry_after=7)
        w.admin.wait("a 429", lambda: [r for r in w.log(node) if r["event"] == "cluster_error"], timeout=30)
        [err] = [r for r in w.log(node) if r["event"] == "cluster_error"][:1]
        assert err["status"] == 429 and 7 <= err["retry_in"] <= 8, err
        time.sleep(3)
        assert len([r for r in w.log(node) if r["event"] == "cluster_error"]) == 1  # waited, did not hammer
    finally:
        agent.terminate()
        agent.wait(10)
        proxy.close()


def test_an_image_broken_now_and_after_does_not_hold_the_node(world, client):
    w = world
    node = f"broken-now-{client}"
    w.add_node(node, image="future")  # CUDA 13.0 without a compat driver: broken on R535 and on R470
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["regressions"], r["broken_now_and_after"], r["gate"]) == ("warn", 0, 1, "clear"), r
    assert SKIP not in w.labels(node) and w.labels(node)[f"{PREFIX}/preflight.broken"] == "0"
    [row] = w.details(node)["broken_now_and_after"]
    assert (row["image"], row["pods"], row["now"], row["after"]) == (ref("future"), [f"apps/future-{node}"], "broken", "broken")


# ----------------------------------------------------------------------------- the GPUs and the pods


@pytest.mark.parametrize("case, gpu, now, target, image, verdict", [
    pytest.param("h100-r470", H100, R535, R470, "legacy", "fail", id="h100-r470"),  # R470 does not drive Hopper
    pytest.param("h100-r580", H100, R535, R580, "legacy", "pass", id="h100-r580"),
    pytest.param("v100-r590", V100, R580, R590, "legacy", "fail", id="v100-r590"),  # R580: the last for Volta
])
def test_the_target_must_drive_the_nodes_gpu(world, client, case, gpu, now, target, image, verdict):
    """A CUDA 11.8 pod: on an H100 a rollback to R470 breaks it (held), R580 does not; a V100 on R580
    moving to R590 breaks."""
    w = world
    node = f"{case}-{client}"
    w.add_node(node, image=image, gpu=gpu, driver=now)
    r = w.agent(node, "--driver", target, client=client)["last"]
    assert r["preflight"] == verdict, r
    if verdict == "fail":
        assert r["gate"] == "held" and w.labels(node)[SKIP] == "true", r
        [reg] = w.details(node)["regressions"]
        assert reg["reason"] == "gpu_unsupported_by_driver" and reg["error"] == 100, reg


@pytest.mark.parametrize("runtime_class, regresses", [("nvidia", True), ("cuda-compat", False)])
def test_the_pods_own_env_and_runtime_class_decide(world, client, runtime_class, regresses):
    """A compat image (driver 550) whose pod sets LD_LIBRARY_PATH to the compat dir, on 535 moving to 580:
    through the NVIDIA toolkit alone the 550 compat driver loads over the 580 host (803); through
    compat-hook it does not."""
    w = world
    node = f"env-{runtime_class}-{client}"
    w.add_node(node, image="train", runtime_class=runtime_class, env=[("LD_LIBRARY_PATH", "/usr/local/cuda/compat")])
    r = w.agent(node, "--driver", R580, client=client)["last"]
    assert (r["preflight"] == "fail", r["regressions"]) == (regresses, int(regresses)), r


@pytest.mark.parametrize("path, regressions", [("nri", 0), ("runtimeclass", 2)])
def test_the_nodes_registration_says_which_pods_run_through_compat_hook(world, client, tmp_path, path, regressions):
    """The compat image's pods set LD_LIBRARY_PATH to its compat dir and name no RuntimeClass: a plain GPU
    pod, and one that gets its GPU only from NVIDIA's annotation (nvidia.cdi.k8s.io/container.<name>).
    On a node the installer registered ``nri`` the plugin routes both, so compat-hook's outcome counts
    (the host's driver on 580); on a ``runtimeclass`` node the toolkit alone serves them (803)."""
    w = world
    node = f"path-{path}-{client}"
    w.add_node(node)
    ld = [("LD_LIBRARY_PATH", "/usr/local/cuda/compat")]
    w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"plain-{node}", node, ref("train"), runtime_class=None,
                                                           env=ld))
    annotated = gpu_pod(f"nvidia-{node}", node, ref("train"), runtime_class=None, env=ld)
    del annotated["spec"]["containers"][0]["resources"]
    annotated["metadata"]["annotations"] = {"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=all"}
    w.admin.create("/api/v1/namespaces/apps/pods", annotated)
    word = tmp_path / "registration"
    word.write_text(path + "\n")
    r = w.agent(node, "--driver", R580, "--registration-file", str(word), client=client)["last"]
    assert (r["workloads"], r["regressions"]) == (2, regressions), r
    # through compat-hook the outcome changes (the compat driver now, the host's after): warn, not held
    assert r["preflight"] == ("fail" if regressions else "warn"), r
    recorded = json.loads((w.work / "state" / node / "workloads.json").read_text())["workloads"]
    assert sorted(p for x in recorded for p in x["pods"]) == [f"apps/nvidia-{node}", f"apps/plain-{node}"], recorded


@pytest.mark.parametrize("allocated, held", [
    pytest.param("gpu.nvidia.com", True, id="nvidia-gpu"),
    pytest.param("nic.example.com", False, id="other-driver"),
    pytest.param(None, True, id="not-allocated"),
])
def test_a_dra_claim_counts_as_a_gpu_by_the_driver_it_was_allocated(world, client, allocated, held):
    """A pod whose container gets a device only from a DRA ResourceClaim (``resource.k8s.io/v1``), running
    the compat image through the NVIDIA toolkit alone with its compat dir on ``LD_LIBRARY_PATH``: 803 on
    580 if that device is a GPU. The agent (the chart's RBAC: list/watch of ResourceClaims) reads the
    claim: allocated NVIDIA's ``gpu.nvidia.com`` device, the pod is a GPU workload and the node is held;
    allocated only another driver's (a NIC), it is not one; not allocated yet, it counts (never a
    workload left out for want of its claim)."""
    w = world
    node = f"dra-{allocated or 'none'}-{client}".replace(".", "-")
    w.add_node(node)
    claims = "/apis/resource.k8s.io/v1/namespaces/apps/resourceclaims"
    cls = allocated or "gpu.nvidia.com"
    w.admin.create(claims, {"metadata": {"name": node}, "spec": {"devices": {"requests": [
        {"name": "dev", "exactly": {"deviceClassName": cls}}]}}})
    if allocated:
        w.admin.merge(f"{claims}/{node}/status", {"status": {"allocation": {"devices": {"results": [
            {"request": "dev", "driver": allocated, "pool": node, "device": "dev-0"}]}}}})
    pod = gpu_pod(f"claimed-{node}", node, ref("train"), runtime_class="nvidia",
                  env=[("LD_LIBRARY_PATH", "/usr/local/cuda/compat")])
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
    pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimName": node}]
    w.admin.create("/api/v1/namespaces/apps/pods", pod)
    want = (1, 1, "held") if held else (0, 0, "clear")
    r = w.agent(node, "--driver", R580, client=client)["last"]
    assert (r["workloads"], r["regressions"], r["gate"]) == want, r
    assert (w.labels(node).get(SKIP) == "true") is held
    # a watching agent reads the claim from its cache (kept slim), from its first pass on
    agent = w.spawn(node, "--driver", R580, "--interval", "2", client=client)
    try:
        w.admin.wait("a watching agent's first pass", lambda: w.passes(node), timeout=60)
        first = w.passes(node)[0]
        assert (first["workloads"], first["regressions"], first["gate"]) == want, first
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(10)


def test_pods_are_read_as_the_engine_starts_them(world, client):
    """The pod's env, its unresolvable variables and its RuntimeClass reach the assessment; the pods
    behind each workload are named."""
    w = world
    node = f"pods-{client}"
    w.add_node(node)
    pods = w.admin.create
    pods("/api/v1/namespaces/apps/pods", gpu_pod(f"a-{node}", node, ref("infer")))
    pods("/api/v1/namespaces/apps/pods", gpu_pod(f"b-{node}", node, ref("infer")))
    secret_pod = gpu_pod(f"c-{node}", node, ref("legacy"))
    secret_pod["spec"]["containers"][0]["env"] = [
        {"name": "LD_LIBRARY_PATH", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    pods("/api/v1/namespaces/apps/pods", secret_pod)
    pods("/api/v1/namespaces/apps/pods", {"metadata": {"name": f"cpu-{node}", "namespace": "apps"},
                                          "spec": {"nodeName": node, "containers": [{"name": "c", "image": ref("future")}]}})
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["workloads"], r["regressions"], r["unknown_workloads"]) == (2, 1, 1), r
    assert (r["preflight"], r["complete"]) == ("fail", False), r
    # completeness per regressing workload: the regression was read and judged, so it is held; what
    # could not be judged (the other pod's secret) is said, not a reason to let the upgrade through
    assert r["gate"] == "held" and "not judged" in r["gate_message"] and "secretKeyRef" in r["gate_message"], r
    assert w.labels(node)[SKIP] == "true" and HOLDS in w.annotations(node)
    rc, nodes, _ = w.status_json(node, client)
    assert (rc, nodes[node]["hold"], nodes[node]["held"]) == (3, "yes", True), nodes
    d = w.details(node)
    [reg] = d["regressions"]
    assert reg["pods"] == [f"apps/a-{node}", f"apps/b-{node}"], reg
    [unk] = d["unknown_workloads"]
    assert unk["pods"] == [f"apps/c-{node}"] and "LD_LIBRARY_PATH comes from secretKeyRef" in unk["why"], unk
    workloads = json.loads((w.work / "state" / node / "workloads.json").read_text())
    assert workloads["driver"] == R535 and workloads["version"] == 1
    assert sorted((x["image"], tuple(x["pods"])) for x in workloads["workloads"]) == sorted([
        (ref("infer"), (f"apps/a-{node}", f"apps/b-{node}")), (ref("legacy"), (f"apps/c-{node}",))])


def test_only_the_validators_own_probe_pods_are_left_out(world, client):
    """A tenant's GPU pod labelled like the validator's probe is a workload like any other (assessed,
    held, recorded for the validator); the validator's own probe pod, in compat-hook's namespace, is not
    (its image is in no store: counted, it would make the pass incomplete)."""
    from compat_hook.cluster.node import validate

    w = world
    node = f"probe-label-{client}"
    w.add_node(node)
    w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"infer-{node}", node, ref("infer"),
                                                           labels={"app.kubernetes.io/name": "compat-hook-probe"}))
    opts = validate.ValidatorOptions(node, publish_namespace="compat-hook", probe_image="localhost/compat-hook:0")
    probe = validate.probe_pod(opts, {"image": "registry.test/apps/missing:1", "env": [], "runtime_class": None})
    w.admin.create("/api/v1/namespaces/compat-hook/pods", probe)
    try:
        r = w.agent(node, "--driver", R470, client=client)["last"]
        assert (r["workloads"], r["not_in_store"], r["regressions"]) == (1, 0, 1), r
        assert (r["preflight"], r["gate"], r["complete"]) == ("fail", "held", True), r
        assert w.labels(node)[SKIP] == "true" and HOLDS in w.annotations(node)
        recorded = json.loads((w.work / "state" / node / "workloads.json").read_text())["workloads"]
        assert [(x["image"], x["pods"]) for x in recorded] == [(ref("infer"), [f"apps/infer-{node}"])], recorded
    finally:
        w.admin.delete(f"/api/v1/namespaces/compat-hook/pods/{probe['metadata']['name']}", gracePeriodSeconds="0")


# ----------------------------------------------------------------------------- the operator's view


def test_the_agent_follows_the_operators_active_clusterpolicy(world, client):
    w = world
    node = f"policies-{client}"
    w.add_node(node, image="legacy")
    spec = w.admin.get(CP)["spec"]
    # one sorted before the active one by name but marked ignored by the operator, one created after it
    extra = {"a-ignored": R470, "zz-newer": R570}
    for name, announce in extra.items():
        w.admin.create("/apis/nvidia.com/v1/clusterpolicies", {
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": name, "annotations": {f"{PREFIX}/next-driver": announce}}, "spec": spec})
    obj = w.admin.get("/apis/nvidia.com/v1/clusterpolicies/a-ignored")
    obj["status"] = {"state": "ignored"}
    w.admin.request("PUT", "/apis/nvidia.com/v1/clusterpolicies/a-ignored/status", obj)
    try:
        r = w.agent(node, client=client)["last"]
        assert r["target"] == spec["driver"]["version"], r
        assert r["target_from"] == ("ClusterPolicy cluster-policy spec.driver.version "
                                    "(the active one of 3 (1 marked ignored))"), r
    finally:
        for name in extra:
            w.admin.delete(f"/apis/nvidia.com/v1/clusterpolicies/{name}")


def test_a_bad_announcement_is_a_warning_and_keeps_the_hold(world, client):
    w = world
    node = f"announce-{client}"
    w.add_node(node, image="infer")
    w.set_target(announce=R470)
    try:
        r = w.agent(node, client=client)["last"]
        assert (r["target"], r["preflight"], r["gate"]) == (R470, "fail", "held"), r
        for bad in ("latest", "v570.195.03", "570"):
            w.set_target(announce=bad)
            r = w.agent(node, client=client)["last"]
            assert (r["target"], r["preflight"], r["gate"]) == (None, "unknown", "held"), r
            assert "bad_announcement" in r["reasons"] and repr(bad) in r["problem"], r
            _still_held(w, node)
        warnings = [e["message"] for e in w.events(node) if e["type"] == "Warning"]
        # one Warning per bad value: an operator's fix that is bad again is news too
        for bad in ("latest", "v570.195.03", "570"):
            assert len([m for m in warnings if "next-driver" in m and repr(bad) in m]) == 1, (bad, warnings)
        w.agent(node, client=client)  # the same bad value again: no new Event
        assert len([e for e in w.events(node) if e["type"] == "Warning"]) == len(warnings), w.events(node)
        # a branch is what a precompiled driver is announced by
        w.admin.merge(CP, {"spec": {"driver": {"usePrecompiled": True}}})
        w.set_target(announce="470")
        r = w.agent(node, client=client)["last"]
        assert (r["target"], r["preflight"], r["gate"]) == ("470", "fail", "held"), r
    finally:
        w.admin.merge(CP, {"spec": {"driver": {"usePrecompiled": None}}})
        w.set_target(remove_announce=True)


def test_autoupgrade_off_cannot_hold(world, client):
    w = world
    node = f"noauto-{client}"
    w.add_node(node, image="infer")
    w.admin.merge(CP, {"spec": {"driver": {"upgradePolicy": {"autoUpgrade": False}}}})
    try:
        r = w.agent(node, "--driver", R470, client=client)["last"]
        assert (r["preflight"], r["gate"]) == ("fail", "cannot-hold"), r
        assert "autoUpgrade" in r["gate_message"] and SKIP not in w.labels(node), r
        [ev] = w.events(node)
        assert ev["type"] == "Warning" and "cannot hold" in ev["message"], ev
    finally:
        w.admin.merge(CP, {"spec": {"driver": {"upgradePolicy": {"autoUpgrade": True}}}})


def test_archives_are_matched_by_their_names_or_refused(world, client, tmp_path):
    w = world
    node = f"archives-{client}"
    w.add_node(node, image="infer")
    oci_archive = tmp_path / "store.tar"  # the store's four images, each named by its full reference
    subprocess.run(["tar", "-C", str(w.store), "-cf", str(oci_archive), "."], check=True)
    docker_archive = tmp_path / "docker.tar"
    skopeo("copy", "--quiet", f"oci:{w.store}:{ref('infer')}", f"docker-archive:{docker_archive}:{ref('infer')}")
    for store in (f"oci-archive:{oci_archive}", f"docker-archive:{docker_archive}"):
        r = w.agent(node, "--driver", R470, client=client, store=store)["last"]
        assert (r["preflight"], r["regressions"], r["not_in_store"], r["complete"]) == ("fail", 1, 0, True), (store, r)
    # an archive whose images are named by a tag alone cannot be matched: refused, in one line
    skopeo("copy", "--quiet", f"oci:{w.store}:{ref('infer')}", f"oci-archive:{tmp_path / 'tagonly.tar'}:v1")
    r = w.agent(node, "--driver", R470, client=client, store=f"oci-archive:{tmp_path / 'tagonly.tar'}")["last"]
    assert (r["preflight"], r["complete"]) == ("warn", False) and "only by tags" in r["problem"], r
    assert r["gate"] == "held", r  # the earlier hold stays: this pass read nothing


def test_no_crash_without_the_nvidiadriver_crd_and_on_odd_answers(world, client, tmp_path):
    """The GPU Operator before 23.9 has no NVIDIADriver CRD: a 404, in a pass and in the watch."""
    w = world
    node = f"nocrd-{client}"
    w.add_node(node, image="legacy")
    proxy = FaultProxy(w.cp.url)
    try:
        proxy.fail("GET", r"^/apis/nvidia\.com/v1alpha1/", 404)
        proxy.fail("GET", r"^/apis/coordination", 418)  # an answer nobody expects: one line, exit 1
        kc = proxy.kubeconfig(tmp_path / "proxy.kubeconfig", AGENT_TOKEN)
        r = w.agent(node, client=client, kubeconfig=kc, check=False)
        assert r["rc"] == 1 and r["last"]["status"] == 418 and "injected by the test" in r["last"]["message"], r
        proxy.clear()
        proxy.fail("GET", r"^/apis/nvidia\.com/v1alpha1/", 404)
        agent = w.spawn(node, "--interval", "300", client=client, kubeconfig=kc)
        try:
            w.admin.wait("a pass", lambda: w.passes(node), timeout=60)
            time.sleep(2)
            assert agent.poll() is None
            [p] = w.passes(node)
            assert p["complete"] and p["target_from"].startswith("ClusterPolicy cluster-policy"), p
        finally:
            agent.terminate()
            agent.wait(10)
        # without watches, a pass a second: the missing CRD is asked for once, then after a backoff (30 s
        # at least), not on every pass
        n0 = len(w.passes(node))
        seen0 = len(proxy.seen)
        agent = w.spawn(node, "--interval", "1", "--no-watch", client=client, kubeconfig=kc)
        try:
            w.admin.wait("five passes", lambda: len(w.passes(node)) >= n0 + 5, timeout=60)
            assert agent.poll() is None
        finally:
            agent.terminate()
            agent.wait(10)
        asked = [p for m, p in proxy.seen[seen0:] if "/nvidiadrivers" in p]
        policies = [p for m, p in proxy.seen[seen0:] if "/clusterpolicies" in p]
        assert len(asked) == 1 and len(policies) >= 5, (asked, len(policies))
        assert all(p["complete"] for p in w.passes(node)[n0:]), w.passes(node)[n0:]
    finally:
        proxy.close()


def test_a_missing_namespace_is_one_clear_line(world, client):
    """The agent run by hand where the chart's namespace is not: one line that says so, exit 1."""
    w = world
    node = f"nons-{client}"
    w.add_node(node, image="legacy")
    r = w.agent(node, "--publish-namespace", "no-such-ns", client=client, kubeconfig=w.admin_kc, check=False)
    assert r["rc"] == 1 and r["last"]["event"] == "cluster_error" and r["last"]["status"] == 404, r
    msg = r["last"]["message"]
    assert "the namespace no-such-ns does not exist" in msg and "--publish-namespace" in msg, msg
    assert "{" not in msg and "\n" not in msg, msg  # not the API server's Status body


# ----------------------------------------------------------------------------- the loop: faults, watches, cost


def test_api_server_stops_mid_run_and_comes_back(world, client):
    w = world
    node = f"apistop-{client}"
    w.add_node(node, image="infer")
    agent = w.spawn(node, "--driver", R470, "--interval", "1", client=client)
    down = False
    try:
        w.admin.wait("first pass", lambda: w.labels(node).get(f"{PREFIX}/preflight") == "fail")
        w.cp.stop_apiserver()
        down = True
        time.sleep(4)
        assert agent.poll() is None, "the agent exited while the API server was down"
        errors = [r for r in w.log(node) if r["event"] == "cluster_error"]
        assert errors and errors[-1]["reason"] == "cluster_api" and errors[-1]["retry_in"] > 0, errors
        assert errors[-1]["last_result"].startswith(f"fail for {R470}"), errors[-1]
        assert "unreachable" in errors[-1]["message"] or errors[-1]["status"] >= 500, errors[-1]
        w.cp.start_apiserver()
        down = False
        # the next pass after it is back sees the fix
        w.admin.delete(f"/api/v1/namespaces/apps/pods/infer-{node}", gracePeriodSeconds="0")
        w.admin.wait("a pass after the API server came back",
                     lambda: w.labels(node).get(f"{PREFIX}/preflight") == "pass", timeout=90)
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(10)
        if down:  # the module's other tests need it back, whatever failed above
            w.cp.start_apiserver()


def test_a_conflicting_writer_never_loses_its_labels(world, client):
    import threading

    w = world
    node = f"conflict-{client}"
    w.add_node(node, image="infer")
    stop = threading.Event()
    writes = []

    def hammer():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"other-writer/seq": str(i)}}})
                writes.append(i)
            except (ApiError, OSError):
                pass
            time.sleep(0.02)

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    try:
        r = w.agent(node, "--driver", R470, client=client)["last"]
    finally:
        stop.set()
        t.join(10)
    assert r["preflight"] == "fail" and r["node_write"] == "written" and r["conflicts"] >= 1, r
    labels = w.labels(node)
    assert labels["other-writer/seq"] == str(writes[-1]), (labels, writes[-3:])  # the other writer's last write stands
    assert labels[f"{PREFIX}/preflight"] == "fail" and labels[SKIP] == "true"


def test_an_operators_own_skip_label_is_left_alone(world, client):
    w = world
    node = f"theirs-{client}"
    w.add_node(node, image="infer", labels={SKIP: "true"})
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["gate"]) == ("fail", "skipped-by-other"), r
    assert w.labels(node)[SKIP] == "true" and HOLDS not in w.annotations(node)
    w.admin.delete(f"/api/v1/namespaces/apps/pods/infer-{node}", gracePeriodSeconds="0")
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert (r["preflight"], r["gate"]) == ("pass", "skipped-by-other"), r
    assert w.labels(node)[SKIP] == "true"  # never removed: it is not compat-hook's


def test_rbac_denied_is_one_clear_line_and_the_agent_stays_up(world, client):
    w = world
    node = f"rbac-{client}"
    w.add_node(node, image="infer")
    nobody = w.cp.kubeconfig(NOBODY_TOKEN, "nobody")
    r = w.agent(node, client=client, kubeconfig=nobody, check=False)
    assert r["rc"] == 1 and r["last"]["event"] == "cluster_error" and r["last"]["status"] == 403, r
    assert "forbidden" in r["last"]["message"] and f"/api/v1/nodes/{node}" in r["last"]["message"], r["last"]
    agent = w.spawn(node, "--interval", "1", client=client, kubeconfig=nobody)
    try:
        time.sleep(5)
        assert agent.poll() is None, "the agent exited on 403"
        errors = [x for x in w.log(node) if x["event"] == "cluster_error"]
        assert len(errors) >= 2 and all(e["status"] == 403 for e in errors), errors
        # exponential: each wait within [2^n / 2, 2^n] (capped), so the second is at least the first's floor
        assert all(2 ** n / 2 <= e["retry_in"] <= 2 ** n for n, e in enumerate(errors[:3])), errors
    finally:
        agent.terminate()
        agent.wait(10)
    rc, out, err = w.status(node, client=client, kubeconfig=nobody)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "403" in err, (rc, out, err)


def test_hostile_annotations_and_huge_pod_image_lists_stay_bounded(world, client):
    w = world
    node = f"hostile-{client}"
    w.add_node(node, annotations={
        f"{PREFIX}/preflight": "{" * 100000, f"{PREFIX}/next-driver": "x" * 5000,
        "nvidia.com/gpu-driver-upgrade-requested": "true"},
        labels={STATE: "upgrade-required", f"{PREFIX}/preflight.broken": "9999999999"})
    for i in range(40):  # 40 pods x 8 distinct images each: more workloads than a pass reads
        w.admin.create("/api/v1/namespaces/apps/pods", {
            "metadata": {"name": f"many-{i}-{node}", "namespace": "apps"},
            "spec": {"nodeName": node, "containers": [
                {"name": f"c{j}", "image": f"registry.test/flood/{i}-{j}:{'t' * 100}",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}} for j in range(8)]}})
    w.admin.create("/api/v1/namespaces/apps/pods", {
        "metadata": {"name": f"long-ref-{node}", "namespace": "apps"},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "registry.test/" + "x" * 4000, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    r = w.agent(node, "--driver", R470, client=client)["last"]
    assert r["preflight"] == "warn" and r["not_in_store"] == 256 and "left out" in r["problem"], r
    assert not r["complete"] and r["gate"] == "clear", r
    raw = w.annotations(node)[f"{PREFIX}/preflight"]
    assert len(raw) <= 4096 and json.loads(raw)["verdict"] == "warn", raw
    d = w.details(node)
    assert len(json.dumps(d)) <= 256 << 10 and d["counts"]["not_in_store"] == 256, d["counts"]
    rc, nodes, _ = w.status_json(node, client)
    assert nodes[node]["preflight"] == "warn" and nodes[node]["broken"] == 0
    # a node whose annotation is garbage and whose label is not a count: shown, not fatal
    w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {
        "annotations": {f"{PREFIX}/preflight": "[" * 70000}, "labels": {f"{PREFIX}/preflight.broken": "lots"}}})
    rc, nodes, _ = w.status_json(node, client)
    assert nodes[node]["broken"] is None and nodes[node]["target"] == R470


def test_a_watching_agent_reacts_to_what_matters_and_leaves_the_node_quiet(world, client):
    w = world
    node = f"quiet-{client}"
    w.add_node(node, image="legacy")
    agent = w.spawn(node, "--interval", "300", client=client)  # polling alone would take 5 minutes
    try:
        w.admin.wait("first pass", lambda: w.passes(node), timeout=60)
        first = w.passes(node)[0]
        # what does not matter: a non-GPU pod, an unrelated label, a ClusterPolicy status write
        w.admin.create("/api/v1/namespaces/apps/pods", {"metadata": {"name": f"cpu-{node}", "namespace": "apps"},
                                                        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})
        w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"unrelated.example.com/x": "1"}}})
        cp = w.admin.get(CP)
        cp["status"] = {"state": "ready", "seen": time.time()}
        w.admin.request("PUT", CP + "/status", cp)
        time.sleep(3)
        assert len(w.passes(node)) == 1, w.passes(node)
        # the agent's keys are its field manager's, by server-side apply
        mine = [m for m in w.node(node)["metadata"]["managedFields"]
                if (m["manager"], m["operation"]) == ("compat-hook-agent", "Apply")]
        assert mine and all(m["time"] <= first["time"][:19] + "Z" for m in mine), (mine, first)
        # what matters: the announced target (every agent at once: a jittered wait), a GPU pod
        t0 = time.monotonic()
        w.set_target(announce=R570)
        w.admin.wait("the announced target", lambda: len(w.passes(node)) >= 2, timeout=150)
        # a random share of up to 30 s (a tenth of the interval), not the 300 s interval itself
        assert time.monotonic() - t0 < 150
        second = w.passes(node)[1]
        assert second["target"] == R570, second
        # from the caches: no read in the pass, only writes (the Node, the details, an Event, the Lease)
        assert not [k for k in second["api_requests"] if k.startswith(("GET", "LIST"))], second["api_requests"]
        w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"infer-{node}", node, ref("infer")))
        w.admin.wait("the new GPU pod's pass", lambda: len(w.passes(node)) >= 3, timeout=30)
        assert w.passes(node)[2]["workloads"] == 2
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(10)
        w.set_target(remove_announce=True)


def test_the_agent_reads_its_config_again_at_every_pass(world, client, tmp_path):
    w = world
    node = f"config-{client}"
    w.add_node(node, image="infer")
    conf = hookenv.write_config(tmp_path / "c.yaml", host_root=w.hosts[node], log_file=tmp_path / "d.log", nvml="off",
                                cluster={"gate_upgrade": False})
    agent = w.spawn(node, "--driver", R470, "--interval", "1", client=client, config=conf)
    try:
        w.admin.wait("a pass", lambda: w.passes(node), timeout=60)
        assert w.passes(node)[0]["gate"] == "off" and SKIP not in w.labels(node)
        conf.write_text("cluster: {gate_upgrade: [not a bool]}\n")  # a broken file keeps the last good config
        time.sleep(2.5)
        assert agent.poll() is None and SKIP not in w.labels(node)
        assert [r for r in w.log(node) if r["event"] == "cluster_config_error"], w.log(node)
        hookenv.write_config(conf, host_root=w.hosts[node], log_file=tmp_path / "d.log", nvml="off",
                             cluster={"gate_upgrade": True})
        w.admin.wait("held once the gate is on", lambda: w.labels(node).get(SKIP) == "true", timeout=30)
    finally:
        agent.terminate()
        agent.wait(10)


# ----------------------------------------------------------------------------- node-local outputs, cost


def test_nfd_feature_file_and_textfile(world, client, tmp_path):
    w = world
    node = f"files-{client}"
    w.add_node(node, image="infer")
    log = tmp_path / "decisions.log"
    log.write_text('{"event":"decision","effect":"compat","reason":"compat_newer_supported"}\n' * 3
                   + '{"event":"decision","effect":"none","reason":"no_gpu_request"}\nnot json\n')
    conf = hookenv.write_config(tmp_path / "c.yaml", host_root=w.hosts[node], log_file=log, nvml="off",
                                cluster={"nfd_features_file": str(tmp_path / "features.d" / "compat-hook"),
                                         "textfile": str(tmp_path / "textfile" / "compat-hook.prom")})
    r = w.agent(node, "--driver", R470, config=conf, client=client)["last"]
    assert r["preflight"] == "fail"
    assert (tmp_path / "features.d" / "compat-hook").read_text() == (
        f"{PREFIX}/preflight=fail\n{PREFIX}/preflight.broken=1\n{PREFIX}/preflight.target-driver={R470}\n")
    prom = (tmp_path / "textfile" / "compat-hook.prom").read_text()
    assert 'compat_hook_preflight_workloads{class="regression"} 1' in prom
    assert 'compat_hook_preflight_result{result="fail"} 1' in prom
    assert 'compat_hook_decisions{effect="compat",reason="compat_newer_supported"} 3' in prom
    assert "compat_hook_preflight_last_run_timestamp_seconds " in prom
    assert not list((tmp_path / "textfile").glob(".*"))  # no temp file left behind


def test_pass_cost_50_pods_20_images(world, tmp_path):
    """The measured numbers: one ``--once`` pass over 50 GPU pods using 20 images (all in the store)."""
    w = world
    store = Layout(tmp_path / "store")
    r = rootfs.build_rootfs(tmp_path / "root", compat_lib=None)
    layer = gz(tar_dir(r))
    for i in range(20):
        desc = store.image([layer], env=[f"CUDA_VERSION=12.{i % 9}.0", "PATH=/usr/bin:/bin"])
        store.tag(desc, f"registry.test/bench/app{i}:1")
    node = "bench"
    w.add_node(node)
    for i in range(50):
        w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"bench-{i}", node, f"registry.test/bench/app{i % 20}:1"))
    t0 = time.monotonic()
    last = w.agent(node, client="latest", store=f"oci:{tmp_path / 'store'}")["last"]  # the ClusterPolicy's target
    wall = time.monotonic() - t0
    assert last["workloads"] == 20 and last["pods"] == 50 and last["not_in_store"] == 0, last
    # reads: the Node, the pods, ClusterPolicies, NVIDIADrivers, ResourceClaims, the ConfigMap and the Lease;
    # writes: the Node, the ConfigMap, the Lease, the Event
    assert last["api_requests"] == {"GET nodes": 1, "GET pods": 1, "GET clusterpolicies": 1, "GET nvidiadrivers": 1,
                                    "GET resourceclaims": 1, "GET configmaps": 1, "GET leases": 1, "PATCH nodes": 1,
                                    "POST configmaps": 1, "POST leases": 1, "POST events": 1}, last
    again = w.agent(node, client="latest", store=f"oci:{tmp_path / 'store'}")["last"]
    assert again["api_requests"] == {"GET nodes": 1, "GET pods": 1, "GET clusterpolicies": 1, "GET nvidiadrivers": 1,
                                     "GET resourceclaims": 1, "GET configmaps": 1, "GET leases": 1, "PUT leases": 1}, again
    print(f"\nMEASURED pass={last['seconds']}s (process wall {wall:.2f}s) api_calls={last['api_calls']} "
          f"(unchanged: {again['api_calls']}, pass {again['seconds']}s) max_rss={last['max_rss_kib']} KiB")
    assert last["seconds"] < 60 and last["max_rss_kib"] < 400 * 1024


# ----------------------------------------------------------------------------- the client's configuration

_CONNECT = """
import sys, time
from compat_hook.cluster.api import kube
k = kube.connect(sys.argv[1])
try:
    for i in range(int(sys.argv[2])):
        if i:
            time.sleep(float(sys.argv[3]))
        k.get("/api/v1/nodes", limit=1)
    print("OK")
except kube.KubeError as e:
    print("ERROR", e.status, e)
"""


def _connect(w: World, client: str, kc, n: int = 1, pause: float = 0.0) -> str:
    p = subprocess.run([w.pythons[client], "-c", _CONNECT, str(kc), str(n), str(pause)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
    return p.stdout.strip()


def _kubeconfig(path, server: str, cluster: dict, user: dict) -> pathlib.Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": dict(cluster, server=server)}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}]}))
    return path


def test_the_clients_configuration_is_what_the_requests_use(world, client, tmp_path):
    """The CA (verified, or a wrong one refused), the exec plugin's token renewed when it expires, and
    (where the client reads it) tls-server-name."""
    import base64
    import re

    w = world
    pem = (w.cp.work / "certs" / "apiserver.crt").read_text()
    certs = re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n?", pem, re.S)
    ca = base64.b64encode(certs[-1].encode()).decode()  # the self-signed CA that signed the serving cert
    token = {"token": ADMIN_TOKEN}
    good = _kubeconfig(tmp_path / "ca.kc", w.cp.url, {"certificate-authority-data": ca}, token)
    assert _connect(w, client, good) == "OK"
    other = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=other",
                            "-keyout", str(tmp_path / "k"), "-days", "1"], capture_output=True, text=True).stdout
    bad = _kubeconfig(tmp_path / "bad.kc", w.cp.url,
                      {"certificate-authority-data": base64.b64encode(other.encode()).decode()}, token)
    out = _connect(w, client, bad)
    assert out.startswith("ERROR 0 ") and "unreachable" in out and "certificate" in out.lower(), out
    # an exec plugin whose token expires after 2 s: asked again for the second request
    counter = tmp_path / "runs"
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(
        "#!/bin/sh\necho run >> " + str(counter) + "\n"
        "exp=$(date -u -d '+2 seconds' +%Y-%m-%dT%H:%M:%SZ)\n"
        "printf '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\","
        "\"status\":{\"token\":\"" + ADMIN_TOKEN + "\",\"expirationTimestamp\":\"%s\"}}' \"$exp\"\n")
    plugin.chmod(0o755)
    execkc = _kubeconfig(tmp_path / "exec.kc", w.cp.url, {"insecure-skip-tls-verify": True},
                         {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin)}})
    assert _connect(w, client, execkc, n=2, pause=3.0) == "OK"
    assert counter.read_text().count("run") >= 2, counter.read_text()
    if client == "latest":  # tls-server-name: the name the serving certificate is checked against
        named = _kubeconfig(tmp_path / "named.kc", w.cp.url,
                            {"certificate-authority-data": ca, "tls-server-name": "kubernetes.default.svc"}, token)
        assert _connect(w, client, named) == "OK"
        wrong = _kubeconfig(tmp_path / "wrong.kc", w.cp.url,
                            {"certificate-authority-data": ca, "tls-server-name": "wrong.example"}, token)
        out = _connect(w, client, wrong)
        assert out.startswith("ERROR 0 ") and "wrong.example" in out, out


# ----------------------------------------------------------------------------- the operator's command lines


def _kc_file(path, doc: dict) -> pathlib.Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def _cluster_cmd(w: World, client: str, *args, env=None) -> subprocess.CompletedProcess:
    import os

    p = subprocess.run([w.pythons[client], "-m", "compat_hook", "cluster", *args, "--config", str(w.config)], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env or {})))
    assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    return p


def test_several_kubeconfig_files_are_merged_as_kubectl_merges_them(world, client, tmp_path):
    """$KUBECONFIG=a:b: the first file to name a user, cluster or context wins whole, and current-context
    comes from the first file that sets one (kubectl's rules, client-go's clientcmd); the command says
    which server and context it used."""
    w = world
    case = f"merge-{client}"
    w.add_node(case, image="legacy")
    w.agent(case, client=client)
    server = {"name": "test", "cluster": {"server": w.cp.url, "insecure-skip-tls-verify": True}}
    # a: no current-context; context "ops" with user "me", who is the admin here
    a = _kc_file(tmp_path / "a", {"apiVersion": "v1", "kind": "Config",
                                  "contexts": [{"name": "ops", "context": {"cluster": "test", "user": "me"}}],
                                  "users": [{"name": "me", "user": {"token": ADMIN_TOKEN}}]})
    # b: current-context "ops"; its own "me" (nobody) and "ops" (with user "me"), the cluster
    b = _kc_file(tmp_path / "b", {"apiVersion": "v1", "kind": "Config", "current-context": "ops",
                                  "clusters": [server],
                                  "contexts": [{"name": "ops", "context": {"cluster": "test", "user": "me"}}],
                                  "users": [{"name": "me", "user": {"token": NOBODY_TOKEN}}]})
    p = _cluster_cmd(w, client, "status", "-l", f"{CASE}={case}", env={"KUBECONFIG": f"{a}:{b}"})
    assert p.returncode in (0, 2) and case in p.stdout, p.stdout + p.stderr  # a's "me": the admin
    assert f"API server {w.cp.url} (context ops, {a}:{b})" in p.stderr, p.stderr
    p = _cluster_cmd(w, client, "status", "-l", f"{CASE}={case}", env={"KUBECONFIG": f"{b}:{a}"})
    assert p.returncode == 1 and "403" in p.stderr and "forbidden" in p.stderr, p.stderr  # b's "me": nobody
    assert p.stderr.count("\n") == 1, p.stderr
    # --json names the server too
    p = _cluster_cmd(w, client, "status", "-l", f"{CASE}={case}", "--json", env={"KUBECONFIG": f"{a}:{b}"})
    assert json.loads(p.stdout)["server"] == {"url": w.cp.url, "credentials": f"context ops, {a}:{b}"}, p.stdout


def test_context_picks_the_kubeconfig_context(world, client, tmp_path):
    w = world
    case = f"context-{client}"
    w.add_node(case, image="legacy")
    w.agent(case, client=client)
    server = {"name": "test", "cluster": {"server": w.cp.url, "insecure-skip-tls-verify": True}}
    kc = _kc_file(tmp_path / "kc", {
        "apiVersion": "v1", "kind": "Config", "current-context": "nobody", "clusters": [server],
        "contexts": [{"name": "nobody", "context": {"cluster": "test", "user": "nobody"}},
                     {"name": "admin", "context": {"cluster": "test", "user": "admin"}}],
        "users": [{"name": "nobody", "user": {"token": NOBODY_TOKEN}}, {"name": "admin", "user": {"token": ADMIN_TOKEN}}]})
    p = _cluster_cmd(w, client, "status", "-l", f"{CASE}={case}", "--kubeconfig", str(kc))
    assert p.returncode == 1 and "forbidden" in p.stderr, p.stderr
    p = _cluster_cmd(w, client, "status", "-l", f"{CASE}={case}", "--kubeconfig", str(kc), "--context", "admin")
    assert p.returncode in (0, 2) and case in p.stdout and "(context admin, " in p.stderr, p.stdout + p.stderr
    p = _cluster_cmd(w, client, "release", "--node", case, "--kubeconfig", str(kc), "--context", "admin")
    assert p.returncode == 0 and "(context admin, " in p.stderr, p.stdout + p.stderr
    r = w.agent(case, "--context", "admin", client=client, kubeconfig=kc)["stdout"]
    connected = [json.loads(ln) for ln in r.splitlines() if '"cluster_connected"' in ln]
    assert connected and connected[0]["server"] == w.cp.url and connected[0]["credentials"].startswith("context admin"), r


def test_a_selector_that_matches_nothing_and_an_unknown_node_exit_4(world, client):
    """A typo in a CI gate must not pass: no GPU node selected, or no such node to release, is exit 4
    with one line saying so."""
    w = world
    rc, out, err = w.status(f"no-such-case-{client}", client=client)
    assert rc == 4 and "no GPU node" in err and "selects none" in err, (rc, out, err)
    rc, out, err = w.status(f"no-such-case-{client}", "--json", client=client)
    assert rc == 4 and json.loads(out)["nodes"] == [], (rc, out, err)
    p = w.run("release", "--node", f"nosuchnode-{client}", client=client)
    assert p.returncode == 4 and f"nosuchnode-{client}: no such node" in p.stdout + p.stderr, p


def test_every_unknown_row_has_a_note(world, client):
    """An ``unknown`` verdict (here: a bad announcement) and a node no agent published on say why."""
    w = world
    case = f"unknownnote-{client}"
    for n in (f"{case}-a", f"{case}-none"):
        w.add_node(n, image="legacy", labels={CASE: case})
    w.set_target(announce="latest")
    try:
        w.agent(f"{case}-a", client=client)
        rc, out, _ = w.status(case, client=client)
    finally:
        w.set_target(remove_announce=True)
    rows = _table(out)
    assert rc == 2 and rows[f"{case}-a"]["PREFLIGHT"] == "unknown", out
    assert rows[f"{case}-a"]["NOTE"].startswith("unknown: ") and "bad_announcement" in rows[f"{case}-a"]["NOTE"], out
    assert rows[f"{case}-none"]["NOTE"] == "no preflight published: is its agent running?", out


def test_sigterm_stops_a_watching_agent_within_a_second(world, client):
    """As a pod's PID 1 the agent gets SIGTERM from the kubelet: it ends its loop at once (exit 0), its
    state file whole and naming what it last published."""
    import signal

    w = world
    node = f"sigterm-{client}"
    w.add_node(node, image="infer")
    agent = w.spawn(node, "--driver", R470, "--interval", "300", client=client)
    try:
        w.admin.wait("a pass", lambda: w.passes(node), timeout=60)
        time.sleep(0.5)  # in its wait for the next pass
        t = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        rc = agent.wait(10)
        took = time.monotonic() - t
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)
    print(f"agent exit after SIGTERM: {took:.3f} s")
    assert rc == 0 and took < 1.0, (rc, took)
    last = w.log(node)[-1]
    assert last["event"] == "cluster_agent_stopped" and last["last_result"].startswith("fail for " + R470), last
    state = json.loads((w.work / "state" / node / "cluster-agent.json").read_text())
    assert (state["verdict"], state["gate"], state["prefix"]) == ("fail", "held", PREFIX), state


def test_purge_leaves_no_key_and_a_running_agent_writes_nothing_back(world, client):
    """(Last in this file: it purges every node.) ``cluster release --all --purge`` with a watching agent still
    running, as under ``helm uninstall`` (its pre-delete Job runs before the DaemonSet goes): no ``<prefix>/`` key,
    Lease or ConfigMap of the agent is left, and the agent, seeing its Node purged, writes none of them back."""
    w = world
    node = f"purge-{client}"
    w.add_node(node, image="infer")
    w.admin.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {f"{PREFIX}/validated": R535}}})
    agent = w.spawn(node, "--driver", R470, "--interval", "2", client=client)
    try:
        w.admin.wait("held", lambda: w.labels(node).get(SKIP) == "true" and w.passes(node), timeout=60)
        p = w.run("release", "--all", "--purge", "--publish-namespace", "compat-hook", client=client)
        assert p.returncode == 0 and f"removed compat-hook's labels and annotations from {node}" in p.stdout, \
            p.stdout + p.stderr
        time.sleep(5)  # two intervals and a watch event: a pass would have written by now
        meta = w.node(node)["metadata"]
        left = [k for k in list(meta.get("labels") or {}) + list(meta.get("annotations") or {})
                if k.startswith(f"{PREFIX}/") or k == SKIP]
        assert left == [], meta
        for kind in ("apis/coordination.k8s.io/v1/namespaces/compat-hook/leases", "api/v1/namespaces/compat-hook/configmaps"):
            with pytest.raises(ApiError) as e:
                w.admin.get(f"/{kind}/{node}")
            assert e.value.status == 404
        assert [r for r in w.log(node) if r["event"] == "cluster_purged"], w.log(node)
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(10)
