"""A container root filesystem behind one confined object.

Every path of the image is resolved *inside* the root, the way
``openat2(RESOLVE_IN_ROOT)`` does it: ``..`` at the root stays at the root, an
absolute symlink restarts at the root, and nothing can lead outside, however
the image's symlinks are arranged. The walk is done one component at a time on
``O_PATH`` file descriptors, so a directory renamed or replaced while we walk
cannot move us out either: ``..`` is never looked up on disk, it pops our own
stack of already-opened directories.

Files are only ever opened after the inode they resolve to has been checked
to be a regular file (on an ``O_PATH`` descriptor, which opens nothing), and
reopened through ``/proc/self/fd`` so the checked inode is the one read; a
FIFO, a device node or a directory in its place is never opened. Files are
created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to a confined directory
descriptor and renamed into place, so a symlink planted by the image is
replaced, never followed.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> os.symlink("../../../..", os.path.join(d, "up"))
>>> os.symlink("/up/up/lib", os.path.join(d, "usr")); os.mkdir(os.path.join(d, "lib"))
>>> with Root(d) as r:
...     r.realpath("up"), r.realpath("/usr/../up/usr"), r.exists("/up/etc/passwd")
('/', '/lib', False)
"""

from __future__ import annotations

import errno
from ..core import fastos as os  # os without importing os: ~1 ms of a container start
import stat as _stat

from ..core.errors import UnsafePath
from .surface import (DESCEND, LINK, MAX_SYMLINKS, RESTART, Surface, dirent_kind, enoent, lookup_step, not_regular,
                      split_path)

__all__ = ["Root", "UnsafePath", "MAX_SYMLINKS"]

_O_PATH = getattr(os, "O_PATH", 0o10000000)
_PATH_FLAGS = _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
_S_ISDIR = _stat.S_ISDIR


class _Walk:
    """The result of a lookup: an ``O_PATH`` fd, its stat and its in-root path."""

    __slots__ = ("fd", "st", "parts")

    def __init__(self, fd: int, st: os.stat_result, parts: list) -> None:
        self.fd = fd
        self.st = st
        self.parts = parts

    @property
    def path(self) -> str:
        return "/" + "/".join(self.parts)


class Root(Surface):
    """A confined view of the directory ``path`` (a container rootfs).

    Paths given to its methods are container paths: absolute or relative,
    both taken from the root. Methods raise ``FileNotFoundError`` /
    ``NotADirectoryError`` / ``OSError`` as the system would, and
    :class:`UnsafePath` where a path exists but is of a type that must not be
    used (a FIFO where a regular file is required, say).
    """

    #: ``None``, or a dict in which :func:`compat_hook.facts.loader.ld_so_conf` keeps its reading
    #: of this root: set by the hook for its one start (the image's ``/etc/ld.so.conf`` is read once
    #: for the assessment and the drop-in's write); a Root kept while the image changes has none.
    ld_so_conf_memo = None

    def __init__(self, path: str) -> None:
        self.host_path = os.fspath(path)
        self._fd = os.open(self.host_path, _DIR_FLAGS)

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "Root":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- the walk -----------------------------------------------------------
    def _walk(self, path: str, follow: bool = True, missing_ok: bool = False):
        """Resolve ``path`` inside the root; returns a :class:`_Walk`.

        With ``follow=False`` a symlink in the last component is returned
        itself. With ``missing_ok`` a missing last component returns
        ``(parent_walk, name)`` instead of raising, for creates.
        """
        # stack[i] is an O_PATH fd of the directory named by names[:i]; stack[0] is the root's own
        # fd, never closed here (no dup of it per walk: a GPU start walks ~20 paths).
        root = self._fd
        stack = [root]
        names: list = []
        todo = split_path(path)
        todo.reverse()
        links = 0
        try:
            while todo:
                name = todo.pop()
                if name == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                        names.pop()
                    continue
                try:
                    fd = os.open(name, _PATH_FLAGS, dir_fd=stack[-1])
                except FileNotFoundError:
                    if missing_ok and not todo:
                        pfd = stack.pop() if len(stack) > 1 else os.dup(root)
                        return _Walk(pfd, os.fstat(pfd), list(names)), name
                    raise enoent(path) from None
                st = os.fstat(fd)
                if todo and _S_ISDIR(st.st_mode):
                    # A directory with more to walk: lookup_step's DESCEND, without its call (most
                    # components; ~1 us each at a start, measured with the hook's ~20 walks).
                    names.append(name)
                    stack.append(fd)
                    continue
                # readlinkat(fd, "") reads the link the O_PATH fd pins, so
                # the target read is the link just checked (no swap race).
                try:
                    links, step = lookup_step(st.st_mode, links, lambda: os.readlink("", dir_fd=fd), todo, follow,
                                              path)
                except BaseException:
                    os.close(fd)
                    raise
                if step in (LINK, RESTART):
                    os.close(fd)
                    if step == RESTART:
                        while len(stack) > 1:
                            os.close(stack.pop())
                        del names[:]
                    continue
                names.append(name)
                if step == DESCEND:
                    stack.append(fd)
                    continue
                # Last component.
                return _Walk(fd, st, names)
            # Path was the root itself (or collapsed to it): the caller closes what it gets.
            if missing_ok:
                raise IsADirectoryError(errno.EISDIR, "the root itself", path)
            if len(stack) > 1:
                fd = stack.pop()
                return _Walk(fd, os.fstat(fd), names)
            fd = os.dup(root)
            return _Walk(fd, os.fstat(fd), names)
        finally:
            for fd in stack[1:]:
                os.close(fd)

    # -- queries ------------------------------------------------------------
    def realpath(self, path: str) -> str:
        """The canonical in-root path ``path`` resolves to (it must exist)."""
        w = self._walk(path)
        os.close(w.fd)
        return w.path

    def lstat(self, path: str) -> os.stat_result:
        """``lstat`` of ``path`` resolved in the root (last symlink not followed)."""
        w = self._walk(path, follow=False)
        os.close(w.fd)
        return w.st

    def stat(self, path: str) -> os.stat_result:
        w = self._walk(path)
        os.close(w.fd)
        return w.st

    def _open_dir(self, path: str) -> int:
        """A descriptor of directory ``path`` (resolved inside the root) to list; the caller closes it."""
        w = self._walk(path)
        try:
            if not _stat.S_ISDIR(w.st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            return os.open(f"/proc/self/fd/{w.fd}", _DIR_FLAGS & ~os.O_NOFOLLOW)
        finally:
            os.close(w.fd)

    def listdir(self, path: str) -> list:
        """Entries of a directory as ``(name, kind)``; kind is ``"file"``,
        ``"dir"``, ``"symlink"`` or ``"other"``, never following links."""
        dfd = self._open_dir(path)
        try:
            out = []
            with os.scandir(dfd) as it:
                for e in it:
                    out.append((e.name, dirent_kind(e)))
            return out
        finally:
            os.close(dfd)

    def names(self, path: str, prefix: str | tuple = "") -> list:
        """The names in directory ``path`` starting with ``prefix``: ``os.listdir`` of the dir, no
        ``DirEntry`` per name (a 4,500-entry dir: 3.6 ms against 5.2 ms for :meth:`listdir`, on a busy
        test machine; the ``getdents`` calls are most of it)."""
        dfd = self._open_dir(path)
        try:
            return [n for n in os.listdir(dfd) if n.startswith(prefix)]
        finally:
            os.close(dfd)

    def open_regular(self, path: str, follow: bool = True):
        """Open a regular file read-only; anything else is :class:`UnsafePath`.

        Returns a binary file object. The type is checked on the ``O_PATH``
        descriptor before anything is opened, and the reopen goes through that
        descriptor, so a FIFO or device node is never opened.
        """
        return os.fdopen(self._open_regular_fd(path, follow), "rb", buffering=0)

    def read_file(self, path: str, limit: int = 1 << 20) -> bytes:
        """At most ``limit`` bytes of a regular file: :meth:`open_regular`'s checks, one ``read``.

        What an unbuffered file object's ``read(limit)`` does, without the object and its
        own ``fstat`` (a GPU start reads 3-5 small files: ld.so.conf, its includes, passwd).
        """
        fd = self._open_regular_fd(path, True)
        try:
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def _open_regular_fd(self, path: str, follow: bool) -> int:
        w = self._walk(path, follow=follow)
        try:
            if not _stat.S_ISREG(w.st.st_mode):
                raise not_regular(w.path, w.st.st_mode)
            fd = os.open(f"/proc/self/fd/{w.fd}",
                         os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        finally:
            os.close(w.fd)
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (w.st.st_dev, w.st.st_ino):
            os.close(fd)
            raise UnsafePath(f"file changed while opening: {w.path}")
        return fd

    def open_path(self, path: str) -> tuple:
        """``(fd, resolved)``: an ``O_PATH`` descriptor of ``path`` resolved in the root.

        For operations that need a descriptor rather than a name (a bind
        mount through ``/proc/self/fd/N``, which no image symlink can
        redirect); the caller closes it.
        """
        w = self._walk(path)
        return w.fd, w.path

    # -- changes ------------------------------------------------------------
    def mkdirs(self, path: str, mode: int = 0o755) -> str:
        """Create a directory and its parents inside the root; returns its in-root path.

        Existing symlinks along the way are followed inside the root; a
        dangling one is refused (it would create a directory where the image
        pointed, which is how root-escape tricks start).
        """
        parts = split_path(path)
        for i in range(len(parts)):
            sub = "/" + "/".join(parts[: i + 1])
            try:
                w = self._walk(sub)
            except FileNotFoundError:
                try:
                    lw = self._walk(sub, follow=False)
                except FileNotFoundError:
                    lw = None
                if lw is not None:
                    os.close(lw.fd)
                    raise UnsafePath(f"refusing to create through a dangling symlink: {lw.path}")
                got = self._walk(sub, missing_ok=True)
                if isinstance(got, _Walk):
                    # It appeared since the lookups above (a swap racing us):
                    # check what is there now like any existing entry.
                    w = got
                else:
                    parent, name = got
                    try:
                        os.mkdir(name, mode, dir_fd=parent.fd)
                    except FileExistsError:
                        pass
                    finally:
                        os.close(parent.fd)
                    continue
            try:
                if not _stat.S_ISDIR(w.st.st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), w.path)
            finally:
                os.close(w.fd)
        return self.realpath(path) if parts else "/"

    def _parent_dir_fd(self, path: str):
        """An ``O_RDONLY`` directory fd of the confined parent, and the last name."""
        parts = split_path(path)
        if not parts or parts[-1] == "..":
            raise UnsafePath(f"not a file name: {path!r}")
        parent = "/" + "/".join(parts[:-1])
        w = self._walk(parent)
        try:
            if not _stat.S_ISDIR(w.st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), w.path)
            dfd = os.open(f"/proc/self/fd/{w.fd}", _DIR_FLAGS & ~os.O_NOFOLLOW)
        finally:
            os.close(w.fd)
        return dfd, parts[-1], w.path

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> str:
        """Atomically create or replace the file ``path`` (its parent must exist).

        The bytes go to a fresh ``O_EXCL|O_NOFOLLOW`` temp file in the same
        confined directory, then ``rename`` puts it in place: a symlink or
        file already at ``path`` is replaced as a directory entry, never
        written through. Returns the in-root path written.
        """
        # Imported here: most starts write nothing (no compat, or the drop-in already right).
        from ..core.atomic import replace_at

        dfd, name, parent = self._parent_dir_fd(path)
        try:
            try:
                existing = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            if existing is not None and _stat.S_ISDIR(existing.st_mode):
                raise UnsafePath(f"a directory is in the way: {parent.rstrip('/')}/{name}")
            # Random temp names: the image cannot pre-plant them to make the
            # O_EXCL create fail (a denial of compat, not an escape).
            tmps = (f".{name}.compat-hook.{os.urandom(6).hex()}.tmp" for _ in range(8))
            if replace_at(dfd, name, data, mode, tmps) is None:
                raise UnsafePath(f"cannot create a temp file beside {parent.rstrip('/')}/{name}")
        finally:
            os.close(dfd)
        return parent.rstrip("/") + "/" + name

    def unlink(self, path: str) -> bool:
        """Remove a non-directory entry (a symlink itself, never its target).

        Returns False when there was nothing to remove.
        """
        dfd, name, _ = self._parent_dir_fd(path)
        try:
            os.unlink(name, dir_fd=dfd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)
