"""Self-tests of the container harness in tests/support/.

Real runc/crun containers on a real (minimal) rootfs with real Debian libcuda
builds; only the GPU and kernel driver are missing, which cuDriverGetVersion
does not need.  The "host driver" is a stand-in for the NVIDIA Container
Toolkit legacy prestart hook that bind-mounts a host libcuda into the
container and runs ldconfig for the container root.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

from tests.support import debs, rootfs, runtimes as rt
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "crun"])
SYS_DIR = "/usr/lib/x86_64-linux-gnu"
COMPAT_DIR = "/usr/local/cuda-12.4/compat"
PROBE = "/usr/local/bin/probe"

# Ids of the containers this module started, for the leak checks at the end.
_started: list[str] = []


@pytest.fixture(scope="module")
def libs() -> dict[str, pathlib.Path]:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


def _run(bundle: pathlib.Path, runtime: str, **kw) -> rt.Result:
    res = rt.run_container(bundle, runtime, **kw)
    _started.append(res.container_id)
    return res


def _container(tmp_path, runtime, libs, *, host=HOST_535, compat=COMPAT_550, env_extra=(), stage="prestart",
               after=(), args=(PROBE,), extra_files=None, **bundle_kw) -> rt.Result:
    work = tmp_path / "work"
    root = rootfs.build_rootfs(tmp_path / "bundle" / "rootfs", compat_lib=libs[compat] if compat else None,
                               extra_files=extra_files)
    hooks = {}
    if host:
        hooks[stage] = [rt.nvidia_standin_hook(libs[host], work, stage)]
    for st, entry in after:
        hooks.setdefault(st, []).append(entry)
    bundle = rt.make_bundle(tmp_path / "bundle", root, args=list(args), env=list(rt.DEFAULT_ENV) + list(env_extra),
                            hooks=hooks, **bundle_kw)
    return _run(bundle, runtime)


def _assert_probe(res: rt.Result, cuda: int, lib: str) -> None:
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": str(cuda), "libcuda": lib}, str(res)


# --------------------------------------------------------------------------- debs


@pytest.mark.parametrize("version,cuda", sorted(debs.EXPECTED_CUDA.items()))
def test_cuda_driver_version(libs, version, cuda):
    lib = libs[version]
    assert lib.name == f"libcuda.so.{version}" and lib.is_file() and not lib.is_symlink()
    assert debs.cuda_driver_version(lib) == cuda
    assert debs.libcuda(version) == lib  # cached


def test_unknown_version_is_rejected():
    with pytest.raises(ValueError):
        debs.libcuda("999.1")


# --------------------------------------------------------------------------- rootfs / bundle


def test_build_rootfs_layout(tmp_path, libs):
    rootfs.probe_binary()  # the compile is not part of the build budget
    t0 = time.monotonic()
    root = rootfs.build_rootfs(tmp_path / "r", compat_lib=libs[COMPAT_550])
    elapsed = time.monotonic() - t0
    assert elapsed < 15, elapsed  # a bound on a hang, not a speed goal (well under 1 s on a quiet machine)
    compat = root / COMPAT_DIR.lstrip("/")
    assert (compat / f"libcuda.so.{COMPAT_550}").is_file() and not (compat / f"libcuda.so.{COMPAT_550}").is_symlink()
    assert os.readlink(compat / "libcuda.so.1") == f"libcuda.so.{COMPAT_550}"
    assert os.readlink(compat / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(root / "usr/local/cuda") == "cuda-12.4"
    assert (root / "usr/local/cuda/compat").resolve() == compat
    assert (root / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    assert (root / "etc/ld.so.cache").stat().st_size > 0
    assert os.access(root / "usr/local/bin/probe", os.X_OK)
    for applet in rootfs.APPLETS:
        assert os.readlink(root / "usr/bin" / applet) == "busybox"

    bare = rootfs.build_rootfs(tmp_path / "bare", ld_so_conf=False, cuda_symlink=False)
    assert not (bare / "etc/ld.so.conf").exists() and not (bare / "usr/local/cuda").exists()


def test_make_bundle_root_modes(tmp_path):
    root = rootfs.build_rootfs(tmp_path / "elsewhere")
    b1 = rt.make_bundle(tmp_path / "b1", root, readonly=True, annotations={"a": "b"})
    cfg = json.loads((b1 / "config.json").read_text())
    assert cfg["root"] == {"path": str(root), "readonly": True}
    assert cfg["process"]["terminal"] is False and cfg["process"]["args"] == [PROBE]
    assert cfg["annotations"] == {"a": "b"} and "hooks" not in cfg
    b2 = rt.make_bundle(tmp_path / "b2", root, move_rootfs=True)
    assert json.loads((b2 / "config.json").read_text())["root"] == {"path": "rootfs", "readonly": False}
    assert (b2 / "rootfs/usr/local/bin/probe").is_file() and not root.exists()


# --------------------------------------------------------------------------- containers


@pytest.mark.containers
@RUNTIMES
def test_no_libcuda_at_all(tmp_path, runtime, libs):
    """Without a host driver or compat lib, dlopen fails: nothing leaks in from the host."""
    res = _container(tmp_path, runtime, libs, host=None, compat=None)
    assert res.rc == 3, str(res)
    assert res.stdout.startswith("dlopen-error=libcuda.so.1: cannot open shared object file"), str(res)


@pytest.mark.containers
@RUNTIMES
@pytest.mark.parametrize("stage", ["prestart", "createContainer"])
def test_host_driver_wins_by_default(tmp_path, runtime, libs, stage):
    """Compat 550 in the image, host 535: ldconfig's cache points at the host lib."""
    res = _container(tmp_path, runtime, libs, stage=stage)
    _assert_probe(res, 12020, f"{SYS_DIR}/libcuda.so.{HOST_535}")
    assert (tmp_path / "bundle/rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1").is_symlink()


@pytest.mark.containers
@RUNTIMES
def test_ld_library_path_selects_compat(tmp_path, runtime, libs):
    res = _container(tmp_path, runtime, libs, env_extra=["LD_LIBRARY_PATH=/usr/local/cuda/compat"])
    _assert_probe(res, 12040, f"{COMPAT_DIR}/libcuda.so.{COMPAT_550}")


@pytest.mark.containers
@RUNTIMES
def test_newer_host_driver(tmp_path, runtime, libs):
    res = _container(tmp_path, runtime, libs, host=HOST_555)
    _assert_probe(res, 12050, f"{SYS_DIR}/libcuda.so.{HOST_555}")


@pytest.mark.containers
@RUNTIMES
def test_absolute_readonly_root(tmp_path, runtime, libs):
    """root.path absolute (rootfs outside the bundle) and root.readonly=true."""
    work = tmp_path / "work"
    root = rootfs.build_rootfs(tmp_path / "image", compat_lib=libs[COMPAT_550])
    bundle = rt.make_bundle(tmp_path / "bundle", root, readonly=True,
                            hooks={"prestart": [rt.nvidia_standin_hook(libs[HOST_535], work)]})
    _assert_probe(_run(bundle, runtime), 12020, f"{SYS_DIR}/libcuda.so.{HOST_535}")


@pytest.mark.containers
@RUNTIMES
@pytest.mark.parametrize("dropin,cuda,lib", [
    ("00-00-compat-hook.conf", 12040, f"{COMPAT_DIR}/libcuda.so.{COMPAT_550}"),
    ("zz-compat-hook.conf", 12020, f"{SYS_DIR}/libcuda.so.{HOST_535}"),
], ids=["dropin-first", "dropin-last"])
def test_dropin_and_ldconfig_after_standin(tmp_path, runtime, libs, dropin, cuda, lib):
    """The ordering our real hook relies on.

    A drop-in listing the compat dir is in the image before start; the
    stand-in bind-mounts host 535 and runs ldconfig; then a second prestart
    hook (placed AFTER the stand-in) re-runs ``/sbin/ldconfig -r <rootfs>``.

    Observed (runc 1.1.5 and crun 1.8.1, glibc 2.36 ldconfig): ld.so.cache
    holds BOTH ``libcuda.so.1`` entries, in ld.so.conf order (``include``
    globs expand sorted, so ``00-00-compat-hook.conf`` comes before
    ``x86_64-linux-gnu.conf``), and the dynamic loader takes the FIRST one.
    ldconfig does not prefer the higher version across directories (it only
    picks the newest file per SONAME within one directory): a drop-in that
    sorts after ``x86_64-linux-gnu.conf`` (``zz-...``) loses to the host lib.

    The re-run must happen in the container's mount namespace (nsenter from
    prestart, or createContainer).  Run from the host namespace, ldconfig sees
    the stand-in's empty mount-point file instead of the bind-mounted lib and
    silently drops the host entry from the cache: the compat lib would then
    "win" by default, proving nothing.  (dlopen still finds the host lib via
    the default /lib/x86_64-linux-gnu search when the cache has no entry.)
    """
    work = tmp_path / "work"
    res = _container(
        tmp_path, runtime, libs,
        extra_files={f"etc/ld.so.conf.d/{dropin}": COMPAT_DIR + "\n"},
        after=[("prestart", rt.ldconfig_hook(work))],
        args=["/bin/sh", "-c", f"/sbin/ldconfig -p; exec {PROBE}"],
    )
    assert res.rc == 0, str(res)
    cache = [ln.split("=>")[1].strip() for ln in res.stdout.splitlines() if "libcuda.so.1 " in ln]
    # /lib/x86_64-linux-gnu is listed before /usr/lib/x86_64-linux-gnu (merged /usr, same dir)
    expected = [f"{COMPAT_DIR}/libcuda.so.1", "/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert cache == (expected if cuda == 12040 else expected[::-1]), str(res)
    assert res.probe == {"cuDriverGetVersion": str(cuda), "libcuda": lib}, str(res)
    logs = sorted(work.glob("*.log"))
    assert len(logs) == 2 and all(p.read_text().rstrip().endswith("done") for p in logs)


@pytest.mark.containers
@RUNTIMES
def test_failures_are_reported_and_cleaned_up(tmp_path, runtime, libs):
    root = rootfs.build_rootfs(tmp_path / "bundle" / "rootfs")
    failing = rt.hook_entry(["/bin/sh", "-c", "echo hook-says-no >&2; exit 3"])
    bundle = rt.make_bundle(tmp_path / "bundle", root, hooks={"prestart": [failing]})
    res = _run(bundle, runtime)
    assert res.rc != 0 and res.stdout == "", str(res)
    if runtime == "runc":  # crun discards hook output unless run.oci.hooks.stderr is set (docs section 2)
        assert "hook-says-no" in res.stderr, str(res)

    marker = f"{os.getpid()}{len(_started)}7"
    bundle2 = rt.make_bundle(tmp_path / "bundle2", root, args=["/bin/sleep", marker])
    res = _run(bundle2, runtime, timeout=1)
    assert res.rc == 124, str(res)
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd[:2] == [b"/bin/sleep", marker.encode()]:
            left.append(pid)
    assert left == [], "container process survived delete --force"


# Keep last: pytest runs a module's tests in file order.
@pytest.mark.containers
def test_nothing_left_behind(tmp_path_factory):
    assert _started, "no container ran"
    assert rt.mounts_under(tmp_path_factory.getbasetemp()) == []
    assert rt.mounts_under(debs.cache_dir()) == []
    assert [d for d in rt.STATE_DIRS if d.exists()] == []
    cgroups = [p for p in pathlib.Path("/sys/fs/cgroup").glob("*/*") if p.name in _started]
    assert cgroups == []
