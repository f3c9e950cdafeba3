"""Benchmark fixtures: rootfs trees, bundles, configs and state files.

Built once per run under a temp dir with the test harness (tests/support):
the same busybox + glibc rootfs the container tests use, the real Debian
libcuda (550.163.01, 28 MB, cached in .cache/) and a ~600-byte stub ELF.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from compat_hook.core import registration  # noqa: E402
from compat_hook.facts.elfgen import make_elf  # noqa: E402
from tests.support import rootfs as rfs  # noqa: E402
from tests.support import runtimes as rts  # noqa: E402

COMPAT = "usr/local/cuda-12.4/compat"
REAL_VERSION = "550.163.01"
HOST_DRIVER = "535.104.05"  # older than the image's 550 compat lib: compat is enabled
GPU_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all")
NOGPU_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin",)


def stub_lib(dest: Path, version: str = REAL_VERSION) -> Path:
    """A small valid ELF shared object named libcuda.so.<version> (no note)."""
    dest.mkdir(parents=True, exist_ok=True)
    p = dest / f"libcuda.so.{version}"
    p.write_bytes(make_elf(soname="libcuda.so.1", build_id=False))
    return p


def real_lib() -> Path | None:
    try:
        from tests.support import debs
        return debs.libcuda(REAL_VERSION)
    except Exception as e:  # no network and nothing cached
        print(f"[bench] real libcuda unavailable: {e}", file=sys.stderr)
        return None


def write_config(path: Path, log: Path, runtime: str = "runc", **extra) -> Path:
    lines = [f"host_driver_version: \"{HOST_DRIVER}\"", f"log_file: {log}", "nvml: \"off\"",
             f"runtime: {runtime}", "store_inject: false"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def big_edit(n_env: int = 4000, n_mounts: int = 2900):
    """A config.json edit giving ~1 MB: thousands of env entries and mounts."""
    def edit(spec: dict) -> None:
        spec["process"]["env"] += [f"BENCH_VAR_{i:05d}=value-{'x' * 60}-{i}" for i in range(n_env)]
        spec["mounts"] += [{"destination": f"/mnt/bench/{i:05d}", "type": "bind",
                            "source": f"/var/lib/bench/volumes/{i:05d}/data",
                            "options": ["rbind", "ro", "nosuid", "nodev"]} for i in range(n_mounts)]
    return edit


class Fixtures:
    """Everything a run needs, under ``work``."""

    def __init__(self, work: Path, *, concurrency: int = 32) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.log = work / "compat-hook.log"
        self.config = write_config(work / "config.yaml", self.log)
        self.config_true = write_config(work / "config-true.yaml", self.log, runtime="/bin/true")
        self.state_dir = work / "state"
        self.state_dir.mkdir()
        libs = work / "libs"
        self.stub = stub_lib(libs / "stub")
        self.real = real_lib()
        self.rootfs = {}
        self.rootfs["nocompat"] = rfs.build_rootfs(work / "rootfs-nocompat")
        self.rootfs["stub"] = rfs.build_rootfs(work / "rootfs-stub", compat_lib=self.stub, compat_dir=COMPAT)
        if self.real is not None:
            self.rootfs["real"] = rfs.build_rootfs(work / "rootfs-real", compat_lib=self.real, compat_dir=COMPAT)
        many = {f"{COMPAT}/libextra-{i:03d}.so.1": b"\x7fELF not really\n" for i in range(499)}
        self.rootfs["many"] = rfs.build_rootfs(work / "rootfs-many", compat_lib=self.stub, compat_dir=COMPAT,
                                               extra_files=many)
        self.bundles = {}
        b = self.bundles
        b["nogpu"] = rts.make_bundle(work / "b-nogpu", self.rootfs["nocompat"], env=NOGPU_ENV)
        b["nocompat"] = rts.make_bundle(work / "b-nocompat", self.rootfs["nocompat"], env=GPU_ENV)
        b["nocompat_big"] = rts.make_bundle(work / "b-nocompat-big", self.rootfs["nocompat"], env=GPU_ENV,
                                            edit=big_edit())
        b["stub"] = rts.make_bundle(work / "b-stub", self.rootfs["stub"], env=GPU_ENV)
        if self.real is not None:
            b["real"] = rts.make_bundle(work / "b-real", self.rootfs["real"], env=GPU_ENV)
        b["many"] = rts.make_bundle(work / "b-many", self.rootfs["many"], env=GPU_ENV)
        # 32 rootfs copies for the concurrent compat hooks (each writes its own drop-in).
        self.conc_bundles = []
        for i in range(concurrency):
            r = work / f"conc/rootfs-{i:02d}"
            shutil.copytree(self.rootfs["stub"], r, symlinks=True)
            self.conc_bundles.append(rts.make_bundle(work / f"conc/b-{i:02d}", r, env=GPU_ENV))
        # e2e bundles (the container runs `true`)
        self.e2e = {}
        entry = registration.hook_entry(stage="createContainer", config=str(self.config),
                                        state_dir=str(self.state_dir))
        self.hook_entry = entry
        for name, root, env in (("nohook", self.rootfs["nocompat"], GPU_ENV),
                                ("hook_nogpu", self.rootfs["nocompat"], NOGPU_ENV),
                                ("hook_nocompat", self.rootfs["nocompat"], GPU_ENV),
                                ("hook_compat", self.rootfs["stub"], GPU_ENV)):
            hooks = None if name == "nohook" else {"createContainer": [entry]}
            self.e2e[name] = rts.make_bundle(work / f"e2e-{name}", root, args=("/bin/true",), env=env,
                                             hooks=hooks)
        # A copy of the stub rootfs whose drop-in is removed before each run: the hook writes it
        # and rebuilds the cache, as at a container's first start (and as the toolkit's pair does).
        self.rootfs["dropin"] = work / "rootfs-dropin"
        shutil.copytree(self.rootfs["stub"], self.rootfs["dropin"], symlinks=True)
        b["dropin"] = rts.make_bundle(work / "b-dropin", self.rootfs["dropin"], env=GPU_ENV)
        # The NVIDIA toolkit's own hook pair gets a copy of the stub rootfs: its drop-ins
        # (a new 00-compat-<uuid>.conf and zz-nvcr-*.conf per run) must not reach ours.
        self.rootfs["toolkit"] = work / "rootfs-toolkit"
        shutil.copytree(self.rootfs["stub"], self.rootfs["toolkit"], symlinks=True)
        b["toolkit"] = rts.make_bundle(work / "b-toolkit", self.rootfs["toolkit"], env=GPU_ENV)
        self.states = {}
        for name, bundle in list(b.items()) + [(f"conc{i}", cb) for i, cb in enumerate(self.conc_bundles)]:
            self.states[name] = self._state(name, bundle)

    def _state(self, name: str, bundle: Path) -> Path:
        p = self.work / f"state-{name}.json"
        # pid 1: what runc reports at createContainer (already in the container's namespace).
        p.write_text(json.dumps({"ociVersion": "1.0.2", "id": f"bench-{name}", "status": "creating",
                                 "pid": 1, "bundle": str(bundle)}))
        return p

    def hook_argv(self, state_dir: Path | None = None, paths: list | None = None) -> tuple[list, dict]:
        """Exactly registration.hook_entry's argv and env (``paths``: another installation's sys.path)."""
        e = registration.hook_entry(stage="createContainer", config=str(self.config),
                                    state_dir=str(state_dir or self.state_dir), paths=paths)
        env = dict(x.split("=", 1) for x in e["env"])
        return e["args"], env

    def size(self, bundle: str) -> int:
        return (self.bundles[bundle] / "config.json").stat().st_size
