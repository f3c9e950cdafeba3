"""Replace a host file atomically: a temp file beside it, written, then renamed over it.

The one way compat-hook writes a host file (a bundle's config.json, the state
dir's cache entries, engine configs): the temp file is created
``O_EXCL|O_NOFOLLOW`` (a symlink or file planted at its name is never
followed or reused), gets the mode and owner, and replaces the target with
``rename``, so a reader sees the old file or the new one, never half of
either; on any failure it is removed. Files inside a container's rootfs are
written by :meth:`compat_hook.facts.rootfs.Root.write_file`, through a
confined directory descriptor, with the same code (:func:`replace_at`).

>>> import os, tempfile
>>> d = tempfile.mkdtemp(); p = os.path.join(d, "f")
>>> replace(p, b"one\\n", 0o640); open(p).read(), oct(os.stat(p).st_mode & 0o777), os.listdir(d)
('one\\n', '0o640', ['f'])
"""

from __future__ import annotations

import errno
from . import fastos as os  # os without importing os: ~1 ms of a container start (fastos)

__all__ = ["replace", "replace_at", "fsync_dir"]


def replace(path: str, data: bytes, mode: int, *, owner: tuple | None = None, fsync: bool = False,
            tmp: str | None = None) -> None:
    """Atomically put ``data`` at ``path`` with ``mode`` (and ``owner`` ``(uid, gid)`` when given).

    ``fsync``: flush the file and its directory (engine configs that must
    survive a crash; the hot path skips it); ``tmp``: the temp file's name
    (default: ``.<name>.compat-hook.<pid>.tmp`` beside ``path``).
    """
    d = os.path.dirname(path) or "."
    tmp = tmp or os.path.join(d, f".{os.path.basename(path)}.compat-hook.{os.getpid()}.tmp")
    if replace_at(None, path, data, mode, (tmp,), owner=owner, fsync=fsync) is None:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), tmp)
    if fsync:
        fsync_dir(d)


def replace_at(dir_fd: int | None, name: str, data: bytes, mode: int, tmp_names, *,
               owner: tuple | None = None, fsync: bool = False) -> str | None:
    """The one write-then-rename: put ``data`` at ``name`` (relative to ``dir_fd``, or a path when None).

    The temp file is the first of ``tmp_names`` that can be created
    ``O_EXCL|O_NOFOLLOW`` (a name already taken, by a file or a planted
    symlink, is skipped, never followed or reused); it gets ``mode`` (and
    ``owner``), is flushed when ``fsync``, then renamed over ``name``; on any
    failure it is removed. Returns the temp name used, or None when every name
    was taken (nothing was written). :func:`replace` calls it with a path,
    :meth:`compat_hook.facts.rootfs.Root.write_file` with a confined directory
    descriptor.

    >>> import os, tempfile
    >>> d = os.open(tempfile.mkdtemp(), os.O_RDONLY | os.O_DIRECTORY)
    >>> open(os.open("taken", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=d), "w").close()
    >>> replace_at(d, "f", b"x", 0o644, ("taken", "free")), sorted(os.listdir(d))
    ('free', ['f', 'taken'])
    >>> replace_at(d, "f", b"y", 0o644, ("taken",)) is None
    True
    """
    for tmp in tmp_names:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        return None
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
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    return tmp


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
