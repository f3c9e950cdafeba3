"""Real Podman (Debian's 4.3.1) with the hooks.d file ``compat-hook install podman`` writes.

A local image, built here as an OCI layout with umoci from the harness rootfs
(tests/support/rootfs.py: busybox, glibc, the probe, the real compat
libcuda 550 in /usr/local/cuda-12.4/compat), is loaded with ``podman load``. The "host driver" is a real host
libcuda bind-mounted with ``-v`` onto the container's
/usr/lib/x86_64-linux-gnu/libcuda.so.1, as the NVIDIA toolkit does, and the
hook reads a fake host tree (``/proc/driver/nvidia/version``) through
``host_root`` in its config.

Podman runs with private storage under the test's tmp dir (``--root``,
``--runroot``, ``--tmpdir``, file locks), ``--cgroup-manager=cgroupfs
--events-backend=file --runtime=/usr/sbin/runc``, overlay storage (vfs when overlay cannot be
mounted), ``--network=none`` and the CI machine's rlimits (section 8:
``--ulimit nofile=4096:4096 --ulimit nproc=4096:4096``). The storage is reset
and removed afterwards, and the test checks that no mount is left under it.

:class:`DebianPodman` is the case a user gets: no engine flags, Debian's
default runtime (crun) and ``containers.conf``, the hooks.d file in the
default dir, the default paths shadowed in a private mount namespace (its
docstring names what cannot be default here, and why).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.support.trees import write_fake_host
from tests.support import debs
from tests.support import runtimes as rt
from tests.support.engines import PODMAN, PODMAN_IMAGE as IMAGE, RUN_FLAGS, build_image_tar, sh, start_podman
from tests.support.rootfs import COMPAT_LIBCUDA as COMPAT_LIB, HOST_LIBCUDA as SYS_LIB
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

REPO = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.containers


def hook_config(path: pathlib.Path, host_root: pathlib.Path, log: pathlib.Path) -> pathlib.Path:
    path.write_text(f'host_root: {host_root}\nlog_file: {log}\nnvml: "off"\n')
    return path


def fake_host(base: pathlib.Path, version: str) -> pathlib.Path:
    return write_fake_host(base, version_line=(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Release Build  "
        f"(dvs-builder@U16-I3-B03-4-3)  Mon Dec  1 12:00:00 UTC 2026"))


def install_podman(*argv, state_dir=None) -> int:
    """``compat-hook install|uninstall podman ARGV`` through the real argument parser."""
    from compat_hook.commands import cli
    from compat_hook.install import run_install

    args = cli._parser().parse_args(list(argv))
    args.state_dir = str(state_dir) if state_dir else None  # keep the hook's cache in tmp
    return run_install(args, uninstall=args.command == "uninstall")


def log_lines(log: pathlib.Path) -> list:
    if not log.exists():
        return []
    return [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def libs() -> dict:
    return {v: debs.libcuda(v) for v in (HOST_535, COMPAT_550, HOST_555)}


@pytest.fixture(scope="module")
def podman(tmp_path_factory, libs):
    work = tmp_path_factory.mktemp("podman")
    tar = build_image_tar(work / "image", compat_lib=libs[COMPAT_550])
    pm = start_podman(work / "pm", tar)
    try:
        yield pm
    finally:
        pm.reset()


def _host_lib(lib: pathlib.Path) -> list:
    return ["-v", f"{lib}:{SYS_LIB}:ro"]


def test_podman_compat_on_and_off(podman, libs, tmp_path, capsys):
    """host 535 + image compat 550 -> the compat driver (12040); host 555 -> the host's (12050)."""
    state = tmp_path / "state"
    cases = {}
    for name, version in (("h535", HOST_535), ("h555", HOST_555)):
        hooks = tmp_path / f"hooks-{name}"
        log = tmp_path / f"{name}.log"
        cfg = hook_config(tmp_path / f"{name}.yaml", fake_host(tmp_path / f"host-{name}", version), log)
        assert install_podman("install", "podman", "--hooks-dir", str(hooks), "--hook-config", str(cfg),
                              state_dir=state) == 0
        doc = json.loads((hooks / "50-compat-hook.json").read_text())
        assert doc["when"] == {"always": True} and doc["stages"] == ["createContainer"]
        assert doc["hook"]["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"]
        assert doc["hook"]["args"][1:3] == ["-I", "-S"] and str(cfg) in doc["hook"]["args"]
        cases[name] = (hooks, log)
    out = capsys.readouterr().out
    assert "wrote " in out

    hooks, log = cases["h535"]
    res = podman.run("-e", "NVIDIA_VISIBLE_DEVICES=all", *_host_lib(libs[HOST_535]), IMAGE, hooks_dir=hooks)
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}, str(res)
    (rec,) = log_lines(log)
    assert rec["decision"] == "enable" and rec["reason"] == "compat_major_newer", rec
    assert rec["host_driver_version"] == HOST_535 and rec["stage"] == "createContainer", rec
    assert "/overlay/" in rec["rootfs"] or "/vfs/" in rec["rootfs"], rec

    hooks, log = cases["h555"]
    res = podman.run("-e", "NVIDIA_VISIBLE_DEVICES=all", *_host_lib(libs[HOST_555]), IMAGE, hooks_dir=hooks)
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": "12050", "libcuda": SYS_LIB}, str(res)
    (rec,) = log_lines(log)
    assert rec["decision"] == "skip" and rec["reason"] == "compat_not_newer", rec


def test_podman_non_gpu_container_and_uninstall(podman, libs, tmp_path, capsys):
    """The hook fires for every container (when: always) and skips non-GPU ones; uninstall removes it."""
    hooks, log = tmp_path / "hooks", tmp_path / "hook.log"
    cfg = hook_config(tmp_path / "cfg.yaml", fake_host(tmp_path / "host", HOST_535), log)
    base = ["podman", "--hooks-dir", str(hooks), "--hook-config", str(cfg)]
    assert install_podman("install", *base, state_dir=tmp_path / "state") == 0
    assert install_podman("install", *base, state_dir=tmp_path / "state") == 0
    assert "already registered; nothing changed" in capsys.readouterr().out

    res = podman.run(*_host_lib(libs[HOST_535]), IMAGE, hooks_dir=hooks)  # no NVIDIA_VISIBLE_DEVICES
    assert res.probe == {"cuDriverGetVersion": "12020", "libcuda": SYS_LIB}, str(res)
    (rec,) = log_lines(log)
    assert rec["decision"] == "skip" and rec["reason"] == "no_gpu_request", rec

    assert install_podman("uninstall", *base[:3]) == 0
    assert not (hooks / "50-compat-hook.json").exists()
    res = podman.run("-e", "NVIDIA_VISIBLE_DEVICES=all", *_host_lib(libs[HOST_535]), IMAGE, hooks_dir=hooks)
    assert res.probe == {"cuDriverGetVersion": "12020", "libcuda": SYS_LIB}, str(res)
    assert len(log_lines(log)) == 1  # the hook did not run


# --------------------------------------------------------------------------- Podman as Debian ships it


class DebianPodman:
    """``podman`` with no engine flags at all: Debian 12's defaults, in a private mount namespace.

    What a user gets from ``apt install podman`` and the README's ``compat-hook install podman``:
    the default runtime (crun), the default ``containers.conf`` (Debian's file at its own path,
    no ``CONTAINERS_CONF``), the default hooks dir ``/usr/share/containers/oci/hooks.d``, the default
    storage driver, cgroup manager, events backend and lock type. What cannot be default here, and why:

    * the default *paths* are shadowed, in a mount namespace of the test's own (a holder process
      made with ``unshare -m``; every command joins it with ``nsenter``), so that nothing of the
      machine is touched and no other podman on it sees this one's state:
      ``/usr/share/containers`` is a bind mount of a copy of Debian's (containers.conf and
      seccomp.json byte for byte; ``compat-hook install podman`` writes ``oci/hooks.d`` into it),
      ``/var/lib/containers`` (storage) a private dir, ``/run`` (runroot, ``/run/libpod``,
      crun's state) and ``/dev/shm`` (the SHM lock segment) private tmpfs. A hooks.d file in the
      machine's real dir would run this test's hook in every other podman container on it;
    * a machine booted with systemd's "hybrid" cgroup layout (cgroup v1 plus a cgroup2 mount at
      ``/sys/fs/cgroup/unified``, as CI machines can be): crun 1.8 refuses it ("cgroups in hybrid mode
      not supported"), so there the namespace unmounts that cgroup2 mount; Debian 12 itself boots
      with the unified cgroup v2 layout, where nothing is unmounted;
    * the cgroup manager: containers.conf's default is systemd, which needs a running systemd;
      this sandbox has none, and podman then picks cgroupfs on its own (asserted below);
    * the events backend: the default journald needs journald; podman picks ``file`` itself;
    * ``podman run`` flags: ``--network=none`` (the default network would create a bridge in
      the machine's network namespace, which the mount namespace does not isolate) and the CI
      machine's rlimits (``--ulimit``, as the rest of this module);
    * the hook entry's ``--state-dir`` (compat-hook's ELF cache) is under the test's tmp dir,
      not ``/var/lib/compat-hook``.
    """

    def __init__(self) -> None:
        self.private = pathlib.Path(tempfile.mkdtemp(prefix="chpd-", dir="/tmp"))
        self.share = self.private / "share"
        shutil.copytree("/usr/share/containers", self.share, symlinks=True)
        storage = self.private / "storage"
        storage.mkdir()
        script = (f"mount --bind {self.share} /usr/share/containers && "
                  f"mount --bind {storage} /var/lib/containers && "
                  "mount -t tmpfs -o mode=0755 run /run && mount -t tmpfs -o mode=1777 shm /dev/shm && "
                  + (f"umount {rt.CGROUP2_HYBRID} && " if rt.cgroup_hybrid() else "")
                  + "echo ready && exec sleep 3600")
        self.holder = subprocess.Popen([rt.UNSHARE, "-m", "--propagation", "private", "/bin/sh", "-c", script],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
        ready = self.holder.stdout.readline().strip()
        if ready != "ready":
            self.holder.kill()
            raise AssertionError(f"mount namespace holder: {ready!r} {self.holder.stderr.read()}")
        self.ns = f"/proc/{self.holder.pid}/ns/mnt"

    def sh(self, *argv, check=True, timeout=120) -> subprocess.CompletedProcess:
        # joining a mount namespace resets the cwd to its root: name the checkout (python3 -m compat_hook)
        return sh("nsenter", f"--mount={self.ns}", f"--wd={REPO}", "--", *argv, check=check, timeout=timeout)

    def podman(self, *args, check=True) -> subprocess.CompletedProcess:
        return self.sh(PODMAN, *args, check=check)

    def run(self, *args) -> rt.Result:
        t0 = time.monotonic()
        p = self.podman("run", "--rm", *RUN_FLAGS, *args, check=False)
        return rt.Result(p.returncode, p.stdout, p.stderr, "podman", "", time.monotonic() - t0)

    def close(self) -> None:
        try:
            self.podman("system", "reset", "-f", check=False)
        finally:
            self.holder.kill()
            self.holder.wait(timeout=30)
            self.holder.stdout.close()
            self.holder.stderr.close()
        leftover = rt.mounts_under(self.private)
        shutil.rmtree(self.private, ignore_errors=True)
        assert leftover == [], leftover


def test_podman_as_debian_ships_it(libs, tmp_path):
    """``compat-hook install podman`` (the README's way) then plain ``podman run``: crun runs the
    container, the hook decides at createContainer, and the probe loads the compat driver on host
    535 and the host's own driver after the host went to 555."""
    from tests.support.hookenv import set_host_version

    pm = DebianPodman()
    try:
        out = pm.podman("load", "-i", build_image_tar(tmp_path / "image", compat_lib=libs[COMPAT_550])).stdout
        loaded = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Loaded image")]
        assert loaded, out
        pm.podman("tag", loaded[0], IMAGE)
        info = json.loads(pm.podman("info", "--format", "json").stdout)
        assert (info["host"]["ociRuntime"]["name"], info["host"]["cgroupManager"],
                info["host"]["eventLogger"]) == ("crun", "cgroupfs", "file"), info["host"]
        assert info["host"]["ociRuntime"]["path"] == "/usr/bin/crun"

        host = fake_host(tmp_path / "host", HOST_535)
        log = tmp_path / "hook.log"
        cfg = hook_config(tmp_path / "cfg.yaml", host, log)
        pm.sh("/usr/bin/python3", "-m", "compat_hook", "install", "podman", "--hook-config", cfg,
              "--state-dir", tmp_path / "state")
        installed = pm.share / "oci/hooks.d/50-compat-hook.json"
        assert installed.is_file() and str(cfg) in installed.read_text()
        assert not pathlib.Path("/usr/share/containers/oci/hooks.d/50-compat-hook.json").exists()

        res = pm.run("-e", "NVIDIA_VISIBLE_DEVICES=all", *_host_lib(libs[HOST_535]), IMAGE)
        assert res.rc == 0, str(res)
        assert res.probe == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}, str(res)
        (rec,) = log_lines(log)
        assert (rec["decision"], rec["effect"], rec["stage"]) == ("enable", "compat", "createContainer"), rec

        set_host_version(host, HOST_555)
        res = pm.run("-e", "NVIDIA_VISIBLE_DEVICES=all", *_host_lib(libs[HOST_555]), IMAGE)
        assert res.rc == 0, str(res)
        assert res.probe == {"cuDriverGetVersion": "12050", "libcuda": SYS_LIB}, str(res)
        rec = log_lines(log)[-1]
        assert (rec["decision"], rec["reason"]) == ("skip", "compat_not_newer"), rec
    finally:
        pm.close()
