"""When compat is chosen, nothing the image's search path reaches first shadows it.

compat-hook's drop-in puts the chosen compat dir first in the ld cache, but an
``LD_LIBRARY_PATH`` entry beats the cache: ``/usr/local/cuda/lib64/stubs``
holding a ``libcuda.so.1`` (a link-time stub some Dockerfiles leave there), a
dir with the image's own userland driver, or the dir a device plugin mounts the
host's driver into (GKE's ``/usr/local/nvidia/lib64``, which the CUDA images'
``LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64`` names). The
loader maps the first ``libcuda.so.1`` it meets there, not the compat driver.

So where the decision's effect is ``compat`` (the image's compat driver), every
``libcuda.so.1`` that an ``LD_LIBRARY_PATH`` entry before the chosen dir leads
to (a regular file, resolved inside the root) gets **the chosen compat libcuda
bind-mounted read-only over it** by the hook at createContainer, where the
runtime's mounts are already in place: whatever road reaches that file (the
search, an absolute path, a shell prepending the dir again) maps the compat
driver. The image's files are not changed. The chosen file itself, and a file
inside another candidate dir (those lose by :mod:`compat_hook.policy.assess`'s
rules), are left.

The driver's other libraries in such a dir (:data:`compat_hook.policy.hostover.COMPANIONS`:
``libnvidia-ptxjitcompiler.so.1``, ``libnvidia-nvvm.so.4``, ...), which the compat libcuda
loads by soname and the same ``LD_LIBRARY_PATH`` entry leads to first, are covered too, as
:mod:`compat_hook.policy.hostover` covers a compat dir's when the host is chosen: by the chosen
compat dir's file of the same library at the compat version (``libnvidia-ptxjitcompiler.so.550.x``)
where it has one, else by ``/dev/null`` (no loader maps it), so the compat libcuda never loads
the host's JIT compiler (``kind`` ``companion``; one listing of each covered entry, names only).

A dir a device plugin fills only when the container is created (a bind mount of
the spec's at or around it, GKE's ``/usr/local/nvidia``, empty when the runtime
wrapper or ``explain`` read the image) is named in a note, and the loader model
counts it as reaching the chosen compat libcuda: the hook covers what it finds
there. A driver dir no mount of the spec fills (the CUDA images name
``/usr/local/nvidia/lib64`` on every node) holds nothing at the start, and the
search passes over it. A hook outside the container's mount namespace
(prestart, createRuntime) cannot mount: a warning names the file that maps
instead. Through the runtime wrapper, the hook it adds does the mounts.

Plain data in :attr:`compat_hook.policy.assess.Assessment.compat_over`
(``{"target", "source", "via", "kind", "by", "in_rootfs"}``, ``kind`` ``host``, ``other`` or
``companion``); no mounts here:
:func:`compat_hook.effects.mounts.bind_file_over` carries it out.
"""

from __future__ import annotations

import stat as _stat

__all__ = ["DRIVER_MOUNT_DIRS", "MAX_ENTRIES", "MAX_COMPANIONS", "companions", "plan"]

#: Where device plugins mount the host's driver libraries (GKE's ``/usr/local/nvidia``).
DRIVER_MOUNT_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")
#: At most this many ``LD_LIBRARY_PATH`` entries before the chosen dir are looked at.
MAX_ENTRIES = 32
#: At most this many companion files of one ``LD_LIBRARY_PATH`` entry are covered (a driver has ~8).
MAX_COMPANIONS = 64


def _into(root, entry: str, d: str) -> bool:
    try:
        r = root.realpath(entry)
    except (OSError, ValueError):
        return False
    return r == d or r.startswith(d.rstrip("/") + "/")


#: The companions only CUDA loads, which ``/dev/null`` covers where the compat dir has no file of them. The
#: others (``libnvidia-gpucomp``, ``libnvidia-pkcs11*``) the host's graphics libraries in the same dir load
#: too: without a compat file of theirs they are left as they are.
NULL_COVERED = ("libcudadebugger.so.", "libnvidia-nvvm.so.", "libnvidia-ptxjitcompiler.so.", "libnvidia-nvvm70.so.",
                "libnvidia-tileiras.so.")


def companions(root, entry: str, chosen, version: str | None, skip=()) -> list:
    """``[(target, source, via, in_rootfs)]``: each driver companion file ``entry`` holds (by soname or file
    name, resolved inside the root to a regular file named like one), with what covers it: the chosen compat
    dir's regular file of the same library at ``version`` (the chosen candidate's, from its scan:
    :attr:`~compat_hook.facts.imagefacts.ImageFacts.other_libs`; ``in_rootfs``), else
    :data:`~compat_hook.policy.hostover.NULL` for a library only CUDA loads (:data:`NULL_COVERED`).
    ``skip``: targets already covered.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); nv = d + "/usr/local/nvidia/lib64"; os.makedirs(nv)
    >>> for n in ("libnvidia-ptxjitcompiler.so.535.1", "libnvidia-nvvm.so.535.1", "libfoo.so.1"):
    ...     open(f"{nv}/{n}", "w").close()
    >>> os.symlink("libnvidia-ptxjitcompiler.so.535.1", nv + "/libnvidia-ptxjitcompiler.so.1")
    >>> os.makedirs(d + "/etc"); open(d + "/etc/passwd", "w").close()
    >>> os.symlink("../../../../etc/passwd", nv + "/libcudadebugger.so.1")  # not a driver library's file
    >>> from compat_hook.facts.imagefacts import ImageFacts
    >>> c = ImageFacts(); c.compat_dir = "/cuda/compat"
    >>> c.other_libs = [{"name": "libnvidia-ptxjitcompiler.so.550.2", "kind": "file", "version": "550.2"}]
    >>> from compat_hook.facts.rootfs import Root
    >>> with Root(d) as r:
    ...     got = companions(r, "/usr/local/nvidia/lib64", c, "550.2")
    >>> [(t.rsplit("/", 1)[1], s) for t, s, _, _ in got]
    [('libnvidia-nvvm.so.535.1', '/dev/null'), \
('libnvidia-ptxjitcompiler.so.535.1', '/cuda/compat/libnvidia-ptxjitcompiler.so.550.2')]
    """
    from .hostover import COMPANIONS, NULL  # here: only a start whose LD_LIBRARY_PATH shadows the compat dir

    try:
        d = root.realpath(entry).rstrip("/")
        # one listing (a driver dir holds ~60 files; d_type, no stat), one startswith over the tuple; regular
        # files first: each is its own target without a lookup, and a soname link to one is then seen already
        found = sorted((kind != "file", n) for n, kind in root.listdir(d)
                       if kind in ("file", "symlink") and n.startswith(COMPANIONS))[:MAX_COMPANIONS]
    except (OSError, ValueError):
        return []
    # the compat dir's own regular files, as its scan saw them (no lookup more)
    own = {o["name"] for o in chosen.other_libs if o.get("kind") == "file"}
    vias: dict = {}  # target -> the name the search meets: its soname link where there is one
    for link, n in found:
        if not link:
            vias[f"{d}/{n}"] = n
            continue
        try:
            target = root.realpath(f"{d}/{n}")
            # a driver library's file only: a link to /etc/passwd gets nothing put over it
            if not target.rsplit("/", 1)[-1].startswith(COMPANIONS) or (
                    target not in vias and not _stat.S_ISREG(root.lstat(target).st_mode)):
                continue
        except (OSError, ValueError):
            continue
        vias[target] = n
    out: list = []
    for target, n in vias.items():
        if target in skip:
            continue
        prefix = next(p for p in COMPANIONS if n.startswith(p))  # the listed name's library (a link's too)
        # the compat libcuda's own version of that library, or nothing: never a mix of versions
        mine = prefix + version if version and prefix + version in own else None
        source = f"{chosen.compat_dir.rstrip('/')}/{mine}" if mine else None
        if source == target or (source is None and prefix not in NULL_COVERED):
            continue
        out.append((target, source or NULL, f"{entry.rstrip('/')}/{n}", source is not None))
    return out


def _mounted(request, entry: str) -> bool:
    """Whether the spec bind-mounts something at ``entry``, above it or into it (filled at the start)."""
    e = entry.rstrip("/")
    for d in request.bind_destinations():
        d = d.rstrip("/")
        if e == d or e.startswith(d + "/") or d.startswith(e + "/"):
            return True
    return False


def plan(a, config, root, mount_ns: bool) -> None:
    """Fill ``a.compat_over`` for effect ``compat`` where an ``LD_LIBRARY_PATH`` entry shadows the chosen dir.

    ``a.shadowed``: the ``LD_LIBRARY_PATH`` entries whose ``libcuda.so.1`` the hook covers (or will find
    the runtime's mount in), which the loader model then counts as reaching the chosen dir.

    >>> class A: pass
    >>> a = A(); a.effect = "host"; plan(a, None, None, True); a.compat_over, a.shadowed
    ([], [])
    """
    a.compat_over = []
    a.shadowed = []
    if a.effect != "compat":
        return
    d = a.decision
    if d.source != "image" or a.image is None or root is None or a.request is None:
        return
    value = a.request.env.get("LD_LIBRARY_PATH")
    if not value or not d.compat_dir:
        return
    chosen = next((c for c in a.image.all() if c.compat_dir == d.compat_dir), None)
    name = d.details.get("candidate") if isinstance(d.details, dict) else None
    name = name or (chosen.candidate if chosen is not None else None)
    if chosen is None or not name:
        return
    source = chosen.file_of(name)
    version = name[len("libcuda.so."):] if name.startswith("libcuda.so.") else None
    others = [c.compat_dir for c in a.image.all() if c is not chosen]
    drv = a.host.driver_text if a.host is not None else None
    from .toolkit import default_host_dir

    host_dir = default_host_dir({"arch": None})
    pending = []
    for e in [e for e in value.split(":") if e.startswith("/")][:MAX_ENTRIES]:
        if _into(root, e, d.compat_dir):
            break  # the chosen dir comes first from here on
        if any(_into(root, e, o) for o in others):
            continue  # a losing compat dir: taken off, hidden (assess)
        via = f"{e.rstrip('/')}/libcuda.so.1"
        try:
            target = root.realpath(via)
            regular = _stat.S_ISREG(root.lstat(target).st_mode)
        except (OSError, ValueError):
            regular = False
        if not regular:
            if _into(root, e, host_dir) or (e.rstrip("/") in DRIVER_MOUNT_DIRS and _mounted(a.request, e)):
                pending.append(e)  # the runtime mounts the host's driver there at the start
            continue
        if target == source or any(x["target"] == target for x in a.compat_over):
            continue
        base = target.rsplit("/", 1)[-1]
        kind = "host" if drv and base == f"libcuda.so.{drv}" else "other"
        a.compat_over.append({"target": target, "source": source, "via": via, "kind": kind, "by": "hook",
                              "in_rootfs": True})
        # the compat libcuda loads its companions by soname: this entry would hand it the driver's own
        for t, s, v, inside in companions(root, e, chosen, version, [x["target"] for x in a.compat_over]):
            a.compat_over.append({"target": t, "source": s, "via": v, "kind": "companion", "by": "hook",
                                  "in_rootfs": inside})
    can = "hook" in a.actors and mount_ns or "wrapper" in a.actors
    if pending and can:
        a.notes.append(
            f"LD_LIBRARY_PATH names {', '.join(pending)} before {d.compat_dir}, where the runtime or a device plugin "
            f"mounts the host's driver: at createContainer the hook puts {source} over the libcuda.so.1 it finds "
            "there, and the compat dir's file of each of the driver's other libraries (libnvidia-ptxjitcompiler, "
            "libnvidia-nvvm, ...; /dev/null where it has none) over the one there")
    if can:
        # the loader model (explain) sees these entries reach the chosen compat libcuda
        a.shadowed = pending + [x["via"].rsplit("/", 1)[0] for x in a.compat_over if x["kind"] != "companion"]
    if a.compat_over and not can:
        first = a.compat_over[0]
        a.warnings.append(
            f"LD_LIBRARY_PATH reaches {first['via']} ({first['target']}) before {d.compat_dir}: the loader maps "
            f"{first['target']}, not the chosen compat driver, and a hook outside the container's mount namespace "
            "(prestart, createRuntime) cannot put the compat libcuda in its place: register the hook at "
            "createContainer, or use compat-hook's runtime wrapper (compat-hook install containerd|docker|crio)")
        a.maps_uncertain = True
        a.compat_over = []
