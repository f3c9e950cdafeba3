"""``compat-hook cluster validate``: after a driver change, the node proves its workloads before it takes work again.

The GPU Operator's upgrade controller keeps a node in ``validation-required`` until every pod
labelled ``app=nvidia-operator-validator`` on it is Ready (600 s at most; then the node goes to
``upgrade-failed`` and is uncordoned once its driver pod is Ready). The chart's validator
DaemonSet (templates/validator.yaml) carries that label, so the node waits for this loop:

1. it reads the node's driver (``/proc/driver/nvidia/version`` under ``host_root``) every
   ``--interval`` seconds; with no pass recorded for that driver the pod is not Ready (its
   readiness probe compares ``--ready-file`` with the driver's line, so a change is seen at once);
2. it takes the GPU workloads the agent recorded on this node before the change (and since:
   :func:`compat_hook.cluster.workload.workloads.for_driver`) and runs each as a short probe pod pinned to
   the node (:func:`probe_pod`): the workload's image and GPU env, on the road the workload takes
   (:func:`paths`: compat-hook's RuntimeClass where compat-hook reaches the workload, through its
   NRI plugin or its RuntimeClass; the workload's own RuntimeClass where nothing of compat-hook's
   does, so the NVIDIA toolkit alone decides, as for the workload), the cordon, GPU and
   compat-hook's own taints tolerated, a GPU from the env, a device plugin
   (``--gpu-resource``) or a DRA claim (``--claim-template``: then pinned by node affinity, so
   that the scheduler allocates the claim), and ``compat-hook-probe`` (packaging/oci-image/
   compat-hook-probe.c), copied from compat-hook's image into an ``emptyDir`` by an init
   container, as the command. The probe says which libcuda the image's own loader took,
   ``cuDriverGetVersion``, and ``cuInit`` where a GPU is present. A probe pod has a deadline and
   is always deleted;
3. :func:`judge` compares that with compat-hook's decision for the image on this node
   (:func:`expectation`: the assessment ``plan`` and the hook run; the toolkit's own rules for a
   workload compat-hook does not reach): the libcuda it names must be
   the one loaded, and the driver API must cover the CUDA version the image needs (same major
   and an older minor passes: minor-version compatibility, as in ``plan``);
4. it publishes ``<prefix>/validated=<driver version>`` or ``failed`` on the Node, an Event on it
   (``CompatHookValidation``; a Warning naming each failing image and the pods that ran it), and
   writes the ready file on a pass.

A failure is retried every ``--retry`` seconds (a fixed image, re-tagged, then passes); the
pod stays not Ready meanwhile, so past the controller's 600 s the node ends in
``upgrade-failed`` with the label saying ``failed`` and the Event saying why.

It fails closed: a workload whose expectation cannot be formed (its image unreadable, the store
unreachable: ``no_expectation``) or whose image is no longer on the node (the probe never pulls;
``ErrImageNeverPull``: ``not_on_node``) fails, unless the config's
``cluster.validation_allow_unverified`` is true (then it passes as not verified). A failed node
carries compat-hook's own taint :data:`TAINT` (``<prefix>/validation-failed=<driver>:NoSchedule``,
``cluster.validation_taint``, on by default) until a pass: NVIDIA's controller uncordons a node in
``upgrade-failed`` once its driver pod is Ready, and the taint keeps new pods off it all the same.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from ...core import logjson
from ...core.errors import CompatHookError, UsageError, describe
from ..workload import workloads as wl
from ..api.kube import KubeError, NotFound, Unreachable
from .nodeevents import EVENT_NAMESPACE  # where an Event about a Node can be (the agent's too)

__all__ = ["ValidatorOptions", "expectation", "judge", "judge_probe", "no_gpu_hint", "probe_pod", "probe_name", "parse_probe", "validate",
           "run", "main", "LABEL", "TAINT", "EVENT_REASON", "taints_after", "failed"]

LABEL = "validated"
#: ``<prefix>/`` + this: the taint (``=<driver>:NoSchedule``) a node carries while its validation fails.
TAINT = "validation-failed"
EVENT_REASON = "CompatHookValidation"
STATE_FILE = "validation.json"
#: In compat-hook's image (packaging/oci-image/stage-probe.sh) and in the probe pod.
PROBE_BINARY = "/usr/local/libexec/compat-hook-probe"
PROBE_DIR = "/compat-hook-probe"
#: The probe's JSON, as the kubelet keeps it (a termination message is 4096 bytes at most).
MAX_MESSAGE = 4096
#: The probe pod's user and group: nobody (65534), never root.
PROBE_UID = 65534
MAX_EVENT = 1024
#: Waiting reasons after which the probe pod cannot start by itself.
_NOT_ON_NODE = ("ErrImageNeverPull",)
_HOPELESS = ("InvalidImageName", "CreateContainerConfigError")
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
#: Set on SIGTERM (the pod going away): probe pods in flight are deleted, nothing half-done is published.
STOP = threading.Event()
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class ValidatorOptions:
    __slots__ = ("node", "publish_namespace", "workloads_dir", "state_dir", "probe_image", "runtime_class",
                 "probe_timeout", "deadline", "parallel", "interval", "retry", "ready_file", "address",
                 "namespace", "once", "gpu_resource", "allow_unverified", "taint", "claim_template", "taint_key")

    def __init__(self, node: str, *, publish_namespace: str = "compat-hook", workloads_dir: str = "",
                 state_dir: str = "", probe_image: str = "", runtime_class: str = "cuda-compat",
                 probe_timeout: int = 90, deadline: int = 420, parallel: int = 4, interval: float = 5.0,
                 retry: float = 300.0, ready_file: str | None = None, address: str | None = None,
                 namespace: str = "k8s.io", once: bool = False, gpu_resource: str | None = None,
                 allow_unverified: bool = False, taint: bool = True, claim_template: str | None = None,
                 taint_key: str = f"compat-hook.io/{TAINT}") -> None:
        self.node, self.publish_namespace, self.workloads_dir = node, publish_namespace, workloads_dir
        self.state_dir, self.probe_image, self.runtime_class = state_dir, probe_image, runtime_class
        self.probe_timeout, self.deadline, self.parallel = probe_timeout, deadline, parallel
        self.interval, self.retry, self.ready_file = interval, retry, ready_file
        self.address, self.namespace, self.once = address, namespace, once
        self.gpu_resource = gpu_resource
        #: ``cluster.validation_allow_unverified``: a workload that cannot be judged (its image unreadable,
        #: or not on the node) passes, not verified. Off by default: the interlock fails closed.
        self.allow_unverified = allow_unverified
        #: ``cluster.validation_taint``: a failed node carries TAINT until a pass.
        self.taint = taint
        #: ``--claim-template``: probe pods get their GPU from a ResourceClaim of this ResourceClaimTemplate
        #: (the chart's, with ``validator.deviceClass``), placed on the node by the scheduler, which allocates it.
        self.claim_template = claim_template
        #: ``<prefix>/`` + TAINT: the probe pods tolerate it (the scheduler places them on a failed node too).
        self.taint_key = taint_key


# --------------------------------------------------------------------------- pure parts


def probe_name(node: str, workload: dict) -> str:
    """A probe pod's name: the same for the same node and workload (a restarted validator finds and
    deletes what it left), a DNS label whatever the node's name.

    >>> w = {"image": "x", "runtime_class": None, "env": []}
    >>> n = probe_name("gpu-a", w); n == probe_name("gpu-a", dict(w)), n != probe_name("gpu-b", w), len(n)
    (True, True, 37)
    """
    import hashlib

    key = json.dumps([workload["image"], workload.get("runtime_class"), workload.get("env") or []])
    return (f"compat-hook-probe-{hashlib.sha256(node.encode()).hexdigest()[:8]}-"
            f"{hashlib.sha256(key.encode()).hexdigest()[:10]}")


def _probe_env(workload: dict, ask_gpu: bool = True) -> list:
    """The workload's env as a pod's; with ``ask_gpu`` a GPU for the runtime to give when it named
    none (the device plugin sets NVIDIA_VISIBLE_DEVICES for a pod that asks for nvidia.com/gpu, not
    its spec)."""
    env, names = [], set()
    for item in workload.get("env") or []:
        k, _, v = item.partition("=")
        if k and k not in names:
            names.add(k)
            env.append({"name": k, "value": v})
    if ask_gpu and "NVIDIA_VISIBLE_DEVICES" not in names:
        env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return env


def probe_runtime_class(opts: ValidatorOptions, workload: dict, path: str | None = None) -> str | None:
    """The RuntimeClass a probe of ``workload`` runs on: compat-hook's (``opts.runtime_class``) where a path
    of compat-hook's reaches the workload (:data:`..workload.runs.PATHS` ``nri``, ``runtimeclass``; None: not
    known, as before), the workload's own where none does (``none``: the toolkit alone, as for the workload).

    >>> o = ValidatorOptions("n")
    >>> w = {"image": "x", "runtime_class": "nvidia"}
    >>> probe_runtime_class(o, w, "nri"), probe_runtime_class(o, w, "none"), probe_runtime_class(o, w)
    ('cuda-compat', 'nvidia', 'cuda-compat')
    """
    return workload.get("runtime_class") if path == "none" else opts.runtime_class


def probe_pod(opts: ValidatorOptions, workload: dict, path: str | None = None) -> dict:
    """The probe pod of ``workload``, whose GPU containers take ``path`` on this node (see the module
    docstring and :func:`probe_runtime_class`).

    >>> o = ValidatorOptions("gpu-a", probe_image="localhost/compat-hook:0.1.0")
    >>> p = probe_pod(o, {"image": "nvcr.io/nvidia/cuda:12.4.1-base", "env": ["CUDA_VISIBLE_DEVICES=0"],
    ...                   "runtime_class": None, "pods": ["ml/a"]})
    >>> p["spec"]["nodeName"], p["spec"]["runtimeClassName"], p["spec"]["containers"][0]["command"]
    ('gpu-a', 'cuda-compat', ['/compat-hook-probe/compat-hook-probe'])
    >>> [e["name"] for e in p["spec"]["containers"][0]["env"]], p["metadata"]["labels"]["app.kubernetes.io/name"]
    (['CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES'], 'compat-hook-probe')
    >>> sc = p["spec"]["containers"][0]["securityContext"]
    >>> p["spec"]["serviceAccountName"], sc["runAsUser"], sc["capabilities"], sc["seccompProfile"]["type"]
    ('default', 65534, {'drop': ['ALL']}, 'RuntimeDefault')

    With ``claim_template`` (``--claim-template``, the chart's ``validator.deviceClass``) the GPU comes
    from a ResourceClaim of that template: a claim is allocated only by the scheduler, so the pod is
    not bound by ``nodeName`` but pinned to the node by a required node affinity on its name, and
    asks for no GPU in its env.

    >>> o.claim_template = "compat-hook-probe-gpu"
    >>> p = probe_pod(o, {"image": "cuda:12.4", "env": [], "runtime_class": None, "pods": ["ml/a"]})
    >>> "nodeName" in p["spec"], p["spec"]["resourceClaims"], p["spec"]["containers"][0]["resources"]["claims"]
    (False, [{'name': 'gpu', 'resourceClaimTemplateName': 'compat-hook-probe-gpu'}], [{'name': 'gpu'}])
    >>> p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [{'matchFields': [{'key': 'metadata.name', 'operator': 'In', 'values': ['gpu-a']}]}]
    >>> p["spec"]["containers"][0]["env"]
    []
    """
    small = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "128Mi"}}
    mount = {"name": "probe", "mountPath": PROBE_DIR}
    # The image's code runs here: as nobody, with no capability, no way to gain one and the
    # runtime's seccomp profile. The probe only reads the image's libraries and writes its
    # termination message (the kubelet makes that file writable by any user).
    confined = {"runAsNonRoot": True, "runAsUser": PROBE_UID, "runAsGroup": PROBE_UID,
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}
    # With --gpu-resource the device plugin gives the probe a GPU (where the runtime ignores a GPU
    # asked for in the env of an unprivileged pod); with --claim-template a DRA claim does (a node
    # whose GPUs come only from claims); by default the env asks, and no GPU is taken.
    res = small if not opts.gpu_resource else {"requests": small["requests"],
                                               "limits": dict(small["limits"], **{opts.gpu_resource: "1"})}
    if opts.claim_template:
        res = dict(small, claims=[{"name": "gpu"}])
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": probe_name(opts.node, workload), "namespace": opts.publish_namespace,
                     "labels": {"app.kubernetes.io/name": wl.PROBE_NAME, "app.kubernetes.io/part-of": "compat-hook",
                                "app.kubernetes.io/component": "validation-probe"},
                     "annotations": {"compat-hook.io/probe-of": workload["image"][:512]}},
        "spec": {
            "nodeName": opts.node, "runtimeClassName": probe_runtime_class(opts, workload, path),
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(opts.probe_timeout), "terminationGracePeriodSeconds": 1,
            # the namespace's "default" account, which the chart grants nothing: a node's kubelet may
            # mint a token for the account of any pod bound to it, so never one of the chart's own
            "serviceAccountName": "default", "automountServiceAccountToken": False, "enableServiceLinks": False,
            # what the scheduler would weigh when it places a claim's pod: a cordoned node (the
            # upgrade's), the GPU taint, compat-hook's own taint on a node whose validation failed
            "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "nvidia.com/gpu", "operator": "Exists"},
                            {"key": opts.taint_key, "operator": "Exists", "effect": "NoSchedule"}],
            "volumes": [{"name": "probe", "emptyDir": {"sizeLimit": "16Mi"}}],
            "initContainers": [{
                "name": "stage", "image": opts.probe_image, "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/cp", PROBE_BINARY, f"{PROBE_DIR}/compat-hook-probe"],
                "volumeMounts": [mount], "resources": small,
                "securityContext": dict(confined, readOnlyRootFilesystem=True)}],
            "containers": [{
                "name": "probe", "image": workload["image"], "imagePullPolicy": "Never",
                "command": [f"{PROBE_DIR}/compat-hook-probe"],
                "env": _probe_env(workload, not (opts.gpu_resource or opts.claim_template)),
                "volumeMounts": [dict(mount, readOnly=True)], "resources": res,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": dict(confined)}]}}
    if opts.claim_template:
        # The scheduler allocates the claim where it places the pod: one required term naming this node
        # alone (the chart's admission policy accepts exactly that form in place of spec.nodeName).
        spec = pod["spec"]
        del spec["nodeName"]
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [opts.node]}]}]}}}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": opts.claim_template}]
    if pod["spec"]["runtimeClassName"] is None:
        del pod["spec"]["runtimeClassName"]  # the engine's default runtime, as the workload's
    return pod


def paths(kube, cfg, opts: ValidatorOptions, prefix: str):
    """What reaches the GPU containers on this node (:class:`..workload.runs.Node`): the registration the
    Node reports (the agent's label, which the installer's word sets) and the config's
    ``cluster.compat_runtime_classes``, the agent's own model of what runs; None where the Node reports
    no registration."""
    from ..workload import runs
    from .agent import settings

    try:
        node = kube.get(f"/api/v1/nodes/{opts.node}")
    except NotFound:
        node = None
    reg = runs.reported(None, node, prefix)
    # No registration on the Node yet (before the agent's first pass, after a release): the road is not known,
    # and each workload is probed through compat-hook, as before the roads were told apart.
    return runs.Node(reg, settings(cfg)["compat_runtime_classes"]) if reg is not None else None


def parse_probe(text) -> dict | None:
    """The probe's JSON object with its fields checked, or None.

    >>> parse_probe('{"probe": 1, "libcuda": "/usr/lib/libcuda.so.1", "driver_api": 12050, "maps": []}')["driver_api"]
    12050
    >>> parse_probe('{"probe": 1, "driver_api": "x"}') is None, parse_probe("not json") is None
    (True, True)

    The image's own code writes this text (its libcuda, its loader): size and nesting are bounded
    before it is parsed (:mod:`compat_hook.core.safejson`), and whatever it is, the answer is a
    checked dict or None, never an exception.

    >>> parse_probe('{"probe": 1, "maps": ' + "[" * 50000 + "]" * 50000 + "}") is None
    True
    """
    from ...core import safejson

    if not isinstance(text, str) or len(text) > 4 * MAX_MESSAGE:
        return None
    start = text.find("{")
    doc, _ = safejson.parse_object(text[start:], max_bytes=4 * MAX_MESSAGE, max_depth=8) if start >= 0 else (None, None)
    if not isinstance(doc, dict) or doc.get("probe") != 1:
        return None
    out = {}
    for k in ("libcuda", "loaded_as", "glibc", "error"):
        v = doc.get(k)
        if v is not None and not isinstance(v, str):
            return None
        out[k] = v[:1024] if isinstance(v, str) else None
    for k in ("driver_api", "driver_api_rc", "cuinit"):
        v = doc.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            return None
        out[k] = v
    out["gpu"] = doc.get("gpu") is True
    maps = doc.get("maps")
    out["maps"] = [m[:1024] for m in maps[:8] if isinstance(m, str)] if isinstance(maps, list) else []
    return out


def _api_version(v: int) -> tuple:
    return (v // 1000, (v % 1000) // 10)


def _cuda_tuple(text):
    try:
        parts = [int(x) for x in str(text).split(".")[:2]]
    except ValueError:
        return None
    return tuple(parts + [0] * (2 - len(parts))) if parts else None


#: What the usual cuInit results mean, for the Event.
CU_ERRORS = {35: "CUDA_ERROR_INSUFFICIENT_DRIVER", 100: "CUDA_ERROR_NO_DEVICE", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
             803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
             999: "CUDA_ERROR_UNKNOWN"}


def judge(expect: dict, probe: dict | None, *, unjudged_ok: bool = False) -> dict:
    """``{"ok", "code", "message"}``: does what the probe saw match compat-hook's decision (``expect``,
    :func:`expectation`) and cover the image's CUDA need? Without a decision (``loads`` None: the image
    could not be read) it fails (``no_expectation``), unless ``unjudged_ok`` (the config's
    ``cluster.validation_allow_unverified``): then only the probe's own checks count.

    >>> e = {"loads": "compat", "compat_version": "550.163.01", "compat_dir": "/usr/local/cuda/compat", "needs": "12.4"}
    >>> judge(e, {"libcuda": "/usr/local/cuda-12.4/compat/libcuda.so.550.163.01", "driver_api": 12040, "maps": []})["ok"]
    True
    >>> r = judge(dict(e, loads="host"), {"libcuda": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "driver_api": 11040,
    ...                                   "maps": []})
    >>> r["ok"], r["code"]
    (False, 'insufficient_driver')
    >>> judge(dict(e, needs="12.6"), {"libcuda": "/c/libcuda.so.550.163.01", "driver_api": 12040, "maps": []})["code"]
    'minor_version_compatibility'
    >>> unknown = {"loads": None, "problem": "store unreachable"}
    >>> judge(unknown, {"libcuda": "/c/libcuda.so.1", "driver_api": 11040, "maps": []})["code"]
    'no_expectation'
    >>> judge(unknown, {"libcuda": "/c/libcuda.so.1", "driver_api": 11040, "maps": []}, unjudged_ok=True)["ok"]
    True
    """
    if expect.get("loads") is None and not unjudged_ok:
        # No decision to compare with (the image could not be read): nothing is proven, so nothing passes.
        return {"ok": False, "code": "no_expectation",
                "message": "compat-hook's decision for the image could not be formed"
                           + (f": {expect['problem']}" if expect.get("problem") else "")}
    if probe is None:
        return {"ok": False, "code": "no_probe_result", "message": "the probe gave no result"}
    if probe.get("error") or not probe.get("libcuda"):
        return {"ok": False, "code": "no_libcuda", "message": f"libcuda.so.1 did not load: {probe.get('error')}"}
    lib = probe["libcuda"]
    base = lib.rsplit("/", 1)[-1]
    if len(set(probe.get("maps") or [])) > 1:
        return {"ok": False, "code": "two_libcuda", "message": "two libcuda files mapped: " + ", ".join(probe["maps"])}
    compat_file = f"libcuda.so.{expect['compat_version']}" if expect.get("compat_version") else None
    loads = expect.get("loads")
    if loads in ("compat", "store") and compat_file and base != compat_file:
        where = f"{expect.get('compat_dir') or 'the compat dir'}/{compat_file}"
        return {"ok": False, "code": "wrong_libcuda",
                "message": f"loaded {lib}; compat-hook's decision names the compat driver {where}"}
    if loads == "host" and compat_file and base == compat_file:
        return {"ok": False, "code": "wrong_libcuda",
                "message": f"loaded the image's compat driver {lib}; compat-hook's decision is the host driver's"}
    v = probe.get("driver_api")
    if not isinstance(v, int) or probe.get("driver_api_rc") not in (0, None):
        return {"ok": False, "code": "driver_api_failed",
                "message": f"cuDriverGetVersion failed ({probe.get('driver_api_rc')}) in {lib}"}
    api = _api_version(v)
    needs = _cuda_tuple(expect.get("needs")) if expect.get("needs") else None
    code, message = "ok", f"loads {lib}, driver API {api[0]}.{api[1]}"
    if needs is not None and api < needs:
        if api[0] != needs[0]:
            return {"ok": False, "code": "insufficient_driver",
                    "message": f"loads {lib}: driver API {api[0]}.{api[1]} < CUDA {needs[0]}.{needs[1]} the image "
                               f"needs (CUDA error 35)"}
        code = "minor_version_compatibility"
        message += f" < {needs[0]}.{needs[1]}: minor-version compatibility (PTX newer than the driver: error 222)"
    rc = probe.get("cuinit")
    if probe.get("gpu") and isinstance(rc, int) and rc != 0:
        return {"ok": False, "code": "cuinit_failed",
                "message": f"loads {lib}: cuInit returned {rc} ({CU_ERRORS.get(rc, 'CUDA error')})"}
    return {"ok": True, "code": code, "message": message}


def judge_probe(opts: ValidatorOptions, expect: dict, probe: dict | None) -> dict:
    """:func:`judge` as the validator runs it: a probe that loaded no libcuda also says how its pod asked
    for a GPU (:func:`no_gpu_hint`): on a node whose GPUs come only from DRA claims, a probe pod of the
    default way gets none, and the node fails closed saying what to set.

    >>> e = {"loads": "host", "compat_version": None, "compat_dir": None, "needs": "12.4"}
    >>> r = judge_probe(ValidatorOptions("gpu-a"), e, {"libcuda": None, "error": "libcuda.so.1: not found"})
    >>> r["ok"], r["code"], "validator.deviceClass" in r["message"]
    (False, 'no_libcuda', True)
    """
    verdict = judge(expect, probe, unjudged_ok=opts.allow_unverified)
    if verdict["code"] == "no_libcuda":
        verdict["message"] += no_gpu_hint(opts)
    return verdict


def no_gpu_hint(opts: ValidatorOptions) -> str:
    """What a probe that loaded no libcuda adds to its message: how its pod asked for a GPU, and what
    else there is where that way reaches none (a node whose GPUs come only from a device plugin or
    from DRA claims).

    >>> no_gpu_hint(ValidatorOptions("gpu-a"))[:72]
    ' (the probe pod asked for a GPU in its env, NVIDIA_VISIBLE_DEVICES=all; '
    >>> "validator.deviceClass" in no_gpu_hint(ValidatorOptions("gpu-a"))
    True
    >>> no_gpu_hint(ValidatorOptions("gpu-a", gpu_resource="nvidia.com/gpu"))
    ' (the probe pod requested one nvidia.com/gpu)'
    >>> no_gpu_hint(ValidatorOptions("gpu-a", claim_template="compat-hook-probe-gpu"))
    ' (the probe pod had a claim of the ResourceClaimTemplate compat-hook-probe-gpu)'
    """
    if opts.claim_template:
        return f" (the probe pod had a claim of the ResourceClaimTemplate {opts.claim_template})"
    if opts.gpu_resource:
        return f" (the probe pod requested one {opts.gpu_resource})"
    return (" (the probe pod asked for a GPU in its env, NVIDIA_VISIBLE_DEVICES=all; where the runtime ignores "
            "that, set validator.gpuResource for a device plugin's GPUs, or validator.deviceClass where GPUs "
            "come only from DRA claims)")


def event_message(driver: str, rows: list, problem: str | None = None) -> str:
    """The Event's text: the failing images with their pods and why (bounded); ``problem``: why the
    validation as a whole failed (an error in the validator itself, :func:`failed`).

    >>> event_message("470.256.02", [], "validator_error: TypeError: x")
    'driver 470.256.02: validation failed: validator_error: TypeError: x'

    >>> event_message("470.256.02", [{"image": "a:1", "pods": ["ml/x"], "ok": False, "message": "loads y: no"},
    ...                              {"image": "b:1", "pods": [], "ok": True, "message": ""}])
    'driver 470.256.02: 1 of 2 workload image(s) failed validation: a:1 (pods ml/x): loads y: no'
    """
    if problem:
        return f"driver {driver}: validation failed: {problem}"[:MAX_EVENT]
    bad = [r for r in rows if not r["ok"]]
    unverified = [r for r in rows if r.get("unverified")]
    if not bad:
        msg = f"driver {driver}: {len(rows)} workload image(s) validated"
        if unverified:
            msg += f"; not verified (not on the node): {', '.join(r['image'] for r in unverified)}"
        return msg[:MAX_EVENT]
    parts = [f"{r['image']} (pods {', '.join(r['pods'][:3]) or '-'}): {r['message']}" for r in bad]
    msg = f"driver {driver}: {len(bad)} of {len(rows)} workload image(s) failed validation: " + "; ".join(parts)
    return msg if len(msg) <= MAX_EVENT else msg[:MAX_EVENT - 3] + "..."


# --------------------------------------------------------------------------- node side


def driver_file(cfg) -> str:
    """Where the loaded kernel driver's version is read (``host_root`` + ``/proc/driver/nvidia/version``)."""
    return os.path.join(cfg.host_root, "proc/driver/nvidia/version")


def read_driver(cfg) -> tuple:
    """``(version, first line)`` of ``/proc/driver/nvidia/version`` under ``host_root``; ``(None, None)``
    while no kernel module is loaded."""
    from ...facts.hostfacts import parse_proc_version

    try:
        with open(driver_file(cfg), "rb") as f:
            text = f.read(65536).decode("utf-8", "replace")
    except OSError:
        return None, None
    version = parse_proc_version(text)
    return (version, text.splitlines()[0]) if version else (None, None)


def expectation(cfg, opts: ValidatorOptions, workload: dict, host, reader=None, path: str | None = None) -> dict:
    """What compat-hook's decision says ``workload`` loads on this node, from the image in the node's
    store (the assessment the hook runs and ``plan`` reports):
    ``{"loads", "compat_version", "compat_dir", "needs", "outcome", "error", "problem"}``; ``reader``:
    the image reader (:func:`validate`'s own). On ``path`` ``none`` (nothing of compat-hook's reaches
    the workload) what the NVIDIA toolkit alone gives (the model ``plan`` uses for such a pod)."""
    from ...images.sources import open_source
    from ...policy.assess import assess
    from ...policy.outcome import gpu_request, image_needs, result, rules_verdict

    src = workload.get("source") or f"containerd:{workload['image']}"
    out = {"loads": None, "compat_version": None, "compat_dir": None, "needs": None, "outcome": None,
           "error": None, "problem": None}
    try:
        with open_source(src, cfg, address=opts.address, namespace=opts.namespace, reader=reader) as img:
            env = _overlay(img.env, workload.get("env") or [])
            need = image_needs(img.root, env)
            request = gpu_request(env)
            a = assess(cfg, request, img.root, spec={"process": {"env": env}, "root": {"path": "rootfs"}},
                       host=host, actors=("hook", "wrapper"), toolkit=True)
    except Exception as e:  # an image the store cannot give: the probe still runs, the check is looser
        out["problem"] = describe(e)[1]
        return out
    if path == "none":
        # plan's toolkit_only: the rules' verdict on the image's own compat driver; no store package (only
        # compat-hook mounts one)
        loads = a.toolkit["alone"]["result"] if a.toolkit else "host"
        r = result(a, host, need["version"], loads, rules_verdict(a, request, cfg))
    else:
        loads = a.toolkit["with_wrapper"]["result"] if a.toolkit else "host"
        if a.effect == "compat":
            loads = "compat"
        r = result(a, host, need["version"], loads)
    d = a.decision if a.decision is not None and a.decision.compat_version else a.image_decision
    out.update(loads="store" if r["outcome"] == "store" and path != "none" else loads, needs=_text(need["version"]),
               outcome=r["outcome"], error=r["error"],
               compat_version=getattr(d, "compat_version", None), compat_dir=getattr(d, "compat_dir", None))
    return out


def _text(v):
    return ".".join(str(x) for x in v[:2]) if v else None


def _overlay(image_env: list, env: list) -> list:
    """The container's env: the image's, with the pod spec's laid over it."""
    out = {}
    for e in list(image_env or []) + list(env):
        if isinstance(e, str) and "=" in e:
            k, _, v = e.partition("=")
            out[k] = v
    return [f"{k}={v}" for k, v in out.items()]


def _pod_state(pod: dict) -> tuple:
    """``(phase, waiting reason, the probe's message)`` of a probe pod."""
    st = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    phase = st.get("phase") if isinstance(st.get("phase"), str) else None
    waiting, message = None, None
    statuses = [c for key in ("initContainerStatuses", "containerStatuses")
                for c in (st.get(key) if isinstance(st.get(key), list) else []) if isinstance(c, dict)]
    for c in statuses:
        state = c.get("state") if isinstance(c.get("state"), dict) else {}
        w = state.get("waiting")
        if isinstance(w, dict) and w.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
            waiting = f"{c.get('name')}: {w.get('reason')}: {str(w.get('message') or '')[:200]}".rstrip(": ")
        t = state.get("terminated")
        if c.get("name") == "probe" and isinstance(t, dict):
            message = t.get("message")
        elif isinstance(t, dict) and t.get("exitCode") not in (0, None):
            waiting = f"{c.get('name')}: exit {t.get('exitCode')}: {str(t.get('message') or t.get('reason'))[:200]}"
    if waiting is None and not statuses:
        # a pod the scheduler places (--claim-template) and cannot yet: say why (no free device, a taint)
        for cond in st.get("conditions") if isinstance(st.get("conditions"), list) else []:
            if (isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                    and cond.get("reason")):
                waiting = f"not scheduled: {cond.get('reason')}: {str(cond.get('message') or '')[:200]}".rstrip(": ")
    return phase, waiting, message


def run_probe(kube, opts: ValidatorOptions, workload: dict, deadline: float, path: str | None = None) -> dict:
    """One probe pod, created, waited for and deleted: ``{"probe", "error", "unverified", "seconds"}``."""
    from ..api.kube import Conflict

    t0 = time.monotonic()
    pod = probe_pod(opts, workload, path)
    name = pod["metadata"]["name"]
    base = f"/api/v1/namespaces/{opts.publish_namespace}/pods"
    out = {"probe": None, "error": None, "unverified": False, "pod": name}
    # the kubelet ends the pod at activeDeadlineSeconds; a little more for it to say so
    end = min(deadline, t0 + opts.probe_timeout + min(30, opts.probe_timeout))
    try:
        while True:
            try:
                kube.create(base, pod)
                break
            except Conflict:  # left by an earlier run and still going away
                _delete(kube, f"{base}/{name}")
                if time.monotonic() > end or STOP.is_set():
                    raise
                STOP.wait(1)
        while True:
            got = kube.get(f"{base}/{name}")
            phase, waiting, message = _pod_state(got)
            if phase in ("Succeeded", "Failed"):
                out["probe"] = parse_probe(message)
                if out["probe"] is None:
                    reason = (got.get("status") or {}).get("reason") or phase
                    out["error"] = f"the probe gave no result ({reason}{': ' + waiting if waiting else ''})"
                break
            if waiting and any(r in waiting for r in _NOT_ON_NODE):
                out.update(unverified=True, error="the image is not on the node (the probe never pulls)")
                break
            if waiting and any(r in waiting for r in _HOPELESS):
                out["error"] = waiting
                break
            if time.monotonic() > end:
                out["error"] = (f"the probe pod did not finish in {opts.probe_timeout} s"
                                + (f" ({waiting})" if waiting else ""))
                break
            if STOP.wait(1):
                out["error"] = "stopped"
                break
    finally:
        _delete(kube, f"{base}/{name}")
        out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def _delete(kube, path: str) -> None:
    try:
        kube.request("DELETE", path, query={"gracePeriodSeconds": "0"})
    except NotFound:
        pass


def validate(kube, cfg, opts: ValidatorOptions, driver: str, prefix: str = "compat-hook.io") -> dict:
    """Probe every workload to prove on ``driver``; the result (also kept as the state)."""
    from concurrent.futures import ThreadPoolExecutor

    from ...facts import hostfacts

    t0 = time.monotonic()
    deadline = t0 + opts.deadline
    doc = wl.load(opts.workloads_dir)
    if doc is None:
        return {"driver": driver, "result": "waiting", "time": logjson.timestamp(), "images": [],
                "problem": f"no workload record yet in {opts.workloads_dir} (the agent writes it on its first pass)"}
    items = wl.for_driver(doc, driver, max_age=wl.max_age_of(cfg))  # a workload long gone is not proven
    host = hostfacts.gather(cfg)
    node = paths(kube, cfg, opts, prefix)
    # A reader of this validation's own, closed with it: the process's would keep what it spooled
    # (up to its 4 GiB bound in all) for as long as the validator runs.
    from ...images.reader import Reader

    reader = Reader()

    def one(w: dict) -> dict:
        try:
            return judged(w)
        except KubeError as e:
            if isinstance(e, Unreachable) or e.status in (0, 401):
                raise  # no answer, or no identity: nothing can be published; run's backoff tries again
            # the API server refused this workload's probe pod (an admission policy, an invalid spec): not
            # proven, so it fails, rather than a validation retried for ever while the node is uncordoned
            return {"image": str(w.get("image"))[:512], "pods": list(w.get("pods") or [])[:5], "env": [],
                    "runtime_class": None, "ok": False, "code": "probe_refused",
                    "message": f"the probe pod was refused: {describe(e)[1][:300]}"}
        except Exception as e:  # fails closed: what cannot be judged does not pass, and the others go on
            image = w.get("image") if isinstance(w, dict) else None
            return {"image": str(image)[:512], "pods": [], "env": [], "runtime_class": None, "ok": False,
                    "code": "validator_error",
                    "message": f"the validator could not judge it: {type(e).__name__}: {str(e)[:200]}"}

    def judged(w: dict) -> dict:
        path = node.path_of(w["runtime_class"]) if node is not None else None
        row = {"image": w["image"], "pods": w["pods"][:5], "env": w["env"], "runtime_class": w["runtime_class"],
               "path": path}
        if time.monotonic() > deadline or STOP.is_set():
            return dict(row, ok=False, code="not_probed", message=f"not probed within {opts.deadline} s")
        exp = expectation(cfg, opts, w, host, reader, path)
        if exp["loads"] is None and not opts.allow_unverified:
            # nothing to compare a probe with: fail closed (cluster.validation_allow_unverified lets it pass)
            return dict(row, expected=None, needs=None, **judge(exp, None))
        got = run_probe(kube, opts, w, deadline, path)
        row.update(expected=exp["loads"], needs=exp["needs"], seconds=got["seconds"])
        if got["unverified"]:
            # the image is not on the node (the kubelet's image GC during the drain): not proven
            return dict(row, ok=opts.allow_unverified, unverified=True, code="not_on_node",
                        message=got["error"] + ("" if opts.allow_unverified else
                                                " (cluster.validation_allow_unverified is off: a workload "
                                                "not proven fails)"))
        if got["error"]:
            return dict(row, ok=False, code="probe_failed", message=got["error"])
        verdict = judge_probe(opts, exp, got["probe"])
        p = got["probe"]
        return dict(row, libcuda=p.get("libcuda"), driver_api=p.get("driver_api"), cuinit=p.get("cuinit"),
                    glibc=p.get("glibc"), **verdict)

    try:
        with ThreadPoolExecutor(max_workers=max(1, opts.parallel)) as pool:
            rows = list(pool.map(one, items))
    finally:
        reader.close()
    ok = all(r["ok"] for r in rows)
    return {"driver": driver, "result": "pass" if ok else "fail", "time": logjson.timestamp(), "images": rows,
            "probes": sum(1 for r in rows if "seconds" in r), "seconds": round(time.monotonic() - t0, 2)}


# --------------------------------------------------------------------------- publishing and the loop


def _load_state(opts: ValidatorOptions) -> dict:
    """The last result (:data:`STATE_FILE`), its fields checked: ``{}`` when it cannot be read."""
    from ...core import safejson

    try:
        with open(os.path.join(opts.state_dir, STATE_FILE), "rb") as f:
            raw = f.read((1 << 20) + 1)
    except OSError:
        return {}
    doc, _ = safejson.parse_object(raw, max_bytes=1 << 20)
    if doc is None or not isinstance(doc.get("driver"), str) or doc.get("result") not in ("pass", "fail"):
        return {}
    epoch = doc.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)):
        doc["epoch"] = 0
    if not isinstance(doc.get("images"), list):
        doc["images"] = []
    return doc


def failed(driver: str, error: BaseException, t0: float | None = None) -> dict:
    """The result of a validation the validator itself could not finish (an error no check foresaw):
    ``fail``, as it proves nothing (the node keeps its taint; the interlock never fails open).

    >>> r = failed("570.1", TypeError("x")); r["result"], r["code"], r["problem"]
    ('fail', 'validator_error', 'validator_error: TypeError: x')
    """
    return {"driver": driver, "result": "fail", "time": logjson.timestamp(), "images": [], "probes": 0,
            "code": "validator_error", "problem": f"validator_error: {type(error).__name__}: {str(error)[:300]}",
            "seconds": round(time.monotonic() - t0, 2) if t0 is not None else 0.0}


def _save_state(opts: ValidatorOptions, state: dict) -> None:
    from ...core import atomic

    try:
        os.makedirs(opts.state_dir, exist_ok=True)
        atomic.replace(os.path.join(opts.state_dir, STATE_FILE),
                       (json.dumps(state, separators=(",", ":")) + "\n").encode(), 0o644)
    except OSError as e:
        _log({"event": "validation_state_error", "message": describe(e)[1]})


def _set_ready(opts: ValidatorOptions, line: str | None) -> None:
    """The ready file holds the driver line a pass was for; the readiness probe compares it."""
    if not opts.ready_file:
        return
    try:
        if line is None:
            os.unlink(opts.ready_file)
        else:
            from ...core import atomic

            atomic.replace(opts.ready_file, (line + "\n").encode(), 0o644)
    except FileNotFoundError:
        pass
    except OSError as e:
        _log({"event": "validation_state_error", "message": describe(e)[1]})


def taints_after(taints, prefix: str, driver: str, failed: bool, enabled: bool = True) -> list | None:
    """The Node's taints with compat-hook's :data:`TAINT` set (``failed``, ``enabled``) or removed;
    None when they already are so. Everyone else's taints are kept as they are, in their order.

    >>> other = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    >>> taints_after([other], "p.io", "470.256.02", True)
    [{'key': 'nvidia.com/gpu', 'effect': 'NoSchedule'}, {'key': 'p.io/validation-failed', 'value': '470.256.02', 'effect': 'NoSchedule'}]
    >>> taints_after(taints_after([other], "p.io", "470.256.02", True), "p.io", "470.256.02", False)
    [{'key': 'nvidia.com/gpu', 'effect': 'NoSchedule'}]
    >>> taints_after([other], "p.io", "470.256.02", False) is None
    True
    """
    from .verdicts import label_value

    key = f"{prefix}/{TAINT}"
    old = [t for t in (taints if isinstance(taints, list) else []) if isinstance(t, dict)]
    new = [t for t in old if t.get("key") != key]
    if failed and enabled:
        new.append({"key": key, "value": label_value(driver) or "unknown", "effect": "NoSchedule"})
    return None if new == old else new


def publish(kube, opts: ValidatorOptions, prefix: str, state: dict, *, event: bool) -> None:
    """The Node's label and taint (when they differ: one patch, conditional on the Node's
    resourceVersion, as the taints are one list) and, with ``event``, the Event."""
    from ..api.kube import Conflict

    path = f"/api/v1/nodes/{opts.node}"
    value = state["driver"] if state["result"] == "pass" else "failed"
    key = f"{prefix}/{LABEL}"
    for attempt in range(4):
        node = kube.get(path)
        meta = node.get("metadata") or {}
        taints = taints_after((node.get("spec") or {}).get("taints"), prefix, state["driver"],
                              state["result"] != "pass", opts.taint)
        patch: dict = {}
        if (meta.get("labels") or {}).get(key) != value:
            patch["metadata"] = {"labels": {key: value}}
        if taints is not None:
            # taints are one atomic list: written whole, and only over the version read
            patch.setdefault("metadata", {})["resourceVersion"] = str(meta.get("resourceVersion") or "")
            patch["spec"] = {"taints": taints}
        if not patch:
            break
        try:
            kube.patch(path, patch, merge="json")
            break
        except Conflict:
            if attempt == 3:
                raise
    if event:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kube.create(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", {
            "metadata": {"generateName": f"{opts.node}.compat-hook-validation."},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": opts.node, "uid": meta.get("uid")},
            "reason": EVENT_REASON, "type": "Normal" if state["result"] == "pass" else "Warning",
            "message": event_message(state["driver"], state.get("images") or [],
                                     state.get("problem") if state["result"] == "fail" else None),
            "source": {"component": "compat-hook-validator", "host": opts.node},
            "reportingComponent": "compat-hook-validator", "reportingInstance": opts.node[:128],
            "firstTimestamp": now, "lastTimestamp": now, "count": 1})


def _max_rss_kib() -> int | None:
    from .agent import _max_rss_kib as rss

    return rss()


def _log(rec: dict) -> None:
    line = dict(time=logjson.timestamp())
    line.update(rec)
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _cleanup(kube, opts: ValidatorOptions, state: dict) -> None:
    """Delete the probe pods an earlier run may have left (their names are the same for the same workloads)."""
    base = f"/api/v1/namespaces/{opts.publish_namespace}/pods"
    for row in state.get("images") or []:
        if isinstance(row, dict) and isinstance(row.get("image"), str):
            w = {"image": row["image"], "runtime_class": row.get("runtime_class"), "env": row.get("env") or []}
            _delete(kube, f"{base}/{probe_name(opts.node, w)}")


def run(kube_factory, cfg, opts: ValidatorOptions, prefix: str) -> int:
    """The loop (module docstring); with ``once`` one validation of the current driver:
    exit 0 pass, 3 failed, 1 an API error or no driver."""
    import signal

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    from ..api.backoff import Backoff

    state = _load_state(opts)
    kube = None
    backoff = Backoff(base=1.0, cap=60.0)
    published = False  # the state's label and taint are on the Node (else the next round says them)
    retry_now = True  # a failure recorded before this process started is tried again at once
    while not STOP.is_set():
        driver = None
        try:
            if kube is None:
                kube = kube_factory()
                _cleanup(kube, opts, state)
            driver, line = read_driver(cfg)
            if driver is None:
                _set_ready(opts, None)
                if opts.once:
                    _log({"event": "validation", "node": opts.node, "result": "no_driver",
                          "file": driver_file(cfg),
                          "message": f"no NVIDIA kernel driver: {driver_file(cfg)} is missing or names no version"})
                    return EXIT_ERROR
            elif state.get("driver") == driver and state.get("result") == "pass" and not opts.once:
                _set_ready(opts, line)
                if not published:
                    publish(kube, opts, prefix, state, event=False)
                    published = True
            elif (state.get("driver") == driver and state.get("result") == "fail" and not opts.once
                  and not retry_now and time.time() - state.get("epoch", 0) < opts.retry):
                _set_ready(opts, None)
                if not published:  # a failure whose label or taint could not be written yet
                    publish(kube, opts, prefix, state, event=False)
                    published = True
            else:
                _set_ready(opts, None)
                t0 = time.monotonic()
                try:
                    result = validate(kube, cfg, opts, driver, prefix)
                except KubeError:
                    raise
                except Exception as e:  # the validator's own error proves nothing: fail, never pass
                    result = failed(driver, e, t0)
                if STOP.is_set():  # interrupted: its probe pods are gone, its verdict is not one
                    break
                result["epoch"] = time.time()
                retry_now = False
                _log(dict({"event": "validation", "node": opts.node}, **{k: v for k, v in result.items()
                                                                         if k != "images"},
                          images=[{k: r.get(k) for k in ("image", "ok", "code", "message", "seconds")}
                                  for r in result["images"]], max_rss_kib=_max_rss_kib()))
                if result["result"] == "waiting":
                    if opts.once:
                        return EXIT_ERROR
                else:
                    changed = (state.get("driver"), state.get("result")) != (result["driver"], result["result"])
                    state = result
                    _save_state(opts, state)
                    published = False
                    publish(kube, opts, prefix, state, event=changed or state["result"] == "fail")
                    published = True
                    if state["result"] == "pass":
                        _set_ready(opts, line)
                    if opts.once:
                        return EXIT_OK if state["result"] == "pass" else EXIT_FAILED
            backoff.reset()
        except KubeError as e:
            code, msg = describe(e)
            wait = backoff.next(getattr(e, "retry_after", None))
            _log({"event": "validation_error", "node": opts.node, "reason": code, "message": msg,
                  "retry_in": None if opts.once else round(wait, 3)})
            if opts.once:
                return EXIT_ERROR
            STOP.wait(wait)
            continue
        except Exception as e:  # anything else: one line, not Ready, back off, and the loop goes on
            wait = backoff.next()
            _log({"event": "validation_error", "node": opts.node, "reason": "internal_error",
                  "message": f"{type(e).__name__}: {str(e)[:300]}", "driver": driver,
                  "retry_in": None if opts.once else round(wait, 3)})
            try:
                _set_ready(opts, None)
            except Exception:  # noqa: S110 - the line above said what went wrong
                pass
            if opts.once:
                return EXIT_ERROR
            STOP.wait(wait)
            continue
        STOP.wait(opts.interval)
    _log({"event": "validation_stopped", "node": opts.node})
    return EXIT_OK


# --------------------------------------------------------------------------- the command line


def _parser():
    from ...core.argparser import Parser

    p = Parser(prog="compat-hook cluster validate",
               description="After a driver change, run each GPU workload image seen on this node as a probe pod "
                           "and publish <prefix>/validated on the Node (docs/validation.md).")
    p.add_argument("--node", required=True, metavar="NAME", help="this node's name (the downward API's spec.nodeName)")
    p.add_argument("--once", action="store_true", help="validate the current driver once: exit 0 pass, 3 failed, 1 error")
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="default: the pod's service account, else $KUBECONFIG (merged as kubectl does)")
    p.add_argument("--context", metavar="NAME", help="the kubeconfig context to use (default: its current-context)")
    p.add_argument("--config", metavar="FILE", help="compat-hook's config (host_root, cluster.label_prefix)")
    p.add_argument("--host-root", metavar="DIR", help="read the node's files under DIR (default: the config's)")
    p.add_argument("--workloads-dir", metavar="DIR", default="/var/lib/compat-hook",
                   help="where the agent records the node's workloads (its --state-dir)")
    p.add_argument("--state-dir", metavar="DIR", default="/var/lib/compat-hook-validator", help="the last result")
    p.add_argument("--probe-image", metavar="REF", required=True, help="compat-hook's image (holds compat-hook-probe)")
    p.add_argument("--runtime-class", metavar="NAME", default="cuda-compat", help="compat-hook's RuntimeClass: the probes of workloads compat-hook reaches run on it (those it does not, on their own)")
    p.add_argument("--publish-namespace", metavar="NS",
                   help="namespace of the probe pods (default: the service account's, else compat-hook)")
    p.add_argument("--address", metavar="SOCKET", help="containerd's socket (to read the images)")
    p.add_argument("--namespace", metavar="NS", default="k8s.io", help="containerd namespace (default k8s.io)")
    p.add_argument("--probe-timeout", type=int, default=90, metavar="SECONDS", help="per probe pod (default 90)")
    p.add_argument("--deadline", type=int, default=420, metavar="SECONDS",
                   help="for one validation (default 420, inside the upgrade controller's 600)")
    p.add_argument("--parallel", type=int, default=4, metavar="N", help="probe pods at a time (default 4)")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS", help="driver checks (default 5)")
    p.add_argument("--retry", type=float, default=300.0, metavar="SECONDS", help="after a failure (default 300)")
    p.add_argument("--ready-file", metavar="PATH", help="written on a pass (the pod's readiness probe reads it)")
    p.add_argument("--gpu-resource", metavar="NAME",
                   help="probe pods request one of this resource (e.g. nvidia.com/gpu) instead of asking the "
                        "runtime for a GPU in their env")
    p.add_argument("--claim-template", metavar="NAME",
                   help="probe pods get their GPU from a ResourceClaim of this ResourceClaimTemplate (in their "
                        "namespace), pinned to the node by node affinity so that the scheduler allocates it")
    return p


def main(argv: list, *, load_config, node_name_ok) -> int:
    """``compat-hook cluster validate ARGS``; ``load_config(path, host_root)`` and ``node_name_ok(name)``
    are the cluster command line's own (compat_hook/cluster/cli.py), so both commands check alike."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    try:
        return _main(args, load_config, node_name_ok)
    except CompatHookError as e:
        sys.stderr.write(f"compat-hook cluster validate: {e}\n")
        return EXIT_USAGE if e.code == "usage" else EXIT_ERROR


def _main(args, load_config, node_name_ok) -> int:
    from ..api import kube
    from .agent import settings

    if not node_name_ok(args.node):
        raise UsageError(f"--node: not a node name (a DNS subdomain), got {args.node[:80]!r}")
    for flag, v, low in (("--probe-timeout", args.probe_timeout, 10), ("--deadline", args.deadline, 10),
                         ("--parallel", args.parallel, 1), ("--interval", args.interval, 1),
                         ("--retry", args.retry, 1)):
        if v < low:
            raise UsageError(f"{flag}: at least {low}")
    if args.gpu_resource and args.claim_template:
        raise UsageError("--gpu-resource and --claim-template: a probe pod gets its GPU one way, give one of them")
    if args.claim_template and not node_name_ok(args.claim_template):
        raise UsageError(f"--claim-template: not an object name (a DNS subdomain), got {args.claim_template[:80]!r}")
    cfg = load_config(args.config, args.host_root)
    ns = args.publish_namespace
    if ns is None:
        try:
            with open(SA_NAMESPACE) as f:
                ns = f.read(256).strip() or None
        except OSError:
            ns = None
    opts = ValidatorOptions(args.node, publish_namespace=ns or "compat-hook", workloads_dir=args.workloads_dir,
                            state_dir=args.state_dir, probe_image=args.probe_image, runtime_class=args.runtime_class,
                            probe_timeout=args.probe_timeout, deadline=args.deadline, parallel=args.parallel,
                            interval=args.interval, retry=args.retry, ready_file=args.ready_file,
                            address=args.address, namespace=args.namespace, once=args.once,
                            gpu_resource=args.gpu_resource or None, claim_template=args.claim_template or None,
                            allow_unverified=bool(settings(cfg)["validation_allow_unverified"]),
                            taint=bool(settings(cfg)["validation_taint"]),
                            taint_key=f"{settings(cfg)['label_prefix']}/{TAINT}")
    return run(lambda: kube.connect(args.kubeconfig, args.context), cfg, opts, settings(cfg)["label_prefix"])
