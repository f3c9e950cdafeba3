"""The one assessment: a container, host facts and the config in; facts, the decision and
every actor's planned effects out, as plain data.

The hook, the runtime wrapper, ``explain`` and ``plan`` all call
:func:`assess` and then only carry out (or print) what it planned, so what
``explain`` shows is by construction what the hook and the wrapper do.

Actors and their effects:

* **hook** (files in the rootfs, :mod:`compat_hook.effects.ldcache`): our drop-in
  ``/etc/ld.so.conf.d/00-00-compat-hook.conf`` naming the compat dir (the
  decision enables), or the dir holding the host driver's library (compat
  is wrong here: the decision's ``effect`` is ``"host"``), or none (removed
  if an earlier start left one); then the ld cache refresh. A host-store
  package is bind-mounted by the hook only at createContainer
  (:mod:`compat_hook.effects.mounts`). Where compat is wrong but the host driver's
  library cannot be named (it is in the container only as ``libcuda.so.1``,
  not ``libcuda.so.<version>``, and no spec mount says where), the compat
  dirs the image's ld.so.conf.d drop-ins name are hidden instead (an empty
  read-only tmpfs, createContainer only) and the cache rebuilt; outside the
  container's mount namespace the log says so and how to fix it.
* **wrapper** (edits of ``config.json``, :mod:`compat_hook.effects.specedit`):
  ``LD_LIBRARY_PATH`` (env mode: the compat dir first; effect ``host``:
  compat dirs taken off), the host-store mount, and compat-hook's
  createContainer hook when the ld cache must change (``wrapper_add_hook``).

Every candidate dir the decision did not choose (all of them when compat is
wrong here) *loses*, whatever names it (:attr:`Assessment.losers`): an
``LD_LIBRARY_PATH`` entry resolving to it is taken off by the wrapper (in every
mode; in ldconfig mode the chosen dir's own entry stays) or, hook only, hidden
under an empty read-only tmpfs; conda's links in ``$PREFIX/lib`` (searched
before the ld cache by the env's RUNPATH) are made to dangle by hiding the
``cuda-compat`` dir they point into, and the wrapper adds the hook that does
it; a drop-in naming it loses to compat-hook's, which sorts first.

Policy that belongs to no single actor lives here once: which decisions
leave the container alone (:attr:`Decision.effect`), the env-mode rule,
store decisions seen at their container path, the warnings.
"""

from __future__ import annotations

__all__ = ["Assessment", "assess", "hook_in_spec"]

#: The hook's drop-in is written for these effects (env mode leaves an image
#: compat dir to the wrapper's LD_LIBRARY_PATH).
_HOST_DRIVER_SOURCES = ("/proc/driver/nvidia/version", "/sys/module/nvidia/version",
                        "libcuda.so.X.Y[.Z] in driver_lib_dirs")


class Assessment:
    """What :func:`assess` found and planned. Plain data; :meth:`to_dict` for JSON."""

    __slots__ = ("request", "host", "image", "decision", "image_decision", "store", "effect",
                 "hook_target", "hook_purpose", "hook", "hook_mount", "hook_masks", "hook_refresh",
                 "existing_dropin", "wrapper", "spec_edits", "new_spec", "warnings", "notes", "dropins",
                 "ld_compat_entries", "toolkit", "actors", "losers", "ldconf", "maps",
                 "wrapper_adds_hook", "maps_uncertain", "host_over", "compat_over", "shadowed")

    def __init__(self) -> None:
        self.request = None
        self.host = None            # HostFacts, or None (opt-out / no GPU: not read)
        self.image = None           # ImageFacts, or None
        self.decision = None        # the Decision that takes effect
        self.image_decision = None  # the decision on the image's own compat driver
        self.store = None           # the host-store Decision, when one was asked
        self.effect = "leave"       # compat | host | leave
        self.hook_target = None     # the dir our drop-in must name, or None
        self.hook_purpose = "compat"
        self.hook: list = []        # ldcache actions: [(action, arg)]
        self.hook_mount = None      # (host dir, container target) the hook bind-mounts
        self.hook_masks: list = []  # container dirs the hook hides under an empty read-only tmpfs
        self.hook_refresh = False   # the ld cache must be rebuilt after the masks (it points into them)
        self.existing_dropin = None
        self.wrapper: dict = {}     # keyword arguments of specedit.plan
        self.spec_edits: list = []  # what specedit.plan reports it would change
        self.new_spec = None        # the spec with those edits (the original is never modified)
        self.warnings: list = []
        self.notes: list = []
        self.dropins: list = []     # compat drop-ins the image (or the toolkit) put in ld.so.conf.d
        self.ld_compat_entries: list = []  # compat dirs on the image's LD_LIBRARY_PATH
        self.toolkit = None         # what the NVIDIA toolkit alone would do (explain, plan)
        self.actors: tuple = ()
        self.losers: list = []      # candidate dirs the decision did not choose, and what names them
        self.ldconf = None          # ldconfig's reading of the image (facts/loader.LdConf)
        self.maps = None            # the libcuda the container maps, as the loader model predicts (toolkit=True)
        self.wrapper_adds_hook = False  # the wrapper's spec runs compat-hook's createContainer hook
        self.maps_uncertain = False     # a warning says the decision may not take effect here
        self.host_over: list = []       # the host's libcuda over each compat file (policy/hostover)
        self.compat_over: list = []     # the chosen compat libcuda (and companions) over what shadows it (policy/shadow)
        self.shadowed: list = []        # LD_LIBRARY_PATH entries whose libcuda.so.1 the hook covers with it

    def replan_hook(self, existing: str | None) -> list:
        """The hook's ld cache actions given the drop-in found now (under the lock)."""
        from ..effects.ldcache import plan_for

        return plan_for(self.hook_target is not None, self.hook_target, existing, self.hook_purpose,
                        self.hook_refresh)

    def log_fields(self) -> dict:
        """The decision's fields of the one JSON log line."""
        d, img, host, req = self.decision, self.image, self.host, self.request
        out: dict = {}
        if req is not None:
            out.update(req.labels)
        if host is not None:
            out["host_driver_version"] = host.to_dict()["driver_version"]
            out["host_driver_source"] = host.driver_source
            if host.driver_version is None:
                out["host_driver_tried"] = ([host.driver_source] if host.driver_source else
                                            list(_HOST_DRIVER_SOURCES)) + list(host.notes)
        if img is not None:
            # the chosen candidate's file (the image may carry several compat dirs)
            out["candidate"] = (d.details.get("candidate", img.candidate)
                                if d.source == "image" and isinstance(d.details, dict) else img.candidate)
            out["elf_source"] = img.elf_source
        out.update(decision=d.action, reason=d.reason, effect=self.effect, compat_dir=d.compat_dir,
                   compat_version=d.compat_version or (img.compat_version_text if img is not None else None))
        if self.store is not None:
            out["store"] = {"decision": self.store.action, "reason": self.store.reason,
                            "version": self.store.compat_version}
        if self.hook_purpose == "host" and self.hook_target:
            out["host_lib_dir"] = self.hook_target
        checked = d.details.get("gpus_checked") if isinstance(d.details, dict) else None
        if checked:
            out["gpus_checked"] = checked
        if self.dropins:
            out["compat_dropins"] = [f"{x['file']} ({x['by']})" for x in self.dropins]
        # what the container maps: the model's (explain, plan), else what compat-hook makes it map,
        # said only where no warning says this start cannot get it
        maps = self.maps or (None if self.warnings else self._intended_lib())
        if maps:
            out["maps"] = maps
        if self.ld_compat_entries:
            out["ld_library_path_compat"] = list(self.ld_compat_entries)
        cands = d.details.get("compat_dirs") if isinstance(d.details, dict) else None
        if cands:
            out["compat_dirs"] = [f"{c['dir']} ({c['origin']}): {c['decision']}" + (" (chosen)" if c["chosen"] else "")
                                 for c in cands]
        if self.losers:
            out["losing_compat_dirs"] = [f"{x['dir']}: {'; '.join(x['how'])}" for x in self.losers]
        has_compat = img is not None and img.status in ("found", "ambiguous")
        if self.effect == "leave" and (d.reason == "opt_out" or has_compat or self.dropins
                                       or self.ld_compat_entries):
            # Said whether or not the toolkit's hook ran before us: it may run after.
            out["left_alone"] = (f"{d.reason}: compat-hook leaves whatever the image and the NVIDIA toolkit "
                                 "set up for compat as it is")
        warnings = list(d.warnings) + self.warnings
        if warnings:
            out["warnings"] = warnings
        if self.ldconf is not None and self.ldconf.incomplete:
            out["ld_so_conf_incomplete"] = self.ldconf.incomplete
        if self.host_over:
            # what now holds the host's library under a compat file's name (RPATH, preload, absolute dlopen)
            out["host_over_compat"] = [f"{x['target']} <- {x['source']} ({x['by']})" for x in self.host_over]
        if self.compat_over:
            # what now holds the chosen compat libcuda under a name the search reaches first (a stub, a driver dir)
            out["compat_over_shadow"] = [f"{x['target']} <- {x['source']} ({x['by']})" for x in self.compat_over]
        return out

    def _intended_lib(self):
        """The libcuda compat-hook makes the container map (its decision's file), where it acts."""
        d = self.decision
        if self.effect == "compat" and d.compat_dir:
            name = d.details.get("candidate") if isinstance(d.details, dict) else None
            name = name or (self.image.candidate if self.image is not None and d.source == "image" else None)
            return f"{d.compat_dir.rstrip('/')}/{name}" if name else None
        if self.effect == "host" and self.hook_purpose == "host" and self.hook_target and self.host is not None \
                and self.host.driver_text:
            return f"{self.hook_target.rstrip('/')}/libcuda.so.{self.host.driver_text}"
        return None

    def effects(self) -> dict:
        """Each actor's planned effects as the lines its log would carry."""
        from ..effects.ldcache import DROPIN_PATH

        hook = []
        for action, arg in self.hook:
            if action == "write_dropin":
                what = "the host driver's dir" if self.hook_purpose == "host" else "the compat dir"
                hook.append(f"write {DROPIN_PATH} naming {arg} ({what})")
            elif action == "remove_dropin":
                hook.append(f"remove {DROPIN_PATH}")
            elif action == "ldconfig":
                hook.append("refresh the container's ld cache (ldconfig -r)")
        # in the order the hook acts: the chosen compat libcuda over what shadows it (effect compat), the host's
        # libcuda over each compat file (effect host), then each mask, followed by the compat file it keeps as
        # the host's
        first: list = []
        for x in self.compat_over:
            if x["kind"] == "companion":
                what = ("the chosen compat dir's file of that library" if x.get("in_rootfs") else
                        "nothing the loader maps (the compat dir has no file of that library)")
                first.append(f"bind-mount {x['source']} over {x['target']} (ro, createContainer): {what} over "
                             f"the driver companion that {x['via']} on LD_LIBRARY_PATH reaches first")
                continue
            first.append(f"bind-mount {x['source']} over {x['target']} (ro, createContainer): the chosen compat "
                         f"libcuda over {'the host driver' if x['kind'] == 'host' else 'a libcuda'} that "
                         f"{x['via']} on LD_LIBRARY_PATH reaches first")
        for x in [x for x in self.host_over if x["by"] == "hook" and not x.get("mask")]:
            first.append(_over_line(x))
        for d in self.hook_masks:
            kept = [x for x in self.host_over if x["by"] == "hook" and x.get("mask") == d]
            names = ", ".join(x["target"].rsplit("/", 1)[1] for x in kept)
            first.append(f"mask {d} with a read-only tmpfs holding only {names}, the host's libcuda (createContainer)"
                         if kept else f"mask {d} with an empty read-only tmpfs (createContainer)")
            first += [_over_line(x) for x in kept]
        hook[:0] = first
        if self.hook_mount is not None:
            hook.insert(0, f"bind-mount {self.hook_mount[0]} at {self.hook_mount[1]} (ro, createContainer)")
        return {"hook": hook, "wrapper": list(self.spec_edits)}

    def to_dict(self) -> dict:
        d = self.decision
        img = self.image
        return {
            "decision": d.action, "reason": d.reason, "message": d.message, "effect": self.effect,
            "compat_dir": d.compat_dir,
            "compat_version": d.compat_version or (img.compat_version_text if img is not None else None),
            "source": d.source, "warnings": list(d.warnings) + self.warnings, "details": d.details,
            "notes": list(self.notes),
            "store": self.store.to_dict() if self.store is not None else None,
            "effects": self.effects(), "hook_actions": [list(a) for a in self.hook],
            "hook_target": self.hook_target, "hook_purpose": self.hook_purpose,
            "compat_dropins": list(self.dropins), "ld_library_path_compat": list(self.ld_compat_entries),
            "losing_compat_dirs": [dict(x) for x in self.losers], "toolkit": self.toolkit,
            "ld_so_conf_incomplete": self.ldconf.incomplete if self.ldconf is not None else None,
            "host_over_compat": [dict(x) for x in self.host_over],
            "compat_over_shadow": [dict(x) for x in self.compat_over],
        }


def _hook_stage(spec):
    """The stage compat-hook's hook runs at in ``spec`` (the createContainer one when there are several), or ``None``."""
    hooks = spec.get("hooks") if isinstance(spec, dict) else None
    found = None
    for stage, entries in hooks.items() if isinstance(hooks, dict) else ():
        for h in entries if isinstance(entries, list) else ():
            args = h.get("args") if isinstance(h, dict) else None
            if isinstance(args, list) and "hook" in args and any(
                    isinstance(x, str) and ("compat_hook" in x or x.endswith("compat-hook")) for x in args):
                if stage == "createContainer":
                    return stage
                found = stage
    return found


def hook_in_spec(spec) -> bool:
    """Whether the spec already runs compat-hook's hook (hooks.d, CDI or an earlier wrapper)."""
    hooks = spec.get("hooks") if isinstance(spec, dict) else None
    for entries in hooks.values() if isinstance(hooks, dict) else ():
        for h in entries if isinstance(entries, list) else ():
            args = h.get("args") if isinstance(h, dict) else None
            if isinstance(args, list) and "hook" in args and any(
                    isinstance(a, str) and ("compat_hook" in a or a.endswith("compat-hook")) for a in args):
                return True
    return False


def _ld_entries(request, known, root=None, cands=()) -> list:
    """The ``LD_LIBRARY_PATH`` entries naming a compat dir: by name, or resolving into a candidate dir."""
    from ..core.ldpath import is_compat_entry

    value = request.env.get("LD_LIBRARY_PATH") if request is not None else None
    if not value:
        return []
    out = []
    for e in value.split(":")[:64]:
        if is_compat_entry(e, known) or (root is not None and e.startswith("/") and any(
                _resolves_into(root, e, c.compat_dir) for c in cands)):
            out.append(e)
    return out


#: The files a driver dir may hold: compat-hook hides a dir not named like a compat dir only
#: when it holds nothing else (an app's lib dir, its own dir, keep working).
_DRIVER_FILES = ("libcuda.so", "libcudadebugger.so", "libnvidia-")


def _removable(root, d: str) -> bool:
    """Whether the candidate dir ``d`` may be hidden or taken off ``LD_LIBRARY_PATH`` as a whole."""
    from ..core.ldpath import is_compat_entry

    if is_compat_entry(d):
        return True
    if root is None or d in _SYSTEM_DIRS:
        return False
    try:
        entries = root.listdir(d)
    except (OSError, ValueError):
        return False
    return bool(entries) and len(entries) <= 256 and all(
        kind in ("file", "symlink") and n.startswith(_DRIVER_FILES) for n, kind in entries)


def assess(config, request, root, *, spec=None, host=None, state_dir=None,
           actors=("hook", "wrapper"), mount_ns: bool = True, stage: str | None = None,
           toolkit: bool = False, hook_entry=None, full: bool = False) -> Assessment:
    """Assess one container start.

    ``request``: :class:`~compat_hook.facts.container.Request`; ``root``: the
    container filesystem (:class:`~compat_hook.facts.rootfs.Root` or an image view
    with the same reading methods); ``spec``: the parsed config.json (a dict;
    needed for the wrapper's plan); ``host``: given
    :class:`~compat_hook.facts.hostfacts.HostFacts` (a hypothetical host for
    ``plan``), else read; ``state_dir``: the ELF cache (None: not used);
    ``actors``: whose effects to plan; ``mount_ns``: the hook runs in the
    container's mount namespace (createContainer), so it can bind-mount a
    store package; ``stage``: the hook's stage at a real container start, which
    decides ``mount_ns`` instead (a GPU container's hook, in the container's
    mount namespace: :func:`compat_hook.effects.mounts.in_container_mount_ns`);
    ``toolkit``: also work out what the NVIDIA toolkit alone
    would do; ``hook_entry``: a callable returning the hook entry the wrapper
    adds; ``full``: gather every fact even where rule 1 alone decides (explain).
    """
    from .decision import decide, decide_request

    if stage is not None:
        from ..effects.mounts import in_container_mount_ns

        mount_ns = bool(request.gpu_requested and not request.disabled and in_container_mount_ns(stage))
    a = Assessment()
    a.request = request
    a.actors = tuple(actors)
    first = decide_request(request, config)
    known = set(config.compat_dirs) | {config.store_target}
    if first is not None and not full:
        # Fast path: an opted-out or non-GPU container needs no facts.
        a.decision = a.image_decision = first
    else:
        from ..facts import hostfacts, imagefacts, loader
        from ..effects.ldcache import DROPIN_NAME

        a.ldconf = loader.ld_so_conf(root, skip=DROPIN_NAME) if root is not None else None
        if a.ldconf is not None and a.ldconf.incomplete:
            # a reading stopped at a bound or its deadline: the decision goes on with what was read
            a.warnings.append(f"{a.ldconf.why_incomplete()} (ldconfig's order is judged from what was read)")
        a.image = imagefacts.gather(root, config, state_dir=state_dir,
                                    env=request.env if request is not None else None,
                                    cwd=request.cwd if request is not None else None, conf=a.ldconf,
                                    exe=request.exe if request is not None else None,
                                    extra_ld=request.ld_before_wrapper() if request is not None else (),
                                    userland=full)
        a.host = host if host is not None else hostfacts.gather(config)
        a.decision = a.image_decision = decide(a.host, a.image, request, config)
        # Only a dir whose libcuda may go (a compat dir by name, or one of driver libraries only)
        # may come off LD_LIBRARY_PATH or be hidden: an app's own dir keeps everything else it holds.
        removable = [c.compat_dir for c in a.image.all() if _removable(root, c.compat_dir)]
        known.update(removable)
        if a.image.status == "none" and config.store_inject:
            from . import storefacts

            a.store = storefacts.decide_for(a.host, request, config)
            if a.store.enable:
                if spec is not None and _mount_at(spec, config.store_target):
                    a.notes.append(f"store package not used: the spec mounts something at "
                                   f"{config.store_target} already")
                elif "wrapper" not in a.actors and not mount_ns:
                    a.notes.append("store package not used: the hook mounts one only in the container's "
                                   "mount namespace (register it at createContainer, or use the wrapper)")
                else:
                    a.decision = a.store.mounted_at(config.store_target)
        if a.image.status != "none" or toolkit or full:
            # Without a compat libcuda in the image no drop-in of it can matter;
            # a GPU container without compat libs is the common start (hot path).
            a.dropins, notes = imagefacts.compat_dropins(root, conf=a.ldconf,
                                                         dirs=[c.compat_dir for c in a.image.all()])
            a.notes.extend(notes)
            a.ld_compat_entries = _ld_entries(request, known, root, [c for c in a.image.all()])
            # an entry naming a candidate dir by another path (a link to it) comes off by that very string
            known.update(e for e in a.ld_compat_entries if any(
                _resolves_into(root, e, d) for d in removable))
    a.effect = a.decision.effect
    _find_losers(a, config, root)
    _plan_hook(a, config, root, mount_ns)
    # only where the host's driver is chosen over compat files the image carries (off the hot path)
    over = a.effect == "host" and a.image is not None and a.image.status != "none"
    if over and not full and root is not None:
        # a userland libcuda in a system lib dir takes the host's place too: read only on this path
        from ..facts.imagefacts import userland_libcuda

        a.image.userland = userland_libcuda(root)
    if over and "wrapper" in a.actors:  # the wrapper's spec mounts, before its other edits
        from . import hostover

        hostover.plan(a, config, root, mount_ns)
    if a.effect == "compat" and a.image is not None and request is not None and request.env.get("LD_LIBRARY_PATH"):
        # only where the image's own LD_LIBRARY_PATH may reach a libcuda before the chosen dir
        from . import shadow

        shadow.plan(a, config, root, mount_ns)
    if "wrapper" in a.actors:
        _plan_wrapper(a, config, spec, known, hook_entry, root)
    # A hook cannot take an entry off the environment, but in the container's mount
    # namespace it can make the dir empty: the loader then finds no libcuda there and
    # falls back to the ld cache, where our drop-in's dir comes first.
    if a.effect == "host":
        ld_losers = list(a.ld_compat_entries)
    else:
        ld_losers = [e for x in a.losers for e in x["ld_entries"]]
    if ld_losers and "wrapper" not in a.actors and mount_ns and root is not None:
        _plan_masks(a, root, ld_losers, "LD_LIBRARY_PATH entry")
    elif ld_losers and "wrapper" not in a.actors:
        a.warnings.append(
            f"the image's LD_LIBRARY_PATH names {', '.join(ld_losers)}, a compat dir that must not "
            f"be used {_not_used_why(a)}, and a hook outside the container's mount namespace "
            "(prestart, createRuntime) can neither change the environment nor hide the dir: register the "
            "hook at createContainer, or compat-hook's runtime wrapper (compat-hook install "
            "containerd|docker|crio), which takes it off, or remove it from the image")
    # conda's links in $PREFIX/lib come before the ld cache (RUNPATH) and may be on
    # LD_LIBRARY_PATH as $PREFIX/lib: hiding the cuda-compat dir they point into makes
    # every one of them dangle, and the loader goes on to the next dir.
    linked = [x for x in a.losers if x["links"]]
    _hide_or_warn(a, root, mount_ns, linked, "conda's cuda-compat dir",
                  f"{', '.join(x['links'][0] for x in linked)} links into {', '.join(x['dir'] for x in linked)}, "
                  f"conda's compat driver, which must not be used {_not_used_why(a)}")
    # A line ldconfig reads before compat-hook's drop-in (a line of /etc/ld.so.conf before its
    # include, a drop-in sorting first) beats ours in the cache: the dir it names must go.
    early = [x for x in a.losers if x["early"] and x["dir"] not in a.hook_masks]
    _hide_or_warn(a, root, mount_ns, early, "a dir ldconfig reads before compat-hook's drop-in",
                  f"{', '.join(x['early'][0] for x in early)} names {', '.join(x['dir'] for x in early)}, a compat "
                  f"dir that must not be used {_not_used_why(a)}, before compat-hook's drop-in")
    if over and "wrapper" not in a.actors:
        # the hook's: after every mask is planned, a dir it masks keeps its libcuda as the host's
        from . import hostover

        hostover.plan(a, config, root, mount_ns)
    if a.effect == "compat" and a.decision.source == "image" and "hook" in a.actors and "wrapper" not in a.actors:
        first = _host_first_on_ld_path(a, root)
        if first is not None and any(x["via"].startswith(first.rstrip("/") + "/") for x in a.compat_over):
            pass  # the hook puts the compat libcuda over the host's there (policy/shadow)
        elif first is not None:
            a.warnings.append(
                f"the image's LD_LIBRARY_PATH names {first}, which holds the host driver's libcuda, before "
                f"{a.decision.compat_dir}: the loader maps the host's, and a hook cannot change the environment; "
                "use compat-hook's runtime wrapper (compat-hook install containerd|docker|crio), which puts "
                "the compat dir first, or take the entry off the image")
        elif a.hook_target is None and config.mode == "env" and not _ld_path_leads_to(a, root, a.decision.compat_dir):
            # (a hook the wrapper added meets the LD_LIBRARY_PATH the wrapper wrote: the compat dir first)
            a.warnings.append(
                f"mode: env: the hook writes no drop-in for {a.decision.compat_dir} (the runtime wrapper puts it on "
                "LD_LIBRARY_PATH), so with the hook alone this start does not get the compat driver: use the "
                "wrapper, or mode: ldconfig")
    for x in a.losers:
        x["how"] = _how_it_loses(a, config, x)
    if (a.effect in ("compat", "host") and a.ldconf is not None and a.ldconf.dropin_key(DROPIN_NAME_) is None
            and a.hook_target is not None and "hook" in a.actors):
        a.notes.append("/etc/ld.so.conf includes no /etc/ld.so.conf.d/*.conf: the hook names the dir on "
                       "ldconfig's command line too (a later ldconfig by another hook would drop it)")
    if toolkit:
        _toolkit_view(a, root, config)
    return a


def _hide_or_warn(a: Assessment, root, mount_ns: bool, losers: list, what: str, why: str) -> None:
    """Hide the losing dirs that would beat the chosen library (the hook, in the container's mount
    namespace), or say that this registration cannot (a hook outside it, without the wrapper)."""
    if not losers or "hook" not in a.actors:
        return
    if mount_ns and root is not None:
        if _plan_masks(a, root, [x["dir"] for x in losers], what):
            a.hook_refresh = True
            a.hook = a.replan_hook(a.existing_dropin)
    elif "wrapper" not in a.actors:
        a.warnings.append(
            f"{why}, and a hook outside the container's mount namespace (prestart, createRuntime) cannot hide "
            "it: register the hook at createContainer, or use compat-hook's runtime wrapper (compat-hook "
            "install containerd|docker|crio)")


def _not_used_why(a: Assessment) -> str:
    if a.effect == "compat":
        return f"beside the chosen {a.decision.compat_dir}"
    return "on this host (error 803/804)"


def _resolves_into(root, entry: str, d: str) -> bool:
    if root is None:
        return entry.rstrip("/") == d
    try:
        r = root.realpath(entry)
    except (OSError, ValueError):
        return False
    return r == d or r.startswith(d.rstrip("/") + "/")


def _ld_path_leads_to(a: Assessment, root, d: str | None) -> bool:
    """Whether the container's ``LD_LIBRARY_PATH`` reaches the dir ``d`` before any other dir holding a
    ``libcuda.so.1`` (resolved in the root; a missing or unreadable entry is passed over, as the loader does)."""
    if root is None or d is None or a.request is None:
        return False
    for e in (a.request.env.get("LD_LIBRARY_PATH") or "").replace(";", ":").split(":")[:64]:
        if not e.startswith("/"):
            continue
        try:
            r = root.realpath(e)
        except (OSError, ValueError):
            continue
        if r.rstrip("/") == d.rstrip("/"):
            return True
        if root.exists(r.rstrip("/") + "/libcuda.so.1"):
            return False
    return False


def _over_line(x: dict) -> str:
    """explain's line for one of the hook's binds of the host's libcuda (or ``/dev/null``) over a compat file."""
    src = f"{x['source']} (in the container)" if x.get("in_rootfs") else x["source"]
    return (f"bind-mount {src} over {x['target']} (ro, createContainer): "
            + {"libcuda": "the host's libcuda", "userland": "the host's libcuda over the image's userland driver",
               "shadow": "the host's libcuda over a libcuda LD_LIBRARY_PATH reaches (a stub, the image's own)"}
            .get(x["kind"], "a compat companion masked"))


def _find_losers(a: Assessment, config, root) -> None:
    """Every candidate dir the decision did not choose, with what names it (``a.losers``).

    Only where compat-hook acts (effect ``compat`` or ``host``): a left-alone
    container keeps whatever the image and the NVIDIA toolkit set up.
    """
    if a.effect not in ("compat", "host") or a.image is None:
        return
    d = a.decision
    chosen = d.compat_dir if a.effect == "compat" and d.source == "image" else None
    for c in a.image.all():
        if chosen is not None and (c.compat_dir == chosen or chosen.startswith(c.compat_dir.rstrip("/") + "/")):
            continue
        naming = [x for x in a.dropins if any(_resolves_into(root, e, c.compat_dir) for e in x["dirs"])]
        ours = _our_key(a)
        # read by ldconfig before compat-hook's drop-in: it would beat ours in the ld cache
        early = [_where(x) for x in naming if ours is None or x.get("key") is None or x["key"] < ours]
        a.losers.append({"dir": c.compat_dir, "origin": c.origin, "compat_version": c.compat_version_text,
                         "ld_entries": [e for e in a.ld_compat_entries if _resolves_into(root, e, c.compat_dir)],
                         "links": list(c.links), "dropins": [_where(x) for x in naming], "early": early,
                         "how": []})


DROPIN_NAME_ = "00-00-compat-hook.conf"  # effects/ldcache.DROPIN_NAME, without importing it here


def _where(x: dict) -> str:
    """Where a line of ldconfig's configuration is, for a person: the drop-in's path or ``/etc/ld.so.conf:N``."""
    f = x["file"]
    return f"/etc/{f}" if f.startswith("ld.so.conf:") else f"/etc/ld.so.conf.d/{f}"


def _our_key(a: Assessment):
    """Where ldconfig reads compat-hook's drop-in (``None``: no include reads it)."""
    from ..effects.ldcache import DROPIN_NAME

    if a.ldconf is None:
        return None
    key = a.ldconf.dropin_key(DROPIN_NAME)
    # no include reads it: the hook names its dir on ldconfig's command line, read before any line
    return key if key is not None else (-1.0, "")


def _how_it_loses(a: Assessment, config, x: dict) -> list:
    """How one losing dir is kept from loading, in words (the log line, explain)."""
    how = []
    masked = x["dir"] in a.hook_masks
    if masked:
        kept = [o["target"].rsplit("/", 1)[1] for o in a.host_over if o.get("mask") == x["dir"]]
        how.append(f"hidden under a read-only tmpfs keeping only {', '.join(kept)} as the host's libcuda "
                   "(createContainer)" if kept else "hidden under an empty read-only tmpfs (createContainer)")
    if x["ld_entries"]:
        if "wrapper" in a.actors and (a.wrapper.get("strip") or a.wrapper.get("ld_dir")):
            how.append(f"LD_LIBRARY_PATH entry {', '.join(x['ld_entries'])} taken off by the wrapper")
        elif not masked:
            how.append(f"LD_LIBRARY_PATH names it: {', '.join(x['ld_entries'])} (see the warning)"
                       if "wrapper" not in a.actors else
                       f"LD_LIBRARY_PATH names it: {', '.join(x['ld_entries'])}")
    if x["links"] and not masked:
        how.append(f"{', '.join(x['links'])} link into it: the hook the wrapper adds hides it"
                   if "wrapper" in a.actors else f"{', '.join(x['links'])} link into it (see the warning)")
    if x["dropins"] and not masked:
        late = [f for f in x["dropins"] if f not in x.get("early", ())]
        if late:
            how.append(f"{', '.join(late)} names it: compat-hook's drop-in is read first"
                       if a.hook_target is not None or (a.effect == "compat" and config.mode != "env")
                       else f"{', '.join(late)} names it")
        if x.get("early"):
            how.append(f"{', '.join(x['early'])} names it before compat-hook's drop-in"
                       + (" (see the warning)" if "wrapper" not in a.actors else ": the hook the wrapper adds hides it"))
    elif x["dropins"]:
        how.append(f"{', '.join(x['dropins'])} names it")
    over = [y for y in a.host_over if y["target"].startswith(x["dir"].rstrip("/") + "/") and y["kind"] == "libcuda"]
    if over:
        how.append(f"the host's libcuda bind-mounted over {', '.join(y['target'] for y in over)} "
                   f"(by the {over[0]['by']}): a path, RPATH or preload naming it maps the host's")
    if not how:
        how.append("nothing names it: the loader never looks there")
    return how


def _plan_masks(a: Assessment, root, entries, what: str) -> list:
    """Add the compat dirs ``entries`` name (resolved in the rootfs) to the hook's masks."""
    from ..core.ldpath import is_compat_entry

    added = []
    for e in entries:
        try:
            d = root.realpath(e)
        except OSError:
            continue
        # Only a dir that still is a compat dir once resolved (by its name, or a candidate
        # dir holding a compat driver that is no system dir): an image linking the compat
        # dir to /etc must not get its /etc hidden (and our drop-in with it).
        if root.is_dir(d) and (is_compat_entry(d) or _candidate_dir_we_may_hide(a, d, root)):
            if d not in a.hook_masks:
                a.hook_masks.append(d)
                added.append(d)
        elif d not in a.hook_masks:
            a.notes.append(f"{what} {e} resolves to {d}, not a compat dir: not masked")
            if what != "drop-in entry" and any(c.compat_dir == d for c in (a.image.all() if a.image is not None
                                                                              else ())):
                a.warnings.append(
                    f"{d} holds a compat libcuda that must not be used {_not_used_why(a)}, and other files "
                    f"compat-hook must not hide with it ({what} {e}): take the compat driver out of it, or "
                    "put it in a dir of its own")
                a.maps_uncertain = True
    return added


#: Dirs never hidden, even holding a compat driver: the system's, and every dir above them.
_SYSTEM_DIRS = ("/", "/etc", "/usr", "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local", "/usr/local/lib",
                "/bin", "/sbin", "/usr/bin", "/usr/sbin", "/opt", "/home", "/root", "/var", "/tmp", "/proc",
                "/dev", "/sys", "/run")


def _candidate_dir_we_may_hide(a: Assessment, d: str, root=None) -> bool:
    """A candidate dir (it holds a compat driver) that is not a system dir nor above what must stay.

    ``/opt/nvidia/compat`` a drop-in names, ``/opt/compat/lib`` on a line of
    ``/etc/ld.so.conf``: hiding them is what makes them lose.
    """
    from ..facts.imagefacts import CONTAINER_LIB_DIRS

    if a.image is None or d in _SYSTEM_DIRS or d in CONTAINER_LIB_DIRS:
        return False
    if not any(c.compat_dir == d for c in a.image.all()):
        return False
    if not _removable(root, d):
        return False
    keep = ["/etc/ld.so.conf.d", a.hook_target or "", a.decision.compat_dir if a.effect == "compat" else ""]
    return not any(k == d or k.startswith(d.rstrip("/") + "/") for k in keep if k)


def _mounted_host_lib_dir(root, request, driver_text):
    """``(dir, path)``: where the spec bind-mounts the host driver's libcuda, or ``(None, None)``.

    A hand-written runtime config, a CDI spec or a device plugin may mount it
    as ``libcuda.so.1`` alone: the spec's mount names it where the rootfs
    only shows a placeholder (prestart) or a bind-mounted file of any name.
    Only a dir outside every compat dir counts, resolved in the rootfs.
    """
    if request is None:
        return None, None
    from ..core.ldpath import is_compat_entry

    names = ("libcuda.so.1",) + ((f"libcuda.so.{driver_text}",) if driver_text else ())
    for dest in request.libcuda_mounts():
        parent, _, name = dest.rpartition("/")
        if name not in names:
            continue
        try:
            resolved = root.realpath(parent or "/")
        except OSError:
            continue
        if not is_compat_entry(resolved) and "/compat" not in resolved and root.is_dir(resolved):
            return resolved, dest
    return None, None


def _mount_at(spec, target):
    from ..effects.specedit import mount_at

    return mount_at(spec, target) if isinstance(spec, dict) else None


def _plan_hook(a: Assessment, config, root, mount_ns: bool) -> None:
    from ..effects import ldcache

    d = a.decision
    if a.effect == "compat":
        if d.source == "store":
            # The wrapper mounts it (a spec mount) and puts it on LD_LIBRARY_PATH;
            # the hook alone mounts it itself and names it in the drop-in.
            if "wrapper" not in a.actors:
                a.hook_mount = (d.details.get("host_dir"), d.compat_dir)
                a.hook_target = d.compat_dir
        elif config.mode != "env":
            a.hook_target = d.compat_dir
        # env mode: the compat dir goes on LD_LIBRARY_PATH (the wrapper's job).
    elif a.effect == "host" and a.image is not None and a.image.status in ("found", "ambiguous"):
        from ..facts.imagefacts import host_lib_dir

        a.hook_purpose = "host"
        drv = a.host.driver_text if a.host is not None else None
        a.hook_target = host_lib_dir(root, drv)
        if a.hook_target is None and root is not None:
            a.hook_target, dest = _mounted_host_lib_dir(root, a.request, drv)
            if dest is not None:
                a.notes.append(f"the spec bind-mounts the host driver's library at {dest}: its dir goes first")
        if a.hook_target is None and a.dropins and "hook" in a.actors:
            # The ld cache cannot be made to prefer a library we cannot name, and the
            # image's drop-in keeps the compat dir first: the dir itself must go.
            dirs = [d for x in a.dropins for d in x["dirs"]]
            files = ", ".join(_where(x) for x in a.dropins)
            if mount_ns and root is not None:
                if _plan_masks(a, root, dirs, "drop-in entry"):
                    a.hook_refresh = True
                else:
                    a.warnings.append(
                        f"{files} names {', '.join(dirs)}, which must not be used on this host (error "
                        f"803/804), but resolves to no compat dir compat-hook may hide, and the host "
                        f"driver's library is not in the container as libcuda.so.{drv or '<version>'}: "
                        "mount the host library under its versioned name, or remove the drop-in from the image")
            elif "wrapper" not in a.actors:
                a.warnings.append(
                    f"{files} names {', '.join(dirs)}, a compat dir that must not be used on this host "
                    f"(error 803/804), and the host driver's library is not in the container as "
                    f"libcuda.so.{drv or '<version>'} (nor bind-mounted by the spec), so the ld cache "
                    "cannot be made to prefer it; a hook outside the container's mount namespace "
                    "(prestart, createRuntime) cannot hide the dir either: register the hook at "
                    "createContainer, or use compat-hook's runtime wrapper (compat-hook install "
                    "containerd|docker|crio), or mount the host library as libcuda.so.<version>")
        elif a.hook_target is None:
            a.notes.append(f"no libcuda.so.{drv or '?'} of the host driver in "
                           "the container's library dirs: nothing to put first (it is mounted at "
                           "createContainer by the NVIDIA runtime)")
    if root is not None:
        a.existing_dropin = ldcache.current_dropin(root)
        a.hook = a.replan_hook(a.existing_dropin)


def _plan_wrapper(a: Assessment, config, spec, known, hook_entry, root=None) -> None:
    from ..effects import specedit

    d = a.decision
    from ..facts.container import ANNOTATION_LD_BEFORE

    # What comes off LD_LIBRARY_PATH is kept in an annotation: the hook added below then sees
    # the same candidate dirs as this assessment, and makes the same decision.
    kw: dict = {"known": sorted(known), "drop_oom": config.wrapper_drop_oom_score_adj,
                "record_ld": ANNOTATION_LD_BEFORE}
    # conda's links into a losing dir: only the hook can hide them (in the container's mount namespace)
    hook_work = (a.effect == "host" or a.existing_dropin is not None or bool(a.compat_over)
                 or any(x["links"] or x["early"] for x in a.losers))
    if a.effect == "compat" and d.source == "store":
        kw["mounts"] = [specedit.store_mount(d.details.get("host_dir"), d.compat_dir)]
        kw["ld_dir"] = d.compat_dir
    elif a.effect == "compat":
        if config.mode in ("env", "both"):
            kw["ld_dir"] = d.compat_dir
        elif _host_first_on_ld_path(a, root) is not None:
            # an earlier LD_LIBRARY_PATH dir holds the host's libcuda, and beats any drop-in:
            # the chosen dir goes before it (ldconfig mode too), every other compat dir off
            kw["ld_dir"] = d.compat_dir
        elif a.ld_compat_entries:
            # ldconfig mode: the drop-in puts the chosen dir first in the ld cache, but an
            # LD_LIBRARY_PATH entry beats the cache: every other compat dir comes off it.
            kw["strip"] = True
            kw["keep"] = [e for e in a.ld_compat_entries if _resolves_into(root, e, d.compat_dir)]
        hook_work = hook_work or config.mode != "env"
    elif a.effect == "host":
        kw["strip"] = True
    already = isinstance(spec, dict) and hook_in_spec(spec)
    a.wrapper_adds_hook = already or bool(hook_work and config.wrapper_add_hook)
    over = [x for x in a.host_over if x["by"] == "wrapper"]
    if over and a.wrapper_adds_hook:
        # The hook the spec runs at createContainer decides again, reading the image's compat files: a spec
        # mount over them would hand it the host's library under a compat file's name (its note, its
        # version), so that hook puts the host's library in place, after its own reading.
        for x in over:
            x["by"] = "hook"
    elif over:
        # the host's libcuda (a compat companion: the host's, or /dev/null) in place of each compat file
        kw["mounts"] = list(kw.get("mounts", [])) + [specedit.file_mount(x["source"], x["target"]) for x in over]
    if hook_work and config.wrapper_add_hook and hook_entry is not None and isinstance(spec, dict) and not already:
        kw["hooks"] = [("createContainer", hook_entry())]
    a.wrapper = kw
    if isinstance(spec, dict):
        a.new_spec, a.spec_edits = specedit.plan(spec, **kw)


def _toolkit_view(a: Assessment, root, config=None) -> None:
    """What the NVIDIA toolkit alone would do, and which library wins alone, with the hook, with the wrapper.

    Predicts the *next* start: compat-hook's own drop-in from an earlier start
    is left out (:func:`compat_hook.policy.toolkit.ld_conf`; the start
    rewrites or removes it), and the hook's masks hide what they cover. With
    the wrapper, the prediction is the hook's own assessment of the spec the
    wrapper hands the runtime (its ``LD_LIBRARY_PATH``, the hook it adds):
    the code path that runs then, not a second model of it.
    """
    from . import toolkit

    drv = a.host.driver_version if a.host is not None else None
    # No driver version: the toolkit's Tegra (CSV) path passes NVML's CUDA version instead.
    cuda = a.host.cuda_version if a.host is not None and drv is None else None
    tk_root = toolkit.ORIN_ROOT if a.host is not None and a.host.tegra else toolkit.COMPAT_ROOT
    if a.request is not None and not a.request.gpu_requested:
        # NVIDIA_VISIBLE_DEVICES=void / none / empty, no device, no CDI name: the NVIDIA
        # runtime adds nothing to such a container, its compat hook included.
        enables, why = False, f"the container requests no GPU ({a.request.gpu_reason}): the NVIDIA runtime adds nothing"
    elif a.image is not None:
        enables, why = toolkit.would_enable(a.image, drv, cuda, root=tk_root)
    else:
        enables, why = False, "not assessed"
    cands = a.image.all() if a.image is not None else []
    has_compat = any(c.status == "found" for c in cands) or (a.image is not None and a.image.status == "ambiguous")
    conf = (toolkit.ld_conf(root, ldconf=a.ldconf) if root is not None
            else {"files": [], "debian_like": False, "arch": None})
    if a.existing_dropin is not None:
        named = [x for x in a.existing_dropin.splitlines() if x.strip() and not x.startswith("#")]
        a.notes.append(f"{toolkit.OUR_DROPIN} in the rootfs is compat-hook's own from an earlier start"
                       + (f" (naming {', '.join(named)})" if named else "")
                       + ": the next start rewrites or removes it, so this prediction leaves it out")
    from ..facts.imagefacts import host_lib_dir

    host_dir = (host_lib_dir(root, a.host.driver_text if a.host is not None else None) if root is not None
                else None) or toolkit.default_host_dir(conf)
    masked = list(a.hook_masks)
    usable = [c for c in cands if c.status == "found"]

    def holds(entry, hidden):
        return _holding(usable, root, entry, hidden)

    def ld_path(value, hidden, covered=()):
        # an entry whose libcuda.so.1 the hook covers with the chosen compat libcuda reaches that (policy/shadow),
        # also where the runtime fills it only at the start (a device plugin's mount: empty in the image)
        cov = {c.rstrip("/") for c in covered}
        out = []
        for e in (value or "").split(":"):
            if e.startswith("/") and e.rstrip("/") in cov:
                out.append({"entry": a.decision.compat_dir, "kind": "compat"})
            else:
                out += _ld_walk(usable, root, e, host_dir, hidden)
        return out

    def dropins(hidden):
        out = []
        for x in a.dropins:
            dirs = [e for e in x["dirs"] if holds(e, hidden) is not None]
            if dirs:
                out.append(dict(x, dirs=dirs))
        return out

    from ..facts.loader import exe_prefix

    # The RUNPATH of the container's program reaches its own env's lib, not another env's, and a
    # program outside every env reaches none; with no program known (plan, explain --rootfs) any
    # env's process may run, so every env's links count.
    exe = a.request.exe if a.request is not None else None
    mine = None
    if exe and root is not None:
        mine = exe_prefix(root, exe, a.request.env)
        if mine is None and not _launcher(exe):
            mine = ""  # a program of no env: its RUNPATH reaches none

    def links(hidden):
        return [p for c in usable if c.compat_dir not in hidden and (mine is None or c.prefix == mine)
                for p in c.links]

    env_ld = a.request.env.get("LD_LIBRARY_PATH") if a.request is not None else None
    first_host = toolkit.host_dir_first(conf, host_dir)
    common = dict(has_compat=has_compat, toolkit_enables=enables, host_first=first_host, conf=conf,
                  ld_library_path=list(a.ld_compat_entries), wrapper_strips=False)
    if not has_compat:
        # what names a compat dir that holds nothing reachable: the model says so
        common["ld_library_path"] = list(a.ld_compat_entries)
    alone = toolkit.effective(hook_effect=None, dropins=dropins(()) if has_compat else a.dropins,
                              ld_path=ld_path(env_ld, ()), links=links(()), **common)
    # effect "host" counts even where the host library is not in the rootfs
    # yet (explain on a bare rootfs): the NVIDIA runtime mounts it at start.
    # env mode: the hook alone writes no drop-in for compat (that is the wrapper's LD_LIBRARY_PATH)
    hook_eff = None if a.effect == "compat" and a.hook_target is None else a.effect
    hook_only = toolkit.effective(hook_effect=hook_eff, dropins=dropins(masked),
                                  ld_path=ld_path(env_ld, masked, a.shadowed),
                                  links=links(masked), **common)
    for res in (alone, hook_only):
        res["dir"] = _winning_dir(res, root, cands, a.decision, tk_root)
        res["maps"] = _maps(res, root, cands, host_dir, a.host)
    # the image's userland driver beside the host's: ldconfig links the higher version of the dir, where
    # nothing covers it (the host's libcuda does only where the host's driver is chosen: hostover)
    for res in (alone, hook_only) if a.effect != "host" else (alone,):
        if res["result"] != "host" or a.image is None or not a.image.userland:
            continue
        from ..facts.imagefacts import ldconfig_picks

        pick = ldconfig_picks(a.image.userland, host_dir, a.host.driver_text if a.host is not None else None)
        name = pick.get(host_dir.rstrip("/"))
        if name and any(u["path"] == f"{host_dir.rstrip('/')}/{name}" for u in a.image.userland) and (
                a.host is None or name != f"libcuda.so.{a.host.driver_text}"):
            res["maps"] = f"{host_dir.rstrip('/')}/{name}"
            res["by"] = f"{res['by']}; ldconfig links the image's own {name}, the higher version in {host_dir}"
    with_wrapper = _wrapper_view(a, root, config) if "wrapper" in a.actors else None
    if with_wrapper is None:
        with_wrapper = dict(hook_only)
    a.toolkit = {"enables": enables, "why": why, "root": tk_root, "alone": alone, "with_hook": hook_only,
                 "with_wrapper": with_wrapper}
    a.maps = (with_wrapper if "wrapper" in a.actors else hook_only).get("maps")


def _holding(usable: list, root, entry: str, hidden=()):
    """The unmasked candidate an ``LD_LIBRARY_PATH`` entry reaches, or ``None``: it resolves into the
    candidate's dir, or it is the env's ``$PREFIX/lib`` whose links point into it."""
    for c in usable:
        if c.compat_dir in hidden:
            continue
        if _resolves_into(root, entry, c.compat_dir):
            return c
        if c.links and any(_resolves_into(root, entry, lk.rsplit("/", 1)[0]) and
                           _resolves_into(root, lk.rsplit("/", 1)[0], _resolved_or(root, entry)) for lk in c.links):
            return c
    return None


def _resolved_or(root, path: str) -> str:
    try:
        return root.realpath(path) if root is not None else path
    except (OSError, ValueError):
        return path


def _ld_walk(usable: list, root, value, host_dir, hidden=()) -> list:
    """``LD_LIBRARY_PATH`` as the loader walks it: ``[{"entry", "kind"}]`` for each entry holding a libcuda.

    ``compat``: it resolves into an unmasked candidate dir; ``host``: it is the
    host driver's dir (``host_dir``) or a library dir of the host driver's holding
    a ``libcuda.so.1``. A missing dir, or one holding none, is passed over.
    """
    from ..facts.imagefacts import CONTAINER_LIB_DIRS

    out = []
    for e in (value or "").split(":"):
        if not e.startswith("/"):
            continue
        if _holding(usable, root, e, hidden) is not None:
            out.append({"entry": e, "kind": "compat"})
        elif (host_dir and _resolves_into(root, e, host_dir)) or (
                e.rstrip("/") in CONTAINER_LIB_DIRS and root is not None
                and root.exists(e.rstrip("/") + "/libcuda.so.1")):
            out.append({"entry": e, "kind": "host"})
    return out


def _host_first_on_ld_path(a: Assessment, root) -> str | None:
    """The ``LD_LIBRARY_PATH`` entry holding the host's libcuda that the loader meets before any compat dir."""
    if a.request is None or root is None or a.image is None:
        return None
    value = a.request.env.get("LD_LIBRARY_PATH")
    if not value:
        return None
    from ..facts.imagefacts import host_lib_dir

    host_dir = host_lib_dir(root, a.host.driver_text) if a.host is not None else None
    if host_dir is None:
        # before the runtime mounts it (the wrapper's create): where the NVIDIA runtime puts it
        from .toolkit import default_host_dir

        host_dir = default_host_dir({"arch": None})
    # the losing dirs come off (the wrapper) or are masked (the hook): only the chosen one is left
    chosen = a.decision.compat_dir
    hidden = [c.compat_dir for c in a.image.all() if c.compat_dir != chosen]
    walk = _ld_walk([c for c in a.image.all() if c.status == "found"], root, value, host_dir, hidden)
    return walk[0]["entry"] if walk and walk[0]["kind"] == "host" else None


#: Programs that start another (a shell, an init, an entrypoint script): which one runs is not known.
_LAUNCHERS = frozenset(("sh", "bash", "dash", "zsh", "ash", "busybox", "env", "tini", "tini-static", "dumb-init",
                        "catatonit", "s6-svscan", "supervisord", "runsvdir", "gosu", "su-exec", "nohup", "exec"))


def _launcher(exe: str) -> bool:
    name = exe.rstrip("/").rsplit("/", 1)[-1]
    return name in _LAUNCHERS or name.endswith(".sh") or "entrypoint" in name


def _wrapper_view(a: Assessment, root, config) -> dict | None:
    """What the container maps through the wrapper: the hook's own assessment of the spec it hands on.

    ``None`` without a spec to edit (then the hook's view stands).
    """
    if not isinstance(a.new_spec, dict) or config is None:
        return None
    from ..facts.container import Request

    req = None
    if a.request is not None:
        import copy

        # The same request (its GPUs, opt-outs), seen through the spec the wrapper hands on.
        edited = Request.from_spec(a.new_spec)
        req = copy.copy(a.request)
        req.env = edited.env
        req.annotations = {**a.request.annotations, **edited.annotations}
        req._spec = a.new_spec
    hooked = a.wrapper_adds_hook
    stage = _hook_stage(a.new_spec)
    second = assess(config, req, root, spec=a.new_spec, host=a.host, actors=("hook",),
                    mount_ns=stage in (None, "createContainer"), toolkit=True, full=True)
    res = dict(second.toolkit["with_hook" if hooked else "alone"])
    if not hooked:
        res["by"] = res["by"] + " (the wrapper adds no hook)"
    return res


def _maps(res: dict, root, cands: list, host_dir: str, host) -> str | None:
    """The file the loader maps for a model result: the compat driver's, or the host driver's by name."""
    if res["result"] == "compat":
        c = next((c for c in cands if c.compat_dir == res.get("dir")), None)
        return f"{c.compat_dir.rstrip('/')}/{c.candidate}" if c is not None and c.candidate else None
    drv = host.driver_text if host is not None else None
    return f"{host_dir.rstrip('/')}/libcuda.so.{drv}" if drv else f"{host_dir.rstrip('/')}/libcuda.so.1"


def _winning_dir(res: dict, root, cands: list, d, tk_root: str):
    """The compat dir (resolved in the rootfs) a ``compat`` result of the model loads from, or ``None``."""
    via, path = res.get("via"), res.get("path")
    if res["result"] != "compat":
        return None
    if via == "compat-hook":
        return d.compat_dir
    if via == "link":
        return next((c.compat_dir for c in cands if path in c.links), None)
    if via == "toolkit":
        return next((c.compat_dir for c in cands if c.configured_dir == tk_root), None)
    if path is None:
        return None
    held = _holding([c for c in cands if c.status == "found"], root, path)
    if held is not None:
        return held.compat_dir
    try:
        return root.realpath(path) if root is not None else path
    except (OSError, ValueError):
        return path
