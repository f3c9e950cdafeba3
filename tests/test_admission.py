"""The Helm chart on a real API server: each node's agent may change only its own Node, and only its keys.

kube-apiserver v1.34 (built from the ``k8s.io/kubernetes`` module, RBAC on) with the chart's
rendered manifests applied by server-side apply, as ``helm install`` does. Tokens are real
TokenRequests: an agent's is bound to a Pod of the DaemonSet's template placed on its node (the
API server then names the node in ``request.userInfo.extra``, as for the kubelet's projected
tokens); an unbound one names none. Every refusal is checked to come from the chart's
ValidatingAdmissionPolicy (not RBAC), and to leave the Node as it was; every allowed change is
read back.

Also here: ``helm template`` output for several value sets passes a server-side dry run with
strict field validation; ``helm install --create-namespace`` gives a namespace whose Pod Security
label admits the DaemonSet's pod (which a ``baseline`` namespace refuses); ``containerd.distribution
=auto`` reads the distribution from the nodes; least RBAC, asked of the API server itself.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from tests.support import chart
from tests.support.kube import ADMIN_TOKEN, AGENT_TOKEN, Api, ApiError, ControlPlane

pytestmark = [pytest.mark.containers, pytest.mark.slow]

NS = "compat-hook"
PREFIX = "compat-hook.io"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
DEPLOY = "nvidia.com/gpu.deploy.driver"
AGENT_POLICY = "ValidatingAdmissionPolicy 'compat-hook-agent-node'"
OBJECTS_POLICY = "ValidatingAdmissionPolicy 'compat-hook-agent-objects'"
VALIDATOR_NODE_POLICY = "ValidatingAdmissionPolicy 'compat-hook-validator-node'"
VALIDATOR_PODS_POLICY = "ValidatingAdmissionPolicy 'compat-hook-validator-pods'"
VALIDATED = f"{PREFIX}/validated"
EVENTS_POLICY = "ValidatingAdmissionPolicy 'compat-hook-events'"
RELEASE_POLICY = "ValidatingAdmissionPolicy 'compat-hook-release-node'"
#: The labels of the agent's Lease and ConfigMap (compat_hook/cluster/node/detailscm.py)
AGENT_LABELS = {"app.kubernetes.io/name": "compat-hook", "app.kubernetes.io/component": "preflight"}
MERGE, SMP, JSONP = ("application/merge-patch+json", "application/strategic-merge-patch+json",
                     "application/json-patch+json")


class World:
    def __init__(self, cp: ControlPlane, docs: list) -> None:
        self.cp, self.admin, self.docs = cp, cp.admin, docs
        self.api: dict = {}

    def node(self, name: str) -> dict:
        return self.admin.get(f"/api/v1/nodes/{name}")

    def patch(self, who: str, name: str, body, ct: str = MERGE, **query) -> dict:
        return self.api[who].request("PATCH", f"/api/v1/nodes/{name}", body, content_type=ct, query=query or None)

    def refused(self, who: str, name: str, body, ct: str = MERGE, policy: str | tuple = AGENT_POLICY) -> str:
        """The patch is refused by ``policy`` (one of them, for a tuple: the API server names the first policy
        that denies, in no set order) and the Node is left as it was; returns the message."""
        before = self.node(name)
        with pytest.raises(ApiError) as e:
            self.patch(who, name, body, ct)
        policies = (policy,) if isinstance(policy, str) else policy
        assert e.value.status == 403 and any(p in str(e.value) for p in policies), e.value
        after = self.node(name)
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        return str(e.value)


def _pod(w_docs: list, node: str, name: str, ds: str = "compat-hook") -> dict:
    """A Pod of DaemonSet ``ds``'s own template, bound to ``node`` (no kubelet runs it)."""
    tpl = json.loads(json.dumps(chart.daemonset(w_docs, ds)["spec"]["template"]))
    tpl["metadata"]["name"] = name
    tpl["spec"]["nodeName"] = node
    return tpl


def _token(admin: Api, sa: str, pod: dict | None = None) -> str:
    spec: dict = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"]["uid"]}
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    return admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts/{sa}/token", req)["status"]["token"]


def _wait_policy(w: World, who: str, node: str, body, policy: str) -> None:
    """Until the API server enforces the policies just applied (a dry run: nothing changes)."""
    def enforced():
        try:
            w.patch(who, node, body, dryRun="All")
        except ApiError as e:
            return e.status == 403 and policy in str(e)
        return False

    w.admin.wait(f"{policy} enforced", enforced, timeout=30)


def _wait_refused(w: World, policy: str, call) -> None:
    """Until ``call`` (a dry run) is refused by ``policy``."""
    def enforced():
        try:
            call()
        except ApiError as e:
            return e.status == 403 and policy in str(e)
        return False

    w.admin.wait(f"{policy} enforced", enforced, timeout=30)


class PrivilegedControlPlane(ControlPlane):
    """The API server allows privileged containers, as kubeadm's and most clusters' do: a privileged
    probe pod is then refused by the chart's policy, not by the API server itself."""

    def start_apiserver(self) -> None:
        if "--allow-privileged=true" not in self._apiserver_argv:
            self._apiserver_argv.append("--allow-privileged=true")
        super().start_apiserver()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    cp = PrivilegedControlPlane(tmp_path_factory.mktemp("admission") / "cp")
    cp.start()
    try:
        docs = chart.render()
        # the release Job is a pre-delete hook: nothing here would run it
        chart.apply(cp.admin, [d for d in docs if d["kind"] != "Job"])
        w = World(cp, docs)
        for name in ("gpu-a", "gpu-b"):
            cp.admin.create("/api/v1/nodes", {"metadata": {"name": name, "labels": {
                DEPLOY: "true", "nvidia.com/gpu.present": "true", "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
                "annotations": {"team.example.com/owner": "gpu-team"}}})
        for node in ("gpu-a", "gpu-b"):
            pod = cp.admin.create(f"/api/v1/namespaces/{NS}/pods", _pod(docs, node, f"compat-hook-{node}"))
            w.api[node] = Api(cp.url, _token(cp.admin, "compat-hook", pod))
        w.api["unbound"] = Api(cp.url, _token(cp.admin, "compat-hook"))
        w.api["static"] = Api(cp.url, AGENT_TOKEN)  # the same user name, from the token file: no extra at all
        w.api["release"] = Api(cp.url, _token(cp.admin, "compat-hook-release"))
        # the validator's pod on gpu-a (the validator DaemonSet's template), and a token bound to none
        vpod = cp.admin.create(f"/api/v1/namespaces/{NS}/pods",
                               _pod(docs, "gpu-a", "compat-hook-validator-gpu-a", ds="compat-hook-validator"))
        w.api["validator"] = Api(cp.url, _token(cp.admin, "compat-hook-validator", vpod))
        w.api["validator-unbound"] = Api(cp.url, _token(cp.admin, "compat-hook-validator"))
        _wait_policy(w, "gpu-a", "gpu-b", {"metadata": {"labels": {f"{PREFIX}/preflight": "pass"}}}, AGENT_POLICY)
        # (each policy is loaded on its own: wait for the others too, each with a dry run it refuses)
        _wait_refused(w, OBJECTS_POLICY, lambda: w.api["gpu-a"].request(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", {"metadata": {"name": "gpu-b"}},
            query={"dryRun": "All"}))
        _wait_refused(w, VALIDATOR_PODS_POLICY, lambda: w.api["validator"].request(
            "POST", f"/api/v1/namespaces/{NS}/pods", dict(_probe("gpu-b")), query={"dryRun": "All"}))
        _wait_policy(w, "validator", "gpu-b", {"metadata": {"labels": {VALIDATED: "x"}}}, VALIDATOR_NODE_POLICY)
        _wait_policy(w, "release", "gpu-b", {"metadata": {"labels": {"x": "1"}}}, RELEASE_POLICY)
        yield w
    finally:
        cp.stop()


# ----------------------------------------------------------------------------- the agent on its Node


def test_pod_bound_token_names_its_node(world):
    """The fact the policy stands on (ServiceAccountTokenPodNodeInfo): a token bound to a pod on a
    node carries that node's name; an unbound one carries none."""
    def extra(who):
        review = world.api[who].create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                       {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        info = review["status"]["userInfo"]
        assert info["username"] == f"system:serviceaccount:{NS}:compat-hook"
        return info.get("extra", {})

    assert extra("gpu-a")["authentication.kubernetes.io/node-name"] == ["gpu-a"]
    assert extra("gpu-b")["authentication.kubernetes.io/node-name"] == ["gpu-b"]
    assert "authentication.kubernetes.io/node-name" not in extra("unbound")


def test_agent_sets_its_own_preflight_and_skip_labels(world):
    w = world
    summary = json.dumps({"verdict": "fail", "details": f"configmap {NS}/gpu-a"})
    w.patch("gpu-a", "gpu-a", {"metadata": {
        "labels": {f"{PREFIX}/preflight": "fail", f"{PREFIX}/preflight.broken": "1",
                   f"{PREFIX}/preflight.target-driver": "580.65.06", SKIP: "true"},
        "annotations": {f"{PREFIX}/preflight": summary, f"{PREFIX}/holds-upgrade": "2026-12-03T10:00:00Z"}}})
    meta = w.node("gpu-a")["metadata"]
    assert meta["labels"][f"{PREFIX}/preflight"] == "fail" and meta["labels"][SKIP] == "true"
    assert meta["labels"][f"{PREFIX}/preflight.target-driver"] == "580.65.06"
    assert meta["annotations"][f"{PREFIX}/preflight"] == summary
    # the other patch kinds, and removals: judged by what they change, not by how they say it
    w.patch("gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: None}, "annotations": {f"{PREFIX}/holds-upgrade": None}}},
            SMP)
    w.patch("gpu-a", "gpu-a", [{"op": "replace", "path": f"/metadata/labels/{PREFIX.replace('/', '~1')}~1preflight",
                                "value": "pass"}], JSONP)
    meta = w.node("gpu-a")["metadata"]
    assert SKIP not in meta["labels"] and f"{PREFIX}/holds-upgrade" not in meta["annotations"]
    assert meta["labels"][f"{PREFIX}/preflight"] == "pass"
    assert meta["labels"][DEPLOY] == "true" and meta["annotations"]["team.example.com/owner"] == "gpu-team"


def test_agent_removes_only_its_own_skip_label(world):
    """The skip label is the agent's only with its holds-upgrade annotation: an operator's own (no
    annotation) is never the agent's to remove, nor is its own without the annotation going too; it
    sets the label only to "true", with the annotation."""
    w = world
    hold = f"{PREFIX}/holds-upgrade"
    w.admin.merge("/api/v1/nodes/gpu-a", {"metadata": {"labels": {SKIP: "true"}, "annotations": {hold: None}}})
    try:
        # someone else's skip label (no annotation of compat-hook's)
        assert "only together with its annotation" in w.refused("gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: None}}})
        # compat-hook's own, but the label alone
        w.admin.merge("/api/v1/nodes/gpu-a", {"metadata": {"annotations": {hold: "x"}}})
        assert "only together with its annotation" in w.refused("gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: None}}})
        assert "only together with its annotation" in w.refused(
            "gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: None}, "annotations": {hold: "y"}}})
        # set to anything but "true", or without the annotation
        assert 'only to \\"true\\"' in w.refused("gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: "false"}}})
        w.patch("gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: None}, "annotations": {hold: None}}})  # together: yes
        assert 'only to \\"true\\"' in w.refused("gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: "true"}}})
        w.patch("gpu-a", "gpu-a", {"metadata": {"labels": {SKIP: "true"}, "annotations": {hold: "z"}}})
        assert w.node("gpu-a")["metadata"]["labels"][SKIP] == "true"
    finally:
        w.admin.merge("/api/v1/nodes/gpu-a", {"metadata": {"labels": {SKIP: None}, "annotations": {hold: None}}})


def test_agent_cannot_change_another_node(world):
    w = world
    msg = w.refused("gpu-a", "gpu-b", {"metadata": {"labels": {f"{PREFIX}/preflight": "fail", SKIP: "true"}}})
    assert "on node gpu-a may change only that Node, not gpu-b" in msg
    w.refused("gpu-a", "gpu-b", {"metadata": {"annotations": {f"{PREFIX}/preflight": "{}"}}})
    # the refusal is about whose Node it is: B's own agent may
    w.patch("gpu-b", "gpu-b", {"metadata": {"labels": {f"{PREFIX}/preflight": "warn"}}})
    assert w.node("gpu-b")["metadata"]["labels"][f"{PREFIX}/preflight"] == "warn"


def test_the_agents_server_side_apply_is_admitted_and_takes_over_an_older_agents_keys(world):
    """compat_hook/cluster/node/nodeapply.py with the agent's pod-bound token: keys an older agent wrote by
    merge patch go by a patch (the hold's pair together), a hold is applied and lifted by server-side
    apply under the field manager compat-hook-agent, and a skip label of someone else's is neither
    applied nor removed. Each write is one the policy admits."""
    from compat_hook.cluster.node import applyintent, gate, nodeapply, nodedoc, nodeevents
    from compat_hook.cluster.api import kube

    w = world
    hold = f"{PREFIX}/holds-upgrade"
    k = kube.connect(str(w.cp.kubeconfig(w.api["gpu-b"].token, "agent-gpu-b")))

    def write(verdict: str) -> dict:
        meta = w.node("gpu-b")["metadata"]
        g = gate.decide(meta, verdict=verdict, complete=True, why="1 workload(s) regress", enabled=True,
                        prefix=PREFIX)
        doc = {"v": 2, "verdict": verdict, "target": "580.65.06", "regressions": int(verdict == "fail"),
               "gate": g.state}
        plan = nodeapply.plan("gpu-b", meta, nodedoc.node_keys(prefix=PREFIX, doc=doc, gate=g, current=meta))
        applyintent.write_node(k, "gpu-b", plan)
        after = w.node("gpu-b")["metadata"]
        return after, {m["manager"]: m["operation"] for m in after["managedFields"]
                       if f"f:{SKIP}" in json.dumps(m.get("fieldsV1"))}

    # an older agent's hold, written by merge patch (its manager owns the keys)
    w.patch("gpu-b", "gpu-b", {"metadata": {"labels": {f"{PREFIX}/preflight": "fail", SKIP: "true"},
                                            "annotations": {hold: "x"}}}, SMP, fieldManager="compat-hook")
    try:
        meta, _ = write("pass")  # lifted: the hold's pair by one patch, the verdict by a forced apply
        assert SKIP not in meta["labels"] and hold not in meta["annotations"], meta
        assert meta["labels"][f"{PREFIX}/preflight"] == "pass"
        meta, skip_owners = write("fail")  # held by apply
        assert meta["labels"][SKIP] == "true" and hold in meta["annotations"]
        assert skip_owners == {"compat-hook-agent": "Apply"}, skip_owners
        meta, _ = write("pass")  # lifted by leaving both out of the apply (one request, the pair together)
        assert SKIP not in meta["labels"] and hold not in meta["annotations"], meta
        # someone else's skip label: the agent's apply never names it, so it stays, theirs
        w.admin.merge("/api/v1/nodes/gpu-b", {"metadata": {"labels": {SKIP: "true"}}})
        meta, skip_owners = write("fail")
        assert meta["labels"][SKIP] == "true" and hold not in meta["annotations"]
        assert "compat-hook-agent" not in skip_owners, skip_owners
        meta, skip_owners = write("pass")
        assert meta["labels"][SKIP] == "true" and "compat-hook-agent" not in skip_owners
    finally:
        w.admin.merge("/api/v1/nodes/gpu-b", {"metadata": {
            "labels": {SKIP: None, f"{PREFIX}/preflight": None, f"{PREFIX}/preflight.broken": None,
                       f"{PREFIX}/preflight.target-driver": None},
            "annotations": {hold: None, f"{PREFIX}/preflight": None}}})


def test_agent_sets_its_nodes_registration_label_and_only_there(world):
    """``<prefix>/registration`` (the chart's registration path, compat_hook/cluster/node/nodedoc.py) is one of the
    agent's own keys on its own Node: set and changed there, refused on another Node and to the validator."""
    w = world
    key = f"{PREFIX}/registration"
    w.patch("gpu-a", "gpu-a", {"metadata": {"labels": {key: "nri"}}}, SMP)
    w.patch("gpu-a", "gpu-a", {"metadata": {"labels": {key: "nri-not-connected"}}}, SMP)
    assert w.node("gpu-a")["metadata"]["labels"][key] == "nri-not-connected"
    assert "may change only that Node, not gpu-b" in w.refused("gpu-a", "gpu-b", {"metadata": {"labels": {key: "nri"}}})
    assert key in w.refused("validator", "gpu-a", {"metadata": {"labels": {key: "runtimeclass"}}},
                            policy=VALIDATOR_NODE_POLICY)
    w.patch("gpu-a", "gpu-a", {"metadata": {"labels": {key: None}}}, SMP)
    assert key not in w.node("gpu-a")["metadata"]["labels"]


@pytest.mark.parametrize("body,ct,says", [
    ({"metadata": {"labels": {DEPLOY: "false"}}}, MERGE, DEPLOY),                # the operator's driver switch
    ({"metadata": {"labels": {DEPLOY: None}}}, SMP, DEPLOY),                     # ... removed
    ({"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"}}}, MERGE,
     "nvidia.com/gpu-driver-upgrade-state"),
    ({"metadata": {"labels": {"team": "x", f"{PREFIX}/preflight": "pass"}}}, MERGE, "not team"),
    ({"metadata": {"annotations": {"nvidia.com/gpu-driver-upgrade-requested": "true"}}}, MERGE,
     "nvidia.com/gpu-driver-upgrade-requested"),
    ({"metadata": {"annotations": {"team.example.com/owner": None}}}, MERGE, "team.example.com/owner"),
    ({"metadata": {"annotations": {f"{PREFIX}/allow-upgrade": "true"}}}, MERGE, f"{PREFIX}/allow-upgrade"),
    ({"metadata": {"labels": {VALIDATED: "555.58.02"}}}, MERGE, VALIDATED),    # the validator's result
    ({"metadata": {"annotations": {VALIDATED: "555.58.02"}}}, MERGE, VALIDATED),
    ({"spec": {"unschedulable": True}}, MERGE, "spec"),                          # a cordon
    ({"spec": {"taints": [{"key": "compat-hook", "effect": "NoSchedule"}]}}, SMP, "spec"),
    ({"spec": {"podCIDR": "10.9.0.0/24"}}, MERGE, "spec"),
    ({"metadata": {"finalizers": ["example.com/keep"]}}, MERGE, "finalizers"),
    ([{"op": "add", "path": "/metadata/labels/other", "value": "1"}], JSONP, "not other"),
], ids=["deploy-driver", "deploy-driver-removed", "upgrade-state", "foreign-label", "upgrade-requested",
        "foreign-annotation-removed", "allow-upgrade", "validated-label", "validated-annotation", "unschedulable", "taint", "spec-field", "finalizer",
        "json-patch"])
def test_agent_cannot_change_anything_else_on_its_node(world, body, ct, says):
    assert says in world.refused("gpu-a", "gpu-a", body, ct)


def test_agent_cannot_replace_its_labels_wholesale(world):
    """A patch that replaces the whole label map (a strategic-merge ``$patch: replace``) keeping only the
    agent's keys drops the operator's: judged key by key, it is refused. (A PUT is refused earlier:
    RBAC gives the agent no ``update`` on Nodes.)"""
    w = world
    labels = {k: v for k, v in w.node("gpu-a")["metadata"]["labels"].items() if k.startswith(f"{PREFIX}/")}
    msg = w.refused("gpu-a", "gpu-a", {"metadata": {"labels": dict(labels, **{"$patch": "replace"})}}, SMP)
    assert DEPLOY in msg
    with pytest.raises(ApiError) as e:
        w.api["gpu-a"].request("PUT", "/api/v1/nodes/gpu-a", w.node("gpu-a"))
    assert e.value.status == 403 and "ValidatingAdmissionPolicy" not in str(e.value)


@pytest.mark.parametrize("who", ["unbound", "static"])
def test_a_token_that_names_no_node_changes_no_node(world, who):
    for node in ("gpu-a", "gpu-b"):
        msg = world.refused(who, node, {"metadata": {"labels": {f"{PREFIX}/preflight": "pass"}}})
        assert "pod-bound token" in msg


# ----------------------------------------------------------------------------- its Lease, ConfigMap, Events


def _create(api: Api, path: str, obj: dict) -> dict:
    return api.create(path, obj)


def test_agent_writes_only_its_own_lease_configmap_and_events(world):
    w = world
    a = w.api["gpu-a"]
    # Events about a Node go to default (the API server takes one about a cluster-scoped object nowhere
    # else), where `kubectl describe node` finds them
    leases, cms, events = (f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", f"/api/v1/namespaces/{NS}/configmaps",
                           "/api/v1/namespaces/default/events")
    lease = _create(a, leases, {"metadata": {"name": "gpu-a", "labels": AGENT_LABELS},
                                "spec": {"holderIdentity": "gpu-a", "leaseDurationSeconds": 600}})
    lease["spec"]["renewTime"] = "2026-12-03T10:05:00.000000Z"
    a.request("PUT", f"{leases}/gpu-a", lease)  # the heartbeat: an update, as the agent renews it
    assert w.admin.get(f"{leases}/gpu-a")["spec"]["renewTime"].startswith("2026-12-03T10:05:00")
    cm = _create(a, cms, {"metadata": {"name": "gpu-a", "labels": AGENT_LABELS}, "data": {"images": "[]"}})
    cm["data"]["images"] = '["x"]'
    a.request("PUT", f"{cms}/gpu-a", cm)
    assert w.admin.get(f"{cms}/gpu-a")["data"]["images"] == '["x"]'
    # an update of another node's Lease is refused, as its create is
    lease_b = w.admin.create(leases, {"metadata": {"name": "gpu-b"}, "spec": {"holderIdentity": "gpu-b"}})
    with pytest.raises(ApiError) as e:
        a.request("PUT", f"{leases}/gpu-b", dict(lease_b, spec={"holderIdentity": "gpu-a"}))
    assert e.value.status == 403 and OBJECTS_POLICY in str(e.value)
    assert w.admin.get(f"{leases}/gpu-b")["spec"]["holderIdentity"] == "gpu-b"
    w.admin.delete(f"{leases}/gpu-b")
    ev = {"metadata": {"generateName": "gpu-a.compat-hook-"}, "reason": "CompatHookPreflight", "message": "m",
          "type": "Normal", "involvedObject": {"kind": "Node", "name": "gpu-a", "apiVersion": "v1"}}
    made = _create(a, events, ev)
    described = w.admin.get("/api/v1/events", fieldSelector="involvedObject.kind=Node,involvedObject.name=gpu-a,"
                                                            "involvedObject.namespace=")["items"]
    assert made["metadata"]["name"] in [e["metadata"]["name"] for e in described]

    def refused(api, path, obj, policy=OBJECTS_POLICY):
        with pytest.raises(ApiError) as e:
            _create(api, path, obj)
        assert e.value.status == 403 and policy in str(e.value), e.value
        return str(e.value)

    assert "writes only the Lease named gpu-a, not gpu-b" in refused(
        a, leases, {"metadata": {"name": "gpu-b"}, "spec": {"holderIdentity": "gpu-b"}})
    refused(a, cms, {"metadata": {"name": "gpu-b"}, "data": {}})
    assert "records Events only about the Node gpu-a" in refused(
        a, events, dict(ev, involvedObject=dict(ev["involvedObject"], name="gpu-b")), EVENTS_POLICY)
    refused(a, events, dict(ev, involvedObject={"kind": "Pod", "name": "gpu-a", "namespace": "default"}),
            EVENTS_POLICY)
    refused(a, events, dict(ev, involvedObject={"name": "gpu-a"}), EVENTS_POLICY)  # no kind: not a Node's
    with pytest.raises(ApiError) as e:
        a.delete(f"{leases}/gpu-a")
    assert e.value.status == 403  # no delete verb (RBAC)
    # a token that names no node writes none of them, not even under the right name
    assert "pod-bound token" in refused(w.api["unbound"], leases, {"metadata": {"name": "gpu-a-x"}, "spec": {}})
    assert "pod-bound token" in refused(w.api["unbound"], events, ev, EVENTS_POLICY)
    # Events anywhere else, its own namespace included: RBAC has nothing for it
    for ns in (NS, "kube-system"):
        with pytest.raises(ApiError) as e:
            _create(a, f"/api/v1/namespaces/{ns}/events", dict(ev, involvedObject=dict(ev["involvedObject"],
                                                                                       namespace=ns)))
        assert e.value.status == 403 and "ValidatingAdmissionPolicy" not in str(e.value), e.value
    assert [c["metadata"]["name"] for c in w.admin.get(cms)["items"] if c["metadata"]["name"].startswith("gpu-")] == [
        "gpu-a"]


def test_agent_writes_nothing_of_the_chart_s_even_on_a_node_named_like_it(world):
    """A node named like one of the chart's own objects (the agent's config, ``compat-hook-agent``):
    its agent's Lease and ConfigMap have that name, but it may write only objects that carry the
    labels compat-hook's agent puts on them (compat_hook/cluster/node/detailscm.py), before and after."""
    from compat_hook.cluster.node.detailscm import COMPONENT_LABELS

    assert COMPONENT_LABELS == AGENT_LABELS  # what the policy asks is what the agent writes
    w, name = world, "compat-hook-agent"
    cms, leases = f"/api/v1/namespaces/{NS}/configmaps", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    w.admin.create("/api/v1/nodes", {"metadata": {"name": name}})
    try:
        pod = w.admin.create(f"/api/v1/namespaces/{NS}/pods", _pod(w.docs, name, f"compat-hook-{name}"))
        a = Api(w.cp.url, _token(w.admin, "compat-hook", pod))
        chart_cm = w.admin.get(f"{cms}/{name}")
        config = chart_cm["data"]["config.yaml"]
        for change in ({}, {"labels": AGENT_LABELS}):  # as it is, or labelled like the agent's own
            forged = json.loads(json.dumps(chart_cm))
            forged["metadata"].setdefault("labels", {}).update(change.get("labels", {}))
            forged["data"]["config.yaml"] = config.replace("gate_upgrade: false", "gate_upgrade: true")
            with pytest.raises(ApiError) as e:
                a.request("PUT", f"{cms}/{name}", forged)
            assert e.value.status == 403 and OBJECTS_POLICY in str(e.value), e.value
            assert "labelled" in str(e.value)
        assert w.admin.get(f"{cms}/{name}")["data"]["config.yaml"] == config
        # a Lease of that name without the agent's labels: refused; with them, its own heartbeat
        with pytest.raises(ApiError) as e:
            a.create(leases, {"metadata": {"name": name}, "spec": {"holderIdentity": name}})
        assert e.value.status == 403 and OBJECTS_POLICY in str(e.value) and "labelled" in str(e.value), e.value
        a.create(leases, {"metadata": {"name": name, "labels": AGENT_LABELS}, "spec": {"holderIdentity": name}})
    finally:
        for path in (f"{leases}/{name}", f"/api/v1/namespaces/{NS}/pods/compat-hook-{name}", f"/api/v1/nodes/{name}"):
            try:
                w.admin.delete(path)
            except ApiError as e:
                assert e.status == 404, e


# ----------------------------------------------------------------------------- the validator's account


def test_validator_sets_only_its_own_nodes_validated_label(world):
    """What the validator publishes (compat_hook/cluster/node/validate.py ``publish``, a strategic-merge patch of
    one label) goes through on its own Node; nothing else does."""
    w = world
    w.patch("validator", "gpu-a", {"metadata": {"labels": {VALIDATED: "555.58.02"}}}, SMP)
    assert w.node("gpu-a")["metadata"]["labels"][VALIDATED] == "555.58.02"
    w.patch("validator", "gpu-a", {"metadata": {"labels": {VALIDATED: "failed"}}}, SMP)
    assert w.node("gpu-a")["metadata"]["labels"][VALIDATED] == "failed"
    assert "on node gpu-a may change only that Node, not gpu-b" in w.refused(
        "validator", "gpu-b", {"metadata": {"labels": {VALIDATED: "555.58.02"}}}, policy=VALIDATOR_NODE_POLICY)
    # (values no other test sets: a patch that changes nothing is no change)
    for body, says in (({"metadata": {"labels": {f"{PREFIX}/preflight": "by-validator"}}}, f"{PREFIX}/preflight"),
                       ({"metadata": {"labels": {SKIP: "by-validator"}}}, SKIP),
                       ({"metadata": {"labels": {VALIDATED: None}}}, None),  # removed: fine, it is its label
                       ({"metadata": {"annotations": {f"{PREFIX}/preflight": "by-validator"}}}, f"{PREFIX}/preflight"),
                       ({"metadata": {"annotations": {"team.example.com/owner": None}}}, "team.example.com/owner"),
                       ({"spec": {"unschedulable": True}}, "spec"),
                       ({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}, "only the taint")):
        if says is None:
            w.patch("validator", "gpu-a", body)
            assert VALIDATED not in w.node("gpu-a")["metadata"]["labels"]
            continue
        # the preflight annotation is also the policy compat-hook-node-verdicts' (only the agent writes it)
        policy = ((VALIDATOR_NODE_POLICY, "compat-hook-node-verdicts") if "annotations" in body.get("metadata", {}) and
                  f"{PREFIX}/preflight" in body.get("metadata", {})["annotations"] else VALIDATOR_NODE_POLICY)
        msg = w.refused("validator", "gpu-a", body, policy=policy)
        assert says in msg or "compat-hook-node-verdicts" in msg, body
    assert "pod-bound token" in w.refused("validator-unbound", "gpu-a", {"metadata": {"labels": {VALIDATED: "x"}}},
                                          policy=VALIDATOR_NODE_POLICY)


def test_validator_adds_and_removes_only_its_own_taint(world):
    """compat_hook/cluster/node/validate.py ``publish``: its taint, ``<prefix>/validation-failed=<driver>:NoSchedule``,
    added and removed in the taints list it writes whole (a JSON merge patch over the version it read);
    every other change of the spec is refused."""
    from compat_hook.cluster.api import kube
    from compat_hook.cluster.node.validate import ValidatorOptions, publish

    w = world
    mine = f"{PREFIX}/validation-failed"
    theirs = {"key": "team.example.com/gpu", "value": "a100", "effect": "NoSchedule"}
    w.admin.merge("/api/v1/nodes/gpu-a", {"spec": {"taints": [theirs]}})
    try:
        # the validator's own code, with its pod-bound token
        k = kube.connect(str(w.cp.kubeconfig(w.api["validator"].token, "validator")))
        opts = ValidatorOptions("gpu-a", publish_namespace=NS)
        publish(k, opts, PREFIX, {"driver": "470.256.02", "result": "fail", "images": []}, event=False)
        node = w.node("gpu-a")
        assert node["spec"]["taints"] == [theirs, {"key": mine, "value": "470.256.02", "effect": "NoSchedule"}]
        assert node["metadata"]["labels"][VALIDATED] == "failed"
        with_mine = node["spec"]["taints"]
        for taints, says in (
                ([theirs, {"key": mine, "value": "470.256.02", "effect": "NoExecute"}], "effect NoSchedule"),
                (with_mine + [{"key": mine, "value": "x", "effect": "PreferNoSchedule"}], "once"),
                ([{"key": mine, "value": "470.256.02", "effect": "NoSchedule"}], "only the taint"),  # theirs removed
                ([dict(theirs, value="h100"), with_mine[1]], "only the taint"),                     # theirs changed
                (with_mine + [{"key": "x.example.com/t", "effect": "NoSchedule"}], "only the taint")):
            assert says in w.refused("validator", "gpu-a", {"spec": {"taints": taints}}, policy=VALIDATOR_NODE_POLICY)
        for spec in ({"unschedulable": True}, {"providerID": "kwok://x"}, {"podCIDR": "10.0.0.0/24"}):
            assert "never changes a Node's spec" in w.refused("validator", "gpu-a", {"spec": spec},
                                                              policy=VALIDATOR_NODE_POLICY), spec
        # not on another Node, not with a token that names no node
        assert "may change only that Node" in w.refused(
            "validator", "gpu-b", {"spec": {"taints": [{"key": mine, "value": "1", "effect": "NoSchedule"}]}},
            policy=VALIDATOR_NODE_POLICY)
        publish(k, opts, PREFIX, {"driver": "470.256.02", "result": "pass", "images": []}, event=False)
        node = w.node("gpu-a")
        assert node["spec"]["taints"] == [theirs] and node["metadata"]["labels"][VALIDATED] == "470.256.02"
    finally:
        w.admin.merge("/api/v1/nodes/gpu-a", {"spec": {"taints": None}})


#: The chart's ResourceClaimTemplate of the probe pods (validator.deviceClass).
CLAIM_TEMPLATE = "compat-hook-probe-gpu"


def _probe(node: str = "gpu-a", gpu_resource: str | None = None, claim_template: str | None = None) -> dict:
    """The probe pod the validator on ``node`` makes for a workload (its own code builds it); with
    ``claim_template``, one that claims its GPU and is pinned to ``node`` by node affinity."""
    from compat_hook.cluster.node.validate import ValidatorOptions, probe_pod

    opts = ValidatorOptions(node, publish_namespace=NS, probe_image="localhost/compat-hook:0.1.0",
                            runtime_class="cuda-compat", gpu_resource=gpu_resource, claim_template=claim_template)
    return probe_pod(opts, {"image": "registry.test/apps/infer:1", "env": ["CUDA_VISIBLE_DEVICES=0"],
                            "runtime_class": "cuda-compat", "pods": ["apps/infer"]})


def _changed(pod: dict, change) -> dict:
    p = json.loads(json.dumps(pod))
    change(p, p["spec"])
    return p


def _sc(c: dict, **kw) -> None:
    c.setdefault("securityContext", {}).update(kw)


PROBES = f"/api/v1/namespaces/{NS}/pods"
BAD_PROBES = {
    "other-node": (lambda p, s: s.update(nodeName="gpu-b"), "not one on gpu-b"),
    "unbound": (lambda p, s: s.pop("nodeName"), "not an unbound one"),
    "not-a-probe": (lambda p, s: p["metadata"]["labels"].update({"app.kubernetes.io/name": "other"}), "probe pods"),
    "token": (lambda p, s: s.update(automountServiceAccountToken=True), "no service-account token"),
    "host-network": (lambda p, s: s.update(hostNetwork=True), "host namespace"),
    "host-pid": (lambda p, s: s.update(hostPID=True), "host namespace"),
    "host-ipc": (lambda p, s: s.update(hostIPC=True), "host namespace"),
    "host-path": (lambda p, s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "only emptyDir"),
    "secret": (lambda p, s: s["volumes"].append({"name": "s", "secret": {"secretName": "x"}}), "only emptyDir"),
    "privileged": (lambda p, s: _sc(s["containers"][0], privileged=True, allowPrivilegeEscalation=True),
                   "no privileged container"),
    "capability": (lambda p, s: _sc(s["initContainers"][0], capabilities={"add": ["SYS_ADMIN"]}), "add no capability"),
    # an account the node's kubelet could then mint a token for: the release Job's, the agent's
    "release-account": (lambda p, s: s.update(serviceAccountName="compat-hook-release"), "service account default"),
    "agent-account": (lambda p, s: s.update(serviceAccountName="compat-hook"), "service account default"),
    # the image's code runs confined: not root, no capability kept, no escalation, the runtime's seccomp
    "root": (lambda p, s: _sc(s["containers"][0], runAsNonRoot=False, runAsUser=0), "as a non-root user"),
    "no-user": (lambda p, s: [c["securityContext"].pop("runAsUser") for c in s["containers"]], "as a non-root user"),
    "init-root": (lambda p, s: s["initContainers"][0]["securityContext"].pop("runAsNonRoot"), "as a non-root user"),
    "caps-kept": (lambda p, s: _sc(s["containers"][0], capabilities={"drop": ["NET_RAW"]}), "drop ALL"),
    "escalation": (lambda p, s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
                   "allowPrivilegeEscalation"),
    "unconfined": (lambda p, s: _sc(s["containers"][0], seccompProfile={"type": "Unconfined"}), "RuntimeDefault"),
    "no-seccomp": (lambda p, s: s["containers"][0]["securityContext"].pop("seccompProfile"), "RuntimeDefault"),
    # pinned to the probe: its program, its images, its env, nothing it does not need
    "pull-policy": (lambda p, s: s["containers"][0].update(imagePullPolicy="Always"), "imagePullPolicy: Never"),
    "other-image": (lambda p, s: s["containers"][0].update(image="registry.test/evil:1"), "probe-of annotation"),
    "command": (lambda p, s: s["containers"][0].update(command=["/bin/sh", "-c", "id"]), "run only the probe"),
    "args": (lambda p, s: s["containers"][0].update(args=["--x"]), "run only the probe"),
    "stage-image": (lambda p, s: s["initContainers"][0].update(image="registry.test/evil:1"), "run only the probe"),
    "stage-command": (lambda p, s: s["initContainers"][0].update(command=["/bin/sh", "-c", "id"]), "run only the probe"),
    "second-container": (lambda p, s: s["containers"].append(dict(s["containers"][0], name="two")), "one container"),
    "env-name": (lambda p, s: s["containers"][0]["env"].append({"name": "HTTP_PROXY", "value": "x"}), "literal values"),
    "env-value-from": (lambda p, s: s["containers"][0]["env"].append(
        {"name": "CUDA_X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}), "literal values"),
    "env-from": (lambda p, s: s["containers"][0].update(envFrom=[{"configMapRef": {"name": "c"}}]), "literal values"),
    "ports": (lambda p, s: s["containers"][0].update(ports=[{"containerPort": 80}]), "open no port"),
    "host-port": (lambda p, s: s["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]), "open no port"),
    "priority": (lambda p, s: s.update(priorityClassName="system-node-critical"), "no priorityClassName"),
    "memory": (lambda p, s: s["containers"][0]["resources"]["limits"].update(memory="64Gi"), "at most 128Mi"),
    "gpus": (lambda p, s: s["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "8"}), "at most one GPU"),
    "cpu": (lambda p, s: s["containers"][0]["resources"]["requests"].update(cpu="16"), "10m CPU"),
    "proc-mount": (lambda p, s: (s.update(hostUsers=False), _sc(s["containers"][0], procMount="Unmasked")), "procMount"),
    "apparmor": (lambda p, s: _sc(s["containers"][0], appArmorProfile={"type": "Unconfined"}), "AppArmor"),
    "sysctls": (lambda p, s: s.update(securityContext={"sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]}),
                "no sysctls"),
}



def _delete_refused(w, v, pod: dict, why: str) -> None:
    """The validator's delete of ``pod`` (made by the admin) is refused by its policy, saying ``why``,
    and the pod is still there."""
    made = w.admin.create(PROBES, pod)
    try:
        with pytest.raises(ApiError) as e:
            v.delete(f"{PROBES}/{made['metadata']['name']}", gracePeriodSeconds="0")
        assert e.value.status == 403 and VALIDATOR_PODS_POLICY in str(e.value), e.value
        assert why in str(e.value)
        assert w.admin.get(f"{PROBES}/{made['metadata']['name']}")["metadata"]["uid"] == made["metadata"]["uid"]
    finally:
        w.admin.delete(f"{PROBES}/{made['metadata']['name']}", gracePeriodSeconds="0")

def test_validator_creates_and_deletes_probe_pods_on_its_own_node(world):
    w = world
    v = w.api["validator"]
    pod = v.create(PROBES, _probe())
    assert pod["spec"]["nodeName"] == "gpu-a" and pod["spec"]["runtimeClassName"] == "cuda-compat"
    assert pod["spec"]["serviceAccountName"] == "default"
    # the API server's ServiceAccount admission fills in "default" before the policy looks: a probe
    # that names no account is admitted too, and runs as the account with no grant
    bare = _changed(_probe(), lambda p, s: s.pop("serviceAccountName"))
    bare["metadata"]["name"] += "-bare"
    assert v.create(PROBES, bare)["spec"]["serviceAccountName"] == "default"
    v.delete(f"{PROBES}/{bare['metadata']['name']}", gracePeriodSeconds="0")
    assert v.get(f"{PROBES}/{pod['metadata']['name']}")["metadata"]["uid"] == pod["metadata"]["uid"]
    v.delete(f"{PROBES}/{pod['metadata']['name']}", gracePeriodSeconds="0")
    # a pod bound to another node, even one shaped like its own probes: not its to delete
    _delete_refused(w, v, _probe("gpu-b"), "not one on gpu-b")
    # on its own node, a pod that is not a probe (the DaemonSet's, with the installer): not its to delete
    _delete_refused(w, v, _pod(w.docs, "gpu-a", "compat-hook-installer-gpu-a"), "deletes only probe pods")
    # a token bound to no pod names no node: no probe at all
    with pytest.raises(ApiError) as e:
        w.api["validator-unbound"].create(PROBES, _probe())
    assert e.value.status == 403 and VALIDATOR_PODS_POLICY in str(e.value) and "pod-bound token" in str(e.value)
    # outside the release namespace RBAC gives it nothing
    with pytest.raises(ApiError) as e:
        v.create("/api/v1/namespaces/apps/pods", dict(_probe(), metadata=dict(_probe()["metadata"], namespace="apps")))
    assert e.value.status == 403 and "ValidatingAdmissionPolicy" not in str(e.value), e.value


def test_a_probe_that_asks_the_device_plugin_for_a_gpu_is_admitted(world):
    """``--gpu-resource``: one GPU by the device plugin (the API server defaults the request to the limit)."""
    made = world.api["validator"].request("POST", PROBES, _probe(gpu_resource="nvidia.com/gpu"), query={"dryRun": "All"})
    assert made["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"


def _term(s: dict) -> dict:
    """The one required node affinity term of a probe pod pinned for the scheduler."""
    return s["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]


#: A probe pod that claims its GPU (validator.deviceClass): pinned to its own node by exactly one term naming
#: it alone, claiming only from the chart's template (``metadata.name In`` two nodes: the API server itself refuses).
BAD_CLAIM_PROBES = {
    "pinned-to-another-node": (lambda p, s: _term(s)["matchFields"][0].update(values=["gpu-b"]), "not one on gpu-b"),
    "pinned-and-bound-elsewhere": (lambda p, s: s.update(nodeName="gpu-b"), "not one on gpu-b"),
    "two-terms": (lambda p, s: s["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"].append({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}]}),
        "not an unbound one"),
    "extra-expression": (lambda p, s: _term(s).update(matchExpressions=[
        {"key": "nvidia.com/gpu.present", "operator": "Exists"}]), "not an unbound one"),
    "extra-field": (lambda p, s: _term(s)["matchFields"].append(
        {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-b"]}), "not an unbound one"),
    "not-in": (lambda p, s: _term(s)["matchFields"][0].update(operator="NotIn", values=["gpu-b"]), "not an unbound one"),
    "claim-by-name": (lambda p, s: s["resourceClaims"][0].pop("resourceClaimTemplateName") and
                      s["resourceClaims"][0].update(resourceClaimName="train-gpu"), "only from the ResourceClaimTemplate"),
    "other-template": (lambda p, s: s["resourceClaims"][0].update(resourceClaimTemplateName="gpu"),
                       "only from the ResourceClaimTemplate"),
    "two-claims": (lambda p, s: s["resourceClaims"].append({"name": "two", "resourceClaimTemplateName": CLAIM_TEMPLATE}),
                   "only from the ResourceClaimTemplate"),
}


def test_a_probe_that_claims_a_gpu_pinned_to_its_own_node_is_admitted_and_deleted(world):
    """``validator.deviceClass``: the probe pod has no nodeName (the scheduler places it, allocating its claim),
    only a required node affinity on its node's name; the validator creates it and, still unscheduled (no
    scheduler runs here), deletes it. One pinned to another node is not its to delete."""
    w, v = world, world.api["validator"]
    made = v.create(PROBES, _probe(claim_template=CLAIM_TEMPLATE))
    try:
        assert "nodeName" not in made["spec"] and _term(made["spec"])["matchFields"][0]["values"] == ["gpu-a"]
        assert made["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": CLAIM_TEMPLATE}]
        assert made["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
        v.delete(f"{PROBES}/{made['metadata']['name']}", gracePeriodSeconds="0")
    finally:
        try:
            w.admin.delete(f"{PROBES}/{made['metadata']['name']}", gracePeriodSeconds="0")
        except ApiError as e:
            assert e.status == 404, e
    _delete_refused(w, v, _probe("gpu-b", claim_template=CLAIM_TEMPLATE), "not one on gpu-b")


@pytest.mark.parametrize("case", sorted(BAD_CLAIM_PROBES))
def test_a_probe_that_claims_a_gpu_is_pinned_to_its_own_node_and_the_chart_s_template(world, case):
    change, says = BAD_CLAIM_PROBES[case]
    with pytest.raises(ApiError) as e:
        world.api["validator"].create(PROBES, _changed(_probe(claim_template=CLAIM_TEMPLATE), change))
    assert e.value.status == 403 and VALIDATOR_PODS_POLICY in str(e.value) and says in str(e.value), e.value
    assert not [p for p in world.admin.get(PROBES, labelSelector="app.kubernetes.io/component=validation-probe")["items"]]


@pytest.mark.parametrize("case", sorted(BAD_PROBES))
def test_validator_creates_nothing_but_a_confined_probe(world, case):
    change, says = BAD_PROBES[case]
    with pytest.raises(ApiError) as e:
        world.api["validator"].create(PROBES, _changed(_probe(), change))
    assert e.value.status == 403 and VALIDATOR_PODS_POLICY in str(e.value) and says in str(e.value), e.value
    assert not [p for p in world.admin.get(PROBES, labelSelector="app.kubernetes.io/component=validation-probe")["items"]]


def test_a_workload_compat_hook_does_not_reach_is_probed_on_its_own_runtime_class(world):
    """The validator's probe of a workload that nothing of compat-hook's reaches (path ``none``: the NVIDIA
    toolkit alone) runs as that workload runs: on its own RuntimeClass (one of validator.probeRuntimeClasses)
    or on the default runtime; a class the chart does not list is refused, naming it."""
    from compat_hook.cluster.node.validate import ValidatorOptions, probe_pod

    classes = "/apis/node.k8s.io/v1/runtimeclasses"
    opts = ValidatorOptions("gpu-a", publish_namespace=NS, probe_image="localhost/compat-hook:0.1.0")
    w = {"image": "registry.test/apps/infer:1", "env": ["CUDA_VISIBLE_DEVICES=0"], "pods": ["apps/infer"]}
    v = world.api["validator"]
    made = []
    for name in ("nvidia", "kata-unlisted"):
        world.admin.create(classes, {"metadata": {"name": name}, "handler": name})
    try:
        for rc in ("nvidia", None):
            pod = v.create(PROBES, probe_pod(opts, dict(w, runtime_class=rc), "none"))
            made.append(pod["metadata"]["name"])
            assert pod["spec"].get("runtimeClassName") == rc, pod["spec"]
        # reached by compat-hook (NRI or its RuntimeClass): compat-hook's class, whatever the workload named
        pod = v.create(PROBES, probe_pod(opts, dict(w, runtime_class="nvidia", env=["CUDA_VISIBLE_DEVICES=1"]), "nri"))
        made.append(pod["metadata"]["name"])
        assert pod["spec"]["runtimeClassName"] == "cuda-compat"
        with pytest.raises(ApiError) as e:
            v.create(PROBES, probe_pod(opts, dict(w, runtime_class="kata-unlisted"), "none"))
        assert e.value.status == 403 and VALIDATOR_PODS_POLICY in str(e.value), e.value
        assert "validator.probeRuntimeClasses" in str(e.value) and "not kata-unlisted" in str(e.value), e.value
    finally:
        for name in made:
            v.delete(f"{PROBES}/{name}", gracePeriodSeconds="0")
        for name in ("nvidia", "kata-unlisted"):
            world.admin.delete(f"{classes}/{name}")


def test_validator_records_events_only_about_its_node(world):
    v, events = world.api["validator"], "/api/v1/namespaces/default/events"
    ev = {"metadata": {"generateName": "gpu-a.compat-hook-validation."}, "reason": "CompatHookValidation",
          "message": "m", "type": "Warning", "involvedObject": {"kind": "Node", "name": "gpu-a", "apiVersion": "v1"}}
    v.create(events, ev)
    with pytest.raises(ApiError) as e:
        v.create(events, dict(ev, involvedObject=dict(ev["involvedObject"], name="gpu-b")))
    assert e.value.status == 403 and EVENTS_POLICY in str(e.value), e.value


# ----------------------------------------------------------------------------- the release Job's account


def test_release_account_removes_holds_and_adds_none(world):
    w = world
    for name in ("gpu-a", "gpu-b"):
        w.admin.merge(f"/api/v1/nodes/{name}", {"metadata": {
            "labels": {SKIP: "true", f"{PREFIX}/preflight": "fail"},
            "annotations": {f"{PREFIX}/holds-upgrade": "2026-12-03T10:00:00Z"}}})
    w.admin.merge("/api/v1/nodes/gpu-b", {"metadata": {"labels": {SKIP: None}}})
    w.refused("release", "gpu-b", {"metadata": {"labels": {SKIP: "true"}}}, policy=RELEASE_POLICY)   # add a hold
    w.refused("release", "gpu-a", {"metadata": {"labels": {SKIP: "false"}}}, policy=RELEASE_POLICY)  # change one
    w.refused("release", "gpu-a", {"metadata": {"labels": {DEPLOY: None}}}, policy=RELEASE_POLICY)
    w.refused("release", "gpu-a", {"metadata": {"annotations": {"team.example.com/owner": None}}},
              policy=RELEASE_POLICY)
    w.refused("release", "gpu-a", {"spec": {"unschedulable": True}}, policy=RELEASE_POLICY)
    w.refused("release", "gpu-a", {"metadata": {"annotations": {f"{PREFIX}/holds-upgrade": "later"}}},
              policy=RELEASE_POLICY)
    # the skip label alone is not compat-hook's hold: never without the annotation that says it is,
    # neither on a node where someone else set it nor, on a held node, leaving the annotation behind
    w.admin.merge("/api/v1/nodes/gpu-b", {"metadata": {"labels": {SKIP: "true"},
                                                      "annotations": {f"{PREFIX}/holds-upgrade": None}}})
    try:
        assert "holds-upgrade" in w.refused("release", "gpu-b", {"metadata": {"labels": {SKIP: None}}},
                                            policy=RELEASE_POLICY)
    finally:
        w.admin.merge("/api/v1/nodes/gpu-b", {"metadata": {"labels": {SKIP: None}}})
    assert "holds-upgrade" in w.refused("release", "gpu-a", {"metadata": {"labels": {SKIP: None}}},
                                        policy=RELEASE_POLICY)
    # what `cluster release` does: the skip label and its annotation, together
    w.patch("release", "gpu-a", {"metadata": {"labels": {SKIP: None},
                                              "annotations": {f"{PREFIX}/holds-upgrade": None}}})
    w.patch("release", "gpu-a", {"metadata": {"labels": {f"{PREFIX}/preflight": None}}}, SMP)
    meta = w.node("gpu-a")["metadata"]
    assert SKIP not in meta["labels"] and f"{PREFIX}/holds-upgrade" not in meta["annotations"]
    assert f"{PREFIX}/preflight" not in meta["labels"] and meta["labels"][DEPLOY] == "true"


def test_release_account_removes_only_the_validators_taint(world):
    """The release Job's account, of a Node's spec, may only remove ``<prefix>/validation-failed``; and
    ``cluster release --all`` with that account takes it off, everyone else's taints kept in order."""
    w = world
    mine = {"key": f"{PREFIX}/validation-failed", "value": "470.256.02", "effect": "NoSchedule"}
    theirs = {"key": "team.example.com/gpu", "value": "a100", "effect": "NoSchedule"}
    other = {"key": "x.example.com/t", "effect": "NoExecute"}
    w.admin.merge("/api/v1/nodes/gpu-a", {"spec": {"taints": [theirs, mine, other]}})
    w.admin.merge("/api/v1/nodes/gpu-b", {"spec": {"taints": [theirs]}})
    try:
        for taints, says in (
                ([theirs, mine, other, {"key": f"{PREFIX}/validation-failed", "effect": "NoExecute"}], "adds"),
                ([theirs, dict(mine, value="575.57.08"), other], "adds and changes none"),   # ours changed
                ([mine, other], "every other taint"),                                       # theirs removed
                ([other, mine, theirs], "every other taint")):                              # reordered
            assert says in w.refused("release", "gpu-a", {"spec": {"taints": taints}}, policy=RELEASE_POLICY)
        assert "never changes a Node's spec" in w.refused("release", "gpu-a", {"spec": {"unschedulable": True}},
                                                          policy=RELEASE_POLICY)
        assert "adds" in w.refused("release", "gpu-b", {"spec": {"taints": [theirs, mine]}}, policy=RELEASE_POLICY)
        kc = w.cp.kubeconfig(_token(w.admin, "compat-hook-release"), "release-taint")
        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "release", "--all",
                            "--kubeconfig", str(kc)], cwd=chart.REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
        assert f"removed the taint {PREFIX}/validation-failed from gpu-a" in p.stdout, p.stdout
        assert w.node("gpu-a")["spec"]["taints"] == [theirs, other]
        assert w.node("gpu-b")["spec"]["taints"] == [theirs]
    finally:
        for node in ("gpu-a", "gpu-b"):
            w.admin.merge(f"/api/v1/nodes/{node}", {"spec": {"taints": None}})


RELEASE_OBJECTS_POLICY = "ValidatingAdmissionPolicy 'compat-hook-release-objects'"


def test_release_purge_removes_everything_compat_hook_wrote_and_nothing_else(world, tmp_path):
    """``helm uninstall``'s Job (``cluster release --all --purge``) with the chart's own RBAC and policies: every
    ``<prefix>/`` key on every Node, compat-hook's hold, the agents' Leases and ConfigMaps go; someone else's
    skip label, keys and ConfigMaps, and the chart's own ConfigMap, stay."""
    import subprocess

    w = world
    cms, leases = f"/api/v1/namespaces/{NS}/configmaps", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    ours = {"labels": {f"{PREFIX}/preflight": "fail", f"{PREFIX}/preflight.broken": "1",
                       f"{PREFIX}/preflight.target-driver": "570.195.03", VALIDATED: "570.195.03"},
            "annotations": {f"{PREFIX}/preflight": "{}", f"{PREFIX}/allow-upgrade": "true"}}
    w.admin.merge("/api/v1/nodes/gpu-a", {"metadata": {"labels": dict(ours["labels"], **{SKIP: "true"}),
                                                      "annotations": dict(ours["annotations"], **{
                                                          f"{PREFIX}/holds-upgrade": "2026-12-03T10:00:00Z"})}})
    w.admin.merge("/api/v1/nodes/gpu-b", {"metadata": {"labels": dict(ours["labels"], **{SKIP: "true"}),
                                                      "annotations": ours["annotations"]}})  # a skip of someone else's
    theirs_taint = {"key": "team.example.com/gpu", "value": "a100", "effect": "NoSchedule"}
    w.admin.merge("/api/v1/nodes/gpu-a", {"spec": {"taints": [
        {"key": f"{PREFIX}/validation-failed", "value": "570.195.03", "effect": "NoSchedule"}, theirs_taint]}})
    for node in ("gpu-a", "gpu-b"):
        for path in (cms, leases):  # (an earlier test's agent may have written its own)
            try:
                w.admin.delete(f"{path}/{node}")
            except ApiError as e:
                assert e.status == 404, e
        w.admin.create(cms, {"metadata": {"name": node, "labels": AGENT_LABELS}, "data": {"preflight.json": "{}"}})
        w.admin.create(leases, {"metadata": {"name": node, "labels": AGENT_LABELS}, "spec": {"holderIdentity": node}})
    w.admin.create(cms, {"metadata": {"name": "team-notes", "labels": {"app.kubernetes.io/name": "compat-hook"}}})
    try:
        # the account deletes only the agents' objects: not the chart's ConfigMap, not another one
        release = w.api["release"]
        _wait_refused(w, RELEASE_OBJECTS_POLICY, lambda: release.request(
            "DELETE", f"{cms}/compat-hook-agent", query={"dryRun": "All"}))
        with pytest.raises(ApiError) as e:
            release.request("DELETE", f"{cms}/team-notes", query={"dryRun": "All"})
        assert e.value.status == 403 and RELEASE_OBJECTS_POLICY in str(e.value), e.value
        kc = w.cp.kubeconfig(_token(w.admin, "compat-hook-release"), "release-purge")
        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "release", "--all", "--purge",
                            "--publish-namespace", NS, "--kubeconfig", str(kc)], cwd=chart.REPO,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
        assert "removed what compat-hook wrote from 2 node(s) and 4 Lease(s)/ConfigMap(s)" in p.stdout, p.stdout
        for node in ("gpu-a", "gpu-b"):
            meta = w.node(node)["metadata"]
            left = [k for k in list(meta.get("labels") or {}) + list(meta.get("annotations") or {})
                    if k.startswith(f"{PREFIX}/")]
            assert left == [], (node, meta)
            assert meta["labels"][DEPLOY] == "true" and meta["annotations"]["team.example.com/owner"] == "gpu-team"
        assert SKIP not in w.node("gpu-a")["metadata"]["labels"]          # compat-hook's hold
        assert w.node("gpu-b")["metadata"]["labels"][SKIP] == "true"       # someone else's
        assert w.node("gpu-a")["spec"]["taints"] == [theirs_taint]        # the validator's taint went
        sel = "app.kubernetes.io/component=preflight"
        assert w.admin.get(cms, labelSelector=sel)["items"] == [] and w.admin.get(leases, labelSelector=sel)["items"] == []
        assert w.admin.get(f"{cms}/team-notes") and w.admin.get(f"{cms}/compat-hook-agent")
    finally:
        w.admin.merge("/api/v1/nodes/gpu-b", {"metadata": {"labels": {SKIP: None}}})
        w.admin.merge("/api/v1/nodes/gpu-a", {"spec": {"taints": None}})
        w.admin.delete(f"{cms}/team-notes")


# ----------------------------------------------------------------------------- RBAC, as the API server sees it


def _can(w: World, user: str, verb: str, resource: str, *, group: str = "", namespace: str | None = None,
         sub: str | None = None) -> bool:
    attrs = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attrs["namespace"] = namespace
    if sub:
        attrs["subresource"] = sub
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": f"system:serviceaccount:{NS}:{user}",
                       "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"],
                       "resourceAttributes": attrs}}
    return w.admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"].get("allowed", False)


def _refusal(call) -> str | None:
    """The body of a 403 ``call`` got, None when it was admitted (a policy not loaded yet)."""
    try:
        call()
    except ApiError as e:
        if e.status == 403:
            return e.body
        raise
    return None


def test_no_account_but_the_agent_writes_a_nodes_verdict(world):
    """An account that may patch Nodes (an operator's, an autoscaler's) cannot mint a verdict: the annotation
    <prefix>/preflight is the agent's (policy compat-hook-node-verdicts); it may remove one, and set the
    label, which then disagrees with the annotation and is no verdict at all."""
    from compat_hook.cluster.overview import status as statusmod

    a = world.cp.admin
    a.create(f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "node-patcher"}})
    a.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": "test-node-patcher"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch", "update"]}]})
    a.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "test-node-patcher"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test-node-patcher"},
        "subjects": [{"kind": "ServiceAccount", "name": "node-patcher", "namespace": NS}]})
    other = Api(world.cp.url, _token(a, "node-patcher"))
    doc = json.dumps({"v": 2, "verdict": "pass", "complete": True, "target": "470.256.02"})
    forged = {"metadata": {"labels": {f"{PREFIX}/preflight": "pass"}, "annotations": {f"{PREFIX}/preflight": doc}}}
    err = world.cp.admin.wait("the verdict policy in force", lambda: _refusal(lambda: other.request(
        "PATCH", "/api/v1/nodes/gpu-b", forged, content_type=MERGE, query={"dryRun": "All"})), timeout=60)
    assert "compat-hook-node-verdicts" in err and f"writes its annotation {PREFIX}/preflight" in err, err
    # the agent writes its own; the other account may take it off, and set the label alone
    world.api["gpu-b"].request("PATCH", "/api/v1/nodes/gpu-b", {"metadata": {
        "labels": {f"{PREFIX}/preflight": "fail"},
        "annotations": {f"{PREFIX}/preflight": json.dumps({"v": 2, "verdict": "fail", "target": "470.256.02"})}}},
        content_type=MERGE)
    other.request("PATCH", "/api/v1/nodes/gpu-b", {"metadata": {"labels": {f"{PREFIX}/preflight": "pass"}}},
                  content_type=MERGE)
    row = statusmod.node_row(a.get("/api/v1/nodes/gpu-b"), PREFIX, now=0.0)
    assert (row["verdict"], row["reason"]) == ("unknown", "preflight_disagrees"), row
    other.request("PATCH", "/api/v1/nodes/gpu-b", {"metadata": {"labels": {f"{PREFIX}/preflight": None},
                                                                "annotations": {f"{PREFIX}/preflight": None}}},
                  content_type=MERGE)
    assert f"{PREFIX}/preflight" not in (a.get("/api/v1/nodes/gpu-b")["metadata"].get("annotations") or {})


def test_rbac_grants_the_agent_only_what_it_uses(world):
    w = world
    allowed = [("get", "nodes", "", None), ("list", "nodes", "", None), ("watch", "nodes", "", None),
               ("patch", "nodes", "", None), ("list", "pods", "", None), ("watch", "pods", "", None),
               ("list", "clusterpolicies", "nvidia.com", None), ("watch", "nvidiadrivers", "nvidia.com", None),
               ("create", "leases", "coordination.k8s.io", NS), ("update", "leases", "coordination.k8s.io", NS),
               ("get", "configmaps", "", NS), ("update", "configmaps", "", NS), ("create", "events", "", "default"),
               # which pod its token is bound to (Kubernetes' system:basic-user, not the chart, grants it)
               ("create", "selfsubjectreviews", "authentication.k8s.io", None)]
    denied = [("update", "nodes", "", None), ("delete", "nodes", "", None), ("create", "nodes", "", None),
              ("get", "pods", "", None), ("get", "clusterpolicies", "nvidia.com", None),
              ("get", "nvidiadrivers", "nvidia.com", None), ("create", "events", "", NS),
              ("create", "events", "", "kube-system"), ("create", "events", "events.k8s.io", "default"),
              ("update", "events", "", "default"), ("delete", "events", "", "default"), ("create", "leases", "coordination.k8s.io", "default"),
              ("list", "configmaps", "", NS), ("delete", "leases", "coordination.k8s.io", NS),
              ("patch", "configmaps", "", NS), ("patch", "leases", "coordination.k8s.io", NS),
              ("get", "secrets", "", NS), ("list", "secrets", "", None), ("create", "pods", "", NS)]
    assert [a for a in allowed if not _can(w, "compat-hook", a[0], a[1], group=a[2], namespace=a[3])] == []
    assert [d for d in denied if _can(w, "compat-hook", d[0], d[1], group=d[2], namespace=d[3])] == []
    assert not _can(w, "compat-hook", "patch", "nodes", sub="status")
    assert _can(w, "compat-hook-release", "list", "nodes") and _can(w, "compat-hook-release", "patch", "nodes")
    assert not any(_can(w, "compat-hook-release", v, r) for v, r in
                   (("get", "nodes"), ("update", "nodes"), ("list", "pods"), ("create", "events")))
    # --purge: the agents' Leases and ConfigMaps in the release namespace, listed and deleted, nothing more
    assert all(_can(w, "compat-hook-release", v, r, group=g, namespace=NS) for v, r, g in
               (("list", "configmaps", ""), ("delete", "configmaps", ""), ("list", "leases", "coordination.k8s.io"),
                ("delete", "leases", "coordination.k8s.io")))
    assert not any(_can(w, "compat-hook-release", v, r, group=g, namespace=ns) for v, r, g, ns in
                   (("create", "configmaps", "", NS), ("update", "leases", "coordination.k8s.io", NS),
                    ("get", "secrets", "", NS), ("delete", "configmaps", "", "default"),
                    ("delete", "leases", "coordination.k8s.io", "kube-system")))
    # the validator: its Node, probe pods in its namespace, Events in default; nothing cluster-wide beyond
    v_allowed = [("get", "nodes", None), ("patch", "nodes", None), ("create", "pods", NS), ("get", "pods", NS),
                 ("delete", "pods", NS), ("create", "events", "default")]
    v_denied = [("list", "nodes", None), ("update", "nodes", None), ("list", "pods", None), ("list", "pods", NS),
                ("update", "pods", NS), ("patch", "pods", NS), ("create", "pods", "apps"), ("delete", "pods", "apps"),
                ("create", "events", NS), ("get", "secrets", NS), ("create", "serviceaccounts/token", NS)]
    assert [a for a in v_allowed if not _can(w, "compat-hook-validator", a[0], a[1], namespace=a[2])] == []
    assert [d for d in v_denied if _can(w, "compat-hook-validator", d[0], d[1].split("/")[0], namespace=d[2],
                                        sub=(d[1].split("/") + [None])[1])] == []


# ----------------------------------------------------------------------------- helm template, helm install


@pytest.mark.parametrize("values", [
    [],
    ["agent.gate=true", "agent.labelPrefix=preflight.example.com", "agent.interval=60", "agent.target=570.195.03",
     "agent.nfdFeaturesFile=/etc/kubernetes/node-feature-discovery/features.d/compat-hook",
     "agent.textfile=/var/lib/node_exporter/textfile_collector/compat-hook.prom",
     "release.formerLabelPrefixes={compat-hook.io,old.example.com}", "fleet.enabled=true",
     "validator.deviceClass=gpu.nvidia.com"],
    ["agent.enabled=false", "runtimeClass.create=false", "release.enabled=false", "admissionPolicy.enabled=false"],
    # (restartContainerd: a privileged installer with hostPID, which this API server allows)
    ["containerd.distribution=k3s", "gpuOperator.toolkitEnv=true", "registration.restartContainerd=true",
     "agent.recursiveReadOnly=", "containerd.snapshotters={overlayfs,native}"],
    ["containerd.distribution=microk8s", "agent.recursiveReadOnly=Enabled", "namespace.create=false"],
], ids=["defaults", "gate-prefix-target-outputs", "registration-only", "k3s-toolkit-env", "microk8s"])
def test_helm_template_applies_with_a_server_side_dry_run(world, tmp_path, values):
    docs = chart.render(*values)
    kinds = sorted({d["kind"] for d in docs})
    if "agent.enabled=false" in values:
        assert kinds == ["DaemonSet", "Namespace"]
    else:
        assert {"ClusterRole", "Role", "ConfigMap", "DaemonSet", "ServiceAccount"} <= set(kinds)
        [cm] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "compat-hook-agent"]
        conf = tmp_path / "agent.yaml"
        conf.write_text(cm["data"]["config.yaml"])
        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "config", "--check", str(conf)], cwd=chart.REPO,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        cluster = yaml.safe_load(cm["data"]["config.yaml"])["cluster"]
        assert cluster["gate_upgrade"] is ("agent.gate=true" in values)
        agent = chart.containers(docs)["agent"]
        assert ("--driver=570.195.03" in agent["command"]) is ("agent.target=570.195.03" in values)
    assert ("Deployment" in kinds) is ("fleet.enabled=true" in values)  # the fleet controller (tests/test_fleet.py)
    assert ("ResourceClaimTemplate" in kinds) is ("validator.deviceClass=gpu.nvidia.com" in values)  # the probes' claims
    assert ("ValidatingAdmissionPolicy" in kinds) is ("admissionPolicy.enabled=false" not in values)
    chart.apply(world.admin, docs, dry_run=True)


def _helm_env(w: World) -> dict:
    return {"KUBECONFIG": str(w.cp.kubeconfig(ADMIN_TOKEN, "admin"))}


def test_helm_install_create_namespace_admits_the_daemonset(world):
    """``helm install --create-namespace`` (Helm 4) gives a namespace labelled for the DaemonSet's pod, which a
    namespace at the ``baseline`` level refuses; without the chart's Namespace, NOTES says what to run."""
    w = world
    off = ["--set", "agent.enabled=false", "--set", "release.enabled=false", "--set", "admissionPolicy.enabled=false",
           "--set", "runtimeClass.create=false"]
    chart.helm("install", "compat-hook", chart.CHART, "--namespace", "ch-created", "--create-namespace", *off,
               env=_helm_env(w))
    labels = w.admin.get("/api/v1/namespaces/ch-created")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged", labels
    pod = _pod(w.docs, "gpu-a", "probe")
    w.admin.create("/api/v1/namespaces/ch-created/serviceaccounts", {"metadata": {"name": "compat-hook"}})
    w.admin.request("POST", "/api/v1/namespaces/ch-created/pods", pod, query={"dryRun": "All"})
    w.admin.create("/api/v1/namespaces", {"metadata": {"name": "ch-baseline", "labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}})
    w.admin.create("/api/v1/namespaces/ch-baseline/serviceaccounts", {"metadata": {"name": "compat-hook"}})
    with pytest.raises(ApiError) as e:
        w.admin.request("POST", "/api/v1/namespaces/ch-baseline/pods", pod, query={"dryRun": "All"})
    assert e.value.status == 403 and "violates PodSecurity" in str(e.value) and "hostPath" in str(e.value)
    # the chart's Namespace off, the namespace unlabelled: the install says how to label it
    p = chart.helm("install", "compat-hook", chart.CHART, "--namespace", "ch-bare", "--create-namespace",
                   "--set", "namespace.create=false", *off, "--dry-run=server", env=_helm_env(w))
    assert "kubectl label --overwrite namespace ch-bare pod-security.kubernetes.io/enforce=privileged" in p.stdout


def test_auto_distribution_is_read_from_the_nodes(world):
    """containerd.distribution=auto: `helm install` looks at the nodes (a k3s kubelet's version says +k3s); the
    socket, config and layer dirs are then k3s's, and the socket is where the image reader looks for k3s."""
    from compat_hook.images.stores import CONTAINERD_SOCKETS

    w = world
    def agent_argv():
        # (the objects exist already, applied by the fixture: nothing is changed by a template)
        p = chart.helm("template", "compat-hook", chart.CHART, "--namespace", NS, "--dry-run=server",
                       "--take-ownership", env=_helm_env(w))
        docs = [d for d in yaml.safe_load_all(p.stdout) if d]
        return chart.containers(docs)

    assert "--address=/host/run/containerd/containerd.sock" in agent_argv()["agent"]["command"]
    w.admin.create("/api/v1/nodes", {"metadata": {"name": "k3s-node"}})
    try:
        w.admin.request("PATCH", "/api/v1/nodes/k3s-node/status", {"status": {"nodeInfo": {
            "kubeletVersion": "v1.31.4+k3s1", "containerRuntimeVersion": "containerd://1.7.23-k3s2"}}},
            content_type=MERGE)
        c = agent_argv()
    finally:
        w.admin.delete("/api/v1/nodes/k3s-node")
    k3s = dict((who, path) for path, who in CONTAINERD_SOCKETS)["k3s/RKE2"]
    assert f"--address=/host{k3s}" in c["agent"]["command"]
    env = {e["name"]: e["value"] for e in c["installer"]["env"]}
    assert env["CONTAINERD_CONFIG"] == "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    mounts = {m["mountPath"] for m in c["agent"]["volumeMounts"]}
    assert "/host/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs" in mounts


def test_a_changed_prefix_moves_the_policy(world):
    """The prefix is rendered into the policy: after an upgrade to another prefix the agent may write that
    prefix's keys and no longer the old one's (last here: it re-applies the defaults after)."""
    w = world
    new = "preflight.example.com"
    docs = [d for d in chart.render(f"agent.labelPrefix={new}") if d["kind"] == "ValidatingAdmissionPolicy"]
    chart.apply(w.admin, docs)
    try:
        _wait_policy(w, "gpu-a", "gpu-a", {"metadata": {"labels": {f"{PREFIX}/preflight": "warn"}}}, AGENT_POLICY)
        w.patch("gpu-a", "gpu-a", {"metadata": {"labels": {f"{new}/preflight": "pass"}}})
        assert w.node("gpu-a")["metadata"]["labels"][f"{new}/preflight"] == "pass"
        assert f"under {new}/" in w.refused("gpu-a", "gpu-a", {"metadata": {"labels": {f"{PREFIX}/preflight": "warn"}}})
    finally:
        chart.apply(w.admin, [d for d in w.docs if d["kind"] == "ValidatingAdmissionPolicy"])


@pytest.mark.parametrize("values", [
    ["agent.labelPrefix=nvidia.com"], ["agent.labelPrefix=gpu.nvidia.com"], ["agent.labelPrefix=kubernetes.io"],
    ["agent.labelPrefix=node.kubernetes.io"], ["agent.labelPrefix=k8s.io"],
    ["release.formerLabelPrefixes={compat-hook.io,x.k8s.io}"],
], ids=["nvidia", "nvidia-sub", "kubernetes", "kubernetes-sub", "k8s", "former-k8s-sub"])
def test_a_reserved_label_prefix_is_refused(values):
    """The prefix is what the agent may write on its Node (and the release Job remove): one of the GPU
    Operator's or Kubernetes' own would hand every node's agent their keys. The templates refuse it by name
    (never a schema's bare "'not' failed"), also for values that skip the schema."""
    sets = [a for v in values for a in ("--set", v)]
    key = values[0].split("=")[0] + ("[1]" if "former" in values[0] else "")
    for extra in ([], ["--skip-schema-validation"]):
        p = chart.helm("template", "compat-hook", chart.CHART, "--namespace", NS, *sets, *extra, check=False)
        assert p.returncode != 0 and f"{key}=" in p.stderr and "is reserved" in p.stderr, (extra, p.stderr)
        assert "'not' failed" not in p.stderr, p.stderr
    # a prefix that only ends like one, or holds one as a label, is someone's own domain
    for prefix in ("mynvidia.com", "nvidia.com.example.org"):
        chart.render(f"agent.labelPrefix={prefix}")


def test_the_nri_toleration_annotation_is_only_for_the_charts_own_pods(world):
    """``registration.nriRequire=all``: containerd's NRI validator refuses every pod without the annotation
    ``tolerate-missing-plugins.compat-hook.io/pod`` while compat-hook's plugin is missing. The chart's own
    pods carry it (the pod that repairs the plugin starts); on any other pod it would opt that pod out, so
    the policy compat-hook-nri-toleration refuses it there, on a create and on an update."""
    a, policy = world.admin, "compat-hook-nri-toleration"
    docs = [d for d in chart.render("registration.nriRequire=all") if d["metadata"]["name"] == policy]
    assert sorted(d["kind"] for d in docs) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert not [d for d in world.docs if d["metadata"]["name"] == policy]  # only with nriRequire=all
    tenant_ns = "nri-tenant"
    a.create("/api/v1/namespaces", {"metadata": {"name": tenant_ns}})
    a.create(f"/api/v1/namespaces/{tenant_ns}/serviceaccounts", {"metadata": {"name": "tenant"}})
    for ns in (tenant_ns, NS):  # a pod's default ServiceAccount (no controller-manager makes one here)
        try:
            a.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})
        except ApiError as e:
            assert e.status == 409, e
    for ns in (tenant_ns, NS):  # a tenant that may create and patch pods in both namespaces
        a.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", {
            "metadata": {"name": "nri-tenant"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "patch", "get"]}]})
        a.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
            "metadata": {"name": "nri-tenant"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                             "name": "nri-tenant"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": tenant_ns}]})
    tok = a.create(f"/api/v1/namespaces/{tenant_ns}/serviceaccounts/tenant/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    tenant = Api(world.cp.url, tok["status"]["token"])
    tol = {"tolerate-missing-plugins.compat-hook.io/pod": "true"}

    def pod(ns, name, annotations=None, labels=None, dry=True):
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {},
                                                                 "labels": labels or {}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}}
        return tenant.request("POST", f"/api/v1/namespaces/{ns}/pods", body, query={"dryRun": "All"} if dry else None)

    chart.apply(a, docs)
    try:
        _wait_refused(world, policy, lambda: pod(tenant_ns, "app", tol))
        with pytest.raises(ApiError) as e:
            pod(tenant_ns, "app", tol)
        assert e.value.status == 403 and f"on {tenant_ns}/app it would let the pod start without" in str(e.value)
        pod(tenant_ns, "app")  # without it: admitted
        pod(NS, "compat-hook-x", tol, {"app.kubernetes.io/name": "compat-hook"})  # the chart's own pod
        with pytest.raises(ApiError) as e:  # the release namespace, but not the chart's pod
            pod(NS, "other", tol, {"app.kubernetes.io/name": "other"})
        assert e.value.status == 403 and policy in str(e.value)
        pod(tenant_ns, "later", dry=False)  # an update that adds it
        with pytest.raises(ApiError) as e:
            tenant.merge(f"/api/v1/namespaces/{tenant_ns}/pods/later", {"metadata": {"annotations": tol}})
        assert e.value.status == 403 and policy in str(e.value)
        got = a.get(f"/api/v1/namespaces/{tenant_ns}/pods/later")
        assert not (got["metadata"].get("annotations") or {}), got["metadata"]
    finally:
        for d in docs:
            a.delete(chart.object_path(d))
        a.delete(f"/api/v1/namespaces/{tenant_ns}")
        a.delete(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles/nri-tenant")
        a.delete(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/nri-tenant")
