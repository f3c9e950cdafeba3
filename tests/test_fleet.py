"""The fleet controller and the driver-version admission policy, on a real API server.

``compat-hook cluster fleet`` (compat_hook/cluster/overview/fleet.py, leader.py) runs as processes with a real
ServiceAccount token of the chart's ``compat-hook-fleet`` account, so the chart's least RBAC is what
it works under; the agents run as processes too (``cluster agent --once``, the tests' agent token), on
real OCI image layouts and a host root whose ``/proc/driver/nvidia/version`` names the node's driver
(tests/support/gpucluster.py). The policy is the chart's, rendered with ``fleet.enabled=true`` and
applied by server-side apply: kube-apiserver v1.34 from ``k8s.io/kubernetes`` evaluates its CEL.

Why the API server evaluates the CEL tests (:func:`test_the_policys_cel_case_by_case`): it is the
evaluator the policy meets in a cluster (the same ``k8s.io/apiserver`` CEL environment, its library
functions, its cost limits, ``has()`` on schemaless custom resources, paramKind/paramRef binding and
``parameterNotFoundAction``), and a dry-run request changes nothing, so one object takes every case.
A Go program of our own around ``k8s.io/apiserver``'s CEL would test our wiring of it, not the
admission chain (matchConditions before validations, the binding's params, the message format).

The pure parts (the reconcile, the election rule) are tested without a server at the end.
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import time

import pytest

from tests.support import chart, debs, hookenv
from tests.support.gpucluster import (A100, R470, R535, R570, R580, R590, agent_rbac, build_store, gpu_node,
                                      gpu_operator, gpu_pod, ref, runtime_classes, set_node_driver)
from tests.support.kube import AGENT_TOKEN, Api, ApiError, ControlPlane
from tests.support.toolkit import noted_compat_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
NS = "compat-hook"
PREFIX = "compat-hook.io"
CP = "/apis/nvidia.com/v1/clusterpolicies"
ND = "/apis/nvidia.com/v1alpha1/nvidiadrivers"
PARAM = f"/api/v1/namespaces/{NS}/configmaps/compat-hook-fleet"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/compat-hook-fleet"
POLICY = "ValidatingAdmissionPolicy 'compat-hook-fleet-driver-version'"
OVERRIDE = f"{PREFIX}/allow-unjudged-driver"
ANNOUNCE = f"{PREFIX}/next-driver"
MERGE = "application/merge-patch+json"
LEASE_SECONDS = 6
#: node -> its GPU pod's image: CUDA 11.8 (works on every target here) and CUDA 12.4 without compat
#: (works on R535 by minor version compatibility, broken on R470: the regression)
NODES = {"fleet-a": "legacy", "fleet-b": "infer"}
CPKEY = "clusterpolicy_cluster-policy_{}"


class World:
    def __init__(self, cp: ControlPlane, work: pathlib.Path, fleet_token: str) -> None:
        self.cp, self.work, self.admin = cp, work, cp.admin
        self.fleet_token = fleet_token
        self.fleet_kc = cp.kubeconfig(fleet_token, "fleet")
        self.agent_kc = cp.kubeconfig(AGENT_TOKEN, "agent")
        libs = {"noted": noted_compat_lib(debs.libcuda("550.163.01"), work / "noted")}
        self.store = build_store(work / "store", sorted(set(NODES.values())), libs)
        self.fleets: dict = {}
        self.hosts: dict = {}

    # -- the fleet controllers ------------------------------------------------
    def start_fleet(self, identity: str, kubeconfig=None, python: str = "/usr/bin/python3") -> subprocess.Popen:
        log = (self.work / f"{identity}.log").open("ab")
        p = subprocess.Popen([python, "-m", "compat_hook", "cluster", "fleet", "--namespace", NS,
                              "--identity", identity, "--lease-seconds", str(LEASE_SECONDS), "--resync", "0.5",
                              "--kubeconfig", str(kubeconfig or self.fleet_kc)],
                             cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.fleets[identity] = p
        return p

    def stop_fleets(self) -> None:
        for p in self.fleets.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(15)
        self.fleets.clear()

    def fleet_log(self, identity: str) -> list:
        text = (self.work / f"{identity}.log").read_text()
        assert "Traceback" not in text, text
        return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]

    def events(self, identity: str, event: str) -> list:
        return [e for e in self.fleet_log(identity) if e["event"] == event]

    # -- the agents -------------------------------------------------------------
    def agent(self, node: str, *, gate: bool = True) -> dict:
        config = hookenv.write_config(self.work / f"agent-{gate}.yaml", host_root=self.work,
                                      log_file=self.work / "decisions.log", nvml="off",
                                      cluster={"gate_upgrade": gate, "hold_quiet_s": 0})
        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "agent", "--node", node, "--once",
                            "--kubeconfig", str(self.agent_kc), "--store", f"oci:{self.store}",
                            "--host-root", str(self.hosts[node]), "--config", str(config),
                            "--state-dir", str(self.work / "state" / node)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
        return [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")][-1]

    def agents(self, **kw) -> None:
        for n in NODES:
            self.agent(n, **kw)

    # -- the objects ------------------------------------------------------------
    def params(self) -> dict:
        return self.admin.get(PARAM).get("data") or {}

    def wait_param(self, key: str, want, timeout: float = 30) -> str:
        """Until the ConfigMap's ``key`` satisfies ``want`` (a value, or a test of the value)."""
        ok = want if callable(want) else (lambda v: v == want)
        return self.admin.wait(f"{key} {want}", lambda: (lambda v: v if v is not None and ok(v) else None)(
            self.params().get(key)), timeout=timeout)

    def set_version(self, version: str, *, annotations: dict | None = None, dry_run: bool = False) -> dict:
        patch: dict = {"spec": {"driver": {"version": version}}}
        if annotations is not None:
            patch["metadata"] = {"annotations": annotations}
        return self.admin.request("PATCH", f"{CP}/cluster-policy", patch, content_type=MERGE,
                                  query={"dryRun": "All"} if dry_run else None)

    def refused(self, version: str, **kw) -> str:
        with pytest.raises(ApiError) as e:
            self.set_version(version, **kw)
        assert e.value.status == 403 and POLICY in e.value.body, e.value
        return json.loads(e.value.body)["message"]

    def version(self) -> str:
        return self.admin.get(f"{CP}/cluster-policy")["spec"]["driver"]["version"]

    def announce(self, version: str | None) -> None:
        self.admin.merge(f"{CP}/cluster-policy", {"metadata": {"annotations": {ANNOUNCE: version}}})


def _token(admin, sa: str) -> str:
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}}
    return admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts/{sa}/token", req)["status"]["token"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    cp = ControlPlane(work / "cp")
    w = None
    try:
        cp.start()
        a = cp.admin
        agent_rbac(cp)
        runtime_classes(a)
        # the chart's fleet objects, as `helm install --set fleet.enabled=true` makes them (the Deployment with no
        # replicas: its replicas are the processes started here; it owns what the fleet makes anew)
        docs = [d for d in chart.render("fleet.enabled=true") if "fleet" in d["metadata"]["name"]]
        for d in docs:
            if d["kind"] == "Deployment":
                d["spec"]["replicas"] = 0
        assert {d["kind"] for d in docs} >= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Lease",
                                             "ConfigMap", "Role", "ClusterRole", "Deployment"}
        gpu_operator(a, R535)  # before the policy: a create is judged too
        chart.apply(a, docs)
        w = World(cp, work, _token(a, "compat-hook-fleet"))
        for n, image in NODES.items():
            a.create("/api/v1/nodes", gpu_node(n, deploy_driver=False, case="fleet"))
            w.hosts[n] = work / "hosts" / n
            set_node_driver(a, w.hosts[n], n, R535, A100)
            a.create("/api/v1/namespaces/apps/pods", gpu_pod(f"{image}-{n}", n, ref(image)))
        yield w
    finally:
        if w is not None:
            w.stop_fleets()
        cp.stop()
        log = work / "cp" / "apiserver.log"
        if log.exists():
            print("--- apiserver.log (tail)\n" + log.read_text(errors="replace")[-3000:])


# ----------------------------------------------------------------------------- the CEL, case by case


def _cel_objects(a) -> None:
    for path, obj in ((CP, {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cel-cp"},
                            "spec": {"driver": {"version": R535, "repository": "nvcr.io/nvidia", "image": "driver"}}}),
                      (CP, {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cel-crd"},
                            "spec": {"driver": {"version": R535, "useNvidiaDriverCRD": True}}}),
                      (ND, {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": "cel-nd"},
                            "spec": {"version": R535, "nodeSelector": {"pool": "cel"}}})):
        # created with the override naming their version (a create is judged), which then comes off
        obj["metadata"]["annotations"] = {OVERRIDE: R535}
        try:
            a.create(path, obj)
        except ApiError as e:
            assert e.status == 409, e
        a.merge(f"{path}/{obj['metadata']['name']}", {"metadata": {"annotations": {OVERRIDE: None}}})


#: (name, path, patch) -> allowed, or the texts the refusal must hold. Every request is a dry run from the
#: same stored objects (version 535.261.03); the params hold PARAMS, written with the fleet's own token
#: (the policy compat-hook-fleet-param refuses anyone else's).
DIGEST = "nvcr.io/nvidia/driver@sha256:" + "ab" * 32
PARAMS = {
    f"clusterpolicy_cel-cp_{R570}": "ok",
    f"clusterpolicy_cel-cp_{R580}": "not judged on 2 of 3 node(s): gpu-x (no verdict), gpu-y (fail, not held)",
    f"nvidiadriver_cel-nd_{R570}": "ok",
    f"clusterpolicy_cel-nd_{R580}": "ok",     # a ClusterPolicy's key: no use to the NVIDIADriver of that name
    f"clusterpolicy_other-cp_{R590}": "ok",   # another object's key: no use to cel-cp
    "clusterpolicy_cel-cp_mode.true.true": "not judged on 1 of 3 node(s): gpu-x (580.95.05: no verdict)",
    "clusterpolicy_cel-cp_mode.false.false": "ok",
    "nvidiadriver_cel-nd_delete": "not judged on 1 of 3 node(s): gpu-z (570.195.03: incomplete: not_in_store)",
    "clusterpolicy_cel-cp_delete": "ok",
    f"driver_{R535}": "not judged on 1 of 3 node(s): gpu-y (verdict for 570.195.03)",
    f"driver_{R570}": "ok",
}
IMG = "nvcr.io/nvidia/driver"
CASES = [
    ("cp: a judged version", CP + "/cel-cp", {"spec": {"driver": {"version": R570}}}, True),
    ("cp: a version with blocking nodes names them", CP + "/cel-cp", {"spec": {"driver": {"version": R580}}},
     [f"driver {R580} for ClusterPolicy cel-cp is refused", "gpu-x (no verdict), gpu-y (fail, not held)",
      f"{OVERRIDE}={R580}"]),
    ("cp: a version never announced", CP + "/cel-cp", {"spec": {"driver": {"version": R590}}},
     [f"no key clusterpolicy_cel-cp_{R590} in ConfigMap compat-hook/compat-hook-fleet", ANNOUNCE,
      "fleet controller runs"]),
    ("cp: the override names the version", CP + "/cel-cp",
     {"metadata": {"annotations": {OVERRIDE: R590}}, "spec": {"driver": {"version": R590}}}, True),
    ("cp: an override of another version", CP + "/cel-cp",
     {"metadata": {"annotations": {OVERRIDE: R580}}, "spec": {"driver": {"version": R590}}}, ["no key"]),
    ("cp: an override of true is not one", CP + "/cel-cp",
     {"metadata": {"annotations": {OVERRIDE: "true"}}, "spec": {"driver": {"version": R590}}}, ["no key"]),
    ("cp: the override beside a blocked version", CP + "/cel-cp",
     {"metadata": {"annotations": {OVERRIDE: R580}}, "spec": {"driver": {"version": R580}}}, True),
    ("cp: another repository, the version unchanged", CP + "/cel-cp",
     {"spec": {"driver": {"repository": "r.example"}}}, True),
    ("cp: the same version written again", CP + "/cel-cp", {"spec": {"driver": {"version": R535}}}, True),
    ("cp: the status subresource", CP + "/cel-cp/status", {"status": {"state": "ready"}}, True),
    ("cp: another object's key", CP + "/cel-cp", {"spec": {"driver": {"version": R590}}}, ["no key"]),
    # the image road: repository and version cleared, a full image with a tag (kbld/carvel) or a digest
    ("cp: a full image whose tag is a judged version", CP + "/cel-cp",
     {"spec": {"driver": {"repository": None, "version": None, "image": f"{IMG}:{R570}-ubuntu22.04"}}}, True),
    ("cp: a full image whose tag was never judged", CP + "/cel-cp",
     {"spec": {"driver": {"repository": None, "version": None, "image": f"{IMG}:{R590}-ubuntu22.04"}}},
     [f"driver {R590} for ClusterPolicy cel-cp is refused", f"no key clusterpolicy_cel-cp_{R590}"]),
    ("cp: a full image with a blocked version", CP + "/cel-cp",
     {"spec": {"driver": {"repository": None, "version": None, "image": f"{IMG}:{R580}"}}}, ["gpu-y (fail, not held)"]),
    ("cp: an image pinned by digest", CP + "/cel-cp",
     {"spec": {"driver": {"repository": None, "version": None, "image": DIGEST}}},
     [f"the image {DIGEST} names no driver version", f"{OVERRIDE}={DIGEST}"]),
    ("cp: a digest as the version", CP + "/cel-cp", {"spec": {"driver": {"version": "sha256:" + "cd" * 32}}},
     ["names no driver version", "@sha256:cdcd"]),
    ("cp: a digest the override names", CP + "/cel-cp",
     {"metadata": {"annotations": {OVERRIDE: DIGEST}},
      "spec": {"driver": {"repository": None, "version": None, "image": DIGEST}}}, True),
    ("cp: a digest with a version override is not one", CP + "/cel-cp",
     {"metadata": {"annotations": {OVERRIDE: R570}},
      "spec": {"driver": {"repository": None, "version": None, "image": DIGEST}}}, ["names no driver version"]),
    ("cp: a tag that is not a version", CP + "/cel-cp", {"spec": {"driver": {"version": "latest"}}},
     ["names no driver version"]),
    ("cp: everything cleared (the operator's default image)", CP + "/cel-cp",
     {"spec": {"driver": {"repository": None, "version": None}}}, ["names no driver version"]),
    # the mode: who runs the driver
    ("cp: drivers handed to NVIDIADrivers, not judged there", CP + "/cel-cp",
     {"spec": {"driver": {"useNvidiaDriverCRD": True}}},
     ["switching ClusterPolicy cel-cp to mode.true.true", "gpu-x (580.95.05: no verdict)",
      f"{OVERRIDE}=mode.true.true"]),
    ("cp: the mode switch overridden", CP + "/cel-cp",
     {"metadata": {"annotations": {OVERRIDE: "mode.true.true"}}, "spec": {"driver": {"useNvidiaDriverCRD": True}}},
     True),
    ("cp: the driver disabled, judged", CP + "/cel-cp", {"spec": {"driver": {"enabled": False}}}, True),
    ("cp: disabled with another version (it drives nothing)", CP + "/cel-cp",
     {"spec": {"driver": {"enabled": False, "version": R590}}}, True),
    ("cp: handed to NVIDIADrivers: its own version drives nothing", CP + "/cel-crd",
     {"spec": {"driver": {"version": R590}}}, True),
    ("cp: taken back from NVIDIADrivers with a new driver at once", CP + "/cel-crd",
     {"spec": {"driver": {"useNvidiaDriverCRD": False, "version": R590}}}, ["one at a time"]),
    ("nd: a judged version", ND + "/cel-nd", {"spec": {"version": R570}}, True),
    ("nd: a ClusterPolicy's key of its name", ND + "/cel-nd", {"spec": {"version": R580}},
     [f"driver {R580} for NVIDIADriver cel-nd is refused", f"no key nvidiadriver_cel-nd_{R580}"]),
    ("nd: the override", ND + "/cel-nd",
     {"metadata": {"annotations": {OVERRIDE: R580}}, "spec": {"version": R580}}, True),
    ("nd: a label, nothing of the driver", ND + "/cel-nd", {"metadata": {"labels": {"team": "a"}}}, True),
    ("nd: its nodeSelector moved onto nodes not all judged", ND + "/cel-nd", {"spec": {"nodeSelector": {"pool": "other"}}},
     [f"driver {R535} for NVIDIADriver cel-nd", "nodeSelector or nodeAffinity moved",
      "gpu-y (verdict for 570.195.03)"]),
    ("nd: a nodeAffinity by node name (matchFields)", ND + "/cel-nd",
     {"spec": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
         {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-y"]}]}]}}}},
     ["nodeSelector or nodeAffinity moved", "gpu-y"]),
    ("nd: moved, with a version every node judged", ND + "/cel-nd",
     {"spec": {"nodeSelector": {"pool": "other"}, "version": R570}}, True),
    ("nd: moved, the override naming the move", ND + "/cel-nd",
     {"metadata": {"annotations": {OVERRIDE: f"scope.{R535}"}}, "spec": {"nodeSelector": {"pool": "other"}}}, True),
    ("nd: moved, a leftover version override is not one", ND + "/cel-nd",
     {"metadata": {"annotations": {OVERRIDE: R535}}, "spec": {"nodeSelector": {"pool": "other"}}},
     [f"{OVERRIDE}=scope.{R535}"]),
    ("nd: a version that is not one", ND + "/cel-nd", {"spec": {"version": "latest"}},
     ["names no driver version"]),
]
#: Creates and deletes (dry runs): (name, method, path, body) -> allowed or the texts of the refusal.
WRITES = [
    ("create: an NVIDIADriver on a version not every node judged", "POST", ND,
     {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": "cel-new"},
      "spec": {"version": R535, "nodeSelector": {"pool": "new"}}},
     [f"driver {R535} for NVIDIADriver cel-new (created: every GPU node must have judged it)", "gpu-y"]),
    ("create: an NVIDIADriver every node judged", "POST", ND,
     {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": "cel-new"},
      "spec": {"version": R570}}, True),
    ("create: an NVIDIADriver pinned by digest", "POST", ND,
     {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": "cel-new"},
      "spec": {"image": DIGEST}}, ["names no driver version"]),
    ("create: a ClusterPolicy that hands drivers to NVIDIADrivers", "POST", CP,
     {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cel-new"},
      "spec": {"driver": {"version": R590, "useNvidiaDriverCRD": True}}}, True),
    ("create: a ClusterPolicy on a version never judged", "POST", CP,
     {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cel-new"},
      "spec": {"driver": {"version": R590}}}, [f"no key driver_{R590}"]),
    ("delete: nodes would fall to a driver they did not judge", "DELETE", ND + "/cel-nd", None,
     ["deleting NVIDIADriver cel-nd is refused", "gpu-z (570.195.03: incomplete: not_in_store)",
      f"{OVERRIDE}=delete"]),
    ("delete: judged", "DELETE", CP + "/cel-cp", None, True),
]


def _dry(a, path: str, patch: dict):
    return a.request("PATCH", path, patch, content_type=MERGE, query={"dryRun": "All"})


def _force_delete(a, path: str) -> None:
    """Delete a test object whatever the fleet judged (the override names the delete)."""
    try:
        a.merge(path, {"metadata": {"annotations": {OVERRIDE: "delete"}}})
        a.delete(path)
    except ApiError as e:
        if e.status != 404:
            raise


def _write(a, method: str, path: str, body) -> object:
    """A dry run of one write: True when admitted, else the policy's refusal (or what else refused it)."""
    try:
        if method == "PATCH":
            _dry(a, path, body)
        else:
            a.request(method, path, body, query={"dryRun": "All"})
        return True
    except ApiError as e:
        return e.body if e.status == 403 and POLICY in e.body else f"not the policy: {e}"


@pytest.mark.containers
@pytest.mark.slow
def test_the_policys_cel_case_by_case(world):
    """Each case of :data:`CASES` and :data:`WRITES` against the chart's policy on the API server (module
    docstring). The test objects are created with the override naming their version (a create is judged
    too), which is then taken off; the params are written with the fleet's token, as only it may."""
    a = world.admin
    fleet = Api(world.cp.url, world.fleet_token)
    _cel_objects(a)
    fleet.request("PUT", PARAM, dict(fleet.get(PARAM), data=PARAMS))

    def enforced():  # the policy and its params reached the API server's admission (informers)
        try:
            _dry(a, CP + "/cel-cp", {"spec": {"driver": {"version": R570}}})
        except ApiError:
            return False
        try:
            _dry(a, CP + "/cel-cp", {"spec": {"driver": {"version": R580}}})
        except ApiError as e:
            return POLICY in str(e) and "gpu-x" in str(e)
        return False

    try:
        a.wait("the policy enforced with its params", enforced, timeout=60)
        failures = []
        for name, method, path, body, want in [(n, "PATCH", p, b, w) for n, p, b, w in CASES] + WRITES:
            got = _write(a, method, path, body)
            if want is True and got is not True:
                failures.append(f"{name}: refused: {got}")
            elif want is not True and (got is True or not all(t in got for t in want)):
                failures.append(f"{name}: want a refusal with {want}, got {got}")
        assert not failures, "\n".join(failures)
        # the judged keys are the fleet's alone: an admin's hand-written "ok" is refused
        with pytest.raises(ApiError) as e:
            a.merge(PARAM, {"data": {f"clusterpolicy_cel-cp_{R590}": "ok"}})
        assert e.value.status == 403 and "compat-hook-fleet-param" in e.value.body, e.value
        # no params at all (the ConfigMap deleted): every change is refused, the message says why
        saved = a.get(PARAM)
        a.delete(PARAM)
        try:
            def missing():
                try:
                    _dry(a, CP + "/cel-cp", {"spec": {"driver": {"version": R570}}})
                except ApiError as e:
                    return "no params found" in e.body and "compat-hook-fleet-driver-version" in e.body
                return False

            a.wait("refused without params", missing, timeout=30)
            # the API server looks the params up before it evaluates anything: without them every
            # write of the objects is refused, not only a driver change; their status writes still pass
            with pytest.raises(ApiError) as e:
                _dry(a, CP + "/cel-cp", {"spec": {"driver": {"repository": "r.example"}}})
            assert "no params found" in e.value.body, e.value
            _dry(a, CP + "/cel-cp/status", {"status": {"state": "ready"}})
            # made anew by anyone but the fleet: only empty
            with pytest.raises(ApiError) as e:
                a.create(f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": "compat-hook-fleet"},
                                                                  "data": {f"driver_{R590}": "ok"}})
            assert e.value.status == 403 and "compat-hook-fleet-param" in e.value.body, e.value
        finally:
            a.create(f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": "compat-hook-fleet",
                                                                           "labels": saved["metadata"]["labels"]}})
    finally:
        # gone again: a second ClusterPolicy made in the same second as the operator's would be the active
        # one for the agents (the lowest name wins a tie), and move the other tests' targets
        for path in (CP + "/cel-cp", CP + "/cel-crd", ND + "/cel-nd"):
            a.wait(f"{path} deleted", lambda: _force_delete(a, path) is None, timeout=30)


# ----------------------------------------------------------------------------- the controller


def _leader(w: World) -> str | None:
    return w.admin.get(LEASE)["spec"].get("holderIdentity") or None


@pytest.mark.containers
@pytest.mark.slow
def test_a_version_is_refused_until_every_node_judged_it(world):
    """Before the verdicts: refused, naming the nodes. Judged: accepted. A stale agent and a regression
    nobody holds block it; the override lets one version through."""
    w = world
    w.start_fleet("fleet-1")
    try:
        w.wait_param(CPKEY.format(R535), lambda v: "fleet-a (no verdict)" in v and "fleet-b (no verdict)" in v)
        # never announced: no key, the refusal says what to do
        msg = w.refused(R570)
        assert f"no key {CPKEY.format(R570)}" in msg and ANNOUNCE in msg, msg
        # announced, before the agents judged it: refused, naming every node
        w.announce(R570)
        w.wait_param(CPKEY.format(R570), lambda v: "fleet-a" in v)
        msg = w.refused(R570)
        assert "not judged on 2 of 2 node(s): fleet-a (no verdict), fleet-b (no verdict)" in msg, msg
        # the agents judge it (the ClusterPolicy's announcement is their target)
        w.agents()
        w.wait_param(CPKEY.format(R570), "ok")
        w.set_version(R570, dry_run=True)  # accepted (not yet applied: the stale agent first)
        # an agent that stopped renewing its Lease (here: one of 2 s, then no change): its verdict is stale once
        # the fleet has seen no change for that long, the version blocked again
        lease = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/fleet-b"
        w.admin.merge(lease, {"spec": {"leaseDurationSeconds": 2}})
        w.wait_param(CPKEY.format(R570), lambda v: "fleet-b (stale" in v and "fleet-a" not in v)
        msg = w.refused(R570)
        assert "not judged on 1 of 2 node(s): fleet-b (stale: no heartbeat from its agent)" in msg, msg
        w.agent("fleet-b")
        w.wait_param(CPKEY.format(R570), "ok")
        w.set_version(R570)
        assert w.version() == R570
        w.announce(None)

        # a regression nobody holds (R470 breaks the CUDA 12.4 image on fleet-b; the gate off)
        w.announce(R470)
        w.agents(gate=False)
        w.wait_param(CPKEY.format(R470), lambda v: "fleet-b (fail, not held)" in v)
        msg = w.refused(R470)
        assert "not judged on 1 of 2 node(s): fleet-b (fail, not held)" in msg, msg
        # held by its agent: the version may go out, fleet-b stays where it is
        w.agents(gate=True)
        assert w.admin.get("/api/v1/nodes/fleet-b")["metadata"]["labels"].get(
            "nvidia.com/gpu-driver-upgrade.skip") == "true"
        w.wait_param(CPKEY.format(R470), "ok")
        w.set_version(R470, dry_run=True)

        # the override: a version nobody judged, with the annotation naming it
        msg = w.refused(R590)
        w.set_version(R590, annotations={OVERRIDE: R590})
        assert w.version() == R590
        w.set_version(R570, annotations={OVERRIDE: R570})  # back, as nobody judged R570 again
        w.admin.merge(f"{CP}/cluster-policy", {"metadata": {"annotations": {OVERRIDE: None, ANNOUNCE: None}}})
        assert w.version() == R570
    finally:
        w.stop_fleets()


@pytest.mark.containers
@pytest.mark.slow
def test_an_nvidiadrivers_scope_is_the_nodes_it_selects(world):
    """An NVIDIADriver selecting fleet-a only: its keys name fleet-a alone, and its version change is refused
    with that one node (fleet-a judged the ClusterPolicy's version, not this one)."""
    w = world
    w.start_fleet("fleet-nd")
    try:
        w.admin.create(ND, {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
                            "metadata": {"name": "pool-a", "annotations": {OVERRIDE: R535}},  # a create is judged
                            "spec": {"version": R535, "nodeSelector": {"kubernetes.io/hostname": "fleet-a"}}})
        w.admin.merge(f"{ND}/pool-a", {"metadata": {"annotations": {ANNOUNCE: R580, OVERRIDE: None}}})
        v = w.wait_param(f"nvidiadriver_pool-a_{R580}", lambda v: v.startswith("not judged on 1 of 1 node(s): fleet-a"))
        assert "fleet-b" not in v
        with pytest.raises(ApiError) as e:
            w.admin.merge(f"{ND}/pool-a", {"spec": {"version": R580}})
        msg = json.loads(e.value.body)["message"]
        assert f"driver {R580} for NVIDIADriver pool-a is refused" in msg and "1 of 1 node(s): fleet-a (" in msg, msg
        # deleted: its keys go (server-side apply drops what the manager no longer sets)
        w.admin.delete(f"{ND}/pool-a")
        w.admin.wait("pool-a's keys gone", lambda: not [k for k in w.params() if k.startswith("nvidiadriver_pool-a_")])
    finally:
        w.stop_fleets()


@pytest.mark.containers
@pytest.mark.slow
def test_one_leader_writes_and_a_standby_takes_over(world):
    """Two replicas: one leads and writes; SIGKILL of the leader hands over within the Lease; SIGTERM
    releases it at once; nothing is written while nothing changes."""
    w = world
    w.start_fleet("fleet-x")
    w.start_fleet("fleet-y")
    try:
        leader = w.admin.wait("a leader", lambda: _leader(w) if _leader(w) in ("fleet-x", "fleet-y") else None)
        other = "fleet-y" if leader == "fleet-x" else "fleet-x"
        w.admin.wait("the leader's first reconcile", lambda: w.events(leader, "fleet_leading"))
        time.sleep(LEASE_SECONDS / 2)
        assert not w.events(other, "fleet_leading") and not w.events(other, "fleet_applied")
        # nothing changed for a while: no write (the ConfigMap's resourceVersion stays; resync is 0.5 s)
        rv = w.admin.get(PARAM)["metadata"]["resourceVersion"]
        applied = len(w.events(leader, "fleet_applied"))
        time.sleep(4)
        assert w.admin.get(PARAM)["metadata"]["resourceVersion"] == rv
        assert len(w.events(leader, "fleet_applied")) == applied
        # a change that matters is written once
        w.announce(R580)
        w.wait_param(CPKEY.format(R580), lambda v: v.startswith("not judged on 2 of 2"))
        assert len(w.events(leader, "fleet_applied")) == applied + 1
        rv_after_change = w.admin.get(PARAM)["metadata"]["resourceVersion"]
        # the leader dies without a word (SIGKILL): the standby takes over within the Lease
        w.fleets[leader].kill()
        w.fleets[leader].wait(10)
        t0 = time.monotonic()
        w.admin.wait("the standby leads", lambda: _leader(w) == other, timeout=LEASE_SECONDS * 3, interval=0.1)
        took = time.monotonic() - t0
        print(f"SIGKILL of the leader: {other} took over after {took:.1f} s (Lease {LEASE_SECONDS} s)")
        # a standby waits out one Lease from when it last saw the record change, then reads every retry
        # period (client-go's rule): the Lease plus one retry period (1 s here), and slack for a busy machine
        assert took <= LEASE_SECONDS + 1 + 2, took
        # the new leader reads what the ConfigMap holds: the same answer is not written again
        w.admin.wait("the new leader's first reconcile", lambda: w.events(other, "fleet_leading"))
        time.sleep(1.5)
        assert not w.events(other, "fleet_applied")
        assert w.admin.get(PARAM)["metadata"]["resourceVersion"] == rv_after_change
        w.announce(R590)  # the new leader writes
        w.wait_param(CPKEY.format(R590), lambda v: v.startswith("not judged on 2 of 2"))
        assert w.events(other, "fleet_applied")
        # SIGTERM: the Lease released at once, a prompt exit 0
        t0 = time.monotonic()
        w.fleets[other].send_signal(signal.SIGTERM)
        assert w.fleets[other].wait(10) == 0
        stopped = time.monotonic() - t0
        assert stopped < 3.5, stopped
        assert _leader(w) is None
        assert w.events(other, "fleet_stopped")[-1]["released"] is True
        # a replica started now leads at its first read (no Lease to wait out)
        t0 = time.monotonic()
        w.start_fleet("fleet-z")
        w.admin.wait("fleet-z leads", lambda: _leader(w) == "fleet-z", timeout=LEASE_SECONDS, interval=0.1)
        print(f"SIGTERM: stopped in {stopped:.1f} s; a new replica led after {time.monotonic() - t0:.1f} s")
    finally:
        w.stop_fleets()
        w.announce(None)


@pytest.mark.containers
@pytest.mark.slow
def test_a_cache_that_is_not_current_writes_nothing(world, tmp_path):
    """The Nodes' watches broken and every list of them failing (500): an announcement seen meanwhile (its
    cache is current) is not judged from the stale Nodes (nothing written); the Nodes back, it is written."""
    from tests.support.kube import FaultProxy

    w = world
    proxy = FaultProxy(w.cp.url)
    try:
        kc = proxy.kubeconfig(tmp_path / "proxy.kubeconfig", _token(w.admin, "compat-hook-fleet"))
        w.start_fleet("fleet-p", kubeconfig=kc)
        w.admin.wait("fleet-p leads", lambda: w.events("fleet-p", "fleet_leading"))
        time.sleep(1.0)
        proxy.fail("GET", r"^/api/v1/nodes", 500)
        proxy.cut()
        time.sleep(1.0)
        rv = w.admin.get(PARAM)["metadata"]["resourceVersion"]
        w.announce(R580)
        time.sleep(3.0)
        assert CPKEY.format(R580) not in w.params()
        assert w.admin.get(PARAM)["metadata"]["resourceVersion"] == rv
        proxy.clear()
        w.wait_param(CPKEY.format(R580), lambda v: v.startswith("not judged on 2 of 2"), timeout=45)
        assert w.fleets["fleet-p"].poll() is None  # it never stopped
    finally:
        w.stop_fleets()
        proxy.close()
        w.announce(None)


@pytest.mark.containers
@pytest.mark.slow
def test_a_leader_that_cannot_renew_stops_writing_before_the_standby_leads(world, tmp_path):
    """The leader cut off from its Lease (every Lease request fails; the rest still works): it stops writing
    within two thirds of the Lease, before the standby may take over, and writes nothing after."""
    from tests.support.kube import FaultProxy

    w = world
    proxy = FaultProxy(w.cp.url)
    try:
        kc = proxy.kubeconfig(tmp_path / "proxy.kubeconfig", _token(w.admin, "compat-hook-fleet"))
        w.start_fleet("fleet-p", kubeconfig=kc)
        w.admin.wait("fleet-p leads", lambda: _leader(w) == "fleet-p")
        w.start_fleet("fleet-q")
        time.sleep(1.0)
        proxy.fail("*", r"/leases/compat-hook-fleet", 500)
        w.admin.wait("fleet-q leads", lambda: _leader(w) == "fleet-q", timeout=LEASE_SECONDS * 4, interval=0.1)
        [down] = w.events("fleet-p", "fleet_standby")
        assert down["reason"] == "renew deadline passed", down
        applied = len(w.events("fleet-p", "fleet_applied"))
        w.announce(R580)  # a change: only the leader writes it (fleet-p could still patch the ConfigMap)
        w.wait_param(CPKEY.format(R580), lambda v: v.startswith("not judged on 2 of 2"))
        time.sleep(1.0)
        assert w.events("fleet-q", "fleet_applied") and len(w.events("fleet-p", "fleet_applied")) == applied
    finally:
        w.stop_fleets()
        proxy.close()
        w.announce(None)


@pytest.mark.containers
@pytest.mark.slow
def test_the_fleet_account_can_do_only_its_job(world):
    """The chart's RBAC and policies for the fleet: its Lease and ConfigMap by name (create too, but of no
    other name), no delete, no other object."""
    from tests.support.kube import Api

    api = Api(world.cp.url, _token(world.admin, "compat-hook-fleet"))
    for method, path, body in (  # create: RBAC lets it (no name to narrow it by), the policy refuses other names
            ("POST", f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": "x"}}),
            ("PATCH", f"/api/v1/namespaces/{NS}/configmaps/compat-hook-agent", {"data": {"a": "b"}}),
            ("DELETE", PARAM, None),
            ("PATCH", "/api/v1/nodes/fleet-a", {"metadata": {"labels": {"x": "y"}}}),
            ("PATCH", f"{CP}/cluster-policy", {"metadata": {"labels": {"x": "y"}}}),
            ("POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", {"metadata": {"name": "x"}})):
        with pytest.raises(ApiError) as e:
            api.request(method, path, body, content_type="application/json" if method == "POST" else MERGE)
        assert e.value.status == 403, (method, path, e.value)
    assert api.get(LEASE)["metadata"]["name"] == "compat-hook-fleet"
    api.request("PUT", PARAM, api.get(PARAM), query={"dryRun": "All"})


@pytest.mark.containers
@pytest.mark.slow
def test_the_newest_kubernetes_client_runs_the_fleet(world):
    """`pip install '.[cluster]'` brings the newest client from PyPI: the controller leads, writes its keys and
    stops on SIGTERM with it as with Debian's."""
    from tests.support.kube import clients

    w = world
    p = w.start_fleet("fleet-new", python=clients()["latest"])
    try:
        w.admin.wait("fleet-new leads", lambda: _leader(w) == "fleet-new", timeout=60)
        w.admin.wait("its reconcile", lambda: w.events("fleet-new", "fleet_leading")
                     and (w.events("fleet-new", "fleet_applied") or w.params()))
        assert CPKEY.format(w.version()) in w.params(), w.params()
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0 and w.events("fleet-new", "fleet_stopped")[-1]["released"] is True
    finally:
        w.stop_fleets()


def _status(w: World) -> tuple:
    from tests.support.kube import ADMIN_TOKEN

    p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "status", "--publish-namespace", NS,
                        "--kubeconfig", str(w.cp.kubeconfig(ADMIN_TOKEN, "admin"))],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    return p.returncode, p.stdout


def _patch_cp(w: World, driver: dict, annotations: dict | None = None, dry_run: bool = False) -> dict:
    patch: dict = {"spec": {"driver": driver}}
    if annotations is not None:
        patch["metadata"] = {"annotations": annotations}
    return w.admin.request("PATCH", f"{CP}/cluster-policy", patch, content_type=MERGE,
                           query={"dryRun": "All"} if dry_run else None)


@pytest.mark.containers
@pytest.mark.slow
def test_the_image_road_a_digest_and_an_incomplete_node(world):
    """A full ``spec.driver.image`` (repository and version cleared) is judged by its tag's version, naming the
    nodes; a digest is refused outright; a node whose pass could not read a pod's image (not in its store)
    blocks the version with that reason until it has looked."""
    w = world
    w.start_fleet("fleet-r")
    v0 = w.version()
    image = {"repository": None, "version": None, "image": f"nvcr.io/nvidia/driver:{R580}-ubuntu22.04"}
    try:
        w.agents()
        w.wait_param(CPKEY.format(v0), "ok")
        with pytest.raises(ApiError) as e:  # never announced: the image's tag is what is judged
            _patch_cp(w, image)
        assert e.value.status == 403 and f"driver {R580} for ClusterPolicy cluster-policy is refused" in e.value.body \
            and f"no key {CPKEY.format(R580)}" in e.value.body, e.value
        w.announce(R580)
        # fleet-a runs a pod whose image its store lacks: its pass is incomplete (warn), and that is no judgement
        w.admin.create("/api/v1/namespaces/apps/pods", gpu_pod("future-fleet-a", "fleet-a", ref("future")))
        w.agents()
        w.wait_param(CPKEY.format(R580), lambda v: "fleet-a (incomplete: not_in_store)" in v and "fleet-b" not in v)
        with pytest.raises(ApiError) as e:
            _patch_cp(w, image)
        assert "not judged on 1 of 2 node(s): fleet-a (incomplete: not_in_store)" in e.value.body, e.value
        rc, out = _status(w)
        assert rc == 2 and "incomplete: not_in_store" in out and "with an incomplete pass" in out, (rc, out)
        w.admin.delete("/api/v1/namespaces/apps/pods/future-fleet-a", gracePeriodSeconds="0")  # no kubelet here
        w.agent("fleet-a")
        w.wait_param(CPKEY.format(R580), "ok")
        _patch_cp(w, image, dry_run=True)  # judged: admitted
        # the same driver pinned by digest: no version to judge, refused unless the override names the image
        digest = "nvcr.io/nvidia/driver@sha256:" + "ef" * 32
        with pytest.raises(ApiError) as e:
            _patch_cp(w, {"repository": None, "version": None, "image": digest})
        assert f"the image {digest} names no driver version" in e.value.body, e.value
        _patch_cp(w, {"repository": None, "version": None, "image": digest}, {OVERRIDE: digest}, dry_run=True)
    finally:
        w.stop_fleets()
        w.announce(None)


@pytest.mark.containers
@pytest.mark.slow
def test_a_hand_written_stale_or_deleted_configmap_or_lease_is_put_back(world):
    """What the fleet did not write is put back: a late write of a deposed leader (the fleet's own token, so the
    policy lets it in), a deleted ConfigMap (refusing every change meanwhile; made anew, owned by the
    Deployment) and a deleted Lease."""
    w = world
    w.start_fleet("fleet-c")
    key = CPKEY.format(R590)
    try:
        w.admin.wait("fleet-c's first write", lambda: w.events("fleet-c", "fleet_applied"))
        good = dict(w.params())
        assert key not in good
        late = Api(w.cp.url, w.fleet_token)
        cm = late.get(PARAM)  # what a leader that lost its Lease could still send
        late.request("PUT", PARAM, dict(cm, data=dict(cm.get("data") or {}, **{key: "ok"})))
        w.admin.wait("the late write put back", lambda: w.params() == good, timeout=30)
        assert any(key in e.get("corrected", []) for e in w.events("fleet-c", "fleet_applied")), \
            w.events("fleet-c", "fleet_applied")
        # deleted: until the fleet makes it anew, nothing is admitted
        w.admin.delete(PARAM)
        cm = w.admin.wait("the ConfigMap made anew", lambda: w.admin.get(PARAM) if w.params() == good else None,
                          timeout=30)
        assert [(o["kind"], o["name"]) for o in cm["metadata"]["ownerReferences"]] == [
            ("Deployment", "compat-hook-fleet")], cm["metadata"]
        assert any(e.get("recreated") for e in w.events("fleet-c", "fleet_applied"))
        # the election's Lease deleted: made anew and led again
        w.admin.delete(LEASE)
        w.admin.wait("the Lease made anew", lambda: _leader(w) == "fleet-c", timeout=LEASE_SECONDS * 3)
        assert w.admin.get(LEASE)["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    finally:
        w.stop_fleets()


@pytest.mark.containers
@pytest.mark.slow
def test_an_agent_with_a_skewed_clock_is_judged_by_observed_time(world):
    """An agent whose clock runs a day ahead wrote its Lease and then died: the fleet takes it for stale one
    Lease after it saw the write, not a day later; `cluster status` (one look, no history) says the clock is
    ahead. Its next real renewal makes it fresh again."""
    w = world
    w.start_fleet("fleet-s")
    v0 = w.version()
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/fleet-b"
    try:
        w.agents()
        w.wait_param(CPKEY.format(v0), "ok")
        ahead = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() + 86400))
        w.admin.merge(lease, {"spec": {"renewTime": ahead, "leaseDurationSeconds": 4}})
        t0 = time.monotonic()
        w.wait_param(CPKEY.format(v0), lambda v: "fleet-b (stale: no heartbeat from its agent)" in v, timeout=30)
        took = time.monotonic() - t0
        assert took >= 3.0, took  # not before one Lease after the write was seen
        rc, out = _status(w)
        assert rc == 2 and "clock is" in out and "ahead" in out, (rc, out)
        w.agent("fleet-b")  # a real renewal
        w.wait_param(CPKEY.format(v0), "ok")
    finally:
        w.stop_fleets()


@pytest.mark.containers
@pytest.mark.slow
def test_an_nvidiadriver_only_cluster_runs_the_runbook(world):
    """gpu-operator v26.7: the ClusterPolicy's driver handed to a default NVIDIADriver (created, judged: every node
    judged its version), the ClusterPolicy switched to NVIDIADrivers and deleted (each judged: no node's driver
    moves), then the runbook on the NVIDIADriver alone: announce, verdicts, a regressing node held by its
    agent under the NVIDIADriver's own upgradePolicy, the version admitted; a GPUCluster is said, not judged."""
    w = world
    a = w.admin
    w.start_fleet("fleet-n")
    v0 = w.version()
    default = {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": "default"},
               "spec": {"version": v0, "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 0}}}
    try:
        w.agents()
        w.wait_param(f"driver_{v0}", "ok")
        a.wait("the default NVIDIADriver admitted", lambda: a.create(ND, default), timeout=30)
        w.wait_param("clusterpolicy_cluster-policy_mode.true.true", "ok")
        a.merge(f"{CP}/cluster-policy", {"spec": {"driver": {"useNvidiaDriverCRD": True}}})
        w.wait_param("clusterpolicy_cluster-policy_delete", "ok")
        a.delete(f"{CP}/cluster-policy")
        # NVIDIADrivers alone: the agents' target is the NVIDIADriver's, and its own upgradePolicy holds
        w.agents()
        w.wait_param(f"nvidiadriver_default_{v0}", "ok")
        a.merge(f"{ND}/default", {"metadata": {"annotations": {ANNOUNCE: R470}}})
        w.wait_param(f"nvidiadriver_default_{R470}", lambda v: v.startswith("not judged on 2 of 2"))
        with pytest.raises(ApiError) as e:
            a.merge(f"{ND}/default", {"spec": {"version": R470}})
        assert f"driver {R470} for NVIDIADriver default is refused" in e.value.body, e.value
        w.agents(gate=True)
        assert a.get("/api/v1/nodes/fleet-b")["metadata"]["labels"].get("nvidia.com/gpu-driver-upgrade.skip") == "true"
        w.wait_param(f"nvidiadriver_default_{R470}", "ok")
        rc, out = _status(w)
        assert rc == 3, (rc, out)  # fleet-b would break and is held
        a.merge(f"{ND}/default", {"spec": {"version": R470}})
        # an experimental GPUCluster (DRA): said, never passed over
        a.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gpuclusters.nvidia.com"},
            "spec": {"group": "nvidia.com", "scope": "Cluster",
                     "names": {"plural": "gpuclusters", "singular": "gpucluster", "kind": "GPUCluster",
                               "listKind": "GPUClusterList"},
                     "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}})
        a.wait("the GPUCluster CRD served", lambda: a.create("/apis/nvidia.com/v1alpha1/gpuclusters", {
            "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "dra"}, "spec": {}}))
        rc, out = _status(w)
        assert rc >= 2 and "GPUCluster dra: the drivers it sets (DRA) are NOT judged" in out, (rc, out)
    finally:
        w.stop_fleets()


# ----------------------------------------------------------------------------- pure parts


def _node(name: str, *, labels=None, verdict=None, target=None, hold=False, prefix=PREFIX, complete=True,
          incomplete=None) -> dict:
    from compat_hook.cluster.node import nodedoc

    lab = {"nvidia.com/gpu.present": "true", **(labels or {})}
    anns = {}
    if verdict:
        lab[f"{prefix}/preflight"] = verdict
        c = {"regressions": 1 if verdict == "fail" else 0}
        doc = nodedoc.node_doc(verdict_=verdict, target=target, target_from="ClusterPolicy cp", now=R535,
                               gate="holding" if hold else "off", c=c, reasons=[], key="k", interval=300,
                               details="", since="2026-01-01T00:00:00Z", complete=complete, incomplete=incomplete)
        anns[f"{prefix}/preflight"] = json.dumps(doc)
    if hold:
        lab["nvidia.com/gpu-driver-upgrade.skip"] = "true"
        anns[f"{prefix}/holds-upgrade"] = "x"
    return {"metadata": {"name": name, "labels": lab, "annotations": anns}}


def _lease(renewed: float, duration: int = 600) -> dict:
    t = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(renewed))
    return {"spec": {"renewTime": t, "leaseDurationSeconds": duration}}


def test_reconcile_scope_freshness_and_holds():
    """An NVIDIADriver's scope is the nodes it selects; each node judged as `cluster status` judges it."""
    from compat_hook.cluster.overview.fleet import OK, Snapshot, reconcile

    now = 1_000_000.0
    nodes = (_node("a1", labels={"pool": "a"}, verdict="pass", target=R570),
             _node("a2", labels={"pool": "a"}, verdict="fail", target=R570, hold=True),
             _node("b1", labels={"pool": "b"}, verdict="fail", target=R570),
             _node("b2", labels={"pool": "b"}, verdict="pass", target=R570),
             {"metadata": {"name": "cpu", "labels": {}}})  # not a GPU node: never in scope
    leases = {"a1": _lease(now - 10), "a2": _lease(now - 10), "b1": _lease(now - 10), "b2": _lease(now - 900)}
    nds = ({"metadata": {"name": "pool-a", "annotations": {ANNOUNCE: R570}},
            "spec": {"version": R535, "nodeSelector": {"pool": "a"}}},
           {"metadata": {"name": "pool-b"}, "spec": {"version": R570, "nodeSelector": {"pool": "b"}}})
    data = reconcile(Snapshot(nodes=nodes, leases=leases, policies=(), drivers=nds, now=now), PREFIX)
    assert data[f"nvidiadriver_pool-a_{R570}"] == OK  # a1 passes, a2 regresses and is held
    assert data[f"nvidiadriver_pool-a_{R535}"] == ("not judged on 2 of 2 node(s): a1 (verdict for 570.195.03), "
                                                    "a2 (verdict for 570.195.03)")
    b = data[f"nvidiadriver_pool-b_{R570}"]
    assert b == "not judged on 2 of 2 node(s): b1 (fail, not held), b2 (stale: no heartbeat from its agent)", b
    cp = {"metadata": {"name": "cp"}, "spec": {"driver": {"version": R570}}}
    data = reconcile(Snapshot(nodes=nodes, leases=leases, policies=(cp,), now=now), PREFIX)
    assert data[f"clusterpolicy_cp_{R570}"].startswith("not judged on 2 of 4 node(s): b1 (fail, not held), b2")
    # the same snapshot: the same data (a leader writes only on a change)
    assert reconcile(Snapshot(nodes=nodes, leases=leases, policies=(cp,), now=now), PREFIX) == data
    # a ClusterPolicy that hands drivers to NVIDIADrivers: its own version drives no node
    crd = {"metadata": {"name": "cp"}, "spec": {"driver": {"version": R580, "useNvidiaDriverCRD": True}}}
    data = reconcile(Snapshot(nodes=nodes, leases=leases, policies=(crd,), now=now), PREFIX)
    # handed over with no NVIDIADriver: the nodes would run nothing of the operator's; back: R580, never judged
    assert data["clusterpolicy_cp_delete"] == OK and data["clusterpolicy_cp_mode.false.true"] == OK
    assert data["clusterpolicy_cp_mode.true.false"].startswith("not judged on 4 of 4 node(s): a1 (580.95.05: verdict for")


def _world(**kw):
    from compat_hook.cluster.overview.fleet import Snapshot

    return Snapshot(**{"leases": {}, "now": 1_000_000.0, **kw})


def test_reconcile_judges_the_effective_driver_and_its_scope():
    """The version the operator will pull (a full image's tag, not spec.version), a digest (no key: refused), an
    NVIDIADriver that selects no node (nothing to judge, not ok), matchFields, and an incomplete pass."""
    from compat_hook.cluster.overview.fleet import OK, reconcile

    now = 1_000_000.0
    leases = {n: _lease(now - 10) for n in ("a1", "a2", "b1")}
    nodes = (_node("a1", labels={"pool": "a"}, verdict="pass", target=R570),
             _node("a2", labels={"pool": "a"}, verdict="warn", target=R570, complete=False,
                   incomplete=["not_in_store"]),
             _node("b1", labels={"pool": "b"}, verdict="pass", target=R570))
    kbld = {"metadata": {"name": "cp"}, "spec": {"driver": {"image": f"nvcr.io/nvidia/driver:{R570}-ubuntu22.04"}}}
    data = reconcile(_world(nodes=nodes, leases=leases, policies=(kbld,), now=now), PREFIX)
    # judged by the version in the image's tag; a2 published warn, but its pass could not look
    assert data[f"clusterpolicy_cp_{R570}"] == "not judged on 1 of 3 node(s): a2 (incomplete: not_in_store)"
    assert data[f"driver_{R570}"] == data[f"clusterpolicy_cp_{R570}"]
    digest = {"metadata": {"name": "cp"}, "spec": {"driver": {"image": "nvcr.io/nvidia/driver@sha256:" + "0" * 64}}}
    data = reconcile(_world(nodes=nodes, leases=leases, policies=(digest,), now=now), PREFIX)
    assert not [k for k in data if k.startswith(("clusterpolicy_cp_5", "driver_"))], data  # no version: no key
    # an NVIDIADriver selecting no GPU node: nothing to judge, and it says so (never ok)
    cp = {"metadata": {"name": "cp"}, "spec": {"driver": {"useNvidiaDriverCRD": True}}}
    none = {"metadata": {"name": "none"}, "spec": {"version": R570, "nodeSelector": {"pool": "z"}}}
    byname = {"metadata": {"name": "byname"}, "spec": {"version": R570, "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a2"]}]}]}}}}
    data = reconcile(_world(nodes=nodes, leases=leases, policies=(cp,), drivers=(none,), now=now), PREFIX)
    assert data[f"nvidiadriver_none_{R570}"] == "nothing to judge: NVIDIADriver none selects no GPU node"
    data = reconcile(_world(nodes=nodes, leases=leases, policies=(cp,), drivers=(byname,), now=now), PREFIX)
    assert data[f"nvidiadriver_byname_{R570}"] == "not judged on 1 of 1 node(s): a2 (incomplete: not_in_store)"
    # a GPUCluster is said, never passed over
    data = reconcile(_world(nodes=nodes, leases=leases, policies=(cp,), now=now,
                            gpuclusters=({"metadata": {"name": "dra"}},)), PREFIX)
    assert data["gpucluster"].startswith("not judged: GPUCluster dra")
    assert data["gpucluster"] != OK


def test_reconcile_what_if_a_delete_or_a_mode_switch():
    """Deleting an NVIDIADriver moves its nodes to the default one's driver; a ClusterPolicy handing drivers to
    NVIDIADrivers moves every node to theirs: ok only where each moving node judged its new driver."""
    from compat_hook.cluster.overview.fleet import OK, reconcile

    now = 1_000_000.0
    nodes = (_node("a1", labels={"pool": "a"}, verdict="pass", target=R570),
             _node("b1", labels={"pool": "b"}, verdict="pass", target=R535))
    leases = {n: _lease(now - 10) for n in ("a1", "b1")}
    cp = {"metadata": {"name": "cp"}, "spec": {"driver": {"version": R535, "useNvidiaDriverCRD": True}}}
    pool_a = {"metadata": {"name": "pool-a"}, "spec": {"version": R570, "nodeSelector": {"pool": "a"}}}
    # the fallback selects every GPU node that no other NVIDIADriver does (pool b here)
    rest = {"metadata": {"name": "rest"}, "spec": {"version": R535, "nodeSelector": {"pool": "b"}}}
    data = reconcile(_world(nodes=nodes, leases=leases, policies=(cp,), drivers=(pool_a, rest), now=now), PREFIX)
    assert data["nvidiadriver_pool-a_delete"] == OK  # a1 falls to no driver: nothing unjudged
    assert data["clusterpolicy_cp_mode.true.false"].startswith("not judged on 1 of 2 node(s): a1 (535.261.03:")
    wide = {"metadata": {"name": "wide"}, "spec": {"version": R580}}  # selects every GPU node
    cp_nd = {"metadata": {"name": "cp"}, "spec": {"driver": {"version": R535}}}
    data = reconcile(_world(nodes=nodes, leases=leases, policies=(cp_nd,), drivers=(wide,), now=now), PREFIX)
    assert data["clusterpolicy_cp_mode.true.true"] == ("not judged on 2 of 2 node(s): a1 (580.95.05: verdict for "
                                                        "570.195.03), b1 (580.95.05: verdict for 535.261.03)")
    assert data["clusterpolicy_cp_delete"] == data["clusterpolicy_cp_mode.true.true"]  # v26.7: NDs drive alone
    assert data["clusterpolicy_cp_mode.false.false"] == OK  # the driver disabled: nothing new runs


def test_freshness_is_what_the_fleet_saw_not_the_agents_clock():
    """A Lease whose renewTime is a day ahead: fresh only for one Lease after the fleet saw it change; one
    renewed by a clock a day behind is fresh while it keeps changing."""
    from compat_hook.cluster.overview.fleet import LeaseClock, reconcile

    now = 1_000_000.0
    nodes = (_node("a1", verdict="pass", target=R570),)
    cp = {"metadata": {"name": "cp"}, "spec": {"driver": {"version": R570}}}
    ahead = dict(_lease(now + 86400, duration=60), metadata={"name": "a1", "resourceVersion": "7"})
    clock = LeaseClock()
    clock.note(ahead, 500.0)  # seen change (a watch event) at t=500 of the fleet's clock
    for t, want in ((530.0, "ok"), (561.0, "not judged on 1 of 1 node(s): a1 (stale: no heartbeat from its agent)")):
        ages = clock.ages({"a1": ahead}, t)
        data = reconcile(_world(nodes=nodes, leases={"a1": ahead}, policies=(cp,), now=now, ages=ages), PREFIX)
        assert data[f"clusterpolicy_cp_{R570}"] == want, (t, data)
    # the same Lease read at a fleet's start (a list, no change seen): from the future, so stale at once
    fresh_start = LeaseClock()
    fresh_start.note(ahead, 500.0, listed=True, wall=now)
    ages = fresh_start.ages({"a1": ahead}, 500.0)
    data = reconcile(_world(nodes=nodes, leases={"a1": ahead}, policies=(cp,), now=now, ages=ages), PREFIX)
    assert "stale" in data[f"clusterpolicy_cp_{R570}"]
    # a clock a day behind, renewing: every change seen is a heartbeat
    behind = dict(_lease(now - 86400, duration=60), metadata={"name": "a1", "resourceVersion": "8"})
    clock.note(behind, 600.0)
    data = reconcile(_world(nodes=nodes, leases={"a1": behind}, policies=(cp,), now=now,
                            ages=clock.ages({"a1": behind}, 630.0)), PREFIX)
    assert data[f"clusterpolicy_cp_{R570}"] == "ok"


def test_the_election_rule():
    """Expiry by the standby's own clock, renew by the holder, an empty holder free at once."""
    from compat_hook.cluster.api.leader import decide

    rec = {"holderIdentity": "x", "leaseDurationSeconds": 6}
    assert decide(rec, me="y", observed_at=0.0, now=5.9) == "standby"
    assert decide(rec, me="y", observed_at=0.0, now=6.1) == "acquire"
    assert decide(rec, me="x", observed_at=0.0, now=100.0) == "renew"
    assert decide({"holderIdentity": "", "leaseDurationSeconds": 1}, me="y", observed_at=0.0, now=0.0) == "acquire"


@pytest.mark.parametrize("argv, rc, says", [
    (["--namespace", "Not_A_Namespace"], 2, "--namespace: not a namespace name"),
    (["--lease-seconds", "1"], 2, "--lease-seconds: 3 to 3600"),
    (["--resync", "0"], 2, "--resync: 0.5 to 3600 seconds"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], 1, "no cluster credentials"),
])
def test_bad_usage_and_no_credentials_are_one_line(argv, rc, says, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C"}
    p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "fleet", *argv], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == rc, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in p.stderr, p.stderr


@pytest.mark.containers
@pytest.mark.slow
def test_helm_install_runs_and_uninstall_leaves_nothing_of_the_fleet(tmp_path):
    """`helm install --set fleet.enabled=true` on a control plane of its own (the chart's cluster-scoped objects
    would meet the module's), the controller run with the installed account's token until it leads and
    writes, stopped, then `helm uninstall`: no object of the fleet's is left, and it had made none of its own
    (everything it writes is the chart's Lease and ConfigMap)."""
    from tests.support.kube import ADMIN_TOKEN

    ns = "ch-fleet"
    cp = ControlPlane(tmp_path / "cp")
    proc = None
    try:
        cp.start()
        env = {"KUBECONFIG": str(cp.kubeconfig(ADMIN_TOKEN, "admin"))}
        gpu_operator(cp.admin, R535)  # before the policy: creating it is judged too
        chart.helm("install", "compat-hook", chart.CHART, "--namespace", ns, "--create-namespace",
                   "--set", "fleet.enabled=true", "--no-hooks", env=env)
        a = cp.admin
        sel = {"labelSelector": "app.kubernetes.io/name=compat-hook,app.kubernetes.io/component=fleet"}
        kinds = {"leases": f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                 "configmaps": f"/api/v1/namespaces/{ns}/configmaps",
                 "deployments": f"/apis/apps/v1/namespaces/{ns}/deployments",
                 "clusterroles": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                 "vaps": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"}
        before = {k: sorted(o["metadata"]["name"] for o in a.get(p, **sel)["items"]) for k, p in kinds.items()}
        assert before == {"leases": ["compat-hook-fleet"], "configmaps": ["compat-hook-fleet"],
                          "deployments": ["compat-hook-fleet"], "clusterroles": ["compat-hook-fleet"],
                          "vaps": ["compat-hook-fleet-driver-version", "compat-hook-fleet-objects",
                                   "compat-hook-fleet-param"]}, before
        a.create("/api/v1/nodes", gpu_node("gpu-1", deploy_driver=False))
        token = a.create(f"/api/v1/namespaces/{ns}/serviceaccounts/compat-hook-fleet/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600}})["status"]["token"]
        log = (tmp_path / "fleet.log").open("wb")
        proc = subprocess.Popen(["/usr/bin/python3", "-m", "compat_hook", "cluster", "fleet", "--namespace", ns,
                                 "--identity", "pod-1", "--kubeconfig", str(cp.kubeconfig(token, "fleet"))],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        cm = f"/api/v1/namespaces/{ns}/configmaps/compat-hook-fleet"
        a.wait("the installed controller's answer", lambda: (a.get(cm).get("data") or {}).get(CPKEY.format(R535)))
        assert (a.get(cm)["data"][CPKEY.format(R535)] == "not judged on 1 of 1 node(s): gpu-1 (no verdict)")
        def refused() -> bool:  # the API server loads a new policy asynchronously: a dry run until it is in force
            try:
                a.request("PATCH", f"{CP}/cluster-policy", {"spec": {"driver": {"version": R570}}},
                          content_type=MERGE, query={"dryRun": "All"})
                return False
            except ApiError as err:
                assert err.status == 403 and POLICY in err.body, err
                return True

        a.wait("the installed policy in force", refused, timeout=30, interval=0.5)
        with pytest.raises(ApiError) as e:  # the installed policy refuses it
            a.merge(f"{CP}/cluster-policy", {"spec": {"driver": {"version": R570}}})
        assert POLICY in e.value.body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert a.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/compat-hook-fleet")["spec"].get(
            "holderIdentity", "") == ""
        after_run = {k: sorted(o["metadata"]["name"] for o in a.get(p, **sel)["items"]) for k, p in kinds.items()}
        assert after_run == before  # it made nothing of its own
        chart.helm("uninstall", "compat-hook", "--namespace", ns, "--no-hooks", "--wait", env=env)
        left = {k: [o["metadata"]["name"] for o in a.get(p, **sel)["items"]] for k, p in kinds.items()}
        assert left == {k: [] for k in kinds}, left
        # the policy went with it (once the API server's admission has seen it go)
        a.wait("the policy gone", lambda: a.merge(f"{CP}/cluster-policy", {"spec": {"driver": {"version": R570}}}),
               timeout=30)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        cp.stop()
