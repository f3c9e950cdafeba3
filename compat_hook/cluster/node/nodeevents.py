"""The Event about a Node when the verdict, the gate or the regressions change.
"""

from __future__ import annotations

from .verdicts import counts, verdict

__all__ = ["EVENT_NAMESPACE", "event_signature", "event"]

#: Where an Event about a Node goes. The API server takes a core/v1 Event whose involvedObject has no
#: namespace (a cluster-scoped object) only in ``default`` (``kube-system`` too through events.k8s.io);
#: in another namespace it must name that namespace, and ``kubectl describe node``, which selects
#: ``involvedObject.namespace=""``, never shows it. The kubelet writes its Node Events there too.
EVENT_NAMESPACE = "default"


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
