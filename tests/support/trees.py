"""Trees on disk for the tests: rootfs entries, libcuda-like ELF stubs and the one fake-host writer.

:func:`build_tree` creates a tree from a mapping of in-tree paths to bytes,
text, :class:`Symlink`, :class:`Dir`, :class:`Fifo` or :class:`CharDev`.
:func:`write_fake_host` writes what a host tells about its driver
(``/proc``, ``/sys``, the driver library dirs, ``/dev/nvgpu``) under a
directory used as ``host_root``, so host facts are read from it and never from
this machine; the ``fake_host`` fixture (tests/conftest.py),
:func:`tests.support.hookenv.fake_host` and the other tests' host roots all
call it. Where the code under test reads the machine's own ``/`` (the
built-in defaults: ``host_root: /``), :func:`machine_driver_argv` runs a
command with a fake host's ``/proc/driver`` over this machine's.
"""

from __future__ import annotations

import os
import pathlib
import stat

from tests import elfgen

__all__ = ["HOST_ARCH", "elf", "Symlink", "Dir", "Fifo", "CharDev", "build_tree", "HOST_LIB_DIR", "VERSION_LINE",
           "write_fake_host", "machine_driver_argv"]


#: The machine the tests run on, as elfgen spells it (x86_64 or aarch64).
HOST_ARCH = os.uname().machine if os.uname().machine in ("x86_64", "aarch64") else "x86_64"


def elf(note: str | None = None, **kw) -> bytes:
    """A valid libcuda-like ELF stub for this machine (ET_DYN, SONAME libcuda.so.1)."""
    kw.setdefault("machine", HOST_ARCH)
    return elfgen.make_elf(note_json=note, **kw)


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


HOST_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
#: The first line of /proc/driver/nvidia/version for ``version=`` (the proprietary module's form).
VERSION_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Mon Jan  6 12:00:00 UTC 2025"


def write_fake_host(base, *, version: str | None = None, version_line: str | None = None, gpus=None,
                    sys_version: str | None = None, libcuda=None, tegra: bool = False,
                    lib_dir: str = HOST_LIB_DIR, pci: dict | None = None) -> pathlib.Path:
    """Write a fake host root under ``base``; returns it. The one fake-host writer of the tests.

    version: the kernel driver's version, as the proprietary module's line
      (:data:`VERSION_LINE`) says it; or
    version_line: first line of /proc/driver/nvidia/version (a GCC line follows);
    gpus: {bus_id: model} or a list of models (bus ids are made up), each
      written as /proc/driver/nvidia/gpus/<bdf>/information;
    sys_version: content of /sys/module/nvidia/version (written as given);
    libcuda: names of regular files to put in ``lib_dir`` (a list), or a
      mapping name -> bytes | Symlink;
    tegra: create /dev/nvgpu (a regular placeholder file);
    pci: {bus_id: device id ("0x2330")}: NVIDIA 3D controllers under /sys/bus/pci/devices
      (vendor, device, class files as sysfs has them), listed by the driver or not.
    """
    base = pathlib.Path(base)
    base.mkdir(parents=True, exist_ok=True)
    entries: dict = {lib_dir: Dir(), "proc/driver/nvidia": Dir(), "dev": Dir()}
    if version is not None:
        assert version_line is None, "version or version_line, not both"
        version_line = VERSION_LINE.format(v=version)
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
    for bus, device in (pci or {}).items():
        for name, value in (("vendor", "0x10de"), ("device", device), ("class", "0x030200")):
            entries[f"sys/bus/pci/devices/{bus}/{name}"] = value + "\n"
    return build_tree(base, entries)


def machine_driver_argv(host_root) -> list:
    """An argv prefix running a command with ``host_root``'s ``/proc/driver`` bind-mounted over this
    machine's, in a private mount namespace (root only; nothing outside the command sees it).

    For code that reads the host driver at ``/`` (the built-in defaults' ``host_root``): the
    driver is faked at the file boundary, the command itself runs unchanged (``exec``).
    """
    import shutil

    unshare = shutil.which("unshare", path="/usr/bin:/bin") or "/usr/bin/unshare"
    src = os.path.join(os.fspath(host_root), "proc/driver")
    return [unshare, "-m", "--propagation", "private", "/bin/sh", "-c",
            'mount --bind "$0" /proc/driver && exec "$@"', src]
