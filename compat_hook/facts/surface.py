"""The one reading surface the checks see, whatever holds the tree.

A container's rootfs on disk (:class:`compat_hook.facts.rootfs.Root`), an
image read into memory (:class:`compat_hook.images.view.View`) and the layer
dirs an engine already unpacked (:class:`compat_hook.images.unpacked.Layers`)
answer the same questions the same way, so :mod:`compat_hook.facts.imagefacts`,
:mod:`compat_hook.facts.cudaruntime` and the toolkit model read all three
without knowing which it is. Each holder implements the primitives, resolving
every path inside its own tree: ``realpath``, ``lstat``, ``stat``,
``listdir`` (``(name, kind)``, never following links) and ``open_regular`` (a
binary file object of a regular file, anything else :class:`UnsafePath`).
What follows from them is here, once.

>>> kind_name(0o010644), kind_name(0o040755)
('FIFO', 'directory')
"""

from __future__ import annotations

import stat as _stat

__all__ = ["Surface", "kind_name", "not_regular", "dirent_kind"]


def kind_name(mode: int) -> str:
    """The file type in words, for error messages (``FIFO``, ``symlink``, ...)."""
    for test, name in ((_stat.S_ISDIR, "directory"), (_stat.S_ISLNK, "symlink"),
                       (_stat.S_ISFIFO, "FIFO"), (_stat.S_ISCHR, "character device"),
                       (_stat.S_ISBLK, "block device"), (_stat.S_ISSOCK, "socket"),
                       (_stat.S_ISREG, "regular file")):
        if test(mode):
            return name
    return "unknown type"


def dirent_kind(entry) -> str:
    """``file``, ``symlink``, ``dir`` or ``other`` for an ``os.DirEntry``, as ``listdir`` names them.

    d_type answers without a stat and never follows a link; files first, the
    common case in a compat dir.
    """
    if entry.is_file(follow_symlinks=False):
        return "file"
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "other"


def not_regular(where: str, mode: int):
    """The :class:`~compat_hook.core.errors.UnsafePath` every holder raises for a non-regular file."""
    from ..core.errors import UnsafePath

    return UnsafePath(f"not a regular file: {where} ({kind_name(mode)})")


class Surface:
    """What every tree holder offers on top of its primitives."""

    __slots__ = ()

    def exists(self, path: str) -> bool:
        """Whether ``path`` resolves to anything in the tree (links followed)."""
        try:
            self.stat(path)
            return True
        except OSError:
            return False

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` resolves to a directory in the tree (links followed)."""
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except OSError:
            return False

    def read_file(self, path: str, limit: int = 1 << 20) -> bytes:
        """At most ``limit`` bytes of a regular file (:meth:`open_regular`)."""
        with self.open_regular(path) as f:
            return f.read(limit)
