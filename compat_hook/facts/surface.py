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
What follows from them is here, once, and so are the path rules every
holder's walk keeps: components split alike (:func:`split_path`), a symlink
followed alike (:func:`follow_link`: at most :data:`MAX_SYMLINKS`, an empty
target missing, an absolute one restarting at the holder's root), each
component looked up taken alike (:func:`lookup_step`).

>>> kind_name(0o010644), kind_name(0o040755)
('FIFO', 'directory')
"""

from __future__ import annotations

import errno
import stat as _stat

from ..core import fastos as os  # os without importing os: a container start reads through Root

__all__ = ["Surface", "kind_name", "not_regular", "dirent_kind", "split_path", "enoent", "follow_link",
           "lookup_step", "MAX_SYMLINKS", "LINK", "RESTART", "DESCEND", "LAST"]

#: Like Linux's limit for one path lookup (ELOOP after 40 links).
MAX_SYMLINKS = 40


def split_path(path: str) -> list:
    """Components of ``path`` (``.`` and empty ones dropped; ``..`` kept for the walk).

    >>> split_path("/usr//local/./cuda/../lib/")
    ['usr', 'local', 'cuda', '..', 'lib']
    """
    return [c for c in path.split("/") if c and c != "."]


def enoent(path: str) -> FileNotFoundError:
    """The ``FileNotFoundError`` every holder raises for a missing ``path``."""
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def follow_link(links: int, read, todo: list, path: str) -> tuple:
    """``(links + 1, absolute)``: one more symlink met walking ``path``, its target queued on ``todo``.

    ``todo`` is the walk's components still to resolve, the next one last;
    ``read()`` returns the link's target, asked only while the count allows
    one more link (ELOOP past :data:`MAX_SYMLINKS`, as Linux's lookup). An
    empty target is missing (ENOENT). ``absolute``: the target starts with
    ``/``, so the caller restarts the walk at its root.

    >>> todo = ["compat"]  # walking /usr/local/cuda/compat, at cuda -> ../cuda-12.4
    >>> follow_link(0, lambda: "../cuda-12.4", todo, "/usr/local/cuda/compat"), todo
    ((1, False), ['compat', 'cuda-12.4', '..'])
    >>> follow_link(1, lambda: "/opt/cuda", todo, "/usr/local/cuda/compat"), todo[-2:]
    ((2, True), ['cuda', 'opt'])
    >>> follow_link(MAX_SYMLINKS, lambda: "x", [], "/loop")
    Traceback (most recent call last):
    ...
    OSError: [Errno 40] Too many levels of symbolic links: '/loop'
    """
    links += 1
    if links > MAX_SYMLINKS:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
    target = read()
    if not target:
        raise enoent(path)
    more = split_path(target)
    more.reverse()
    todo.extend(more)
    return links, target.startswith("/")


#: What :func:`lookup_step` tells a walk to do next: a symlink was followed (its target is on
#: ``todo``), an absolute one (restart at the root), go into the directory, or it was the last one.
LINK, RESTART, DESCEND, LAST = "link", "restart", "descend", "last"


def lookup_step(mode: int, links: int, read, todo: list, follow: bool, path: str) -> tuple:
    """``(links, step)`` for the component of ``path`` a walk just looked up (``mode`` its ``lstat``'s).

    As Linux's lookup: a symlink with more to walk, or the last one when
    ``follow``, is followed (:func:`follow_link` with ``read``): :data:`LINK`,
    or :data:`RESTART` for an absolute target; anything else with more to walk
    must be a directory (ENOTDIR otherwise): :data:`DESCEND`; else it is the
    :data:`LAST` component (a symlink itself when not ``follow``).

    >>> todo = ["lib"]
    >>> lookup_step(0o120777, 0, lambda: "/opt/cuda", todo, True, "/usr/local/cuda/lib"), todo
    ((1, 'restart'), ['lib', 'cuda', 'opt'])
    >>> lookup_step(0o040755, 1, None, todo, True, "/usr/local/cuda/lib")
    (1, 'descend')
    >>> lookup_step(0o120777, 1, None, [], False, "/usr/local/cuda")
    (1, 'last')
    >>> lookup_step(0o100644, 1, None, ["x"], True, "/etc/passwd/x")
    Traceback (most recent call last):
    ...
    NotADirectoryError: [Errno 20] Not a directory: '/etc/passwd/x'
    """
    if _stat.S_ISLNK(mode) and (todo or follow):
        links, absolute = follow_link(links, read, todo, path)
        return links, RESTART if absolute else LINK
    if not todo:
        return links, LAST
    if not _stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    return links, DESCEND


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

    def names(self, path: str, prefix: str | tuple = "") -> list:
        """The names in directory ``path`` that start with ``prefix``, kinds not read (links followed to
        the dir). A holder may do it cheaper than :meth:`listdir` (:meth:`compat_hook.facts.rootfs.Root.names`)."""
        return [n for n, _ in self.listdir(path) if n.startswith(prefix)]

    def read_file(self, path: str, limit: int = 1 << 20) -> bytes:
        """At most ``limit`` bytes of a regular file (:meth:`open_regular`)."""
        with self.open_regular(path) as f:
            return f.read(limit)
