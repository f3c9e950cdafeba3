"""The plan report: each image's outcome on the host driver now and on a target driver.

:func:`plan` builds the report ``compat-hook plan`` prints and the cluster
agent publishes: for every image and each driver (now, after) it runs the
shared assessment through :func:`compat_hook.policy.outcome.assess_image`.
:func:`gate` turns a report into an exit status: 4 when a source could not be
read or nothing was read (unless ``allow_unreadable``), 3 when ``--fail-on``
is met. Plain data in, plain data out: the printing is
:mod:`compat_hook.commands.plan`'s.
"""

from __future__ import annotations

from ..core.errors import UsageError
from .outcome import assess_image, check_driver, image_needs, parse_target

__all__ = ["plan", "gpus_from_names", "gate", "exit_status", "EXIT_GATE", "EXIT_UNREADABLE"]


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


def _host_with(base, driver_text: str):
    from ..facts.hostfacts import HostFacts
    from ..core.versions import try_parse_version

    v = try_parse_version(driver_text)
    return HostFacts(driver_version=v, driver_source="plan", driver_text=driver_text,
                     gpus=base.gpus, gpus_source=base.gpus_source, arch=base.arch,
                     cuda_version=None, tegra=False)


def plan(config, sources: list, *, driver: str | None = None, manifest: str | None = None,
         from_driver: str | None = None, gpus: list | None = None, opener=None, expander=None,
         address: str | None = None, namespace: str = "k8s.io", allow_unreadable: bool = False) -> dict:
    """The plan report (see the module docstring and :func:`render_text`).

    ``containerd:`` sources use containerd's socket at ``address``, else the
    first one :func:`compat_hook.images.stores.find_socket` finds under the
    config's ``host_root``; the report's ``containerd`` says which.
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
    now, after = _host_with(base, now_text), _host_with(base, driver)
    ctrd = _containerd(sources, address, namespace, config) if opener is None else None
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
    from ..core.errors import describe

    code, msg = describe(e)
    return {"image": src, "needs_cuda": None, "error": msg, "error_code": code, "now": None, "after": None,
            "toolkit_only_after": None}


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
    return {
        "images": len(images), "read": len(ok), "unreadable": len(images) - len(ok),
        "broken_after": sum(1 for i in ok if i["after"]["outcome"] == "broken"),
        "changed": sum(1 for i in ok if i["now"]["outcome"] != i["after"]["outcome"]),
        "broken_after_toolkit_only": sum(1 for i in ok if i["toolkit_only_after"]["outcome"] == "broken"),
        "fixed_by_compat_hook": sum(1 for i in ok if i["toolkit_only_after"]["outcome"] == "broken"
                                    and i["after"]["outcome"] != "broken"),
    }


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
