"""The plan report: each image's (or workload's) outcome on the host driver now and on a target driver.

:func:`plan` builds the report ``compat-hook plan`` prints and the cluster
agent publishes: for every image and each driver (now, after) it runs the
shared assessment through :func:`compat_hook.policy.outcome.assess_image`.
:func:`gate` turns a report into an exit status: 4 when a source could not be
read, a workload could not be assessed or nothing was read (unless
``allow_unreadable``), 3 when ``--fail-on`` is met. Plain data in, plain data
out: the printing is :mod:`compat_hook.commands.plan`'s.

Each row carries ``regression``: it works now, it is broken after, and the
target is another driver than the current one. The summary counts them
(``regressions``) apart from the rows broken before and after alike
(``broken_now_and_after``), which an upgrade makes no worse.

*Workloads* (the cluster agent's pods, not images): each is
``{"source", "name", "env", "annotations", "runtime", "unknown"}``. Its request
is the image's env overlaid by the container's ``env`` (as the kubelet hands
it to the engine), with the pod's ``annotations`` (the opt-out switches, CDI
devices) and its ``NVIDIA_VISIBLE_DEVICES``. Its ``now`` / ``after`` are
compat-hook's outcome for ``runtime: compat-hook`` and the NVIDIA toolkit's
alone for ``runtime: toolkit``; both are kept (``compat_hook_after``,
``toolkit_only_after``). An image is opened once for all of its workloads. A
workload with ``unknown`` set (an env the pod spec does not resolve) is a row
with no outcome, counted in ``unknown_workloads``.

>>> overlay_env(["PATH=/bin", "LD_LIBRARY_PATH=/usr/lib", "CUDA_VERSION=12.4.1"], ["LD_LIBRARY_PATH=/usr/local/cuda/compat", "A=1"])
['PATH=/bin', 'LD_LIBRARY_PATH=/usr/local/cuda/compat', 'CUDA_VERSION=12.4.1', 'A=1']
"""

from __future__ import annotations

from ..core.errors import UsageError
from .outcome import assess_image, check_driver, image_needs, parse_target

__all__ = ["plan", "gpus_from_names", "gate", "exit_status", "overlay_env", "RUNTIMES", "FAIL_ON", "EXIT_GATE",
           "EXIT_UNREADABLE"]

#: A workload's ``runtime``: which outcome applies to it.
RUNTIMES = ("compat-hook", "toolkit")
#: What ``--fail-on`` takes.
FAIL_ON = ("broken", "regression", "change")


def gpus_from_names(names: list) -> list:
    """:class:`~compat_hook.facts.hostfacts.Gpu` objects from ``--gpu`` names (:mod:`compat_hook.facts.gpunames`).

    NVML names, GFD ``nvidia.com/gpu.product`` labels and short model names;
    an unknown name is a :class:`~compat_hook.facts.gpunames.UnknownGpuName` (exit 2).

    >>> [(g.brand, g.compute_capability) for g in gpus_from_names(["NVIDIA-H100-80GB-HBM3", "RTX 4090", "V100"])]
    [(14, (9, 0)), (5, (8, 9)), (2, (7, 0))]
    """
    from ..facts.gpunames import resolve
    from ..facts.hostfacts import Gpu

    out = []
    for i, n in enumerate(names):
        g = resolve(n)
        out.append(Gpu(f"gpu{i}", g.model, g.brand, f"--gpu {g.form} name", g.compute_capability))
    return out


def overlay_env(image_env: list, env: list) -> list:
    """The container's env: the image's, each variable the container sets replaced (or added at the end)."""
    out: dict = {}
    for e in list(image_env or []) + list(env or []):
        if isinstance(e, str):
            out[e.split("=", 1)[0]] = e
    return list(out.values())


def _host_with(base, driver_text: str):
    from ..facts.hostfacts import HostFacts
    from ..core.versions import try_parse_version

    v = try_parse_version(driver_text)
    return HostFacts(driver_version=v, driver_source="plan", driver_text=driver_text,
                     gpus=base.gpus, gpus_source=base.gpus_source, arch=base.arch,
                     cuda_version=None, tegra=False)


def _gpu_view(config, base, named: bool) -> list:
    """The GPUs with their architectures: the ones the driver lists (or ``--gpu`` names), then the
    NVIDIA GPUs on the PCI bus the driver does not list (read from the host; never with ``--gpu``)."""
    from ..facts import gpusupport
    from ..facts.gpunames import architecture_of_pci

    pci = {} if named else gpusupport.pci_gpus(getattr(config, "host_root", "/") or "/")
    view = [gpusupport.of_gpu(g, pci, None if named else True) for g in base.gpus]
    seen = {v.bus_id for v in view}
    for bus, dev in sorted(pci.items()):
        if bus not in seen:
            arch = architecture_of_pci(dev)
            view.append(gpusupport.GpuArch(None, bus, dev, arch, f"PCI device ID {dev}" if arch else None, False))
    return view


class _Ctx:
    """What every row of one report shares: the config, both hosts, the GPUs, the driver texts."""

    __slots__ = ("config", "now", "after", "view", "listed_by", "now_text", "after_text")

    def __init__(self, config, now, after, view, listed_by, now_text, after_text) -> None:
        self.config, self.now, self.after, self.view, self.listed_by = config, now, after, view, listed_by
        self.now_text, self.after_text = now_text, after_text

    def outcomes(self, root, env: list, need: dict, annotations: dict | None = None) -> tuple:
        kw = dict(annotations=annotations, gpus=self.view, listed_by=self.listed_by)
        return (assess_image(self.config, root, env, self.now, need, **kw),
                assess_image(self.config, root, env, self.after, need, **kw))

    def regression(self, now: dict | None, after: dict | None) -> bool:
        return (now is not None and after is not None and now["outcome"] != "broken"
                and after["outcome"] == "broken" and self.now_text != self.after_text)


def plan(config, sources: list, *, driver: str | None = None, manifest: str | None = None,
         from_driver: str | None = None, gpus: list | None = None, opener=None, expander=None,
         address: str | None = None, namespace: str = "k8s.io", allow_unreadable: bool = False,
         workloads: list | None = None) -> dict:
    """The plan report (see the module docstring and :func:`render_text`).

    ``containerd:`` sources use containerd's socket at ``address``, else the
    first one :func:`compat_hook.images.stores.find_socket` finds under the
    config's ``host_root``; the report's ``containerd`` says which.
    ``workloads``: the cluster agent's containers (the module docstring); their
    rows follow the images', in the order given.
    """
    import functools

    from ..facts import hostfacts

    if (driver is None) == (manifest is None):
        raise UsageError("give the target driver with --driver VERSION or --manifest FILE")
    target_from = "--driver"
    if manifest is not None:
        driver, target_from = parse_target(manifest)
    else:
        driver = check_driver(driver, "--driver")
    base = hostfacts.gather(config)
    if gpus:
        base.gpus, base.gpus_source = gpus_from_names(gpus), "--gpu"
    if from_driver is not None:
        now_text = check_driver(from_driver, "--from-driver")
    elif base.driver_version is not None:
        now_text = base.driver_text
    else:
        raise UsageError(f"the host driver is unknown under {config.host_root}: give --from-driver VERSION")
    view = _gpu_view(config, base, bool(gpus))
    ctx = _Ctx(config, _host_with(base, now_text), _host_with(base, driver), view,
               None if gpus else base.driver_text, now_text, driver)
    workloads = list(workloads or [])
    all_sources = list(sources) + [w.get("source") for w in workloads if isinstance(w, dict)]
    ctrd = _containerd(all_sources, address, namespace, config) if opener is None else None
    where = {"address": ctrd.get("address") if ctrd else address, "namespace": namespace}
    if opener is None:
        from ..images.sources import open_source

        opener = functools.partial(open_source, **where)
    if expander is None:
        from ..images.sources import expand

        expander = functools.partial(expand, **where)
    images = []
    todo = []
    for src in sources:
        try:
            if ctrd and ctrd.get("error") and src.startswith("containerd:"):
                from ..core.errors import ImageError

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
                _read_via(entry, img)
                need = image_needs(img.root, img.env)
                r_now, r_after = ctx.outcomes(img.root, img.env, need)
            entry.update(needs_cuda=r_now["needs_cuda"], needs_source=need["source"],
                         needs_sources=need["sources"], now=r_now["result"], after=r_after["result"],
                         toolkit_only_after=r_after["toolkit_only"],
                         regression=ctx.regression(r_now["result"], r_after["result"]))
            if need["warning"]:
                entry["warnings"] = [need["warning"]]
            if r_now.get("image_libcuda"):
                # a symlinked compat file, a userland driver in a system dir: facts (their fate is in now/after)
                entry["image_libcuda"] = r_now["image_libcuda"]
        except Exception as e:  # one image's failure never stops the others
            entry = _unreadable(src, e)
        images.append(entry)
    if workloads:
        images.extend(_workload_rows(ctx, workloads, opener, ctrd))
    out = {"driver": {"now": now_text, "after": driver, "target_from": target_from},
           "gpus": [v.to_dict() for v in view], "images": images, "summary": _summary(images),
           "allow_unreadable": bool(allow_unreadable)}
    if ctrd:
        out["containerd"] = ctrd
    return out


def _read_via(entry: dict, img) -> None:
    entry["read_via"] = getattr(img, "read_via", "dir")
    if getattr(img, "read_via_reason", None):
        entry["read_via_reason"] = img.read_via_reason


def _workload_head(w) -> tuple:
    """``(row head, why it cannot be assessed or None)`` of one workload dict."""
    if not isinstance(w, dict):
        return {"image": None, "name": None, "workload": True, "runtime": None}, "not a workload (a dict)"
    head = {"image": w.get("source"), "name": w.get("name"), "workload": True, "runtime": w.get("runtime")}
    if w.get("unknown"):
        return head, str(w["unknown"])
    if w.get("runtime") not in RUNTIMES:
        return head, f"runtime {w.get('runtime')!r} is none of {', '.join(RUNTIMES)}"
    if not isinstance(w.get("source"), str) or not w["source"]:
        return head, "no image source (the image is not in a store plan reads)"
    env, ann = w.get("env") or [], w.get("annotations") or {}
    if not isinstance(env, list) or not isinstance(ann, dict):
        return head, "env is not a list of K=V, or annotations not a mapping"
    return head, None


def _workload_rows(ctx: _Ctx, workloads: list, opener, ctrd) -> list:
    """One row per workload, in the order given; each image opened once for all of its workloads."""
    from ..facts import cudaruntime

    rows: list = [None] * len(workloads)
    by_source: dict = {}
    for i, w in enumerate(workloads):
        head, why = _workload_head(w)
        if why is not None:
            rows[i] = dict(head, needs_cuda=None, unknown=why, now=None, after=None, compat_hook_after=None,
                           toolkit_only_after=None, regression=False)
        else:
            by_source.setdefault(w["source"], []).append((i, head, w))
    for src, items in by_source.items():
        try:
            if ctrd and ctrd.get("error") and src.startswith("containerd:"):
                from ..core.errors import ImageError

                raise ImageError(ctrd["error"])
            with opener(src, ctx.config) as img:
                found = cudaruntime.sources(img.root)
                for i, head, w in items:
                    rows[i] = _workload_row(ctx, img, found, head, w)
        except Exception as e:  # the image cannot be read: each of its workloads says so
            for i, head, _ in items:
                if rows[i] is None:
                    rows[i] = dict(_unreadable(src, e), **head, compat_hook_after=None)
    return rows


def _workload_row(ctx: _Ctx, img, found: list, head: dict, w: dict) -> dict:
    row = dict(head)
    try:
        _read_via(row, img)
        env = overlay_env(img.env, w.get("env") or [])
        ann = w.get("annotations") or {}
        need = image_needs(img.root, env, ann, found)
        r_now, r_after = ctx.outcomes(img.root, env, need, ann)
        key = "result" if w["runtime"] == "compat-hook" else "toolkit_only"
        now, after = r_now[key], r_after[key]
        row.update(needs_cuda=r_now["needs_cuda"], needs_source=need["source"], needs_sources=need["sources"],
                   now=now, after=after, compat_hook_after=r_after["result"],
                   toolkit_only_after=r_after["toolkit_only"], regression=ctx.regression(now, after))
        if need["warning"]:
            row["warnings"] = [need["warning"]]
    except Exception as e:  # one workload's failure never stops the others
        row = dict(_unreadable(head["image"], e), **head, compat_hook_after=None)
    return row


def _unreadable(src: str, e: BaseException) -> dict:
    """The row of a source that could not be read: ``error`` (one line) and ``error_code``, no outcome."""
    from ..core.errors import describe

    code, msg = describe(e)
    return {"image": src, "needs_cuda": None, "error": msg, "error_code": code, "now": None, "after": None,
            "toolkit_only_after": None, "regression": False}


def _containerd(sources: list, address, namespace: str, config) -> dict | None:
    """``{"address", "found_by", "namespace"}`` (or ``"error"``) when a source is ``containerd:``."""
    if not any(isinstance(s, str) and s.startswith("containerd:") for s in sources):
        return None
    from ..core.errors import ImageError
    from ..images.stores import find_socket

    try:
        addr, how = find_socket(address, getattr(config, "host_root", "/") or "/")
    except ImageError as e:
        return {"address": None, "found_by": None, "namespace": namespace, "error": str(e)}
    return {"address": addr, "found_by": how, "namespace": namespace}


def _summary(images: list) -> dict:
    ok = [i for i in images if i.get("now") is not None]
    unknown = sum(1 for i in images if i.get("unknown"))

    def broken(r) -> bool:
        return r is not None and r["outcome"] == "broken"

    return {
        "images": len(images), "read": len(ok), "unreadable": len(images) - len(ok) - unknown,
        "unknown_workloads": unknown,
        "broken_after": sum(1 for i in ok if broken(i["after"])),
        "regressions": sum(1 for i in ok if i.get("regression")),
        "broken_now_and_after": sum(1 for i in ok if broken(i["now"]) and broken(i["after"])),
        "changed": sum(1 for i in ok if i["now"]["outcome"] != i["after"]["outcome"]),
        "broken_after_toolkit_only": sum(1 for i in ok if broken(i["toolkit_only_after"])),
        # through compat-hook only: a workload on the toolkit runtime has its outcome as "after"
        "fixed_by_compat_hook": sum(1 for i in ok if broken(i["toolkit_only_after"]) and not broken(i["after"])),
    }


#: ``--fail-on`` met: an image is broken after the upgrade (``broken``), works now and
#: breaks after it (``regression``), or an outcome changes (``change``).
EXIT_GATE = 3
#: A source could not be read, a workload could not be assessed, or no image was read at
#: all: the gate did not check what it was asked to (``--allow-unreadable`` accepts that).
EXIT_UNREADABLE = 4

_FAIL_KEY = {"broken": "broken_after", "regression": "regressions", "change": "changed"}


def gate(report: dict, fail_on: str | None, allow_unreadable: bool = False) -> tuple:
    """``(exit status, one-line reason or None)``: 4 when a source was unreadable, a workload unknown or
    nothing was read (unless ``allow_unreadable``), else 3 when ``fail_on`` (:data:`FAIL_ON`) is met, else 0.

    >>> s = {"images": 1, "read": 0, "unreadable": 1, "broken_after": 0, "changed": 0}
    >>> gate({"summary": s}, "broken")
    (4, '1 of 1 source(s) unreadable, nothing read: the gate checked nothing (--allow-unreadable to accept)')
    >>> gate({"summary": s}, None, True)
    (0, None)
    >>> s = {"images": 2, "read": 2, "unreadable": 0, "broken_after": 2, "regressions": 0, "changed": 0}
    >>> gate({"summary": s}, "broken"), gate({"summary": s}, "regression")
    ((3, None), (0, None))
    """
    s = report["summary"]
    unknown = s.get("unknown_workloads", 0)
    if (s["unreadable"] or unknown or not s["read"]) and not allow_unreadable:
        parts = []
        if s["unreadable"]:
            parts.append(f"{s['unreadable']} of {s['images']} source(s) unreadable")
        if unknown:
            parts.append(f"{unknown} workload(s) not assessed")
        what = ", ".join(parts) or "no image in the sources"
        if not s["read"]:
            what += ", nothing read: the gate checked nothing"
        return EXIT_UNREADABLE, f"{what} (--allow-unreadable to accept)"
    if fail_on is not None:
        if fail_on not in _FAIL_KEY:
            raise UsageError(f"--fail-on {fail_on!r}: give one of {', '.join(FAIL_ON)}")
        if s.get(_FAIL_KEY[fail_on]):
            return EXIT_GATE, None
    return 0, None


def exit_status(report: dict, fail_on: str | None, allow_unreadable: bool = False) -> int:
    """0, 3 when ``fail_on`` is met, 4 when a source was unreadable (:func:`gate`)."""
    return gate(report, fail_on, allow_unreadable)[0]
