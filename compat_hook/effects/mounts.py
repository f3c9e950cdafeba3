"""The hook's mounts, in the container's mount namespace only (createContainer): a host-store
package bind-mounted read-only, and an empty read-only tmpfs over a compat dir that must not be used.

Only in the container's mount namespace: a mount made from the host's
namespace (prestart) would leak onto the host and be invisible in the
container. The target is created and opened inside the confined root and
mounted through its ``/proc/self/fd`` path, so an image symlink cannot
redirect the mount; the source is a store directory, or, over a compat
file, the host's libcuda (opened in the root where the runtime put it there,
else a host path) or ``/dev/null``.
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start

__all__ = ["in_container_mount_ns", "bind_readonly", "mask_dir", "bind_built_file", "bind_file_over"]

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_PRIVATE, _MNT_DETACH = 1 << 18, 2


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None,
           data: str | None = None) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    src = os.fsencode(source) if source is not None else None
    fs = os.fsencode(fstype) if fstype is not None else None
    opts = ctypes.c_char_p(os.fsencode(data)) if data is not None else None
    if libc.mount(src, os.fsencode(target), fs, flags, opts) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def _umount(target: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def in_container_mount_ns(stage: str | None = None) -> bool:
    """Whether a mount made now lands in the container (and nowhere else).

    The runtime-spec runs createContainer (and startContainer) hooks in the
    container's mount namespace, prestart and createRuntime hooks in the
    runtime's. Where pid 1's namespace can be read it must differ from ours
    (never the host's); where it cannot (a sandboxed pid 1), the stage says.
    """
    try:
        same = os.stat("/proc/self/ns/mnt").st_ino == os.stat("/proc/1/ns/mnt").st_ino
    except OSError:
        same = None
    if same is True:
        return False
    if stage is None:
        return same is False
    return stage in ("createContainer", "startContainer")


def bind_readonly(root, source: str, target: str) -> list:
    """Bind-mount host dir ``source`` read-only at ``target`` in ``root``; returns what was done."""
    resolved = root.mkdirs(target)
    fd, resolved = root.open_path(resolved)
    try:
        _mount(source, f"/proc/self/fd/{fd}", _MS_BIND)
    finally:
        os.close(fd)
    # The first descriptor names the directory now covered by the mount: open
    # the target again (the confined walk crosses into the new mount), check it
    # is the store dir, and make that read-only.
    _seal(root, resolved, source, os.stat(source))
    return [f"bind-mounted {source} at {resolved} (ro)"]


def _seal(root, resolved: str, source: str, want) -> None:
    """Make the bind mount at ``resolved`` read-only (nosuid, nodev), after checking that what is there now
    is ``source`` (``want``: its stat): a path the image swapped meanwhile is refused, not remounted."""
    fd, _ = root.open_path(resolved)
    try:
        got = os.fstat(fd)
        if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
            raise OSError(f"{resolved}: the bind mount of {source} is not where it was made")
        _mount(None, f"/proc/self/fd/{fd}", _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    finally:
        os.close(fd)


def mask_dir(root, path: str, keep=()) -> list:
    """Hide the dir ``path`` in ``root`` under a read-only tmpfs; returns what was done.

    Like the runtime's masked paths: nothing of the image's under it (a compat
    libcuda, its companions, its symlinks) can be found there, by
    ``LD_LIBRARY_PATH``, a RUNPATH's links or ldconfig, for the life of the
    container. The image's files are not touched. The target is resolved and
    opened inside the confined root and mounted through its descriptor, so no
    image symlink can redirect it.

    ``keep``: ``[(name, source, source_in_root)]``, where the host's driver is chosen: the compat
    libcuda file ``name`` of the dir stays there, as the host's libcuda ``source`` bind-mounted
    read-only (:func:`bind_file_over`). A process that opens that file by its path (an absolute
    ``dlopen``, a preload) maps the host's library, as it does where no mask is needed
    (:mod:`compat_hook.policy.hostover`). Its links (``libcuda.so.1``, ``libcuda.so``) are not kept:
    the dir is masked because a *search* reaches it (``LD_LIBRARY_PATH``, a RUNPATH's links, an early
    ld.so.conf line), and a search for ``libcuda.so.1`` must find nothing there and go on to the host's
    dir, so ``dlopen("<dir>/libcuda.so.1")`` fails (ENOENT) instead of mapping a compat driver.
    """
    import stat as _stat

    fd, resolved = root.open_path(path)
    try:
        if not _stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(f"{resolved}: not a directory")
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        if not keep:
            _mount("compat-hook-mask", f"/proc/self/fd/{fd}", _MS_RDONLY | flags, "tmpfs",
                   "size=4k,nr_inodes=1,mode=0555")
            return [f"masked {resolved} (empty read-only tmpfs)"]
        names = 1 + len(keep)
        _mount("compat-hook-mask", f"/proc/self/fd/{fd}", flags, "tmpfs", f"size=16k,nr_inodes={names},mode=0755")
    finally:
        os.close(fd)
    said = []
    try:
        tfd, _ = root.open_path(resolved)  # the new tmpfs: the confined walk crosses into the mount
        try:
            for name, _, _ in keep:
                if "/" in name or name in (".", ".."):
                    raise OSError(f"{resolved}: {name!r} is not a file name")
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444,
                                 dir_fd=tfd))
        finally:
            os.close(tfd)
        for name, source, in_root in keep:
            said += bind_file_over(root, source, f"{resolved}/{name}", in_root)
    finally:
        # read-only whatever happened: a mask half made still hides the image's files
        tfd, _ = root.open_path(resolved)
        try:
            _mount(None, f"/proc/self/fd/{tfd}", _MS_REMOUNT | _MS_RDONLY | flags)
        finally:
            os.close(tfd)
    kept = ", ".join(n for n, _, _ in keep)
    return [f"masked {resolved} (read-only tmpfs holding only {kept}, the host's libcuda)"] + said


def bind_built_file(root, scratch: str, name: str, build, dest: str) -> list:
    """Build a file in a private tmpfs and bind-mount it read-only over the regular file ``dest``.

    For a root the runtime made read-only before the hook runs (crun at
    createContainer with ``root.readonly``): nothing in the rootfs can be
    written, but an existing file can still be covered by a mount. A small
    tmpfs is mounted for a moment over the existing dir ``scratch`` of the
    root (no process runs in the container yet), ``build`` is called with the
    in-root path ``<scratch>/<name>`` to write there (ldconfig chrooted in the
    root, so the path must be inside it), the result is bind-mounted over
    ``dest`` and the tmpfs is taken away again (the bind keeps the file).
    Every path is opened inside the confined root and mounted through its
    descriptor, as :func:`bind_readonly` does. Returns what was done.
    """
    import stat as _stat

    fd, at = root.open_path(scratch)
    try:
        if not _stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(f"{at}: not a directory")
        _mount("compat-hook-scratch", f"/proc/self/fd/{fd}", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
               "tmpfs", "size=64m,mode=0700")
    finally:
        os.close(fd)
    fd, _ = root.open_path(at)  # the new tmpfs' root: where it is unmounted from
    try:
        _mount(None, f"/proc/self/fd/{fd}", _MS_PRIVATE)  # nothing of it reaches a peer mount
        build(f"{at}/{name}")
        src, _ = root.open_path(f"{at}/{name}")
        try:
            dst, where = root.open_path(dest)
            try:
                if not (_stat.S_ISREG(os.fstat(src).st_mode) and _stat.S_ISREG(os.fstat(dst).st_mode)):
                    raise OSError(f"{where}: not a regular file")
                _mount(f"/proc/self/fd/{src}", f"/proc/self/fd/{dst}", _MS_BIND)
            finally:
                os.close(dst)
            dst, _ = root.open_path(where)  # the file now covering it
            try:
                _mount(None, f"/proc/self/fd/{dst}", _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
            finally:
                os.close(dst)
        finally:
            os.close(src)
    finally:
        try:
            _umount(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
    return [f"bind-mounted a rebuilt ld cache over {where} (ro; the root is read-only)"]


def bind_file_over(root, source: str, target: str, source_in_root: bool) -> list:
    """Bind-mount the file ``source`` read-only over the regular file ``target`` in ``root``.

    ``source_in_root``: ``source`` is a container path (the host's library the
    runtime mounted into the rootfs), opened inside the confined root; else a
    host path (the host's driver dir, ``/dev/null``). The target is opened
    inside the root without following an image symlink out of it, and must be
    a regular file; a target that is the source's file already is left as it is.
    """
    import stat as _stat

    fd, resolved = root.open_path(target)
    sfd = None
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{resolved}: not a regular file")
        if source_in_root:
            sfd, src_resolved = root.open_path(source)
            src, want = f"/proc/self/fd/{sfd}", os.fstat(sfd)
            if not _stat.S_ISREG(want.st_mode):
                raise OSError(f"{src_resolved}: not a regular file")
        else:
            src, want = source, os.stat(source)
        got = os.fstat(fd)
        if (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino):
            return []
        _mount(src, f"/proc/self/fd/{fd}", _MS_BIND)
    finally:
        os.close(fd)
        if sfd is not None:
            os.close(sfd)
    _seal(root, resolved, source, want)
    return [f"bind-mounted {source} over {resolved} (ro)"]
