"""What runs on this node: which containers of a pod ask for a GPU, and whether compat-hook reaches them.

The one model the agent's preflight (:mod:`.pods`), the images it looks up
(:func:`.refs.gpu_pod`) and the validator's record (:mod:`.workloads`) share, and
the rules compat-hook's NRI plugin (``packaging/nri``, ``gpuReason``) routes by.
``packaging/nri/testdata/routing-cases.json`` is one table both sides are tested
against (tests/test_runs.py and the plugin's ``main_test.go``).

**A GPU container** (:func:`gpu_reason`), from the pod spec, one class each
(:data:`REASONS`), the first that holds:

* ``resource``: a limit or request ``nvidia.com/gpu*`` or ``nvidia.com/mig-*``
  (the device plugin's CDI device, env or device nodes are what the engine sees);
* ``claim``: a DRA resource claim the container uses (``resources.claims``) that is
  allocated a device of a DRA driver whose name ends with ``nvidia.com`` (NVIDIA's
  ``gpu.nvidia.com``: its CDI devices, ``k8s.gpu.nvidia.com/claim=...``, are what the
  plugin routes by: :func:`nvidia_driver`). The claim
  itself is not in the pod: :class:`Claims` reads it from the ResourceClaims the
  agent's cache holds. A claim that cannot be read (no cache given, not created or
  not allocated yet, not in the cache) counts: a pod is never left out for want of
  it. A claim allocated only other drivers' devices (a NIC, an FPGA) does not;
* ``nvidia-annotation``: NVIDIA's pod annotation, as NVIDIA's own NRI plugin reads it
  (``nvidia.cdi.k8s.io/container.<name>``, else ``nvidia.cdi.k8s.io/pod``, else
  ``nvidia.cdi.k8s.io``: the first that is set decides), naming an ``nvidia.com/``
  device. The device that plugin adds is never in the pod spec nor in the request
  compat-hook's plugin sees: the annotation is the only sign of it;
* ``cdi-annotation``: a pod annotation ``cdi.k8s.io/*`` naming an ``nvidia.com/`` device;
* ``env``: ``NVIDIA_VISIBLE_DEVICES`` in the container's env, its last value not
  empty, ``void`` or ``none``.

**The path** (:meth:`Node.path_of`) comes from what the node reports: the
registration word the chart's installer wrote (``<prefix>/registration`` on the
Node, :func:`reported`). ``nri``: the plugin routes every GPU container, whatever
RuntimeClass its pod names. Otherwise (``runtimeclass``, ``nri-not-connected``: the
runtime is registered on NRI nodes too; or nothing reported) a container is reached
when its pod names one of ``cluster.compat_runtime_classes`` (the chart renders its
RuntimeClass's name; ``*`` every class, ``""`` the default runtime), else ``none``:
the NVIDIA toolkit alone decides.

**The pod's annotations in effect** (:meth:`Node.effective`). The hook reads the
container's OCI annotations. containerd copies into them only the pod annotations
its runtime's ``pod_annotations`` lists, and compat-hook's runtime lists none; so on
the ``runtimeclass`` path a pod's ``compat-hook/*`` annotations do not reach the hook.
On ``nri`` the plugin sees every pod annotation: it keeps away from a container whose
pod says ``compat-hook/disable``, and adds the pod's other ``compat-hook/*``
annotations to the container (the container's own win), so all of them take effect.
``cdi.k8s.io/*`` annotations describe the GPUs and are kept on every path; the
devices NVIDIA's annotation names for a container join them
(:func:`container_annotations`), so the decision selects the same GPUs.

>>> pod = {"metadata": {"annotations": {"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=all",
...                                     "compat-hook/dry-run": "true"}},
...        "spec": {"containers": [{"name": "app", "image": "a"}, {"name": "log", "image": "b"}]}}
>>> [(c["name"], gpu_reason(pod, c)) for c in pod["spec"]["containers"]]
[('app', 'nvidia-annotation'), ('log', None)]
>>> nri, rc = Node("nri", ["cuda-compat"]), Node("runtimeclass", ["cuda-compat"])
>>> nri.path_of(None), rc.path_of(None), rc.path_of("cuda-compat"), Node(None, ["*"]).path_of("x")
('nri', 'none', 'runtimeclass', 'runtimeclass')
>>> anns = {"compat-hook/dry-run": "true", "cdi.k8s.io/g": "nvidia.com/gpu=0"}
>>> nri.effective("nri", anns), rc.effective("runtimeclass", anns)
({'cdi.k8s.io/g': 'nvidia.com/gpu=0', 'compat-hook/dry-run': 'true'}, {'cdi.k8s.io/g': 'nvidia.com/gpu=0'})
>>> [(r.name, r.reason, r.path) for r in runs(pod, nri)]
[('app', 'nvidia-annotation', 'nri')]
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REASONS", "PATHS", "REGISTRATIONS", "Node", "Run", "Claims", "nvidia_driver", "slim_claim", "gpu_reason", "visible_devices", "reported", "runs",
           "pod_annotations", "container_annotations", "disabled", "NVIDIA_DEVICES_KEY"]

#: Why a container is a GPU one, in the order they are tried.
REASONS = ("resource", "claim", "nvidia-annotation", "cdi-annotation", "env")
#: Which path reaches a container: compat-hook's NRI plugin, its RuntimeClass's runtime, or neither.
PATHS = ("nri", "runtimeclass", "none")
#: The words the chart's installer registers a node by (``cluster/node/nodedoc.REGISTRATIONS``).
REGISTRATIONS = ("nri", "nri-not-connected", "runtimeclass")
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
#: The pod annotations the model reads: compat-hook's switches and the CDI names.
ANNOTATION_PREFIXES = ("compat-hook/", "cdi.k8s.io/")
NVIDIA_DOMAIN = "nvidia.cdi.k8s.io"
DISABLE = "compat-hook/disable"
MAX_VALUE = 32 << 10
#: At most this many ResourceClaims are indexed (:class:`Claims`); one beyond is unknown, so it counts.
MAX_CLAIMS = 50_000
#: At most this many allocation results of one claim are read.
MAX_RESULTS = 256
_TRUE = ("1", "true", "yes", "on", "y")


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v) -> list:
    return v if isinstance(v, list) else []


def _all_annotations(pod: dict) -> dict:
    return {k: v for k, v in _map(_map(pod.get("metadata")).get("annotations")).items()
            if isinstance(k, str) and isinstance(v, str)}


def pod_annotations(pod: dict) -> dict:
    """The pod's annotations the model keeps (:data:`ANNOTATION_PREFIXES`), values bounded.

    >>> pod_annotations({"metadata": {"annotations": {"compat-hook/disable": "1", "x": "y", "cdi.k8s.io/a": 3}}})
    {'compat-hook/disable': '1'}
    """
    return {k: v[:MAX_VALUE] for k, v in _all_annotations(pod).items() if k.startswith(ANNOTATION_PREFIXES)}


#: The key under which :func:`container_annotations` gives the decision the devices NVIDIA's pod
#: annotation names for a container: they reach it as CDI devices, read as a CDI annotation's.
NVIDIA_DEVICES_KEY = "cdi.k8s.io/" + NVIDIA_DOMAIN


def container_annotations(pod: dict, c: dict) -> dict:
    """The pod's annotations the model keeps (:func:`pod_annotations`), for container ``c``: with the
    devices NVIDIA's pod annotation names for it under :data:`NVIDIA_DEVICES_KEY` (NVIDIA's NRI plugin
    adds them as CDI devices; the decision reads them as it reads a CDI annotation's).

    >>> pod = {"metadata": {"annotations": {"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=1"}}}
    >>> container_annotations(pod, {"name": "app"}), container_annotations(pod, {"name": "log"})
    ({'cdi.k8s.io/nvidia.cdi.k8s.io': 'nvidia.com/gpu=1'}, {})
    """
    out = pod_annotations(pod)
    name = c.get("name")
    v = nvidia_annotation(_all_annotations(pod), name) if isinstance(name, str) else None
    if v is not None and "nvidia.com/" in v:
        out[NVIDIA_DEVICES_KEY] = v[:MAX_VALUE]
    return out


def nvidia_annotation(anns: dict, name: str) -> str | None:
    """NVIDIA's pod annotation for container ``name``, as nri's ``GetEffectiveAnnotation`` reads it.

    >>> nvidia_annotation({"nvidia.cdi.k8s.io/pod": "p", "nvidia.cdi.k8s.io/container.c": "c"}, "c")
    'c'
    >>> nvidia_annotation({"nvidia.cdi.k8s.io/pod": "p", "nvidia.cdi.k8s.io": "b"}, "d")
    'p'
    """
    for key in (f"{NVIDIA_DOMAIN}/container.{name}", f"{NVIDIA_DOMAIN}/pod", NVIDIA_DOMAIN):
        if key in anns:
            return anns[key]
    return None


def visible_devices(env: list) -> str | None:
    """The last ``NVIDIA_VISIBLE_DEVICES`` of ``env`` (``K=V`` strings), stripped; None when unset."""
    out = None
    for e in env:
        if isinstance(e, str) and e.startswith("NVIDIA_VISIBLE_DEVICES="):
            out = e.split("=", 1)[1].strip()
    return out


def _plain_env(c: dict) -> list:
    """``K=V`` of the container's env entries with a plain ``value`` (what the engine gets as is)."""
    return [f"{e['name']}={e.get('value') or ''}" for e in _list(c.get("env"))
            if isinstance(e, dict) and isinstance(e.get("name"), str) and not e.get("valueFrom")
            and isinstance(e.get("value", ""), (str, type(None)))]


def nvidia_driver(driver) -> bool:
    """Whether a DRA driver's devices are ones the plugin routes: their CDI devices, ``k8s.<driver>/claim=...``
    as NVIDIA's drivers name them, hold ``nvidia.com/`` (the plugin's rule, ``gpuReason``), so the driver's
    name ends with ``nvidia.com``. (A driver of another name that hands out ``/dev/nvidia*`` is routed by
    the plugin on containerd before 2.3 by the device nodes, and is not counted here.)

    >>> nvidia_driver("gpu.nvidia.com"), nvidia_driver("nic.example.com"), nvidia_driver("xnvidia.com")
    (True, False, True)
    """
    return isinstance(driver, str) and "nvidia.com/" in f"k8s.{driver}/"


def slim_claim(obj: dict) -> dict:
    """What the agent's cache keeps of a ResourceClaim: its name, namespace and resourceVersion, and of its
    allocation each result's ``request`` and ``driver`` (at most :data:`MAX_RESULTS`): a cache of every
    claim of the cluster stays small.

    >>> slim_claim({"metadata": {"name": "c", "namespace": "ml", "resourceVersion": "7", "labels": {"a": "b"}},
    ...             "spec": {"devices": {}}, "status": {"allocation": {"devices": {"results": [
    ...             {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}}}})
    {'metadata': {'name': 'c', 'namespace': 'ml', 'resourceVersion': '7'}, 'status': {'allocation': {'devices': {'results': [{'request': 'gpu', 'driver': 'gpu.nvidia.com'}]}}}}
    """
    meta = _map(_map(obj).get("metadata"))
    out: dict = {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion")
                              if isinstance(meta.get(k), str)}}
    alloc = _map(_map(_map(obj).get("status")).get("allocation"))
    if alloc:
        results = [{k: r.get(k) for k in ("request", "driver") if isinstance(r.get(k), str)}
                   for r in _list(_map(alloc.get("devices")).get("results"))[:MAX_RESULTS] if isinstance(r, dict)]
        out["status"] = {"allocation": {"devices": {"results": results}}}
    return out


class Claims:
    """The ResourceClaims the agent's cache holds (``resource.k8s.io/v1``), by namespace and name.

    >>> claim = {"metadata": {"namespace": "ml", "name": "p-gpu-x"}, "status": {"allocation": {"devices": {
    ...          "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}}}}
    >>> nic = {"metadata": {"namespace": "ml", "name": "nic"}, "status": {"allocation": {"devices": {
    ...        "results": [{"request": "nic", "driver": "nic.example.com", "pool": "n", "device": "eth1"}]}}}}
    >>> pod = {"metadata": {"namespace": "ml"}, "spec": {"resourceClaims": [
    ...        {"name": "gpu", "resourceClaimTemplateName": "t"}, {"name": "nic", "resourceClaimName": "nic"},
    ...        {"name": "new", "resourceClaimTemplateName": "t"}]},
    ...        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}}
    >>> cs = Claims([claim, nic])
    >>> cs.gpu(pod, {"name": "gpu"}), cs.gpu(pod, {"name": "nic"}), cs.gpu(pod, {"name": "new"})
    (True, False, None)
    >>> cs.gpu(pod, {"name": "gpu", "request": "other"})
    False
    """

    def __init__(self, objects=()) -> None:
        self._by: dict = {}
        for o in list(objects or ())[:MAX_CLAIMS]:
            meta = _map(_map(o).get("metadata"))
            ns, name = meta.get("namespace"), meta.get("name")
            if isinstance(ns, str) and isinstance(name, str):
                self._by[(ns, name)] = o

    def __len__(self) -> int:
        return len(self._by)

    def __eq__(self, other) -> bool:
        return isinstance(other, Claims) and self._by == other._by

    __hash__ = None

    @staticmethod
    def name_of(pod: dict, entry: str) -> str | None | bool:
        """The ResourceClaim behind the pod's claim ``entry`` (``spec.resourceClaims[].name``): its
        ``resourceClaimName``, else the one the pod's status names for its template; False where the
        status says none was needed; None where it is not known yet."""
        for e in _list(_map(pod.get("spec")).get("resourceClaims")):
            if isinstance(e, dict) and e.get("name") == entry:
                if isinstance(e.get("resourceClaimName"), str):
                    return e["resourceClaimName"]
                break
        else:
            return None
        for st in _list(_map(pod.get("status")).get("resourceClaimStatuses")):
            if isinstance(st, dict) and st.get("name") == entry:
                n = st.get("resourceClaimName")
                return n if isinstance(n, str) else False  # unset: no claim was needed
        return None

    def gpu(self, pod: dict, use: dict) -> bool | None:
        """Whether the claim a container uses (``resources.claims[]``: ``name``, ``request``) is allocated an
        NVIDIA device: True, False, or None (unknown: it counts)."""
        entry = use.get("name") if isinstance(use, dict) else None
        if not isinstance(entry, str):
            return None
        name = self.name_of(pod, entry)
        if name is False:
            return False
        ns = _map(pod.get("metadata")).get("namespace")
        claim = self._by.get((ns, name)) if isinstance(name, str) else None
        if claim is None:
            return None
        alloc = _map(_map(claim.get("status")).get("allocation"))
        if not alloc:
            return None  # not allocated yet: the scheduler has not placed it
        req = use.get("request")
        results = [r for r in _list(_map(alloc.get("devices")).get("results"))[:MAX_RESULTS] if isinstance(r, dict)]
        if isinstance(req, str) and req:
            # a request's subrequests (firstAvailable) are allocated as "<request>/<subrequest>"
            results = [r for r in results if r.get("request") == req or str(r.get("request")).startswith(req + "/")]
        return any(nvidia_driver(r.get("driver")) for r in results)


def gpu_reason(pod: dict, c: dict, env: list | None = None, claims: Claims | None = None) -> str | None:
    """Why container ``c`` of ``pod`` asks for a GPU (a class of :data:`REASONS`), None when it does not.

    ``env``: the container's env as ``K=V`` (expanded by :mod:`.pods`); by default its plain values.
    ``claims``: the ResourceClaims to judge a claim by (:class:`Claims`); None: every claim counts.

    >>> gpu_reason({}, {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}})
    'resource'
    >>> gpu_reason({}, {"resources": {"claims": [{"name": "gpu"}]}}), gpu_reason({}, {"resources": {"claims": []}})
    ('claim', None)
    >>> gpu_reason({}, {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ...                         {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]})
    >>> gpu_reason({"metadata": {"annotations": {"cdi.k8s.io/x": "example.com/dev=0"}}}, {})
    """
    res = _map(c.get("resources"))
    for part in ("limits", "requests"):
        if any(isinstance(k, str) and k.startswith(GPU_RESOURCES) for k in _map(res.get(part))):
            return "resource"
    uses = _list(res.get("claims"))
    if uses and (claims is None or any(claims.gpu(pod, u) is not False for u in uses)):
        return "claim"
    anns = _all_annotations(pod)
    name = c.get("name")
    v = nvidia_annotation(anns, name) if isinstance(name, str) else None
    if v is not None and "nvidia.com/" in v:
        return "nvidia-annotation"
    if any(k.startswith("cdi.k8s.io/") and "nvidia.com/" in v for k, v in anns.items()):
        return "cdi-annotation"
    visible = visible_devices(_plain_env(c) if env is None else env)
    if visible not in (None, "", "void", "none"):
        return "env"
    return None


def truthy(v) -> bool:
    return isinstance(v, str) and v.strip().lower() in _TRUE


def disabled(annotations: dict) -> bool:
    """``compat-hook/disable`` set true (the hook's and the plugin's reading)."""
    return truthy(annotations.get(DISABLE))


def reported(word: str | None, node: dict | None = None, prefix: str | None = None) -> str | None:
    """The node's registration: ``word`` (the installer's file, as the agent read it) where it is one of
    :data:`REGISTRATIONS`, else the Node's ``<prefix>/registration`` label, else None (nothing reported).

    >>> reported(None, {"metadata": {"labels": {"p/registration": "nri"}}}, "p"), reported("runtimeclass")
    ('nri', 'runtimeclass')
    >>> reported("junk", {"metadata": {"labels": {"p/registration": "junk"}}}, "p")
    """
    if word in REGISTRATIONS:
        return word
    if node is not None and prefix:
        label = _map(_map(_map(node).get("metadata")).get("labels")).get(f"{prefix}/registration")
        if label in REGISTRATIONS:
            return label
    return None


@dataclass(frozen=True)
class Node:
    """What the node reports: ``registration`` (:data:`REGISTRATIONS`, None: not reported) and
    ``classes``, the RuntimeClasses whose runtime is compat-hook's (``cluster.compat_runtime_classes``)."""

    registration: str | None
    classes: tuple = ()

    def __init__(self, registration: str | None, classes=()) -> None:
        object.__setattr__(self, "registration", registration if registration in REGISTRATIONS else None)
        object.__setattr__(self, "classes", tuple(c for c in (classes or ()) if isinstance(c, str)))

    def path_of(self, runtime_class: str | None) -> str:
        """The path that reaches a GPU container of a pod naming ``runtime_class`` (None: none named)."""
        if self.registration == "nri":
            return "nri"
        if "*" in self.classes or (runtime_class or "") in self.classes:
            return "runtimeclass"
        return "none"

    def effective(self, path: str, annotations: dict) -> dict:
        """The pod's annotations (of :data:`ANNOTATION_PREFIXES`) that take effect on ``path``, sorted."""
        keep = {k: v for k, v in annotations.items()
                if k.startswith("cdi.k8s.io/") or (path == "nri" and k.startswith("compat-hook/"))}
        return dict(sorted(keep.items()))


@dataclass(frozen=True)
class Run:
    """One GPU container as it will run: ``name``, ``reason`` (:data:`REASONS`), ``path`` (:data:`PATHS`),
    ``annotations`` (those in effect on that path), ``reached`` (compat-hook's hook runs for it: a path,
    and not turned off by an annotation in effect)."""

    name: str
    reason: str
    path: str
    annotations: dict

    @property
    def reached(self) -> bool:
        return self.path != "none" and not disabled(self.annotations)


def runs(pod: dict, node: Node, claims: Claims | None = None) -> list:
    """A :class:`Run` per GPU app container of ``pod`` on ``node`` (init containers left out); ``claims``
    as :func:`gpu_reason`'s."""
    spec = _map(pod.get("spec"))
    rc = spec.get("runtimeClassName") if isinstance(spec.get("runtimeClassName"), str) else None
    path = node.path_of(rc)
    out = []
    for c in _list(spec.get("containers")):
        if isinstance(c, dict):
            why = gpu_reason(pod, c, claims=claims)
            if why is not None:
                out.append(Run(str(c.get("name"))[:63], why, path, node.effective(path, container_annotations(pod, c))))
    return out
