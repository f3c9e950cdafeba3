"""The details ConfigMap of a pass: every workload that regresses with its pods, those broken now and
after, those not in the store, unreadable or not assessable (in the agent's namespace, named after
the node; written only when it changes).
"""

from __future__ import annotations

import json

from ...core import safejson
from .verdicts import _outcome, _s, counts, regression, verdict

__all__ = ["MAX_DETAILS", "DETAILS_KEY", "COMPONENT_LABELS", "details_doc", "configmap", "details_of"]

#: The details ConfigMap's JSON, at most (a ConfigMap holds 1 MiB).
MAX_DETAILS = 256 << 10


DETAILS_KEY = "preflight.json"


COMPONENT_LABELS = {"app.kubernetes.io/name": "compat-hook", "app.kubernetes.io/component": "preflight"}


def _row(r: dict, pods: dict) -> dict:
    a = r.get("after") if isinstance(r.get("after"), dict) else {}
    n = r.get("now") if isinstance(r.get("now"), dict) else {}
    name = r.get("name") or r.get("image")
    return {"name": _s(name, 400), "image": _s(r.get("workload_image") or r.get("image"), 400),
            "pods": list(pods.get(name, []))[:20], "runtime": _s(r.get("runtime"), 32),
            "now": _s(n.get("outcome"), 32), "after": _s(a.get("outcome"), 32), "reason": _s(a.get("reason"), 64),
            "error": a.get("error"), "cuda": _s(a.get("cuda"), 16), "needs": _s(r.get("needs_cuda"), 16)}


#: Workloads whose image_libcuda facts the details carry (they are cut first when the details are too big).
MAX_LIBCUDA_ROWS = 50


def _libcuda(r: dict) -> dict:
    """One workload's ``image_libcuda`` facts, bounded: ``userland`` paths, ``symlinked`` links, ``ldconfig_picks``."""
    f = r["image_libcuda"]
    out = {"name": _s(r.get("name") or r.get("image"), 400)}
    if isinstance(f.get("userland"), list):
        out["userland"] = [_s(p, 400) for p in f["userland"][:8]]
    for key in ("symlinked", "ldconfig_picks"):
        if isinstance(f.get(key), dict):
            out[key] = {_s(k, 400): _s(v, 400) for k, v in list(f[key].items())[:8]}
    return out


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
           "not_in_store": [{"image": _s(img, 400), "pods": list(p)[:20]} for img, p in missing],
           # every libcuda a workload's image carries outside its compat dirs' own files (a userland driver in a
           # system dir, a symlinked compat file) and what ldconfig links there: plan's facts, whatever the verdict
           "image_libcuda": [_libcuda(r) for r in rows if isinstance(r.get("image_libcuda"), dict)][:MAX_LIBCUDA_ROWS]}
    for key in ("image_libcuda", "changed", "not_in_store", "unreadable", "unknown_workloads", "broken_now_and_after",
                "regressions"):
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
