"""A hold outlives its workload's pod churn made by the real StatefulSet and Job controllers.

The control plane of tests/test_cluster.py (its :class:`~tests.test_cluster.World`: etcd, kube-apiserver,
kwok, NVIDIA's upgrade state machine in tests/upgrade_harness), plus what this module alone needs:

* **kube-controller-manager** v1.34 with only ``statefulset-controller`` and ``job-controller``: the
  pods come and go as those controllers make them (names, owners, finalizers, the Job's backoff);
* **kwok pod stages of its own** (:func:`pod_stages`, in place of kwok's fast ones), the kubelet
  behaviour the churn depends on:

  - a pod goes Running and Ready (kwok's own ``pod-ready`` stage, read from kwok's files);
  - a deleted pod first *stops*: its containers terminate and it turns Succeeded, as a kubelet
    does (since 1.27 it puts a deleted pod in a terminal phase before it removes it); only then is it
    removed, and an object a finalizer keeps stays in the API, terminal, until the finalizer goes;
  - a Job's pod runs :data:`RUN_S` seconds and completes, except the first try of its index 0: that
    one runs until the test crashes it (the annotation :data:`CRASH`, as ``kubectl exec ... kill 1``
    would), and it fails (exit 1). The Job controller's own pod-failure backoff (10 s for a first
    failure) is then the gap before its next pod.

The agent counts a pod that is Pending, Running or Terminating-but-running as its workload present; a
terminal pod (Succeeded, Failed) is not. So a gap is the time between a pod turning terminal and the
next pod of the workload existing.
"""

from __future__ import annotations

import datetime
import json
import time

import pytest
import yaml

from compat_hook.cluster.node import holds
from compat_hook.cluster.workload import pods as podsmod
from tests.support import debs, kubebuild
from tests.support.gpucluster import R470, SKIP, STATE, agent_rbac, gpu_operator, gpu_pod, ref, runtime_classes
from tests.support.kube import ApiError, ControlPlane
from tests.support.toolkit import noted_compat_lib
from tests.test_cluster import CLIENTS, HOLDS, PREFIX, World, _quiet_config

pytestmark = [pytest.mark.containers, pytest.mark.slow]

APPS = "/api/v1/namespaces/apps"
STS = "/apis/apps/v1/namespaces/apps/statefulsets"
JOBS = "/apis/batch/v1/namespaces/apps/jobs"
#: The finalizer of the StatefulSet's pods: the cleanup a controller of the workload's own does after
#: each pod (a checkpoint upload, say). The test plays that controller.
CLEANUP = "compat-hook-test/checkpoint-upload"
#: How long that cleanup takes: the StatefulSet's gap (its controller recreates a pod only once the old
#: object is gone).
CLEANUP_S = 8
#: How long a Job's pod runs before it completes.
RUN_S = 4
#: The annotation that crashes a Job's running pod (the test sets it on the first one).
CRASH = "compat-hook-test/crash"
#: The hold's quiet time: longer than any gap here (the Job's backoff: 10 s), short for the test.
QUIET_S = 20

_JOB_RUNNING = [
    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
    {"key": ".status.phase", "operator": "In", "values": ["Running"]},
    {"key": '.status.conditions.[] | select( .type == "Ready" ) | .status', "operator": "In", "values": ["True"]},
    {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
]
#: ``<completion index>/<failures of that index so far>``: "0/0" is the first try of index 0.
_TRY = ('[.metadata.annotations["batch.kubernetes.io/job-completion-index"], '
        '.metadata.annotations["batch.kubernetes.io/job-index-failure-count"]] | join("/")')


def _terminated(phase: str, exit_code: int, reason: str) -> str:
    """A kwok status template: every container terminated with ``exit_code``, the pod in ``phase``."""
    return ("{{ $now := Now }}\ncontainerStatuses:\n{{ range .spec.containers }}\n"
            "- image: {{ .image | Quote }}\n  name: {{ .name | Quote }}\n  ready: false\n  restartCount: 0\n"
            f"  started: false\n  state:\n    terminated:\n      exitCode: {exit_code}\n"
            f"      finishedAt: {{{{ $now | Quote }}}}\n      reason: {reason}\n"
            "      startedAt: {{ $now | Quote }}\n{{ end }}\n"
            f"phase: {phase}\n")


def _stage(name: str, match: list, *, status: str | None = None, delete: bool = False, delay_s: float = 0) -> dict:
    spec: dict = {"resourceRef": {"apiGroup": "v1", "kind": "Pod"}, "selector": {"matchExpressions": match},
                  "next": {"delete": True} if delete else {"statusTemplate": status}}
    if delay_s:
        spec["delay"] = {"durationMilliseconds": int(delay_s * 1000)}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def pod_stages() -> list:
    """The pod lifecycle of the module docstring, as kwok ``Stage`` documents. No two match the same pod
    (where several match, kwok picks one at random)."""
    [ready] = [yaml.safe_load(p.read_text()) for p in kubebuild.kwok()[1] if p.name == "pod-fast-pod-ready.yaml"]
    deleted = {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
    return [
        ready,
        _stage("pod-stop", [deleted, {"key": ".status.phase", "operator": "NotIn", "values": ["Succeeded", "Failed"]}],
               status=_terminated("Succeeded", 0, "Completed")),
        _stage("pod-remove", [deleted, {"key": ".status.phase", "operator": "In", "values": ["Succeeded", "Failed"]}],
               delete=True),
        _stage("job-pod-crash", _JOB_RUNNING + [{"key": f'.metadata.annotations["{CRASH}"]', "operator": "Exists"}],
               status=_terminated("Failed", 1, "Error")),
        _stage("job-pod-complete", _JOB_RUNNING + [{"key": _TRY, "operator": "NotIn", "values": ["0/0"]}],
               status=_terminated("Succeeded", 0, "Completed"), delay_s=RUN_S),
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("churn")
    libs = {"noted": noted_compat_lib(debs.libcuda("550.163.01"), work / "noted")}
    cp = ControlPlane(work / "cp")
    try:
        cp.start()
        cp.start_controller_manager(("statefulset-controller", "job-controller"))
        cp.start_kwok(pod_stages())
        agent_rbac(cp)
        runtime_classes(cp.admin)
        gpu_operator(cp.admin)
        w = World(cp, work, libs)
        cp.start_harness()
        yield w
    finally:
        cp.stop()
        for name in ("harness.log", "kwok.log", "controller-manager.log"):
            f = work / "cp" / name
            if f.exists():
                print(f"--- {name} (tail)\n" + f.read_text(errors="replace")[-3000:])


@pytest.fixture(params=CLIENTS)
def client(request):
    return request.param


def _ts(s: str) -> float:
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _finished(pod: dict) -> float:
    """When the pod's container terminated (kwok's clock, in the API's whole seconds)."""
    [st] = pod["status"]["containerStatuses"]
    return _ts(st["state"]["terminated"]["finishedAt"])


def _terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class Churn:
    """The test's eyes while the controllers churn: every wait polls the watched nodes' pods (each pod
    ever seen is kept, by uid) and the parked Nodes. A parked Node must stay held (the skip label and
    compat-hook's holds-upgrade annotation) and in upgrade-required, unless its workload is gone for
    good (:meth:`gone_for_good`) and the quiet time has passed since: then its release is recorded."""

    def __init__(self, w: World, nodes) -> None:
        self.w, self.nodes = w, list(nodes)
        self.parked: set = set()
        self.seen: dict = {n: {} for n in self.nodes}
        self.held_ids: dict = {n: set() for n in self.nodes}
        self.empty: set = set()  # the nodes that ran no pod of their workload at the last poll
        self.gone: dict = {}  # node -> when its workload went for good (the API's time of its last pod's end)
        self.released: dict = {}  # node -> when its hold was first seen lifted (this clock's time)
        self.polls = 0

    def pods(self, node: str) -> list:
        got = self.w.admin.get(f"{APPS}/pods", fieldSelector=f"spec.nodeName={node}")["items"]
        for p in got:
            self.seen[node][p["metadata"]["uid"]] = p
        return got

    def live(self, node: str) -> list:
        """The node's pods the agent counts as its workload present (not terminal)."""
        return [p for p in self.pods(node) if not _terminal(p)]

    def check(self) -> None:
        for n in self.nodes:
            if self.live(n):
                self.empty.discard(n)
            else:
                self.empty.add(n)
        for n in sorted(self.parked - set(self.released)):
            meta = self.w.node(n)["metadata"]
            labels, anns = meta.get("labels") or {}, meta.get("annotations") or {}
            if n in self.gone and SKIP not in labels and HOLDS not in anns:
                # the agent counts from the whole second of its first pass without the workload
                assert time.time() - self.gone[n] >= QUIET_S - 1, (n, time.time() - self.gone[n], anns)
                self.released[n] = time.time()
                continue
            assert labels.get(SKIP) == "true" and HOLDS in anns, (n, labels, anns)
            assert labels.get(STATE) == "upgrade-required", (n, labels)
            self.held_ids[n] |= set(json.loads(anns[f"{PREFIX}/preflight"])["held"]["w"])
        self.polls += 1

    def wait(self, what: str, fn, timeout: float = 60):
        end = time.monotonic() + timeout
        while True:
            self.check()
            got = fn()
            if got:
                return got
            assert time.monotonic() < end, f"timed out waiting for {what}"
            time.sleep(0.2)

    def gone_for_good(self, node: str) -> None:
        """The node's workload ended for good: no pod of it is live; it went when its last pod ended."""
        self.check()
        assert node in self.empty, self.live(node)
        self.gone[node] = max(_finished(p) for p in self.seen[node].values())

    def ids(self, node: str) -> set:
        """The workload id (:func:`compat_hook.cluster.node.holds.workload_id`) of every pod seen on the node,
        as the agent computes it (with its default RuntimeClasses), each judged as while it ran."""
        out = set()
        for p in self.seen[node].values():
            [w] = podsmod.build([dict(p, status={"phase": "Running"})], ["cuda-compat"]).items
            out.add(holds.workload_id(w))
        return out


def _statefulset(name: str, node: str) -> dict:
    pod = gpu_pod(name, node, ref("infer"))
    return {"metadata": {"name": name}, "spec": {
        "replicas": 1, "serviceName": name, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}, "finalizers": [CLEANUP]}, "spec": pod["spec"]}}}


def _job(name: str, node: str) -> dict:
    pod = gpu_pod(name, node, ref("infer"))
    return {"metadata": {"name": name}, "spec": {
        "completionMode": "Indexed", "completions": 2, "parallelism": 1, "backoffLimitPerIndex": 1,
        "template": {"metadata": {"labels": {"app": name}}, "spec": dict(pod["spec"], restartPolicy="Never")}}}


def _index(pod: dict) -> str:
    a = pod["metadata"]["annotations"]
    return f"{a['batch.kubernetes.io/job-completion-index']}/{a['batch.kubernetes.io/job-index-failure-count']}"


def _unfinalize(w: World, pod: dict) -> None:
    w.admin.merge(f"{APPS}/pods/{pod['metadata']['name']}", {"metadata": {"finalizers": None}})


def test_a_hold_outlives_a_statefulsets_and_a_jobs_pod_churn_under_nvidias_state_machine(world, client, tmp_path):
    """Two nodes, each running the regressing workload (a CUDA 12.4 image on the R470 target) under a
    real controller, each held and parked in upgrade-required by NVIDIA's controller:

    * a **StatefulSet**'s pod is deleted (``kubectl delete pod``). It stops at once, but a finalizer
      of the workload's own keeps the object while its cleanup runs (:data:`CLEANUP_S`; the test
      plays that cleanup and removes the finalizer). The StatefulSet controller makes the pod again
      only once the old object is gone, so the node runs none of the workload's pods for that long;
    * a **Job** (Indexed, 2 completions, parallelism 1, ``backoffLimitPerIndex: 1``): its first pod
      crashes (the test crashes it once the node is parked), and the Job controller waits out its own
      pod-failure backoff (10 s) before the retry; the retry completes and the next index's pod
      follows at once (the short gap of a Job between two pods). The kwok stages play the pods'
      lives (the module docstring).

    The Nodes are polled through every gap: held the whole time, in upgrade-required. The pods the
    controllers made are one workload each by the agent's id (:func:`holds.workload_id`), the one
    the Node's record holds. When the workload ends for good (the StatefulSet scaled to 0, the Job
    complete) the hold lifts after the quiet time, and NVIDIA's controller moves each node on."""
    w = world
    sts_node, job_node = f"sts-{client}", f"job-{client}"
    sts, job = f"infer-{client}", f"train-{client}"
    c = Churn(w, (sts_node, job_node))
    agents = []
    try:
        for n in c.nodes:
            w.add_node(n, deploy_driver=True)
        w.admin.create(STS, _statefulset(sts, sts_node))
        w.admin.create(JOBS, _job(job, job_node))
        c.wait("the first pods running", lambda: all(
            [p["status"].get("phase") for p in c.live(n)] == ["Running"] for n in c.nodes), timeout=60)
        for n in c.nodes:
            agents.append(w.spawn(n, "--driver", R470, "--interval", "2", client=client,
                                  config=_quiet_config(w, n, tmp_path, QUIET_S)))
        for n in c.nodes:
            w.admin.wait(f"{n} upgrade-done", lambda n=n: w.labels(n).get(STATE) == "upgrade-done", timeout=60)
            w.admin.wait(f"{n} held", lambda n=n: w.labels(n).get(SKIP) == "true" and HOLDS in w.annotations(n),
                         timeout=60)
            # the controller is asked to upgrade the node (its own annotation): the skip label parks it
            w.admin.merge(f"/api/v1/nodes/{n}", {"metadata": {"annotations": {
                "nvidia.com/gpu-driver-upgrade-requested": "true"}}})
        for n in c.nodes:
            w.admin.wait(f"{n} upgrade-required", lambda n=n: w.labels(n).get(STATE) == "upgrade-required", timeout=60)
        c.parked.update(c.nodes)
        n0 = {n: len(w.passes(n)) for n in c.nodes}
        # the Job's first pod crashes now that its node is parked (the Job goes on in the background)
        [first] = c.live(job_node)
        assert _index(first) == "0/0", first
        w.admin.merge(f"{APPS}/pods/{first['metadata']['name']}", {"metadata": {"annotations": {CRASH: "true"}}})

        # 1. the StatefulSet's pod deleted: stopped, kept CLEANUP_S by its finalizer, then made again
        [old] = c.live(sts_node)
        w.admin.delete(f"{APPS}/pods/{old['metadata']['name']}")
        c.wait("the StatefulSet's pod stopped", lambda: sts_node in c.empty, timeout=30)
        p0, t0 = c.polls, time.monotonic()
        c.wait("its cleanup", lambda: time.monotonic() - t0 >= CLEANUP_S)
        _unfinalize(w, old)
        [new] = c.wait("the StatefulSet's pod made again", lambda: [
            p for p in c.live(sts_node) if p["status"].get("phase") == "Running"], timeout=30)
        sts_polls = c.polls - p0
        k = len(w.passes(sts_node))
        c.wait("a pass that sees the StatefulSet's workload back", lambda: any(
            (p["regressions"], p["absent_regressions"]) == (1, 0) for p in w.passes(sts_node)[k:]), timeout=30)
        assert new["metadata"]["name"] == old["metadata"]["name"] and new["metadata"]["uid"] != old["metadata"]["uid"]
        stopped = c.seen[sts_node][old["metadata"]["uid"]]
        sts_gap = _ts(new["metadata"]["creationTimestamp"]) - _finished(stopped)
        assert 5 <= sts_gap <= 20, sts_gap

        # 2. the StatefulSet scaled to 0: its workload gone for good (its cleanup is quick this time)
        w.admin.merge(f"{STS}/{sts}", {"spec": {"replicas": 0}})
        c.wait("the StatefulSet's last pod stopped", lambda: sts_node in c.empty, timeout=30)
        c.gone_for_good(sts_node)
        _unfinalize(w, new)

        # 3. the Job runs its course: the crash, the controller's backoff, the retry, the next index
        def complete():
            conds = (w.admin.get(f"{JOBS}/{job}").get("status") or {}).get("conditions") or []
            return any(x["type"] == "Complete" and x["status"] == "True" for x in conds)

        c.wait("the Job complete", complete, timeout=10 + 2 * RUN_S + 30)
        c.gone_for_good(job_node)
        jpods = sorted(c.seen[job_node].values(), key=lambda p: (p["metadata"]["creationTimestamp"], _index(p)))
        assert [(_index(p), p["status"]["phase"]) for p in jpods] == [
            ("0/0", "Failed"), ("0/1", "Succeeded"), ("1/0", "Succeeded")], jpods
        job_gaps = [_ts(b["metadata"]["creationTimestamp"]) - _finished(a) for a, b in zip(jpods, jpods[1:])]
        assert 5 <= job_gaps[0] <= 20 and 0 <= job_gaps[1] <= 3, job_gaps

        # 4. gone for good: each hold lifts after the quiet time (never before: Churn.check), and the
        # controller moves the node on
        c.wait("both holds lifted", lambda: len(c.released) == 2, timeout=QUIET_S + 30)
        took = {n: c.released[n] - c.gone[n] for n in c.nodes}
        assert all(QUIET_S - 1 <= t < QUIET_S + 10 for t in took.values()), took
        for n in c.nodes:
            w.admin.wait(f"{n} past upgrade-required", lambda n=n: w.labels(n).get(STATE) != "upgrade-required",
                         timeout=60)
            assert "held" not in json.loads(w.annotations(n)[f"{PREFIX}/preflight"])

        # one workload per node, whichever pod ran it: the one the Node's record held throughout
        for n in c.nodes:
            assert len(c.ids(n)) == 1 and c.held_ids[n] == c.ids(n), (n, c.ids(n), c.held_ids[n])
        for n in c.nodes:
            passes = w.passes(n)[n0[n]:]
            held = [p for p in passes if p["gate"] == "held"]
            assert passes[:len(held)] == held and len(held) >= 5, passes
            assert all(p["preflight"] == "fail" for p in held), held
            assert any(p["absent_regressions"] == 1 and p["regressions"] == 0 for p in held), held  # in a gap
            assert all(p["regressions"] == p["absent_regressions"] == 0 for p in passes[len(held):]), passes
        assert all(a.poll() is None for a in agents)
        print(f"{client}: StatefulSet gap {sts_gap:.0f} s ({sts_polls} polls), Job gaps "
              f"{', '.join(f'{g:.0f}' for g in job_gaps)} s; "
              f"{c.polls} polls, all held until released {took[sts_node]:.1f} s / {took[job_node]:.1f} s after "
              f"the workload went (quiet time {QUIET_S} s)")
    finally:
        for a in agents:
            a.terminate()
            a.wait(10)
        for path in (f"{STS}/{sts}", f"{JOBS}/{job}"):
            try:
                w.admin.delete(path, propagationPolicy="Orphan")
            except ApiError as e:
                assert e.status == 404, e
        for n in c.nodes:
            for p in c.pods(n):
                try:
                    _unfinalize(w, p)
                    w.admin.delete(f"{APPS}/pods/{p['metadata']['name']}", gracePeriodSeconds="0")
                except ApiError as e:
                    assert e.status == 404, e
