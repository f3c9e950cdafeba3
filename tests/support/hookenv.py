"""Helpers for running the real compat-hook in real containers.

* :func:`fake_host` writes a fake host root whose ``/proc/driver/nvidia/version``
  names a driver version (what hostfacts reads under ``host_root``), with
  :func:`tests.support.trees.write_fake_host`.
* :func:`write_config` writes a YAML config for the hook (host_root, log_file,
  state dir, extras) and returns its path.
* :func:`read_log` returns the hook's JSON log lines.
* :func:`snapshot` records a rootfs tree (paths, types, modes, sizes, mtimes,
  symlink targets, regular-file bytes digest) for before/after comparisons.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from tests.support.trees import VERSION_LINE, write_fake_host

Path = pathlib.Path

PROC_VERSION = VERSION_LINE + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"


def set_host_version(host_root: Path, version: str) -> None:
    p = Path(host_root) / "proc/driver/nvidia/version"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(PROC_VERSION.format(v=version))


def fake_host(dest: Path, version: str) -> Path:
    """A host root whose ``/proc/driver/nvidia/version`` names ``version`` (resolved)."""
    return write_fake_host(dest, version=version).resolve()


def write_config(path: Path, *, host_root: Path, log_file: Path, **extra) -> Path:
    """A YAML config (JSON is YAML) with ``host_root``, ``log_file`` and ``extra`` keys."""
    data = {"host_root": str(host_root), "log_file": str(log_file), **extra}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path.resolve()


def read_log(log_file: Path) -> list[dict]:
    p = Path(log_file)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def snapshot(root: Path, *, exclude: tuple = ()) -> dict:
    """``{relpath: (kind, mode, size, mtime_ns, detail)}`` for every entry under ``root``."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel in exclude:
                continue
            st = os.lstat(full)
            if os.path.islink(full):
                out[rel] = ("link", st.st_mode, st.st_size, st.st_mtime_ns, os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = ("dir", st.st_mode, 0, st.st_mtime_ns, None)
            else:
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def diff(before: dict, after: dict) -> dict:
    """What changed between two :func:`snapshot`\\s (empty when nothing did)."""
    return {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)}
