"""The state-dir cache: parsed configs and inspected libraries.

Why: importing PyYAML and pyelftools (docs/design.md, "Hot path rules") on every
container start would cost several times the hook's whole budget, yet their
answers only change when the file they read changes.

What makes an entry safe to use:

* config entries store the exact text they were parsed from and are used
  only when the file's bytes are identical, so they cannot be stale;
* library entries are found by ``(inode, size, mtime)`` and used only if
  the bytes the ELF reader read when the entry was made are, re-read now,
  the same (a blake2b digest over every range it read, ~3 KB of a 28 MB
  libcuda). The reader is a function of those bytes, so a hit gives exactly
  the answer parsing would: an image that forges the metadata of another
  image's library still gets a miss;
* entries live in ``<state_dir>/cache`` (mode 0700, root's), are written to a
  temp file and renamed into place (a reader sees a whole entry or none), and
  are validated field by field on load: a damaged or tampered entry is a
  miss, never a different answer;
* the tool version is part of every entry, so an upgrade re-parses.

Nothing here raises: a cache that cannot be read or written is a miss.
"""

from __future__ import annotations

from . import fastos as os  # os without importing os: ~1 ms of a container start (fastos)

from .. import __version__
from . import jsonfast

__all__ = ["get_config", "put_config", "get_elf", "put_elf", "file_key", "Recorder", "MAX_ENTRIES"]

#: Prune the oldest entries past this many files (one per library seen).
MAX_ENTRIES = 1024
_FORMAT = 1


def _dir(state_dir: str) -> str:
    return os.path.join(state_dir, "cache")


def _read(path: str):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, 1 << 20)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        obj = jsonfast.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("format") != _FORMAT or obj.get("tool") != __version__:
        return None
    return obj


def _write(state_dir: str, name: str, obj: dict) -> bool:
    d = _dir(state_dir)
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        from .atomic import replace

        # A random temp name: concurrent hooks write the same entry at once.
        replace(os.path.join(d, name), jsonfast.dumps(obj).encode(), 0o600,
                tmp=os.path.join(d, f".{name}.{os.urandom(6).hex()}.tmp"))
    except (OSError, ValueError, TypeError):
        return False
    _prune(d)
    return True


def _prune(d: str) -> None:
    try:
        names = [n for n in os.listdir(d) if n.endswith(".json")]
        if len(names) <= MAX_ENTRIES:
            return
        aged = sorted(names, key=lambda n: os.stat(os.path.join(d, n)).st_mtime_ns)
        for n in aged[: len(names) - MAX_ENTRIES]:
            os.unlink(os.path.join(d, n))
    except OSError:
        pass


def _config_name(path: str) -> str:
    """The entry's file name: a 32-bit FNV-1a of the path (the entry itself names the path it is for).

    Not ``zlib.crc32``: importing zlib cost ~80 us of every container start, this ~15 us
    (a fresh ``python3 -I -S``, minimum of 40 runs). Two paths that share a name share
    an entry, which :func:`get_config` then finds for the other path: a miss.

    >>> _config_name("a")  # FNV-1a's published test vector for "a": 0xe40c292c
    'config-e40c292c.json'
    """
    h = 0x811C9DC5
    for b in os.fsencode(path):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"config-{h:08x}.json"


def get_config(state_dir: str, path: str, text: str):
    """The parsed mapping cached for this exact config text, or ``None``."""
    obj = _read(os.path.join(_dir(state_dir), _config_name(path)))
    if obj is None or obj.get("path") != path or obj.get("text") != text:
        return None
    data = obj.get("data")
    return data if isinstance(data, dict) else None


def put_config(state_dir: str, path: str, text: str, data) -> bool:
    if not isinstance(data, dict):
        return False
    return _write(state_dir, _config_name(path),
                  {"format": _FORMAT, "tool": __version__, "path": path, "text": text, "data": data})


def file_key(st: os.stat_result) -> list:
    """Where an entry for this file is looked up: ``[inode, size, mtime_ns]``.

    Not ``st_dev``: an overlay rootfs gets a new device number at every
    mount, so the same image file would never be seen again under
    containerd or Podman. The key only finds a candidate entry; what makes
    it usable is the content check (:func:`get_elf`).
    """
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _elf_name(key: list) -> str:
    return "elf-" + "-".join(str(k) for k in key) + ".json"


def _hasher():
    try:
        import _blake2  # the C module alone: hashlib's import costs ~5 ms (OpenSSL)

        return _blake2.blake2b(digest_size=20)
    except ImportError:  # pragma: no cover
        import hashlib

        return hashlib.blake2b(digest_size=20)


#: An entry may re-read at most this much (the ELF reader reads ~3 KB of a
#: real 28 MB libcuda; its own caps allow a 1 MiB string table).
_MAX_SPANS, _MAX_SPAN_BYTES = 256, 2 << 20


class Recorder:
    """A read-only file wrapper that remembers every byte range read, in order.

    The ELF reader is a deterministic function of the bytes it reads (and
    the file size): each read's offset comes from bytes read before it. So
    if every recorded range holds the same bytes again, the reader would take
    the same path and return the same answer - which is what lets a cache
    entry stand in for parsing, whatever happened to the file's metadata.
    """

    def __init__(self, f) -> None:
        self._f = f
        self._pos = 0
        self.spans: list = []
        self.total = 0
        self._h = _hasher()

    def fileno(self) -> int:
        return self._f.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = self._f.seek(offset, whence)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.spans.append([self._pos, len(data)])
        self.total += len(data)
        self._h.update(data)
        self._pos += len(data)
        return data

    def digest(self) -> str:
        return self._h.hexdigest()


def _same_bytes(fd: int, spans, digest: str) -> bool:
    if not isinstance(spans, list) or len(spans) > _MAX_SPANS or not isinstance(digest, str):
        return False
    h = _hasher()
    total = 0
    for span in spans:
        if (not isinstance(span, list) or len(span) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in span)):
            return False
        off, n = span
        total += n
        if total > _MAX_SPAN_BYTES:
            return False
        data = os.pread(fd, n, off) if n else b""
        if len(data) != n:
            return False
        h.update(data)
    return h.hexdigest() == digest


def get_elf(state_dir: str, st: os.stat_result, fd: int):
    """The cached ``ElfInfo`` dict for the open file ``fd`` (stat ``st``), or ``None``.

    A hit needs the same size and, re-read from ``fd`` now, the very bytes
    the parser read when the entry was made (blake2b over every range).
    """
    key = file_key(st)
    obj = _read(os.path.join(_dir(state_dir), _elf_name(key)))
    if obj is None or obj.get("key") != key:
        return None
    info = obj.get("info")
    if not isinstance(info, dict):
        return None
    try:
        if not _same_bytes(fd, obj.get("spans"), obj.get("digest")):
            return None
    except OSError:
        return None
    return info


def put_elf(state_dir: str, st: os.stat_result, info: dict, recorder: Recorder) -> bool:
    """Store ``info`` for the file ``st``, with the ranges ``recorder`` saw."""
    if len(recorder.spans) > _MAX_SPANS or recorder.total > _MAX_SPAN_BYTES:
        return False
    key = file_key(st)
    return _write(state_dir, _elf_name(key),
                  {"format": _FORMAT, "tool": __version__, "key": key, "spans": recorder.spans,
                   "digest": recorder.digest(), "info": info})
