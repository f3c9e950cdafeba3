"""``compat-hook cluster release``: take compat-hook's holds off, so that none outlives its agent.

A hold is compat-hook's when the Node carries both the skip label
``nvidia.com/gpu-driver-upgrade.skip=true`` and the annotation
``<prefix>/holds-upgrade``; release removes both together, with one patch
conditional on the Node's resourceVersion (a concurrent change is read again),
and with them the agent's last word on the Node, the annotation
``<prefix>/preflight`` (its labels stay): an agent installed afterwards starts
fresh, and holds again where a workload regresses, instead of reading its
predecessor's ``held`` with both keys gone as a hold someone released for good
(an agent still running when release runs, as under ``helm uninstall``, does
not hold again, and writes back a doc that binds only the agents of its own
installation: :mod:`.reconcile`).
A skip label without that annotation is someone else's and is never touched.
Release also takes the validator's taint ``<prefix>/validation-failed`` off
(:func:`taints_without`, the rest of the Node's taints kept as they are, in the
same conditional patch): once compat-hook is released nothing of it may keep a
node out of service, and the agent that would prove the node again is going.
Several prefixes can be given (``--prefix``, repeatable): the holds of an agent
that ran with another ``cluster.label_prefix`` are found and released too.

With ``--purge`` (``helm uninstall``'s pre-delete Job, unless the chart's
``release.keepPublished``) it removes everything compat-hook wrote, not only the holds:
every label and annotation under the prefixes on every Node (the preflight's,
``validated``, the override), the skip label where it was compat-hook's hold, the
validator's taint,
and the agents' Leases and ConfigMaps in their namespace (only those labelled
as the agents' own). An agent still running sees its Node purged and writes
nothing more until it restarts (:meth:`~.agent.Agent.run`); one caught in the
middle of a pass may write once more, so the sweep is repeated until it finds
nothing (:data:`SWEEPS` at most).

``--all`` also takes the label ``<prefix>/registration`` (how the chart registered the
node: :data:`.nodedoc.REGISTRATIONS`) off every Node that has one: the chart that said
it is going.

Run by the Helm chart's pre-delete hook, and by hand after turning the agent
off. Exit status: 0 done (also when there was nothing to release), 1 an API
error, 2 bad usage, 4 ``--node NAME`` names no node.

>>> ours({"labels": {SKIP_LABEL: "true"}, "annotations": {"p.io/holds-upgrade": "x"}}, ["p.io"])
['p.io']
>>> ours({"labels": {SKIP_LABEL: "true"}, "annotations": {}}, ["p.io"])
[]
>>> release_patch({"resourceVersion": "7"}, ["p.io"])
{'metadata': {'resourceVersion': '7', 'labels': {'nvidia.com/gpu-driver-upgrade.skip': None}, 'annotations': {'p.io/holds-upgrade': None, 'p.io/preflight': None}}}
>>> node = {"spec": {"taints": [{"key": "p.io/validation-failed", "value": "470", "effect": "NoSchedule"},
...                             {"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}
>>> taints_without(node, ["p.io"])
([{'key': 'nvidia.com/gpu', 'effect': 'NoSchedule'}], ['p.io/validation-failed'])
>>> release_patch({"resourceVersion": "7"}, [], taints=[])
{'metadata': {'resourceVersion': '7'}, 'spec': {'taints': []}}
"""

from __future__ import annotations

from .gate import SKIP_LABEL
from ..api.kube import Conflict

__all__ = ["release", "ours", "release_patch", "purge", "purge_patch", "taints_without", "TAINT"]

#: The validator's taint under each prefix (compat_hook/cluster/node/validate.py ``TAINT``).
TAINT = "validation-failed"

PAGE = 500
RETRIES = 4
#: Sweeps of a purge at most, :data:`SETTLE` seconds apart, until one finds nothing left.
SWEEPS = 5
SETTLE = 1.0
#: The labels of the agents' Leases and ConfigMaps (compat_hook/cluster/node/detailscm.py).
AGENT_OBJECTS = "app.kubernetes.io/name=compat-hook,app.kubernetes.io/component=preflight"


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def ours(meta: dict, prefixes: list) -> list:
    """The prefixes whose hold is on this Node (skip label and that prefix's annotation)."""
    labels, anns = _map(meta.get("labels")), _map(meta.get("annotations"))
    if labels.get(SKIP_LABEL) != "true":
        return []
    return [p for p in prefixes if f"{p}/holds-upgrade" in anns]


def taints_without(node: dict, prefixes: list) -> tuple | None:
    """``(taints left, keys removed)``: the Node's taints without compat-hook's ``<prefix>/validation-failed``
    (everyone else's as they are, in their order); None when it carries none of them."""
    taints = _map(node.get("spec")).get("taints")
    old = [t for t in (taints if isinstance(taints, list) else []) if isinstance(t, dict)]
    keys = {f"{p}/{TAINT}" for p in prefixes}
    left = [t for t in old if t.get("key") not in keys]
    if len(left) == len(old):
        return None
    return left, sorted({str(t.get("key")) for t in old if t.get("key") in keys})


def release_patch(meta: dict, prefixes: list, taints: list | None = None) -> dict:
    """The patch that releases the holds of ``prefixes`` (none: no label or annotation) and, with ``taints``,
    sets the Node's taints to that list (taints are one atomic list: written whole, over the version read)."""
    patch: dict = {"metadata": {"resourceVersion": str(meta.get("resourceVersion") or "")}}
    if prefixes:
        patch["metadata"]["labels"] = {SKIP_LABEL: None}
        patch["metadata"]["annotations"] = {f"{p}/{key}": None for p in prefixes
                                            for key in ("holds-upgrade", "preflight")}
    if taints is not None:
        patch["spec"] = {"taints": taints}
    return patch


def _nodes(kube, **query) -> list:
    """Nodes by a list (the release Job may list and patch Nodes, nothing else), page by page."""
    nodes, cont = [], None
    while True:
        doc = kube.get("/api/v1/nodes", limit=PAGE, **query, **({"continue": cont} if cont else {}))
        nodes += [n for n in doc.get("items") or [] if isinstance(n, dict)]
        cont = _map(doc.get("metadata")).get("continue")
        if not cont:
            return nodes


def _patch_node(kube, node: dict, plan):
    """Patch ``node`` with ``plan(node)`` -> ``(patch, result)`` under its resourceVersion, reading it
    again on a conflict; ``result`` once applied, ``None`` when there is nothing to patch (any more)."""
    name = _map(node.get("metadata")).get("name")
    for attempt in range(RETRIES):
        patch, result = plan(node)
        if patch is None:
            return None
        try:
            kube.patch(f"/api/v1/nodes/{name}", patch)
            return result
        except Conflict:
            if attempt == RETRIES - 1:
                raise
            again = _nodes(kube, fieldSelector=f"metadata.name={name}")
            if not again:
                return None
            node = again[0]
    return None


def _one(kube, node: dict, prefixes: list) -> tuple:
    """Release ``node``'s holds and take the validator's taint off: ``(prefixes released, taint keys
    removed)`` (a conflict reads the Node again)."""
    def plan(n):
        meta = _map(n.get("metadata"))
        mine = ours(meta, prefixes)
        tainted = taints_without(n, prefixes)
        if not mine and tainted is None:
            return None, None
        return (release_patch(meta, mine, tainted[0] if tainted else None),
                (mine, tainted[1] if tainted else []))

    return _patch_node(kube, node, plan) or ([], [])


def release(kube, prefixes: list, node: str | None = None, out=None) -> list:
    """Release compat-hook's holds and the validator's taints on ``node`` (None: every node);
    ``[(node, [prefixes])]`` whose hold was released, None when ``node`` does not exist."""
    done = []
    if node is not None:
        nodes = _nodes(kube, fieldSelector=f"metadata.name={node}")
        if not nodes:
            if out is not None:
                out.write(f"{node}: no such node\n")
            return None
    else:
        # every Node: a taint cannot be selected for (the skip label could, the taint not)
        nodes = _nodes(kube)
    for n in nodes:
        name = str(_map(n.get("metadata")).get("name"))
        mine, untainted = _one(kube, n, prefixes)
        if untainted and out is not None:
            out.write(f"removed the taint {', '.join(untainted)} from {name}\n")
        if mine:
            done.append((name, mine))
            if out is not None:
                out.write(f"released the hold on {name} ({', '.join(p + '/holds-upgrade' for p in mine)} and "
                          f"{SKIP_LABEL})\n")
        elif out is not None and node is not None and not untainted:
            out.write(f"{name}: no hold of compat-hook's (a skip label without {prefixes[0]}/holds-upgrade "
                      f"is someone else's)\n")
    if node is None:
        _drop_registration(kube, prefixes, out)
    return done


def _under(key: str, prefixes: list) -> bool:
    return any(key.startswith(p + "/") for p in prefixes)


def purge_patch(meta: dict, prefixes: list, spec: dict | None = None) -> dict | None:
    """Every key under ``prefixes`` removed (and the skip label where it is compat-hook's hold, and with
    the Node's ``spec`` the validator's taint); None: nothing of compat-hook's on this Node.

    >>> purge_patch({"resourceVersion": "3", "labels": {"p.io/preflight": "pass", "team": "a"},
    ...              "annotations": {"p.io/preflight": "{}", "other.io/x": "1"}}, ["p.io"])
    {'metadata': {'resourceVersion': '3', 'labels': {'p.io/preflight': None}, 'annotations': {'p.io/preflight': None}}}
    >>> purge_patch({"labels": {SKIP_LABEL: "true"}}, ["p.io"]) is None
    True
    >>> purge_patch({}, ["p.io"], {"taints": [{"key": "p.io/validation-failed", "effect": "NoSchedule"}]})["spec"]
    {'taints': []}
    """
    labels, anns = _map(meta.get("labels")), _map(meta.get("annotations"))
    drop_labels = {k: None for k in labels if _under(k, prefixes)}
    if ours(meta, prefixes):
        drop_labels[SKIP_LABEL] = None
    drop_anns = {k: None for k in anns if _under(k, prefixes)}
    tainted = taints_without({"spec": spec}, prefixes) if spec is not None else None
    if not drop_labels and not drop_anns and tainted is None:
        return None
    patch: dict = {"metadata": {"resourceVersion": str(meta.get("resourceVersion") or ""), "labels": drop_labels,
                                "annotations": drop_anns}}
    if tainted is not None:
        patch["spec"] = {"taints": tainted[0]}
    return patch


def _purge_node(kube, node: dict, prefixes: list) -> bool:
    return bool(_patch_node(kube, node, lambda n: (purge_patch(_map(n.get("metadata")), prefixes,
                                                               _map(n.get("spec"))), True)))


def _purge_objects(kube, namespace: str) -> list:
    """The agents' Leases and ConfigMaps in ``namespace`` deleted (each only as the object listed: its uid
    is the delete's precondition); ``["Lease/NAME", ...]``."""
    from ..api.kube import NotFound

    gone = []
    for kind, path in (("Lease", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"),
                       ("ConfigMap", f"/api/v1/namespaces/{namespace}/configmaps")):
        try:
            items = kube.get(path, labelSelector=AGENT_OBJECTS).get("items") or []
        except NotFound:
            continue
        for o in items:
            meta = _map(_map(o).get("metadata"))
            name, uid = meta.get("name"), meta.get("uid")
            if not name:
                continue
            try:
                kube.request("DELETE", f"{path}/{name}", body={"kind": "DeleteOptions", "apiVersion": "v1",
                                                               "preconditions": {"uid": uid}})
                gone.append(f"{kind}/{name}")
            except (NotFound, Conflict):
                pass  # gone already, or replaced: the next sweep sees it
    return gone


def purge(kube, prefixes: list, namespace: str, out=None, sleep=None) -> dict:
    """Everything compat-hook wrote (module docstring): ``{"nodes": [names], "objects": [...], "sweeps": n}``."""
    import time

    sleep = sleep or time.sleep
    nodes_done, objects_done, sweeps = [], [], 0
    for sweeps in range(1, SWEEPS + 1):
        found = False
        for n in _nodes(kube):
            name = str(_map(n.get("metadata")).get("name"))
            if _purge_node(kube, n, prefixes):
                found = True
                if name not in nodes_done:
                    nodes_done.append(name)
                    if out is not None:
                        out.write(f"removed compat-hook's labels and annotations from {name}\n")
        gone = _purge_objects(kube, namespace)
        found = found or bool(gone)
        for g in gone:
            if g not in objects_done:
                objects_done.append(g)
                if out is not None:
                    out.write(f"deleted {namespace}/{g}\n")
        if not found:
            break
        sleep(SETTLE)  # an agent in the middle of a pass may write once more: look again
    return {"nodes": nodes_done, "objects": objects_done, "sweeps": sweeps}


def _drop_registration(kube, prefixes: list, out) -> None:
    """``<prefix>/registration`` off every Node (a label removal: no resourceVersion needed, and one
    already gone is no error)."""
    for p in prefixes:
        key = f"{p}/registration"
        for n in _nodes(kube, labelSelector=key):
            name = str(_map(n.get("metadata")).get("name"))
            kube.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {key: None}}})
            if out is not None:
                out.write(f"removed the label {key} from {name}\n")
