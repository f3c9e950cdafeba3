"""An image's merged filesystem, held in memory, read like a :class:`~compat_hook.facts.rootfs.Root`.

Layers are applied to a :class:`Tree` the way container runtimes apply them
(containerd's ``archive.Apply``, umoci): a layer's whiteouts and opaque
markers first remove what the layers below put there, then its entries are
added in order; an entry's parent dirs are resolved *in the tree*, following
symlinks set by earlier layers (an entry ``usr/local/cuda/compat/x`` lands in
``cuda-12.4`` when ``/usr/local/cuda -> cuda-12.4``), and created when
missing; an entry replacing a directory with anything else drops its subtree;
a hard link names the same :class:`Node` as its target (parent resolved, the
last component not followed, like containerd's ``hardlinkRootPath``).

:class:`View` then answers the reading methods of ``Root`` - ``realpath``,
``lstat``, ``stat``, ``exists``, ``is_dir``, ``listdir``, ``open_regular``,
``read_file`` - with the same resolution rules (``..`` clamped at the root,
absolute symlinks restart at the root, 40 links at most) and the same
exceptions, so :func:`compat_hook.facts.imagefacts.gather` and the assessment run
on it unchanged. Nothing in the tree touches the disk; a file's content is
held by its node (:attr:`Node.content`): bytes, a spooled copy, a fetch on
demand, or the reason it cannot be read.

>>> t = Tree()
>>> t.add_dir("usr/local/cuda-12.4/compat")
>>> t.add("usr/local/cuda-12.4/compat/libcuda.so.550.54.15", Node.file(b"\\x7fELF...", size=8))
>>> t.add("usr/local/cuda", Node.symlink("cuda-12.4"))
>>> v = t.view()
>>> v.realpath("/usr/local/cuda/compat"), v.listdir("/usr/local/cuda/compat")
('/usr/local/cuda-12.4/compat', [('libcuda.so.550.54.15', 'file')])
>>> v.read_file("/usr/local/cuda/../cuda/compat/libcuda.so.550.54.15", 4)
b'\\x7fELF'
"""

from __future__ import annotations

import errno
import io
import os
import stat as _stat

from ..facts.surface import LAST, LINK, MAX_SYMLINKS, RESTART, Surface, enoent, lookup_step, not_regular, split_path

__all__ = ["Node", "Link", "Tree", "View", "Spooled", "Lazy", "Unreadable", "split_path", "MAX_SYMLINKS"]


class Spooled:
    """A file's bytes copied to the reader's private temp dir (holes kept as holes)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path


class Unreadable:
    """A file whose content cannot be read through the view, with the reason."""

    __slots__ = ("reason", "errno")

    def __init__(self, reason: str, err: int = errno.EIO) -> None:
        self.reason = reason
        self.errno = err


class Lazy:
    """Content fetched on first open: ``fetcher(member, spool)`` returns bytes, :class:`Spooled` or
    :class:`Unreadable`; ``spool``: a file to copy whole (a library), not a text to keep the head of."""

    __slots__ = ("fetcher", "member", "spool")

    def __init__(self, fetcher, member: str, spool: bool = False) -> None:
        self.fetcher = fetcher
        self.member = member
        self.spool = spool


_LINK_MODE = _stat.S_IFLNK | 0o777


class _Inode:
    """What :class:`Node` and :class:`Link` share: the kind and a stat result."""

    __slots__ = ()

    @property
    def kind(self) -> str:
        """``file``, ``dir``, ``symlink`` or ``other``, as :meth:`Root.listdir` names them."""
        fmt = _stat.S_IFMT(self.mode)
        if fmt == _stat.S_IFREG:
            return "file"
        if fmt == _stat.S_IFDIR:
            return "dir"
        if fmt == _stat.S_IFLNK:
            return "symlink"
        return "other"

    def stat(self) -> os.stat_result:
        # st_ino from the object (hard links share it); st_dev 0: no device;
        # st_nlink 1 (the tree does not count links). Computed here, not
        # stored: a big image keeps ~100k nodes.
        size = len(self.target.encode("utf-8", "surrogateescape")) if self.target is not None else self.size
        return os.stat_result((self.mode, id(self) >> 4, 0, 1, self.uid, self.gid, size,
                               self.mtime, self.mtime, self.mtime))


class Node(_Inode):
    """One inode: ``mode`` has the type bits; ``children`` only for directories.

    Non-directory nodes never change once built (a lazy ``content`` is filled
    in once), so a layer's nodes are shared by every image that has the layer.
    """

    __slots__ = ("mode", "uid", "gid", "size", "mtime", "target", "content", "children")

    def __init__(self, mode: int, *, size: int = 0, mtime: int = 0, uid: int = 0, gid: int = 0,
                 target: str | None = None, content=None) -> None:
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.size = size
        self.mtime = mtime
        self.target = target
        self.content = content
        self.children = {} if _stat.S_ISDIR(mode) else None

    @classmethod
    def file(cls, content=None, *, size: int | None = None, perm: int = 0o644, **kw) -> "Node":
        if size is None:
            size = len(content) if isinstance(content, bytes) else 0
        return cls(_stat.S_IFREG | perm, size=size, content=content, **kw)

    @staticmethod
    def symlink(target: str, **_meta) -> "Link":
        return Link(target)

    @classmethod
    def directory(cls, perm: int = 0o755, **kw) -> "Node":
        return cls(_stat.S_IFDIR | perm, **kw)


class Link(_Inode):
    """A symlink: its target only (owner and times read as 0). Images hold tens of thousands, and a
    32-byte object instead of a 96-byte :class:`Node` keeps a 100k-entry image under 64 MiB."""

    __slots__ = ("target",)
    mode = _LINK_MODE
    uid = gid = size = mtime = 0
    content = children = None

    def __init__(self, target: str) -> None:
        self.target = target


def _walk(root: Node, path: str, follow: bool = True, create: bool = False, miss=None) -> tuple:
    """``(node, in-root components)`` of ``path`` resolved like :meth:`Root._walk`.

    ``create``: missing components become directories (applying a layer:
    runtimes create an entry's missing parents, through symlinks).
    ``miss(parent, names, name)``: asked for a missing last component
    reached through a symlink; returns a node, or None (missing).
    """
    stack = [root]
    names: list = []
    todo = split_path(path)
    todo.reverse()
    links = 0
    while todo:
        name = todo.pop()
        if name == "..":
            if len(stack) > 1:
                stack.pop()
                names.pop()
            continue
        node = stack[-1].children.get(name)
        if node is None and miss is not None and links and not todo:
            node = miss(stack[-1], names, name)
        if node is None:
            if not create:
                raise enoent(path)
            node = stack[-1].children[name] = Node.directory()
        links, step = lookup_step(node.mode, links, lambda: node.target or "", todo, follow, path)
        if step == RESTART:
            del stack[1:]
            del names[:]
        if step in (LINK, RESTART):
            continue
        names.append(name)
        if step == LAST:
            return node, names
        stack.append(node)
    return stack[-1], names


class Tree:
    """The merged filesystem being built, layer by layer (see the module docstring)."""

    def __init__(self, max_entries: int | None = None) -> None:
        self.root = Node.directory()
        self.entries = 0
        self.max_entries = max_entries
        # parent path -> its dir node, while no dir or symlink is replaced:
        # siblings follow each other in a tar (50 images sharing a base
        # apply its entries 50 times).
        self._dirs: dict = {}

    def forget(self) -> None:
        """Drop the parent cache (a whiteout, an opaque dir, a replaced dir or symlink)."""
        self._dirs.clear()

    def _dir(self, path: str) -> Node:
        """The directory ``path`` (in-image, resolved through symlinks), created when missing."""
        node = self._dirs.get(path)
        if node is not None:
            return node
        node, names = _walk(self.root, path, create=True)
        if node.children is None:
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/" + "/".join(names))
        self._dirs[path] = node
        return node

    def _count(self) -> None:
        self.entries += 1
        if self.max_entries is not None and self.entries > self.max_entries:
            from ..core.errors import ImageError

            raise ImageError(f"more than {self.max_entries} entries kept: too large to read")

    @staticmethod
    def _split(path: str) -> tuple:
        parts = split_path(path)
        if not parts or parts[-1] == "..":
            return None, None
        return "/".join(parts[:-1]), parts[-1]

    # -- what a layer does ---------------------------------------------------
    def whiteout(self, path: str) -> None:
        """``.wh.NAME``: remove NAME (and its subtree) left by the layers below."""
        self.forget()
        parent, name = self._split(path)
        if name is None:
            return
        try:
            node, _ = _walk(self.root, parent)
        except OSError:
            return
        if node.children is not None:
            node.children.pop(name, None)

    def opaque(self, path: str) -> None:
        """``DIR/.wh..wh..opq``: DIR keeps nothing of the layers below."""
        self.forget()
        try:
            node, _ = _walk(self.root, path)
        except OSError:
            return
        if node.children is not None:
            node.children.clear()

    def mkdirs(self, path: str) -> None:
        """Make sure directory ``path`` exists (created through symlinks, like a parent)."""
        self._dir(path)

    def add_dir_at(self, parent: str, name: str, perm: int = 0o755, uid: int = 0, gid: int = 0,
                   mtime: int = 0) -> None:
        """A directory entry ``parent/name``: an existing directory keeps its children."""
        d = self._dir(parent)
        old = d.children.get(name)
        if old is not None and old.children is not None:
            old.mode, old.uid, old.gid, old.mtime = _stat.S_IFDIR | perm, uid, gid, mtime
            return
        if old is not None and old.target is not None:
            self.forget()  # a symlink made a directory: paths through it resolve anew
        self._count()
        d.children[name] = Node.directory(perm, uid=uid, gid=gid, mtime=mtime)

    def add_at(self, parent: str, name: str, node: Node) -> None:
        """A non-directory entry ``parent/name`` (replaces whatever was there)."""
        d = self._dir(parent)
        old = d.children.get(name)
        if old is not None and (old.children is not None or old.target is not None):
            self.forget()  # a directory or symlink replaced: paths through it resolve anew
        self._count()
        d.children[name] = node

    def link_at(self, parent: str, name: str, linkname: str, fallback: Node | None = None) -> None:
        """A hard link to ``linkname``; ``fallback`` stands in when the target was not kept."""
        lparent, lname = self._split(linkname)
        target = None
        if lname is not None:
            try:
                d, _ = _walk(self.root, lparent)
                target = d.children.get(lname) if d.children is not None else None
            except OSError:
                target = None
        if target is None or target.children is not None:
            # Not kept (or a directory, which no runtime links): the layer's
            # own record of the link, if it was worth keeping.
            target = fallback
        if target is not None:
            self.add_at(parent, name, target)

    # -- by whole path (tests, examples) ---------------------------------------
    def add_dir(self, path: str, **meta) -> None:
        parent, name = self._split(path)
        if name is not None:
            self.add_dir_at(parent, name, **meta)

    def add(self, path: str, node: Node) -> None:
        parent, name = self._split(path)
        if name is not None:
            self.add_at(parent, name, node)

    def view(self, resolver=None) -> "View":
        return View(self.root, resolver)


class View(Surface):
    """Read-only, :class:`~compat_hook.facts.rootfs.Root`-compatible access to a :class:`Tree`.

    Paths are container paths; the same exceptions as ``Root``:
    ``FileNotFoundError``, ``NotADirectoryError``, ``OSError(ELOOP)``, and
    :class:`~compat_hook.core.errors.UnsafePath` for a non-regular file where a
    regular one is required. A file whose content was not kept raises
    ``OSError`` when opened (:class:`Unreadable`).
    """

    #: There is no directory on the host behind an image view.
    host_path = None

    def __init__(self, root: Node, resolver=None) -> None:
        self._root = root
        # resolver(requested, parent, names, name): a node the tree did not
        # keep, looked up again (see compat_hook.images.reader); None: missing.
        self._resolver = resolver

    # -- lifetime (nothing to release: the reader owns the spooled files) ------
    def close(self) -> None:
        pass

    def __enter__(self) -> "View":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- queries ------------------------------------------------------------
    def _walk(self, path: str, follow: bool = True) -> tuple:
        r = self._resolver
        if r is None:
            return _walk(self._root, path, follow)
        return _walk(self._root, path, follow, miss=lambda parent, names, name: r(path, parent, names, name))

    def realpath(self, path: str) -> str:
        """The canonical in-image path ``path`` resolves to (it must exist)."""
        return "/" + "/".join(self._walk(path)[1])

    def lstat(self, path: str) -> os.stat_result:
        return self._walk(path, follow=False)[0].stat()

    def stat(self, path: str) -> os.stat_result:
        return self._walk(path)[0].stat()

    def listdir(self, path: str) -> list:
        """Entries of a directory as ``(name, kind)``, never following links.

        Only the entries the reader kept are listed (see :mod:`compat_hook.images.layers`).
        """
        node, _ = self._walk(path)
        if node.children is None:
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        return [(name, child.kind) for name, child in node.children.items()]

    def open_regular(self, path: str, follow: bool = True):
        """A binary file object of a regular file; anything else is :class:`UnsafePath`."""
        node, names = self._walk(path, follow)
        where = "/" + "/".join(names)
        if not _stat.S_ISREG(node.mode):
            raise not_regular(where, node.mode)
        content = node.content
        if isinstance(content, Lazy):
            content = node.content = content.fetcher(content.member, content.spool)
        if isinstance(content, bytes):
            return io.BytesIO(content)
        if isinstance(content, Spooled):
            fd = os.open(content.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            return os.fdopen(fd, "rb", buffering=0)
        if isinstance(content, Unreadable):
            raise OSError(content.errno, content.reason, where)
        raise OSError(errno.EIO, "content not kept by the image reader", where)

    def walk_entries(self):
        """Every kept entry as ``(path, node)``, parents first (for tests and reports)."""
        todo = [("", self._root)]
        while todo:
            base, node = todo.pop()
            for name, child in sorted(node.children.items(), reverse=True):
                p = f"{base}/{name}"
                yield p, child
                if child.children is not None:
                    todo.append((p, child))
