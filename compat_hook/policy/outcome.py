"""What a container gets on a given host driver: the outcome and CUDA-error model of ``plan``.

:func:`assess_image` runs :func:`compat_hook.policy.assess.assess` - the code
the hook and the wrapper run at container start - and :func:`result` turns
what the container would load into an outcome, following CUDA's
compatibility rules:

* ``host``: the host driver serves it and is new enough;
* ``host-minor``: the host driver serves it, same CUDA major, older minor
  (minor-version compatibility: it runs; PTX newer than the driver fails
  with CUDA error 222);
* ``compat`` / ``store``: the image's compat driver (or a host-store package)
  serves it and is new enough;
* ``compat-minor`` / ``store-minor``: the compat driver serves it, same CUDA
  major as what the image needs, older minor (minor-version compatibility
  again: it runs, with the 222 caveat);
* ``broken``: only a major-version gap (error 35: the driver API is too old),
  a compat driver that is wrong on this host or GPU loaded anyway (803 /
  804), or a GPU the driver branch does not drive (100, reason
  ``gpu_unsupported_by_driver``, :mod:`compat_hook.facts.gpusupport`: no
  container sees that GPU, whatever the image carries).

Every outcome is ``{"outcome", "reason", "cuda", "error"}``; an unsupported
GPU adds ``unsupported_gpus`` (which ones, and the branches that drive them).
:func:`parse_target` reads the target driver from a GPU Operator
ClusterPolicy (``spec.driver.version``) or NVIDIADriver (``spec.version``)
manifest.

>>> from compat_hook.facts.hostfacts import HostFacts
>>> host_outcome(HostFacts(driver_version=(535, 261, 3)), (12, 4, 0))
{'outcome': 'host-minor', 'cuda': '12.2', 'error': 222}
>>> host_outcome(HostFacts(driver_version=(535, 261, 3)), (13, 0, 0))['error']
35
>>> minor("compat", (12, 4, 0), (12, 8, 0)), minor("store", (12, 4, 0), (13, 0, 0)), minor("compat", (12, 9, 0), None)
(('compat-minor', 222), ('broken', 35), ('compat', None))
"""

from __future__ import annotations

from ..core.errors import ImageError, UsageError

__all__ = ["host_outcome", "result", "assess_image", "image_needs", "gpu_request", "check_driver",
           "parse_target", "cuda_text", "minor", "unsupported_gpus", "OUTCOMES", "OUTCOME_REASONS",
           "LdConfIncomplete"]

#: Every outcome; all but ``broken`` are working ones (the ``-minor`` ones with the 222 caveat).
OUTCOMES = ("host", "host-minor", "compat", "compat-minor", "store", "store-minor", "broken")

#: Reason codes of outcomes that are not a decision's (the decision's are
#: :data:`compat_hook.policy.decision.REASONS`), with their one-line explanation.
OUTCOME_REASONS = {
    "gpu_unsupported_by_driver": ("the driver branch does not drive a GPU the container uses (its architecture "
                                  "is outside the branches that support it): CUDA error 100, no device"),
}

class LdConfIncomplete(ImageError):
    """The image's ``/etc/ld.so.conf`` tree was not read to the end (a bound, the deadline): ``plan``
    gives that image no outcome, its row says why (``code``: :data:`compat_hook.facts.loader.INCOMPLETE`).

    >>> from compat_hook.core.errors import describe
    >>> describe(LdConfIncomplete("ld_so_conf_deadline", "not read in time"))
    ('ld_so_conf_deadline', 'not read in time')
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


#: CUDA errors a wrong compat choice ends in, by compat-hook's skip reason.
_WRONG_COMPAT_ERROR = {"device_unsupported": 804, "device_unknown": 804, "device_consumer": 804}
#: CUDA_ERROR_NO_DEVICE: the kernel module does not drive the GPU, so the container sees none.
NO_DEVICE = 100


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


def minor(kind: str, provides, needs) -> tuple:
    """``(outcome, error)`` when ``kind`` (``compat`` / ``store``) serves CUDA ``provides`` to an image needing ``needs``.

    CUDA's minor-version compatibility: an older minor of the same major runs
    (``<kind>-minor``, 222 for newer PTX); an older major does not (35).
    """
    if needs is None or provides is None or provides[:2] >= needs[:2]:
        return kind, None
    if provides[0] == needs[0]:
        return f"{kind}-minor", 222
    return "broken", 35


def _compat_cuda(d):
    """The CUDA version the compat driver of decision ``d`` provides."""
    from ..core.versions import branch_max_cuda, try_parse_version

    note = (d.details or {}).get("note")
    if isinstance(note, dict) and note.get("cuda_version"):
        v = try_parse_version(note["cuda_version"])
        if v is not None:
            return v
    v = try_parse_version(d.compat_version) if d.compat_version else None
    return branch_max_cuda(v[0]) if v else None


def result(a, host, needs, loads: str, verdict=None, unsupported=()) -> dict:
    """The outcome when the container loads ``loads`` (``compat``/``host``) under assessment ``a``.

    ``verdict``: the rules' decision on the image's compat driver where
    ``a.decision`` has none (an opted-out container: the toolkit may still
    load it); default ``a.decision``. ``unsupported``: the container's GPUs
    the host's branch does not drive (:func:`unsupported_gpus`): broken
    whatever loads.
    """
    d = a.decision
    if unsupported:
        return {"outcome": "broken", "reason": "gpu_unsupported_by_driver", "cuda": None, "error": NO_DEVICE,
                "unsupported_gpus": list(unsupported)}
    if loads == "compat":
        v = verdict if verdict is not None else d
        if v.enable:
            cuda = _compat_cuda(v)
            outcome, error = minor("store" if v.source == "store" else "compat", cuda, needs)
            return {"outcome": outcome, "reason": v.reason, "cuda": cuda_text(cuda), "error": error}
        # The image's compat driver is loaded although it is wrong here.
        return {"outcome": "broken", "reason": v.reason, "cuda": None,
                "error": _WRONG_COMPAT_ERROR.get(v.reason, 803)}
    out = host_outcome(host, needs)
    return {"outcome": out["outcome"], "reason": d.reason, "cuda": out["cuda"], "error": out["error"]}


def unsupported_gpus(host, request, gpus: list | None, listed_by: str | None = None) -> list:
    """The container's GPUs the host's driver branch does not drive, one line each (empty when none).

    ``gpus``: :class:`~compat_hook.facts.gpusupport.GpuArch` entries, the
    driver-listed GPUs (``gpu`` set) and the unlisted ones. The container's
    GPUs are those its request selects (:func:`compat_hook.policy.decision.select_gpus`);
    a request for all of them also gets the unlisted ones, which the target
    driver would list. ``listed_by``: the driver text that listed them: a GPU
    the running driver lists is one it drives, whatever the table says. No
    driver version (Tegra, unknown) judges nothing.

    >>> from compat_hook.facts.gpusupport import GpuArch
    >>> from compat_hook.facts.hostfacts import Gpu, HostFacts
    >>> h100 = GpuArch(Gpu("gpu0", "NVIDIA H100", 14, "--gpu", (9, 0)), "gpu0", None, "Hopper", "cc", True)
    >>> unsupported_gpus(HostFacts(driver_version=(470, 256, 2)), gpu_request([]), [h100])
    ['NVIDIA H100 (Hopper): driven by R520 and later, not R470']
    >>> unsupported_gpus(HostFacts(driver_version=(580, 95, 5)), gpu_request([]), [h100])
    []
    """
    from ..facts.gpusupport import branch_text, supports
    from ..facts.hostfacts import Gpu
    from .decision import select_gpus

    drv = host.driver_version
    if not gpus or drv is None or host.tegra or request is None or not request.gpu_requested:
        return []
    # An unlisted GPU has no index, UUID or minor: a request gets it only where it gets every GPU
    # (all, none named, a name that maps to none), which is what select_gpus tells by keeping it.
    stand_in = {id(g): Gpu(g.bus_id, "", None, "pci") for g in gpus if g.gpu is None}
    pool = [g.gpu if g.gpu is not None else stand_in[id(g)] for g in gpus]
    chosen, _ = select_gpus(pool, request.gpu_names())
    taken = {id(x) for x in chosen}
    uses = [g for g, x in zip(gpus, pool) if id(x) in taken]
    same_driver = listed_by is not None and listed_by == host.driver_text
    return [f"{g.name()}: driven by {branch_text(g.arch)}, not R{drv[0]}" for g in uses
            if g.arch is not None and not supports(drv[0], g.arch) and not (g.listed and same_driver)]


def gpu_request(env: list, annotations: dict | None = None):
    """The request of a GPU container with ``env`` (and a pod's ``annotations``)."""
    from ..facts.container import Request

    env = [e for e in env if isinstance(e, str)]
    # plan asks about GPU containers: the device plugin sets this at start.
    if not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in env):
        env.append("NVIDIA_VISIBLE_DEVICES=all")
    spec: dict = {"process": {"env": env}}
    if annotations:
        spec["annotations"] = {str(k): str(v) for k, v in annotations.items()}
    return Request.from_spec(spec)


def image_needs(root, env: list, annotations: dict | None = None, found: list | None = None) -> dict:
    """The CUDA version the image needs, from its files and its env (:func:`compat_hook.facts.cudaruntime.needs`).

    ``found``: the image's runtime files (:func:`compat_hook.facts.cudaruntime.sources`)
    when already read: an image read once serves all of its containers.
    """
    from ..facts import cudaruntime

    env_need, env_source = gpu_request(env, annotations).required_cuda()
    return cudaruntime.needs(cudaruntime.sources(root) if found is None else found, env_need, env_source)


def _verdict(a, request, config):
    """The rules' decision on the image's compat driver where compat-hook's own is no verdict on it.

    An opted-out container (or one compat-hook takes for no GPU request) is left
    alone, but the toolkit or its ``LD_LIBRARY_PATH`` may load the compat
    driver anyway: whether that works is what the rules say of it.
    """
    import copy

    from .decision import decide

    d = a.decision
    if d.reason not in ("opt_out", "no_gpu_request") or a.image is None or a.host is None:
        return d
    r = copy.copy(request)
    r.disabled, r.gpu_requested = False, True
    return decide(a.host, a.image, r, config)


def rules_verdict(a, request, config):
    """The verdict an outcome of the toolkit alone is judged by (:func:`_verdict`): ``plan``'s, the validator's."""
    return _verdict(a, request, config)


def assess_image(config, root, env: list, host, image_needs: dict | None = None, *,
                 annotations: dict | None = None, gpus: list | None = None, listed_by: str | None = None) -> dict:
    """``{"needs_cuda", "result", "toolkit_only"}`` for one container of an image on one host.

    What the image needs is the highest CUDA version its runtime files or its
    env name (``image_needs``, :func:`image_needs`); the hook's decision
    itself sees only the env (and the ``annotations``), as it does at container
    start. ``gpus`` / ``listed_by``: the host's GPUs with their architectures,
    for :func:`unsupported_gpus`.
    """
    from .assess import assess

    request = gpu_request(env, annotations)
    needs = image_needs["version"] if image_needs is not None else request.required_cuda()[0]
    spec: dict = {"process": {"env": list(env)}, "root": {"path": "rootfs"}}
    if annotations:
        spec["annotations"] = {str(k): str(v) for k, v in annotations.items()}
    a = assess(config, request, root, spec=spec, host=host, actors=("hook", "wrapper"), toolkit=True, full=True)
    if a.ldconf is not None and a.ldconf.incomplete:
        # ldconfig's order was not read to the end: no verdict (a gate fails closed on what it cannot judge)
        raise LdConfIncomplete(a.ldconf.incomplete, a.ldconf.why_incomplete())
    loads = a.toolkit["with_wrapper"]["result"] if a.toolkit else "host"
    alone = a.toolkit["alone"]["result"] if a.toolkit else "host"
    if a.effect == "compat":
        loads = "compat"
    verdict = _verdict(a, request, config)
    bad = unsupported_gpus(host, request, gpus, listed_by)
    out = {"needs_cuda": cuda_text(needs), "result": result(a, host, needs, loads, verdict, bad),
           "toolkit_only": result(a, host, needs, alone, verdict, bad)}
    files = image_libcuda(a)
    if files:
        out["image_libcuda"] = files
    return out


def image_libcuda(a) -> dict:
    """The libcuda files the image carries outside its compat dirs' own regular files, and what ldconfig
    links in their dirs (``{}`` where there are none): ``userland``, ``symlinked``, ``ldconfig_picks``."""
    img = a.image
    if img is None:
        return {}
    out: dict = {}
    links = {f"{c.compat_dir}/{n}": t for c in img.all() for n, t in c.link_targets.items()}
    if links:
        out["symlinked"] = links
    if img.userland:
        from ..facts.imagefacts import ldconfig_picks
        from .toolkit import default_host_dir

        out["userland"] = [u["path"] for u in img.userland]
        out["ldconfig_picks"] = ldconfig_picks(img.userland, default_host_dir({"arch": None}),
                                               a.host.driver_text if a.host is not None else None)
    return out


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
