"""The hook's one mount: a host-store package, read-only, into the container (createContainer).

Only in the container's mount namespace: a mount made from the host's
namespace (prestart) would leak onto the host and be invisible in the
container. The target is created and opened inside the confined root and
mounted through its ``/proc/self/fd`` path, so an image symlink cannot
redirect the mount; the source is only ever a store directory.
"""

from __future__ import annotations

import os

__all__ = ["in_container_mount_ns", "bind_readonly"]

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 32, 4096


def _mount(source: str | None, target: str, flags: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    src = os.fsencode(source) if source is not None else None
    if libc.mount(src, os.fsencode(target), None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def in_container_mount_ns() -> bool:
    """Whether this process runs in another mount namespace than pid 1 (the container's)."""
    try:
        return os.stat("/proc/self/ns/mnt").st_ino != os.stat("/proc/1/ns/mnt").st_ino
    except OSError:
        return False


def bind_readonly(root, source: str, target: str) -> list:
    """Bind-mount host dir ``source`` read-only at ``target`` in ``root``; returns what was done."""
    resolved = root.mkdirs(target)
    fd, resolved = root.open_path(resolved)
    try:
        fdpath = f"/proc/self/fd/{fd}"
        _mount(source, fdpath, _MS_BIND)
        _mount(None, fdpath, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    finally:
        os.close(fd)
    return [f"bind-mounted {source} at {resolved} (ro)"]
