"""``compat-hook explain``: facts, decision, reason, and what each mode would change.

Read-only by construction: it opens the rootfs through the confined
:class:`~compat_hook.rootfs.Root` for reading, passes no state dir (so not
even the cache is written) and never calls an effect.
"""

from __future__ import annotations

__all__ = ["explain", "render_text"]


def explain(config, *, rootfs: str | None = None, bundle: str | None = None,
            host_driver_version: str | None = None, host_cuda_version: str | None = None) -> dict:
    """Gather facts and decide; returns the report (see :func:`render_text`).

    Raises :class:`~compat_hook.errors.StateError` for an unreadable bundle
    or rootfs.
    """
    from . import hostfacts, imagefacts, ldcache, ldpath, oci
    from .container import Request
    from .decision import decide
    from .errors import StateError
    from .rootfs import Root

    spec = None
    if bundle is not None:
        spec = oci.load_spec(bundle)
        rootfs = oci.rootfs_path(bundle, spec)
        request = Request.from_spec(spec, config.annotations)
    else:
        request = Request.assume_gpu()
    try:
        root = Root(rootfs)
    except OSError as e:
        raise StateError(f"cannot open rootfs {rootfs}: {e.strerror}") from None
    with root:
        image = imagefacts.gather(root, config, state_dir=None)
        host = hostfacts.gather(config, driver_version=host_driver_version,
                                cuda_version=host_cuda_version)
        decision = decide(host, image, request, config)
        store_decision = None
        if image.status == "none" and config.store_inject and decision.reason == "no_candidate":
            from . import store

            store_decision = store.decide_for(host, request, config)
            if store_decision is not None and store_decision.enable:
                decision = store_decision
        existing = ldcache.current_dropin(root)

    modes = {}
    image_enable = decision.enable and decision.source == "image"
    actions = ldcache.plan_for(image_enable, decision.compat_dir, existing)
    ld_changes = []
    for a, arg in actions:
        if a == "write_dropin":
            ld_changes.append(f"write {ldcache.DROPIN_PATH} containing {arg}")
        elif a == "remove_dropin":
            ld_changes.append(f"remove the stale {ldcache.DROPIN_PATH}")
        elif a == "ldconfig":
            ld_changes.append(f"run {config.ldconfig} -r <rootfs> to refresh /etc/ld.so.cache")
    modes["ldconfig"] = ld_changes or ["nothing"]

    env_list = []
    if spec is not None:
        proc = spec.get("process")
        raw = proc.get("env") if isinstance(proc, dict) else None
        env_list = [e for e in raw if isinstance(e, str)] if isinstance(raw, list) else []
    known = set(config.compat_dirs) | {config.store_target}
    for d in image.dirs_checked:
        if d.get("resolved"):
            known.add(d["resolved"])
    new_env, changed = ldpath.rewrite_env(env_list, decision.compat_dir if decision.enable else None,
                                          known)
    old = next((e for e in reversed(env_list) if e.startswith("LD_LIBRARY_PATH=")), None)
    new = next((e for e in reversed(new_env) if e.startswith("LD_LIBRARY_PATH=")), None)
    env_changes = []
    if changed:
        env_changes.append(f"{old or 'LD_LIBRARY_PATH unset'} -> {new or 'LD_LIBRARY_PATH unset'}")
    if decision.enable and decision.source == "store":
        env_changes.append(f"bind-mount {decision.compat_dir} read-only at {config.store_target}")
    modes["env"] = env_changes or ["nothing"]

    note = image.elf.note.to_dict() if image.elf is not None and image.elf.note is not None else None
    return {
        "decision": decision.action,
        "reason": decision.reason,
        "message": decision.message,
        "compat_dir": decision.compat_dir,
        "compat_version": decision.compat_version or image.compat_version_text,
        "host_driver_version": host.to_dict()["driver_version"],
        "host_cuda_version": host.to_dict()["cuda_version"],
        "note": note,
        "warnings": decision.warnings,
        "details": decision.details,
        "host": host.to_dict(),
        "image": image.to_dict(),
        "request": request.to_dict(),
        "store": store_decision.to_dict() if store_decision is not None else None,
        "would_change": modes,
        "rootfs": rootfs,
        "config": config.source,
    }


def render_text(report: dict) -> str:
    """A readable report of :func:`explain`'s result."""
    h, img, req = report["host"], report["image"], report["request"]
    out = []
    out.append(f"decision: {report['decision'].upper()}  ({report['reason']})")
    out.append(f"  why: {report['message']}")
    for w in report["warnings"]:
        out.append(f"  warning: {w}")
    out.append("host:")
    out.append(f"  kernel driver: {h['driver_version'] or 'unknown'}"
               + (f"  (from {h['driver_source']})" if h["driver_source"] else ""))
    if h["cuda_version"]:
        out.append(f"  CUDA: {h['cuda_version']}  (from {h['cuda_source']})")
    for g in h["gpus"]:
        out.append(f"  GPU {g['bus_id']}: {g['model'] or '?'}  brand {g['brand_name']} "
                   f"(from {g['brand_source']})")
    if h["tegra"]:
        out.append("  Tegra: yes (no kernel driver version, /dev/nvgpu)")
    out.append(f"  arch: {h['arch']}")
    for n in h["notes"]:
        out.append(f"  note: {n}")
    out.append("image:")
    for d in img["dirs_checked"]:
        res = f" -> {d['resolved']}" if d["resolved"] and d["resolved"] != d["dir"] else ""
        out.append(f"  {d['dir']}{res}: {d['status']}")
    if img["candidate"]:
        out.append(f"  candidate: {img['compat_dir']}/{img['candidate']}  (version {img['compat_version']})")
    elif img["candidates"]:
        out.append(f"  candidates: {', '.join(img['candidates'])}")
    elf = img["elf"]
    if elf:
        if elf["error"]:
            out.append(f"  ELF: {elf['error']}")
        else:
            out.append(f"  ELF: ELFCLASS{elf['elf_class']} {elf['machine']} {elf['elf_type']}, "
                       f"SONAME {elf['soname'] or '(none)'}  [{img['elf_source']}]")
        if report["note"]:
            n = report["note"]
            out.append(f"  note: CUDA {n.get('cuda_version')}, driver branches {n.get('driver')}, "
                       f"devices {n.get('device')}")
        elif elf.get("note_error"):
            out.append(f"  note: none ({elf['note_error']})")
        else:
            out.append("  note: none")
    for lib in img["other_libs"]:
        out.append(f"  also: {lib['name']}" + (" (symlink)" if lib["kind"] == "symlink" else ""))
    for n in img["notes"]:
        out.append(f"  note: {n}")
    out.append("container:")
    out.append(f"  GPU requested: {'yes' if req['gpu_requested'] else 'no'} ({req['gpu_reason']})")
    if req["disabled"]:
        out.append(f"  opted out: {req['disabled_reason']}")
    if req["required_cuda"]:
        out.append(f"  needs CUDA {req['required_cuda']} (from {req['required_cuda_source']})")
    if report.get("store"):
        s = report["store"]
        out.append(f"host store: {s['decision']} ({s['reason']})")
    out.append("would change:")
    for mode, changes in report["would_change"].items():
        for c in changes:
            out.append(f"  {mode} mode: {c}")
    out.append("(explain changes nothing)")
    return "\n".join(out) + "\n"
