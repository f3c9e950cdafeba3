"""``compat-hook cluster agent``: one node's upgrade preflight, published for the cluster, and the gate.

A pass (:meth:`Agent.run_pass`) is observe → reconcile → intent → apply:

1. **observe** (:meth:`Agent.observe`): a :class:`~.reconcile.Snapshot` of the caches a watch
   keeps current (:mod:`.reflector`; ``--once`` and ``--no-watch`` read directly,
   ``resourceVersion=0``): the agent's own Node, the pods bound to it, the ClusterPolicies and
   NVIDIADrivers, whether every watch is current; the target driver and whether a hold can work
   (:mod:`.target`); the GPU workloads of the node's pods (:mod:`.pods`), their images matched to
   the node's store and assessed by ``plan`` on the driver now (``/proc/driver/nvidia/version``
   under ``host_root``) and on the target (:mod:`.predict`); the details ConfigMap as last read;
2. **reconcile** (:mod:`.reconcile`, pure): what the pass found, and the keys the Node should
   carry: the verdict labels, the ``<prefix>/preflight`` doc and the gate (:mod:`.gate`: a
   regression holds, a complete pass without one lifts a hold, a pass that is not complete keeps
   what is there), from the Node as read, the settings, the agent's own last word and the clock;
3. **intent** (:mod:`.intent`, pure): one :class:`~.intent.Intent` covering every output: the
   requests that make the Node say those keys (:mod:`.nodeapply`; none when it does), the
   details (changed or not), the Event (when the verdict, the gate or the regressions changed),
   the Lease's renewal, the state file, ``workloads.json`` and the node-local files;
4. **apply** (:mod:`.applyintent`, the agent's only writer): server-side apply of the Node's keys
   under the field manager ``compat-hook-agent``, conditional on the Node's resourceVersion (a
   conflict reads it again and computes the intent again); then the state file, the details in
   the agent's ConfigMap when they changed, the Event about the Node (in ``default``, where
   ``kubectl describe node`` finds it), the Lease (the heartbeat) every pass, ``workloads.json``
   and the node-local files.

:class:`Agent` loops: a pass every ``interval`` seconds (jittered), and soon
after a change that matters to this node (its target, the hold-ability, its own
Node's upgrade state, skip label, override annotation or driver, its GPU
workloads): after a cluster-wide change (a ClusterPolicy or NVIDIADriver) the
pass waits a random share of a window, so a fleet's agents do not all write at
once. The config file is read again at every pass. An API failure is one JSON
line with a reason code and the last published result; the next try waits an
exponential, jittered, capped backoff that honours ``Retry-After``. It never
exits on an API error (``--once`` exits 1). SIGTERM or SIGINT ends it at once
(exit 0, :func:`run`); a Node purged by ``cluster release --purge`` quiets it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import threading
import time

from ...core import logjson, safejson
from ...core.errors import CompatHookError, describe
from . import gate as gatemod
from ..workload import pods as podsmod
from ..workload import runs as runsmod
from ..workload.runs import reported
from . import applyintent, holds, intent, nodedoc, reconcile
from ..workload import predict, target as targetmod, workloads
from ..api.backoff import Backoff, herd_delay, jittered
from ..api.kube import KubeError, NotFound, Unreachable

__all__ = ["AgentOptions", "Agent", "run", "settings", "DEFAULT_PREFIX"]

DEFAULT_PREFIX = "compat-hook.io"
DEFAULT_NAMESPACE = "compat-hook"
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
STATE_FILE = intent.STATE_FILE
MAX_BACKOFF = 300.0
#: Seconds a pass under way may still take after SIGTERM (the kubelet's grace is longer; a Pod's stop
#: should not be).
STOP_GRACE = 0.8
CONFLICT_RETRIES = 4
#: The DRA claims a container's claim is judged by (:class:`..workload.runs.Claims`): Kubernetes >= 1.34 serves them.
CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"


class AgentOptions:
    __slots__ = ("node", "stores", "address", "namespace", "driver", "state_dir", "interval", "once", "watch",
                 "publish_namespace", "registration_file")

    def __init__(self, node: str, *, stores=None, address=None, namespace="k8s.io", driver=None,
                 state_dir=None, interval: float = 300.0, once: bool = False, watch: bool = True,
                 publish_namespace: str | None = None, registration_file: str | None = None) -> None:
        self.node, self.stores, self.address, self.namespace = node, list(stores or ["containerd:"]), address, namespace
        self.driver, self.state_dir, self.interval, self.once, self.watch = driver, state_dir, interval, once, watch
        self.publish_namespace = publish_namespace or _sa_namespace() or DEFAULT_NAMESPACE
        #: the chart's installer's word on how this node's containerd reaches compat-hook (Node label)
        self.registration_file = registration_file


def registration(path: str | None) -> str | None:
    """The path the chart's installer registered this node by (:data:`nodedoc.REGISTRATIONS`), read from
    ``path``; None (the label is left as it is) when there is no such file or it says something else."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            word = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return word if word in nodedoc.REGISTRATIONS else None


def _sa_namespace() -> str | None:
    try:
        with open(SA_NAMESPACE, "rb") as f:
            ns = f.read(256).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return ns or None


def settings(cfg) -> dict:
    """The ``cluster:`` settings with their defaults."""
    s = {"gate_upgrade": False, "label_prefix": DEFAULT_PREFIX, "nfd_features_file": None, "textfile": None,
         "compat_runtime_classes": ["cuda-compat"], "hold_quiet_s": None, "validation_allow_unverified": False,
         "validation_taint": True}
    s.update(getattr(cfg, "cluster", None) or {})
    return s


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _log(rec: dict) -> None:
    line = dict(time=logjson.timestamp())
    line.update(rec)
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _patched(node: dict, keys: dict) -> dict:
    """``node`` as it will be once ``keys`` (labels and annotations, None: removed) are written.

    >>> _patched({"metadata": {"labels": {"a": "1", "b": "2"}}}, {"labels": {"a": None, "c": "3"}})
    {'metadata': {'labels': {'b': '2', 'c': '3'}, 'annotations': {}}}
    """
    meta = dict(_map(node.get("metadata")))
    for kind in ("labels", "annotations"):
        d = dict(_map(meta.get(kind)))
        for k, v in _map(keys.get(kind)).items():
            if v is None:
                d.pop(k, None)
            else:
                d[k] = v
        meta[kind] = d
    return dict(node, metadata=meta)


# ----------------------------------------------------------------------------- what a pass reads


class DirectView:
    """Reads everything now (``--once``, ``--no-watch``): four requests, from the watch cache. A kind
    the API server does not serve (no such CRD: a 404) is not asked for again until a jittered,
    exponential backoff (:data:`CRD_RETRY`) has passed; until then there are none of it."""

    #: (base, cap) seconds before a kind found missing is listed again
    CRD_RETRY = (60.0, 900.0)

    def __init__(self, kube, node: str, rng=None) -> None:
        self.kube, self.node_name = kube, node
        self.rng = rng or random.Random()
        self._missing: dict = {}  # path -> (monotonic time to ask again, its Backoff)

    def node(self) -> dict:
        return self.kube.get(f"/api/v1/nodes/{self.node_name}")

    def pods(self) -> list:
        doc = self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node_name}", resourceVersion="0")
        return [p for p in doc.get("items") or [] if isinstance(p, dict)]

    def _optional(self, path: str) -> list:
        missing = self._missing.get(path)
        if missing is not None and time.monotonic() < missing[0]:
            return []  # found missing a moment ago: not asked for on every pass
        try:
            doc = self.kube.get(path, resourceVersion="0")
        except NotFound:  # no such CRD: no GPU Operator objects of that kind
            b = missing[1] if missing is not None else Backoff(*self.CRD_RETRY, rng=self.rng)
            self._missing[path] = (time.monotonic() + b.next(), b)
            return []
        self._missing.pop(path, None)
        return [o for o in doc.get("items") or [] if isinstance(o, dict)]

    def policies(self) -> list:
        return self._optional("/apis/nvidia.com/v1/clusterpolicies")

    def drivers(self) -> list:
        return self._optional("/apis/nvidia.com/v1alpha1/nvidiadrivers")

    def claims(self):
        """The cluster's ResourceClaims (:class:`~..workload.runs.Claims`), None where they cannot be read
        (then every claim counts as a GPU's: never a pod left out for want of them)."""
        try:
            return runsmod.Claims(self._optional(CLAIMS_PATH))
        except KubeError:
            return None

    def stale(self) -> str | None:
        return None

    def wrote(self, node: dict) -> None:
        pass


class WatchView:
    """The same reads from caches kept by watches; ``on_change`` is called from their threads."""

    def __init__(self, kube, node: str, on_change, rng=None) -> None:
        from ..api.reflector import Reflector

        r = rng or random.Random()
        self.kube, self.node_name = kube, node
        self.direct = DirectView(kube, node, rng=r)
        self.r_node = Reflector(kube, "/api/v1/nodes", query={"fieldSelector": f"metadata.name={node}"},
                                on_change=on_change, name="node", rng=r, managed_fields=True)
        self.r_pods = Reflector(kube, "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"},
                                on_change=on_change, name="pods", rng=r)
        self.r_cps = Reflector(kube, "/apis/nvidia.com/v1/clusterpolicies", optional=True, on_change=on_change,
                               name="clusterpolicies", rng=r)
        self.r_nds = Reflector(kube, "/apis/nvidia.com/v1alpha1/nvidiadrivers", optional=True, on_change=on_change,
                               name="nvidiadrivers", rng=r)
        self.all = (self.r_node, self.r_pods, self.r_cps, self.r_nds)
        # Not among ``all``: a claims cache that is not current makes every claim count (the cautious
        # reading), never the pass's verdict stale. Every claim of the cluster, kept slim (name and each
        # allocated device's request and driver); no pass starts on a claim's change: a pod's own start
        # (after its claim is allocated) starts one, and a claim not yet seen counts.
        self.r_claims = Reflector(kube, CLAIMS_PATH, optional=True, name="resourceclaims", rng=r,
                                  slim=runsmod.slim_claim)

    def start(self, wait: float = 10.0) -> None:
        for r in self.all + (self.r_claims,):
            r.start()
        end = time.monotonic() + wait
        # until each has listed once, or failed to (the claims too: a first pass before them would count
        # a NIC's claim as a GPU's and could hold the node for the quiet time)
        for r in self.all + (self.r_claims,):
            r.attempted.wait(max(0.0, end - time.monotonic()))

    def node(self) -> dict:
        if not self.r_node.synced.is_set():
            return self.direct.node()
        for n in self.r_node.objects():
            return n
        raise NotFound(f"node {self.node_name} not found (the watch on it lists none)", 404)

    def pods(self) -> list:
        return self.r_pods.objects() if self.r_pods.synced.is_set() else self.direct.pods()

    def policies(self) -> list:
        return self.r_cps.objects() if self.r_cps.synced.is_set() else self.direct.policies()

    def drivers(self) -> list:
        return self.r_nds.objects() if self.r_nds.synced.is_set() else self.direct.drivers()

    def claims(self):
        """The ResourceClaims of the cache while it is current, else None (every claim counts)."""
        r = self.r_claims
        return runsmod.Claims(r.objects()) if r.synced.is_set() and r.healthy else None

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.all)

    def stale(self) -> str | None:
        bad = [f"{r.name}: {r.error or 'not watching'}" for r in self.all if not r.healthy]
        return "; ".join(bad)[:400] if bad else None

    def wrote(self, node: dict) -> None:
        self.r_node.replace(node)


# ----------------------------------------------------------------------------- the agent


class Agent:
    """The node agent (see the module docstring). ``load_config()`` returns the current config."""

    def __init__(self, kube_factory, load_config, opts: AgentOptions, rng=None) -> None:
        self.kube_factory, self.load_config, self.opts = kube_factory, load_config, opts
        self.rng = rng or random.Random()
        self.kube = None
        self.view = None
        self.cfg = None
        self.config_error = None
        self.wake = threading.Event()
        #: set by SIGTERM/SIGINT (:func:`run`): every wait of the loop ends at once, the loop exits after
        #: the pass under way (its Node write and state file are whole)
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._last_trigger = None
        self._herd = False
        #: the details (written when they change) and the heartbeat that says this verdict is current
        #: (renewed after every pass, its acquireTime kept): :mod:`.applyintent` writes both
        self.details_cm = applyintent.details_owned(self)
        self.lease = applyintent.lease_owned(self)
        self._said_purged = False
        self.previous_prefix = _state_prefix(opts)  # the label prefix of the last pass before this start
        self.published = None    # (prefix, the Node doc) this process last decided: its own last word
        self.next_expiry = None  # when a regressing workload recorded while absent stops counting (epoch)
        # The registration path this process last put on the Node: written again only when the installer's
        # word changes, so a label `cluster release --all` took off (helm uninstall) is not put back by an
        # agent still running in the seconds before its pod goes.
        self.registration_said = None
        #: the uid of the pod this agent's token is bound to (:meth:`_whoami`; None: none; False: not asked yet)
        self.pod_uid = False

    # -- configuration -------------------------------------------------------
    def config(self):
        """The config, read again now; a bad file keeps the last good one (said once per error)."""
        try:
            cfg = self.load_config()
            self.config_error = None
            self.cfg = cfg
        except CompatHookError as e:
            msg = describe(e)[1]
            if msg != self.config_error:
                _log({"event": "cluster_config_error", "node": self.opts.node, "reason": "bad_config",
                      "message": msg, "using": "the last good config" if self.cfg is not None else "none"})
            self.config_error = msg
            if self.cfg is None:
                raise
        return self.cfg

    # -- what starts a pass --------------------------------------------------
    def _trigger_key(self, node=None, pods_list=None, policies=None, drivers=None, claims=False) -> tuple:
        """What a pass depends on: the target and hold-ability, the Node's upgrade state, skip label,
        override, our hold and driver, and the GPU workloads (from the caches, or what is given)."""
        s = settings(self.cfg)
        prefix = s["label_prefix"]
        v = self.view
        try:
            node = v.node() if node is None else node
        except KubeError:
            return (None,)
        meta = _map(node.get("metadata"))
        labels, anns = _map(meta.get("labels")), _map(meta.get("annotations"))
        tgt = targetmod.node_target(node, v.policies() if policies is None else policies,
                                    v.drivers() if drivers is None else drivers, prefix=prefix,
                                    override=self.opts.driver)
        node_key = (labels.get(gatemod.STATE_LABEL), labels.get(gatemod.SKIP_LABEL),
                    anns.get(f"{prefix}/{gatemod.OVERRIDE}"), f"{prefix}/holds-upgrade" in anns,
                    labels.get("nvidia.com/cuda.driver-version.full"))
        ws = podsmod.build(v.pods() if pods_list is None else pods_list, s["compat_runtime_classes"],
                           self.opts.publish_namespace,
                           registration=reported(registration(self.opts.registration_file), node, prefix),
                           claims=v.claims() if claims is False else claims)
        pods_key = tuple((w["name"], tuple(w["env"]), w["runtime"], w["unknown"], tuple(ws.pods[w["name"]]))
                         for w in ws.items)
        return (tgt.key(), node_key, pods_key)

    def on_change(self, _reflector=None) -> None:
        """A watch saw a change: start a pass when it matters to this node (never a read of its own: until
        every cache has its first list, the first pass is still to come)."""
        if self.cfg is None or not isinstance(self.view, WatchView) or not self.view.synced():
            return
        try:
            key = self._trigger_key()
        except Exception:  # from a watch's thread: a pass runs now, and its loop says what is wrong, once
            self.wake.set()
            return
        with self._lock:
            last = self._last_trigger
            if last is not None and key == last:
                return
            if last is None or key[:1] != last[:1]:
                self._herd = True  # the target changed: every node's agent sees it at once
        self.wake.set()

    # -- one pass --------------------------------------------------------------
    def observe(self, cfg, s: dict):
        """Observe: the :class:`~.reconcile.Snapshot` of the caches, the node's target, its GPU workloads
        and their assessment on the driver now and the target (the image store, the node's files)."""
        v, opts = self.view, self.opts
        with self._lock:  # what changed until now, this pass reads
            self.wake.clear()
            self._herd = False
        snap = reconcile.Snapshot(node=v.node(), pods=v.pods(), policies=v.policies(), drivers=v.drivers(),
                                  stale=v.stale(), claims=v.claims())
        if isinstance(v, WatchView):
            with self._lock:
                self._last_trigger = self._trigger_key(snap.node, snap.pods, snap.policies, snap.drivers, snap.claims)
        tgt = targetmod.node_target(snap.node, snap.policies, snap.drivers, prefix=s["label_prefix"],
                                    override=opts.driver)
        ws = podsmod.build(snap.pods, s["compat_runtime_classes"], opts.publish_namespace,  # the node's path
                           registration=reported(registration(opts.registration_file), snap.node, s["label_prefix"]),
                           claims=snap.claims)
        a = predict.assess(cfg, version=tgt.plan_version(), workloads=ws, stores=opts.stores, address=opts.address,
                           namespace=opts.namespace)
        return snap, tgt, ws, a

    def run_pass(self) -> dict:
        """One pass: observe, reconcile and intend (pure, :mod:`.intent`), apply (:mod:`.applyintent`, the one
        writer). A Node changed since it was read (a 409) is read again, and the intent computed and
        applied again, up to :data:`CONFLICT_RETRIES` times."""
        t0 = time.monotonic()
        kube, opts = self.kube, self.opts
        calls0, by0 = kube.calls, dict(kube.by_kind)
        cfg = self.config()
        s = settings(cfg)
        prefix = s["label_prefix"]
        snap, tgt, ws, a = self.observe(cfg, s)
        reg = registration(opts.registration_file)
        st = reconcile.Settings(prefix=prefix, gate=bool(s["gate_upgrade"]),
                                quiet=holds.quiet_s(s["hold_quiet_s"], opts.interval), interval=opts.interval,
                                details=f"{opts.publish_namespace}/{opts.node}", former_prefix=self.previous_prefix,
                                registration=None if reg == self.registration_said else reg,
                                installation=reconcile.installation(snap.pods, self.pod_uid or None))
        where = intent.Where(node=opts.node, namespace=opts.publish_namespace, interval=opts.interval,
                             state_dir=opts.state_dir, nfd_file=s["nfd_features_file"], textfile=s["textfile"],
                             max_age=workloads.max_age_of(cfg))
        own = self.published[1] if self.published is not None and self.published[0] == prefix else None
        previous = intent.Previous(own=own, details=self.details_cm.read())
        decisions = _decision_counts(cfg) if s["textfile"] else None
        conflicts = 0
        for attempt in range(CONFLICT_RETRIES):
            it = intent.intend(snap, target=tgt, workloads=ws, assessment=a, settings=st, where=where,
                               previous=previous, decisions=decisions, now=time.time())
            self.next_expiry = it.desired.next_expiry
            if it.node_patch.changed and isinstance(self.view, WatchView):  # our own write is no reason for a pass
                with self._lock:
                    self._last_trigger = self._trigger_key(_patched(snap.node, it.desired.keys), snap.pods,
                                                           snap.policies, snap.drivers, snap.claims)
            done = applyintent.apply(self, it, settled=lambda node, it=it: self._settled(it, node, st), log=_log)
            if done.node_write != "conflict":
                break
            conflicts += 1
            if attempt == CONFLICT_RETRIES - 1:
                raise done.conflict
            # changed since read: decide again on what is there now
            snap = dataclasses.replace(snap, node=kube.get(f"/api/v1/nodes/{opts.node}"))
        d, f = it.desired, it.findings
        g, verdict, c, cn = d.gate, d.verdict, f.counts, d.counts
        return {"event": "cluster_pass", "node": opts.node, "preflight": verdict, "complete": f.complete,
                "reasons": it.reasons, "target": tgt.version, "target_from": tgt.where, "now": a.now,
                "gate": g.state, "gate_message": g.message, "workloads": c["workloads"],
                "regressions": c["regressions"], "absent_regressions": cn["absent_regressions"],
                "broken_now_and_after": c["broken_now_and_after"],
                "changed": c["changed"], "not_in_store": c["not_in_store"], "unreadable": c["unreadable"],
                "unknown_workloads": c["unknown_workloads"], "pods": len(snap.pods),
                "problem": it.problem, "node_write": done.node_write, "conflicts": conflicts,
                "details_written": done.details_written,
                "event_sent": done.event_sent, "api_calls": kube.calls - calls0,
                "api_requests": {k: n - by0.get(k, 0) for k, n in sorted(kube.by_kind.items()) if n - by0.get(k, 0)},
                "seconds": round(time.monotonic() - t0, 3), "max_rss_kib": _max_rss_kib()}

    def _settled(self, it, node: dict | None, st) -> None:
        """The Node says ``it`` now (``node``: as written; None: it said so already): the agent's own last
        word, the watch cache, the registration said."""
        if node is not None:
            self.view.wrote(node)
        self.published = (it.prefix, it.desired.doc)
        if st.registration is not None:
            self.registration_said = st.registration

    # -- the loop --------------------------------------------------------------
    def _connect(self) -> None:
        if self.kube is None:
            self.kube = self.kube_factory()
            _log({"event": "cluster_connected", "node": self.opts.node, "server": getattr(self.kube, "host", None),
                  "credentials": getattr(self.kube, "source", None)})
        self._whoami()
        if self.view is None:
            if self.opts.watch and not self.opts.once:
                self.view = WatchView(self.kube, self.opts.node, self.on_change, rng=self.rng)
                self.view.start()
            else:
                self.view = DirectView(self.kube, self.opts.node, rng=self.rng)

    def _whoami(self) -> None:
        """The uid of the pod this agent's token is bound to, asked once (a SelfSubjectReview, which every
        authenticated user may make): the kubelet's projected token names its pod, a token of the agent
        run by hand none. What a release the agent saw is bound to (:func:`.reconcile.installation`). An
        API server that cannot answer now is asked again before the next pass; any other answer is final."""
        if self.pod_uid is not False:
            return
        try:
            r = self.kube.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                  body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        except Unreachable:
            return
        except KubeError:
            r = {}
        v = _map(_map(_map(r.get("status")).get("userInfo")).get("extra")).get("authentication.kubernetes.io/pod-uid")
        self.pod_uid = v[0][:64] if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str) else None

    def run(self) -> int:
        """One pass with ``once`` (exit 0 published, 1 an API error), else until :attr:`stop` (exit 0)."""
        backoff = Backoff(base=1.0, cap=min(MAX_BACKOFF, max(self.opts.interval, 30.0)), rng=self.rng)
        self.config()
        while not self.stop.is_set():
            try:
                self._connect()
                if self._purged():
                    self._wait()
                    continue
                _log(self.run_pass())
                backoff.reset()
                if self.opts.once:
                    return 0
            except KubeError as e:
                code, msg = describe(e)
                wait = backoff.next(getattr(e, "retry_after", None))
                _log({"event": "cluster_error", "node": self.opts.node, "reason": code,
                      "status": getattr(e, "status", 0), "message": msg,
                      "retry_in": None if self.opts.once else round(wait, 3), "last_result": _last_result(self.opts)})
                if self.opts.once:
                    return 1
                self.stop.wait(wait)
                continue
            except Exception as e:  # one bad object (a Node's keys, a pod, an image) never ends the loop
                wait = backoff.next()
                _log({"event": "cluster_error", "node": self.opts.node, "reason": "internal_error",
                      "message": f"{type(e).__name__}: {str(e)[:300]}",
                      "retry_in": None if self.opts.once else round(wait, 3), "last_result": _last_result(self.opts)})
                if self.opts.once:
                    return 1
                self.stop.wait(wait)
                continue
            self._wait()
        _log({"event": "cluster_agent_stopped", "node": self.opts.node, "last_result": _last_result(self.opts)})
        return 0

    def _wait(self) -> None:
        """Until the next pass: the (jittered) interval, or soon after a change that matters (or a stop)."""
        timeout = jittered(self.opts.interval, 0.1, self.rng)
        if self.next_expiry is not None:  # a hold kept for an absent workload: judge it again when that ends
            timeout = min(timeout, max(0.5, self.next_expiry - time.time() + 0.5))
        if self.wake.wait(timeout) and not self.stop.is_set():
            self.wake.clear()
            with self._lock:
                herd, self._herd = self._herd, False
            # A change every agent sees at once waits a random share of a window; one of this node only
            # waits for its burst of events to settle.
            self.stop.wait(herd_delay(self.opts.interval, self.rng) if herd else self.rng.uniform(0.05, 0.3))
            self.wake.clear()

    def _purged(self) -> bool:
        """``cluster release --purge`` (``helm uninstall``) took every key of this process's prefix off its
        Node: the agent is being removed, so it writes nothing more (no key, Lease, ConfigMap or Event
        back) until it restarts. Seen from the watch's cache only (free); said once."""
        if self.published is None or not isinstance(self.view, WatchView) or not self.view.synced():
            return False
        try:
            meta = _map(self.view.node().get("metadata"))
        except KubeError:
            return False
        mine = self.published[0] + "/"
        if any(str(k).startswith(mine) for k in list(_map(meta.get("labels"))) + list(_map(meta.get("annotations")))):
            return False
        if not self._said_purged:
            self._said_purged = True
            _log({"event": "cluster_purged", "node": self.opts.node,
                  "message": f"every {mine} key is gone from the Node (cluster release --purge): "
                             "publishing nothing more until this agent restarts"})
        return True

    def request_stop(self, *_) -> None:
        """SIGTERM (the kubelet stopping the pod) or SIGINT: the loop ends without waiting out its interval."""
        self.stop.set()
        self.wake.set()


def run(kube_factory, load_config, opts: AgentOptions) -> int:
    """The agent until SIGTERM or SIGINT. As a container's PID 1 a signal without a handler is ignored
    (the kubelet would wait out the whole grace period, then SIGKILL): the handler ends the loop. A pass
    under way finishes first (its writes are whole); one blocked on the API server longer than
    ``STOP_GRACE`` seconds is abandoned: every write it makes is atomic, so nothing is left half done."""
    import signal

    agent = Agent(kube_factory, load_config, opts)
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, _frame):
            agent.request_stop()
            t = threading.Timer(STOP_GRACE, _abandon, args=(opts.node, signum))
            t.daemon = True
            t.start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    return agent.run()


def _abandon(node: str, signum: int) -> None:
    _log({"event": "cluster_agent_stopped", "node": node, "reason": "pass_abandoned",
          "message": f"signal {signum}: the pass under way did not end within {STOP_GRACE} s"})
    sys.stdout.flush()
    os._exit(0)


def _max_rss_kib() -> int:
    """This process's peak RSS: ``VmHWM`` (getrusage's maxrss would include what the parent had
    before exec, e.g. a test runner's)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _decision_counts(cfg) -> dict | None:
    """``{(effect, reason): n}`` from the decision log (the hook's and the wrapper's records)."""
    if not cfg.log_file or not os.path.isfile(cfg.log_file):
        return None
    counts: dict = {}
    try:
        with open(cfg.log_file, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (16 << 20)))  # the newest 16 MiB at most
            for line in f:
                try:  # compat-hook's own lines (not nested); a torn or foreign line is skipped, whatever it is
                    rec = json.loads(line.decode())
                except (ValueError, UnicodeDecodeError, RecursionError):
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("reason"), str):
                    key = (str(rec.get("effect") or rec.get("event") or "-"), rec["reason"])
                    counts[key] = counts.get(key, 0) + 1
    except OSError:
        return None
    return counts


def _state_doc(opts: AgentOptions) -> dict | None:
    """The state file's doc (what the last pass published, with its prefix); None: none, or unreadable."""
    if not opts.state_dir:
        return None
    try:
        with open(os.path.join(opts.state_dir, STATE_FILE), "rb") as f:
            raw = f.read((1 << 20) + 1)
    except OSError:
        return None
    return safejson.parse_object(raw, max_bytes=1 << 20)[0]


def _state_prefix(opts: AgentOptions) -> str | None:
    """The label prefix the last pass (before this process) published under, from the state file."""
    p = (_state_doc(opts) or {}).get("prefix")
    return p if isinstance(p, str) and 0 < len(p) <= 253 else None


def _last_result(opts: AgentOptions) -> str | None:
    doc = _state_doc(opts)
    if doc is None:
        return None
    return f"{doc.get('verdict')} for {doc.get('target')} since {doc.get('since')} (gate {doc.get('gate')})"
