"""The node's files: node-feature-discovery's features file and the node exporter's textfile (their text;
:mod:`.applyintent` writes them).
"""

from __future__ import annotations

from .verdicts import counts, label_value, regression, verdict

__all__ = ["nfd_text", "textfile_text"]

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
