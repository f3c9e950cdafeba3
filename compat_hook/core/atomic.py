"""Replace a host file atomically: a temp file beside it, written, then renamed over it.

The one way compat-hook writes a host file (a bundle's config.json, the state
dir's cache entries, engine configs): the temp file is created
``O_EXCL|O_NOFOLLOW`` (a symlink or file planted at its name is never
followed or reused), gets the mode and owner, and replaces the target with
``rename``, so a reader sees the old file or the new one, never half of
either; on any failure it is removed. Files inside a container's rootfs are
written by :meth:`compat_hook.facts.rootfs.Root.write_file` instead, through a
confined directory descriptor.

>>> import os, tempfile
>>> d = tempfile.mkdtemp(); p = os.path.join(d, "f")
>>> replace(p, b"one\\n", 0o640); open(p).read(), oct(os.stat(p).st_mode & 0o777), os.listdir(d)
('one\\n', '0o640', ['f'])
"""

from __future__ import annotations

import os

__all__ = ["replace", "fsync_dir"]


def replace(path: str, data: bytes, mode: int, *, owner: tuple | None = None, fsync: bool = False,
            tmp: str | None = None) -> None:
    """Atomically put ``data`` at ``path`` with ``mode`` (and ``owner`` ``(uid, gid)`` when given).

    ``fsync``: flush the file and its directory (engine configs that must
    survive a crash; the hot path skips it); ``tmp``: the temp file's name
    (default: ``.<name>.compat-hook.<pid>.tmp`` beside ``path``).
    """
    d = os.path.dirname(path) or "."
    tmp = tmp or os.path.join(d, f".{os.path.basename(path)}.compat-hook.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if owner is not None and owner != (os.getuid(), os.getgid()):
                try:
                    os.fchown(fd, *owner)
                except PermissionError:
                    pass
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        fsync_dir(d)


def fsync_dir(d: str) -> None:
    """Flush directory ``d`` (a rename or unlink in it), best effort."""
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
