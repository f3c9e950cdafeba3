"""What a pass publishes, and where: the Node stays quiet, the details and the heartbeat live apart.

Every write to a Node reaches every Node watcher of the cluster (scheduler,
controller-manager, CNI agents, the GPU Operator), so the Node carries only
what changes with the verdict (:func:`node_doc`, :func:`node_keys`, written by
:mod:`.nodeapply`):

* labels ``<prefix>/preflight`` (``pass``/``warn``/``fail``/``unknown``),
  ``<prefix>/preflight.broken`` (the regressions), ``<prefix>/preflight.target-driver``,
  and under the chart ``<prefix>/registration`` (:data:`REGISTRATIONS`: how the node's containerd
  reaches compat-hook, as its installer says);
* the annotation ``<prefix>/preflight``: a small JSON (at most :data:`MAX_NODE_DOC`
  bytes: verdict, target and where from, driver now, gate state, counts, reason
  codes, when it last changed, the agent's interval, where the details are, and
  ``held``: the regressing workloads with when each was last missed, :mod:`.holds`).

A pass writes to the Node only when that changes: the verdict, the target
(and where from), the driver now, the gate and the hold's reason, the counts,
the reason codes, or the regressions' key (what the regressing workloads are,
never their pods' names); pods replaced under new names write nothing. The rest goes to objects of the agent's own, in its
namespace, named after the node:

* a ConfigMap (:func:`details_doc`): every workload that regresses, with its
  pods; those broken now and after; those not in the store, unreadable or not
  assessable; written only when it changes;
* a Lease (:func:`lease`): the heartbeat, renewed after every pass
  (``leaseDurationSeconds`` = 2 x interval): ``cluster status`` reads a verdict
  whose Lease expired as stale;
* an Event on the Node (:func:`event`) when the verdict, the gate or the
  regressions change: in the namespace ``default`` (:data:`EVENT_NAMESPACE`),
  where ``kubectl describe node`` finds it.

The verdict of a pass (:func:`verdict`) over the assessed workloads:

* ``fail``: a workload that works on the node's driver now breaks on the target
  (a regression);
* ``warn``: no regression, but an outcome changes, a workload is broken now and
  after (reported, never held: the upgrade makes it no worse), or something
  could not be read or assessed;
* ``pass``: every workload keeps its outcome;
* ``unknown``: no target, or the node's driver is unknown.

>>> c = counts([{"now": {"outcome": "compat"}, "after": {"outcome": "broken"}, "regression": True},
...             {"now": {"outcome": "broken"}, "after": {"outcome": "broken"}}])
>>> (c["regressions"], c["broken_now_and_after"], verdict(c, target_known=True, report=True))
(1, 1, 'fail')
>>> verdict(counts([{"now": {"outcome": "broken"}, "after": {"outcome": "broken"}}]), target_known=True, report=True)
'warn'
"""

from __future__ import annotations

import json
import os

from ...core import safejson

__all__ = ["REGISTRATIONS", "verdict", "counts", "regression", "node_doc", "node_keys", "details_doc", "lease", "event",
           "event_signature", "label_value", "nfd_text", "textfile_text", "write_file", "MAX_NODE_DOC",
           "EVENT_NAMESPACE"]

#: The Node annotation's largest size.
MAX_NODE_DOC = 4096
#: The details ConfigMap's JSON, at most (a ConfigMap holds 1 MiB).
MAX_DETAILS = 256 << 10
MAX_STR = 200
DETAILS_KEY = "preflight.json"
#: Where an Event about a Node goes. The API server takes a core/v1 Event whose involvedObject has no
#: namespace (a cluster-scoped object) only in ``default`` (``kube-system`` too through events.k8s.io);
#: in another namespace it must name that namespace, and ``kubectl describe node``, which selects
#: ``involvedObject.namespace=""``, never shows it. The kubelet writes its Node Events there too.
EVENT_NAMESPACE = "default"
#: ``<prefix>/registration``: the NRI plugin, the same with the plugin gone from containerd's plugin
#: dir (GPU containers start without compat-hook), or the runtime the RuntimeClass names.
REGISTRATIONS = ("nri", "nri-not-connected", "runtimeclass")
COMPONENT_LABELS = {"app.kubernetes.io/name": "compat-hook", "app.kubernetes.io/component": "preflight"}


def _s(v, n: int = MAX_STR):
    if v is None:
        return None
    t = "".join(c if c.isprintable() else "?" for c in str(v))
    return t if len(t) <= n else t[:n] + "..."


def _outcome(r) -> str | None:
    return r.get("outcome") if isinstance(r, dict) else None


def regression(row: dict) -> bool:
    """The policy layer's ``regression`` of a row; where a row lacks it, the same rule: works now,
    broken after (the target differs from the driver now, or the row would not break)."""
    if "regression" in row:
        return bool(row["regression"])
    return _outcome(row.get("now")) not in (None, "broken") and _outcome(row.get("after")) == "broken"


def counts(rows: list) -> dict:
    """The counts a verdict is made of, over the workload rows of a plan report."""
    c = {"workloads": len(rows), "assessed": 0, "regressions": 0, "broken_now_and_after": 0, "changed": 0,
         "unreadable": 0, "unknown_workloads": 0}
    for r in rows:
        if r.get("unknown"):
            c["unknown_workloads"] += 1
            continue
        if r.get("now") is None or r.get("after") is None:
            c["unreadable"] += 1
            continue
        c["assessed"] += 1
        now, after = _outcome(r["now"]), _outcome(r["after"])
        if regression(r):
            c["regressions"] += 1
        elif now == "broken" and after == "broken":
            c["broken_now_and_after"] += 1
        if now != after:
            c["changed"] += 1
    return c


def verdict(c: dict, *, target_known: bool, report: bool, incomplete: bool = False) -> str:
    if not target_known or not report:
        return "unknown"
    if c["regressions"]:
        return "fail"
    if (c["changed"] or c["unreadable"] or c["unknown_workloads"] or c["broken_now_and_after"]
            or c.get("not_in_store") or incomplete):
        return "warn"
    return "pass"


def label_value(v) -> str | None:
    """``v`` as a label value (63 chars of [A-Za-z0-9._-], alphanumeric at both ends), else None.

    >>> label_value("550.163.01"), label_value("a b"), label_value(None)
    ('550.163.01', None, None)
    """
    if v is None:
        return None
    t = str(v)
    ok = 0 < len(t) <= 63 and t[0].isalnum() and t[-1].isalnum() and t.isascii() and \
        all(c.isalnum() or c in "._-" for c in t)
    return t if ok else None


def node_doc(*, verdict_: str, target, target_from, now, gate: str, c: dict, reasons: list, key: str,
             interval: float, details: str, since: str, released_by: str | None = None,
             held: dict | None = None, agent: str | None = None, complete: bool = False,
             incomplete: list | None = None) -> dict:
    """The Node's small annotation (see the module docstring); ``since`` is when it last changed;
    ``released_by``: how a ``released-by-other`` gate came (:class:`~.gate.Gate`); ``held``: the
    regressing workloads' record (:meth:`.holds.Record.doc`), what a restarted agent goes on;
    ``agent``: the installation that saw a release (:func:`.reconcile.installation`; said only
    with ``released_by: release``); ``complete``: whether the pass read everything it needed (only a
    complete verdict is a judgement, for the fleet and ``cluster status``), ``incomplete`` what kept it
    from that (reason codes)."""
    doc = {"v": 2, "verdict": verdict_, "complete": bool(complete), "target": _s(target, 64), "from": _s(target_from, 160), "now": _s(now, 64),
           "gate": gate, "regressions": c.get("regressions", 0), "broken_now": c.get("broken_now_and_after", 0),
           "reasons": [_s(r, 32) for r in reasons[:12]], "key": key, "interval": int(interval),
           "details": _s(details, 320), "since": since}
    if not complete:
        doc["incomplete"] = [_s(r, 32) for r in (incomplete or ["unknown"])[:8]]
    if released_by:
        doc["released_by"] = _s(released_by, 16)
        if released_by == "release" and agent:
            doc["agent"] = _s(agent, 64)
    if held:
        doc["held"] = {"target": held.get("target"), "w": dict(held.get("w") or {})}
    while len(json.dumps(doc, separators=(",", ":"))) > MAX_NODE_DOC and doc["reasons"]:
        doc["reasons"].pop()
    while len(json.dumps(doc, separators=(",", ":"))) > MAX_NODE_DOC and doc.get("held", {}).get("w"):
        doc["held"]["w"].popitem()  # the last: the longest absent (the present ones come first)
    return doc


def same_node_doc(a, b) -> bool:
    """Whether two Node docs say the same (``since`` aside)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return {k: v for k, v in a.items() if k != "since"} == {k: v for k, v in b.items() if k != "since"}


def node_keys(*, prefix: str, doc: dict, gate, current: dict, registration: str | None = None) -> dict:
    """The keys compat-hook governs on the Node, as they should be after this pass:
    ``{"labels": {key: value or None}, "annotations": {...}}`` (None: absent), for
    :func:`.nodeapply.plan`. ``current``: the Node's metadata; ``gate``: the :class:`~.gate.Gate`
    (its changes); ``registration``: the ``<prefix>/registration`` label's value (None: left as it
    is). The skip label is among them only while it is compat-hook's (with ``<prefix>/holds-upgrade``)
    before or after: someone else's is never named, so never written or removed. The annotation keeps
    its text when only ``since`` would change (not a change).

    >>> from .gate import Gate
    >>> k = node_keys(prefix="p", doc={"verdict": "pass", "target": "a b", "regressions": 0}, gate=Gate("clear"),
    ...               current={"labels": {"nvidia.com/gpu-driver-upgrade.skip": "true", "p/registration": "nri"}})
    >>> k["labels"]
    {'p/preflight': 'pass', 'p/preflight.target-driver': None, 'p/preflight.broken': '0', 'p/registration': 'nri'}
    """
    have_l = current.get("labels") if isinstance(current.get("labels"), dict) else {}
    have_a = current.get("annotations") if isinstance(current.get("annotations"), dict) else {}
    from .gate import SKIP_LABEL

    hold = f"{prefix}/holds-upgrade"
    reg = f"{prefix}/registration"
    labels = {f"{prefix}/preflight": doc["verdict"], f"{prefix}/preflight.target-driver": label_value(doc["target"]),
              f"{prefix}/preflight.broken": str(doc["regressions"]),
              reg: registration if registration in REGISTRATIONS else have_l.get(reg)}
    text = json.dumps(doc, separators=(",", ":"))
    old = have_a.get(f"{prefix}/preflight")
    if isinstance(old, str) and same_node_doc(safejson.parse_object(old)[0], doc):
        text = old  # only ``since`` differs: not a change
    annotations = {f"{prefix}/preflight": text, hold: have_a.get(hold)}
    annotations.update(gate.annotations)
    if hold in have_a and have_l.get(SKIP_LABEL) == "true":  # our hold: kept, or lifted with its annotation
        labels[SKIP_LABEL] = "true"
    labels.update(gate.labels)
    return {"labels": labels, "annotations": annotations}


def _row(r: dict, pods: dict) -> dict:
    a = r.get("after") if isinstance(r.get("after"), dict) else {}
    n = r.get("now") if isinstance(r.get("now"), dict) else {}
    name = r.get("name") or r.get("image")
    return {"name": _s(name, 400), "image": _s(r.get("workload_image") or r.get("image"), 400),
            "pods": list(pods.get(name, []))[:20], "runtime": _s(r.get("runtime"), 32),
            "now": _s(n.get("outcome"), 32), "after": _s(a.get("outcome"), 32), "reason": _s(a.get("reason"), 64),
            "error": a.get("error"), "cuda": _s(a.get("cuda"), 16), "needs": _s(r.get("needs_cuda"), 16)}


def details_doc(*, node: str, verdict_: str, complete: bool, target, target_from, now, gate, gate_message: str,
                problem, reasons: list, interval: float, c: dict, rows: list, pods: dict, missing: list,
                pods_seen: int, workloads: list | None = None) -> dict:
    """The ConfigMap's details (bounded to :data:`MAX_DETAILS` bytes; ``truncated`` when cut)."""
    def listed(pred):
        return [_row(r, pods) for r in rows if pred(r)]

    doc = {"version": 2, "node": _s(node, 253), "verdict": verdict_, "complete": complete, "target": _s(target, 64),
           "target_from": _s(target_from, 400), "now": _s(now, 64), "gate": gate,
           "gate_message": _s(gate_message, 1024), "problem": _s(problem, 2048), "reasons": reasons[:20],
           "interval": int(interval), "pods": pods_seen, "counts": dict(c),
           "regressions": listed(regression),
           "broken_now_and_after": listed(lambda r: not regression(r) and _outcome(r.get("now")) == "broken"
                                          and _outcome(r.get("after")) == "broken"),
           "changed": listed(lambda r: not regression(r) and r.get("now") is not None and r.get("after") is not None
                             and _outcome(r["now"]) != _outcome(r["after"])),
           "unreadable": [{"name": _s(r.get("name") or r.get("image"), 400), "error": _s(r.get("error"), 400),
                           "pods": list(pods.get(r.get("name"), []))[:20]}
                          for r in rows if not r.get("unknown") and (r.get("now") is None or r.get("after") is None)],
           "unknown_workloads": [{"name": _s(w["name"], 400), "why": _s(w["unknown"], 400),
                                  "pods": list(pods.get(w["name"], []))[:20]} for w in (workloads or []) if w.get("unknown")],
           "not_in_store": [{"image": _s(img, 400), "pods": list(p)[:20]} for img, p in missing]}
    for key in ("changed", "not_in_store", "unreadable", "unknown_workloads", "broken_now_and_after", "regressions"):
        while len(json.dumps(doc, separators=(",", ":"))) > MAX_DETAILS and doc[key]:
            doc[key].pop()
            doc["truncated"] = True
    return doc


def configmap(*, name: str, namespace: str, doc: dict, when: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(COMPONENT_LABELS)},
            "data": {DETAILS_KEY: json.dumps(dict(doc, time=when), separators=(",", ":"), sort_keys=True)}}


def details_of(cm: dict) -> dict | None:
    """The details doc of a ConfigMap (None: none, or not ours)."""
    raw = cm.get("data").get(DETAILS_KEY) if isinstance(cm.get("data"), dict) else None
    return safejson.parse_object(raw, max_bytes=2 * MAX_DETAILS)[0]  # bounded: anyone may have written it


def microtime(t: float) -> str:
    """A Kubernetes MicroTime (``2026-12-03T22:32:00.123456Z``).

    >>> microtime(0.5)
    '1970-01-01T00:00:00.500000Z'
    """
    import time as _t

    return _t.strftime("%Y-%m-%dT%H:%M:%S", _t.gmtime(t)) + f".{int(round((t % 1) * 1e6)) % 1000000:06d}Z"


def lease(*, name: str, namespace: str, interval: float, now: float, acquired: str | None = None,
          resource_version: str | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, "labels": dict(COMPONENT_LABELS)}
    if resource_version:
        meta["resourceVersion"] = resource_version
    t = microtime(now)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": max(2, int(round(2 * interval))),
                     "renewTime": t, "acquireTime": acquired or t}}


def event_signature(doc: dict) -> str:
    """What an Event is emitted for: the verdict, the gate, the regressions (not the target alone).

    >>> event_signature({"verdict": "fail", "gate": "held", "key": "k", "regressions": 2, "reasons": ["x"]})
    'fail|held|k|2'
    """
    key = doc.get("key") if doc.get("verdict") == "fail" else ""
    return "|".join(str(x) for x in (doc.get("verdict"), doc.get("gate"), key, doc.get("regressions")))


def event(*, node: dict, details: dict, when: str, warning_reason: str | None = None) -> dict:
    """A core/v1 Event on the Node, for :data:`EVENT_NAMESPACE` (reason ``CompatHookPreflight``; Warning
    on ``fail``, on a gate that cannot hold, and on a bad announcement).

    >>> e = event(node={"metadata": {"name": "gpu-a", "uid": "u1"}}, when="2026-12-03T10:00:00Z",
    ...           details={"verdict": "pass", "target": "580.95.05", "gate": "clear", "counts": {}})
    >>> e["metadata"]["namespace"], e["involvedObject"], e["type"]
    ('default', {'kind': 'Node', 'name': 'gpu-a', 'uid': 'u1', 'apiVersion': 'v1'}, 'Normal')
    """
    meta = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
    name = str(meta.get("name"))
    d = details
    c = d.get("counts") or {}
    if d["verdict"] == "fail":
        listed = "; ".join(f"{r['image']} ({', '.join(r['pods'][:3]) or '-'}): {r['now']} -> broken"
                           f"{' (' + str(r['error']) + ')' if r.get('error') is not None else ''}"
                           for r in d["regressions"][:3])
        msg = f"preflight fail for driver {d['target']}: {c.get('regressions')} workload(s) regress: {listed}"
    elif d["verdict"] == "unknown":
        msg = f"preflight unknown: {d.get('problem') or 'no target'}"
    else:
        msg = (f"preflight {d['verdict']} for driver {d['target']}: {c.get('workloads', 0)} workload(s), "
               f"{c.get('changed', 0)} change outcome, {c.get('broken_now_and_after', 0)} broken now and after, "
               f"{c.get('unreadable', 0) + c.get('not_in_store', 0) + c.get('unknown_workloads', 0)} not assessed")
    if d["gate"] == "held":
        msg += "; holding the upgrade (nvidia.com/gpu-driver-upgrade.skip=true)"
    elif d.get("gate_message"):
        msg += f"; {d['gate_message']}"
    from .gate import WARNING

    warn = d["verdict"] == "fail" or d["gate"] in WARNING or warning_reason is not None
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name[:200]}.compat-hook-", "namespace": EVENT_NAMESPACE},
        # no namespace: the Node is cluster-scoped (EVENT_NAMESPACE says why the Event is in "default")
        "involvedObject": {"kind": "Node", "name": name, "uid": meta.get("uid"), "apiVersion": "v1"},
        "reason": "CompatHookPreflight", "message": msg[:1024],
        "type": "Warning" if warn else "Normal",
        "source": {"component": "compat-hook", "host": name},
        "firstTimestamp": when, "lastTimestamp": when, "count": 1,
        "reportingComponent": "compat-hook", "reportingInstance": name, "action": "Preflight",
    }


def nfd_text(prefix: str, doc: dict) -> str:
    """An NFD local feature file: one ``<prefix>/<name>=<value>`` per line."""
    lines = [f"{prefix}/preflight={doc['verdict']}", f"{prefix}/preflight.broken={doc['regressions']}"]
    tv = label_value(doc["target"])
    if tv:
        lines.append(f"{prefix}/preflight.target-driver={tv}")
    return "\n".join(lines) + "\n"


def textfile_text(details: dict, when_s: float, decisions: dict | None = None) -> str:
    """node_exporter textfile: workloads per outcome class on the target, the last run, decision counts."""
    c = details.get("counts") or {}
    out = ["# HELP compat_hook_preflight_workloads GPU workloads of this node by what the target driver does to them.",
           "# TYPE compat_hook_preflight_workloads gauge"]
    not_assessed = c.get("unreadable", 0) + c.get("not_in_store", 0) + c.get("unknown_workloads", 0)
    classes = {"regression": c.get("regressions", 0), "broken_now_and_after": c.get("broken_now_and_after", 0),
               "changed": max(0, c.get("changed", 0) - c.get("regressions", 0)), "not_assessed": not_assessed,
               "unchanged": max(0, c.get("assessed", 0) - c.get("changed", 0) - c.get("broken_now_and_after", 0))}
    for k in sorted(classes):
        out.append(f'compat_hook_preflight_workloads{{class="{k}"}} {classes[k]}')
    out += ["# HELP compat_hook_preflight_last_run_timestamp_seconds When the last preflight pass ended.",
            "# TYPE compat_hook_preflight_last_run_timestamp_seconds gauge",
            f"compat_hook_preflight_last_run_timestamp_seconds {when_s:.3f}"]
    out += ["# HELP compat_hook_preflight_result 1 for this node's current preflight verdict.",
            "# TYPE compat_hook_preflight_result gauge"]
    for v in ("pass", "warn", "fail", "unknown"):
        out.append(f'compat_hook_preflight_result{{result="{v}"}} {1 if details["verdict"] == v else 0}')
    if decisions:
        out += ["# HELP compat_hook_decisions Decisions in the decision log, by effect and reason.",
                "# TYPE compat_hook_decisions gauge"]
        for (effect, reason), n in sorted(decisions.items()):
            out.append(f'compat_hook_decisions{{effect="{_esc(effect)}",reason="{_esc(reason)}"}} {n}')
    return "\n".join(out) + "\n"


def _esc(v) -> str:
    return str(v)[:64].replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def write_file(path: str, text: str) -> None:
    """Temp file then rename (readers - NFD, node_exporter - never see half a file)."""
    from ...core import atomic

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic.replace(path, text.encode(), 0o644)
