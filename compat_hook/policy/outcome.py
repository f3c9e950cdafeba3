"""What a container gets on a given host driver: the outcome and CUDA-error model of ``plan``.

:func:`assess_image` runs :func:`compat_hook.policy.assess.assess` - the code
the hook and the wrapper run at container start - and :func:`result` turns
what the container would load into an outcome: ``compat``/``store`` (the
compat driver serves it), ``host`` (the host driver does), ``host-minor``
(CUDA error 222: the host's branch is older within the same major version),
``broken`` (error 35: too old a driver; 803/804: a compat driver that is wrong
on this host or GPU is loaded anyway). :func:`parse_target` reads the
target driver from a GPU Operator ClusterPolicy (``spec.driver.version``) or
NVIDIADriver (``spec.version``) manifest.

>>> from compat_hook.facts.hostfacts import HostFacts
>>> host_outcome(HostFacts(driver_version=(535, 261, 3)), (12, 4, 0))
{'outcome': 'host-minor', 'cuda': '12.2', 'error': 222}
>>> host_outcome(HostFacts(driver_version=(535, 261, 3)), (13, 0, 0))['error']
35
"""

from __future__ import annotations

from ..core.errors import UsageError

__all__ = ["host_outcome", "result", "assess_image", "image_needs", "gpu_request", "check_driver",
           "parse_target", "cuda_text"]

#: CUDA errors a wrong compat choice ends in, by compat-hook's skip reason.
_WRONG_COMPAT_ERROR = {"device_unsupported": 804, "device_unknown": 804}


def cuda_text(v) -> str | None:
    return f"{v[0]}.{v[1]}" if v else None


def host_outcome(host, needs) -> dict:
    """What the host driver alone gives an image needing CUDA ``needs`` (a tuple or None)."""
    from ..core.versions import branch_max_cuda

    native = branch_max_cuda(host.driver_version[0]) if host.driver_version else host.cuda_version
    if native is None:
        return {"outcome": "host", "cuda": None, "error": None}
    if needs is None or native[:2] >= needs[:2]:
        return {"outcome": "host", "cuda": cuda_text(native), "error": None}
    if native[0] == needs[0]:
        return {"outcome": "host-minor", "cuda": cuda_text(native), "error": 222}
    return {"outcome": "broken", "cuda": cuda_text(native), "error": 35}


def _compat_cuda(a):
    """The CUDA version the chosen compat driver provides."""
    from ..core.versions import branch_max_cuda, try_parse_version

    d = a.decision
    note = (d.details or {}).get("note")
    if isinstance(note, dict) and note.get("cuda_version"):
        v = try_parse_version(note["cuda_version"])
        if v is not None:
            return v
    v = try_parse_version(d.compat_version) if d.compat_version else None
    return branch_max_cuda(v[0]) if v else None


def result(a, host, needs, loads: str) -> dict:
    """The outcome when the container loads ``loads`` (``compat``/``host``) under assessment ``a``."""
    d = a.decision
    if loads == "compat":
        if a.effect == "compat":
            cuda = _compat_cuda(a)
            out = {"outcome": "store" if d.source == "store" else "compat", "reason": d.reason,
                   "cuda": cuda_text(cuda), "error": None}
            if needs is not None and cuda is not None and cuda[:2] < needs[:2]:
                out.update(outcome="broken", error=35 if cuda[0] != needs[0] else 222)
            return out
        # The image's compat driver is loaded although it is wrong here.
        return {"outcome": "broken", "reason": d.reason, "cuda": None,
                "error": _WRONG_COMPAT_ERROR.get(d.reason, 803)}
    out = host_outcome(host, needs)
    return {"outcome": out["outcome"], "reason": d.reason, "cuda": out["cuda"], "error": out["error"]}


def gpu_request(env: list):
    from ..facts.container import Request

    env = [e for e in env if isinstance(e, str)]
    # plan asks about GPU containers: the device plugin sets this at start.
    if not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in env):
        env.append("NVIDIA_VISIBLE_DEVICES=all")
    return Request.from_spec({"process": {"env": env}})


def image_needs(root, env: list) -> dict:
    """The CUDA version the image needs, from its files and its env (:func:`compat_hook.facts.cudaruntime.needs`)."""
    from ..facts import cudaruntime

    env_need, env_source = gpu_request(env).required_cuda()
    return cudaruntime.needs(cudaruntime.sources(root), env_need, env_source)


def assess_image(config, root, env: list, host, image_needs: dict | None = None) -> dict:
    """``{"needs_cuda", "result", "toolkit_only"}`` for one image on one host.

    What the image needs is the highest CUDA version its runtime files or its
    env name (``image_needs``, :func:`image_needs`); the hook's decision
    itself sees only the env, as it does at container start.
    """
    from .assess import assess

    request = gpu_request(env)
    needs = image_needs["version"] if image_needs is not None else request.required_cuda()[0]
    spec = {"process": {"env": list(env)}, "root": {"path": "rootfs"}}
    a = assess(config, request, root, spec=spec, host=host, actors=("hook", "wrapper"), toolkit=True)
    loads = a.toolkit["with_wrapper"]["result"] if a.toolkit else "host"
    alone = a.toolkit["alone"]["result"] if a.toolkit else "host"
    if a.effect == "compat":
        loads = "compat"
    return {"needs_cuda": cuda_text(needs), "result": result(a, host, needs, loads),
            "toolkit_only": result(a, host, needs, alone)}


def check_driver(text: str, where: str) -> str:
    from ..core.versions import try_parse_version

    t = (text or "").strip()
    if t.startswith("sha256:") or "@sha256:" in t:
        raise UsageError(f"{where}: {t!r} is an image digest, not a driver version: give the version (550.54.15)")
    v = try_parse_version(t)
    if v is None or t.count(".") < 1:
        raise UsageError(f"{where}: {t!r} is not a full driver version (550.54.15; a branch alone says too little)")
    return t


def parse_target(manifest: str) -> tuple:
    """``(version, where)`` from a ClusterPolicy or NVIDIADriver manifest (multi-document YAML)."""
    import yaml

    try:
        with open(manifest, "rb") as f:
            docs = [d for d in yaml.safe_load_all(f.read()) if d is not None]
    except OSError as e:
        raise UsageError(f"{manifest}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{manifest}: not valid YAML: {str(e).splitlines()[0]}") from None
    found = []
    for d in docs:
        if not isinstance(d, dict):
            continue
        kind, spec = d.get("kind"), d.get("spec") if isinstance(d.get("spec"), dict) else {}
        name = (d.get("metadata") or {}).get("name") if isinstance(d.get("metadata"), dict) else None
        if kind == "ClusterPolicy":
            drv = spec.get("driver") if isinstance(spec.get("driver"), dict) else {}
            if drv.get("version") is not None:
                found.append((str(drv["version"]), f"ClusterPolicy {name} spec.driver.version"))
        elif kind == "NVIDIADriver" and spec.get("version") is not None:
            sel = spec.get("nodeSelector")
            where = f"NVIDIADriver {name} spec.version"
            if sel:
                where += " (nodeSelector " + ",".join(f"{k}={v}" for k, v in sorted(sel.items())) + ")"
            found.append((str(spec["version"]), where))
    if not found:
        raise UsageError(f"{manifest}: no ClusterPolicy spec.driver.version or NVIDIADriver spec.version")
    if len({v for v, _ in found}) > 1:
        raise UsageError(f"{manifest}: several driver versions ({', '.join(w for _, w in found)}): "
                         "give one with --driver")
    version, where = found[0]
    return check_driver(version, f"{manifest}: {where}"), where
