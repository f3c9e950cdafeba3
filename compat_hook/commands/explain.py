"""``compat-hook explain``: facts, decision, reason, what the hook and the wrapper would
change, and what the NVIDIA toolkit would do beside them.

Read-only by construction: it opens the rootfs through the confined
:class:`~compat_hook.facts.rootfs.Root` for reading, passes no state dir (so not
even the cache is written) and never calls an effect. The plans come from
the same :func:`compat_hook.policy.assess.assess` the hook and the wrapper run.
"""

from __future__ import annotations

__all__ = ["explain", "render_text"]


def explain(config, *, rootfs: str | None = None, bundle: str | None = None,
            host_driver_version: str | None = None, host_cuda_version: str | None = None) -> dict:
    """Gather facts and assess as the hook and the wrapper would; returns the report.

    Each actor's plan comes from :func:`compat_hook.policy.assess.assess`, the code
    the hook and the wrapper run: ``effects.hook`` is what the hook does at
    createContainer, ``effects.wrapper`` what the wrapper changes in
    config.json (for ``--rootfs``, a minimal spec stands in). Raises
    :class:`~compat_hook.core.errors.StateError` for an unreadable bundle or rootfs.
    """
    from ..facts import hostfacts, oci
    from ..policy.assess import assess
    from ..facts.container import Request
    from ..core.errors import StateError
    from ..facts.rootfs import Root

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

    def entry():
        from ..core.registration import hook_entry

        return hook_entry(stage="createContainer", config=config.source)

    with root:
        host = hostfacts.gather(config, driver_version=host_driver_version, cuda_version=host_cuda_version)
        hook = assess(config, request, root, spec=spec, host=host, actors=("hook",), mount_ns=True,
                      toolkit=True, full=True)
        wrapper = assess(config, request, root, host=host, actors=("wrapper",), hook_entry=entry, full=True,
                         spec=spec if spec is not None else {"process": {"env": []}, "root": {"path": rootfs}},
                         toolkit=True)
        # the wrapper's path is the hook's assessment of the spec the wrapper hands on (assess)
        hook.toolkit["with_wrapper"] = wrapper.toolkit["with_wrapper"]
    image = hook.image
    decision = wrapper.decision  # the wrapper sees the spec: a store mount is its to make
    elf = image.elf if image is not None else None
    note = elf.note.to_dict() if elf is not None and elf.note is not None else None
    report = {
        "decision": decision.action,
        "reason": decision.reason,
        "message": decision.message,
        "effect": decision.effect,
        "compat_dir": decision.compat_dir,
        "compat_version": decision.compat_version or (image.compat_version_text if image else None),
        "host_driver_version": host.to_dict()["driver_version"],
        "host_cuda_version": host.to_dict()["cuda_version"],
        "note": note,
        "warnings": list(decision.warnings) + hook.warnings,
        "notes": hook.notes,
        "details": decision.details,
        "host": host.to_dict(),
        "image": image.to_dict(),
        "request": request.to_dict(),
        "gpus_checked": decision.details.get("gpus_checked"),
        "store": wrapper.store.to_dict() if wrapper.store is not None else None,
        "effects": {"hook": hook.effects()["hook"], "wrapper": wrapper.effects()["wrapper"]},
        "hook_actions": [list(x) for x in hook.hook],
        "compat_dropins": hook.dropins,
        "ld_library_path_compat": hook.ld_compat_entries,
        "compat_dirs": decision.details.get("compat_dirs") if isinstance(decision.details, dict) else None,
        "losing_compat_dirs": _losers(hook, wrapper),
        "toolkit": hook.toolkit,
        "ldconfig_picks": _picks(hook),
        "compat_over_shadow": [dict(x) for x in hook.compat_over],
        "rootfs": rootfs,
        "config": config.source,
        "path": _path(spec),
    }
    report["summary"] = _summary(report)
    return report


def _picks(a) -> dict:
    """What ldconfig links in each dir holding a userland libcuda of the image, the host's file counted."""
    from ..facts.imagefacts import ldconfig_picks
    from ..policy.toolkit import default_host_dir

    img = a.image
    if img is None or not img.userland:
        return {}
    drv = a.host.driver_text if a.host is not None else None
    return ldconfig_picks(img.userland, default_host_dir({"arch": None}), drv)


#: A hook entry of compat-hook's names its CLI module in its boot code (core.registration).
_MARK = "compat_hook.cli"


def _path(spec) -> str | None:
    """How compat-hook reaches this bundle's container, from its spec's hooks (``None``: no bundle).

    The NRI plugin's entry ends in ``--via nri``; an entry without it came from a hooks.d file,
    a base runtime spec or the toolkit's chain; none at all: the runtime wrapper adds it at
    create (its RuntimeClass), or nothing of compat-hook's routes this container.
    """
    if spec is None:
        return None
    hooks = spec.get("hooks") if isinstance(spec.get("hooks"), dict) else {}
    for stage in ("createContainer", "prestart", "createRuntime", "startContainer"):
        for h in hooks.get(stage) or []:
            args = h.get("args") if isinstance(h, dict) else None
            if not isinstance(args, list) or not any(isinstance(a, str) and _MARK in a for a in args):
                continue
            if args[-2:] == ["--via", "nri"]:
                return "nri: compat-hook's NRI plugin added the hook"
            return f"hook in the spec ({stage}: a hooks.d file, a base runtime spec or the wrapper)"
    return ("no compat-hook hook in the spec: only the runtime wrapper (RuntimeClass cuda-compat) "
            "would add it at create")


def _losers(hook, wrapper) -> list:
    """Each candidate dir the decision did not choose, and how it loses under the hook and under the wrapper."""
    by_dir = {x["dir"]: x for x in wrapper.losers}
    out = []
    for x in hook.losers:
        w = by_dir.get(x["dir"], {})
        out.append({"dir": x["dir"], "origin": x["origin"], "compat_version": x["compat_version"],
                    "ld_entries": x["ld_entries"], "links": x["links"], "dropins": x["dropins"],
                    "hook": list(x["how"]), "wrapper": list(w.get("how", []))})
    return out


def _summary(r: dict) -> str:
    """One line: what the toolkit alone does, what compat-hook decides, what takes effect."""
    tk = r["toolkit"]
    lib = {"compat": "compat library", "host": "host library"}
    tk_part = "toolkit: would enable" if tk["enables"] else "toolkit: would not enable"
    ours = f"compat-hook: {r['decision']} {r['reason']}"
    with_hook, alone = tk["with_hook"], tk["alone"]
    line = f"{tk_part}; {ours} -> {lib[with_hook['result']]}"
    if with_hook["result"] == "compat" and with_hook.get("dir"):
        line += f" ({with_hook['dir']})"
    if r["effect"] == "leave":
        line += f" (left as the image and the toolkit set it: {alone['by']})"
    elif with_hook["result"] != alone["result"] or with_hook.get("dir") != alone.get("dir"):
        line += ", compat-hook overrides it"
        if with_hook["result"] == alone["result"] == "compat" and alone.get("dir"):
            line += f" (alone: the compat library in {alone['dir']})"
    if tk["with_wrapper"]["result"] != with_hook["result"]:
        line += f"; with the wrapper: {lib[tk['with_wrapper']['result']]}"
    return line


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
        ids = ", ".join(x for x in (f"minor {g['minor']}" if g.get("minor") is not None else None,
                                    g.get("uuid")) if x)
        out.append(f"  GPU {g['index'] if g.get('index') is not None else '?'} {g['bus_id']}: {g['model'] or '?'}  "
                   f"brand {g['brand_name']} (from {g['brand_source']})" + (f"  [{ids}]" if ids else ""))
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
        first = " (the first found; the ELF lines below are its)" if img.get("others") else ""
        out.append(f"  candidate{first}: {img['compat_dir']}/{img['candidate']}  (version {img['compat_version']})")
    elif img["candidates"]:
        out.append(f"  candidates: {', '.join(img['candidates'])}")
    for o in img.get("others", []):
        what = o["candidate"] or ", ".join(o["candidates"])
        out.append(f"  also a candidate ({o['origin']}): {o['compat_dir']}/{what}  (version {o['compat_version']})")
    for o in [img] + img.get("others", []):
        if o.get("prefix"):
            pkg = f", package {o['package']}" if o.get("package") else ""
            out.append(f"  conda prefix {o['prefix']}{pkg}: " + (f"{len(o['links'])} link(s) in lib/ into "
                       f"{o['compat_dir']} ({', '.join(o['links'])})" if o["links"] else "no links in lib/"))
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
    for o in [img] + img.get("others", []):
        for n, t in (o.get("link_targets") or {}).items():
            out.append(f"  symlinked candidate: {o['compat_dir']}/{n} -> {t}")
    for u in img.get("userland") or []:
        how = f"through {u['via']}" if u.get("via") else "no link leads to it: an absolute path or ldconfig's link"
        out.append(f"  userland libcuda: {u['path']} (version {u['version']}, {how})")
    for d, name in (report.get("ldconfig_picks") or {}).items():
        out.append(f"  ldconfig links {d}/libcuda.so.1 -> {name} (the highest version of the dir)")
    for n in img["notes"]:
        out.append(f"  note: {n}")
    out.append("container:")
    out.append(f"  GPU requested: {'yes' if req['gpu_requested'] else 'no'}, {req['gpu_reason']}")
    if report.get("path"):
        out.append(f"  path: {report['path']}")
    if req["disabled"]:
        out.append(f"  opted out: {req['disabled_reason']}")
    if req["required_cuda"]:
        out.append(f"  needs CUDA {req['required_cuda']} (from {req['required_cuda_source']})")
    checked = report["details"].get("gpus_checked") if isinstance(report["details"], dict) else None
    if checked:
        out.append(f"  GPUs checked: {', '.join(checked['gpus']) or 'none'} ({checked['why']})")
    if report.get("store"):
        s = report["store"]
        out.append(f"host store: {s['decision']} ({s['reason']})")
    if report["compat_dropins"]:
        for d in report["compat_dropins"]:
            where = f"/etc/{d['file']}" if d["file"].startswith("ld.so.conf:") else f"/etc/ld.so.conf.d/{d['file']}"
            out.append(f"  compat drop-in: {where} -> {', '.join(d['dirs'])} ({d['by']})")
    if report["ld_library_path_compat"]:
        out.append(f"  LD_LIBRARY_PATH names compat dirs: {', '.join(report['ld_library_path_compat'])}")
    if report.get("compat_dirs"):
        out.append("compat dirs (each decided alone; the newest that may be used is chosen):")
        for c in report["compat_dirs"]:
            out.append(f"  {c['dir']} ({c['origin']}, {c['compat_version']}): {c['decision']}"
                       + ("  <- chosen" if c["chosen"] else ""))
    for x in report.get("losing_compat_dirs") or []:
        out.append(f"  loses: {x['dir']}")
        for how in x["hook"]:
            out.append(f"    hook: {how}")
        for how in x["wrapper"]:
            out.append(f"    with the wrapper: {how}")
    tk = report["toolkit"]
    out.append("NVIDIA toolkit (enable-cuda-compat, v1.20 rules):")
    if tk.get("root") and tk["root"] != "/usr/local/cuda/compat":
        out.append(f"  looks in {tk['root']} only (a Jetson Orin host: its CSV mode's compat root)")
    out.append(f"  would {'enable' if tk['enables'] else 'not enable'}: {tk['why']}")
    out.append(f"  alone, the container loads the {tk['alone']['result']} library ({tk['alone']['by']})")
    out.append("the container maps (the loader's order: LD_LIBRARY_PATH, the program's env, the ld cache):")
    for key, label in (("alone", "without compat-hook"), ("with_hook", "with the hook"),
                       ("with_wrapper", "with the wrapper")):
        res = tk.get(key) or {}
        out.append(f"  {label}: {res.get('maps') or 'the ' + str(res.get('result')) + ' library'}; {res.get('by')}")
    for n in report["notes"]:
        out.append(f"note: {n}")
    out.append("would change:")
    for actor, changes in report["effects"].items():
        label = "hook (createContainer)" if actor == "hook" else "wrapper (config.json)"
        for c in changes or ["nothing"]:
            out.append(f"  {label}: {c}")
    out.append(f"result: {report['summary']}")
    out.append("(explain changes nothing)")
    return "\n".join(out) + "\n"
