"""Shared fixtures: fake container root filesystems and fake host trees.

``make_rootfs`` builds an image tree from a mapping of in-root paths::

    root = make_rootfs({
        "usr/local/cuda-12.4/compat/libcuda.so.550.54.15": elf(NOTE_575),
        "usr/local/cuda-12.4/compat/libcuda.so.1": Symlink("libcuda.so.550.54.15"),
        "usr/local/cuda": Symlink("cuda-12.4"),
        "etc": Dir(),
    })

``fake_host`` writes what the host tells about its driver (``/proc``, ``/sys``,
the driver library dirs, ``/dev/nvgpu``) under a directory used as
``host_root``, so host facts are read from it and never from this machine.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import stat

import pytest

from tests import elfgen

__all__ = ["HOST_ARCH", "Symlink", "Dir", "Fifo", "CharDev", "elf", "build_tree", "write_fake_host",
           "config_for", "snapshot_tree"]


class Symlink:
    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        self.target = target


class Dir:
    __slots__ = ("mode",)

    def __init__(self, mode: int = 0o755) -> None:
        self.mode = mode


class Fifo:
    __slots__ = ()


class CharDev:
    """A character device node (1:3, the same numbers as /dev/null); needs root."""

    __slots__ = ()


#: The machine the tests run on, as elfgen spells it (x86_64 or aarch64).
HOST_ARCH = os.uname().machine if os.uname().machine in ("x86_64", "aarch64") else "x86_64"


def elf(note: str | None = None, **kw) -> bytes:
    """A valid libcuda-like ELF stub for this machine (ET_DYN, SONAME libcuda.so.1)."""
    kw.setdefault("machine", HOST_ARCH)
    return elfgen.make_elf(note_json=note, **kw)


def build_tree(base, entries: dict) -> pathlib.Path:
    """Create ``entries`` (in-tree path -> bytes | str | Symlink | Dir | Fifo | CharDev) under ``base``."""
    base = pathlib.Path(base)
    base.mkdir(parents=True, exist_ok=True)
    for rel, value in entries.items():
        p = os.path.join(os.fsencode(base), os.fsencode(rel).lstrip(b"/"))
        parent = os.path.dirname(p)
        os.makedirs(parent, exist_ok=True)
        if isinstance(value, Symlink):
            os.symlink(value.target, p)
        elif isinstance(value, Dir):
            os.makedirs(p, exist_ok=True)
            os.chmod(p, value.mode)
        elif isinstance(value, Fifo):
            os.mkfifo(p)
        elif isinstance(value, CharDev):
            os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        else:
            data = value.encode() if isinstance(value, str) else bytes(value)
            with open(p, "wb") as f:
                f.write(data)
    return base


_counter = itertools.count()


@pytest.fixture
def make_rootfs(tmp_path):
    """Factory: ``make_rootfs(entries=None, name=None) -> pathlib.Path`` of a new rootfs."""

    def make(entries: dict | None = None, name: str | None = None) -> pathlib.Path:
        d = tmp_path / (name or f"rootfs{next(_counter)}")
        d.mkdir(parents=True)
        return build_tree(d, entries or {})

    return make


HOST_LIB_DIR = "/usr/lib/x86_64-linux-gnu"


def write_fake_host(base, *, version_line: str | None = None, gpus=None, sys_version: str | None = None,
                    libcuda=None, tegra: bool = False, lib_dir: str = HOST_LIB_DIR) -> pathlib.Path:
    """Write a fake host root under ``base``; returns it.

    version_line: first line of /proc/driver/nvidia/version (a GCC line follows);
    gpus: {bus_id: model} or a list of models (bus ids are made up), each
      written as /proc/driver/nvidia/gpus/<bdf>/information;
    sys_version: content of /sys/module/nvidia/version (written as given);
    libcuda: names of regular files to put in ``lib_dir`` (a list), or a
      mapping name -> bytes | Symlink;
    tegra: create /dev/nvgpu (a regular placeholder file).
    """
    base = pathlib.Path(base)
    base.mkdir(parents=True, exist_ok=True)
    entries: dict = {lib_dir: Dir(), "proc/driver/nvidia": Dir(), "dev": Dir()}
    if version_line is not None:
        entries["proc/driver/nvidia/version"] = (
            version_line + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    if gpus:
        if not isinstance(gpus, dict):
            gpus = {f"0000:{0x17 + i:02x}:00.0": m for i, m in enumerate(gpus)}
        for bus, model in gpus.items():
            entries[f"proc/driver/nvidia/gpus/{bus}/information"] = (
                f"Model: \t\t {model}\nIRQ:             154\nGPU UUID: \t GPU-0a1b2c3d-0000-1111-2222-333344445555\n"
                "Video BIOS: \t 96.00.89.00.01\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
                f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {bus}\nDevice Minor: \t 0\n"
                "GPU Excluded:\t No\n")
    if sys_version is not None:
        entries["sys/module/nvidia/version"] = sys_version
    if libcuda:
        items = libcuda.items() if isinstance(libcuda, dict) else ((n, b"\x7fELF host libcuda") for n in libcuda)
        for name, value in items:
            entries[f"{lib_dir.strip('/')}/{name}"] = value
    if tegra:
        entries["dev/nvgpu"] = b""
    return build_tree(base, entries)


@pytest.fixture
def fake_host(tmp_path):
    """Factory: ``fake_host(base=None, version_line=..., gpus=..., sys_version=..., libcuda=..., tegra=...)``."""

    def make(base=None, **kw) -> pathlib.Path:
        if base is None or pathlib.Path(base) == tmp_path:
            base = tmp_path / f"host{next(_counter)}"
        return write_fake_host(base, **kw)

    return make


def config_for(host_root=None, **values):
    """A validated Config reading host facts under ``host_root`` (NVML off)."""
    from compat_hook.core.config import from_mapping

    data = {"nvml": "off", "log_file": None}
    if host_root is not None:
        data["host_root"] = str(host_root)
    data.update(values)
    return from_mapping(data)


def snapshot_tree(base) -> dict:
    """Every entry under ``base``: path -> (type, mode, size, mtime_ns, content or link target)."""
    out = {}
    base = os.fsencode(base)
    for dirpath, dirnames, filenames in os.walk(base):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    extra = f.read()
            else:
                extra = None
            out[os.path.relpath(p, base)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                             st.st_size if not stat.S_ISDIR(st.st_mode) else None,
                                             st.st_mtime_ns, extra)
    return out
