"""An image's layers as the node already unpacked them, read as one merged tree.

containerd's overlayfs snapshotter, Docker's overlay2 and containers/storage's
overlay driver keep each layer as a directory; the container sees them
stacked by overlayfs. :class:`Layers` reads such a stack without mounting
anything, with overlay's rules:

* the top layer wins; a directory present in several layers is merged;
* a *whiteout* (a character device 0/0) hides the name in the layers below;
* an *opaque* directory (xattr ``trusted.overlay.opaque=y``, or
  ``user.overlay.opaque=y`` as rootless and ``userxattr`` set it) hides
  what the layers below have under it;
* a non-directory hides a directory of the same name below it.

A single directory (containerd's native snapshotter, a one-layer view, a
vfs layer) is a stack of one.

It answers the reading methods of :class:`~compat_hook.facts.rootfs.Root` (and of
:class:`~compat_hook.images.view.View`): ``realpath``, ``lstat``, ``stat``,
``exists``, ``is_dir``, ``listdir``, ``open_regular``, ``read_file``, with
the same exceptions, so :mod:`compat_hook.facts.imagefacts` and
:mod:`compat_hook.cudaruntime` run on it unchanged. Every path is resolved
*in the merged tree*, component by component, each name looked up with
``O_NOFOLLOW`` relative to a layer's directory descriptor: a symlink in any
layer is resolved against the merged view (absolute targets restart at its
root, ``..`` stops there, 40 links at most), never by the kernel, so nothing
outside the layer dirs is ever reached. A FIFO or device node is never
opened (its type is checked on an ``O_PATH`` descriptor first, as in
``Root``). The tree is attacker-controlled: a directory listing larger than
``max_dir_entries`` or an image read past its ``deadline`` is an
:class:`~compat_hook.images.reader.ImageError` (the image's row says so), never a
hang.

The layer dirs are the node's paths (what containerd's snapshotter or the
engine's graph driver reports). ``host_root`` other than ``/`` says where the
node's root is seen from here (``/host`` in the cluster agent's pod): each dir
is then resolved *inside* it with :class:`~compat_hook.facts.rootfs.Root`, so a
symlink on the way (``/var/lib/containerd`` linked to a data disk, say) is
followed within the node's root and never out of it.

Nothing is written; the directory descriptors opened by the constructor are
the only thing held, until :meth:`Layers.close`.

>>> import os, tempfile
>>> lower, upper = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> os.makedirs(f"{lower}/usr/local/cuda-12.4/compat"); os.makedirs(f"{upper}/usr/local")
>>> open(f"{lower}/usr/local/cuda-12.4/compat/libcuda.so.1", "w").close()
>>> os.symlink("cuda-12.4", f"{upper}/usr/local/cuda")          # the link set by a later layer
>>> os.symlink("/../../..", f"{upper}/up")                       # no way out
>>> with Layers([upper, lower]) as r:
...     r.listdir("/usr/local/cuda/compat"), r.realpath("/up/usr/local/cuda"), sorted(r.listdir("/usr/local"))
([('libcuda.so.1', 'file')], '/usr/local/cuda-12.4', [('cuda', 'symlink'), ('cuda-12.4', 'dir')])
"""

from __future__ import annotations

import errno
import os
import stat as _stat
import time

from ..core.errors import UnsafePath
from ..facts.surface import (LAST, LINK, MAX_SYMLINKS, RESTART, Surface, dirent_kind, enoent, lookup_step,
                             not_regular, split_path)

__all__ = ["Layers", "MAX_SYMLINKS", "OPAQUE_XATTRS"]

#: The xattrs overlayfs reads to make a directory opaque (``user.`` with ``userxattr``).
OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")

_O_PATH = getattr(os, "O_PATH", 0o10000000)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir_in(host, path: str) -> int:
    """A read fd of the directory ``path`` resolved inside ``host`` (a ``Root``): confined, and
    reopened through the checked ``O_PATH`` descriptor so the inode checked is the one read."""
    fd, _ = host.open_path(path)
    try:
        st = os.fstat(fd)
        if not _stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        out = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(fd)
    if (os.fstat(out).st_dev, os.fstat(out).st_ino) != (st.st_dev, st.st_ino):  # pragma: no cover - a race
        os.close(out)
        raise OSError(errno.ESTALE, "directory changed while opening", path)
    return out


def is_whiteout(st: os.stat_result) -> bool:
    """Whether ``st`` is an overlay whiteout: a character device with device number 0/0."""
    return _stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(fd: int) -> bool:
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(fd, name) == b"y":
                return True
        except OSError:
            pass  # ENODATA mostly; no xattr support: not opaque
    return False


class _Entry:
    """What a name is in the merged tree: a directory (``dirs``: its fds, top first) or another
    entry (``parent``: the fd of the layer dir holding it, ``name``), with the stat of its top one."""

    __slots__ = ("st", "dirs", "parent", "name")

    def __init__(self, st, dirs=None, parent: int = -1, name: str = "") -> None:
        self.st, self.dirs, self.parent, self.name = st, dirs, parent, name


class Layers(Surface):
    """The merged, read-only view of layer directories ``dirs`` (top first); see the module docstring.

    ``what`` names the image in errors; ``deadline`` is a ``time.monotonic()``
    instant after which every call raises ImageError.
    """

    #: There is no one directory on the host behind a stack of layers.
    host_path = None

    def __init__(self, dirs: list, *, what: str = "image", max_dir_entries: int = 100_000,
                 deadline: float | None = None, host_root: str | None = None) -> None:
        self.what = what
        self.max_dir_entries = max_dir_entries
        self.deadline = deadline
        self.paths = list(dirs)
        self._fds: list = []
        if not dirs:
            raise self._error("no layer directories")
        host = None
        try:
            if host_root not in (None, "", "/"):
                from ..facts.rootfs import Root

                try:
                    host = Root(host_root)
                except OSError as e:
                    raise self._error(f"host root {host_root}: {e.strerror or e}") from None
            for d in dirs:
                try:
                    self._fds.append(os.open(d, _DIR_FLAGS) if host is None else _open_dir_in(host, d))
                except OSError as e:
                    where = f" under {host_root}" if host is not None else ""
                    raise self._error(f"layer dir {d}{where}: {e.strerror or e}") from None
        except BaseException:
            self.close()
            raise
        finally:
            if host is not None:
                host.close()
        self._root = _Entry(os.fstat(self._fds[0]), dirs=self._fds)

    def _error(self, msg: str):
        from ..core.errors import ImageError

        return ImageError(f"{self.what}: {msg}")

    def _denied(self, path: str):
        # A reader without CAP_DAC_READ_SEARCH (the cluster agent) meets a directory or file that
        # is not root's and not world-readable: the image cannot be read whole, so it is not
        # judged (taking the name as absent would hide what the container sees there).
        return self._error(f"{path}: permission denied in a layer dir (the image cannot be read whole)")

    # -- lifetime -------------------------------------------------------------
    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> "Layers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the walk -------------------------------------------------------------
    def _tick(self) -> None:
        if not self._fds:
            raise self._error("read after close")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise self._error("reading the unpacked layers took too long")

    def _lookup(self, cur: _Entry, name: str, owned: list, path: str) -> _Entry:
        """``name`` in the merged directory ``cur`` (overlay's rules); new dir fds go to ``owned``."""
        found = None
        dirs: list = []
        for fd in cur.dirs:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except NotADirectoryError:
                continue
            except PermissionError:
                raise self._denied(path) from None
            if not _stat.S_ISDIR(st.st_mode):
                if found is None and not is_whiteout(st):
                    return _Entry(st, parent=fd, name=name)
                break  # a whiteout, or a non-directory under a directory: nothing below shows
            try:
                dfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except PermissionError:
                raise self._denied(path) from None
            except OSError:
                break  # swapped since the stat: stop here rather than guess
            owned.append(dfd)
            if found is None:
                found = st
            dirs.append(dfd)
            if _opaque(dfd):
                break
        if found is None:
            raise enoent(path)
        return _Entry(found, dirs=dirs)

    def _walk(self, path: str, follow: bool = True) -> tuple:
        """``(entry, in-tree names, fds to close)``, resolved like :meth:`Root._walk`."""
        self._tick()
        todo = split_path(path)
        todo.reverse()
        names: list = []
        cur = self._root
        owned: list = []
        level: list = []
        links = 0
        try:
            while todo:
                name = todo.pop()
                if name == "..":
                    if names:
                        names.pop()
                        cur = self._descend(names, owned, path)
                    continue
                level = []
                ent = self._lookup(cur, name, level, path)
                # on an error (ELOOP, ENOENT, ENOTDIR) the except below closes level's and owned's fds
                links, step = lookup_step(ent.st.st_mode, links, lambda: os.readlink(name, dir_fd=ent.parent),
                                          todo, follow, path)
                if step in (LINK, RESTART):
                    self._release(level)
                    if step == RESTART:
                        del names[:]
                        self._release(owned)
                        cur = self._root
                    continue
                names.append(name)
                if step == LAST:
                    owned.extend(level)  # the parent's fds stay open: ent.parent is one of them
                    return ent, names, owned
                # the parent's fds are not needed any more (".." walks again from the root)
                self._release(owned)
                owned.extend(level)
                level = []
                cur = ent
            return cur, names, owned
        except BaseException:
            self._release(owned)
            self._release(level)
            raise

    def _descend(self, names: list, owned: list, path: str) -> _Entry:
        """The merged directory ``names`` (canonical: every component a directory), walked from the root."""
        self._release(owned)
        cur = self._root
        for n in names:
            cur = self._lookup(cur, n, owned, path)
            if cur.dirs is None:
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        return cur

    @staticmethod
    def _release(owned: list) -> None:
        while owned:
            os.close(owned.pop())

    # -- queries (Root's reading surface) ---------------------------------------
    def realpath(self, path: str) -> str:
        """The canonical in-image path ``path`` resolves to (it must exist)."""
        _, names, owned = self._walk(path)
        self._release(owned)
        return "/" + "/".join(names)

    def lstat(self, path: str) -> os.stat_result:
        ent, _, owned = self._walk(path, follow=False)
        self._release(owned)
        return ent.st

    def stat(self, path: str) -> os.stat_result:
        ent, _, owned = self._walk(path)
        self._release(owned)
        return ent.st

    def listdir(self, path: str) -> list:
        """Entries of a merged directory as ``(name, kind)`` (``file``, ``dir``, ``symlink``, ``other``),
        whiteouts and what they hide left out; more than ``max_dir_entries`` is an ImageError."""
        ent, names, owned = self._walk(path)
        try:
            if ent.dirs is None:
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            seen: dict = {}
            hidden: set = set()
            scanned = 0
            for fd in ent.dirs:
                dfd = os.open(".", _DIR_FLAGS, dir_fd=fd)
                try:
                    with os.scandir(dfd) as it:
                        for e in it:
                            scanned += 1
                            if scanned > self.max_dir_entries:
                                raise self._error(f"/{'/'.join(names)}: more than {self.max_dir_entries} "
                                                  "entries in its layers")
                            n = e.name
                            if n in seen or n in hidden:
                                continue
                            kind = dirent_kind(e)
                            if kind == "other":
                                try:
                                    st = os.stat(n, dir_fd=fd, follow_symlinks=False)
                                except OSError:
                                    continue
                                if is_whiteout(st):
                                    hidden.add(n)
                                    continue
                            seen[n] = kind
                finally:
                    os.close(dfd)
                self._tick()
            return list(seen.items())
        finally:
            self._release(owned)

    def open_regular(self, path: str, follow: bool = True):
        """A binary file object of a regular file; anything else is :class:`UnsafePath`.

        The type is checked on an ``O_PATH`` descriptor and the reopen goes
        through it, so a FIFO or device node is never opened.
        """
        ent, names, owned = self._walk(path, follow)
        try:
            where = "/" + "/".join(names)
            if not _stat.S_ISREG(ent.st.st_mode):
                raise not_regular(where, ent.st.st_mode)
            pfd = os.open(ent.name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=ent.parent)
            try:
                st = os.fstat(pfd)
                if not _stat.S_ISREG(st.st_mode):
                    raise UnsafePath(f"file changed while opening: {where}")
                try:
                    fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
                except PermissionError:
                    raise self._denied(where) from None
            finally:
                os.close(pfd)
        finally:
            self._release(owned)
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise UnsafePath(f"file changed while opening: {where}")
        return os.fdopen(fd, "rb", buffering=0)

