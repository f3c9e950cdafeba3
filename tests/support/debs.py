"""Real NVIDIA ``libcuda.so`` builds from Debian's ``libcuda1`` packages.

docs/background.md "The ELF note":

=============  =========================  ======================
version        suite/component            cuDriverGetVersion
=============  =========================  ======================
470.256.02     bookworm non-free          11040
535.261.03     bookworm non-free          12020
550.163.01     trixie non-free            12040
555.58.02      experimental non-free      12050
=============  =========================  ======================

470.256.02 is ``libnvidia-tesla-470-cuda1`` (the R470 branch's own package), the others
``libcuda1``. :func:`old_libc` is bullseye's ``libc6`` (glibc 2.31), unpacked: a root an image
with an old glibc would have.

The packages are fetched with a *private* apt state (sources, lists and
archive cache under ``<cache>/apt``); ``/etc/apt`` is never touched.  They are
unpacked with ``dpkg-deb -x``, never installed.

Never call ``cuInit`` on these libraries in the test process: as root it
mknod()s ``/dev/nvidiactl``.  :func:`cuda_driver_version` only calls
``cuDriverGetVersion``, and only in a subprocess.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from tests.support.cache import cache_dir, ensure_dir, locked
from tests.support.versions import COMPAT_550, HOST_470, HOST_535, HOST_555, OLD_GLIBC

Path = pathlib.Path

#: upstream version -> (Debian suite, expected cuDriverGetVersion)
VERSIONS: dict[str, tuple[str, int]] = {
    HOST_470: ("bookworm", 11040),
    HOST_535: ("bookworm", 12020),
    COMPAT_550: ("trixie", 12040),
    HOST_555: ("experimental", 12050),
}
EXPECTED_CUDA = {v: cuda for v, (_, cuda) in VERSIONS.items()}

#: The package and the dir in it, where they are not ``libcuda1`` and :data:`LIB_SUBDIR`.
PACKAGES = {HOST_470: ("libnvidia-tesla-470-cuda1", "usr/lib/x86_64-linux-gnu/nvidia/tesla-470")}
#: Besides the suites' non-free: the old glibc of :func:`old_libc`.
EXTRA_SOURCES = {OLD_GLIBC: "bullseye main"}
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
LIB_SUBDIR = "usr/lib/x86_64-linux-gnu/nvidia/current"


def _apt_dir() -> Path:
    a = cache_dir() / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (a / sub).mkdir(parents=True, exist_ok=True)
    src = "".join(
        f"deb [signed-by={KEYRING}] {MIRROR} {suite}\n"
        for suite in sorted({f"{s} non-free" for s, _ in VERSIONS.values()} | set(EXTRA_SOURCES.values()))
    )
    sl = a / "sources.list"
    if not sl.exists() or sl.read_text() != src:
        sl.write_text(src)
    return a


def _apt_opts(a: Path) -> list[str]:
    opts = {
        "Dir::Etc::SourceList": a / "sources.list",
        "Dir::Etc::SourceParts": a / "sources.list.d",
        "Dir::Etc::Preferences": a / "preferences",  # absent: no host pinning applies
        "Dir::Etc::PreferencesParts": a / "preferences.d",
        "Dir::State::Lists": a / "lists",
        "Dir::Cache": a / "cache",
        "APT::Sandbox::User": "root",  # silences "Download is performed unsandboxed"
        "Acquire::Languages": "none",
    }
    out: list[str] = []
    for k, v in opts.items():
        out += ["-o", f"{k}={v}"]
    return out


def _problems(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith(("E:", "W:", "Err:"))] or lines[-1:]
    return " | ".join(errs)[:400]


def _run(argv: list[str], what: str, cwd: Path | None = None) -> tuple[str, str]:
    try:
        p = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{what}: {e}") from None
    if p.returncode != 0:
        raise RuntimeError(f"{what}: exit {p.returncode}: {_problems(p.stderr + p.stdout)}")
    return p.stdout, p.stderr


def _madison(a: Path, version: str, package: str = "libcuda1") -> str | None:
    """Debian version (e.g. ``550.163.01-2``) of ``package`` whose upstream part is ``version``."""
    out, _ = _run(["apt-cache", *_apt_opts(a), "madison", package], f"apt-cache madison {package}")
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 2 and parts[0] == package and parts[1].split("-")[0].split(":")[-1] == version:
            return parts[1]
    return None


def _download_deb(version: str, package: str = "libcuda1", where: str = "") -> Path:
    debs = cache_dir() / "debs"
    debs.mkdir(exist_ok=True)
    have = sorted(debs.glob(f"{package}_{version}-*_amd64.deb"))
    if have:
        return have[-1]
    with locked("apt"):
        have = sorted(debs.glob(f"{package}_{version}-*_amd64.deb"))
        if have:
            return have[-1]
        a = _apt_dir()
        what = f"{package} {version}: download from {MIRROR} ({where or VERSIONS[version][0] + ' non-free'}) failed"
        debver = None
        if any((a / "lists").glob("*_Packages")):
            debver = _madison(a, version, package)
        update_msgs = ""
        if debver is None:
            out, err = _run(["apt-get", *_apt_opts(a), "-q", "update"], f"{what}: apt-get update")
            update_msgs = _problems(err) if "W:" in err or "E:" in err else ""
            debver = _madison(a, version, package)
        if debver is None:
            raise RuntimeError(f"{what}: no {package} {version}-* in the package lists"
                               + (f" (apt-get update: {update_msgs})" if update_msgs else ""))
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=debs))
        try:
            _run(["apt-get", *_apt_opts(a), "-q", "download", f"{package}={debver}"], what, cwd=tmp)
            got = list(tmp.glob(f"{package}_*.deb"))
            if len(got) != 1:
                raise RuntimeError(f"{what}: apt-get download produced {[g.name for g in got]}")
            final = debs / got[0].name
            os.rename(got[0], final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final


def libcuda(version: str) -> Path:
    """Path of the real, extracted ``libcuda.so.<version>`` (a regular, read-only file).

    Downloads and unpacks the Debian package on first use; cached afterwards.
    Raises :class:`RuntimeError` (one line) when the download fails.
    """
    if version not in VERSIONS:
        raise ValueError(f"unknown libcuda version {version!r}; known: {', '.join(VERSIONS)}")
    package, subdir = PACKAGES.get(version, ("libcuda1", LIB_SUBDIR))
    final = cache_dir() / "libcuda" / version
    lib = final / subdir / f"libcuda.so.{version}"
    if lib.is_file():
        return lib

    def build(tmp: Path) -> None:
        deb = _download_deb(version, package)
        _run(["dpkg-deb", "-x", str(deb), str(tmp)], f"dpkg-deb -x {deb.name}")
        got = tmp / subdir / f"libcuda.so.{version}"
        if not got.is_file() or got.is_symlink():
            raise RuntimeError(f"{deb.name}: no regular file {subdir}/libcuda.so.{version}")
        got.chmod(0o444)

    ensure_dir(final, build, lock=f"libcuda-{version}")
    return lib


def old_libc() -> Path:
    """Bullseye's ``libc6`` (glibc :data:`~tests.support.versions.OLD_GLIBC`) unpacked: a dir holding
    ``lib/x86_64-linux-gnu/{ld-linux-x86-64.so.2,libc.so.6,libdl.so.2,...}`` and ``lib64``."""
    final = cache_dir() / "libc6" / OLD_GLIBC

    def build(tmp: Path) -> None:
        deb = _download_deb(OLD_GLIBC, "libc6", EXTRA_SOURCES[OLD_GLIBC])
        _run(["dpkg-deb", "-x", str(deb), str(tmp)], f"dpkg-deb -x {deb.name}")
        if not (tmp / "lib/x86_64-linux-gnu/libc.so.6").exists():
            raise RuntimeError(f"{deb.name}: no lib/x86_64-linux-gnu/libc.so.6")

    ensure_dir(final, build, lock=f"libc6-{OLD_GLIBC}")
    return final


_VERSION_CODE = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int(-1)
rc = lib.cuDriverGetVersion(ctypes.byref(v))
print(rc, v.value)
"""


def cuda_driver_version(lib: Path) -> int:
    """``cuDriverGetVersion`` of ``lib``, loaded with ctypes in a subprocess (never cuInit)."""
    p = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _VERSION_CODE, str(lib)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"loading {lib} failed (exit {p.returncode}): {tail}")
    rc, v = (int(x) for x in p.stdout.split())
    if rc != 0:
        raise RuntimeError(f"cuDriverGetVersion({lib}) returned CUresult {rc}")
    return v
