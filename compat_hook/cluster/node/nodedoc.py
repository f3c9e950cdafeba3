"""What a pass puts on the Node: few keys, written only on a change; the rest lives apart.

What a pass publishes is split by output: the verdict (:mod:`.verdicts`), the Node's keys (here),
the details ConfigMap (:mod:`.detailscm`), the heartbeat Lease (:mod:`.heartbeat`), the Event
(:mod:`.nodeevents`) and the node's files (:mod:`.nodefiles`: node-feature-discovery's and the textfile).

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
"""

from __future__ import annotations

import json

from ...core import safejson
from .verdicts import _s, label_value, verdict

__all__ = ["MAX_NODE_DOC", "REGISTRATIONS", "node_doc", "same_node_doc", "node_keys"]

#: The Node annotation's largest size.
MAX_NODE_DOC = 4096


#: ``<prefix>/registration``: the NRI plugin, the same with the plugin gone from containerd's plugin
#: dir (GPU containers start without compat-hook), or the runtime the RuntimeClass names.
REGISTRATIONS = ("nri", "nri-not-connected", "runtimeclass")


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
