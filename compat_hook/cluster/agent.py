"""``compat-hook cluster agent``: one node's upgrade preflight, published on its Node.

A pass (:func:`run_pass`):

1. reads the Node, the ClusterPolicies and NVIDIADrivers, and the pods bound to the
   node (a field selector on ``spec.nodeName``) - four GETs;
2. finds the target driver (:mod:`.target`) and the images of the node's GPU pods
   that are in the node's store (:mod:`.refs`; any ``plan`` source, by default the
   node's containerd);
3. runs ``plan`` - the same assessment the hook runs at container start - with the
   "now" side from the host facts under ``host_root``;
4. publishes the verdict (:mod:`.publish`) and the gate (:mod:`.gate`) with one
   strategic-merge PATCH of the Node under optimistic concurrency (its
   ``resourceVersion``; a conflict re-reads and retries), and an Event only when
   the result changes.

:func:`run` loops: a pass every ``interval`` seconds, at once when a ClusterPolicy
or NVIDIADriver changes (a watch on each), and while the API server is unreachable
or denies access it logs one JSON line, keeps the last result in its state dir and
retries with backoff - it never exits on an API error.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from ..core import logjson
from ..core.errors import describe
from . import gate as gatemod
from . import publish, refs, target as targetmod, workloads
from .kube import Conflict, KubeError, NotFound

__all__ = ["AgentOptions", "run_pass", "run", "settings"]

DEFAULT_PREFIX = "compat-hook.io"
STATE_FILE = "cluster-agent.json"
MAX_PREVIOUS = 2 * publish.MAX_ANNOTATION
MAX_BACKOFF = 300.0
CONFLICT_RETRIES = 4


class AgentOptions:
    __slots__ = ("node", "stores", "address", "namespace", "driver", "state_dir", "interval", "once", "watch")

    def __init__(self, node: str, *, stores=None, address=None, namespace="k8s.io", driver=None,
                 state_dir=None, interval: float = 300.0, once: bool = False, watch: bool = True) -> None:
        self.node, self.stores, self.address, self.namespace = node, list(stores or ["containerd:"]), address, namespace
        self.driver, self.state_dir, self.interval, self.once, self.watch = driver, state_dir, interval, once, watch


def settings(cfg) -> dict:
    """The ``cluster:`` settings with their defaults."""
    s = {"gate_upgrade": False, "label_prefix": DEFAULT_PREFIX, "nfd_features_file": None, "textfile": None}
    s.update(getattr(cfg, "cluster", None) or {})
    return s


def _items(kube, path: str) -> list:
    """The items of a list, or [] when the resource type does not exist (no GPU Operator CRDs)."""
    try:
        doc = kube.get(path)
    except NotFound:
        return []
    items = doc.get("items")
    return items if isinstance(items, list) else []


def _previous(meta: dict, prefix: str) -> dict | None:
    raw = (meta.get("annotations") or {}).get(f"{prefix}/preflight")
    if not isinstance(raw, str) or len(raw) > MAX_PREVIOUS:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("preflight"), str) else None


def _plan(cfg, opts: AgentOptions, version: str, sources: list):
    """``plan``'s report (plain data) for ``sources`` on ``version``; (None, problem) when it cannot run."""
    import functools

    from ..policy import preflight as planmod
    from ..images.sources import expand, open_source

    where = {"address": opts.address, "namespace": opts.namespace}
    try:
        return planmod.plan(cfg, sources, driver=version, opener=functools.partial(open_source, **where),
                            expander=functools.partial(expand, **where)), None
    except Exception as e:  # the host driver unknown, a bad target: the verdict is unknown, said why
        return None, describe(e)[1]


def assess_node(kube, cfg, opts: AgentOptions, node: dict, prefix: str) -> dict:
    """Everything but the write: ``{"target", "report", "missing", "pods", "problem"}``."""
    import functools

    from ..images.sources import expand

    name = opts.node
    policies = [] if opts.driver else _items(kube, "/apis/nvidia.com/v1/clusterpolicies")
    drivers = [] if opts.driver else _items(kube, "/apis/nvidia.com/v1alpha1/nvidiadrivers")
    pods = kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={name}", limit=refs.MAX_PODS)
    items = pods.get("items") if isinstance(pods.get("items"), list) else []
    tgt = targetmod.node_target(node, policies, drivers, prefix=prefix, override=opts.driver)
    images, dropped = refs.pod_images(items)
    problems = [tgt.problem] if tgt.problem else []
    if dropped or (pods.get("metadata") or {}).get("continue"):
        problems.append(f"{dropped} pod image(s) left out (more than {refs.MAX_IMAGES} images, "
                        f"{refs.MAX_PODS} pods, or a reference that is not one)")
    index, store_problems = refs.store_index(opts.stores, functools.partial(
        expand, address=opts.address, namespace=opts.namespace))
    problems += store_problems
    found, missing = refs.match(images, index)
    workloads.record_pass(cfg, opts.state_dir, items, found)  # what the validator proves after a driver change
    report = None
    if tgt.version is not None:
        report, problem = _plan(cfg, opts, tgt.version, sorted(found))
        if problem:
            problems.append(problem)
        if report is not None:
            for entry in report["images"]:  # name each row by the pods' references, not the store's
                entry["image"] = ", ".join(found.get(entry["image"], [entry["image"]]))[:publish.MAX_STR]
    return {"target": tgt, "report": report, "missing": missing, "pods": len(items),
            "problem": "; ".join(problems) or None, "dropped": dropped}


def run_pass(kube, cfg, opts: AgentOptions) -> dict:
    """One pass (see the module docstring); returns what it published and what it cost."""
    t0 = time.monotonic()
    calls0 = kube.calls
    s = settings(cfg)
    prefix = s["label_prefix"]
    path = f"/api/v1/nodes/{opts.node}"
    node = kube.get(path)
    a = assess_node(kube, cfg, opts, node, prefix)
    report, tgt = a["report"], a["target"]
    preflight = publish.verdict(report, missing=len(a["missing"])) if tgt.version else "unknown"
    if report is None:
        preflight = "unknown"
    elif a["problem"] and preflight == "pass":
        preflight = "warn"
    broken = publish.broken_images(report)
    why = (f"{len(broken)} image(s) break on driver {tgt.version}: " +
           ", ".join(f"{b['image']} ({b['error']})" for b in broken[:3])) if broken else ""
    event_sent = False
    conflicts = 0
    for attempt in range(CONFLICT_RETRIES):
        meta = node.get("metadata") or {}
        g = gatemod.decide(meta, preflight, why, enabled=bool(s["gate_upgrade"]), prefix=prefix)
        prev = _previous(meta, prefix)
        now_text = (report or {}).get("driver", {}).get("now")
        doc = publish.summary(node=opts.node, preflight=preflight, now=now_text, target=tgt.version,
                              target_from=tgt.where, report=report, missing=a["missing"], pods=a["pods"],
                              gate_state=g.state, gate_message=g.message, problem=a["problem"],
                              when=logjson.timestamp())
        changed = prev is None or publish.signature(prev) != publish.signature(doc)
        same = prev is not None and {k: v for k, v in prev.items() if k != "time"} == \
            {k: v for k, v in doc.items() if k != "time"}
        if same and not g.labels and not g.annotations and _labels_current(meta, prefix, doc):
            break
        try:
            kube.patch(path, publish.node_patch(prefix=prefix, doc=doc, gate=g,
                                                resource_version=str(meta.get("resourceVersion") or "")))
            break
        except Conflict:
            conflicts += 1
            if attempt == CONFLICT_RETRIES - 1:
                raise
            node = kube.get(path)  # changed since read: decide again on what is there now
    if changed:
        kube.create("/api/v1/namespaces/default/events", publish.event(node=node, doc=doc, when=_rfc3339()))
        event_sent = True
    result = {"event": "cluster_pass", "node": opts.node, "preflight": preflight, "target": tgt.version,
              "target_from": tgt.where, "now": doc["now"], "gate": g.state, "images": doc["images"],
              "broken": doc["broken"], "changed": doc["changed"], "not_in_store": doc["not_in_store"],
              "pods": a["pods"], "problem": a["problem"], "event_sent": event_sent, "conflicts": conflicts,
              "api_calls": kube.calls - calls0, "seconds": round(time.monotonic() - t0, 3),
              "max_rss_kib": _max_rss_kib()}
    _outputs(cfg, s, prefix, doc, opts)
    return result


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


def _labels_current(meta: dict, prefix: str, doc: dict) -> bool:
    labels = meta.get("labels") or {}
    return (labels.get(f"{prefix}/preflight") == doc["preflight"]
            and labels.get(f"{prefix}/preflight.broken") == str(doc["broken"])
            and labels.get(f"{prefix}/preflight.target-driver") == publish.label_value(doc["target"]))


def _rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _decision_counts(cfg) -> dict | None:
    """``{(effect, reason): n}`` from the decision log (the hook's and the wrapper's records)."""
    if not cfg.log_file or not os.path.isfile(cfg.log_file):
        return None
    counts: dict = {}
    try:
        with open(cfg.log_file, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (16 << 20)))  # the newest 16 MiB at most
            for line in f:
                try:
                    rec = json.loads(line.decode())
                except (ValueError, UnicodeDecodeError):
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("reason"), str):
                    key = (str(rec.get("effect") or rec.get("event") or "-"), rec["reason"])
                    counts[key] = counts.get(key, 0) + 1
    except OSError:
        return None
    return counts


def _outputs(cfg, s: dict, prefix: str, doc: dict, opts: AgentOptions) -> None:
    """The state file and the optional node-local files (never fatal: a pass is published already)."""
    try:
        if opts.state_dir:
            publish.write_file(os.path.join(opts.state_dir, STATE_FILE), json.dumps(doc, separators=(",", ":")) + "\n")
        if s["nfd_features_file"]:
            publish.write_file(s["nfd_features_file"], publish.nfd_text(prefix, doc))
        if s["textfile"]:
            publish.write_file(s["textfile"], publish.textfile_text(doc, time.time(), _decision_counts(cfg)))
    except OSError as e:
        _log({"event": "cluster_output_error", "reason": "os_error", "message": describe(e)[1]})


def _log(rec: dict) -> None:
    line = dict(time=logjson.timestamp())
    line.update(rec)
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class _Watcher:
    """Sets ``changed`` when a ClusterPolicy or NVIDIADriver changes (one watch thread per resource)."""

    def __init__(self, kube, paths: list, timeout: float) -> None:
        self.changed = threading.Event()
        self.stop = threading.Event()
        for p in paths:
            threading.Thread(target=self._watch, args=(kube, p, timeout), daemon=True).start()

    def _watch(self, kube, path: str, timeout: float) -> None:
        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    # the list a watch starts from: not a pass's call
                    rv = (kube.request("GET", path, count=False).get("metadata") or {}).get("resourceVersion") or ""
                for ev in kube.watch(path, rv, int(max(5, timeout))):
                    obj = ev.get("object") if isinstance(ev.get("object"), dict) else {}
                    if ev.get("type") == "ERROR":
                        rv = None
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.changed.set()
            except NotFound:
                self.stop.wait(60)  # no such CRD (yet)
            except KubeError:
                rv = None
                self.stop.wait(5)


def run(kube_factory, cfg, opts: AgentOptions) -> int:
    """The agent: one pass with ``once`` (exit 0 published, 1 an API error), else forever."""
    backoff = 1.0
    kube = None
    watcher = None
    while True:
        try:
            if kube is None:
                kube = kube_factory()
            result = run_pass(kube, cfg, opts)
            _log(result)
            backoff = 1.0
            if opts.once:
                return 0
        except KubeError as e:
            code, msg = describe(e)
            wait = min(backoff, max(opts.interval, 30.0), MAX_BACKOFF)
            _log({"event": "cluster_error", "node": opts.node, "reason": code, "status": getattr(e, "status", 0),
                  "message": msg, "retry_in": None if opts.once else wait,
                  "last_result": _last_result(opts)})
            if opts.once:
                return 1
            time.sleep(wait)
            backoff = min(backoff * 2, MAX_BACKOFF)
            continue
        if opts.watch and watcher is None and kube is not None and hasattr(kube, "watch"):
            watcher = _Watcher(kube, ["/apis/nvidia.com/v1/clusterpolicies",
                                      "/apis/nvidia.com/v1alpha1/nvidiadrivers"], opts.interval)
        if watcher is not None:
            if watcher.changed.wait(opts.interval):
                watcher.changed.clear()
                time.sleep(0.5)  # let an update's burst settle
        else:
            time.sleep(opts.interval)


def _last_result(opts: AgentOptions) -> str | None:
    if not opts.state_dir:
        return None
    try:
        with open(os.path.join(opts.state_dir, STATE_FILE), "rb") as f:
            doc = json.loads(f.read(1 << 20).decode())
        return f"{doc.get('preflight')} for {doc.get('target')} at {doc.get('time')}"
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return None
