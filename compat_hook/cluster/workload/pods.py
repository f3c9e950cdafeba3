"""Each GPU container of the node's pods, as the engine will start it: the workloads ``plan`` assesses.

The image's env alone says too little. A pod can set ``LD_LIBRARY_PATH`` to a
compat dir, narrow ``NVIDIA_VISIBLE_DEVICES``, turn compat-hook off with an
annotation, or run on a RuntimeClass that does not go through compat-hook at
all. So each GPU container becomes a workload (the policy layer's contract):

* ``env``: the container's ``env`` from the pod spec, to be laid over the
  image's env. ``$(VAR)`` references are expanded as the kubelet does;
  ``valueFrom.fieldRef`` is read from the pod. A variable the decision may read
  (``NVIDIA_*``, ``CUDA_*``, ``LD_*``, ``COMPAT_HOOK_*``) that comes from a
  ConfigMap, a Secret or another source the agent cannot read, or an
  ``envFrom`` that may bring one, makes the container ``unknown``: not assessed,
  never silently dropped. Other variables do not matter to the decision and are
  left out.
* a container with a GPU resource (``nvidia.com/gpu*``, ``nvidia.com/mig-*``) or
  a resource claim gets ``NVIDIA_VISIBLE_DEVICES=all`` last: the device plugin's
  value (the GPUs it allocates, any of the node's) overrides the spec's;
* ``annotations``: the pod's compat-hook and CDI annotations that take effect on
  the path that reaches the container (:mod:`.runs`: every ``compat-hook/*`` one
  on ``nri``, none on ``runtimeclass``);
* ``runtime``: ``compat-hook`` when a path reaches the container (:mod:`.runs`:
  the node's registration, ``nri`` or ``runtimeclass``, and on the latter the
  config's ``cluster.compat_runtime_classes``), else ``toolkit`` (the NVIDIA
  toolkit alone decides); ``path`` says which.

Which containers are GPU ones is :func:`.runs.gpu_reason`'s (the NRI plugin's rules).

Containers alike (same image, env, annotations and runtime) are one workload,
named after its first pod; the pods behind each are kept (:class:`Workloads`).

Pod specs come from the API server and are untrusted: counts and lengths are
bounded, and what is left out is counted.

>>> pod = {"metadata": {"name": "p", "namespace": "ns", "annotations": {"compat-hook/disable": "1", "x": "y"}},
...        "spec": {"runtimeClassName": "nvidia", "containers": [{"name": "c", "image": "registry.test/a:1",
...                 "env": [{"name": "BASE", "value": "/opt"}, {"name": "LD_LIBRARY_PATH", "value": "$(BASE)/lib"},
...                         {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
...                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
>>> [c] = gpu_containers(pod)[0]
>>> c.env, c.annotation_map, c.unknown, c.runtime_class
(('LD_LIBRARY_PATH=/opt/lib', 'NVIDIA_VISIBLE_DEVICES=all'), {'compat-hook/disable': '1'}, None, 'nvidia')
>>> pod["spec"]["initContainers"] = [{"name": "i", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
>>> pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
>>> [c.name for c in gpu_containers(pod)[0]]
['c']
>>> runtime_of("nvidia", ["cuda-compat"]), runtime_of(None, ["", "cuda-compat"]), runtime_of("x", ["*"])
('toolkit', 'compat-hook', 'compat-hook')
>>> runtime_of(None, ["cuda-compat"], "nri"), runtime_of(None, ["cuda-compat"], "nri-not-connected")
('compat-hook', 'toolkit')
>>> pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cfg"}}]
>>> gpu_containers(pod)[0][0].unknown
'envFrom configMapRef cfg may set NVIDIA_*, CUDA_*, LD_* or COMPAT_HOOK_* variables the agent cannot read'
"""

from __future__ import annotations

from dataclasses import dataclass

from . import runs as runsmod
from .refs import normalize_ref

__all__ = ["Container", "Workloads", "gpu_containers", "runtime_of", "build", "is_probe", "RELEVANT", "MAX_PODS",
           "PROBE_NAME", "PROBE_OF"]

#: Env names a decision (compat-hook's or the toolkit's) may read.
RELEVANT = ("NVIDIA_", "CUDA_", "LD_", "COMPAT_HOOK_")
ANNOTATION_PREFIXES = runsmod.ANNOTATION_PREFIXES
MAX_PODS = 1000
MAX_CONTAINERS = 64
MAX_ENV = 1000
MAX_VALUE = 32 << 10
MAX_WORKLOADS = 256
MAX_REF = 512
MAX_PODS_LISTED = 20


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v) -> list:
    return v if isinstance(v, list) else []


#: The label value (``app.kubernetes.io/name``) of the validator's probe pods: never a workload.
PROBE_NAME = "compat-hook-probe"
#: The annotation every probe pod carries (the image it proves; :func:`compat_hook.cluster.node.validate.probe_pod`).
PROBE_OF = "compat-hook.io/probe-of"


def is_probe(pod: dict, namespace: str | None) -> bool:
    """The validator's own probe pod (:mod:`compat_hook.cluster.node.validate`): in ``namespace`` (the agent's
    and the validator's, the release namespace), labelled and annotated as the validator makes it. The
    label alone is anyone's to set: a GPU pod left out of the preflight on its word would be a silent
    fail-open, so a pod short of any of the three is a workload.

    >>> probe = {"metadata": {"namespace": "compat-hook", "labels": {"app.kubernetes.io/name": PROBE_NAME},
    ...                       "annotations": {PROBE_OF: "registry.test/a:1"}}}
    >>> is_probe(probe, "compat-hook"), is_probe(probe, "ml"), is_probe(probe, None)
    (True, False, False)
    >>> del probe["metadata"]["annotations"]; is_probe(probe, "compat-hook")
    False
    """
    meta = _map(pod.get("metadata"))
    return (namespace is not None and meta.get("namespace") == namespace
            and _map(meta.get("labels")).get("app.kubernetes.io/name") == PROBE_NAME
            and PROBE_OF in _map(meta.get("annotations")))


def relevant(name: str) -> bool:
    """Whether the decision may read env variable ``name``.

    >>> relevant("LD_LIBRARY_PATH"), relevant("HOME")
    (True, False)
    """
    return name.startswith(RELEVANT)


def _prefix_may_be_relevant(prefix: str) -> bool:
    return any(r.startswith(prefix) or prefix.startswith(r) for r in RELEVANT)


@dataclass(frozen=True)
class Container:
    """One GPU container of a pod, as the engine will start it: the one workload model of the agent
    (its preflight, through ``plan``'s policy layer) and the validator (its record,
    :mod:`.workloads`, and its probe pods), so both judge the same containers with the same env.

    ``pod`` (ns/name), ``name``, ``image`` (normalized), ``env`` (``K=V``: the relevant variables,
    ``$(VAR)`` expanded as the kubelet does, the device plugin's ``NVIDIA_VISIBLE_DEVICES``
    last), ``annotations`` (``(key, value)`` pairs, sorted: the pod's compat-hook and CDI ones, and the devices
    NVIDIA's pod annotation names for this container: :func:`.runs.container_annotations`),
    ``runtime_class``, ``unknown`` (why it cannot be assessed, or None), ``reason`` (why it is a GPU
    container, :data:`.runs.REASONS`). Init containers and
    containers that ask for no GPU (sidecars) are never one."""

    pod: str
    name: str
    image: str
    env: tuple
    annotations: tuple
    runtime_class: str | None
    unknown: str | None
    reason: str = "resource"

    @property
    def annotation_map(self) -> dict:
        return dict(self.annotations)


def _expand(value: str, defined: dict) -> str:
    """The kubelet's ``$(VAR)`` expansion: earlier variables of the same container; ``$$`` is ``$``.

    >>> _expand("$(A)/x:$$(A):$(NOPE)", {"A": "/a"})
    '/a/x:$(A):$(NOPE)'
    """
    out = []
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if c == "$" and i + 1 < n:
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end > 0:
                    name = value[i + 2:end]
                    out.append(defined[name] if name in defined else value[i:end + 1])
                    i = end + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def _field(pod: dict, path: str):
    """A ``fieldRef.fieldPath`` read from the pod object (None: not set or not supported)."""
    meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), _map(pod.get("status"))
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.hostIP": status.get("hostIP"),
              "status.podIP": status.get("podIP")}
    if path in simple:
        v = simple[path]
        return v if isinstance(v, str) else None
    for kind in ("labels", "annotations"):
        head = f"metadata.{kind}['"
        if path.startswith(head) and path.endswith("']"):
            v = _map(meta.get(kind)).get(path[len(head):-2])
            return v if isinstance(v, str) else None
    return None


def _env(pod: dict, c: dict) -> tuple:
    """``(env [K=V] of the relevant variables, unknown reason or None)`` of container ``c``."""
    unknown = None
    for src in _list(c.get("envFrom"))[:MAX_ENV]:
        src = _map(src)
        prefix = src.get("prefix") if isinstance(src.get("prefix"), str) else ""
        if not _prefix_may_be_relevant(prefix):
            continue
        kind = next((k for k in ("configMapRef", "secretRef") if k in src), "source")
        ref = str(_map(src.get(kind)).get("name") or "?")[:253]
        unknown = unknown or (f"envFrom {kind} {ref} may set NVIDIA_*, CUDA_*, LD_* or COMPAT_HOOK_* variables "
                              f"the agent cannot read")
    defined: dict = {}
    entries = _list(c.get("env"))
    if len(entries) > MAX_ENV:
        unknown = unknown or f"more than {MAX_ENV} env entries"
    for e in entries[:MAX_ENV]:
        e = _map(e)
        name = e.get("name")
        if not isinstance(name, str) or not name or "=" in name:
            continue
        if "valueFrom" in e and e.get("valueFrom") is not None:
            vf = _map(e.get("valueFrom"))
            path = _map(vf.get("fieldRef")).get("fieldPath")
            v = _field(pod, path) if isinstance(path, str) else None
            if v is None:
                defined.pop(name, None)
                if relevant(name):
                    kind = next(iter(vf), "valueFrom")
                    unknown = unknown or f"{name} comes from {kind}, which the agent cannot read"
                continue
            defined[name] = v[:MAX_VALUE]
            continue
        v = e.get("value")
        defined[name] = _expand(v, defined)[:MAX_VALUE] if isinstance(v, str) else ""
    return [f"{k}={v}" for k, v in defined.items() if relevant(k)], unknown


def gpu_containers(pod: dict, claims=None) -> tuple:
    """``([Container], dropped)`` for the GPU containers of a running or pending ``pod``; ``claims``: the
    ResourceClaims a claim is judged by (:class:`.runs.Claims`; None: every claim counts)."""
    if not isinstance(pod, dict) or _map(pod.get("status")).get("phase") in ("Succeeded", "Failed"):
        return [], 0
    meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
    who = f"{str(meta.get('namespace'))[:63]}/{str(meta.get('name'))[:253]}"
    rc = spec.get("runtimeClassName") if isinstance(spec.get("runtimeClassName"), str) else None
    out, dropped = [], 0
    # The app containers only: init containers (and sidecars, restartPolicy Always, among them) run
    # before or beside the workload, never as it; a container that asks for no GPU is not one either.
    cs = [c for c in _list(spec.get("containers")) if isinstance(c, dict)]
    for c in cs[:MAX_CONTAINERS]:
        env, unknown = _env(pod, c)
        why = runsmod.gpu_reason(pod, c, env, claims)
        if why is None:
            continue
        if why in ("resource", "claim"):
            env = [e for e in env if not e.startswith("NVIDIA_VISIBLE_DEVICES=")] + ["NVIDIA_VISIBLE_DEVICES=all"]
        img = c.get("image")
        if not isinstance(img, str) or not img or len(img) > MAX_REF or not img.isprintable() or " " in img:
            dropped += 1
            continue
        anns = runsmod.container_annotations(pod, c)
        out.append(Container(who, str(c.get("name"))[:63], normalize_ref(img), tuple(env), tuple(sorted(anns.items())),
                             rc, unknown, why))
    dropped += max(0, len(cs) - MAX_CONTAINERS)
    return out, dropped


def runtime_of(runtime_class, classes, registration: str | None = None) -> str:
    """``compat-hook`` when a path reaches a GPU container of a pod naming ``runtime_class`` (None: no
    RuntimeClass, the engine's default runtime) on a node registered as ``registration``
    (:meth:`.runs.Node.path_of`: ``nri`` every one; otherwise by ``classes``, ``"*"`` every one and
    ``""`` the default runtime), else ``toolkit``."""
    return "toolkit" if runsmod.Node(registration, classes).path_of(runtime_class) == "none" else "compat-hook"


class Workloads:
    """The node's GPU workloads: ``items`` (the policy layer's workload dicts, ``source`` None until
    the image is found in a store), ``pods`` (name -> the pods behind it), ``images`` (image -> names),
    ``dropped`` (what was left out), ``unknown`` (names that cannot be assessed)."""

    def __init__(self) -> None:
        self.items: list = []
        self.pods: dict = {}
        self.images: dict = {}
        self.dropped = 0
        self.containers = 0
        self._by_key: dict = {}

    def add(self, c: Container, runtime: str, path: str | None = None, annotations: dict | None = None) -> None:
        """``c`` run by ``runtime`` on ``path`` (:data:`.runs.PATHS`) with the pod's ``annotations`` in
        effect there (default: ``c``'s)."""
        self.containers += 1
        anns = c.annotation_map if annotations is None else dict(annotations)
        key = (c.image, c.env, tuple(sorted(anns.items())), runtime, c.unknown)
        w = self._by_key.get(key)
        if w is None:
            if len(self.items) >= MAX_WORKLOADS:
                self.dropped += 1
                return
            name = f"{c.image} ({c.pod} {c.name})"
            w = {"source": None, "name": name, "image": c.image, "env": list(c.env),
                 "annotations": anns, "runtime": runtime, "runtime_class": c.runtime_class,
                 "unknown": c.unknown}
            if path is not None:
                w["path"] = path
            self._by_key[key] = w
            self.items.append(w)
            self.images.setdefault(c.image, []).append(name)
            self.pods[name] = []
        pods = self.pods[w["name"]]
        if c.pod not in pods and len(pods) < MAX_PODS_LISTED:
            pods.append(c.pod)

    def unknown(self) -> list:
        return [w for w in self.items if w["unknown"]]


def build(pods: list, classes, probe_namespace: str | None = None, *, registration: str | None = None,
          claims=None) -> Workloads:
    """The :class:`Workloads` of ``pods`` (the pods bound to the node) as they run on a node registered as
    ``registration`` (:func:`.runs.reported`; None: nothing reported, ``classes`` alone decide); the
    validator's probes, in ``probe_namespace`` (the agent's own), are left out (:func:`is_probe`).
    ``claims``: the ResourceClaims the agent's cache holds (:class:`.runs.Claims`; None: every claim counts).

    >>> pod = {"metadata": {"name": "p", "namespace": "ml", "annotations": {"compat-hook/disable": "true",
    ...        "nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=0"}},
    ...        "spec": {"containers": [{"name": "c", "image": "a:1"}]}}
    >>> nri = build([pod], ["cuda-compat"], registration="nri").items
    >>> [(w["runtime"], w["path"], sorted(w["annotations"])) for w in nri]
    [('compat-hook', 'nri', ['cdi.k8s.io/nvidia.cdi.k8s.io', 'compat-hook/disable'])]
    >>> [(w["runtime"], w["path"], sorted(w["annotations"])) for w in build([pod], ["cuda-compat"]).items]
    [('toolkit', 'none', ['cdi.k8s.io/nvidia.cdi.k8s.io'])]
    """
    node = runsmod.Node(registration, classes)
    ws = Workloads()
    for pod in pods[:MAX_PODS]:
        if isinstance(pod, dict) and is_probe(pod, probe_namespace):  # the validator's own: never a workload
            continue
        cs, dropped = gpu_containers(pod, claims)
        ws.dropped += dropped
        for c in cs:
            path = node.path_of(c.runtime_class)
            ws.add(c, "toolkit" if path == "none" else "compat-hook", path, node.effective(path, c.annotation_map))
    ws.dropped += max(0, len(pods) - MAX_PODS)
    return ws
