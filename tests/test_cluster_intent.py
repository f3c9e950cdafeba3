"""The node agent's pass: one intent covering every output, and one writer.

A pass is observe → reconcile → intent → apply. :func:`compat_hook.cluster.node.intent.intend` is
pure: these tests feed it what a pass observed (a Node, a GPU pod, the assessment of its image),
the agent's last word and a clock, and read every output from the intent: the Node's patch, the
details, the Event, the Lease's renewal, the files. The same pass on a real API server is
tests/test_cluster.py and tests/test_hostile_cluster.py. Last, the source itself: in the node
agent only :mod:`compat_hook.cluster.node.applyintent` writes (to the API server or a file).
"""

from __future__ import annotations

import ast
import dataclasses
import copy
import pathlib

from compat_hook.cluster.node import applyintent, intent, reconcile
from compat_hook.cluster.node.gate import SKIP_LABEL
from compat_hook.cluster.workload import pods as podsmod, predict, target as targetmod

REPO = pathlib.Path(__file__).resolve().parent.parent
NODE_PKG = REPO / "compat_hook" / "cluster" / "node"
P = "p.io"
TARGET = "470.256.02"
WHERE = intent.Where(node="gpu-a", namespace="compat-hook", interval=300.0, state_dir="/var/lib/ch",
                     nfd_file="/etc/nfd/compat-hook", textfile="/var/lib/ne/compat-hook.prom", max_age=86400.0)
ST = reconcile.Settings(prefix=P, gate=True, quiet=0.0, interval=300.0, details="compat-hook/gpu-a")


#: The GPU Operator's ClusterPolicy with its upgrade controller on: a hold can work.
POLICY = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
          "spec": {"driver": {"version": "535.183.01", "upgradePolicy": {"autoUpgrade": True}}}}


def bare_node() -> dict:
    return {"metadata": {"name": "gpu-a", "uid": "u-1", "resourceVersion": "7", "labels": {}, "annotations": {}}}


def observed(node: dict, regresses: bool) -> dict:
    """What a pass observed on ``node``: one GPU pod on the compat runtime, its image assessed (working
    now, broken on the target when ``regresses``)."""
    pod = {"metadata": {"name": "app-1", "namespace": "apps", "uid": "p-1"},
           "spec": {"nodeName": "gpu-a", "runtimeClassName": "cuda-compat",
                    "containers": [{"name": "main", "image": "registry.example/app:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    snap = reconcile.Snapshot(node=node, pods=[pod], policies=[POLICY], drivers=[])
    ws = podsmod.build(snap.pods, ["cuda-compat"], WHERE.namespace)
    a = predict.Assessment()
    a.report, a.now = {"workloads": []}, "535.183.01"
    a.rows = [{"name": ws.items[0]["name"], "workload_image": "registry.example/app:1", "runtime": "cuda-compat",
               "now": {"outcome": "host"},
               "after": {"outcome": "broken", "reason": "driver_too_old"} if regresses else {"outcome": "host"}}]
    tgt = targetmod.node_target(node, snap.policies, [], prefix=P, override=TARGET)
    return dict(snap=snap, target=tgt, workloads=ws, assessment=a)


def intend(obs: dict, previous: intent.Previous, now: float) -> intent.Intent:
    return intent.intend(obs["snap"], target=obs["target"], workloads=obs["workloads"], assessment=obs["assessment"],
                         settings=ST, where=WHERE, previous=previous, decisions={("compat", "ok"): 3}, now=now)


def published(node: dict, it: intent.Intent) -> tuple:
    """The Node once ``it`` is applied, and what the agent then remembers (its word, the details)."""
    meta = copy.deepcopy(node["metadata"])
    for kind, keys in it.desired.keys.items():
        for k, v in keys.items():
            if v is None:
                meta[kind].pop(k, None)
            else:
                meta[kind][k] = v
    return dict(node, metadata=meta), intent.Previous(own=it.desired.doc, details=it.details)


# --------------------------------------------------------------------------- (a) a pure function


def test_the_intent_is_a_pure_function_of_what_the_pass_observed():
    obs = observed(bare_node(), regresses=True)
    before = copy.deepcopy({k: obs[k] for k in ("snap",)})
    prev = intent.Previous(own=None, details={})
    one, two = intend(obs, prev, 1000.0), intend(observed(bare_node(), regresses=True), prev, 1000.0)
    assert one == two  # the same inputs, an equal intent (no client, no clock read, no file read)
    assert obs["snap"] == before["snap"]  # and the inputs are as they were
    # the clock is an input: every time an output says is the pass's
    later = intend(obs, prev, 2000.0)
    assert later != one and later.lease.now == 2000.0 and later.event["firstTimestamp"] == "1970-01-01T00:33:20Z"
    # and the module imports nothing that talks to the API server or writes
    imported = {a.name for n in ast.walk(ast.parse((NODE_PKG / "intent.py").read_text()))
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names} | {
        n.module or "" for n in ast.walk(ast.parse((NODE_PKG / "intent.py").read_text()))
        if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if "kube" in m or "api" in m or "applyintent" in m or "atomic" in m}, imported


def test_one_intent_covers_every_output():
    it = intend(observed(bare_node(), regresses=True), intent.Previous(details={}), 1000.0)
    assert (it.desired.verdict, it.desired.gate.state) == ("fail", "held")
    assert it.node_patch.changed and it.node_patch.apply["metadata"]["labels"][SKIP_LABEL] == "true"
    assert it.details["verdict"] == "fail" and it.details["counts"]["regressions"] == 1 and it.details_changed
    assert it.event_why == "first" and it.event["type"] == "Warning"
    assert it.event["involvedObject"] == {"kind": "Node", "name": "gpu-a", "uid": "u-1", "apiVersion": "v1"}
    assert it.lease == intent.LeaseRenewal(name="gpu-a", namespace="compat-hook", interval=300.0, now=1000.0)
    assert it.state_file.path == "/var/lib/ch/cluster-agent.json" and '"prefix":"p.io"' in it.state_file.text
    assert it.record.state_dir == "/var/lib/ch" and it.record.driver == "535.183.01"
    assert [f.path for f in it.files] == [WHERE.nfd_file, WHERE.textfile]
    assert f"{P}/preflight=fail" in it.files[0].text
    assert 'compat_hook_decisions{effect="compat",reason="ok"} 3' in it.files[1].text
    # no state dir, no NFD file, no textfile: no file at all
    bare = intent.intend(**observed(bare_node(), regresses=True), settings=ST, previous=intent.Previous(details={}),
                         where=intent.Where(node="gpu-a", namespace="compat-hook", interval=300.0), decisions=None,
                         now=1000.0)
    assert (bare.state_file, bare.record, bare.files) == (None, None, ())


# --------------------------------------------------------------------------- (b) write only on change


def test_an_unchanged_pass_writes_no_node_no_details_and_sends_no_event():
    node = bare_node()
    first = intend(observed(node, regresses=True), intent.Previous(details={}), 1000.0)
    node, prev = published(node, first)
    again = intend(observed(node, regresses=True), prev, 1300.0)
    assert not again.node_patch.changed  # the Node says it all
    assert not again.details_changed and again.details == first.details
    assert again.event is None and again.event_why is None
    assert again.lease.now == 1300.0  # the heartbeat is renewed every pass
    assert again.state_file is not None and again.files  # the files say when the last pass ran
    # a restarted agent (no word of its own, the details read back) agrees: nothing to write either
    restarted = intend(observed(node, regresses=True), intent.Previous(own=None, details=first.details), 1400.0)
    assert not restarted.node_patch.changed and restarted.event is None and not restarted.details_changed


def test_a_change_writes_the_node_the_details_and_sends_an_event():
    node = bare_node()
    first = intend(observed(node, regresses=True), intent.Previous(details={}), 1000.0)
    node, prev = published(node, first)
    fixed = intend(observed(node, regresses=False), prev, 1300.0)  # the image fixed: the hold is lifted
    assert (fixed.desired.verdict, fixed.desired.gate.state) == ("pass", "clear")
    assert fixed.node_patch.changed and fixed.details_changed and fixed.event_why == "changed"
    assert fixed.event["type"] == "Normal"
    # details the agent read back differently (someone edited the ConfigMap): written again, no Event
    node, prev = published(node, fixed)
    edited = intend(observed(node, regresses=False), intent.Previous(own=prev.own, details={"verdict": "x"}), 1600.0)
    assert edited.details_changed and edited.event is None and not edited.node_patch.changed


# --------------------------------------------------------------------------- (c) one writer

#: The kube client's methods that write (compat_hook/cluster/api/kube.py), and an owned object's put.
KUBE_WRITES = {"create", "update", "patch", "apply", "delete", "put"}
#: Calls that write a file (or a directory entry).
FILE_WRITES = {("atomic", "replace"), ("os", "replace"), ("os", "rename"), ("os", "unlink"), ("os", "remove"),
               ("os", "makedirs"), ("os", "mkdir"), ("os", "open"), ("os", "symlink"), ("workloads", "record")}


def _receiver(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def writes(source: str) -> list:
    """The calls in ``source`` that write: a kube client's write method (``kube.create``, ``self.kube.patch``,
    ``kube.request`` with a method other than GET, a review excepted: it asks, it stores nothing), an
    owned object's ``put``, a file opened for writing, a file replaced, removed or made."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name):
            if f.id == "open" and len(n.args) > 1 and isinstance(n.args[1], ast.Constant) and \
                    set(str(n.args[1].value)) & set("wax+"):
                found.append((n.lineno, "open"))
            elif f.id in ("write_file", "write_node"):
                found.append((n.lineno, f.id))
            continue
        if not isinstance(f, ast.Attribute):
            continue
        recv = _receiver(f.value)
        if recv == "kube" and f.attr in KUBE_WRITES:
            found.append((n.lineno, f"kube.{f.attr}"))
        elif recv == "kube" and f.attr == "request":
            method = n.args[0].value if n.args and isinstance(n.args[0], ast.Constant) else None
            path = n.args[1].value if len(n.args) > 1 and isinstance(n.args[1], ast.Constant) else ""
            if method != "GET" and not str(path).endswith("reviews"):
                found.append((n.lineno, f"kube.request({method})"))
        elif f.attr == "put":
            found.append((n.lineno, f"{recv}.put"))
        elif (recv, f.attr) in FILE_WRITES or f.attr in ("write_file", "write_node", "write_text", "write_bytes") \
                or recv == "shutil":
            found.append((n.lineno, f"{recv}.{f.attr}"))
    return found


def test_the_write_finder_finds_writes():
    # a control: each shape of write the next test looks for is found, and a read is not
    src = ("self.kube.create(p, o)\nkube.patch(p, o)\nself.kube.request('DELETE', p)\nself.lease.put(x, 1)\n"
           "open(p, 'wb')\natomic.replace(p, b'')\nnodefiles.write_file(p, t)\nworkloads.record(d, [])\n"
           "kube.get(p)\nopen(p, 'rb')\nd.update(x)\nself.kube.request('POST', '/apis/a/v1/selfsubjectreviews')\n")
    assert [w for _, w in writes(src)] == ["kube.create", "kube.patch", "kube.request(DELETE)", "lease.put", "open",
                                          "atomic.replace", "nodefiles.write_file", "workloads.record"]


def test_in_the_node_agent_only_the_apply_step_writes():
    by_module = {p.stem: writes(p.read_text()) for p in sorted(NODE_PKG.glob("*.py"))}
    writers = {m for m, w in by_module.items() if w}
    # The agent's writes are applyintent's alone. The validator (`cluster validate`) and the release
    # (`cluster release`) are commands of their own in the same folder, each its own writer.
    assert writers == {"applyintent", "validate", "release"}, {m: by_module[m] for m in writers}
    assert {w for _, w in by_module["applyintent"]} >= {"kube.create", "kube.update", "kube.patch", "kube.apply",
                                                         "write_file", "workloads.record", "atomic.replace"}


def test_the_apply_step_writes_nothing_when_the_intent_says_nothing_changed():
    """applyintent.apply on an unchanged pass: no Node write, no ConfigMap write, no Event; the Lease only."""
    node = bare_node()
    first = intend(observed(node, regresses=True), intent.Previous(details={}), 1000.0)
    node, prev = published(node, first)
    again = intend(observed(node, regresses=True), prev, 1300.0)
    calls = []

    class Kube:
        def get(self, path, **q):
            calls.append(("get", path))
            return {"metadata": {"resourceVersion": "1"}, "spec": {}}

        def __getattr__(self, name):
            def write(path, *a, **kw):
                calls.append((name, path))
                return {"metadata": {"resourceVersion": "2"}}
            return write

    class Opts:
        node, publish_namespace = "gpu-a", "compat-hook"

    class Agent:
        kube, opts = Kube(), Opts()

    agent = Agent()
    agent.details_cm, agent.lease = applyintent.details_owned(agent), applyintent.lease_owned(agent)
    agent.details_cm.known, agent.details_cm.said = True, prev.details
    settled = []
    it = dataclasses.replace(again, state_file=None, record=None, files=())
    done = applyintent.apply(agent, it, settled=settled.append, log=calls.append)
    assert (done.node_write, done.details_written, done.event_sent) == ("unchanged", False, False)
    assert settled == [None]
    assert [c for c in calls if c[0] != "get"] == [("update", "/apis/coordination.k8s.io/v1/namespaces/compat-hook/"
                                                               "leases/gpu-a")]


def test_the_details_show_every_libcuda_a_workloads_image_carries():
    """plan's ``image_libcuda`` facts (a userland driver in a system dir, a symlinked compat file, what ldconfig
    links there) reach the agent's details whatever the verdict, bounded; a row without them adds nothing."""
    from compat_hook.cluster.node import detailscm

    sys_dir = "/usr/lib/x86_64-linux-gnu"
    facts = {"userland": [f"{sys_dir}/libcuda.so.575.57.08"], "ldconfig_picks": {sys_dir: "libcuda.so.575.57.08"},
             "symlinked": {"/usr/local/cuda-12.9/compat/libcuda.so.575.57.08": "/opt/nv/libcuda.so.575.57.08"}}
    rows = [{"name": "apps/infer:1", "image_libcuda": facts, "now": {"outcome": "compat"}, "after": {"outcome": "compat"}},
            {"name": "apps/plain:1", "now": {"outcome": "host"}, "after": {"outcome": "host"}},
            {"name": "apps/hostile:1", "image_libcuda": {"userland": ["x" * 5000] * 50, "symlinked": "not a map"}}]
    doc = detailscm.details_doc(node="n", verdict_="pass", complete=True, target="580.65.06", target_from="x",
                                now="535.261.03", gate="off", gate_message="", problem=None, reasons=[], interval=30,
                                c={}, rows=rows, pods={}, missing=[], pods_seen=3)
    first, hostile = doc["image_libcuda"]
    assert first == dict(facts, name="apps/infer:1")
    assert len(hostile["userland"]) == 8 and all(len(p) <= 403 for p in hostile["userland"])  # 400 and "..."
    assert "symlinked" not in hostile and hostile["name"] == "apps/hostile:1"
    big = [dict(rows[0], name=f"apps/w{i}:1") for i in range(500)]
    doc = detailscm.details_doc(node="n", verdict_="pass", complete=True, target="580.65.06", target_from="x",
                                now="535.261.03", gate="off", gate_message="", problem=None, reasons=[], interval=30,
                                c={}, rows=big, pods={}, missing=[], pods_seen=500)
    assert len(doc["image_libcuda"]) <= detailscm.MAX_LIBCUDA_ROWS
