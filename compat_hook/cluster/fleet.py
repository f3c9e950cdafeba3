"""``compat-hook cluster fleet``: the one writer of what the fleet has judged, for the driver-version admission policy.

The chart's ValidatingAdmissionPolicy ``compat-hook-fleet-driver-version`` refuses an update of a
ClusterPolicy's ``spec.driver.version`` or an NVIDIADriver's ``spec.version`` until every GPU node in
the object's scope has a fresh verdict for the new version and every node that would regress is held.
A policy sees one object and its parameter, never the fleet, so this controller keeps the parameter:
the ConfigMap :data:`PARAM_NAME` in the release namespace, one key per object and version
(:func:`param_key`), whose value is :data:`OK` or which nodes block it and why (:func:`reconcile`).

It is a controller in three steps:

* observe (:func:`observe`): a :class:`Snapshot` from watch caches (:mod:`.reflector`): the GPU Nodes
  (two watches: ``nvidia.com/gpu.present=true`` and ``<prefix>/preflight``, the nodes ``cluster status``
  shows), the agents' Leases, the ClusterPolicies and the NVIDIADrivers;
* reconcile (:func:`reconcile`, pure): for each object, its versions (the spec's and an announced
  ``<prefix>/next-driver``) and its scope (a ClusterPolicy: every GPU node; an NVIDIADriver: the GPU
  nodes its ``nodeSelector`` and ``nodeAffinity`` select, :func:`.target.selects`); each node judged by
  ``cluster status``'s own row (:func:`.status.node_row`, so the policy and ``status`` never disagree
  on what is fresh or held, :func:`judge`);
* apply (:func:`apply`): a server-side apply of the ConfigMap's ``data`` with field manager
  :data:`FIELD_MANAGER`, only when it differs from what the ConfigMap holds.

Only the leader applies (:mod:`.leader`: the Lease :data:`PARAM_NAME` in the same namespace); a second
replica stands by and takes over when the leader's Lease runs out, or at once when the leader
releases it on SIGTERM. A Lease expires without any event, so the leader reconciles again every
``resync`` seconds as well as on every change of its caches; it writes only when the result changed.
While a cache is not current (its watch broke) it writes nothing: the ConfigMap keeps its last word,
and a version never judged has no key there (refused).

>>> node = {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true", "pool": "a"}}}
>>> cp = {"metadata": {"name": "cluster-policy"}, "spec": {"driver": {"version": "535.261.03"}}}
>>> snap = Snapshot(nodes=(node,), leases={}, policies=(cp,), drivers=(), now=0.0)
>>> reconcile(snap, "compat-hook.io")
{'clusterpolicy_cluster-policy_535.261.03': 'not judged on 1 of 1 node(s): gpu-a (no verdict)'}
"""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass, field

from . import status as statusmod
from . import target as targetmod
from .backoff import Backoff, jittered
from .kube import KubeError, NotFound

__all__ = ["Snapshot", "reconcile", "judge", "param_key", "observe", "apply", "Fleet", "FleetOptions", "run",
           "PARAM_NAME", "FIELD_MANAGER", "OK", "OVERRIDE"]

#: The ConfigMap the policy reads (its ``paramRef``) and the Lease of the election: both the chart's.
PARAM_NAME = "compat-hook-fleet"
FIELD_MANAGER = "compat-hook-fleet"
#: The value of a key whose version every node in scope has judged.
OK = "ok"
#: The annotation (under the label prefix) that lets one version through unjudged: its value is that version.
OVERRIDE = "allow-unjudged-driver"
#: The labels of the chart's Lease and ConfigMap of the fleet controller.
LABELS = {"app.kubernetes.io/name": "compat-hook", "app.kubernetes.io/component": "fleet"}
#: Nodes named in one refusal at most (the rest are counted).
MAX_NAMED = 8
MAX_REASON = 80
#: A ConfigMap key: what the API server accepts, and what the policy's CEL builds.
_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
KINDS = {"clusterpolicy": "ClusterPolicy", "nvidiadriver": "NVIDIADriver"}


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _name(obj) -> str:
    return str(_map(_map(obj).get("metadata")).get("name") or "")


@dataclass(frozen=True)
class Snapshot:
    """What the caches held at one moment: the GPU Nodes, the agents' Leases by node name, the
    ClusterPolicies, the NVIDIADrivers, and the wall-clock time the freshness is judged at."""

    nodes: tuple
    leases: dict = field(default_factory=dict)
    policies: tuple = ()
    drivers: tuple = ()
    now: float = 0.0


def param_key(kind: str, name: str, version: str) -> str | None:
    """The ConfigMap key for ``kind`` (``clusterpolicy``/``nvidiadriver``), object ``name`` and ``version``,
    as the policy's CEL builds it; None when the API server would refuse it (a key longer than 253).
    ``_`` separates: neither an object name nor a driver version has one.

    >>> param_key("nvidiadriver", "pool-a", "570.195.03"), param_key("clusterpolicy", "x" * 250, "570.195.03")
    ('nvidiadriver_pool-a_570.195.03', None)
    """
    key = f"{kind}_{name}_{version}"
    return key if _KEY.fullmatch(key) else None


def versions(obj: dict, kind: str, prefix: str) -> list:
    """The versions of ``obj`` worth a key: its spec's and an announced ``<prefix>/next-driver``, each only
    when it is a version the operator takes (:func:`.target.check_version`).

    >>> nd = {"metadata": {"annotations": {"p.io/next-driver": "570.195.03"}}, "spec": {"version": "535.261.03"}}
    >>> versions(nd, "nvidiadriver", "p.io")
    ['535.261.03', '570.195.03']
    >>> versions({"spec": {"driver": {"version": "latest"}}}, "clusterpolicy", "p.io")
    []
    """
    spec = _map(obj.get("spec"))
    if kind == "clusterpolicy":
        spec = _map(spec.get("driver"))
    precompiled = spec.get("usePrecompiled") is True
    out = []
    for raw in (spec.get("version"), _map(_map(obj.get("metadata")).get("annotations")).get(f"{prefix}/next-driver")):
        v, _, problem = targetmod.check_version(raw, precompiled)
        if v is not None and problem is None and v not in out:
            out.append(v)
    return out


def judge(row: dict | None, version: str) -> str | None:
    """Why ``row`` (:func:`.status.node_row`, judged against ``version``) blocks ``version``; None: judged.

    >>> judge({"verdict": "pass", "stale": None, "target": "570.195.03", "hold": "-"}, "570.195.03") is None
    True
    >>> judge({"verdict": "fail", "stale": None, "target": "570.195.03", "hold": "-"}, "570.195.03")
    'fail, not held'
    >>> judge({"verdict": "fail", "stale": None, "target": "570.195.03", "hold": "yes"}, "570.195.03") is None
    True
    >>> judge({"verdict": "pass", "stale": "no heartbeat for 99 s", "target": "570.195.03"}, "570.195.03")
    'stale: no heartbeat for 99 s'
    >>> judge({"verdict": "pass", "stale": None, "target": "535.261.03", "hold": "-"}, "570.195.03")
    'verdict for 535.261.03'
    """
    if row is None or row.get("verdict") is None:
        return "no verdict"
    if row.get("target") != version:  # judged another version (the node's own staleness says the same)
        return f"verdict for {row.get('target') or 'no target'}"[:MAX_REASON]
    if row.get("stale"):
        return f"stale: {row['stale']}"[:MAX_REASON]
    if row["verdict"] == "unknown":
        return "unknown"
    if row["verdict"] == "fail" and row.get("hold") not in statusmod.HELD:
        return "fail, not held"
    return None


def _scope(obj: dict, kind: str, gpu_nodes: list) -> list:
    """The GPU nodes whose driver ``obj``'s version sets: a ClusterPolicy's, every one (none when it hands
    drivers to NVIDIADrivers, ``useNvidiaDriverCRD: true``: its version then drives nothing); an
    NVIDIADriver's, those it selects."""
    if kind == "clusterpolicy":
        return [] if _map(_map(obj.get("spec")).get("driver")).get("useNvidiaDriverCRD") is True else gpu_nodes
    spec = _map(obj.get("spec"))
    return [n for n in gpu_nodes if targetmod.selects(
        spec.get("nodeSelector"), {k: v for k, v in _map(_map(n.get("metadata")).get("labels")).items()
                                   if isinstance(v, str)}, spec.get("nodeAffinity"))]


def _blocked(blockers: list, total: int) -> str:
    """The refusal's list of nodes (bounded).

    >>> _blocked([("a", "no verdict"), ("b", "fail, not held")], 3)
    'not judged on 2 of 3 node(s): a (no verdict), b (fail, not held)'
    >>> _blocked([(str(i), "x") for i in range(10)], 10).endswith("7 (x) and 2 more")
    True
    """
    named = ", ".join(f"{n[:63]} ({why})" for n, why in blockers[:MAX_NAMED])
    more = f" and {len(blockers) - MAX_NAMED} more" if len(blockers) > MAX_NAMED else ""
    return f"not judged on {len(blockers)} of {total} node(s): {named}{more}"


def reconcile(snap: Snapshot, prefix: str) -> dict:
    """The ConfigMap's ``data``: for each ClusterPolicy and NVIDIADriver and each of its :func:`versions`,
    :data:`OK` or the nodes that block it (see the module docstring). Pure."""
    gpu = []
    for n in snap.nodes:
        if statusmod.node_row(n, prefix, now=snap.now) is not None:  # a GPU node, as `cluster status` says
            gpu.append(n)
    gpu.sort(key=_name)
    out: dict = {}
    for kind, objs in (("clusterpolicy", snap.policies), ("nvidiadriver", snap.drivers)):
        for obj in objs:
            if not isinstance(obj, dict) or not _name(obj):
                continue
            scope = _scope(obj, kind, gpu)
            for v in versions(obj, kind, prefix):
                key = param_key(kind, _name(obj), v)
                if key is None:
                    continue  # no key: the policy refuses (fails closed)
                tgt = targetmod.Target(v, "compat-hook fleet")
                blockers = []
                for n in scope:
                    row = statusmod.node_row(n, prefix, lease=snap.leases.get(_name(n)), target=tgt, now=snap.now)
                    why = judge(row, v)
                    if why is not None:
                        blockers.append((_name(n), why))
                out[key] = OK if not blockers else _blocked(blockers, len(scope))
    return dict(sorted(out.items()))


# ----------------------------------------------------------------------------- observe and apply


def _union(*lists) -> list:
    """Nodes from several caches, one per name (the newest resourceVersion)."""
    by: dict = {}
    for objs in lists:
        for o in objs:
            name = _name(o)
            old = by.get(name)
            if old is None or _rv(old) < _rv(o):
                by[name] = o
    return list(by.values())


def _rv(obj) -> int:
    try:
        return int(_map(_map(obj).get("metadata")).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def observe(caches: dict, now: float) -> Snapshot:
    """A :class:`Snapshot` of ``caches`` (``{"gpu": Reflector, "published": ..., "leases": ..., "policies":
    ..., "drivers": ...}``)."""
    return Snapshot(nodes=tuple(_union(caches["gpu"].objects(), caches["published"].objects())),
                    leases={_name(o): o for o in caches["leases"].objects()},
                    policies=tuple(caches["policies"].objects()), drivers=tuple(caches["drivers"].objects()),
                    now=now)


def param_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps/{PARAM_NAME}"


def current(kube, namespace: str) -> dict | None:
    """The ConfigMap's ``data`` now (None: no ConfigMap)."""
    try:
        cm = kube.get(param_path(namespace))
    except NotFound:
        return None
    return {k: v for k, v in _map(cm.get("data")).items() if isinstance(v, str)}


def apply(kube, namespace: str, data: dict) -> dict:
    """Server-side apply of ``data`` as the ConfigMap's whole ``data`` (keys this manager set before and
    left out now are removed), field manager :data:`FIELD_MANAGER`."""
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": PARAM_NAME, "namespace": namespace, "labels": dict(LABELS)}, "data": data}
    return kube.request("PATCH", param_path(namespace), query={"fieldManager": FIELD_MANAGER, "force": "true"},
                        body=json.dumps(body, separators=(",", ":")).encode(),
                        content_type="application/apply-patch+yaml")


# ----------------------------------------------------------------------------- the loop


@dataclass
class FleetOptions:
    namespace: str
    identity: str
    prefix: str
    lease_seconds: int = 15
    resync: float = 5.0


def _say(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Fleet:
    """The controller's loop (module docstring); :attr:`stop` ends it, releasing the Lease."""

    #: Changes that come in a burst (a rollout renews many Leases) are reconciled once, this much later.
    DEBOUNCE = 0.3

    def __init__(self, kube, opts: FleetOptions, *, clock=None, wall=None, rng=None) -> None:
        import random
        import time

        from .leader import Elector

        self.kube, self.opts = kube, opts
        self._clock, self._wall = clock or time.monotonic, wall or time.time
        self.rng = rng or random.Random()
        self.elector = Elector(kube, opts.namespace, PARAM_NAME, opts.identity, lease_seconds=opts.lease_seconds,
                               clock=self._clock, wall=self._wall, labels=LABELS)
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.written: dict | None = None  # what the ConfigMap holds, as this leader knows it
        self.applies = 0
        self.caches: dict = {}

    def _changed(self, _reflector) -> None:
        self.wake.set()

    def start_caches(self) -> None:
        from .reflector import Reflector

        p, ns = self.opts.prefix, self.opts.namespace
        specs = {
            "gpu": ("/api/v1/nodes", {"labelSelector": f"{statusmod.PRESENT_LABEL}=true"}, False),
            "published": ("/api/v1/nodes", {"labelSelector": f"{p}/preflight"}, False),
            "leases": (f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                       {"labelSelector": statusmod.LEASE_SELECTOR}, False),
            "policies": ("/apis/nvidia.com/v1/clusterpolicies", None, True),
            "drivers": ("/apis/nvidia.com/v1alpha1/nvidiadrivers", None, True),
        }
        for name, (path, query, optional) in specs.items():
            self.caches[name] = Reflector(self.kube, path, query=query, optional=optional, on_change=self._changed,
                                          name=name, rng=self.rng).start()

    def healthy(self) -> bool:
        return all(c.synced.is_set() and c.healthy for c in self.caches.values())

    def reconcile_once(self) -> bool:
        """One observe -> reconcile -> apply; True when it wrote."""
        data = reconcile(observe(self.caches, self._wall()), self.opts.prefix)
        if data == self.written:
            return False
        if not self.elector.still_leading():  # the election may have moved while reconciling
            return False
        apply(self.kube, self.opts.namespace, data)
        self.written = data
        self.applies += 1
        _say("fleet_applied", identity=self.opts.identity, keys=len(data),
             refused=sorted(k for k, v in data.items() if v != OK)[:20])
        return True

    def run(self) -> int:
        self.start_caches()
        backoff = Backoff(base=1.0, cap=60.0, rng=self.rng)
        next_step = next_sync = 0.0
        leading = dirty = False
        while not self.stop.is_set():
            if self.wake.is_set():  # a cache changed (a standby only notes it: it reconciles when it leads)
                self.wake.clear()
                dirty = True
            now = self._clock()
            if now >= next_step:
                was = leading
                try:
                    leading = self.elector.step()
                    next_step = now + jittered(self.elector.retry, 0.1, self.rng)
                    backoff.reset()
                    if leading and not was:
                        self.written = current(self.kube, self.opts.namespace)
                        _say("fleet_leading", identity=self.opts.identity)
                        next_sync = 0.0
                except KubeError as e:
                    leading = self.elector.still_leading()
                    next_step = now + backoff.next(getattr(e, "retry_after", None))
                    _say("fleet_error", identity=self.opts.identity, error=str(e)[:300])
                if was and not leading:
                    _say("fleet_standby", identity=self.opts.identity, leader=self.elector.holder,
                         reason="renew deadline passed" if self.elector.holder in (None, self.opts.identity)
                         else "another replica holds the Lease")
            if leading and not self.elector.still_leading():  # no renewal within the deadline: stop writing
                leading = False
                _say("fleet_standby", identity=self.opts.identity, leader=None, reason="renew deadline passed")
            if leading and (dirty or now >= next_sync):
                if dirty:
                    self.stop.wait(self.DEBOUNCE)  # a burst of changes: one reconcile
                    self.wake.clear()
                    dirty = False
                if self.healthy():
                    try:
                        self.reconcile_once()
                        next_sync = self._clock() + self.opts.resync
                    except KubeError as e:
                        next_sync = self._clock() + backoff.next(getattr(e, "retry_after", None))
                        _say("fleet_error", identity=self.opts.identity, error=str(e)[:300])
                else:
                    next_sync = self._clock() + 1.0  # a cache is catching up: look again soon
            until = min(next_step, next_sync) if leading else next_step
            self.wake.wait(max(0.05, until - self._clock()))
        for c in self.caches.values():
            c.stop.set()
        released = self.elector.release()
        _say("fleet_stopped", identity=self.opts.identity, released=released)
        return 0

    def request_stop(self) -> None:
        self.stop.set()
        self.wake.set()


#: Seconds the stop may take after SIGTERM (the Lease's release is one request) before the process ends.
STOP_GRACE = 3.0


def run(kube_factory, opts: FleetOptions) -> int:
    """The controller until SIGTERM or SIGINT (exit 0, the Lease released)."""
    import os
    import signal

    fleet = Fleet(kube_factory(), opts)
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, _frame):
            fleet.request_stop()
            t = threading.Timer(STOP_GRACE, lambda: (sys.stdout.flush(), os._exit(0)))
            t.daemon = True
            t.start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    _say("fleet_started", identity=opts.identity, namespace=opts.namespace, lease_seconds=opts.lease_seconds)
    return fleet.run()
