"""The node's GPU workloads on the target driver: their images found in the node's store, then ``plan``.

:func:`assess` matches each workload's image (the pod's reference) to a source
in the node's store (:mod:`.refs`), and asks the policy layer's ``plan`` for one
row per workload: its outcome on the driver now and on the target, for the
compat-hook outcome or the NVIDIA toolkit's alone (the workload's ``runtime``),
and whether it regresses. Images not in the store are listed, not assessed.

A precompiled branch target (``570``) is assessed as the branch's first release
(``570.0``): the branch fixes the highest CUDA version and the GPUs supported.

>>> rows = [{"name": "a", "now": {"outcome": "host"}, "after": {"outcome": "broken"}}]
>>> _finish(rows, {"driver": {"now": "535.261.03", "after": "535.261.03"}})[0]["regression"]
False
"""

from __future__ import annotations

import functools

from ..core.errors import describe
from . import refs

__all__ = ["assess", "Assessment"]


class Assessment:
    """``report`` (plan's, None when it could not run), ``rows`` (one per workload sent), ``missing``
    (``[(image, [pods])]`` not in the store), ``problems``, ``reasons`` (codes), ``reachable``
    (every store could be listed), ``now`` (the node's driver text or None)."""

    def __init__(self) -> None:
        self.report = None
        self.rows: list = []
        self.missing: list = []
        self.problems: list = []
        self.reasons: list = []
        self.reachable = True
        self.now = None


def _supports_workloads(plan) -> bool:
    import inspect

    try:
        return "workloads" in inspect.signature(plan).parameters
    except (TypeError, ValueError):
        return False


def _plan_workloads(cfg, version: str, items: list, opener, expander) -> dict:
    """The policy layer's plan over workloads (its contract: one row per workload)."""
    from ..policy import preflight

    return preflight.plan(cfg, [], driver=version, opener=opener, expander=expander, workloads=items)


def _plan_workloads_stub(cfg, version: str, items: list, opener, expander) -> dict:
    """Until the policy layer's workloads API is on main: today's per-image plan. It opens each image
    once and gives each workload its image's row; the pod's env and annotations are not laid over the
    image's yet, and the toolkit-alone outcome stands for ``runtime: toolkit`` only after the upgrade."""
    from ..policy import preflight

    sources = sorted({w["source"] for w in items if not w["unknown"]})
    rep = preflight.plan(cfg, sources, driver=version, opener=opener, expander=expander)
    by_source = {r["image"]: r for r in rep["images"]}
    rows = []
    for w in items:
        base = {"workload": True, "name": w["name"], "runtime": w["runtime"]}
        if w["unknown"]:
            rows.append(dict(base, image=w["source"], now=None, after=None, unknown=w["unknown"]))
            continue
        r = dict(by_source.get(w["source"]) or {"image": w["source"], "now": None, "after": None,
                                                "error": "not read"}, **base)
        if r.get("now") is not None:
            r["compat_hook_after"] = r["after"]
            if w["runtime"] == "toolkit" and r.get("toolkit_only_after") is not None:
                r["after"] = r["toolkit_only_after"]
        rows.append(r)
    rep["workloads"] = rows
    return rep


def _finish(rows: list, report: dict) -> list:
    """Rows without the policy's ``regression``: none when the target is the driver now."""
    drv = report.get("driver") if isinstance(report.get("driver"), dict) else {}
    same = drv.get("now") is not None and drv.get("now") == drv.get("after")
    for r in rows:
        if "regression" not in r and same:
            r["regression"] = False
    return rows


def assess(cfg, *, version: str | None, workloads, stores: list, address, namespace: str) -> Assessment:
    """See the module docstring; ``workloads`` is a :class:`~.pods.Workloads`."""
    from ..images.sources import expand, open_source

    a = Assessment()
    where = {"address": address, "namespace": namespace}
    expander = functools.partial(expand, **where)
    items = [w for w in workloads.items]
    if any(not w["unknown"] for w in items):
        index, problems, a.reachable = refs.store_index(stores, expander, address=address, namespace=namespace,
                                                        host_root=getattr(cfg, "host_root", "/") or "/")
        a.problems += problems
        if not a.reachable:
            a.reasons.append("store_unreachable")
        elif problems:
            a.reasons.append("store_refused")
        for img, names in workloads.images.items():
            src = index.get(img)
            if src is None and "@" in img:
                src = index.get("@" + img.partition("@")[2])
            for w in items:
                if w["name"] in names:
                    w["source"] = src
            if src is None:
                pods = sorted({p for n in names for p in workloads.pods.get(n, [])})
                a.missing.append((img, pods))
        if a.missing:
            a.reasons.append("not_in_store")
    send = [w for w in items if w["unknown"] or w["source"] is not None]
    if version is None:
        return a
    from ..policy import preflight

    plan = _plan_workloads if _supports_workloads(preflight.plan) else _plan_workloads_stub
    payload = [{"source": w["source"], "name": w["name"], "env": list(w["env"]), "annotations": dict(w["annotations"]),
                "runtime": w["runtime"], "unknown": w["unknown"]} for w in send]
    try:
        a.report = plan(cfg, version, payload, functools.partial(open_source, **where), expander)
    except Exception as e:  # the host driver unknown, a bad target: the verdict is unknown, said why
        code, msg = describe(e)
        a.problems.append(msg)
        a.reasons.append("driver_unknown" if "host driver is unknown" in msg else "plan_error")
        return a
    rows = a.report.get("workloads")
    if not isinstance(rows, list):
        rows = [r for r in a.report.get("images", []) if isinstance(r, dict) and r.get("workload")]
    image_of = {w["name"]: w["image"] for w in items}
    for r in rows:
        r["workload_image"] = image_of.get(r.get("name"), r.get("image"))
    a.rows = _finish(rows, a.report)
    a.now = (a.report.get("driver") or {}).get("now")
    return a
