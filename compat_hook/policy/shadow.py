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

A dir a device plugin fills only when the container is created (empty when the
runtime wrapper or ``explain`` read the image) is named in a note: the hook
covers what it finds there. A hook outside the container's mount namespace
(prestart, createRuntime) cannot mount: a warning names the file that maps
instead. Through the runtime wrapper, the hook it adds does the mounts.

Plain data in :attr:`compat_hook.policy.assess.Assessment.compat_over`
(``{"target", "source", "via", "kind", "by", "in_rootfs"}``); no mounts here:
:func:`compat_hook.effects.mounts.bind_file_over` carries it out.
"""

from __future__ import annotations

import stat as _stat

__all__ = ["DRIVER_MOUNT_DIRS", "MAX_ENTRIES", "plan"]

#: Where device plugins mount the host's driver libraries (GKE's ``/usr/local/nvidia``).
DRIVER_MOUNT_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")
#: At most this many ``LD_LIBRARY_PATH`` entries before the chosen dir are looked at.
MAX_ENTRIES = 32


def _into(root, entry: str, d: str) -> bool:
    try:
        r = root.realpath(entry)
    except (OSError, ValueError):
        return False
    return r == d or r.startswith(d.rstrip("/") + "/")


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
            if e.rstrip("/") in DRIVER_MOUNT_DIRS or _into(root, e, host_dir):
                pending.append(e)  # the runtime mounts the host's driver there at the start
            continue
        if target == source or any(x["target"] == target for x in a.compat_over):
            continue
        base = target.rsplit("/", 1)[-1]
        kind = "host" if drv and base == f"libcuda.so.{drv}" else "other"
        a.compat_over.append({"target": target, "source": source, "via": via, "kind": kind, "by": "hook",
                              "in_rootfs": True})
    can = "hook" in a.actors and mount_ns or "wrapper" in a.actors
    if pending and can:
        a.notes.append(
            f"LD_LIBRARY_PATH names {', '.join(pending)} before {d.compat_dir}, where the runtime or a device plugin "
            f"mounts the host's driver: at createContainer the hook puts {source} over the libcuda.so.1 it finds "
            "there")
    if can:
        # the loader model (explain) sees these entries reach the chosen compat libcuda
        a.shadowed = pending + [x["via"].rsplit("/", 1)[0] for x in a.compat_over]
    if a.compat_over and not can:
        first = a.compat_over[0]
        a.warnings.append(
            f"LD_LIBRARY_PATH reaches {first['via']} ({first['target']}) before {d.compat_dir}: the loader maps "
            f"{first['target']}, not the chosen compat driver, and a hook outside the container's mount namespace "
            "(prestart, createRuntime) cannot put the compat libcuda in its place: register the hook at "
            "createContainer, or use compat-hook's runtime wrapper (compat-hook install containerd|docker|crio)")
        a.maps_uncertain = True
        a.compat_over = []
