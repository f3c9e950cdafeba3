"""Read one image layer as a stream and keep only the entries that matter.

A layer blob is a tar stream, gzip- or zstd-compressed or plain (told by its
first bytes, not its media type, which can lie). It is read once from start to
end: decompressed in bounded chunks, parsed by :mod:`tarfile` through a
forward-only reader (members never held), and every member is either skipped
or kept as a :class:`~compat_hook.images.view.Node`. Nothing is extracted
(``tarfile.extract`` is never used); names are only keys of the in-memory tree.

What is kept (:func:`keep`), enough for the compat checks and for resolving
paths the way the container will:

* every directory and symlink (cheap, and any of them can redirect a path);
* regular files and others named ``libcuda*`` / ``libnvidia-*``, every entry
  under a directory named ``compat*``, and files named ``*.conf``;
* what tells the image's CUDA runtime (:mod:`compat_hook.facts.cudaruntime`):
  ``libcudart.so.*`` and conda's ``conda-meta/cuda-cudart-*.json`` (names
  only), a ``nvidia_cuda_runtime*.dist-info/METADATA`` and ``torch/version.py``
  (text, in the per-layer text budget);
* the parent dirs of entries not kept (a tar need not list them, and a
  symlink may lead through them);
* content: ``libcuda.so.<version>`` files under a ``compat*`` directory are
  spooled to the reader's private temp dir (a sparse member's holes, and
  64 KiB runs of zeros, stay holes: a 4 GB sparse file costs its data only);
  ``/etc/ld.so.conf``, ``/etc/ld.so.conf.d/*`` and the runtime texts above keep
  their first 64 KiB in memory; any other kept file is fetched on demand by reading its layer again
  (rare: a compat dir outside the usual places; see also
  :mod:`compat_hook.images.reader` for files reached through a symlink).

Whiteouts (``.wh.NAME``) and opaque markers (``.wh..wh..opq``) are recorded
and applied by :class:`~compat_hook.images.view.Tree` before the layer's
entries. Bounds (:class:`~compat_hook.images.reader.Limits`): decompressed bytes and
members per layer, kept entries, spooled bytes, a deadline; crossing one is an
:class:`~compat_hook.core.errors.ImageError` naming the layer.

Speed: gzip is inflated in-process with zlib, which beat spawning ``gzip
-dc`` here (1.08 GB layer: zlib 1.2 s, zlib + sha256 1.6 s, ``gzip -dc``
3.8 s; 2-core EPYC, Debian 12); benchmarks/images.py has the whole read at
0.84x ``gzip -dc``. zstd goes through the ``zstd`` binary
(a second process decompressing while this one parses, and it reports a
truncated frame, which python-zstandard's stream reader does not); the
``zstandard`` module is the fallback when there is no binary.
"""

from __future__ import annotations

import os
import stat as _stat
import tarfile
import time

from ..core.process import StderrTail, big_pipe
from .view import Lazy, Node, Spooled, Tree, Unreadable, split_path

__all__ = ["LayerEntries", "scan_layer", "fetch_member", "keep", "Spool", "CHUNK"]

#: Read and decompress in chunks of this size (the per-call overhead of
#: tarfile and zlib is negligible at 1 MiB; memory stays a few MiB).
CHUNK = 1 << 20
_BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(_BLOCK)
_ZEROS = bytes(CHUNK)
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LIB_PREFIXES = ("libcuda", "libnvidia-")
_TEXT_LIMIT = 64 << 10


def _error(msg: str):
    from ..core.errors import ImageError

    return ImageError(msg)


def normalize(name: str) -> str:
    """A tar member name as an in-image path: ``..`` clamped at the root, no leading ``/``.

    >>> normalize("./usr/../../etc//ld.so.conf"), normalize("/a/b/"), normalize("..")
    ('etc/ld.so.conf', 'a/b', '')
    """
    out: list = []
    for c in split_path(name):
        if c == "..":
            if out:
                out.pop()
        else:
            out.append(c)
    return "/".join(out)


def _binary(path: str) -> bool:
    """Whether a kept file is a library (copied whole when read) rather than a text."""
    return path[path.rfind("/") + 1:].startswith(_LIB_PREFIXES)


def _under_compat(path: str) -> bool:
    # A parent dir named compat* (compat, compat_orin, compat-12.4 ...).
    return path.startswith("compat") or "/compat" in path[: path.rfind("/") + 1]


def keep(path: str, kind: str) -> str | None:
    """How much of an entry to keep: ``None``, ``"meta"``, ``"spool"`` or ``"text"``.

    >>> keep("usr/local/cuda-12.4/compat/libcuda.so.550.54.15", "file")
    'spool'
    >>> keep("usr/lib/x86_64-linux-gnu/libc.so.6", "file") is None, keep("usr/bin", "dir")
    (True, 'meta')
    >>> keep("etc/ld.so.conf.d/cuda.conf", "file"), keep("opt/x/libcuda.so.550.54.15", "file")
    ('text', 'spool')
    >>> keep("usr/lib/x86_64-linux-gnu/libcuda.so.1", "file"), keep("etc/passwd", "file")
    ('meta', 'text')
    """
    if kind in ("dir", "symlink"):
        return "meta"
    name = path[path.rfind("/") + 1:]
    compat = _under_compat(path)
    if kind == "file":
        # a compat driver may sit in any dir the loader reads (one a drop-in names, NGC's lib.real)
        if name.startswith("libcuda.so.") and len(name) > 11 and (compat or name.count(".") >= 3):
            return "spool"
        # ldconfig's configuration, and the homes where micromamba 2 keeps its envs
        if path in ("etc/ld.so.conf", "etc/passwd") or path.startswith("etc/ld.so.conf.d/"):
            return "text"
    if compat or name.startswith(_LIB_PREFIXES) or name.endswith(".conf"):
        return "meta"
    return _runtime(path, name)


def _runtime(path: str, name: str) -> str | None:
    """What :mod:`compat_hook.facts.cudaruntime` reads to tell the image's CUDA runtime (``plan``).

    Names alone for ``libcudart.so.*`` and conda's ``cuda-cudart-*.json``; the
    (small, bounded) text of a CUDA runtime wheel's ``METADATA`` and of
    ``torch/version.py``.

    >>> _runtime("usr/local/cuda-13.0/lib64/libcudart.so.13.0.48", "libcudart.so.13.0.48")
    'meta'
    >>> _runtime("usr/lib/python3/site-packages/nvidia_cuda_runtime_cu12-12.4.127.dist-info/METADATA", "METADATA")
    'text'
    >>> _runtime("usr/lib/python3/site-packages/torch/version.py", "version.py"), _runtime("a/METADATA", "METADATA")
    ('text', None)
    """
    if name.startswith("libcudart.so."):
        return "meta"
    parent = path[:path.rfind("/")] if "/" in path else ""
    pname = parent[parent.rfind("/") + 1:]
    if name == "METADATA" and pname.startswith("nvidia_cuda_runtime") and pname.endswith(".dist-info"):
        return "text"
    if name == "version.py" and pname == "torch":
        return "text"
    if pname == "conda-meta" and name.startswith(("cuda-cudart-", "cudatoolkit-")) and name.endswith(".json"):
        return "meta"
    return None


class Spool:
    """The private temp dir (0700) that kept file contents are copied into."""

    def __init__(self, max_total: int, parent: str | None = None) -> None:
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="compat-hook-images-", dir=parent)
        self.max_total = max_total
        self.used = 0
        self._n = 0

    def create(self) -> tuple:
        """``(fd, path)`` of a new file, created ``O_EXCL|O_NOFOLLOW`` inside the dir."""
        self._n += 1
        path = os.path.join(self.dir, f"f{self._n}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        return fd, path

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


class LayerEntries:
    """What one layer contributes: deletions, then additions in stream order.

    ``adds`` holds ``("d", parent, name, (perm, uid, gid, mtime))``, ``("n",
    parent, name, node)``, ``("l", parent, name, linkname, fallback)`` and
    ``("m", path)`` (a dir only implied by entries not kept) tuples; paths are
    normalized (:func:`normalize`), parents and metadata tuples shared between
    siblings, names shared with the trees built from them. Shared by every
    image with this layer: ~250 bytes an entry.
    """

    __slots__ = ("digest", "whiteouts", "opaques", "adds", "members", "size", "blob_size")

    def __init__(self, digest: str) -> None:
        self.digest = digest
        self.whiteouts: list = []
        self.opaques: list = []
        self.adds: list = []
        self.members = 0
        self.size = 0          # decompressed bytes
        self.blob_size = None  # bytes of the blob as read

    def apply(self, tree: Tree) -> None:
        for path in self.whiteouts:
            tree.whiteout(path)
        for path in self.opaques:
            tree.opaque(path)
        for a in self.adds:
            op = a[0]
            if op == "n":
                tree.add_at(a[1], a[2], a[3])
            elif op == "d":
                tree.add_dir_at(a[1], a[2], *a[3])
            elif op == "m":
                tree.mkdirs(a[1])
            else:
                tree.link_at(a[1], a[2], a[3], a[4])

    @property
    def kept(self) -> int:
        return len(self.adds) + len(self.whiteouts) + len(self.opaques)


# ---------------------------------------------------------------------------- decompression


class _Budget:
    """Decompressed-byte and time bounds of one layer read."""

    __slots__ = ("what", "max_bytes", "deadline", "total")

    def __init__(self, what: str, max_bytes: int, deadline: float | None) -> None:
        self.what = what
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.total = 0

    def count(self, n: int) -> None:
        self.total += n
        if self.total > self.max_bytes:
            raise _error(f"{self.what}: more than {self.max_bytes} bytes decompressed (a decompression bomb?)")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _error(f"{self.what}: not read within the time allowed")


class _Plain:
    def __init__(self, raw, head: bytes, budget: _Budget) -> None:
        self.raw, self.head, self.budget = raw, head, budget

    def read(self, n: int = CHUNK) -> bytes:
        if self.head:
            b, self.head = self.head, b""
        else:
            b = self.raw.read(CHUNK)
        self.budget.count(len(b))
        return b

    def close(self) -> None:
        pass


class _Gzip:
    """zlib inflate of a (multi-member) gzip stream, at most ``CHUNK`` bytes out per call."""

    def __init__(self, raw, head: bytes, budget: _Budget) -> None:
        import zlib

        self.zlib = zlib
        self.raw, self.budget = raw, budget
        self.d = None          # the member being inflated; None between members
        self.tail = head       # compressed bytes not yet fed
        self.members = 0

    def _more(self) -> bool:
        b = self.raw.read(CHUNK)
        self.tail += b
        return bool(b)

    def read(self, n: int = CHUNK) -> bytes:
        zlib = self.zlib
        while True:
            if self.d is None:
                # Another member (pigz, concatenated streams) or the end.
                # Zero padding after the last member is ignored; other bytes
                # are not gzip and make the layer unreadable.
                while len(self.tail) < 2 and self._more():
                    pass
                if not self.tail:
                    return b""
                if self.tail[:2] == _GZIP_MAGIC:
                    self.d = zlib.decompressobj(31)
                    self.members += 1
                    continue
                if self.members and self.tail.count(0) == len(self.tail):
                    self.tail = b""
                    if not self._more():
                        return b""
                    continue
                raise _error(f"{self.budget.what}: bytes after the gzip stream that are not gzip")
            if not self.tail and not self._more():
                raise _error(f"{self.budget.what}: truncated gzip stream")
            try:
                out = self.d.decompress(self.tail, CHUNK)
            except zlib.error as e:
                raise _error(f"{self.budget.what}: not a valid gzip stream ({e})") from None
            if self.d.eof:
                self.tail = self.d.unused_data + self.d.unconsumed_tail
                self.d = None
            else:
                self.tail = self.d.unconsumed_tail
            if out:
                self.budget.count(len(out))
                return out

    def close(self) -> None:
        pass


class _ZstdBinary:
    """``zstd -dc`` in a child process, fed by a thread (raw reads hash the blob there)."""

    def __init__(self, raw, head: bytes, budget: _Budget, binary: str) -> None:
        import subprocess
        import threading

        self.budget = budget
        # --memory: the decoder's window limit, zstd's default made explicit
        # (a frame asking for more is refused, not allocated).
        self.p = subprocess.Popen([binary, "-d", "-c", "-q", "--memory=128MB"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, close_fds=True,
                                  env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
        self.err = StderrTail(self.p.stderr)
        self.failure = None
        big_pipe(self.p.stdout.fileno())

        def feed() -> None:
            try:
                chunk = head
                while chunk:
                    self.p.stdin.write(chunk)
                    chunk = raw.read(CHUNK)
            except (BrokenPipeError, ValueError, OSError):
                pass  # zstd stopped (an error it reports, or we are closing)
            except BaseException as e:  # ImageError from the verified blob reader
                self.failure = e
            finally:
                try:
                    self.p.stdin.close()
                except OSError:
                    pass

        self.thread = threading.Thread(target=feed, name="zstd-feed", daemon=True)
        self.thread.start()

    def read(self, n: int = CHUNK) -> bytes:
        b = self.p.stdout.read(CHUNK)
        if b:
            self.budget.count(len(b))
            return b
        self.thread.join()
        if self.failure is not None:
            raise self.failure
        rc = self.p.wait()
        if rc != 0:
            msg = self.err.last_line()[:200]
            raise _error(f"{self.budget.what}: not a valid zstd stream ({msg or f'zstd exit {rc}'})")
        return b""

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        for f in (self.p.stdout, self.p.stdin):
            try:
                f.close()
            except OSError:
                pass
        self.p.wait()
        self.thread.join()
        self.err.close()


class _ZstdModule:
    """python-zstandard's stream reader (when there is no ``zstd`` binary)."""

    def __init__(self, raw, head: bytes, budget: _Budget) -> None:
        import zstandard

        class Src:
            def __init__(self):
                self.head = head

            def read(self, n=CHUNK):
                if self.head:
                    b, self.head = self.head, b""
                    return b
                return raw.read(n)

        self.zstd = zstandard
        self.budget = budget
        self.r = zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(
            Src(), read_size=CHUNK, read_across_frames=True)

    def read(self, n: int = CHUNK) -> bytes:
        try:
            b = self.r.read(CHUNK)
        except self.zstd.ZstdError as e:
            raise _error(f"{self.budget.what}: not a valid zstd stream ({e})") from None
        self.budget.count(len(b))
        return b

    def close(self) -> None:
        pass


def _decompressor(raw, budget: _Budget, zstd: str):
    head = b""
    while len(head) < 4:
        b = raw.read(CHUNK)
        if not b:
            break
        head += b
    if head[:2] == _GZIP_MAGIC:
        return _Gzip(raw, head, budget)
    if head[:4] == _ZSTD_MAGIC:
        import shutil

        binary = shutil.which("zstd", path="/usr/bin:/bin:/usr/local/bin") if zstd in ("auto", "binary") else None
        if binary:
            return _ZstdBinary(raw, head, budget, binary)
        if zstd == "binary":
            raise _error(f"{budget.what}: zstd-compressed, and there is no zstd binary")
        try:
            return _ZstdModule(raw, head, budget)
        except ImportError:
            raise _error(f"{budget.what}: zstd-compressed: install zstd (or python3-zstandard)") from None
    return _Plain(raw, head, budget)


class _Hashing:
    """The decompressed stream, hashed (docker-archive layers: verified against the config's diff_ids)."""

    def __init__(self, inner, digest: str) -> None:
        import hashlib

        self.inner = inner
        self.alg, _, self.hexd = digest.partition(":")
        self.h = hashlib.new(self.alg)

    def read(self, n: int = CHUNK) -> bytes:
        b = self.inner.read(n)
        self.h.update(b)
        return b

    def close(self) -> None:
        self.inner.close()


# ---------------------------------------------------------------------------- tar scanning


class _Forward:
    """A decompressed stream as a file that seeks forward only: skipped data is dropped, not copied."""

    def __init__(self, src) -> None:
        self.src = src
        self.buf = b""
        self.off = 0     # read position in buf
        self.pos = 0     # stream position

    def _fill(self) -> bool:
        self.buf = self.src.read(CHUNK)
        self.off = 0
        return bool(self.buf)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise _error("a whole-stream read of a layer")  # tarfile never asks for one
        if self.off + n <= len(self.buf):
            b = self.buf[self.off:self.off + n]
            self.off += n
            self.pos += n
            return b
        parts = []
        while n > 0:
            if self.off >= len(self.buf) and not self._fill():
                break
            b = self.buf[self.off:self.off + n]
            self.off += len(b)
            self.pos += len(b)
            n -= len(b)
            parts.append(b)
        return b"".join(parts)

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 1:
            pos += self.pos
        elif whence != 0:
            raise OSError("seek from the end of a layer stream")
        if pos < self.pos:
            raise OSError(f"backward seek in a layer stream ({self.pos} -> {pos})")
        skip = pos - self.pos
        while skip > 0:
            if self.off >= len(self.buf) and not self._fill():
                break  # past the end: the next read comes back short, tarfile says so
            k = min(skip, len(self.buf) - self.off)
            self.off += k
            self.pos += k
            skip -= k
        return self.pos

    def tell(self) -> int:
        return self.pos



class _Info(tarfile.TarInfo):
    """Remembers the last header block read: tarfile ends quietly on a bad one."""

    @classmethod
    def fromtarfile(cls, tf):
        buf = tf.fileobj.read(_BLOCK)
        tf.last_block = buf
        obj = cls.frombuf(buf, tf.encoding, tf.errors)
        obj.offset = tf.fileobj.tell() - _BLOCK
        return obj._proc_member(tf)


def _kind(m: tarfile.TarInfo) -> str:
    if m.isreg():
        return "file"
    if m.isdir():
        return "dir"
    if m.issym():
        return "symlink"
    if m.islnk():
        return "link"
    if m.ischr() or m.isblk() or m.isfifo():
        return "other"
    return "unknown"


_TYPE_BITS = {tarfile.CHRTYPE: _stat.S_IFCHR, tarfile.BLKTYPE: _stat.S_IFBLK, tarfile.FIFOTYPE: _stat.S_IFIFO}


class _Scan:
    """One pass over a layer's tar stream; subclasses decide what to do per member."""

    def __init__(self, raw, *, what: str, limits, deadline: float | None = None,
                 uncompressed: str | None = None) -> None:
        self.budget = _Budget(what, limits.max_layer_bytes, deadline)
        self.what = what
        self.limits = limits
        self.raw = raw
        self.stream = _decompressor(raw, self.budget, limits.zstd)
        if uncompressed:
            self.stream = _Hashing(self.stream, uncompressed)
        self.uncompressed = uncompressed
        self.members = 0

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.stream.close()

    def _run(self) -> None:
        try:
            # "r:" on a forward-only reader, not stream mode "r|": tarfile's
            # _Stream copies every skipped MiB three times (~1.5 s per GB here).
            tf = tarfile.open(fileobj=_Forward(self.stream), mode="r:", tarinfo=_Info,
                              encoding="utf-8", errors="surrogateescape")
        except tarfile.ReadError as e:
            if self.budget.total == 0:
                self._end()  # an empty stream is an empty layer (Go's archive/tar agrees)
                return
            raise _error(f"{self.what}: not a tar stream ({e})") from None
        max_members = self.limits.max_members
        n = 0
        try:
            while True:
                m = tf.next()
                if m is None:
                    break
                tf.members.clear()  # stream mode: never hold members
                n += 1
                if n > max_members:
                    raise _error(f"{self.what}: more than {max_members} tar members")
                self.member(tf, m)
            end = getattr(tf, "last_block", None)
            if end and (len(end) != _BLOCK or end != _ZERO_BLOCK):
                raise _error(f"{self.what}: bad tar header at offset {tf.offset}")
        except tarfile.TarError as e:
            raise _error(f"{self.what}: damaged tar stream ({e})") from None
        except EOFError as e:
            raise _error(f"{self.what}: truncated tar stream ({e})") from None
        except OSError as e:
            raise _error(f"{self.what}: cannot be read ({e.strerror or e})") from None
        finally:
            self.members = n
        self._end()

    def _end(self) -> None:
        # The rest of the stream (the second end block, padding, a gzip
        # trailer): decompressed and hashed like runtimes do, bounded.
        while self.stream.read(CHUNK):
            pass
        if self.uncompressed:
            h = self.stream
            if h.h.hexdigest() != h.hexd:
                raise _error(f"{self.what}: content does not match its diff_id {h.alg}:{h.hexd}")
        self.raw.finish()

    def member(self, tf, m) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


_HOLE = 64 << 10


def _put(fd: int, b: bytes, at: int) -> int:
    """Write ``b`` at ``at``, leaving 64 KiB runs of zeros as holes; returns the bytes written."""
    n = len(b)
    if b == (_ZEROS if n == CHUNK else bytes(n)):
        return 0
    view = memoryview(b)
    written = 0
    for i in range(0, n, _HOLE):
        j = min(i + _HOLE, n)
        if b.count(0, i, j) == j - i:
            continue
        piece, off = view[i:j], at + i
        while piece:
            k = os.pwrite(fd, piece, off)
            piece, off, written = piece[k:], off + k, written + k
    return written


def _segments(tf, m):
    """``(offset, bytes)`` chunks of a member's data: a sparse member's data blocks only (holes are
    never read), a plain one's whole data."""
    if m.sparse:
        stored = m.offset_data
        for off, size in m.sparse:
            if size <= 0:
                continue
            if off < 0 or off + size > m.size:
                raise _error(f"{m.name}: a sparse map entry outside the file")
            tf.fileobj.seek(stored)
            left, at = size, off
            while left:
                b = tf.fileobj.read(min(CHUNK, left))
                if not b:
                    raise _error(f"{m.name}: truncated sparse data")
                yield at, b
                at += len(b)
                left -= len(b)
            stored += size
        return
    f = tf.extractfile(m)
    at = 0
    while at < m.size:
        b = f.read(min(CHUNK, m.size - at))
        if not b:
            return
        yield at, b
        at += len(b)


def _copy_out(tf, m, spool: Spool, limits):
    """Spool a member's bytes (zero runs as holes); :class:`Spooled` or :class:`Unreadable`."""
    room = spool.max_total - spool.used
    cap = min(limits.max_file_bytes, room)
    if m.size > limits.max_file_size:
        return Unreadable(f"{m.name}: {m.size} bytes (a sparse file?): too large for the image reader", 27)
    fd, path = spool.create()
    written = 0
    try:
        for at, b in _segments(tf, m):
            written += _put(fd, b, at)
            if written > cap:
                os.ftruncate(fd, 0)
                if cap < limits.max_file_bytes:
                    # The reader's spool (its temp dir's bound) is full, not this file too big: the
                    # image cannot be read whole here, so it is an error for it, not a guess without it.
                    raise _error(f"{m.name}: more than the {room} bytes left in the image reader's spool "
                                 f"({spool.max_total} in all): this image is not read")
                return Unreadable(f"{m.name}: more than {cap} bytes of data: too large for the image reader",
                                  27)  # EFBIG
        os.ftruncate(fd, m.size)
        spool.used += written
        return Spooled(path)
    finally:
        os.close(fd)


class _Keep(_Scan):
    def __init__(self, raw, *, what, limits, spool, fetcher, deadline=None, uncompressed=None, room=None) -> None:
        super().__init__(raw, what=what, limits=limits, deadline=deadline, uncompressed=uncompressed)
        self.room = room
        self.spool = spool
        self.fetcher = fetcher
        self.out = LayerEntries(what)
        self.text_left = limits.max_text_bytes_per_layer
        self.parents: set = set()
        self.shared: dict = {}   # one object per distinct parent path / metadata tuple / mtime

    def _one(self, v):
        return self.shared.setdefault(v, v)

    def member(self, tf, m) -> None:
        path = normalize(m.name)
        if not path:
            return
        slash = path.rfind("/")
        base = path[slash + 1:]
        out = self.out
        if base.startswith(".wh."):
            parent = path[: slash + 1]
            if base == ".wh..wh..opq":
                out.opaques.append(parent.rstrip("/"))
            elif not base.startswith(".wh..wh.") and base[4:] not in ("", ".", ".."):
                out.whiteouts.append(parent + base[4:])
            self._check()
            return
        kind = _kind(m)
        if kind == "unknown":
            return
        if kind == "link":
            link = normalize(m.linkname)
            if not link:
                return
            how = keep(path, "file")
            if how is None and keep(link, "file") is None:
                return
            # Stands in for a target that was not kept: its bytes come from
            # the layer again, by the target's name, only if ever opened.
            fallback = Node(_stat.S_IFREG | (m.mode & 0o7777), size=0, mtime=int(m.mtime), uid=m.uid, gid=m.gid,
                            content=Lazy(self.fetcher, link, _binary(path))) if how is not None else None
            out.adds.append(("l", self._one(path[:max(slash, 0)]), base, link, fallback))
            self._check()
            return
        how = keep(path, kind)
        if how is None:
            # Not kept, but its parent dirs exist in the container (a tar
            # need not list them): a symlink may lead through them.
            parent = path[:slash] if slash > 0 else ""
            if parent and parent not in self.parents:
                self.parents.add(parent)
                out.adds.append(("m", parent))
                self._check()
            return
        perm = m.mode & 0o7777
        mtime = self._one(int(m.mtime))
        common = dict(mtime=mtime, uid=m.uid, gid=m.gid)
        parent = self._one(path[:max(slash, 0)])
        if kind == "dir":
            out.adds.append(("d", parent, base, self._one((perm, m.uid, m.gid, mtime))))
        elif kind == "symlink":
            out.adds.append(("n", parent, base, Node.symlink(m.linkname, **common)))
        elif kind == "other":
            out.adds.append(("n", parent, base, Node(self._one(_TYPE_BITS[m.type] | perm), size=0, **common)))
        else:
            if how == "spool":
                content = _copy_out(tf, m, self.spool, self.limits)
            elif how == "text" and self.text_left > 0:
                f = tf.extractfile(m)
                content = f.read(min(m.size, _TEXT_LIMIT, self.text_left))
                self.text_left -= len(content)
            else:
                content = Lazy(self.fetcher, path, _binary(path))
            out.adds.append(("n", parent, base, Node(self._one(_stat.S_IFREG | perm), size=m.size, content=content,
                                                     **common)))
        self._check()
        return

    def _check(self) -> None:
        kept = self.out.kept
        if kept > self.limits.max_entries:
            raise _error(f"{self.what}: more than {self.limits.max_entries} entries to keep")
        if self.room is not None and not kept & 4095:
            self.room(kept)  # the reader drops cached layers as this one grows


class _Fetch(_Scan):
    def __init__(self, raw, *, what, limits, spool, path, binary, deadline=None) -> None:
        super().__init__(raw, what=what, limits=limits, deadline=deadline)
        self.spool = spool
        self.path = path
        self.binary = binary
        self.found = None

    def member(self, tf, m) -> None:
        if normalize(m.name) != self.path:
            return
        # The last one of that name wins, as in the tree; the whole layer is
        # still read, so the blob's digest is checked again.
        common = dict(mtime=int(m.mtime), uid=m.uid, gid=m.gid)
        perm = m.mode & 0o7777
        if m.isreg():
            if self.binary:
                content = _copy_out(tf, m, self.spool, self.limits)
            else:
                content = tf.extractfile(m).read(min(m.size, _TEXT_LIMIT))
            self.found = Node(_stat.S_IFREG | perm, size=m.size, content=content, **common)
        elif m.type in _TYPE_BITS:
            self.found = Node(_TYPE_BITS[m.type] | perm, **common)
        elif m.islnk():
            self.found = Node(_stat.S_IFREG | perm, content=Unreadable(
                f"{self.what}: {self.path} is a hard link to {m.linkname}, which was not kept"), **common)


def scan_layer(raw, *, what: str, limits, spool: Spool, fetcher, deadline: float | None = None,
               uncompressed: str | None = None, room=None) -> LayerEntries:
    """Read the whole layer behind ``raw`` and return what it keeps.

    ``raw``: the blob, a reader with ``read(n)`` and ``finish()`` (which
    checks its digest and size once the stream is drained); ``what``: how
    errors name the layer; ``fetcher(member)``: fetches a kept file's bytes
    later (:class:`~compat_hook.images.view.Lazy`); ``uncompressed``: a digest
    the decompressed stream must have (a docker-archive diff_id); ``deadline``:
    a ``time.monotonic()`` value; ``room(n)``: called as the kept entries
    grow (every 4096), so a cache can make room. Raises
    :class:`~compat_hook.core.errors.ImageError`.
    """
    s = _Keep(raw, what=what, limits=limits, spool=spool, fetcher=fetcher, deadline=deadline,
              uncompressed=uncompressed, room=room)
    s.run()
    s.out.members = s.members
    s.out.size = s.budget.total
    s.out.blob_size = getattr(raw, "count", None)
    return s.out


def fetch_member(raw, path: str, *, what: str, limits, spool: Spool, binary: bool = False,
                 deadline: float | None = None):
    """The last non-directory member ``path`` of a layer as a :class:`Node`, or None.

    A regular file's content is spooled (``binary``: a library, read as a
    file) or its first 64 KiB kept.
    """
    s = _Fetch(raw, what=what, limits=limits, spool=spool, path=path, binary=binary, deadline=deadline)
    s.run()
    return s.found
