"""The node agent's one writer: applies a pass's :class:`~.intent.Intent` (every API and file write).

:func:`apply` writes, in this order, what the intent says:

1. the Node's keys (:func:`write_node`: the merge patch, then the server-side apply, planned by
   :func:`.nodeapply.plan`), only when the Node does not already say them. A 409 (the Node changed
   since it was read) writes nothing more: :func:`apply` returns ``conflict`` and the agent reads
   the Node again, computes the intent again and applies that;
2. ``settled(node)``: the agent's memory of what it said (its last word, the watch cache), before
   anything below may fail;
3. the state file (``cluster-agent.json``), at once: the error line's ``last_result`` reads it;
4. the details ConfigMap, only when the details changed (:class:`Owned`: a create, or an update
   conditional on its resourceVersion);
5. the Event, when the intent has one;
6. the Lease, renewed every pass (its ``acquireTime`` kept);
7. ``workloads.json`` and the node-local files (the NFD features file, the textfile).

A file that cannot be written is one log line (never fatal); an API error ends the pass (the
agent's loop says it and backs off).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import detailscm, nodeapply
from .intent import Intent, lease_object, rfc3339
from ..api.kube import Conflict, NotFound

__all__ = ["Owned", "Applied", "apply", "write_node", "write_file", "details_of", "acquired"]


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def acquired(lease) -> str | None:
    """The Lease's ``acquireTime``, kept across renewals: a MicroTime, else None (a new one is taken).

    >>> acquired({"spec": {"acquireTime": "2026-12-07T04:00:00.000000Z"}}), acquired({"spec": {"acquireTime": [[1]]}})
    ('2026-12-07T04:00:00.000000Z', None)
    """
    v = _map(_map(lease).get("spec")).get("acquireTime")
    return v if isinstance(v, str) and len(v) <= 40 else None


def details_of(cm) -> dict:
    """The details a ConfigMap says, without their time (``{}``: none, or not ours)."""
    old = (detailscm.details_of(cm) or {}) if cm is not None else {}
    old.pop("time", None)
    return old


class Owned:
    """One object of the agent's own in its namespace, named after its node (the details ConfigMap, the
    Lease): read once (:meth:`read`), then remembered (its resourceVersion and what it says,
    ``parse(obj or None)``); written by :meth:`put`: a create, or an update conditional on that
    resourceVersion, of ``build(content, said, resource_version, now)``; a conflict (someone else
    wrote it, or it appeared) reads it again, once. With ``always`` every put writes (the
    heartbeat); else only a change does."""

    def __init__(self, agent, path: str, parse, build, always: bool = False) -> None:
        self.agent, self.path, self.parse, self.build, self.always = agent, path, parse, build, always
        self.known = False
        self.rv = None
        self.said = None

    def _path(self) -> str:
        return self.path.format(ns=self.agent.opts.publish_namespace)

    def read(self):
        """What it says (read from the API server the first time, and after a conflict)."""
        if not self.known:
            try:
                cur = self.agent.kube.get(f"{self._path()}/{self.agent.opts.node}")
                self.rv, self.said = str(_map(cur.get("metadata")).get("resourceVersion") or ""), self.parse(cur)
            except NotFound:
                self.rv, self.said = None, self.parse(None)
            self.known = True
        return self.said

    def put(self, content, now: float) -> bool:
        kube, opts = self.agent.kube, self.agent.opts
        path = self._path()
        for attempt in range(2):
            self.read()
            if not self.always and self.said == content:
                return False
            obj = self.build(content, self.said, self.rv, now)
            try:
                new = (kube.update(f"{path}/{opts.node}", obj) if self.rv
                       else _in_namespace(lambda: kube.create(path, obj), opts.publish_namespace))
            except Conflict:
                self.known = False
                if attempt:
                    raise
                continue
            self.rv = str(_map(new.get("metadata")).get("resourceVersion") or "")
            self.said = self.parse(new) if self.always else content
            return True
        return False


def details_owned(agent) -> Owned:
    """The details ConfigMap (written when the details change)."""
    def build(doc, _said, rv, now):
        obj = detailscm.configmap(name=agent.opts.node, namespace=agent.opts.publish_namespace, doc=doc,
                                  when=rfc3339(now))
        if rv:
            obj["metadata"]["resourceVersion"] = rv
        return obj

    return Owned(agent, "/api/v1/namespaces/{ns}/configmaps", details_of, build)


def lease_owned(agent) -> Owned:
    """The heartbeat Lease (renewed every pass; its acquireTime kept)."""
    return Owned(agent, "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", acquired,
                 lambda renewal, acq, rv, _now: lease_object(renewal, acquired=acq, resource_version=rv),
                 always=True)


def _in_namespace(create, namespace: str):
    """``create()``; a 404 there means the namespace itself is missing (the agent run by hand without
    the chart's namespace): said in one line, not as the API server's Status body."""
    try:
        return create()
    except NotFound:
        raise NotFound(f"the namespace {namespace} does not exist: the agent publishes its details and "
                       f"heartbeat there (install the chart, create it, or pass --publish-namespace)", 404) from None


def write_node(kube, name: str, w: nodeapply.Writes, manager: str = nodeapply.MANAGER) -> dict | None:
    """Send :func:`.nodeapply.plan`'s requests; the Node as the last one left it (None: nothing sent). A
    :class:`~..api.kube.Conflict` (409) means the Node changed since it was read: the caller reads it
    again and plans again. The apply after a removal goes on the removal's resourceVersion (it was
    planned on the Node before the removal, which changed nothing else)."""
    node = None
    path = f"/api/v1/nodes/{name}"
    if w.remove is not None:
        node = kube.patch(path, w.remove, merge="json")
    if w.apply is not None:
        body = w.apply
        if node is not None:
            body = dict(body, metadata=dict(body["metadata"], resourceVersion=str(
                _map(node.get("metadata")).get("resourceVersion") or "")))
        node = kube.apply(path, body, manager=manager, force=w.force)
    return node


def write_file(path: str, text: str) -> None:
    """Temp file then rename (readers - NFD, node_exporter - never see half a file)."""
    from ...core import atomic

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic.replace(path, text.encode(), 0o644)


@dataclass
class Applied:
    """What :func:`apply` did: ``node_write`` (``written``, ``unchanged`` or ``conflict``, with the
    409 in ``conflict``), the Node as written (None: not written), whether the details were written
    and the Event sent."""

    node_write: str
    node: dict | None = None
    details_written: bool = False
    event_sent: bool = False
    conflict: Exception | None = None


def apply(agent, it: Intent, *, settled, log) -> Applied:
    """Write what ``it`` says (the module docstring gives the order). ``agent``: what holds the client
    (``kube``), the options and the :class:`Owned` details (``details_cm``) and Lease (``lease``);
    ``settled(node or None)`` is called once the Node says the intent; ``log(record)`` says a file
    that could not be written."""
    kube, node_name = agent.kube, agent.opts.node
    done = Applied("unchanged")
    if it.node_patch.changed:
        try:
            done.node = write_node(kube, node_name, it.node_patch)
        except Conflict as e:
            return Applied("conflict", conflict=e)
        done.node_write = "written"
    settled(done.node)
    if it.state_file is not None:  # what the Node now says, on the node at once
        _files(node_name, log, lambda: write_file(it.state_file.path, it.state_file.text))
    if it.details_changed:
        done.details_written = agent.details_cm.put(it.details, it.now)
    if it.event is not None:
        from .nodeevents import EVENT_NAMESPACE

        kube.create(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", it.event)
        done.event_sent = True
    agent.lease.put(it.lease, it.now)

    def outputs():
        if it.record is not None:
            from ..workload import workloads

            r = it.record
            workloads.record(r.state_dir, r.pods, driver=r.driver, sources=r.sources,
                             probe_namespace=r.probe_namespace, max_age=r.max_age, claims=r.claims)
        for f in it.files:
            write_file(f.path, f.text)

    _files(node_name, log, outputs)
    return done


def _files(node: str, log, write) -> None:
    """``write()``; an OSError is one log line (a node-local file is never fatal to the pass)."""
    from ...core.errors import describe

    try:
        write()
    except OSError as e:
        log({"event": "cluster_output_error", "node": node, "reason": "os_error", "message": describe(e)[1]})
