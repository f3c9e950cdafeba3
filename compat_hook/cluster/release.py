"""``compat-hook cluster release``: take compat-hook's holds off, so that none outlives its agent.

A hold is compat-hook's when the Node carries both the skip label
``nvidia.com/gpu-driver-upgrade.skip=true`` and the annotation
``<prefix>/holds-upgrade``; release removes both together, with one patch
conditional on the Node's resourceVersion (a concurrent change is read again),
and with them the agent's last word on the Node, the annotation
``<prefix>/preflight`` (its labels stay): an agent installed afterwards starts
fresh, and holds again where a workload regresses, instead of reading its
predecessor's ``held`` with both keys gone as a hold someone released for good
(an agent still running when release runs, as under ``helm uninstall``,
remembers what it published and does not hold again until it is restarted).
A skip label without that annotation is someone else's and is never touched.
Several prefixes can be given (``--prefix``, repeatable): the holds of an agent
that ran with another ``cluster.label_prefix`` are found and released too.

``--all`` also takes the label ``<prefix>/registration`` (how the chart registered the
node: :data:`.publish.REGISTRATIONS`) off every Node that has one: the chart that said
it is going.

Run by the Helm chart's pre-delete hook, and by hand after turning the agent
off. Exit status: 0 done (also when there was nothing to release), 1 an API
error, 2 bad usage.

>>> ours({"labels": {SKIP_LABEL: "true"}, "annotations": {"p.io/holds-upgrade": "x"}}, ["p.io"])
['p.io']
>>> ours({"labels": {SKIP_LABEL: "true"}, "annotations": {}}, ["p.io"])
[]
>>> release_patch({"resourceVersion": "7"}, ["p.io"])
{'metadata': {'resourceVersion': '7', 'labels': {'nvidia.com/gpu-driver-upgrade.skip': None}, 'annotations': {'p.io/holds-upgrade': None, 'p.io/preflight': None}}}
"""

from __future__ import annotations

from .gate import SKIP_LABEL
from .kube import Conflict

__all__ = ["release", "ours", "release_patch"]

PAGE = 500
RETRIES = 4


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def ours(meta: dict, prefixes: list) -> list:
    """The prefixes whose hold is on this Node (skip label and that prefix's annotation)."""
    labels, anns = _map(meta.get("labels")), _map(meta.get("annotations"))
    if labels.get(SKIP_LABEL) != "true":
        return []
    return [p for p in prefixes if f"{p}/holds-upgrade" in anns]


def release_patch(meta: dict, prefixes: list) -> dict:
    return {"metadata": {"resourceVersion": str(meta.get("resourceVersion") or ""), "labels": {SKIP_LABEL: None},
                         "annotations": {f"{p}/{key}": None for p in prefixes for key in ("holds-upgrade", "preflight")}}}


def _nodes(kube, **query) -> list:
    """Nodes by a list (the release Job may list and patch Nodes, nothing else), page by page."""
    nodes, cont = [], None
    while True:
        doc = kube.get("/api/v1/nodes", limit=PAGE, **query, **({"continue": cont} if cont else {}))
        nodes += [n for n in doc.get("items") or [] if isinstance(n, dict)]
        cont = _map(doc.get("metadata")).get("continue")
        if not cont:
            return nodes


def _one(kube, node: dict, prefixes: list) -> list:
    """Release ``node``'s holds; the prefixes released (a conflict reads the Node again)."""
    name = _map(node.get("metadata")).get("name")
    for attempt in range(RETRIES):
        meta = _map(node.get("metadata"))
        mine = ours(meta, prefixes)
        if not mine:
            return []
        try:
            kube.patch(f"/api/v1/nodes/{name}", release_patch(meta, mine))
            return mine
        except Conflict:
            if attempt == RETRIES - 1:
                raise
            again = _nodes(kube, fieldSelector=f"metadata.name={name}")
            if not again:
                return []
            node = again[0]
    return []


def release(kube, prefixes: list, node: str | None = None, out=None) -> list:
    """Release compat-hook's holds on ``node`` (None: every node); ``[(node, [prefixes])]`` released."""
    done = []
    if node is not None:
        nodes = _nodes(kube, fieldSelector=f"metadata.name={node}")
        if not nodes and out is not None:
            out.write(f"{node}: no such node\n")
    else:
        nodes = _nodes(kube, labelSelector=f"{SKIP_LABEL}=true")
    for n in nodes:
        name = str(_map(n.get("metadata")).get("name"))
        mine = _one(kube, n, prefixes)
        if mine:
            done.append((name, mine))
            if out is not None:
                out.write(f"released the hold on {name} ({', '.join(p + '/holds-upgrade' for p in mine)} and "
                          f"{SKIP_LABEL})\n")
        elif out is not None and node is not None:
            out.write(f"{name}: no hold of compat-hook's (a skip label without {prefixes[0]}/holds-upgrade "
                      f"is someone else's)\n")
    if node is None:
        _drop_registration(kube, prefixes, out)
    return done


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
