"""One pass's intent: everything the node agent will write after a pass, as plain data (pure: no clock, no I/O).

A pass is observe → reconcile → intent → apply (:meth:`.agent.Agent.run_pass`). :func:`intend` takes
what the pass observed (the :class:`~.reconcile.Snapshot`, the node's target, its GPU workloads and
their assessment, the decision log's counts), the agent's :class:`~.reconcile.Settings` and
:class:`Where` it publishes, its :class:`Previous` word (the doc it last decided, the details
ConfigMap as last read or written) and the clock, and returns one :class:`Intent` covering every
output: the Node's keys and the requests that make the Node say them (none when it already does),
the details (changed or not), the Event to send (or None, and why), the Lease's renewal, the state
file, the workloads record and the node-local files. :mod:`.applyintent` is the one step that
writes them; nothing else in the agent writes.

Each output's rule "write only on change" is read from the intent:

* the Node: :attr:`Intent.node_patch` has ``changed`` False when the Node already says every key;
* the details ConfigMap: :attr:`Intent.details_changed` (the details against those last read);
* the Event: :attr:`Intent.event` is None unless the verdict, the gate or the regressions changed
  (:func:`event_why`); a bad announcement changed to another bad one is news too;
* the Lease is renewed every pass (the heartbeat says the verdict is current);
* the files are written every pass (the textfile says when the last pass ran).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from . import detailscm, heartbeat, nodeapply, nodeevents, nodefiles, reconcile

__all__ = ["Where", "Previous", "FileWrite", "WorkloadsRecord", "LeaseRenewal", "Intent", "intend", "event_why",
           "STATE_FILE"]

#: The node-local state file (in the state dir): the doc on the Node, with its prefix.
STATE_FILE = "cluster-agent.json"


@dataclass(frozen=True)
class Where:
    """Where the agent publishes: its node, its namespace (details ConfigMap, Lease), its interval,
    the state dir, the NFD features file and the textfile (None: none), and how long a workload no
    pod runs stays in the record (:func:`..workload.workloads.max_age_of`)."""

    node: str
    namespace: str
    interval: float
    state_dir: str | None = None
    nfd_file: str | None = None
    textfile: str | None = None
    max_age: float | None = None


@dataclass(frozen=True)
class Previous:
    """What the agent said before: ``own``, the doc this process last decided under the current prefix
    (None: none yet; the Node's doc is read from the snapshot), and ``details``, the details
    ConfigMap's doc as last read or written, without its time (``{}``: none)."""

    own: dict | None = None
    details: dict | None = None


@dataclass(frozen=True)
class FileWrite:
    """A node-local file to replace whole (a temp file, then a rename)."""

    path: str
    text: str


@dataclass(frozen=True)
class WorkloadsRecord:
    """``<state-dir>/workloads.json`` to update (:func:`..workload.workloads.record`): the GPU workloads
    seen per host driver, merged with what the file already says."""

    state_dir: str
    pods: list
    driver: object
    sources: dict
    probe_namespace: str
    max_age: float | None
    claims: object = None


@dataclass(frozen=True)
class LeaseRenewal:
    """The heartbeat Lease (:mod:`.heartbeat`) renewed at ``now`` (epoch seconds)."""

    name: str
    namespace: str
    interval: float
    now: float


@dataclass(frozen=True)
class Intent:
    """Every output of one pass (see the module docstring)."""

    prefix: str
    findings: reconcile.Findings
    desired: reconcile.Desired
    #: the requests that make the Node say ``desired.keys`` (``changed`` False: none)
    node_patch: nodeapply.Writes
    details: dict
    details_changed: bool
    #: the Event to create (None: nothing to say) and why (:func:`event_why`)
    event: dict | None
    event_why: str | None
    lease: LeaseRenewal
    #: ``<state-dir>/cluster-agent.json`` (None: no state dir), written as soon as the Node is
    state_file: FileWrite | None
    record: WorkloadsRecord | None
    #: the NFD features file and the textfile, as configured
    files: tuple
    problem: str | None
    reasons: list
    #: the pass's clock (epoch seconds): every time an output says is this one
    now: float


def rfc3339(t: float) -> str:
    """RFC 3339 of ``t`` (epoch seconds), as the details ConfigMap and the Event say it.

    >>> rfc3339(0)
    '1970-01-01T00:00:00Z'
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def event_why(prev: dict | None, doc: dict, *, bad_announcement: bool, details_before: dict | None,
              problem: str | None) -> str | None:
    """Why an Event is sent about the Node (None: it is not): ``first`` (the Node had no doc of
    ours), ``changed`` (the verdict, the gate or the regressions, :func:`.nodeevents.event_signature`),
    ``announcement`` (a bad announcement changed to another bad one: the operator's fix did not take).

    >>> d = {"verdict": "pass", "gate": "clear", "regressions": 0, "reasons": []}
    >>> event_why(None, d, bad_announcement=False, details_before={}, problem=None)
    'first'
    >>> event_why(d, dict(d), bad_announcement=False, details_before={}, problem=None) is None
    True
    >>> event_why(d, dict(d, gate="held"), bad_announcement=False, details_before={}, problem=None)
    'changed'
    >>> event_why(d, dict(d), bad_announcement=True, details_before={"problem": "a"}, problem="b")
    'announcement'
    """
    if prev is None:
        return "first"
    if nodeevents.event_signature(prev) != nodeevents.event_signature(doc):
        return "changed"
    if bad_announcement and (prev.get("reasons") != doc.get("reasons")
                             or (details_before or {}).get("problem") != problem):
        return "announcement"
    return None


def intend(snap: reconcile.Snapshot, *, target, workloads, assessment, settings: reconcile.Settings,
           where: Where, previous: Previous, decisions: dict | None, now: float) -> Intent:
    """The :class:`Intent` of a pass (pure: the same inputs give an equal intent)."""
    tgt, ws, a, st = target, workloads, assessment, settings
    f = reconcile.findings(snap, target=tgt, workloads=ws, assessment=a, settings=st)
    meta = snap.node.get("metadata") if isinstance(snap.node.get("metadata"), dict) else {}
    d = reconcile.reconcile(meta, f, st, now=now, own=previous.own)
    patch = nodeapply.plan(where.node, meta, d.keys)
    doc, g = d.doc, d.gate
    problem = "; ".join(f.problems) or None
    reasons = sorted(set(f.reasons))
    details = detailscm.details_doc(node=where.node, verdict_=d.verdict, complete=f.complete, target=tgt.version,
                                    target_from=tgt.where, now=a.now, gate=g.state, gate_message=g.message,
                                    problem=problem, reasons=reasons, interval=where.interval, c=f.counts,
                                    rows=a.rows, pods=ws.pods, missing=a.missing, pods_seen=len(snap.pods),
                                    workloads=ws.items)
    bad = tgt.reason == "bad_announcement"
    why = event_why(d.previous, doc, bad_announcement=bad, details_before=previous.details, problem=problem)
    event = None if why is None else nodeevents.event(node=snap.node, details=details, when=rfc3339(now),
                                                      warning_reason=tgt.reason if bad else None)
    state_file = record = None
    if where.state_dir:
        state_file = FileWrite(os.path.join(where.state_dir, STATE_FILE),
                               json.dumps(dict(doc, prefix=st.prefix), separators=(",", ":")) + "\n")
        sources: dict = {}
        for w in ws.items:
            if w.get("source"):
                sources.setdefault(w["source"], []).append(w["image"])
        # nothing is recorded while the driver is unknown (workloads.record says so)
        record = WorkloadsRecord(state_dir=where.state_dir, pods=list(snap.pods), driver=a.now, sources=sources,
                                 probe_namespace=where.namespace, max_age=where.max_age, claims=snap.claims)
    files = []
    if where.nfd_file:
        files.append(FileWrite(where.nfd_file, nodefiles.nfd_text(st.prefix, doc)))
    if where.textfile:
        files.append(FileWrite(where.textfile, nodefiles.textfile_text(details, now, decisions)))
    return Intent(prefix=st.prefix, findings=f, desired=d, node_patch=patch, details=details,
                  details_changed=details != (previous.details or {}), event=event, event_why=why,
                  lease=LeaseRenewal(name=where.node, namespace=where.namespace, interval=where.interval, now=now),
                  state_file=state_file, record=record, files=tuple(files), problem=problem, reasons=reasons, now=now)


def lease_object(r: LeaseRenewal, *, acquired: str | None, resource_version: str | None) -> dict:
    """The Lease that renews ``r`` (its ``acquireTime`` kept, on the resourceVersion last read)."""
    return heartbeat.lease(name=r.name, namespace=r.namespace, interval=r.interval, now=r.now, acquired=acquired,
                           resource_version=resource_version or None)
