"""``compat-hook plan``: each image's outcome on the host driver now and on a target driver.

The driver-upgrade preflight. For every image and each driver (now, after)
it runs :func:`compat_hook.assess.assess` - the code the hook and the wrapper
run at container start - against a host that has that driver, and turns the
result into what the container gets:

* ``host``: the host driver, new enough for what the image needs;
* ``host-minor``: an older host driver of the same CUDA major (CUDA's
  minor-version compatibility): it runs, but PTX newer than the driver
  fails with 222;
* ``compat``: the image's compat driver; ``store``: a host-store package;
* ``broken``: error 35 (insufficient driver), 803 or 804.

``toolkit_only_after`` is what the NVIDIA toolkit alone (v1.20 rules, the
image's compat drop-ins and ``LD_LIBRARY_PATH`` included) gives on the
target driver, so the operator sees what compat-hook changes.

What an image needs (``needs_cuda``, ``needs_source``, ``needs_sources``) is
the highest CUDA version its runtime files or its env name
(:mod:`compat_hook.cudaruntime`); disagreeing sources add a ``warnings``
entry. A source that cannot be read is a row with ``error`` and
``error_code`` and no outcome; :func:`gate` makes such a run exit
:data:`EXIT_UNREADABLE` (4) unless ``allow_unreadable``. ``--gpu`` names
resolve through :mod:`compat_hook.gpunames`.

>>> from compat_hook.hostfacts import HostFacts
>>> host_outcome(HostFacts(driver_version=(535, 261, 3)), (12, 4, 0))
{'outcome': 'host-minor', 'cuda': '12.2', 'error': 222}
>>> host_outcome(HostFacts(driver_version=(535, 261, 3)), (13, 0, 0))['error']
35
"""

from __future__ import annotations

import os

from .errors import UsageError

__all__ = ["plan", "host_outcome", "parse_target", "render_text", "gpus_from_names", "gate", "exit_status",
           "EXIT_GATE", "EXIT_UNREADABLE"]

#: CUDA errors a wrong compat choice ends in, by compat-hook's skip reason.
_WRONG_COMPAT_ERROR = {"device_unsupported": 804, "device_unknown": 804}


def _cuda_text(v) -> str | None:
    return f"{v[0]}.{v[1]}" if v else None


def host_outcome(host, needs) -> dict:
    """What the host driver alone gives an image needing CUDA ``needs`` (a tuple or None)."""
    from .versions import branch_max_cuda

    native = branch_max_cuda(host.driver_version[0]) if host.driver_version else host.cuda_version
    if native is None:
        return {"outcome": "host", "cuda": None, "error": None}
    if needs is None or native[:2] >= needs[:2]:
        return {"outcome": "host", "cuda": _cuda_text(native), "error": None}
    if native[0] == needs[0]:
        return {"outcome": "host-minor", "cuda": _cuda_text(native), "error": 222}
    return {"outcome": "broken", "cuda": _cuda_text(native), "error": 35}


def _compat_cuda(a):
    """The CUDA version the chosen compat driver provides."""
    from .versions import branch_max_cuda, try_parse_version

    d = a.decision
    note = (d.details or {}).get("note")
    if isinstance(note, dict) and note.get("cuda_version"):
        v = try_parse_version(note["cuda_version"])
        if v is not None:
            return v
    v = try_parse_version(d.compat_version) if d.compat_version else None
    return branch_max_cuda(v[0]) if v else None


def _result(a, host, needs, loads: str) -> dict:
    """The outcome when the container loads ``loads`` (``compat``/``host``) under assessment ``a``."""
    d = a.decision
    if loads == "compat":
        if a.effect == "compat":
            cuda = _compat_cuda(a)
            out = {"outcome": "store" if d.source == "store" else "compat", "reason": d.reason,
                   "cuda": _cuda_text(cuda), "error": None}
            if needs is not None and cuda is not None and cuda[:2] < needs[:2]:
                out.update(outcome="broken", error=35 if cuda[0] != needs[0] else 222)
            return out
        # The image's compat driver is loaded although it is wrong here.
        return {"outcome": "broken", "reason": d.reason, "cuda": None,
                "error": _WRONG_COMPAT_ERROR.get(d.reason, 803)}
    out = host_outcome(host, needs)
    return {"outcome": out["outcome"], "reason": d.reason, "cuda": out["cuda"], "error": out["error"]}


def _request(env: list):
    from .container import Request

    env = [e for e in env if isinstance(e, str)]
    # plan asks about GPU containers: the device plugin sets this at start.
    if not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in env):
        env.append("NVIDIA_VISIBLE_DEVICES=all")
    return Request.from_spec({"process": {"env": env}})


def image_needs(root, env: list) -> dict:
    """The CUDA version the image needs, from its files and its env (:func:`compat_hook.cudaruntime.needs`)."""
    from . import cudaruntime

    env_need, env_source = _request(env).required_cuda()
    return cudaruntime.needs(cudaruntime.sources(root), env_need, env_source)


def assess_image(config, root, env: list, host, image_needs: dict | None = None) -> dict:
    """``{"needs_cuda", "result", "toolkit_only"}`` for one image on one host.

    What the image needs is the highest CUDA version its runtime files or its
    env name (``image_needs``, :func:`image_needs`); the hook's decision
    itself sees only the env, as it does at container start.
    """
    from .assess import assess

    request = _request(env)
    needs = image_needs["version"] if image_needs is not None else request.required_cuda()[0]
    spec = {"process": {"env": list(env)}, "root": {"path": "rootfs"}}
    a = assess(config, request, root, spec=spec, host=host, actors=("hook", "wrapper"), toolkit=True)
    loads = a.toolkit["with_wrapper"]["result"] if a.toolkit else "host"
    alone = a.toolkit["alone"]["result"] if a.toolkit else "host"
    if a.effect == "compat":
        loads = "compat"
    return {"needs_cuda": _cuda_text(needs), "result": _result(a, host, needs, loads),
            "toolkit_only": _result(a, host, needs, alone)}


def gpus_from_names(names: list) -> list:
    """:class:`~compat_hook.hostfacts.Gpu` objects from ``--gpu`` names (:mod:`compat_hook.gpunames`).

    NVML names, GFD ``nvidia.com/gpu.product`` labels and short model names;
    an unknown name is a :class:`~compat_hook.gpunames.UnknownGpuName` (exit 2).

    >>> [(g.brand, g.compute_capability) for g in gpus_from_names(["NVIDIA-H100-80GB-HBM3", "RTX 4090", "V100"])]
    [(14, (9, 0)), (5, (8, 9)), (2, (7, 0))]
    """
    from .gpunames import resolve
    from .hostfacts import Gpu

    out = []
    for i, n in enumerate(names):
        g = resolve(n)
        out.append(Gpu(f"gpu{i}", g.model, g.brand, f"--gpu {g.form} name", g.compute_capability))
    return out


def _host_with(base, driver_text: str):
    from .hostfacts import HostFacts
    from .versions import try_parse_version

    v = try_parse_version(driver_text)
    return HostFacts(driver_version=v, driver_source="plan", driver_text=driver_text,
                     gpus=base.gpus, gpus_source=base.gpus_source, arch=base.arch,
                     cuda_version=None, tegra=False)


def _check_driver(text: str, where: str) -> str:
    from .versions import try_parse_version

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
    return _check_driver(version, f"{manifest}: {where}"), where


def plan(config, sources: list, *, driver: str | None = None, manifest: str | None = None,
         from_driver: str | None = None, gpus: list | None = None, opener=None, expander=None,
         address: str | None = None, namespace: str = "k8s.io", allow_unreadable: bool = False) -> dict:
    """The plan report (see the module docstring and :func:`render_text`).

    ``containerd:`` sources use containerd's socket at ``address``, else the
    first one :func:`compat_hook.imagestores.find_socket` finds under the
    config's ``host_root``; the report's ``containerd`` says which.
    """
    import functools

    from . import hostfacts

    if (driver is None) == (manifest is None):
        raise UsageError("give the target driver with --driver VERSION or --manifest FILE")
    target_from = "--driver"
    if manifest is not None:
        driver, target_from = parse_target(manifest)
    else:
        driver = _check_driver(driver, "--driver")
    base = hostfacts.gather(config)
    if gpus:
        base.gpus, base.gpus_source = gpus_from_names(gpus), "--gpu"
    if from_driver is not None:
        now_text = _check_driver(from_driver, "--from-driver")
    elif base.driver_version is not None:
        now_text = base.driver_text
    else:
        raise UsageError(f"the host driver is unknown under {config.host_root}: give --from-driver VERSION")
    now, after = _host_with(base, now_text), _host_with(base, driver)
    ctrd = _containerd(sources, address, namespace, config) if opener is None else None
    where = {"address": ctrd.get("address") if ctrd else address, "namespace": namespace}
    if opener is None:
        from .planimages import open_source

        opener = functools.partial(open_source, **where)
    if expander is None:
        from .planimages import expand

        expander = functools.partial(expand, **where)
    images = []
    todo = []
    for src in sources:
        try:
            if ctrd and ctrd.get("error") and src.startswith("containerd:"):
                from .images import ImageError

                raise ImageError(ctrd["error"])
            todo.extend(expander(src))
        except Exception as e:  # a store that cannot be listed: one row says why
            images.append(_unreadable(src, e))
    for src in todo:
        entry = {"image": src}
        try:
            with opener(src, config) as img:
                # read_via: how the image was read (snapshot: the node's unpacked layer dirs;
                # blobs / stream: decompressed; dir: a rootfs), the cost the operator pays
                entry["read_via"] = getattr(img, "read_via", "dir")
                if getattr(img, "read_via_reason", None):
                    entry["read_via_reason"] = img.read_via_reason
                need = image_needs(img.root, img.env)
                r_now = assess_image(config, img.root, img.env, now, need)
                r_after = assess_image(config, img.root, img.env, after, need)
            entry.update(needs_cuda=r_now["needs_cuda"], needs_source=need["source"],
                         needs_sources=need["sources"], now=r_now["result"], after=r_after["result"],
                         toolkit_only_after=r_after["toolkit_only"])
            if need["warning"]:
                entry["warnings"] = [need["warning"]]
        except Exception as e:  # one image's failure never stops the others
            entry = _unreadable(src, e)
        images.append(entry)
    out = {"driver": {"now": now_text, "after": driver, "target_from": target_from},
           "gpus": [g.to_dict() for g in base.gpus], "images": images, "summary": _summary(images),
           "allow_unreadable": bool(allow_unreadable)}
    if ctrd:
        out["containerd"] = ctrd
    return out


def _unreadable(src: str, e: BaseException) -> dict:
    """The row of a source that could not be read: ``error`` (one line) and ``error_code``, no outcome."""
    from .errors import describe

    code, msg = describe(e)
    return {"image": src, "needs_cuda": None, "error": msg, "error_code": code, "now": None, "after": None,
            "toolkit_only_after": None}


def _containerd(sources: list, address, namespace: str, config) -> dict | None:
    """``{"address", "found_by", "namespace"}`` (or ``"error"``) when a source is ``containerd:``."""
    if not any(isinstance(s, str) and s.startswith("containerd:") for s in sources):
        return None
    from .images import ImageError
    from .imagestores import find_socket

    try:
        addr, how = find_socket(address, getattr(config, "host_root", "/") or "/")
    except ImageError as e:
        return {"address": None, "found_by": None, "namespace": namespace, "error": str(e)}
    return {"address": addr, "found_by": how, "namespace": namespace}


def _summary(images: list) -> dict:
    ok = [i for i in images if i.get("now") is not None]
    return {
        "images": len(images), "read": len(ok), "unreadable": len(images) - len(ok),
        "broken_after": sum(1 for i in ok if i["after"]["outcome"] == "broken"),
        "changed": sum(1 for i in ok if i["now"]["outcome"] != i["after"]["outcome"]),
        "broken_after_toolkit_only": sum(1 for i in ok if i["toolkit_only_after"]["outcome"] == "broken"),
        "fixed_by_compat_hook": sum(1 for i in ok if i["toolkit_only_after"]["outcome"] == "broken"
                                    and i["after"]["outcome"] != "broken"),
    }


def _cell(r) -> str:
    if r is None:
        return "-"
    s = r["outcome"]
    if r.get("cuda"):
        s += f" {r['cuda']}"
    if r.get("error"):
        s += f" ({r['error']})"
    return s


def render_text(report: dict) -> str:
    """The table (one row per image), the sources that could not be read, and a summary line."""
    from .errors import one_line

    d = report["driver"]
    rows = [("IMAGE", "NEEDS", f"NOW {d['now']}", f"AFTER {d['after']}", "TOOLKIT ALONE AFTER", "NEEDS FROM")]
    for i in report["images"]:
        if i.get("error"):
            rows.append((one_line(i["image"]), "-", "unreadable", "-", "-", "-"))
            continue
        # where the need was read: libcudart, wheel, torch, conda, env (the path is in the JSON)
        source = i["needs_source"].split()[0] if i.get("needs_source") else "-"
        rows.append((one_line(i["image"]), i["needs_cuda"] or "-", _cell(i["now"]), _cell(i["after"]),
                     _cell(i["toolkit_only_after"]), source))
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    out = [("  ".join(r[k].ljust(widths[k]) for k in range(5)) + "  " + r[5]).rstrip() for r in rows]
    c = report.get("containerd")
    if c and c.get("address"):
        out.append(f"containerd: socket {c['address']} ({c['found_by']}), namespace {c['namespace']}")
    via: dict = {}
    for i in report["images"]:
        if i.get("read_via"):
            via.setdefault(i["read_via"], []).append(one_line(i["image"]))
    # told when an engine's store was read (a file source has no other way to be read)
    if set(via) & {"snapshot", "stream"} or any(i.get("read_via_reason") for i in report["images"]):
        slow = via.get("blobs", []) + via.get("stream", [])
        out.append("read via: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(via.items()))
                   + (f" (decompressed: {', '.join(slow[:5])}{', ...' if len(slow) > 5 else ''})"
                      if slow and "snapshot" in via else ""))
    for i in report["images"]:
        if i.get("error"):
            out.append(f"unreadable: {one_line(i['image'])}: {i['error']}")
        for w in i.get("warnings") or ():
            out.append(f"warning: {one_line(i['image'])}: {one_line(w)}")
    s = report["summary"]
    out.append(f"{s['images']} image(s): {s['broken_after']} broken after the upgrade, {s['changed']} change "
               f"outcome, {s['unreadable']} unreadable; the toolkit alone would leave "
               f"{s['broken_after_toolkit_only']} broken ({s['fixed_by_compat_hook']} kept working by compat-hook)")
    return "\n".join(out) + "\n"


#: ``--fail-on`` met: an image is broken after the upgrade, or an outcome changes.
EXIT_GATE = 3
#: A source could not be read, or no image was read at all: the gate did not check
#: what it was asked to (``--allow-unreadable`` accepts that).
EXIT_UNREADABLE = 4


def gate(report: dict, fail_on: str | None, allow_unreadable: bool = False) -> tuple:
    """``(exit status, one-line reason or None)``: 4 when a source was unreadable or nothing was read
    (unless ``allow_unreadable``), else 3 when ``fail_on`` (``broken`` / ``change``) is met, else 0.

    >>> gate({"summary": {"images": 1, "read": 0, "unreadable": 1, "broken_after": 0, "changed": 0}}, "broken")
    (4, '1 of 1 source(s) unreadable, nothing read: the gate checked nothing (--allow-unreadable to accept)')
    >>> gate({"summary": {"images": 1, "read": 0, "unreadable": 1, "broken_after": 0, "changed": 0}}, None, True)
    (0, None)
    """
    s = report["summary"]
    if (s["unreadable"] or not s["read"]) and not allow_unreadable:
        what = (f"{s['unreadable']} of {s['images']} source(s) unreadable" if s["unreadable"]
                else "no image in the sources")
        if not s["read"]:
            what += ", nothing read: the gate checked nothing"
        return EXIT_UNREADABLE, f"{what} (--allow-unreadable to accept)"
    if fail_on == "broken" and s["broken_after"]:
        return EXIT_GATE, None
    if fail_on == "change" and s["changed"]:
        return EXIT_GATE, None
    return 0, None


def exit_status(report: dict, fail_on: str | None, allow_unreadable: bool = False) -> int:
    """0, 3 when ``fail_on`` is met, 4 when a source was unreadable (:func:`gate`)."""
    return gate(report, fail_on, allow_unreadable)[0]


class _DirImage:
    """A rootfs dir or an OCI bundle dir as a plan source (env from the bundle's config.json)."""

    def __init__(self, path: str) -> None:
        from . import oci
        from .rootfs import Root

        self.env = []
        rootfs = path
        if os.path.isfile(os.path.join(path, "config.json")):
            spec = oci.load_spec(path)
            rootfs = oci.rootfs_path(path, spec)
            proc = spec.get("process") if isinstance(spec.get("process"), dict) else {}
            self.env = [e for e in proc.get("env") or [] if isinstance(e, str)]
        self.root = Root(rootfs)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.root.close()


def open_dir(path: str):
    return _DirImage(path)
