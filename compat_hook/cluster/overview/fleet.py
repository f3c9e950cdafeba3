"""``compat-hook cluster fleet``: the one writer of what the fleet has judged, for the driver admission policy.

The chart's ValidatingAdmissionPolicy ``compat-hook-fleet-driver-version`` refuses any create, update or
delete of a ClusterPolicy or NVIDIADriver that changes the driver some GPU node will run, until every node
whose driver moves has a complete, fresh verdict for the new one (a regressing node held). What the operator
will run is judged, not a field: the driver image the operator resolves (``repository``/``image``/``version``,
a full ``image`` with a tag, a digest: :func:`.target.effective`), which nodes it drives (``enabled``,
``useNvidiaDriverCRD``, ``nodeSelector``, ``nodeAffinity`` with ``matchFields``). A policy sees one object
and its parameter, never the fleet, so this controller keeps the parameter: the ConfigMap
:data:`PARAM_NAME` in the release namespace, whose keys (:func:`reconcile`) answer each question the
policy may ask:

* ``<kind>_<name>_<version>``: that object's driver moved to ``version``, its scope unchanged;
* ``driver_<version>``: every GPU node judged ``version`` (a create, a moved selector: the fleet cannot see
  the new scope ahead, so every node must have judged it);
* ``<kind>_<name>_delete``, ``clusterpolicy_<name>_mode.<enabled>.<useNvidiaDriverCRD>``: that change made,
  computed here in a what-if world: ``ok`` when no node's driver moves to one it has not judged.

Each value is :data:`OK` or which nodes block it and why. Only the fleet's account may write the ConfigMap's
data (the chart's policy ``compat-hook-fleet-param``); the fleet watches it and puts back whatever it did not
write (a whole update: a key someone else added goes), conditional on the ``resourceVersion`` it read.

It is a controller in three steps:

* observe (:func:`observe`): a :class:`Snapshot` from watch caches (:mod:`.reflector`): the GPU Nodes
  (two watches: ``nvidia.com/gpu.present=true`` and ``<prefix>/preflight``, the nodes ``cluster status``
  shows), the agents' Leases (each one's freshness by when the fleet itself saw it change, never the
  agent's clock), the ClusterPolicies, the NVIDIADrivers, the ConfigMap itself;
* reconcile (:func:`reconcile`, pure): each node judged by ``cluster status``'s own row
  (:func:`.status.node_row`, so the policy and ``status`` never disagree on what is fresh or held,
  :func:`judge`);
* apply (:func:`apply`): an update of the ConfigMap's whole ``data``, conditional on the
  ``resourceVersion`` read, only when it differs from what the ConfigMap holds.

Only the leader applies (:mod:`.leader`: the Lease :data:`PARAM_NAME` in the same namespace); a second
replica stands by and takes over when the leader's Lease runs out, or at once when the leader
releases it on SIGTERM. Leases expire without any event, so the leader looks again every ``resync``
seconds; a renewal that changes no judgement costs no reconcile. While a cache is not current (its watch
broke) it writes nothing: the ConfigMap keeps its last word, and a version never judged has no key there
(refused).

>>> node = {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true", "pool": "a"}}}
>>> cp = {"metadata": {"name": "cluster-policy"}, "spec": {"driver": {"version": "535.261.03"}}}
>>> snap = Snapshot(nodes=(node,), leases={}, policies=(cp,), drivers=(), now=0.0)
>>> data = reconcile(snap, "compat-hook.io")
>>> data["clusterpolicy_cluster-policy_535.261.03"], data["driver_535.261.03"]
('not judged on 1 of 1 node(s): gpu-a (no verdict)', 'not judged on 1 of 1 node(s): gpu-a (no verdict)')
>>> data["clusterpolicy_cluster-policy_delete"], data["clusterpolicy_cluster-policy_mode.true.true"]
('ok', 'ok')
"""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass, field

from . import status as statusmod
from ..workload import target as targetmod
from ..api.backoff import Backoff, jittered
from ..api.kube import KubeError, NotFound

__all__ = ["Snapshot", "reconcile", "judge", "param_key", "observe", "apply", "Fleet", "FleetOptions", "run",
           "PARAM_NAME", "FIELD_MANAGER", "OK", "OVERRIDE"]

#: The ConfigMap the policy reads (its ``paramRef``) and the Lease of the election: both the chart's.
PARAM_NAME = "compat-hook-fleet"
FIELD_MANAGER = "compat-hook-fleet"
#: The value of a key whose version every node in scope has judged.
OK = "ok"
#: The annotation (under the label prefix) that lets one version through unjudged: its value is that version.
OVERRIDE = "allow-unjudged-driver"
#: The labels of the chart's Lease and ConfigMap of the fleet controller.
LABELS = {"app.kubernetes.io/name": "compat-hook", "app.kubernetes.io/component": "fleet"}
#: Nodes named in one refusal at most (the rest are counted).
MAX_NAMED = 8
MAX_REASON = 80
#: A ConfigMap key: what the API server accepts, and what the policy's CEL builds.
_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
KINDS = {"clusterpolicy": "ClusterPolicy", "nvidiadriver": "NVIDIADriver"}


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _name(obj) -> str:
    return str(_map(_map(obj).get("metadata")).get("name") or "")


@dataclass(frozen=True)
class Snapshot:
    """What the caches held at one moment: the GPU Nodes, the agents' Leases by node name, the
    ClusterPolicies, the NVIDIADrivers, the wall-clock time, ``ages``: for each Lease, the seconds since the
    fleet itself saw it change (its own clock; None: judge ``renewTime`` by ``now``, as a one-shot
    ``cluster status`` must), and the GPUClusters (gpu-operator v26.7's DRA resource: detected, not judged)."""

    nodes: tuple
    leases: dict = field(default_factory=dict)
    policies: tuple = ()
    drivers: tuple = ()
    now: float = 0.0
    ages: dict | None = None
    gpuclusters: tuple = ()


def param_key(kind: str, name: str, version: str) -> str | None:
    """The ConfigMap key for ``kind`` (``clusterpolicy``/``nvidiadriver``), object ``name`` and ``version``,
    as the policy's CEL builds it; None when the API server would refuse it (a key longer than 253).
    ``_`` separates: neither an object name nor a driver version has one. ``version`` is also one of the
    what-if words: ``delete``, ``mode.<enabled>.<useNvidiaDriverCRD>``.

    >>> param_key("nvidiadriver", "pool-a", "570.195.03"), param_key("clusterpolicy", "x" * 250, "570.195.03")
    ('nvidiadriver_pool-a_570.195.03', None)
    """
    key = f"{kind}_{name}_{version}"
    return key if _KEY.fullmatch(key) else None


def driver_key(version: str) -> str | None:
    """The key that says whether every GPU node has judged ``version`` (what a change the fleet cannot see
    ahead needs: a create, a moved ``nodeSelector``/``nodeAffinity``).

    >>> driver_key("570.195.03")
    'driver_570.195.03'
    """
    key = f"driver_{version}"
    return key if _KEY.fullmatch(key) else None


def versions(obj: dict, kind: str, prefix: str) -> list:
    """The versions of ``obj`` worth a key: the driver it makes the operator pull (:func:`.target.effective`:
    ``version``, or the tag of a full ``image``) and an announced ``<prefix>/next-driver``, each only when it
    is a version the operator takes (:func:`.target.check_version`).

    >>> nd = {"metadata": {"annotations": {"p.io/next-driver": "570.195.03"}}, "spec": {"version": "535.261.03"}}
    >>> versions(nd, "nvidiadriver", "p.io")
    ['535.261.03', '570.195.03']
    >>> versions({"spec": {"driver": {"version": "latest"}}}, "clusterpolicy", "p.io")
    []
    >>> versions({"spec": {"image": "nvcr.io/nvidia/driver:470.256.02-ubuntu22.04"}}, "nvidiadriver", "p.io")
    ['470.256.02']
    """
    spec = _map(obj.get("spec"))
    if kind == "clusterpolicy":
        spec = _map(spec.get("driver"))
    precompiled = spec.get("usePrecompiled") is True
    out = []
    eff = targetmod.effective(obj, kind)
    for raw in (eff.version, _map(_map(obj.get("metadata")).get("annotations")).get(f"{prefix}/next-driver")):
        v, _, problem = targetmod.check_version(raw, precompiled)
        if v is not None and problem is None and v not in out:
            out.append(v)
    return out


def judge(row: dict | None, version: str) -> str | None:
    """Why ``row`` (:func:`.status.node_row`, judged against ``version``) blocks ``version``; None: judged.
    Only a complete verdict is a judgement: a pass that could not read an image, its store or its watches
    publishes ``warn`` too, but has not looked. The words are stable (no seconds): the ConfigMap changes
    only when a judgement does.

    >>> ok = {"verdict": "pass", "stale": None, "target": "570.195.03", "hold": "-", "complete": True}
    >>> judge(ok, "570.195.03") is None
    True
    >>> judge(dict(ok, verdict="fail"), "570.195.03"), judge(dict(ok, verdict="fail", hold="yes"), "570.195.03")
    ('fail, not held', None)
    >>> judge(dict(ok, stale="no heartbeat for 99 s"), "570.195.03")
    'stale: no heartbeat from its agent'
    >>> judge(dict(ok, target="535.261.03"), "570.195.03")
    'verdict for 535.261.03'
    >>> judge(dict(ok, verdict="warn", complete=False, incomplete=["not_in_store"]), "570.195.03")
    'incomplete: not_in_store'
    """
    if row is None or row.get("verdict") is None:
        return "no verdict"
    if row.get("target") != version:  # judged another version (the node's own staleness says the same)
        return f"verdict for {row.get('target') or 'no target'}"[:MAX_REASON]
    if row.get("stale"):
        beat = "heartbeat" in row["stale"] or "Lease" in row["stale"] or "clock" in row["stale"]
        return "stale: no heartbeat from its agent" if beat else "stale: its target moved since"
    if not row.get("complete"):
        why = ", ".join(str(r) for r in (row.get("incomplete") or [])[:4])
        return f"incomplete: {why or 'its agent did not say why'}"[:MAX_REASON]
    if row["verdict"] == "unknown":
        return "unknown"
    if row["verdict"] == "fail" and row.get("hold") not in statusmod.HELD:
        return "fail, not held"
    return None


def _labels(node: dict) -> dict:
    return {k: v for k, v in _map(_map(node.get("metadata")).get("labels")).items() if isinstance(v, str)}


def _selected(obj: dict, kind: str, gpu_nodes: list) -> list:
    """The GPU nodes ``obj`` selects: a ClusterPolicy, every one; an NVIDIADriver, those its ``nodeSelector``,
    ``nodeAffinity`` (``matchFields`` too) select, whether it drives them now or would once a ClusterPolicy
    hands drivers to NVIDIADrivers (that flip is judged on its own)."""
    if kind == "clusterpolicy":
        return list(gpu_nodes)
    spec = _map(obj.get("spec"))
    return [n for n in gpu_nodes if targetmod.selects(spec.get("nodeSelector"), _labels(n), spec.get("nodeAffinity"),
                                                      _name(n))]


def _blocked(blockers: list, total: int) -> str:
    """The refusal's list of nodes (bounded).

    >>> _blocked([("a", "no verdict"), ("b", "fail, not held")], 3)
    'not judged on 2 of 3 node(s): a (no verdict), b (fail, not held)'
    >>> _blocked([(str(i), "x") for i in range(10)], 10).endswith("7 (x) and 2 more")
    True
    """
    named = ", ".join(f"{n[:63]} ({why})" for n, why in blockers[:MAX_NAMED])
    more = f" and {len(blockers) - MAX_NAMED} more" if len(blockers) > MAX_NAMED else ""
    return f"not judged on {len(blockers)} of {total} node(s): {named}{more}"


#: A prefix no annotation carries: a node's driver as the objects set it, announcements left out.
_NO_PREFIX = "\x00"
#: The modes of a ClusterPolicy's driver: ``spec.driver.enabled`` and ``useNvidiaDriverCRD``.
MODES = ((True, False), (True, True), (False, False), (False, True))


def mode_word(enabled: bool, crd: bool) -> str:
    """The what-if word of a ClusterPolicy mode, as the CEL spells it.

    >>> mode_word(True, True)
    'mode.true.true'
    """
    return f"mode.{str(enabled).lower()}.{str(crd).lower()}"


def _mode(cp: dict) -> tuple:
    drv = _map(_map(cp.get("spec")).get("driver"))
    return (drv.get("enabled") is not False, drv.get("useNvidiaDriverCRD") is True)


def _with_mode(cp: dict, enabled: bool, crd: bool) -> dict:
    spec = dict(_map(cp.get("spec")))
    spec["driver"] = dict(_map(spec.get("driver")), enabled=enabled, useNvidiaDriverCRD=crd)
    return dict(cp, spec=spec)


def driven(node: dict, policies, drivers) -> tuple:
    """What the objects make ``node`` run, announcements aside: ``("none", "")`` (no object drives it, or the
    driver is not the operator's), ``("version", v)`` or ``("unknown", why)`` (a digest, a tag that is not a
    version, the operator's default image, several NVIDIADrivers).

    >>> n = {"metadata": {"name": "g", "labels": {"nvidia.com/gpu.present": "true"}}}
    >>> driven(n, [{"metadata": {"name": "cp"}, "spec": {"driver": {"version": "570.195.03"}}}], [])
    ('version', '570.195.03')
    >>> driven(n, [{"metadata": {"name": "cp"}, "spec": {"driver": {"version": "570.195.03", "enabled": False}}}], [])
    ('none', '')
    >>> driven(n, [], [{"metadata": {"name": "d"}, "spec": {"image": "r/driver@sha256:" + "0" * 64}}])[0]
    'unknown'
    """
    cp, _ = targetmod.active_policy(list(policies))
    if cp is not None and _mode(cp)[0] is False:
        return ("none", "")
    if _labels(node).get(targetmod.DEPLOY_DRIVER_LABEL) == "pre-installed":
        return ("none", "")
    t = targetmod.node_target(node, list(policies), list(drivers), prefix=_NO_PREFIX)
    if t.version is not None:
        return ("version", t.version)
    if t.reason == "no_target" and ("none selects" in (t.problem or "") or t.where == "none"):
        return ("none", "")
    return ("unknown", str(t.problem or "no version"))


def _fingerprint(objs) -> tuple:
    return tuple((_name(o), _rv(o), id(o) if not _rv(o) else 0) for o in objs if isinstance(o, dict))


def _selector_keys(objs) -> tuple:
    """The label keys any selector of ``objs`` reads, and whether one reads the node's name (``matchFields``):
    a node's driver in that world depends on those alone."""
    keys = {statusmod.PRESENT_LABEL, targetmod.DEPLOY_DRIVER_LABEL, *targetmod.DEFAULT_SELECTOR}
    by_name = False
    for o in objs:
        spec = _map(_map(o).get("spec"))
        keys.update(k for k in _map(spec.get("nodeSelector")) if isinstance(k, str))
        req = _map(_map(spec.get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution"))
        for term in req.get("nodeSelectorTerms") or []:
            for e in _map(term).get("matchExpressions") or []:
                if isinstance(_map(e).get("key"), str):
                    keys.add(e["key"])
            by_name = by_name or bool(_map(term).get("matchFields"))
    return tuple(sorted(keys)), by_name


class Resolver:
    """Each node's target, its driver now and in every what-if world, and which objects select it, for one
    set of objects: a node's answers depend only on the labels those objects' selectors read (and its name
    where one selects by name), so nodes alike share one computation (a fleet has a few pools, not 10,000)."""

    def __init__(self, policies: tuple, drivers: tuple, prefix: str) -> None:
        self.policies, self.drivers, self.prefix = policies, drivers, prefix
        self.keys, self.by_name = _selector_keys(policies + drivers)
        self.worlds = _worlds(policies, drivers)
        self._cache: dict = {}

    def signature(self, node: dict) -> tuple:
        labels = _labels(node)
        sig = tuple(labels.get(k) for k in self.keys)
        return sig + (_name(node),) if self.by_name else sig

    def answers(self, node: dict) -> tuple:
        """``(target, driven now, [driven in each world], [index of each object that selects it], target's key)``."""
        sig = self.signature(node)
        got = self._cache.get(sig)
        if got is None:
            tgt = targetmod.node_target(node, list(self.policies), list(self.drivers), prefix=self.prefix)
            before = driven(node, self.policies, self.drivers)
            after = [driven(node, p, d) for _, _, _, p, d in self.worlds]
            sel = [i for i, (kind, obj) in enumerate(self.objects()) if _selected(obj, kind, [node])]
            got = self._cache[sig] = (tgt, before, after, sel, tgt.key())
        return got

    def objects(self) -> list:
        return [("clusterpolicy", o) for o in self.policies] + [("nvidiadriver", o) for o in self.drivers]


class Memo:
    """What one reconcile may keep for the next: each node's row (by its resourceVersion, its Lease's
    freshness and its target) and the :class:`Resolver` of the objects (by their resourceVersions). A Lease
    renewal or a verdict on one node then costs that node's work, not the fleet's (benchmarks/fleet_reconcile.py)."""

    def __init__(self) -> None:
        self.objects: tuple | None = None
        self.resolver: Resolver | None = None
        self.rows: dict = {}
        self.nodes: dict = {}

    def resolve(self, policies: tuple, drivers: tuple, prefix: str) -> Resolver:
        fp = (prefix, _fingerprint(policies), _fingerprint(drivers))
        if fp != self.objects or self.resolver is None:
            self.objects, self.resolver = fp, Resolver(policies, drivers, prefix)
            self.rows, self.nodes = {}, {}
        return self.resolver


def _worlds(policies: tuple, drivers: tuple) -> list:
    """The what-if worlds the policy may ask about: ``(kind, name, word, policies, drivers)``: each object
    deleted, and each ClusterPolicy in each of its other modes."""
    out = []
    for i, cp in enumerate(policies):
        if not isinstance(cp, dict) or not _name(cp):
            continue
        out.append(("clusterpolicy", _name(cp), "delete", policies[:i] + policies[i + 1:], drivers))
        for enabled, crd in MODES:
            if (enabled, crd) != _mode(cp):
                # switched to run the driver itself, it is taken for the active one whatever the others say:
                # which ClusterPolicy the operator uses can move without a write the policy sees (another
                # marked ignored, an older operator's choice after a restart), so a staged one is judged too
                alt = ((_with_mode(cp, enabled, crd),) if enabled and not crd
                       else policies[:i] + (_with_mode(cp, enabled, crd),) + policies[i + 1:])
                out.append(("clusterpolicy", _name(cp), mode_word(enabled, crd), alt, drivers))
    for i, nd in enumerate(drivers):
        if isinstance(nd, dict) and _name(nd):
            out.append(("nvidiadriver", _name(nd), "delete", policies, drivers[:i] + drivers[i + 1:]))
    return out


def _fresh(lease, age, now: float, ages) -> bool:
    spec = _map(_map(lease).get("spec"))
    dur = spec.get("leaseDurationSeconds")
    dur = float(dur) if isinstance(dur, (int, float)) and not isinstance(dur, bool) and dur > 0 else None
    if lease is None or dur is None:
        return False
    if ages is not None:
        return age is not None and age <= dur
    return statusmod.heartbeat_problem(statusmod._parse_time(spec.get("renewTime")), dur, now) is None


def reconcile(snap: Snapshot, prefix: str, memo: Memo | None = None) -> dict:
    """The ConfigMap's ``data`` (see the module docstring). Pure: ``memo`` only saves work, never changes the
    result.

    * ``<kind>_<name>_<version>``, for each object's :func:`versions`: :data:`OK` when every GPU node it
      selects judged that version (:func:`judge`), else the nodes that block it; an object that selects no
      GPU node has nothing to judge, and says so (not ``ok``);
    * ``driver_<version>`` for every version any object names or announces: every GPU node judged it;
    * ``<kind>_<name>_delete`` and ``clusterpolicy_<name>_mode.<enabled>.<crd>``: that change, made: ``ok``
      when no node's driver moves to one it has not judged;
    * ``gpucluster``: a GPUCluster exists, and what it drives is not judged.
    """
    memo = memo if memo is not None else Memo()
    policies = tuple(p for p in snap.policies if isinstance(p, dict))
    drivers = tuple(d for d in snap.drivers if isinstance(d, dict))
    res = memo.resolve(policies, drivers, prefix)
    objects = res.objects()
    ages = snap.ages
    present = statusmod.PRESENT_LABEL
    published = f"{prefix}/preflight"
    # per node: (name, node, its answers, its row, its judgements); what did not change since the last
    # reconcile (the node's resourceVersion, its Lease's and its freshness) is taken from the memo
    known, rows_memo = memo.nodes, memo.rows
    nodes_now: dict = {}
    rows_now: dict = {}
    gpu = []
    for n in snap.nodes:
        if not isinstance(n, dict):
            continue
        meta = _map(n.get("metadata"))
        name = str(meta.get("name") or "")
        nkey = (name, meta.get("resourceVersion") or id(n))
        got = known.get(nkey)
        if got is None:
            labels = _labels(n)
            got = (labels.get(present) == "true" or published in labels, res.answers(n) if labels.get(
                present) == "true" or published in labels else None)
        nodes_now[nkey] = got
        if not got[0]:
            continue  # not a GPU node, as `cluster status` says
        ans = got[1]
        lease = snap.leases.get(name)
        age = None if ages is None else ages.get(name)
        fresh = _fresh(lease, age, snap.now, ages)
        rkey = (nkey, fresh, ans[4], _rv(lease) if lease is not None else -1, ages is None)
        rec = rows_memo.get(rkey)
        if rec is None:
            row = statusmod.node_row(n, prefix, lease=lease, target=ans[0], now=snap.now,
                                     observed_age=None if ages is None else (age if age is not None else 1e18))
            rec = (row if row is not None else {"verdict": None}, {})
        rows_now[rkey] = rec
        gpu.append((name, ans, rec))
    memo.nodes, memo.rows = nodes_now, rows_now
    gpu.sort(key=lambda t: t[0])

    def why(rec, v):  # judge(), remembered with the row
        j = rec[1]
        if v not in j:
            j[v] = judge(rec[0], v)
        return j[v]

    scopes: dict = {i: [] for i in range(len(objects))}
    for item in gpu:
        for i in item[1][3]:
            scopes[i].append(item)
    out: dict = {}
    all_versions: list = []
    for i, (kind, obj) in enumerate(objects):
        if not _name(obj):
            continue
        scope = scopes[i]
        for v in versions(obj, kind, prefix):
            if v not in all_versions:
                all_versions.append(v)
            key = param_key(kind, _name(obj), v)
            if key is None:
                continue  # no key: the policy refuses (fails closed)
            if not scope:
                out[key] = f"nothing to judge: {KINDS[kind]} {_name(obj)[:63]} selects no GPU node"
                continue
            blockers = [(name, w) for name, _, rec in scope if (w := why(rec, v)) is not None]
            out[key] = OK if not blockers else _blocked(blockers, len(scope))
    for v in all_versions:
        key = driver_key(v)
        if key is None:
            continue
        if not gpu:
            out[key] = "nothing to judge: no GPU node"
            continue
        blockers = [(name, w) for name, _, rec in gpu if (w := why(rec, v)) is not None]
        out[key] = OK if not blockers else _blocked(blockers, len(gpu))
    # what-if worlds: each node's driver now and in each world (from the resolver)
    verdicts: dict = {}
    for name, ans, rec in gpu:
        before, after = ans[1], ans[2]
        for (kind, oname, word, _, _), drv in zip(res.worlds, after):
            if drv == before or drv[0] == "none":
                continue
            lst = verdicts.setdefault((kind, oname, word), [])
            if drv[0] == "unknown":
                lst.append((name, f"no version to judge: {drv[1]}"[:MAX_REASON]))
                continue
            w = why(rec, drv[1])
            if w is not None:
                lst.append((name, f"{drv[1]}: {w}"[:MAX_REASON]))
    for kind, oname, word, _, _ in res.worlds:
        key = param_key(kind, oname, word)
        if key is None:
            continue
        blockers = verdicts.get((kind, oname, word), [])
        out[key] = OK if not blockers else _blocked(blockers, len(gpu))
    if snap.gpuclusters:
        names = ", ".join(sorted(_name(g)[:63] for g in snap.gpuclusters if isinstance(g, dict))[:4])
        out["gpucluster"] = f"not judged: GPUCluster {names} sets drivers compat-hook does not judge"
    return dict(sorted(out.items()))


# ----------------------------------------------------------------------------- observe and apply


def _union(*lists) -> list:
    """Nodes from several caches, one per name (the newest resourceVersion)."""
    by: dict = {}
    for objs in lists:
        for o in objs:
            name = _name(o)
            old = by.get(name)
            if old is None or _rv(old) < _rv(o):
                by[name] = o
    return list(by.values())


def _rv(obj) -> int:
    try:
        return int(_map(_map(obj).get("metadata")).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class LeaseClock:
    """When the fleet itself saw each agent's Lease change, by its own monotonic clock, as client-go's
    election judges a Lease: an agent whose clock runs a day ahead is stale one Lease after its last
    renewal all the same, and one whose clock runs behind is not taken for dead.

    A Lease the fleet did not see change (it was there at the list, when the fleet started or its watch
    was listed again) starts as old as its ``renewTime`` says, by the fleet's wall clock, and one from the
    future (beyond :data:`.status.MAX_SKEW`) starts stale: a restarted fleet never takes a dead agent for
    a live one for a whole Lease.

    >>> c = LeaseClock()
    >>> lease = {"metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"leaseDurationSeconds": 10}}
    >>> c.note(lease, 100.0), c.note(lease, 105.0), c.fresh("a", 109.0), c.fresh("a", 111.0)
    (True, False, True, False)
    >>> c.note(dict(lease, metadata={"name": "a", "resourceVersion": "2"}), 112.0)   # renewed: fresh again
    True
    >>> ahead = {"metadata": {"name": "b", "resourceVersion": "1"},
    ...          "spec": {"leaseDurationSeconds": 10, "renewTime": "2099-01-01T00:00:00Z"}}
    >>> c.note(ahead, 100.0, listed=True, wall=1e9), c.fresh("b", 100.0)
    (True, False)
    """

    def __init__(self) -> None:
        self.seen: dict = {}  # name -> [resourceVersion, monotonic time noted, age then, duration]

    def note(self, lease: dict, now: float, *, listed: bool = False, wall: float | None = None) -> bool:
        """Record ``lease`` as read at ``now`` (``listed``: from a list, not a watch event; ``wall``: the
        wall clock then); True when this may change a judgement (new, or stale until now)."""
        name, rv = _name(lease), _rv(lease)
        spec = _map(lease.get("spec"))
        dur = spec.get("leaseDurationSeconds")
        dur = float(dur) if isinstance(dur, (int, float)) and not isinstance(dur, bool) and dur > 0 else None
        old = self.seen.get(name)
        if old is not None and old[0] == rv:
            return False
        was_fresh = old is not None and self.fresh(name, now)
        age = 0.0
        if listed:
            renewed = statusmod._parse_time(spec.get("renewTime"))
            w = wall if wall is not None else now
            age = float("inf") if renewed is None or renewed - w > statusmod.MAX_SKEW else max(0.0, w - renewed)
        self.seen[name] = [rv, now, age, dur]
        return not was_fresh or old[3] != dur or not self.fresh(name, now)

    def forget(self, name: str) -> None:
        self.seen.pop(name, None)

    def age(self, name: str, now: float) -> float | None:
        got = self.seen.get(name)
        return None if got is None else now - got[1] + got[2]

    def fresh(self, name: str, now: float) -> bool:
        got = self.seen.get(name)
        return got is not None and got[3] is not None and now - got[1] + got[2] <= got[3]

    def ages(self, leases: dict, now: float) -> dict:
        """``{name: age}`` for :attr:`Snapshot.ages`, for the Leases noted at the resourceVersion ``leases``
        hold (one not noted yet has no age: stale until it is)."""
        return {name: self.age(name, now) for name, lease in leases.items()
                if name in self.seen and self.seen[name][0] == _rv(lease)}


def observe(caches: dict, now: float, ages: dict | None = None) -> Snapshot:
    """A :class:`Snapshot` of ``caches`` (``{"gpu": Reflector, "published": ..., "leases": ..., "policies":
    ..., "drivers": ..., "gpuclusters": ... (optional)}``); ``ages`` from :meth:`LeaseClock.ages`."""
    gc = caches.get("gpuclusters")
    return Snapshot(nodes=tuple(_union(caches["gpu"].objects(), caches["published"].objects())),
                    leases={_name(o): o for o in caches["leases"].objects()},
                    policies=tuple(caches["policies"].objects()), drivers=tuple(caches["drivers"].objects()),
                    now=now, ages=ages, gpuclusters=tuple(gc.objects()) if gc is not None else ())


def param_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps/{PARAM_NAME}"


def current(kube, namespace: str) -> dict | None:
    """The ConfigMap's ``data`` now (None: no ConfigMap)."""
    try:
        cm = kube.get(param_path(namespace))
    except NotFound:
        return None
    return {k: v for k, v in _map(cm.get("data")).items() if isinstance(v, str)}


def apply(kube, namespace: str, data: dict, *, current: dict | None = None, owner: dict | None = None) -> dict:
    """Write ``data`` as the ConfigMap's whole ``data``: an update of ``current`` (the ConfigMap as read)
    conditional on its ``resourceVersion`` (409 when someone wrote since: a deposed leader's late write fails,
    and so does ours after one), which also takes away every key the fleet did not write; or, with no
    ``current``, a create owned by ``owner`` (the fleet's Deployment: gone with the release). Not a
    server-side apply: that would leave a key another field manager wrote."""
    if current is not None:
        body = dict(current)
        meta = dict(_map(current.get("metadata")))
        meta.pop("managedFields", None)
        meta["labels"] = dict(_map(meta.get("labels")), **LABELS)
        body.update(apiVersion="v1", kind="ConfigMap", metadata=meta, data=data)
        body.pop("binaryData", None)
        return kube.update(param_path(namespace), body)
    meta = {"name": PARAM_NAME, "namespace": namespace, "labels": dict(LABELS)}
    if owner:
        meta["ownerReferences"] = [owner]
    return kube.create(f"/api/v1/namespaces/{namespace}/configmaps",
                       {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})


# ----------------------------------------------------------------------------- the loop


@dataclass
class FleetOptions:
    namespace: str
    identity: str
    prefix: str
    lease_seconds: int = 15
    resync: float = 5.0


def _say(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


#: The Deployment that runs the fleet (the chart's): what a recreated ConfigMap or Lease is owned by.
DEPLOYMENT = "compat-hook-fleet"


class Fleet:
    """The controller's loop (module docstring); :attr:`stop` ends it, releasing the Lease."""

    #: Changes that come in a burst (a rollout renews many Leases) are reconciled once, this much later.
    DEBOUNCE = 0.3
    #: How often the API's discovery is asked whether a GPUCluster kind is served.
    DISCOVERY = 300.0

    def __init__(self, kube, opts: FleetOptions, *, clock=None, wall=None, rng=None) -> None:
        import random
        import time

        from ..api.leader import Elector

        self.kube, self.opts = kube, opts
        self._clock, self._wall = clock or time.monotonic, wall or time.time
        self.rng = rng or random.Random()
        self.elector = Elector(kube, opts.namespace, PARAM_NAME, opts.identity, lease_seconds=opts.lease_seconds,
                               clock=self._clock, wall=self._wall, labels=LABELS, owner=self.owner)
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.applies = 0
        self.reconciles = 0
        self.caches: dict = {}
        self.leases = LeaseClock()
        self.memo = Memo()
        self._lock = threading.Lock()
        self._fresh: dict = {}  # each Lease's freshness at the last reconcile
        self._next_discovery = 0.0
        self.last_written: dict | None = None
        self._blind_since: float | None = None  # since when a cache is not current (None: all are)

    # -- what wakes the loop ---------------------------------------------------------------------------
    def _changed(self, _reflector) -> None:
        self.wake.set()

    def _lease_event(self, kind: str, obj: dict) -> None:
        """A Lease changed: note when (by our clock); wake only when that may change a judgement."""
        with self._lock:
            if kind == "DELETED":
                self.leases.forget(_name(obj))
                self.wake.set()
            elif self.leases.note(obj, self._clock(), listed=kind == "LISTED" and _name(obj) not in self.leases.seen,
                                  wall=self._wall()):
                self.wake.set()

    def owner(self) -> dict | None:
        """The ownerReference of what the fleet creates anew (its Deployment), None while that is gone: an
        uninstall is under way, and nothing is to outlive it."""
        try:
            dep = self.kube.get(f"/apis/apps/v1/namespaces/{self.opts.namespace}/deployments/{DEPLOYMENT}")
        except NotFound:
            return None
        meta = _map(dep.get("metadata"))
        if meta.get("deletionTimestamp") or not isinstance(meta.get("uid"), str):
            return None
        return {"apiVersion": "apps/v1", "kind": "Deployment", "name": DEPLOYMENT, "uid": meta["uid"]}

    def start_caches(self) -> None:
        from ..api.reflector import Reflector

        p, ns = self.opts.prefix, self.opts.namespace
        specs = {
            "gpu": ("/api/v1/nodes", {"labelSelector": f"{statusmod.PRESENT_LABEL}=true"}, False, None),
            "published": ("/api/v1/nodes", {"labelSelector": f"{p}/preflight"}, False, None),
            "leases": (f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                       {"labelSelector": statusmod.LEASE_SELECTOR}, False, self._lease_event),
            "policies": ("/apis/nvidia.com/v1/clusterpolicies", None, True, None),
            "drivers": ("/apis/nvidia.com/v1alpha1/nvidiadrivers", None, True, None),
            "param": (f"/api/v1/namespaces/{ns}/configmaps", {"fieldSelector": f"metadata.name={PARAM_NAME}"},
                      False, None),
        }
        for name, (path, query, optional, on_event) in specs.items():
            self.caches[name] = Reflector(self.kube, path, query=query, optional=optional, name=name, rng=self.rng,
                                          on_change=None if on_event else self._changed, on_event=on_event).start()

    def discover(self) -> None:
        """Start a cache of GPUClusters once discovery says the kind is served (looked for every
        :attr:`DISCOVERY` seconds)."""
        from ..api.reflector import Reflector

        if "gpuclusters" in self.caches or self._clock() < self._next_discovery:
            return
        self._next_discovery = self._clock() + jittered(self.DISCOVERY, 0.1, self.rng)
        path = statusmod.find_kind(self.kube, "nvidia.com", targetmod.GPUCLUSTER_KIND)
        if path is not None:
            self.caches["gpuclusters"] = Reflector(self.kube, path, optional=True, on_change=self._changed,
                                                   name="gpuclusters", rng=self.rng).start()
            _say("fleet_gpucluster_kind", identity=self.opts.identity, path=path)

    def healthy(self) -> bool:
        return all(c.synced.is_set() and c.healthy for c in self.caches.values())

    def param(self) -> dict | None:
        objs = self.caches["param"].objects()
        return objs[0] if objs else None

    def flipped(self) -> bool:
        """Whether some Lease's freshness changed since the last reconcile (an expiry has no event)."""
        now = self._clock()
        with self._lock:
            return any(self.leases.fresh(n, now) != f for n, f in self._fresh.items()) or \
                any(n not in self._fresh for n in self.leases.seen)

    def reconcile_once(self) -> bool:
        """One observe -> reconcile -> apply; True when it wrote."""
        now = self._clock()
        leases = {_name(o): o for o in self.caches["leases"].objects()}
        with self._lock:
            for o in leases.values():  # a Lease in the cache before its event reached us: noted now (one
                # never seen before by its renewTime, one seen at another version as changed now)
                self.leases.note(o, now, listed=_name(o) not in self.leases.seen, wall=self._wall())
            ages = self.leases.ages(leases, now)
            self._fresh = {n: self.leases.fresh(n, now) for n in self.leases.seen}
        snap = observe(self.caches, self._wall(), ages)
        data = reconcile(snap, self.opts.prefix, self.memo)
        self.reconciles += 1
        cm = self.param()
        have = {k: v for k, v in _map(_map(cm).get("data")).items()} if cm is not None else None
        if data == have:
            return False
        if not self.elector.still_leading():  # the election may have moved while reconciling
            return False
        owner = None
        if cm is None:
            owner = self.owner()
            if owner is None:
                _say("fleet_not_recreating", identity=self.opts.identity,
                     reason=f"the ConfigMap {PARAM_NAME} is gone and so is the Deployment {DEPLOYMENT}")
                return False
        foreign = sorted(k for k in (have or {}) if data.get(k) != have[k])[:20] \
            if have is not None and self.last_written is not None and have != self.last_written else []
        got = apply(self.kube, self.opts.namespace, data, current=cm, owner=owner)
        self.caches["param"].replace(got)
        self.last_written = data
        self.applies += 1
        # corrected: keys whose value someone else (a hand, a deposed leader) wrote since this leader's last write
        _say("fleet_applied", identity=self.opts.identity, keys=len(data),
             refused=sorted(k for k, v in data.items() if v != OK)[:20],
             **({"corrected": foreign} if foreign else {}), **({"recreated": True} if cm is None else {}))
        return True

    #: How long a leader's caches may stay not current before it takes back every ``ok`` it wrote: a short
    #: break (a watch that ends, a list again) changes no answer; a long one must not leave old answers.
    BLIND_AFTER = 30.0

    def withdraw_if_blind(self) -> bool:
        """While a cache is not current for :attr:`BLIND_AFTER` seconds, every key becomes "not judged": the
        fleet cannot see what changed meanwhile (a node turned ``fail``, an agent died), so no old ``ok``
        stays. True when it wrote."""
        now = self._clock()
        if self._blind_since is None:
            self._blind_since = now
        if now - self._blind_since < max(self.BLIND_AFTER, 3 * self.opts.resync):
            return False
        cm = self.param()
        have = {k: v for k, v in _map(_map(cm).get("data")).items()} if cm is not None else None
        if not have or not self.elector.still_leading():
            return False
        bad = sorted(f"{c.name}: {c.error or 'not listed yet'}"[:80] for c in self.caches.values()
                     if not (c.synced.is_set() and c.healthy))
        why = f"not judged now: the fleet controller's view is not current ({'; '.join(bad)[:200]})"
        data = {k: why for k in have}
        if data == have:
            return False
        got = apply(self.kube, self.opts.namespace, data, current=cm)
        self.caches["param"].replace(got)
        self.last_written = data
        _say("fleet_withdrawn", identity=self.opts.identity, keys=len(data), reason=why)
        return True

    def run(self) -> int:
        self.start_caches()
        backoff = Backoff(base=1.0, cap=60.0, rng=self.rng)
        next_step = next_sync = 0.0
        leading = dirty = False
        while not self.stop.is_set():
            try:
                if self.wake.is_set():  # a cache changed (a standby only notes it: it reconciles when it leads)
                    self.wake.clear()
                    dirty = True
                now = self._clock()
                if now >= next_step:
                    was = leading
                    try:
                        leading = self.elector.step()
                        next_step = now + jittered(self.elector.retry, 0.1, self.rng)
                        backoff.reset()
                        if leading and not was:
                            _say("fleet_leading", identity=self.opts.identity)
                            next_sync, dirty = 0.0, True
                    except KubeError as e:
                        leading = self.elector.still_leading()
                        next_step = now + backoff.next(getattr(e, "retry_after", None))
                        _say("fleet_error", identity=self.opts.identity, error=str(e)[:300])
                    if was and not leading:
                        _say("fleet_standby", identity=self.opts.identity, leader=self.elector.holder,
                             reason="renew deadline passed" if self.elector.holder in (None, self.opts.identity)
                             else "another replica holds the Lease")
                if leading and not self.elector.still_leading():  # no renewal within the deadline: stop writing
                    leading = False
                    _say("fleet_standby", identity=self.opts.identity, leader=None, reason="renew deadline passed")
                if leading:
                    self.discover()
                    if self.healthy():
                        self._blind_since = None
                    else:  # a watch broken for long: no old "ok" stays (an expiry has no event either)
                        self.withdraw_if_blind()
                if leading and (dirty or (now >= next_sync and self.flipped())):
                    if dirty:
                        self.stop.wait(self.DEBOUNCE)  # a burst of changes: one reconcile
                        self.wake.clear()
                    if self.healthy():
                        dirty = False
                        try:
                            self.reconcile_once()
                            next_sync = self._clock() + self.opts.resync
                        except KubeError as e:
                            dirty = True  # a 409 (someone wrote first): read again and retry
                            next_sync = self._clock() + backoff.next(getattr(e, "retry_after", None))
                            _say("fleet_error", identity=self.opts.identity, error=str(e)[:300])
                    else:
                        next_sync = self._clock() + 1.0  # a cache is catching up: look again soon
                elif leading and now >= next_sync:
                    next_sync = now + self.opts.resync
                until = min(next_step, next_sync) if leading else next_step
                if dirty and leading:
                    until = min(until, self._clock() + 1.0)
                self.wake.wait(max(0.05, until - self._clock()))
            except Exception as e:  # one bad object or a bug must not end the loop: say it, back off, go on
                _say("fleet_error", identity=self.opts.identity, error=f"{type(e).__name__}: {str(e)[:300]}")
                self.stop.wait(backoff.next())
        for c in self.caches.values():
            c.stop.set()
        released = self.elector.release()
        _say("fleet_stopped", identity=self.opts.identity, released=released)
        return 0

    def request_stop(self) -> None:
        self.stop.set()
        self.wake.set()


#: Seconds the stop may take after SIGTERM (the Lease's release is one request) before the process ends.
STOP_GRACE = 3.0


def run(kube_factory, opts: FleetOptions) -> int:
    """The controller until SIGTERM or SIGINT (exit 0, the Lease released)."""
    import os
    import signal

    fleet = Fleet(kube_factory(), opts)
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, _frame):
            fleet.request_stop()
            t = threading.Timer(STOP_GRACE, lambda: (sys.stdout.flush(), os._exit(0)))
            t.daemon = True
            t.start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    _say("fleet_started", identity=opts.identity, namespace=opts.namespace, lease_seconds=opts.lease_seconds)
    return fleet.run()
