"""``compat-hook cluster status``: every GPU node's driver, target, upgrade state, verdict and hold.

A GPU node is one labelled ``nvidia.com/gpu.present=true`` (the GPU Operator's
and GPU Feature Discovery's label) or one an agent has published on. The driver
now is GPU Feature Discovery's ``nvidia.com/cuda.driver-version.full``, else
what the agent read on the node.

It never passes on stale data. A node has no valid verdict (``stale``) when:

* its agent's heartbeat (the Lease of its name in the agent's namespace) is
  missing or expired: the verdict is older than twice the agent's interval;
* its verdict was computed for another target than the node's current one
  (the active ClusterPolicy's or the NVIDIADriver's version, or an announced
  ``next-driver``; read with the agent's own rules, :mod:`.target`).

The row says why. A hold whose agent has not renewed its heartbeat for three
intervals is shown as a stale hold.

Each row also shows what the validator (:mod:`.validate`) published after the
node's last driver change: ``<prefix>/validated``, the driver version its
workloads were proven on, or ``failed``; the summary counts the ``failed`` nodes.

Each row also shows how the node's containerd reaches compat-hook (PATH), as the chart's
installer said and the agent labelled it (``<prefix>/registration``): ``nri``, ``runtimeclass``,
or ``nri (not connected)`` when the NRI plugin is gone from containerd's plugin dir (GPU
containers start without compat-hook there); ``-`` without the label (installed by hand).

A node that carries compat-hook's ``<prefix>/validation-failed`` taint which its driver's
DaemonSet does not tolerate (the active ClusterPolicy's ``spec.daemonsets.tolerations``, or the
selecting NVIDIADriver's ``spec.tolerations``) says so in its NOTE (:func:`untolerated_taint`):
the DaemonSet controller counts such a node out while the driver pod still runs there, and NVIDIA's
upgrade controller then refuses the DaemonSet, so no node's upgrade moves.

Reads: Nodes, the agent's Leases, ClusterPolicies and NVIDIADrivers, each as
paginated lists of :data:`PAGE` (four requests for a thousand nodes).

Only a complete pass is a judgement: a node whose agent could not read every workload (an image not in
its store, a store it could not list, a broken watch) publishes ``warn`` with ``complete: false``, and
its NOTE says what kept it incomplete. A GPUCluster (gpu-operator v26.7's DRA resource) is found by
discovery and said on a line of its own: the drivers it sets are not judged. The fleet controller's
pods on a GPU node are said too (a compromised GPU node could read its token).

Exit status: 0 every node passes; 2 some node changes outcome (``warn``), its
verdict is ``unknown``, missing or stale, its NRI plugin is not connected, or its validation-failed
taint is not tolerated by its driver's DaemonSet, or a GPUCluster exists; 3 some
node would regress (``fail``, not stale) and every such node is held (:data:`HELD`: compat-hook's hold, a
skip label of someone else's, or the admin's override); 5 some node would
regress and nothing holds it (the gate off, ``too-late``, ``cannot-hold``,
``released-by-other``): the upgrade will break it; 4 no GPU node at all (none
matched the selector: a typo in a CI gate must not pass); 1 an error.

>>> rows = [{"preflight": "pass"}, {"preflight": "warn"}]
>>> exit_status(rows), exit_status(rows + [{"preflight": "fail", "hold": "yes"}])
(2, 3)
>>> exit_status(rows + [{"preflight": "fail", "hold": "yes"}, {"preflight": "fail", "hold": "too-late"}])
5
>>> exit_status([{"preflight": "stale", "verdict": "fail"}])
2
>>> exit_status([{"preflight": "pass", "path": "nri"}]), exit_status([{"preflight": "pass", "path": NOT_CONNECTED}])
(0, 2)
>>> exit_status([{"preflight": "pass", "taint_not_tolerated": True}])
2
"""

from __future__ import annotations

import time

from ...core import safejson
from ..workload import target as targetmod
from ..node.gate import OVERRIDE, SKIP_LABEL, STATE_LABEL

__all__ = ["status", "report", "render_text", "exit_status", "node_row", "PAGE", "HELD", "FAIL_NOT_HELD"]

DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
PRESENT_LABEL = "nvidia.com/gpu.present"
MAX_FIELD = 64
MAX_ANNOTATION = 64 << 10
PAGE = 1000
NOT_CONNECTED = "nri (not connected)"
_PATHS = {"nri": "nri", "runtimeclass": "runtimeclass", "nri-not-connected": NOT_CONNECTED}
LEASE_SELECTOR = "app.kubernetes.io/name=compat-hook,app.kubernetes.io/component=preflight"
#: The ``hold`` values of a node that NVIDIA's upgrade controller will not upgrade unasked.
HELD = ("yes", "stale", "other", "override")
#: ``cluster status``'s exit: some node would regress and nothing holds it.
FAIL_NOT_HELD = 5


def _s(v, n: int = MAX_FIELD):
    if v is None:
        return None
    t = "".join(c if c.isprintable() else "?" for c in str(v)[:n + 1])
    return t if len(t) <= n else t[:n - 3] + "..."


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _parse_time(text) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (``...Z``, fractions allowed), else None.

    >>> _parse_time("1970-01-01T00:01:00.250000Z"), _parse_time("junk"), _parse_time("2026-02-30T00:00:00Z")
    (60.25, None, None)
    """
    import calendar

    if not isinstance(text, str) or len(text) > 40 or not text.endswith("Z"):
        return None
    base, _, frac = text[:-1].partition(".")
    # by hand, not time.strptime (~150 us a call, and the fleet reads a Lease per node)
    if len(base) != 19 or base[4] != "-" or base[7] != "-" or base[10] != "T" or base[13] != ":" or base[16] != ":":
        return None
    parts = (base[0:4], base[5:7], base[8:10], base[11:13], base[14:16], base[17:19])
    if not all(p.isdigit() and p.isascii() for p in parts) or (frac and not (frac.isdigit() and frac.isascii())):
        return None
    y, mo, d, h, mi, se = (int(p) for p in parts)
    if not (1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1] and h < 24 and mi < 60 and se < 61):
        return None
    return calendar.timegm((y, mo, d, h, mi, se, 0, 0, 0)) + (float("0." + frac) if frac else 0.0)


#: The fields of the ``<prefix>/preflight`` doc a row reads, with the type each must have.
_DOC_STR = ("target", "now", "from", "gate", "since", "verdict")


def _doc(anns: dict, prefix: str) -> tuple:
    """``(doc, reason)``: the fields of the node's ``<prefix>/preflight`` doc a row reads, each of the
    right type (another agent wrote it: its size and nesting are bounded before it is parsed,
    :mod:`compat_hook.core.safejson`); ``reason``: why a doc that is there cannot be read (None: it can,
    or there is none).

    >>> _doc({"p/preflight": '{"target": "570.1", "gate": 7, "reasons": ["a", 1]}'}, "p")
    ({'target': '570.1', 'reasons': ['a']}, None)
    >>> _doc({"p/preflight": "[" * 5000}, "p"), _doc({}, "p"), _doc({"p/preflight": 5}, "p")
    (({}, 'too_deep'), ({}, None), ({}, 'not_text'))
    """
    key = f"{prefix}/preflight"
    if key not in anns:
        return {}, None
    d, reason = safejson.parse_object(anns[key], max_bytes=MAX_ANNOTATION)
    if d is None:
        return {}, reason
    out = {k: d[k] for k in _DOC_STR if isinstance(d.get(k), str)}
    if isinstance(d.get("reasons"), list):
        out["reasons"] = [r for r in d["reasons"][:8] if isinstance(r, str)]
    if d.get("complete") is True:
        out["complete"] = True
    if isinstance(d.get("incomplete"), list):
        out["incomplete"] = [r for r in d["incomplete"][:8] if isinstance(r, str)]
    return out, None


#: How far ahead of the reader's clock a Lease's ``renewTime`` may be before it is taken for a skewed clock.
MAX_SKEW = 60.0


def heartbeat_problem(renewed: float | None, duration: float | None, now: float, observed_age: float | None = None):
    """Why an agent's Lease is no heartbeat (None: it is one). ``observed_age``: seconds since the reader
    itself saw the Lease change (its own clock, as client-go's election goes by): given, it alone decides,
    so an agent's clock can neither keep a dead agent fresh nor make a live one stale. Without it (a
    one-shot ``cluster status``) the ``renewTime`` is compared with ``now``, and one further ahead than
    :data:`MAX_SKEW` is no heartbeat either: a clock that runs ahead would otherwise keep a dead agent
    fresh for as long as it is ahead.

    >>> heartbeat_problem(1000.0, 120.0, 1050.0), heartbeat_problem(1000.0, 120.0, 1200.0)
    (None, 'no heartbeat for 200 s (its Lease expired after 120 s)')
    >>> heartbeat_problem(1000.0 + 86400, 120.0, 1000.0)
    "its agent's clock is 86400 s ahead (renewTime in the future): not a heartbeat"
    >>> heartbeat_problem(1000.0 + 86400, 120.0, 1000.0, observed_age=130.0)
    'no change of its Lease seen for 130 s (it lasts 120 s)'
    """
    if renewed is None or duration is None:
        return "no heartbeat from its agent (no Lease)"
    if observed_age is not None:
        if observed_age > duration:
            seen = f"{int(observed_age)} s" if observed_age < 1e12 else "ever (none seen since the reader started)"
            return f"no change of its Lease seen for {seen} (it lasts {int(duration)} s)"
        return None
    if renewed - now > MAX_SKEW:
        return f"its agent's clock is {int(renewed - now)} s ahead (renewTime in the future): not a heartbeat"
    if now > renewed + duration:
        return f"no heartbeat for {int(now - renewed)} s (its Lease expired after {int(duration)} s)"
    return None


def node_row(node: dict, prefix: str, *, lease: dict | None = None, target=None, now: float | None = None,
             observed_age: float | None = None) -> dict | None:
    """A row for ``node`` (None: not a GPU node); ``lease``: its agent's Lease; ``target``: its current
    :class:`~.target.Target`; ``observed_age``: see :func:`heartbeat_problem`.

    Whatever the Node and the Lease say, this returns: an unreadable ``<prefix>/preflight`` doc makes
    the verdict ``unknown`` with the reason in its NOTE (``preflight annotation unreadable: too_deep``),
    and an error no check foresaw makes it ``unknown`` with ``row_error`` (``cluster status`` and the
    fleet both build their rows here: one node's keys never stop either for every node).

    >>> n = {"metadata": {"name": "a", "labels": {PRESENT_LABEL: "true", "p/preflight": "pass"},
    ...                   "annotations": {"p/preflight": "[" * 100000}}}
    >>> r = node_row(n, "p", now=0.0); r["verdict"], r["note"]
    ('unknown', 'unknown: preflight annotation unreadable: too_large; no heartbeat from its agent (no Lease)')
    >>> node_row({"metadata": {"labels": {PRESENT_LABEL: "true"}}}, "p", lease=[], now=0.0)["verdict"] is None
    True
    """
    try:
        return _node_row(node, prefix, lease=lease, target=target, now=now, observed_age=observed_age)
    except Exception as e:  # a shape no check foresaw: this node has no verdict, the other rows go on
        meta = _map(_map(node).get("metadata"))
        return _bad_row(_s(meta.get("name"), 253), f"row_error: {type(e).__name__}")


def _bad_row(name, why: str) -> dict:
    """The row of a node whose keys cannot be read: no verdict to act on (``unknown``), saying why."""
    return {"name": name, "driver": None, "target": None, "upgrade_state": None, "preflight": "unknown",
            "verdict": "unknown", "broken": None, "held": False, "hold": "-", "skip": False, "stale": None,
            "renewed": None, "since": None, "validated": None, "note": f"unknown: {why}", "path": None,
            "complete": False, "incomplete": [],
            "reason": why.split(":")[0]}


def _node_row(node: dict, prefix: str, *, lease, target, now, observed_age=None) -> dict | None:
    meta = _map(_map(node).get("metadata"))
    labels, anns = _map(meta.get("labels")), _map(meta.get("annotations"))
    if labels.get(PRESENT_LABEL) != "true" and f"{prefix}/preflight" not in labels:
        return None
    now = time.time() if now is None else now
    doc, unreadable = _doc(anns, prefix)
    broken = labels.get(f"{prefix}/preflight.broken")
    pre = labels.get(f"{prefix}/preflight")
    # A doc that cannot be read leaves no verdict to act on, whatever the label says (fails closed).
    verdict = "unknown" if unreadable else pre if pre in ("pass", "warn", "fail", "unknown") else None
    # The label is for selectors (and anyone, NFD included, may be let set labels); the annotation, which only
    # the node's own agent may write (the policy compat-hook-node-verdicts), says the same: where they
    # disagree, there is no verdict to act on.
    if verdict not in (None, "unknown") and doc.get("verdict") not in (None, verdict):
        unreadable = f"the label says {verdict}, the annotation {_s(doc.get('verdict'), 16)}"
        verdict = "unknown"
    published = _s(doc.get("target") or labels.get(f"{prefix}/preflight.target-driver"))
    state = _s(labels.get(STATE_LABEL)) or None
    ours = f"{prefix}/holds-upgrade" in anns
    skip = labels.get(SKIP_LABEL) == "true"
    spec = _map(_map(lease).get("spec"))
    renewed = _parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    duration = float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) and duration > 0 else None
    stale = stale_code = None
    if verdict is not None:
        beat = heartbeat_problem(renewed if lease is not None else None, duration, now, observed_age)
        if beat is not None:
            stale, stale_code = beat, "no_heartbeat"
        elif target is not None and not str(doc.get("from") or "").startswith("--driver"):
            current = getattr(target, "version", None)
            if current != (doc.get("target") if doc else published):
                stale = f"verdict for {published or 'no target'}, the target now is {current or 'unknown'}"
                stale_code = "stale_target"
    gate = doc.get("gate")
    if ours and skip:
        hold = "yes"
        if renewed is not None and duration is not None and (
                now > renewed + 1.5 * duration if observed_age is None else observed_age > 1.5 * duration):
            hold = "stale"  # 3 intervals (the Lease lasts 2) without a renewal
        elif state not in ("", None, "upgrade-done", "upgrade-required"):
            hold = "too-late"
    elif gate in ("incomplete", "too-late", "cannot-hold", "override", "released-by-other") and verdict == "fail":
        hold = gate
    elif anns.get(f"{prefix}/{OVERRIDE}") == "true":
        hold = "override"
    elif skip:
        hold = "other"
    else:
        hold = "-"
    return {
        "name": _s(meta.get("name"), 253),
        "driver": _s(labels.get(DRIVER_LABEL) or doc.get("now")),
        "target": published,
        "upgrade_state": state,
        "preflight": "stale" if stale and not unreadable else verdict,
        "verdict": verdict,
        "broken": int(broken) if isinstance(broken, str) and broken.isascii() and broken.isdigit() and len(broken) < 7 else None,
        "held": hold in ("yes", "stale"),
        "hold": hold,
        "skip": skip,
        "stale": stale,
        "renewed": _s(spec.get("renewTime"), 40),
        "since": _s(doc.get("since"), 40),
        "validated": _s(labels.get(f"{prefix}/validated")),
        # whether the pass behind the verdict read everything it needed (an image missing from the store, a
        # store it could not list, a broken watch: not complete); only a complete verdict is a judgement
        "complete": doc.get("complete") is True,
        "incomplete": [_s(r, 32) for r in doc.get("incomplete", [])[:6]],
        "note": (_note(verdict, doc, unreadable) + (f"; {stale}" if stale else "")) if unreadable
        else stale or _note(verdict, doc) or (
            "incomplete: " + (", ".join(_s(r, 32) for r in doc.get("incomplete", [])[:4]) or "its agent did not say why")
            if verdict in ("warn", "fail") and doc.get("complete") is not True else None),
        "path": _PATHS.get(labels.get(f"{prefix}/registration")) if isinstance(labels.get(f"{prefix}/registration"),
                                                                                 str) else None,
        "reason": _reason(verdict, doc, unreadable, stale_code),
    }


def _reason(verdict, doc: dict, unreadable: str | None, stale_code: str | None) -> str | None:
    """The row's one reason code (``--json``'s ``reason``): why there is no verdict to act on, or None
    when there is one (fresh, readable and, for ``warn``/``fail``, complete).

    >>> _reason("pass", {}, None, None), _reason("unknown", {"reasons": ["no_target"]}, None, None)
    (None, 'no_target')
    >>> _reason("fail", {"complete": False}, None, None), _reason("fail", {"complete": True}, None, "no_heartbeat")
    ('incomplete', 'no_heartbeat')
    """
    if unreadable:
        return "preflight_disagrees" if unreadable.startswith("the label") else "preflight_unreadable"
    if verdict is None:
        return "no_preflight"
    if stale_code:
        return stale_code
    if verdict == "unknown":
        codes = [r for r in doc.get("reasons") or [] if isinstance(r, str) and r]
        return _s(codes[0], 32) if codes else "no_reason"
    if verdict in ("warn", "fail") and doc.get("complete") is not True:
        return "incomplete"
    return None


def _note(verdict: str | None, doc: dict, unreadable: str | None = None) -> str | None:
    """Why a node has no verdict to act on (an ``unknown`` or missing one): never an empty NOTE.

    >>> _note("unknown", {"reasons": ["no_target", "driver_unknown"]}), _note(None, {})
    ('unknown: no_target, driver_unknown', 'no preflight published: is its agent running?')
    >>> _note("pass", {}), _note("unknown", {})
    (None, 'unknown: its agent gave no reason')
    """
    if unreadable:
        if unreadable.startswith("the label"):
            return f"unknown: {unreadable}"
        return f"unknown: preflight annotation unreadable: {unreadable}"
    if verdict is None:
        return "no preflight published: is its agent running?"
    if verdict != "unknown":
        return None
    reasons = [_s(r, 32) for r in (doc.get("reasons") or [])[:4] if isinstance(r, str) and r]
    return "unknown: " + (", ".join(reasons) if reasons else "its agent gave no reason")


def tolerates(tolerations, key: str, value: str, effect: str) -> bool:
    """Whether ``tolerations`` (a pod spec's) tolerate the taint ``key=value:effect``, by Kubernetes' rules.

    >>> t = "p.io/validation-failed"
    >>> tolerates([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], t, "470", "NoSchedule")
    False
    >>> tolerates([{"key": t, "operator": "Exists", "effect": "NoSchedule"}], t, "470", "NoSchedule")
    True
    >>> tolerates([{"operator": "Exists"}], t, "470", "NoSchedule"), tolerates([{"key": t, "value": "535"}], t, "470", "NoSchedule")
    (True, False)
    """
    for tol in tolerations if isinstance(tolerations, list) else []:
        if not isinstance(tol, dict) or tol.get("effect") not in (None, "", effect):
            continue
        op = tol.get("operator") or "Equal"
        if op == "Exists" and tol.get("key") in (None, "", key):
            return True
        if op == "Equal" and tol.get("key") == key and (tol.get("value") or "") == value:
            return True
    return False


def _driver_tolerations(node: dict, policies: list, drivers: list) -> tuple:
    """``(tolerations, where)`` of the GPU Operator's DaemonSet that runs ``node``'s driver: the active
    ClusterPolicy's ``spec.daemonsets.tolerations``, or with ``useNvidiaDriverCRD`` the selecting
    NVIDIADriver's ``spec.tolerations``; ``(None, "")`` where neither is known."""
    cp, _ = targetmod.active_policy(policies)
    spec = _map(_map(cp).get("spec"))
    if cp is not None and _map(spec.get("driver")).get("useNvidiaDriverCRD") is not True:
        return _map(spec.get("daemonsets")).get("tolerations") or [], \
            f"ClusterPolicy {_s(_map(cp.get('metadata')).get('name'))} spec.daemonsets.tolerations"
    labels = _map(_map(node.get("metadata")).get("labels"))
    for d in drivers:
        ds = _map(_map(d).get("spec"))
        if targetmod.selects(ds.get("nodeSelector"), labels, ds.get("nodeAffinity")):
            return ds.get("tolerations") or [], f"NVIDIADriver {_s(_map(d.get('metadata')).get('name'))} spec.tolerations"
    return None, ""


def untolerated_taint(node: dict, prefix: str, policies: list, drivers: list) -> str | None:
    """The NOTE for a node carrying compat-hook's validation-failed taint that its driver DaemonSet does not
    tolerate (None otherwise): the DaemonSet controller then counts the node out while the driver pod
    still runs there, and NVIDIA's upgrade controller refuses such a DaemonSet, for every node."""
    key = f"{prefix}/validation-failed"
    taints = [t for t in _map(node.get("spec")).get("taints") or [] if isinstance(t, dict) and t.get("key") == key]
    if not taints:
        return None
    tolerations, where = _driver_tolerations(node, policies, drivers)
    if tolerations is None:
        return None
    t = taints[0]
    if tolerates(tolerations, key, str(t.get("value") or ""), str(t.get("effect") or "NoSchedule")):
        return None
    return (f"{key} not tolerated by {where}: NVIDIA's upgrade controller stops for every node "
            f"(docs/validation.md)")


def _pages(kube, path: str, **query) -> list:
    out, cont = [], None
    while True:  # pages: a large cluster never comes in one answer
        doc = kube.get(path, limit=PAGE, **query, **({"continue": cont} if cont else {}))
        out += [o for o in doc.get("items") or [] if isinstance(o, dict)]
        cont = _map(doc.get("metadata")).get("continue")
        if not cont:
            return out


def _optional(kube, path: str) -> list:
    from ..api.kube import NotFound

    try:
        return _pages(kube, path)
    except NotFound:
        return []


def find_kind(kube, group: str, kind: str) -> str | None:
    """The collection path of ``kind`` in API ``group`` (any served version), by discovery; None: not served.

    gpu-operator v26.7's ``GPUCluster`` is experimental: found by its kind, whatever version serves it."""
    from ..api.kube import NotFound

    try:
        grp = kube.get(f"/apis/{group}")
    except NotFound:
        return None
    for ver in _map(grp).get("versions") or []:
        gv = _map(ver).get("groupVersion")
        if not isinstance(gv, str) or "/" not in gv or len(gv) > 200:
            continue
        try:
            res = kube.get(f"/apis/{gv}")
        except NotFound:
            continue
        for r in _map(res).get("resources") or []:
            r = _map(r)
            if r.get("kind") == kind and isinstance(r.get("name"), str) and "/" not in r["name"]:
                return f"/apis/{gv}/{r['name']}"
    return None


def fleet_placement(kube, namespace: str) -> dict | None:
    """Where the fleet controller's pods run: ``{"pods": n, "gpu_nodes": [node, ...]}``, None where this
    user may not list pods there. Its token writes what the admission policy admits drivers by, and a
    compromised node can read the token of any pod it runs: on a GPU node that is one node's reach into
    the whole fleet's interlock."""
    from ..api.kube import KubeError

    try:
        pods = _pages(kube, f"/api/v1/namespaces/{namespace}/pods",
                      labelSelector="app.kubernetes.io/name=compat-hook,app.kubernetes.io/component=fleet")
    except KubeError:
        return None
    nodes = sorted({str(_map(p.get("spec")).get("nodeName") or "") for p in pods} - {""})
    gpu = []
    for n in nodes[:20]:
        try:
            node = kube.get(f"/api/v1/nodes/{n}")
        except KubeError:
            continue
        if _map(_map(node.get("metadata")).get("labels")).get(PRESENT_LABEL) == "true":
            gpu.append(_s(n, 253))
    return {"pods": len(pods), "gpu_nodes": gpu}


def _status_row(n: dict, prefix: str, leases: dict, policies: list, drivers: list, now) -> dict | None:
    name = _map(n.get("metadata")).get("name")
    tgt = targetmod.node_target(n, policies, drivers, prefix=prefix)
    row = node_row(n, prefix, lease=leases.get(name) if isinstance(name, str) else None, target=tgt, now=now)
    if row is not None:
        bad = untolerated_taint(n, prefix, policies, drivers)
        row["taint_not_tolerated"] = bad is not None
        if bad:
            row["note"] = bad + (f"; {row['note']}" if row["note"] else "")
    return row


def status(kube, prefix: str, namespace: str, now: float | None = None, selector: str | None = None) -> dict:
    nodes = _pages(kube, "/api/v1/nodes", **({"labelSelector": selector} if selector else {}))
    leases = _pages(kube, f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases", labelSelector=LEASE_SELECTOR)
    policies = _optional(kube, "/apis/nvidia.com/v1/clusterpolicies")
    drivers = _optional(kube, "/apis/nvidia.com/v1alpha1/nvidiadrivers")
    rep = report(nodes, leases, policies, drivers, prefix, now)
    from ..api.kube import KubeError

    try:  # gpu-operator v26.7's DRA resource: its drivers are not judged, and that is said, never passed over
        path = find_kind(kube, "nvidia.com", targetmod.GPUCLUSTER_KIND)
        gcs = _optional(kube, path) if path else []
    except KubeError:
        gcs = []
    rep["summary"]["gpuclusters"] = sorted(_s(_map(g.get("metadata")).get("name"), 253) or "?" for g in gcs)[:10]
    rep["summary"]["fleet"] = fleet_placement(kube, namespace)
    return rep


def report(nodes: list, leases: list, policies: list, drivers: list, prefix: str, now: float | None = None) -> dict:
    """``{"nodes": rows, "summary": ...}`` from the objects as listed (pure but for the clock): one row per
    GPU node, whatever its keys say (a node whose keys cannot be read is an ``unknown`` row saying why)."""
    by_name = {}
    for o in leases:
        name = _map(_map(o).get("metadata")).get("name")
        if isinstance(name, str):
            by_name[name] = o
    rows = []
    for n in nodes:
        if not isinstance(n, dict) or node_row(n, prefix, now=now) is None:
            continue  # not a GPU node
        try:
            row = _status_row(n, prefix, by_name, policies, drivers, now)
        except Exception as e:  # one node's keys never stop the view of the others
            row = _bad_row(_s(_map(n.get("metadata")).get("name"), 253), f"row_error: {type(e).__name__}")
            row["taint_not_tolerated"] = False
        if row is not None:
            rows.append(row)
    rows.sort(key=lambda r: r["name"] or "")
    summary = {"nodes": len(rows), "held": sum(1 for r in rows if r["held"]),
               "validation_failed": sum(1 for r in rows if r["validated"] == "failed"),
               "nri_not_connected": sum(1 for r in rows if r["path"] == NOT_CONNECTED),
               "taint_not_tolerated": sum(1 for r in rows if r.get("taint_not_tolerated"))}
    for v in ("pass", "warn", "fail", "unknown", "stale"):
        summary[v] = sum(1 for r in rows if r["preflight"] == v)
    summary["no_preflight"] = sum(1 for r in rows if r["preflight"] is None)
    states: dict = {}
    for r in rows:
        k = r["upgrade_state"] or "none"
        states[k] = states.get(k, 0) + 1
    summary["upgrade_states"] = dict(sorted(states.items()))
    summary["incomplete"] = sum(1 for r in rows if r["verdict"] is not None and not r.get("complete"))
    return {"nodes": rows, "summary": summary}


def exit_status(nodes: list, summary: dict | None = None) -> int:
    pre = [r.get("preflight") for r in nodes]
    if any(r.get("preflight") == "fail" and r.get("hold") not in HELD for r in nodes):
        return FAIL_NOT_HELD
    if "fail" in pre:
        return 3
    if any(p != "pass" for p in pre) or any(r.get("path") == NOT_CONNECTED or r.get("taint_not_tolerated")
                                            for r in nodes) or (summary or {}).get("gpuclusters"):
        return 2
    return 0


def render_text(rep: dict) -> str:
    """The table and the summary line.

    >>> row = {"name": "gpu-a", "driver": "470.256.02", "target": "470.256.02", "upgrade_state": "upgrade-done",
    ...        "preflight": "pass", "broken": 0, "hold": "-", "validated": "failed", "stale": None, "path": "nri"}
    >>> s = {"nodes": 1, "pass": 1, "warn": 0, "fail": 0, "unknown": 0, "no_preflight": 0, "stale": 0, "held": 0,
    ...      "validation_failed": 1}
    >>> print(render_text({"nodes": [row], "summary": s}), end="")
    NODE   DRIVER      TARGET      UPGRADE STATE  PREFLIGHT  BROKEN  HELD  VALIDATED  PATH  NOTE
    gpu-a  470.256.02  470.256.02  upgrade-done   pass       0       -     failed     nri
    1 GPU node(s): 1 pass, 0 warn, 0 fail, 0 unknown, 0 stale; 0 held by compat-hook; 1 failed validation
    """
    rows = [("NODE", "DRIVER", "TARGET", "UPGRADE STATE", "PREFLIGHT", "BROKEN", "HELD", "VALIDATED", "PATH", "NOTE")]
    for r in rep["nodes"]:
        rows.append((r["name"] or "?", r["driver"] or "-", r["target"] or "-", r["upgrade_state"] or "-",
                     r["preflight"] or "-", "-" if r["broken"] is None else str(r["broken"]), r["hold"],
                     r["validated"] or "-", r.get("path") or "-", r.get("note") or r["stale"] or ""))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    out = ["  ".join(row[k].ljust(widths[k]) for k in range(len(row))).rstrip() for row in rows]
    s = rep["summary"]
    out.append(f"{s['nodes']} GPU node(s): {s['pass']} pass, {s['warn']} warn, {s['fail']} fail, "
               f"{s['unknown'] + s['no_preflight']} unknown, {s['stale']} stale; {s['held']} held by compat-hook; "
               f"{s['validation_failed']} failed validation"
               + (f"; {s['nri_not_connected']} with the NRI plugin not connected" if s.get("nri_not_connected") else "")
               + (f"; {s['taint_not_tolerated']} with a validation-failed taint their driver DaemonSet does not "
                  f"tolerate" if s.get("taint_not_tolerated") else "")
               + (f"; {s['incomplete']} with an incomplete pass (not a judgement)" if s.get("incomplete") else ""))
    if s.get("gpuclusters"):
        out.append(f"GPUCluster {', '.join(s['gpuclusters'])}: the drivers it sets (DRA) are NOT judged by compat-hook: "
                   f"no preflight, hold or admission covers them")
    fleet = s.get("fleet")
    if fleet and fleet.get("gpu_nodes"):
        out.append(f"the fleet controller runs on GPU node(s) {', '.join(fleet['gpu_nodes'])}: a compromised GPU node "
                   f"could read its token, which writes what the driver admission policy admits; give it a CPU or "
                   f"control-plane node (docs/cluster.md)")
    return "\n".join(out) + "\n"
