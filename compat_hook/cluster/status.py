"""``compat-hook cluster status``: every GPU node's driver, target, upgrade state and preflight.

A GPU node is one labelled ``nvidia.com/gpu.present=true`` (the GPU Operator's
and GPU Feature Discovery's label) or one the agent has published on. The
driver now is GPU Feature Discovery's ``nvidia.com/cuda.driver-version.full``,
else what the agent read on the node.

Exit status: 0 every node passes; 2 some node changes outcome (``warn``), or its
preflight is ``unknown`` or missing; 3 some node would break (``fail``); 1 an error.

>>> rows = [{"preflight": "pass"}, {"preflight": "warn"}]
>>> exit_status(rows), exit_status(rows + [{"preflight": "fail"}]), exit_status([])
(2, 3, 0)
"""

from __future__ import annotations

import json
from .gate import SKIP_LABEL, STATE_LABEL

__all__ = ["status", "render_text", "exit_status", "node_row"]

DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
PRESENT_LABEL = "nvidia.com/gpu.present"
MAX_FIELD = 64
MAX_ANNOTATION = 64 << 10


def _s(v, n: int = MAX_FIELD):
    if v is None:
        return None
    t = "".join(c if c.isprintable() else "?" for c in str(v))
    return t if len(t) <= n else t[:n - 3] + "..."


def node_row(node: dict, prefix: str) -> dict | None:
    meta = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    anns = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    if labels.get(PRESENT_LABEL) != "true" and f"{prefix}/preflight" not in labels:
        return None
    doc = {}
    raw = anns.get(f"{prefix}/preflight")
    if isinstance(raw, str) and len(raw) <= MAX_ANNOTATION:
        try:
            d = json.loads(raw)
            doc = d if isinstance(d, dict) else {}
        except ValueError:
            doc = {}
    broken = labels.get(f"{prefix}/preflight.broken")
    pre = labels.get(f"{prefix}/preflight")
    return {
        "name": _s(meta.get("name"), 253),
        "driver": _s(labels.get(DRIVER_LABEL) or doc.get("now")),
        "target": _s(doc.get("target") or labels.get(f"{prefix}/preflight.target-driver")),
        "upgrade_state": _s(labels.get(STATE_LABEL)) or None,
        "preflight": pre if pre in ("pass", "warn", "fail", "unknown") else None,
        "broken": int(broken) if isinstance(broken, str) and broken.isdigit() and len(broken) < 7 else None,
        "held": f"{prefix}/holds-upgrade" in anns and labels.get(SKIP_LABEL) == "true",
        "skip": labels.get(SKIP_LABEL) == "true",
    }


def status(kube, prefix: str) -> dict:
    nodes = []
    cont = None
    while True:  # pages of 500: a large cluster never comes in one answer
        doc = kube.get("/api/v1/nodes", limit=500, **({"continue": cont} if cont else {}))
        for n in doc.get("items") or []:
            row = node_row(n, prefix) if isinstance(n, dict) else None
            if row is not None:
                nodes.append(row)
        cont = (doc.get("metadata") or {}).get("continue")
        if not cont:
            break
    nodes.sort(key=lambda r: r["name"] or "")
    summary = {"nodes": len(nodes), "held": sum(1 for r in nodes if r["held"])}
    for v in ("pass", "warn", "fail", "unknown"):
        summary[v] = sum(1 for r in nodes if r["preflight"] == v)
    summary["no_preflight"] = sum(1 for r in nodes if r["preflight"] is None)
    states: dict = {}
    for r in nodes:
        k = r["upgrade_state"] or "none"
        states[k] = states.get(k, 0) + 1
    summary["upgrade_states"] = dict(sorted(states.items()))
    return {"nodes": nodes, "summary": summary}


def exit_status(nodes: list) -> int:
    pre = [r.get("preflight") for r in nodes]
    if "fail" in pre:
        return 3
    if any(p != "pass" for p in pre):
        return 2
    return 0


def render_text(rep: dict) -> str:
    rows = [("NODE", "DRIVER", "TARGET", "UPGRADE STATE", "PREFLIGHT", "BROKEN", "HELD")]
    for r in rep["nodes"]:
        held = "yes" if r["held"] else "skip (not ours)" if r["skip"] else "-"
        rows.append((r["name"] or "?", r["driver"] or "-", r["target"] or "-", r["upgrade_state"] or "-",
                     r["preflight"] or "-", "-" if r["broken"] is None else str(r["broken"]), held))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    out = ["  ".join(row[k].ljust(widths[k]) for k in range(len(row))).rstrip() for row in rows]
    s = rep["summary"]
    out.append(f"{s['nodes']} GPU node(s): {s['pass']} pass, {s['warn']} warn, {s['fail']} fail, "
               f"{s['unknown'] + s['no_preflight']} unknown; {s['held']} held by compat-hook")
    return "\n".join(out) + "\n"
