"""What a pass publishes: the preflight verdict, the Node's labels and annotation, the Event,
and the optional node-local files (an NFD local feature file, a node_exporter textfile).

The verdict of a plan report (:func:`verdict`):

* ``fail``: an image of a pod on this node breaks on the target driver;
* ``warn``: an image changes outcome, or something could not be read;
* ``pass``: every image keeps its outcome;
* ``unknown``: no target, or the host driver is unknown.

>>> img = {"image": "x", "now": {"outcome": "compat"}, "after": {"outcome": "broken", "error": 35,
...        "reason": "no_candidate", "cuda": "11.4"}}
>>> verdict({"images": [img], "summary": {"broken_after": 1, "changed": 1, "unreadable": 0}}, missing=0)
'fail'
>>> verdict({"images": [], "summary": {"broken_after": 0, "changed": 0, "unreadable": 0}}, missing=1)
'warn'
"""

from __future__ import annotations

import os

__all__ = ["verdict", "summary", "node_patch", "event", "nfd_text", "textfile_text", "write_file",
           "MAX_ANNOTATION"]

#: The summary annotation's largest size: Kubernetes allows 256 KiB for all of a Node's annotations.
MAX_ANNOTATION = 8192
MAX_LISTED = 10
MAX_STR = 200


def _s(v, n: int = MAX_STR):
    if v is None:
        return None
    t = str(v)
    return t if len(t) <= n else t[:n] + "..."


def verdict(report: dict | None, *, missing: int) -> str:
    if report is None:
        return "unknown"
    s = report["summary"]
    if s["broken_after"]:
        return "fail"
    if s["changed"] or s["unreadable"] or missing:
        return "warn"
    return "pass"


def broken_images(report: dict | None) -> list:
    out = []
    for i in (report or {}).get("images", []):
        a = i.get("after") or {}
        if a.get("outcome") == "broken":
            out.append({"image": _s(i.get("image")), "reason": _s(a.get("reason"), 64), "error": a.get("error"),
                        "cuda": _s(a.get("cuda"), 16), "needs": _s(i.get("needs_cuda"), 16)})
    return out


def summary(*, node: str, preflight: str, now, target, target_from: str, report: dict | None, missing: list,
            pods: int, gate_state: str, gate_message: str, problem: str | None, when: str) -> dict:
    """The bounded JSON summary stored in the annotation (at most :data:`MAX_ANNOTATION` bytes)."""
    s = (report or {}).get("summary") or {}
    doc = {"version": 1, "time": when, "node": _s(node, 253), "preflight": preflight,
           "now": _s(now, 64), "target": _s(target, 64), "target_from": _s(target_from),
           "pods": pods, "images": s.get("images", 0), "broken": s.get("broken_after", 0),
           "changed": s.get("changed", 0), "unreadable": s.get("unreadable", 0), "not_in_store": len(missing),
           "gate": gate_state, "gate_message": _s(gate_message, 512), "problem": _s(problem, 512),
           "broken_images": broken_images(report)[:MAX_LISTED],
           "missing_images": [_s(m) for m in missing[:MAX_LISTED]]}
    import json

    while len(json.dumps(doc, separators=(",", ":"))) > MAX_ANNOTATION and (doc["broken_images"] or doc["missing_images"]):
        (doc["missing_images"] or doc["broken_images"]).pop()
        doc["truncated"] = True
    return doc


def signature(doc: dict) -> str:
    """What an Event is emitted for: a change of any of these (``doc`` may be a hostile annotation).

    >>> signature({"preflight": "fail", "broken_images": [{"image": "b"}, "junk", {"image": "a"}]})
    'fail|None|None|None|a,b'
    """
    listed = doc.get("broken_images") if isinstance(doc.get("broken_images"), list) else []
    names = sorted(str(b.get("image")) for b in listed if isinstance(b, dict))
    return "|".join([str(doc.get("preflight")), str(doc.get("target")), str(doc.get("gate")),
                     str(doc.get("broken")), ",".join(names)])


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


def node_patch(*, prefix: str, doc: dict, gate, resource_version: str) -> dict:
    import json

    labels = {f"{prefix}/preflight": doc["preflight"],
              f"{prefix}/preflight.target-driver": label_value(doc["target"]),
              f"{prefix}/preflight.broken": str(doc["broken"])}
    labels.update(gate.labels)
    annotations = {f"{prefix}/preflight": json.dumps(doc, separators=(",", ":"))}
    annotations.update(gate.annotations)
    return {"metadata": {"resourceVersion": resource_version, "labels": labels, "annotations": annotations}}


def event(*, node: dict, doc: dict, when: str, namespace: str = "default") -> dict:
    """A core/v1 Event on the Node (reason ``CompatHookPreflight``; Warning on ``fail``)."""
    meta = node["metadata"]
    name = meta["name"]
    if doc["preflight"] == "fail":
        listed = "; ".join(f"{b['image']}: broken ({b['error']})" for b in doc["broken_images"][:3])
        msg = f"preflight fail for driver {doc['target']}: {doc['broken']} image(s) break ({listed})"
    elif doc["preflight"] == "unknown":
        msg = f"preflight unknown: {doc['problem'] or 'no target'}"
    else:
        msg = (f"preflight {doc['preflight']} for driver {doc['target']}: {doc['images']} image(s), "
               f"{doc['changed']} change outcome, {doc['unreadable'] + doc['not_in_store']} unreadable")
    if doc["gate"] == "held":
        msg += "; holding the upgrade (nvidia.com/gpu-driver-upgrade.skip=true)"
    elif doc["gate_message"]:
        msg += f"; {doc['gate_message']}"
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name[:200]}.compat-hook-", "namespace": namespace},
        "involvedObject": {"kind": "Node", "name": name, "uid": meta.get("uid"), "apiVersion": "v1"},
        "reason": "CompatHookPreflight", "message": msg[:1024],
        "type": "Warning" if doc["preflight"] in ("fail",) or doc["gate"] == "cannot-hold" else "Normal",
        "source": {"component": "compat-hook", "host": name},
        "firstTimestamp": when, "lastTimestamp": when, "count": 1,
        "reportingComponent": "compat-hook", "reportingInstance": name,
        "action": "Preflight",
    }


def nfd_text(prefix: str, doc: dict) -> str:
    """An NFD local feature file: one ``<prefix>/<name>=<value>`` per line."""
    lines = [f"{prefix}/preflight={doc['preflight']}", f"{prefix}/preflight.broken={doc['broken']}"]
    tv = label_value(doc["target"])
    if tv:
        lines.append(f"{prefix}/preflight.target-driver={tv}")
    return "\n".join(lines) + "\n"


def textfile_text(doc: dict, when_s: float, decisions: dict | None = None) -> str:
    """node_exporter textfile: images per outcome on the target, the last run, decision counts."""
    out = ["# HELP compat_hook_preflight_images Images of this node's GPU pods by outcome on the target driver.",
           "# TYPE compat_hook_preflight_images gauge"]
    counts = {"broken": doc["broken"], "changed": doc["changed"], "unreadable": doc["unreadable"] + doc["not_in_store"],
              "unchanged": max(0, doc["images"] - doc["broken"] - doc["unreadable"]
                               - max(0, doc["changed"] - doc["broken"]))}
    for k in sorted(counts):
        out.append(f'compat_hook_preflight_images{{outcome="{k}"}} {counts[k]}')
    out += ["# HELP compat_hook_preflight_last_run_timestamp_seconds When the last preflight pass ended.",
            "# TYPE compat_hook_preflight_last_run_timestamp_seconds gauge",
            f"compat_hook_preflight_last_run_timestamp_seconds {when_s:.3f}"]
    out += ["# HELP compat_hook_preflight_result 1 for this node's current preflight verdict.",
            "# TYPE compat_hook_preflight_result gauge"]
    for v in ("pass", "warn", "fail", "unknown"):
        out.append(f'compat_hook_preflight_result{{result="{v}"}} {1 if doc["preflight"] == v else 0}')
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
    from ..core import atomic

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic.replace(path, text.encode(), 0o644)
