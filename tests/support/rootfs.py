"""A minimal, real, Debian-like container root filesystem for the harness.

Layout (merged /usr, as in debian:12 images)::

    bin -> usr/bin   lib -> usr/lib   lib64 -> usr/lib64   sbin -> usr/sbin
    usr/bin/busybox (+ applet symlinks)          busybox-static from the host
    usr/lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
    usr/lib/x86_64-linux-gnu/{ld-linux-x86-64.so.2,libc.so.6,libm.so.6,libdl.so.2,libpthread.so.0,librt.so.1}
    usr/sbin/ldconfig                              the host's static ldconfig
    etc/ld.so.conf                                 "include /etc/ld.so.conf.d/*.conf"
    etc/ld.so.conf.d/x86_64-linux-gnu.conf         /usr/local/lib, /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu
    etc/ld.so.cache                                from "ldconfig -r <rootfs>" at build time
    usr/local/bin/probe                            tests/support/probe.c, built with the host gcc
    usr/local/cuda-12.4/compat/libcuda.so.<ver>    (compat_lib) + libcuda.so.1, libcuda.so symlinks
    usr/local/cuda -> cuda-12.4                    (cuda_symlink)
    proc sys dev tmp run                           empty mount points

Everything is copied (never hard-linked to host or cache files), so a hook
that writes into the rootfs cannot damage the host or the cache.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess

from tests.support.cache import cache_dir, ensure_dir
from tests.support.versions import COMPAT_550

Path = pathlib.Path

PROBE_SRC = Path(__file__).with_name("probe.c")
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "env", "echo", "grep", "true", "sleep", "stat", "readlink")
MULTIARCH = "usr/lib/x86_64-linux-gnu"
HOST_MULTIARCH = Path("/lib/x86_64-linux-gnu")
GLIBC_LIBS = ("ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
LDCONFIG = Path("/sbin/ldconfig")
DEFAULT_COMPAT_DIR = "usr/local/cuda-12.4/compat"
#: In the container: the host library an engine mounts, and the compat library the images carry.
HOST_LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
COMPAT_LIBCUDA = f"/{DEFAULT_COMPAT_DIR}/libcuda.so.{COMPAT_550}"
LD_SO_CONF = "include /etc/ld.so.conf.d/*.conf\n"
MULTIARCH_CONF = "# Multiarch support\n/usr/local/lib\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"


def probe_binary(runpath: str | None = None, rpath: str | None = None) -> Path:
    """The compiled probe (cached under ``<cache>/probe/<sha256 of probe.c + gcc>``).

    ``runpath``: built with that ``DT_RUNPATH`` (``$ORIGIN/../lib``, as conda
    builds every binary of an env), so its ``dlopen`` searches there before
    the ld cache, as a conda env's libraries do; ``rpath``: built with that
    ``DT_RPATH`` (``-Wl,--disable-new-dtags``), searched before ``LD_LIBRARY_PATH``.
    """
    src = PROBE_SRC.read_bytes()
    gcc = shutil.which("gcc") or "/usr/bin/gcc"
    gcc_ver = subprocess.run([gcc, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    key = hashlib.sha256(src + b"\0" + gcc_ver.encode() + (b"\0" + runpath.encode() if runpath else b"")
                         + (b"\0rpath\0" + rpath.encode() if rpath else b"")).hexdigest()[:16]
    final = cache_dir() / "probe" / key
    link = [f"-Wl,--enable-new-dtags,-rpath,{runpath}"] if runpath else []
    if rpath:
        link += [f"-Wl,--disable-new-dtags,-rpath,{rpath}"]

    def build(tmp: Path) -> None:
        p = subprocess.run(
            [gcc, "-O2", "-Wall", "-Werror", *link, "-o", str(tmp / "probe"), str(PROBE_SRC)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
        )
        if p.returncode != 0:
            raise RuntimeError(f"compiling {PROBE_SRC} failed: {p.stderr.strip()}")

    ensure_dir(final, build, lock="probe")
    return final / "probe"


def _copy(src: Path, dst: Path, mode: int | None = None) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst, follow_symlinks=True)
    os.chmod(dst, mode if mode is not None else (os.stat(src).st_mode & 0o7777))


def _symlink(target: str, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(target, link)


def lib_version(lib: Path) -> str:
    """``"550.163.01"`` from ``.../libcuda.so.550.163.01``."""
    name = Path(lib).name
    if not name.startswith("libcuda.so.") or name.count(".") < 3:
        raise ValueError(f"not a versioned libcuda file name: {name}")
    return name[len("libcuda.so."):]


def install_libcuda(rootfs: Path, lib: Path, rel_dir: str) -> Path:
    """Copy ``lib`` into ``rootfs/rel_dir`` (regular file) with the libcuda.so.1 / libcuda.so symlinks."""
    ver = lib_version(lib)
    d = Path(rootfs) / rel_dir.strip("/")
    dst = d / f"libcuda.so.{ver}"
    _copy(Path(lib), dst, 0o644)
    _symlink(f"libcuda.so.{ver}", d / "libcuda.so.1")
    _symlink("libcuda.so.1", d / "libcuda.so")
    return dst


def run_ldconfig(rootfs: Path) -> None:
    """``ldconfig -r <rootfs>`` with the host's static ldconfig (reads rootfs/etc/ld.so.conf)."""
    p = subprocess.run([str(LDCONFIG), "-r", str(rootfs)], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"ldconfig -r {rootfs} failed: {p.stderr.strip()}")


def build_rootfs(
    dest: Path,
    *,
    compat_lib: Path | None = None,
    compat_dir: str = DEFAULT_COMPAT_DIR,
    cuda_symlink: bool = True,
    ld_so_conf: bool = True,
    extra_files: dict | None = None,
) -> Path:
    """Create the rootfs at ``dest`` (must not exist or be empty) and return it.

    ``extra_files`` maps rootfs-relative paths to ``str``/``bytes`` contents
    (written as files), or to a :class:`pathlib.Path` (copied).  They are
    written before the build-time ``ldconfig -r`` so a drop-in under
    ``etc/ld.so.conf.d/`` is already reflected in ``etc/ld.so.cache``.
    """
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty")
    root = root.resolve()

    for d in ("usr/bin", "usr/sbin", "usr/lib64", MULTIARCH, "usr/local/bin", "usr/local/lib",
              "etc/ld.so.conf.d", "proc", "sys", "dev", "tmp", "run", "root", "var"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        os.symlink(target, root / name)

    _copy(BUSYBOX, root / "usr/bin/busybox", 0o755)
    for a in APPLETS:
        os.symlink("busybox", root / "usr/bin" / a)

    for lib in GLIBC_LIBS:
        _copy(HOST_MULTIARCH / lib, root / MULTIARCH / lib)
    os.symlink("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", root / "usr/lib64/ld-linux-x86-64.so.2")
    _copy(LDCONFIG, root / "usr/sbin/ldconfig", 0o755)
    _copy(probe_binary(), root / "usr/local/bin/probe", 0o755)

    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    if ld_so_conf:
        (root / "etc/ld.so.conf").write_text(LD_SO_CONF)
    (root / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text(MULTIARCH_CONF)

    if compat_lib is not None:
        install_libcuda(root, Path(compat_lib), compat_dir)
        if cuda_symlink:
            parts = Path(compat_dir.strip("/")).parts  # e.g. usr/local/cuda-12.4/compat
            if len(parts) >= 2 and parts[-1] == "compat" and parts[-2] != "cuda":
                link = root / Path(*parts[:-2]) / "cuda"
                _symlink(parts[-2], link)  # usr/local/cuda -> cuda-12.4 (relative)

    for rel, content in (extra_files or {}).items():
        p = root / str(rel).lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            _copy(content, p)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)

    run_ldconfig(root)
    return root
