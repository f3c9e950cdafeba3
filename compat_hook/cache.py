"""The state-dir cache: parsed configs and inspected libraries.

Why: importing PyYAML (~25 ms) and pyelftools (~50-100 ms) on every
container start would cost several times the hook's whole budget, yet their
answers only change when the file they read changes.

What makes an entry safe to use:

* config entries store the exact text they were parsed from and are used
  only when the file's bytes are identical, so they cannot be stale;
* library entries are keyed on the file's identity on the host:
  ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``. Any write, chmod or
  rename-over changes the ctime, which userspace cannot set back, so a file
  that changed has a different key. An image cannot forge another image's
  key: it would need the same inode on the same device at the same time;
* entries live in ``<state_dir>/cache`` (mode 0700, root's), are written to a
  temp file and renamed into place (a reader sees a whole entry or none), and
  are validated field by field on load: a damaged or tampered entry is a
  miss, never a different answer;
* the tool version is part of every entry, so an upgrade re-parses.

Nothing here raises: a cache that cannot be read or written is a miss.
"""

from __future__ import annotations

import os
import zlib

from . import __version__, jsonfast

__all__ = ["get_config", "put_config", "get_elf", "put_elf", "file_key", "MAX_ENTRIES"]

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
        tmp = os.path.join(d, f".{name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, jsonfast.dumps(obj).encode())
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(d, name))
    except (OSError, ValueError, TypeError):
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, NameError):
            pass
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
    return f"config-{zlib.crc32(os.fsencode(path)):08x}.json"


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
    """The identity of a file on this host (see the module docstring)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _elf_name(key: list) -> str:
    return "elf-" + "-".join(str(k) for k in key) + ".json"


def get_elf(state_dir: str, st: os.stat_result):
    """The cached ``ElfInfo`` dict for the file with this stat, or ``None``."""
    key = file_key(st)
    obj = _read(os.path.join(_dir(state_dir), _elf_name(key)))
    if obj is None or obj.get("key") != key:
        return None
    info = obj.get("info")
    return info if isinstance(info, dict) else None


def put_elf(state_dir: str, st: os.stat_result, info: dict) -> bool:
    key = file_key(st)
    return _write(state_dir, _elf_name(key),
                  {"format": _FORMAT, "tool": __version__, "key": key, "info": info})
