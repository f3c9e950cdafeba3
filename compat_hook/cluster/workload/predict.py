"""The node's GPU workloads on the target driver: their images found in the node's store, then ``plan``.

:func:`assess` matches each workload's image (the pod's reference) to a source
in the node's store (:mod:`.refs`), and asks the policy layer's ``plan`` for one
row per workload: its outcome on the driver now and on the target, for the
compat-hook outcome or the NVIDIA toolkit's alone (the workload's ``runtime``),
and whether it regresses. Images not in the store are listed, not assessed.

A precompiled branch target (``570``) is assessed as the branch's first release
(``570.0``): the branch fixes the highest CUDA version and the GPUs supported.

The workloads go to :func:`compat_hook.policy.preflight.plan` as its contract
says: ``{"source", "name", "env", "annotations", "runtime", "unknown"}`` each,
``env`` the container's from the pod spec (laid over the image's there),
``runtime`` ``compat-hook`` or ``toolkit``. Its workload rows (``"workload":
true``, in the report's ``images`` after the images, none here) carry ``now``,
``after`` (the outcome of the workload's runtime), ``compat_hook_after``,
``toolkit_only_after`` and ``regression``.

>>> [w["runtime"] for w in _payload([{"source": "oci:/s:a", "name": "ns/p:c", "env": ("A=1",), "annotations": {},
...                                   "runtime": "toolkit", "unknown": None, "image": "r/a:1", "pods": []}])]
['toolkit']
"""

from __future__ import annotations

import functools

from ...core.errors import describe
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


def assess(cfg, *, version: str | None, workloads, stores: list, address, namespace: str) -> Assessment:
    """See the module docstring; ``workloads`` is a :class:`~.pods.Workloads`.

    A pass reads with an image reader of its own, closed when it ends: the process's shared one would
    keep every file it spooled (its private temp dir, bounded to ``Limits.max_spool_bytes`` in all)
    for the agent's lifetime, until every image needing a spool failed, and its cached store
    listings would hide images pulled since.
    """
    from ...images.reader import Reader

    reader = Reader()
    try:
        return _assess(cfg, version=version, workloads=workloads, stores=stores, address=address,
                       namespace=namespace, reader=reader)
    finally:
        reader.close()


def _assess(cfg, *, version, workloads, stores: list, address, namespace: str, reader) -> Assessment:
    from ...images.sources import expand, open_source

    a = Assessment()
    where = {"address": address, "namespace": namespace, "reader": reader}
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
        # No target, nothing to predict; the node's driver still counts: the workloads record the
        # validator proves after a driver change is kept per driver, announced or not.
        a.now = _driver_now(cfg)
        return a
    from ...policy import preflight

    try:
        a.report = preflight.plan(cfg, [], driver=version, opener=functools.partial(open_source, **where),
                                  expander=expander, workloads=_payload(send))
    except Exception as e:  # the host driver unknown, a bad target: the verdict is unknown, said why
        code, msg = describe(e)
        a.problems.append(msg)
        a.reasons.append("driver_unknown" if "host driver is unknown" in msg else "plan_error")
        return a
    rows = [r for r in a.report.get("images") or [] if isinstance(r, dict) and r.get("workload")]
    image_of = {w["name"]: w["image"] for w in items}
    for r in rows:
        r["workload_image"] = image_of.get(r.get("name"), r.get("image"))
    a.rows = rows
    a.now = (a.report.get("driver") or {}).get("now")
    return a


def _driver_now(cfg) -> str | None:
    """The loaded kernel module's version under ``host_root`` (None while there is none)."""
    import os

    from ...facts.hostfacts import parse_proc_version

    try:
        with open(os.path.join(getattr(cfg, "host_root", "/") or "/", "proc/driver/nvidia/version"), "rb") as f:
            return parse_proc_version(f.read(65536).decode("utf-8", "replace"))
    except OSError:
        return None


def _payload(workloads: list) -> list:
    """The policy layer's workload dicts (module docstring) of :class:`~.pods.Workloads` items."""
    return [{"source": w["source"], "name": w["name"], "env": list(w["env"]), "annotations": dict(w["annotations"]),
             "runtime": w["runtime"], "unknown": w["unknown"]} for w in workloads]
