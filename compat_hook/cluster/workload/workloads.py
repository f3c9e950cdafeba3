"""The GPU workloads a node ran, per host driver: what the validator proves after a driver change.

The agent calls :func:`record` on every pass with the pods bound to its node; the record is
``<state-dir>/workloads.json``, replaced atomically (:mod:`compat_hook.core.atomic`) only
when it changes::

    {"version": 1, "driver": "535.261.03",
     "workloads": [{"image": "nvcr.io/nvidia/pytorch:24.05-py3", "source": "containerd:nvcr.io/...",
                    "pods": ["ml/train-0"], "env": ["NVIDIA_VISIBLE_DEVICES=all"],
                    "runtime_class": "cuda-compat", "seen": "2026-12-03T10:00:00.000Z"}],
     "previous": {"driver": "525.147.05", "until": "...", "workloads": [...]}}

A *workload* is one GPU container of a running or pending pod, the agent's own model
(:class:`compat_hook.cluster.workload.pods.Container`: the app containers that ask for a GPU, by a GPU
resource, a resource claim, an NVIDIA CDI annotation or ``NVIDIA_VISIBLE_DEVICES``; never an init
container or a sidecar) with the env from its pod spec that can change what it loads
(``NVIDIA_*``, ``CUDA_*``, ``LD_*``, ``COMPAT_HOOK_*``; ``$(VAR)`` expanded as the kubelet does,
the device plugin's ``NVIDIA_VISIBLE_DEVICES=all`` for a GPU resource) and its
``runtimeClassName``: the validator's probe runs with the env the agent judged. Workloads seen under one driver accumulate (a job
that ran this morning counts) until the driver changes; then the record moves to
``previous`` and a new one starts. A workload no pod has run for ``cluster.workload_max_age_s``
(default :data:`MAX_AGE_S`, a week; :func:`max_age_of`) leaves the record, the previous driver's
included, and with it the set the validator proves (:func:`for_driver`): a workload deleted long
ago is not held against the node, whose image store may have let its image go. The
validator's own probe pods are never workloads (:func:`is_probe`: the label
``app.kubernetes.io/name: compat-hook-probe``, the annotation ``compat-hook.io/probe-of`` and the
agent's own namespace, where the validator creates them, all three: a tenant's pod that carries the
label elsewhere is a workload like any other).

Everything is bounded: :data:`MAX_WORKLOADS` workloads, :data:`MAX_PODS` pod names each,
:data:`MAX_ENV` env entries of at most :data:`MAX_VALUE` characters; the file is read
``O_NOFOLLOW`` up to :data:`MAX_FILE` bytes and every field of it is checked
(:func:`load` keeps what is well-formed and drops the rest).

>>> pod = {"metadata": {"namespace": "ml", "name": "train-0"},
...        "spec": {"runtimeClassName": "cuda-compat", "containers": [{"image": "cuda-app:1",
...                 "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "HOME", "value": "/"},
...                         {"name": "LD_LIBRARY_PATH", "value": "$(HOME)lib"}]}, {"image": "busybox"}]},
...        "status": {"phase": "Running"}}
>>> [(w["image"], w["env"], w["pods"], w["runtime_class"]) for w in from_pods([pod])]
[('docker.io/library/cuda-app:1', ['NVIDIA_VISIBLE_DEVICES=all', 'LD_LIBRARY_PATH=/lib'], ['ml/train-0'], 'cuda-compat')]
"""

from __future__ import annotations

import json
import os
import time

from . import refs
from .pods import PROBE_NAME, PROBE_OF, gpu_containers, is_probe  # is_probe and the names: re-exported

__all__ = ["FILE", "PROBE_NAME", "PROBE_OF", "from_pods", "record", "record_pass", "load", "for_driver", "is_probe",
           "max_age_of", "MAX_AGE_S"]

FILE = "workloads.json"
VERSION = 1
MAX_WORKLOADS = 128
MAX_PODS = 8
MAX_ENV = 32
MAX_VALUE = 1024
MAX_FILE = 1 << 20
#: A workload no pod has run for a week is dropped (the default of ``cluster.workload_max_age_s``).
MAX_AGE_S = 7 * 24 * 3600
#: "seen" is refreshed at most this often (so an unchanged node does not rewrite the file each pass).
SEEN_REFRESH_S = 3600


def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v) -> list:
    return v if isinstance(v, list) else []


def _text(v, limit: int) -> str | None:
    """A printable string of at most ``limit`` characters, else None."""
    return v if isinstance(v, str) and 0 < len(v) <= limit and v.isprintable() else None


def from_pods(pods: list, *, sources: dict | None = None, when: str | None = None,
              probe_namespace: str | None = None, claims=None) -> list:
    """The workloads of ``pods`` (the running or pending GPU pods among them, the validator's probes in
    ``probe_namespace`` left out: :func:`is_probe`).

    ``sources``: ``{plan source: [normalized image refs]}`` (the agent's store match), so that each
    workload names where its image is read from. ``claims``: the ResourceClaims a claim is judged by
    (:class:`.runs.Claims`; None: every claim counts).
    """
    by_ref = {}
    for src, names in _dict(sources).items():
        for n in _list(names):
            by_ref.setdefault(n, src)
    when = when or _now()
    out: dict = {}
    for pod in _list(pods)[:refs.MAX_PODS]:
        if not isinstance(pod, dict) or is_probe(pod, probe_namespace) or not refs.gpu_pod(pod, claims):
            continue
        # the GPU containers of the pod, with their env expanded, exactly as the agent judges them
        # (no init container, no sidecar: a busybox beside the workload is not proven on the driver)
        for c in gpu_containers(pod, claims)[0]:
            if len(c.image) > refs.MAX_REF:
                continue
            ref, who = c.image, c.pod
            rc = _text(c.runtime_class, 253) if c.runtime_class is not None else None
            env = [e for e in c.env if len(e) <= MAX_VALUE + 256 and e.isprintable()][:MAX_ENV]
            key = (ref, rc, tuple(env))
            w = out.get(key)
            if w is None:
                if len(out) >= MAX_WORKLOADS:
                    continue
                w = out[key] = {"image": ref, "source": by_ref.get(ref), "pods": [], "env": env,
                                "runtime_class": rc, "seen": when}
            if who not in w["pods"] and len(w["pods"]) < MAX_PODS:
                w["pods"].append(who)
    return list(out.values())


def _key(w: dict) -> tuple:
    return (w["image"], w["runtime_class"], tuple(w["env"]))


def _now() -> str:
    from ...core.logjson import timestamp

    return timestamp()


def _epoch(stamp: str) -> float | None:
    """``2026-12-03T10:00:00.000Z`` as seconds since the epoch (None when it is not that)."""
    import calendar

    try:
        return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, TypeError):
        return None


def _clean_workload(w) -> dict | None:
    """A well-formed workload entry from the file, or None."""
    w = _dict(w)
    image = _text(w.get("image"), refs.MAX_REF)
    if image is None or " " in image:
        return None
    source = w.get("source")
    source = _text(source, 4096) if source is not None else None
    rc = w.get("runtime_class")
    rc = _text(rc, 253) if rc is not None else None
    pods = [p for p in _list(w.get("pods"))[:MAX_PODS] if _text(p, 320)]
    env = [e for e in _list(w.get("env"))[:MAX_ENV]
           if isinstance(e, str) and "=" in e and len(e) <= MAX_VALUE + 256 and e.isprintable()]
    seen = _text(w.get("seen"), 40) or "1970-01-01T00:00:00.000Z"
    return {"image": image, "source": source, "pods": pods, "env": env, "runtime_class": rc, "seen": seen}


def _clean_list(items) -> list:
    out, keys = [], set()
    for w in _list(items)[:MAX_WORKLOADS]:
        c = _clean_workload(w)
        if c is not None and _key(c) not in keys:
            keys.add(_key(c))
            out.append(c)
    return out


def load(state_dir: str) -> dict | None:
    """The record in ``state_dir``, every field checked; None when there is none or it is unusable."""
    from ...core.bounded import read_all

    path = os.path.join(state_dir, FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = read_all(lambda n: os.read(fd, n), MAX_FILE, 1 << 16, lambda: ValueError("too big"))
        doc = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return None
    driver = doc.get("driver")
    out = {"version": VERSION, "driver": _text(driver, 64) if driver is not None else None,
           "workloads": _clean_list(doc.get("workloads"))}
    prev = doc.get("previous")
    if isinstance(prev, dict):
        out["previous"] = {"driver": _text(prev.get("driver"), 64), "until": _text(prev.get("until"), 40),
                           "workloads": _clean_list(prev.get("workloads"))}
    return out


def max_age_of(cfg) -> float:
    """``cluster.workload_max_age_s`` of the config (:data:`MAX_AGE_S` when not set).

    >>> class C: cluster = {"workload_max_age_s": 86400}
    >>> max_age_of(C()), max_age_of(None) == MAX_AGE_S
    (86400.0, True)
    """
    v = (getattr(cfg, "cluster", None) or {}).get("workload_max_age_s")
    return float(MAX_AGE_S if v is None else v)


def _young(items: list, t_now: float, max_age: float) -> list:
    """The workloads of ``items`` a pod ran within ``max_age`` seconds of ``t_now``."""
    return [w for w in items if t_now - (_epoch(w.get("seen")) or 0) <= max_age]


def _merge(old: list, new: list, now: str, max_age: float = MAX_AGE_S) -> list:
    """``old`` workloads still young enough, updated with the ones seen now (newest first, bounded)."""
    t_now = _epoch(now) or time.time()
    merged = {_key(w): dict(w) for w in new}
    for w in old:
        k = _key(w)
        if k in merged:
            cur = merged[k]
            t_old = _epoch(w["seen"]) or 0
            if t_now - t_old < SEEN_REFRESH_S:
                cur["seen"] = w["seen"]  # recently stamped: keep the file unchanged
            cur["pods"] = (cur["pods"] + [p for p in w["pods"] if p not in cur["pods"]])[:MAX_PODS]
            if cur["source"] is None:
                cur["source"] = w["source"]
        elif t_now - (_epoch(w["seen"]) or 0) <= max_age:
            merged[k] = dict(w)
    out = sorted(merged.values(), key=lambda w: w["seen"], reverse=True)
    return out[:MAX_WORKLOADS]


def record(state_dir: str, pods: list, *, driver: str | None, sources: dict | None = None,
           when: str | None = None, probe_namespace: str | None = None, max_age: float = MAX_AGE_S,
           claims=None) -> dict | None:
    """Add what ``pods`` run to the record for host driver ``driver``; returns the record.

    A new driver moves the record to ``previous``. With ``driver`` None (the kernel module is
    not loaded, as in the middle of a driver upgrade) nothing is recorded. A workload no pod has
    run for ``max_age`` seconds is dropped, from ``previous`` too. The file is written only when
    it changes; a write that fails is not fatal (the record is returned anyway).
    """
    if not state_dir or not driver:
        return None
    from ...core import atomic

    now = when or _now()
    old = load(state_dir)
    seen = from_pods(pods, sources=sources, when=now, probe_namespace=probe_namespace, claims=claims)
    if old is None:
        doc = {"version": VERSION, "driver": driver, "workloads": _merge([], seen, now, max_age)}
    elif old["driver"] == driver:
        doc = dict(old, workloads=_merge(old["workloads"], seen, now, max_age))
        if isinstance(old.get("previous"), dict):
            prev = old["previous"]
            doc["previous"] = dict(prev, workloads=_young(prev["workloads"], _epoch(now) or time.time(), max_age))
    else:
        doc = {"version": VERSION, "driver": driver, "workloads": _merge([], seen, now, max_age),
               "previous": {"driver": old["driver"], "until": now,
                            "workloads": _young(old["workloads"], _epoch(now) or time.time(), max_age)}}
    if doc != old:
        try:
            os.makedirs(state_dir, mode=0o755, exist_ok=True)
            atomic.replace(os.path.join(state_dir, FILE),
                           (json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n").encode(), 0o644)
        except OSError:
            pass
    return doc


def record_pass(cfg, state_dir: str | None, pods: list, sources: dict | None = None,
                probe_namespace: str | None = None) -> dict | None:
    """:func:`record` for an agent pass: the driver is the node's now (``/proc/driver/nvidia/version``
    under the config's ``host_root``)."""
    if not state_dir:
        return None
    from ...facts.hostfacts import gather

    return record(state_dir, pods, driver=gather(cfg).driver_text, sources=sources, probe_namespace=probe_namespace)


def for_driver(doc: dict | None, driver: str, *, max_age: float = MAX_AGE_S, now: float | None = None) -> list:
    """The workloads to prove on ``driver``: those seen before it came (and those seen since), but
    those no pod has run for ``max_age`` seconds before ``now`` (epoch seconds; default: the clock).

    >>> w = lambda i, seen="2026-12-01T00:00:00.000Z": {"image": i, "source": None, "pods": [], "env": [],
    ...                                                 "runtime_class": None, "seen": seen}
    >>> doc = {"driver": "555.58.02", "workloads": [w("a")], "previous": {"driver": "535.261.03", "workloads": [
    ...        w("b"), w("old", "2026-10-01T00:00:00.000Z")]}}
    >>> t = _epoch("2026-12-02T00:00:00")
    >>> [x["image"] for x in for_driver(doc, "555.58.02", now=t)], [x["image"] for x in for_driver(doc, "470.256.02", now=t)]
    (['b', 'a'], ['a'])
    >>> [x["image"] for x in for_driver(doc, "555.58.02", now=t, max_age=90 * 86400)]
    ['b', 'old', 'a']
    """
    if not doc:
        return []
    if doc.get("driver") == driver:
        before = _dict(doc.get("previous")).get("workloads") or []
        items = list(before) + list(doc.get("workloads") or [])
    else:  # the agent has not seen the new driver yet: its record is the old driver's
        items = list(doc.get("workloads") or [])
    items = _young([w for w in items if isinstance(w, dict)], time.time() if now is None else now, max_age)
    out, keys = [], set()
    for w in items:
        if _key(w) not in keys:
            keys.add(_key(w))
            out.append(w)
    return out
