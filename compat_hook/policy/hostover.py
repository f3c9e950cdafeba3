"""When the host's driver is chosen, the host's libcuda takes the place of every compat libcuda the image carries.

Taking compat dirs off ``LD_LIBRARY_PATH`` and putting the host driver's dir
first in the ld cache decide the loader's *search*. Other roads reach a compat
file by its path and never search: an app's ``DT_RPATH``/``DT_RUNPATH`` naming
the compat dir, ``LD_PRELOAD`` or ``/etc/ld.so.preload`` naming the file, an
absolute ``dlopen("/usr/local/cuda/compat/libcuda.so.1")`` (numba's
``NUMBA_CUDA_DRIVER``), a shell that prepends the compat dir after every hook
ran. So where the decision's effect is ``host``, every compat libcuda
*regular file* of every candidate dir (the configured dirs, NGC's
``lib.real``, each env's ``cuda-compat``, the dirs ``LD_LIBRARY_PATH`` and
ldconfig's configuration name; every file of an ambiguous dir) gets the host
driver's libcuda bind-mounted read-only over it; so does the regular file a
symlinked compat libcuda leads to (``/opt/nv/libcuda.so.550.x``), and every
userland libcuda of the image's system lib dirs, linked or not
(:func:`compat_hook.facts.imagefacts.userland_libcuda`), but the host's own (ldconfig
links the higher version of a dir: the image's ``libcuda.so.550.x`` would beat
the host's ``libcuda.so.535.x`` mounted beside it), and every other ``libcuda.so.1``
or ``libcuda.so`` an ``LD_LIBRARY_PATH`` entry leads to (:func:`search_shadows`: a
link-time stub in ``/usr/local/cuda/lib64/stubs``, the image's own driver in a
dir of its own; with the compat dirs taken off or masked the search reaches it
first, and a stub fails every call with error 34). Its links
(``libcuda.so.1``, ``libcuda.so``) lead to it, so whatever road a process
takes to a compat libcuda, it maps the host's: **an absolute-path dlopen of a
compat libcuda gets the host driver's library**, under the compat file's name.

The driver's other libraries in those dirs (``libnvidia-ptxjitcompiler``,
``libnvidia-nvvm``, ...: :data:`COMPANIONS`), which a host libcuda loaded from
there would find first, are covered too: by the host's file of the same
library at the host's version where the host has one, else by ``/dev/null``
(a file no loader maps), so a host libcuda never loads a compat companion.
The image's files are untouched.

Who mounts (plain data in :attr:`compat_hook.policy.assess.Assessment.host_over`,
``{"target", "source", "kind", "by"}``):

* the runtime wrapper, as ``config.json`` mounts (``bind``, ``ro``), where the spec runs no
  compat-hook hook at createContainer (one that does decides again on the image's own compat files, so
  it mounts, after its reading: a spec mount would hand it the host's file under a compat name): the
  source is the spec's own bind mount of the host library (a CDI spec, a device plugin), else
  ``libcuda.so.<version>`` in the host's ``driver_lib_dirs``;
* the hook, in the container's mount namespace (createContainer), where the spec
  does not mount the file already: the host library the runtime put in the rootfs
  (the dir compat-hook's drop-in names), else the host's driver dirs (the host's
  filesystem is still visible before ``pivot_root``). A hook outside that
  namespace (prestart, createRuntime) cannot: a note says which files stay.

Plain data, no mounts here: :mod:`compat_hook.effects.mounts` carries it out.
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start

__all__ = ["COMPANIONS", "NULL", "SEARCH_NAMES", "targets", "search_shadows", "host_file", "plan"]

#: The driver's other libraries a libcuda loads by soname from its search path.
COMPANIONS = ("libcudadebugger.so.", "libnvidia-nvvm.so.", "libnvidia-ptxjitcompiler.so.",
              "libnvidia-gpucomp.so.", "libnvidia-tileiras.so.", "libnvidia-pkcs11.so.",
              "libnvidia-pkcs11-openssl3.so.", "libnvidia-nvvm70.so.")
#: What covers a companion the host has no file of: no loader maps a character device.
NULL = "/dev/null"
#: The names a search reaches a libcuda by: the loader's soname, numba's ``dlopen("libcuda.so")``.
SEARCH_NAMES = ("libcuda.so.1", "libcuda.so")
#: At most this many ``LD_LIBRARY_PATH`` entries are looked at (as policy/shadow).
MAX_ENTRIES = 32


def targets(image, driver_text: str | None = None) -> list:
    """``[(container path, kind, name prefix)]``: every compat libcuda regular file and companion file,
    the regular file a symlinked compat libcuda resolves to, and every userland libcuda of the image's
    system lib dirs (:attr:`~compat_hook.facts.imagefacts.ImageFacts.userland`) but the host driver's
    own (``driver_text``).

    >>> from compat_hook.facts.imagefacts import ImageFacts
    >>> f = ImageFacts(); f.status = "found"; f.compat_dir = "/usr/local/cuda-12.4/compat"
    >>> f.candidates = ["libcuda.so.550.163.01"]
    >>> f.other_libs = [{"name": "libnvidia-nvvm.so.550.163.01", "kind": "file", "version": "550.163.01"},
    ...                 {"name": "libnvidia-nvvm.so.4", "kind": "symlink", "version": "4"}]
    >>> [(t, k) for t, k, _ in targets(f)]
    [('/usr/local/cuda-12.4/compat/libcuda.so.550.163.01', 'libcuda'), \
('/usr/local/cuda-12.4/compat/libnvidia-nvvm.so.550.163.01', 'companion')]
    """
    out: list = []
    seen: set = set()
    for c in image.all() if image is not None else ():
        if not c.compat_dir:
            continue
        d = c.compat_dir.rstrip("/")
        for n in c.candidates:
            p = c.file_of(n)  # a symlinked candidate: the file it leads to, wherever it is
            if p not in seen:
                seen.add(p)
                out.append((p, "libcuda", "libcuda.so."))
        for o in c.other_libs:
            name = o.get("name") or ""
            prefix = next((p for p in COMPANIONS if name.startswith(p)), None)
            if o.get("kind") == "file" and prefix is not None and f"{d}/{name}" not in seen:
                seen.add(f"{d}/{name}")
                out.append((f"{d}/{name}", "companion", prefix))
    for u in getattr(image, "userland", None) or () if image is not None else ():
        # cuda-drivers in the image: ldconfig keeps the higher version of one dir, the host's may lose
        if u["path"] not in seen and (not driver_text or u["version"] != driver_text):
            seen.add(u["path"])
            out.append((u["path"], "userland", "libcuda.so."))
    return out


def search_shadows(root, env, driver_text: str | None, seen=()) -> list:
    """``[(container path, "shadow", "libcuda.so.")]``: each regular file an ``LD_LIBRARY_PATH`` entry of
    ``env`` leads to by :data:`SEARCH_NAMES` (resolved inside the root), but those in ``seen`` (the
    compat files :func:`targets` has) and the host driver's own ``libcuda.so.<driver_text>``.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); os.makedirs(d + "/usr/local/cuda/lib64/stubs")
    >>> open(d + "/usr/local/cuda/lib64/stubs/libcuda.so", "w").close()
    >>> os.symlink("libcuda.so", d + "/usr/local/cuda/lib64/stubs/libcuda.so.1")
    >>> from compat_hook.facts.rootfs import Root
    >>> with Root(d) as r:
    ...     search_shadows(r, {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64/stubs:/missing"}, "535.261.03")
    [('/usr/local/cuda/lib64/stubs/libcuda.so', 'shadow', 'libcuda.so.')]
    """
    import stat

    value = (env or {}).get("LD_LIBRARY_PATH")
    if not value or root is None:
        return []
    own = f"libcuda.so.{driver_text}" if driver_text else None
    done = set(seen)
    out = []
    for e in [e for e in value.split(":") if e.startswith("/")][:MAX_ENTRIES]:
        for n in SEARCH_NAMES:
            try:
                p = root.realpath(f"{e.rstrip('/')}/{n}")
                if p in done or not stat.S_ISREG(root.lstat(p).st_mode):
                    continue
            except (OSError, ValueError):
                continue
            done.add(p)
            if p.rsplit("/", 1)[-1] != own:
                out.append((p, "shadow", "libcuda.so."))
    return out


def host_file(config, prefix: str, driver_text: str | None, spec_binds=None) -> str | None:
    """The host path of the host driver's ``<prefix><version>`` (a regular file), or ``None``.

    The spec's own bind mount of it comes first (what the runtime will mount
    as the host's library: its ``libcuda.so.<version>`` or ``libcuda.so.1``),
    then ``config.driver_lib_dirs`` under ``config.host_root``.
    """
    if not driver_text:
        return None
    name = prefix + driver_text
    wanted = (name, "libcuda.so.1") if prefix == "libcuda.so." else (name,)
    for dest, src in (spec_binds or {}).items():
        if dest.rsplit("/", 1)[-1] in wanted and src.startswith("/") and _regular(src):
            return src
    root = (config.host_root or "/").rstrip("/")
    for d in config.driver_lib_dirs:
        p = f"{root}/{d.strip('/')}/{name}"
        if _regular(p):
            return os.path.realpath(p)
    return None


def _regular(path: str) -> bool:
    import stat

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _in_rootfs(root, d: str | None, name: str) -> str | None:
    """``<d>/<name>`` when it is a regular file in the container (resolved in the root), else ``None``."""
    if root is None or not d:
        return None
    p = f"{d.rstrip('/')}/{name}"
    try:
        import stat

        return p if stat.S_ISREG(root.stat(p).st_mode) else None
    except (OSError, ValueError):
        return None


def plan(a, config, root, mount_ns: bool) -> None:
    """Fill ``a.host_over`` (the wrapper's spec mounts, the hook's bind mounts) for effect ``host``."""
    a.host_over = []
    if a.effect != "host" or a.image is None:
        return
    drv = a.host.driver_text if a.host is not None else None
    files = targets(a.image, drv)
    files += search_shadows(root, a.request.env if a.request is not None else None, drv, {t for t, _, _ in files})
    if not files:
        return
    binds = a.request.file_binds() if a.request is not None else {}
    if "wrapper" in a.actors:
        later = []
        for target, kind, prefix in files:
            if target in binds:
                continue
            src = host_file(config, prefix, drv, binds) or (NULL if kind == "companion" else None)
            if src is None:
                later.append(target)
                continue
            a.host_over.append({"target": target, "source": src, "kind": kind, "by": "wrapper"})
        if later:
            a.notes.append(f"no libcuda.so.{drv or '<version>'} of the host driver found on the host "
                           f"(driver_lib_dirs, the spec's mounts): the hook the wrapper adds puts the one the "
                           f"runtime mounts in place of {', '.join(later)}")
        return
    if "hook" not in a.actors:
        return

    def mask_of(t: str):
        return next((m for m in a.hook_masks if t.startswith(m.rstrip("/") + "/")), None)

    # A dir the hook masks keeps its compat libcuda, as the host's (effects.mounts.mask_dir ``keep``); its
    # companions stay hidden with the rest of it.
    todo = [(t, k, p) for t, k, p in files if t not in binds and (k == "libcuda" or mask_of(t) is None)]
    if not todo:
        return
    if not (mount_ns and root is not None):
        shadows = [t for t, k, _ in todo if k == "shadow"]
        if shadows:
            # the search itself maps it: what the log and explain name is not what loads
            a.warnings.append(
                f"LD_LIBRARY_PATH reaches {', '.join(shadows)} before the host's libcuda: the loader maps it, and a "
                "hook outside the container's mount namespace (prestart, createRuntime) cannot put the host's "
                "libcuda in its place; register the hook at createContainer, or use compat-hook's runtime wrapper")
            a.maps_uncertain = True
        a.notes.append(
            f"{', '.join(t for t, _, _ in todo)} stay(s) loadable by path (an RPATH, LD_PRELOAD, an absolute "
            "dlopen, a shell prepending the dir): a hook outside the container's mount namespace (prestart, "
            "createRuntime) cannot put the host's libcuda in its place; register the hook at createContainer, "
            "or use compat-hook's runtime wrapper")
        return
    host_dir = a.hook_target if a.hook_purpose == "host" else None
    for target, kind, prefix in todo:
        inside = _in_rootfs(root, host_dir, prefix + (drv or "")) if drv else None
        if inside is None and kind != "companion":
            inside = _in_rootfs(root, host_dir, "libcuda.so.1")
        m = mask_of(target)
        extra = {"mask": m} if m is not None else {}
        if inside is not None:
            a.host_over.append({"target": target, "source": inside, "kind": kind, "by": "hook",
                                "in_rootfs": True, **extra})
            continue
        src = host_file(config, prefix, drv) or (NULL if kind == "companion" else None)
        if src is None:
            a.notes.append(f"{target} stays" + (" hidden" if m is not None else "") + ": the host driver's "
                           f"libcuda.so.{drv or '<version>'} is neither in the container nor in the host's "
                           "driver_lib_dirs")
            continue
        a.host_over.append({"target": target, "source": src, "kind": kind, "by": "hook", "in_rootfs": False, **extra})

