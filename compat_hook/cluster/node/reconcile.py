"""The agent's reconcile: from what a pass observed to what its Node should say (pure: no clock, no I/O).

A pass of the node agent is observe → reconcile → intent → apply (:meth:`.agent.Agent.run_pass`):

1. **observe**: a :class:`Snapshot` of the caches (its Node, the pods bound to it, the
   ClusterPolicies and NVIDIADrivers, whether every watch is current), and what the node itself
   says: the target driver (:mod:`.target`), the GPU workloads (:mod:`.pods`), their images in the
   node's store assessed by ``plan`` on the driver now and the target (:mod:`.predict`);
2. **reconcile** (this module): :func:`findings` (what the pass found, whatever the Node says) and
   :func:`reconcile` (the Node's keys: the verdict labels, the ``<prefix>/preflight`` annotation,
   the gate, :mod:`.gate`; the regressing workloads' record, :mod:`.holds`), from the Node's
   metadata as read, the findings, the :class:`Settings`, the agent's own last word and ``now``;
3. **intent** (:mod:`.intent`, pure): every output of the pass as one value, the requests that
   make the Node say those keys (:mod:`.nodeapply`) among them;
4. **apply** (:mod:`.applyintent`, the agent's only writer): server-side apply of those keys,
   conditional on the Node's resourceVersion (a Node changed since it was read is read again and
   reconciled again), then the other outputs.

State lives on the Node: the last published doc (``<prefix>/preflight``: the gate, the
regressions' key, ``released_by``, the ``held`` record with each absent workload's clock) is what
a restarted agent reconciles from, so it agrees with the one before it. A hold ``cluster release``
took off is the one thing the Node alone cannot say whose it is. The release removes the hold's
pair and the doc; an agent still running then writes back a doc saying ``released-by-other`` with
``released_by: release``, and does not hold again for the same regressions. That doc must bind the
agents of the same installation only: the release runs under ``helm uninstall`` (its pre-delete
Job, the agents still running), and with ``release.keepPublished`` nothing removes that doc, so the
next ``helm install``'s agents would read it and never hold that node. So the doc names the
installation (``agent``: the uid of the DaemonSet that runs the agent's pod, :func:`installation`,
found from the pod its token is bound to) and is honoured by an agent of the same installation
(restarted, or its pod replaced by a rollout) and by the process that wrote it; an agent installed
again, or one run by hand (no pod), starts fresh. A release meant for good is the override
annotation or the gate turned off.

>>> st = Settings(prefix="p.io", gate=True, quiet=0.0, interval=300.0, details="ns/n")
>>> f = Findings(counts=dict(_COUNTS, workloads=1, assessed=1, regressions=1), problems=(), reasons=("regression",),
...              complete=True, verdict="fail", regressing={"w1": "r/a:1"}, judged=frozenset({"w1"}),
...              present=frozenset({"w1"}), unjudged=(), target="470", target_from="--driver", now="535.1",
...              blocked=None, current=True)
>>> d = reconcile({"labels": {}, "annotations": {}}, f, st, now=1000.0)
>>> d.gate.state, d.keys["labels"]["nvidia.com/gpu-driver-upgrade.skip"], d.keys["labels"]["p.io/preflight"]
('held', 'true', 'fail')
>>> sorted(d.keys["annotations"]), d.doc["held"]
(['p.io/holds-upgrade', 'p.io/preflight'], {'target': '470', 'w': {'w1': ['r/a:1', None]}})

The workload's pod gone a moment later (recreated, evicted): the record, read back from the Node,
keeps the hold until it has been absent for the quiet time.

>>> def written(d):  # the Node once the keys are applied
...     return {kind: {k: v for k, v in d.keys[kind].items() if v is not None} for kind in d.keys}
>>> quiet = Settings(**dict(vars_of(st), quiet=60.0))
>>> gone = Findings(**dict(vars_of(f), counts=dict(_COUNTS), verdict="pass", regressing={}, judged=frozenset(),
...                        present=frozenset(), reasons=()))
>>> d2 = reconcile(written(d), gone, quiet, now=1010.0)
>>> d2.gate.state, d2.verdict, d2.counts["absent_regressions"], d2.next_expiry
('held', 'fail', 1, 1070.0)
>>> d3 = reconcile(written(d2), gone, quiet, now=1080.0)
>>> d3.gate.state, d3.keys["labels"]["nvidia.com/gpu-driver-upgrade.skip"], d3.keys["annotations"]["p.io/holds-upgrade"]
('clear', None, None)

A restarted agent (no word of its own) reads the same clock from the Node:

>>> reconcile(written(d2), gone, quiet, now=1020.0).gate.state
'held'
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass

from ...core import safejson
from . import gate as gatemod
from . import holds, verdicts, nodedoc

__all__ = ["Snapshot", "Settings", "Findings", "Desired", "findings", "reconcile", "installation", "node_doc_of",
           "regressions_key",
           "MAX_NODE_ANNOTATION"]

MAX_NODE_ANNOTATION = 64 << 10
_COUNTS = {"workloads": 0, "assessed": 0, "regressions": 0, "broken_now_and_after": 0, "changed": 0,
           "unreadable": 0, "unknown_workloads": 0, "not_in_store": 0, "pods": 0}


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def vars_of(obj) -> dict:
    """A dataclass's fields as a dict (for a changed copy)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


@dataclass(frozen=True)
class Snapshot:
    """What a pass reads from the caches (or directly, ``--once``): its Node, the pods bound to it,
    the ClusterPolicies and NVIDIADrivers, why a cache is not current (None: all are), and the
    ResourceClaims a pod's claim is judged by (:class:`..workload.runs.Claims`; None: not read, every
    claim counts)."""

    node: dict
    pods: list
    policies: list
    drivers: list
    stale: str | None = None
    claims: object = None


@dataclass(frozen=True)
class Settings:
    """What reconcile needs of the config and the options: the label prefix, whether the gate is on,
    the hold's quiet time (:func:`.holds.quiet_s`), the agent's interval, where the details are
    (``namespace/name``), the label prefix of the agent before this one (None: the same), the
    registration path to say (None: the label is left as it is), and the agent's installation
    (:func:`installation`; None: unknown)."""

    prefix: str
    gate: bool
    quiet: float
    interval: float
    details: str
    former_prefix: str | None = None
    registration: str | None = None
    installation: str | None = None


@dataclass(frozen=True)
class Findings:
    """What a pass found, whatever its Node says: the counts, problems and reason codes, whether it
    is complete, the verdict before the record of absent workloads (``verdict``), the regressing
    workloads (id -> image), the ids judged and present, what could not be judged (by name), the
    target (version, where from), the driver now, why a hold cannot work (``blocked``) and whether
    the view of the pods is current."""

    counts: dict
    problems: tuple
    reasons: tuple
    complete: bool
    verdict: str
    regressing: dict
    judged: frozenset
    present: frozenset
    unjudged: tuple
    target: object
    target_from: object
    now: object
    blocked: str | None
    current: bool
    #: what kept the pass from being complete (reason codes; empty when complete)
    incomplete: tuple = ()


@dataclass(frozen=True)
class Desired:
    """What the Node should say: ``keys`` (``{"labels": {key: value or None}, "annotations": ...}``,
    the keys compat-hook governs there, None: absent), the ``doc`` in ``<prefix>/preflight``, the
    ``verdict``, the ``gate`` (:class:`.gate.Gate`), the ``counts`` with the absent regressions,
    ``previous`` (the doc the Node had), ``next_expiry`` (when an absent workload stops counting)."""

    keys: dict
    doc: dict
    verdict: str
    gate: gatemod.Gate
    counts: dict
    previous: dict | None
    next_expiry: float | None


def node_doc_of(meta: dict, prefix: str) -> dict | None:
    """The agent's doc in the Node's ``<prefix>/preflight`` annotation (None: none, or not one).

    >>> node_doc_of({"annotations": {"p/preflight": '{"v": 2, "gate": "held"}'}}, "p")
    {'v': 2, 'gate': 'held'}
    >>> node_doc_of({"annotations": {"p/preflight": '{"v": 1}'}}, "p") is None
    True
    """
    raw = _map(meta.get("annotations")).get(f"{prefix}/preflight")
    doc, _ = safejson.parse_object(raw, max_bytes=MAX_NODE_ANNOTATION)  # bounded: anyone may have written it
    return doc if doc is not None and doc.get("v") == 2 else None


def regressions_key(target, ids) -> str:
    """What the regressions are: the target and the regressing workloads' ids (:func:`.holds.workload_id`:
    identities, never pods' names; those recorded while absent included), as a short hash.

    >>> regressions_key("570", ["b", "a"]) == regressions_key("570", ["a", "b"]) != regressions_key("580", ["a", "b"])
    True
    """
    return hashlib.sha256("\0".join([str(target)] + sorted(ids)).encode()).hexdigest()[:12]


def _rfc3339(t: float) -> str:
    """RFC 3339 of ``t``, clamped to what ``gmtime`` takes (a clock read back from the Node may be any number).

    >>> _rfc3339(0), _rfc3339(1e300)
    ('1970-01-01T00:00:00Z', '9999-12-31T23:59:59Z')
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(min(max(float(t), 0.0), 253402300799.0)))


def findings(snap: Snapshot, *, target, workloads, assessment, settings: Settings) -> Findings:
    """What the pass found (see :class:`Findings`) from the snapshot, the node's :class:`.target.Target`,
    its :class:`.pods.Workloads` and their :class:`.predict.Assessment`."""
    tgt, ws, a = target, workloads, assessment
    c = verdicts.counts(a.rows)
    c["not_in_store"] = len(a.missing)
    c["pods"] = len(snap.pods)
    reasons, problems = [], []
    if tgt.problem:
        problems.append(tgt.problem)
        reasons.append(tgt.reason)
    problems += a.problems
    reasons += a.reasons
    if ws.dropped:
        problems.append(f"{ws.dropped} GPU container(s) or pod(s) left out (more than the agent reads, or an "
                        f"image reference that is not one)")
        reasons.append("left_out")
    if snap.stale:
        problems.append(f"watch not current: {snap.stale}")
        reasons.append("cache_not_current")
    old = settings.former_prefix
    if old and old != settings.prefix and \
            f"{old}/holds-upgrade" in _map(_map(snap.node.get("metadata")).get("annotations")):
        # The hold an agent published under its former label_prefix: not ours to touch any more (the
        # admission policy allows only the current prefix), and it holds the node until released.
        name = _map(snap.node.get("metadata")).get("name")
        problems.append(f"a hold under the former label prefix {old} remains: release it with "
                        f"compat-hook cluster release --node {name} --prefix {old}")
        reasons.append("former_prefix_hold")
    for code, n in (("regression", c["regressions"]), ("broken_now_and_after", c["broken_now_and_after"]),
                    ("changed", c["changed"]), ("unreadable", c["unreadable"]),
                    ("unknown_workload", c["unknown_workloads"])):
        if n:
            reasons.append(code)
    incomplete = tuple(code for code, bad in (
        ("no_target", tgt.version is None), ("no_report", a.report is None), ("store_unreachable", not a.reachable),
        ("not_in_store", bool(a.missing)), ("unreadable", bool(c["unreadable"])),
        ("unknown_workload", bool(c["unknown_workloads"])), ("left_out", bool(ws.dropped)),
        ("cache_not_current", bool(snap.stale)), ("problem", bool(a.problems))) if bad)
    complete = not incomplete
    verdict0 = verdicts.verdict(c, target_known=tgt.version is not None, report=a.report is not None,
                               incomplete=not complete)
    ids = {w["name"]: holds.workload_id(w) for w in ws.items}
    judged = frozenset(ids[r["name"]] for r in a.rows if r.get("name") in ids)
    regressing = {ids[r["name"]]: str(r.get("workload_image")) for r in a.rows
                  if r.get("name") in ids and verdicts.regression(r)}
    # what could not be judged, by name (the gate's message says it beside a hold)
    unk = ws.unknown()
    unjudged = tuple([f"{w['name']}: {w['unknown']}" for w in unk[:2]] + (
        [f"and {len(unk) - 2} more unknown workload(s)"] if len(unk) > 2 else []))
    return Findings(counts=c, problems=tuple(problems), reasons=tuple(reasons), complete=complete, verdict=verdict0,
                    regressing=regressing, judged=judged, present=frozenset(ids.values()), unjudged=unjudged,
                    target=tgt.version, target_from=tgt.where, now=a.now, blocked=tgt.blocked,
                    current=not snap.stale, incomplete=incomplete)


def installation(pods: list, pod_uid: str | None) -> str | None:
    """The agent's installation: the uid of the controller (the DaemonSet) of its own pod, the pod
    whose uid is ``pod_uid`` among those bound to its node (None: no such pod, or none controls it).

    >>> pod = {"metadata": {"uid": "p1", "ownerReferences": [{"kind": "DaemonSet", "uid": "d1", "controller": True}]}}
    >>> installation([{"metadata": {}}, pod], "p1"), installation([pod], "p2"), installation([pod], None)
    ('d1', None, None)
    """
    if not pod_uid:
        return None
    for p in pods:
        meta = _map(_map(p).get("metadata"))
        if meta.get("uid") != pod_uid:
            continue
        for ref in meta.get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("controller") and isinstance(ref.get("uid"), str):
                return ref["uid"][:64]
    return None


def _previous(on_node: dict | None, own: dict | None, installation: str | None = None) -> dict | None:
    """The last word the gate goes on: this process's own (``own``), else the Node's doc; a release's
    only for the installation that wrote it (the module docstring says why).

    >>> released = {"gate": "released-by-other", "released_by": "release", "agent": "d1"}
    >>> _previous(released, None, "d1") is released, _previous(released, None, "d2"), _previous(released, None)
    (True, None, None)
    """
    if own is not None:
        return own
    if on_node is not None and on_node.get("released_by") == "release" and \
            (installation is None or on_node.get("agent") != installation):
        return None
    return on_node


def reconcile(meta: dict, f: Findings, st: Settings, *, now: float, own: dict | None = None) -> Desired:
    """What the Node whose metadata is ``meta`` should say (:class:`Desired`), after findings ``f``;
    ``own``: the doc this process last decided under ``st.prefix`` (None: none yet); ``now``: epoch
    seconds."""
    prefix = st.prefix
    prev = node_doc_of(meta, prefix)
    previous = _previous(prev, own, st.installation)
    # The regressing workloads, recorded: one no pod runs for a moment (a pod recreated, evicted, a Job
    # between pods) still counts until it has been absent for the quiet time.
    rec = holds.track(_map(previous).get("held"), target=f.target, regressing=f.regressing, present=set(f.present),
                      judged=set(f.judged), now=now, quiet=st.quiet, current=f.current, complete=f.complete)
    absent = rec.absent
    c = f.counts
    cn = dict(c, regressions=c["regressions"] + len(absent), absent_regressions=len(absent))
    verdict = "fail" if absent and f.verdict in ("pass", "warn") else f.verdict
    key = regressions_key(rec.target, list(rec.entries))  # a pass without a target: the record's
    if verdict == "fail":
        # Images, not pods: the hold's reason changes (a Node write) only when the regressions do.
        regs = sorted({e["image"] for e in rec.entries.values()})
        why = (f"{cn['regressions']} workload(s) regress on driver {f.target}: " + "; ".join(regs[:3])
               + (f" and {len(regs) - 3} more image(s)" if len(regs) > 3 else ""))
        if absent:
            why += f" ({len(absent)} run by no pod now, counted until {_rfc3339(rec.next_expiry)} at the earliest)"
    else:
        why = "; ".join(f.problems) or verdict
    g = gatemod.decide(meta, verdict=verdict, complete=f.complete, why=why, enabled=st.gate, prefix=prefix,
                       blocked=f.blocked, key=key, previous=previous,
                       problem="; ".join(f.problems + f.unjudged) or
                       "reasons " + ", ".join(sorted(set(f.reasons) - {"regression"})))
    doc = nodedoc.node_doc(verdict_=verdict, target=f.target, target_from=f.target_from, now=f.now, gate=g.state,
                           c=cn, reasons=sorted(set(f.reasons)), key=key, interval=st.interval, details=st.details,
                           since=_rfc3339(now), released_by=g.released_by if g.state == "released-by-other" else None,
                           held=rec.doc(), agent=st.installation, complete=f.complete, incomplete=list(f.incomplete))
    if nodedoc.same_node_doc(prev, doc):
        doc["since"] = prev.get("since", doc["since"])
    keys = nodedoc.node_keys(prefix=prefix, doc=doc, gate=g, current=meta, registration=st.registration)
    return Desired(keys=keys, doc=doc, verdict=verdict, gate=g, counts=cn, previous=prev, next_expiry=rec.next_expiry)
