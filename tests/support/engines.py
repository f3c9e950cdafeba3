"""Live container engines for the tests, each started by the tests on private sockets and dirs.

* :class:`DirectContainerd`: Debian's containerd 1.6 started directly (no driver
  namespace), for tests whose host is a fake host root; :func:`build_image`, the
  ``bb`` image it imports; :func:`config_dump`, ``containerd config dump`` as dicts;
* :class:`Containerd`: Debian's containerd 1.6 (``/usr/bin``) or containerd 2.x
  (:func:`containerd2`: Debian sid's package, fetched with a private apt state
  and unpacked with ``dpkg-deb -x`` into ``<cache>/containerd2/``; its
  binaries link only libc and run on Debian 12, docs/background.md "Test machines");
* :class:`Dockerd`: Debian's docker.io with its own data, exec root, socket
  and pidfile, ``--iptables=false --bridge=none --storage-driver=vfs`` (§11.1);
* :class:`Podman`: Debian's podman with private storage, runroot, tmpdir and
  containers.conf (:func:`start_podman` loads an image, overlay or vfs);
  :func:`build_image_tar`, the harness rootfs as an image tar;
* :func:`crictl`: cri-tools' crictl, built from the Go module proxy into
  ``<cache>/crictl/`` (Debian has no cri-tools); the Go toolchain is the one
  installed when it is 1.21 or newer (it fetches the version cri-tools needs
  through the proxy itself), else the toolchain module from the proxy,
  checked against a pinned SHA-256.

**The only fake is the kernel driver.** Each daemon runs in its own mount
namespace (``unshare -m --propagation private``) in which a tmpfs is mounted
on ``/proc/driver`` holding ``nvidia/version``: compat-hook's default
``host_root: /`` then reads a host driver there, from the daemon, its shims,
the runtime wrapper and the hook alike; :meth:`Daemon.set_driver` rewrites it
(through ``/proc/<pid>/root``) to turn the same daemon into an older or newer
host. Nothing changes outside the namespace, which goes with the daemon.

Daemons are stopped by their PID (SIGTERM, then SIGKILL), their shims by the
PIDs whose argv names the daemon's work dir, and what is left mounted under
the work dir is unmounted (``umount -R``); :meth:`Daemon.stop` returns what it
had to clean up, so a test can assert there was nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import zipfile

from tests.support import rootfs, runtimes as rt
from tests.support.cache import cache_dir, ensure_dir, locked
from tests.support.versions import COMPAT_550, CONTAINERD2_VERSION, CRICTL_VERSION  # noqa: F401  (engines.* names kept)

Path = pathlib.Path

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
UNSHARE = rt.UNSHARE
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

#: The Go toolchain module fetched when no Go >= 1.21 is installed (cri-tools v1.37.0 needs go >= 1.26.6).
GO_TOOLCHAIN = "go1.26.6"
GO_TOOLCHAIN_SHA256 = "6347bdd1fdc7c659d955d8034cd82ec23a5b776bf48b9dfc3a75088d2dacfe0e"
GO_PROXY = "https://proxy.golang.org"


def driver_version_text(version: str) -> str:
    """``/proc/driver/nvidia/version`` of a proprietary kernel module ``version``."""
    return (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Release Build  "
            f"(dvs-builder@U16-I3-B03-4-3)  Mon Dec  1 12:00:00 UTC 2026\n"
            f"GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


# The namespace's set-up, then the command (exec: its PID is the one Popen returns).
_NS_SCRIPT = r"""set -e
mount -t tmpfs -o size=64k,mode=0755 compat-hook-test-driver /proc/driver
mkdir /proc/driver/nvidia
cat "$1" > /proc/driver/nvidia/version
shift
while :; do
    case $1 in
        --overlay)
            # DIR UPPER WORK: DIR shows UPPER over itself (writes land in UPPER, never on the host)
            mount -t overlay overlay -o "lowerdir=$2,upperdir=$3,workdir=$4" "$2"
            shift 4 ;;
        --tmpfs)
            mount -t tmpfs -o mode=0755 compat-hook-test "$2"
            shift 2 ;;
        *) break ;;
    esac
done
exec "$@"
"""


def in_driver_namespace(argv: list, version_file: Path, overlays: list = (), tmpfs: list = ()) -> list:
    """``argv`` run in a private mount namespace whose ``/proc/driver/nvidia/version`` is ``version_file``'s text.

    ``overlays``: ``(dir, upper, work)`` triples mounted over ``dir`` in that namespace only;
    ``tmpfs``: dirs that get an empty tmpfs there (what the daemon writes into them stays in it).
    """
    extra = []
    for d, upper, work in overlays:
        extra += ["--overlay", str(d), str(upper), str(work)]
    for d in tmpfs:
        extra += ["--tmpfs", str(d)]
    return [UNSHARE, "-m", "--propagation", "private", "/bin/sh", "-c", _NS_SCRIPT, "sh", str(version_file),
            *extra, *map(str, argv)]


def sh(*argv, check=True, timeout=120, env=None, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env or ENV, timeout=timeout,
                       stdin=kw.pop("stdin", subprocess.DEVNULL), **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


# --------------------------------------------------------------------------- daemons


class Daemon:
    """A daemon in a driver namespace, its work dir, log and PID."""

    name = "daemon"

    def __init__(self, work: Path) -> None:
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.driver_file = self.work / "driver-version"
        self.log = self.work / f"{self.name}.log"

    def _spawn(self, argv: list, version: str, env: dict, **ns) -> None:
        self.driver_file.write_text(driver_version_text(version))
        out = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(in_driver_namespace(argv, self.driver_file, **ns), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        finally:
            out.close()

    def _wait_ready(self, ready, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not come up in {timeout}s:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        return self.proc.pid

    def set_driver(self, version: str) -> None:
        """The host kernel driver the daemon's namespace (and every container it starts from now) sees."""
        self.driver = version
        path = Path(f"/proc/{self.pid}/root/proc/driver/nvidia/version")
        path.write_text(driver_version_text(version))
        assert path.read_text().split()[7] == version

    def children(self) -> list:
        """PIDs outside this daemon whose argv names its work dir (shims, a daemon's own containerd)."""
        mine = str(self.work).encode()
        pids = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in (os.getpid(), self.proc.pid if self.proc else -1):
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv and any(mine in a for a in argv):
                pids.append(int(d))
        return pids

    def before_stop(self) -> None:
        """Remove what the daemon runs (called while it is up)."""

    def stop(self) -> dict:
        """Stop the daemon by PID; returns what was left behind: ``{"processes": [...], "mounts": [...]}``."""
        left = {"processes": [], "mounts": []}
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.before_stop()
            finally:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self.proc = None
        deadline = time.monotonic() + 10
        while self.children() and time.monotonic() < deadline:  # shims exit once their tasks are gone
            time.sleep(0.1)
        for pid in self.children():
            left["processes"].append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left["mounts"] = rt.mounts_under(self.work)
        if left["mounts"]:
            sh("umount", "-R", "-l", self.work, check=False)
        return left


class Containerd(Daemon):
    """containerd with its own root, state, socket, runc root and CNI dir, config version 2 (1.6) or 3 (2.x)."""

    name = "containerd"

    def __init__(self, work: Path, *, bin_dir: str = "/usr/bin", pause_image: str) -> None:
        super().__init__(work)
        self.bin_dir = bin_dir
        self.binary = f"{bin_dir}/containerd"
        self.ctr_binary = f"{bin_dir}/ctr"
        self.sock = self.work / "containerd.sock"
        self.main = self.work / "etc" / "config.toml"
        major = int(sh(self.binary, "--version").stdout.split()[2].lstrip("v").split(".")[0])
        self.version = 3 if major >= 2 else 2
        self.main.parent.mkdir(parents=True, exist_ok=True)
        (self.work / "cni").mkdir(exist_ok=True)
        template = MAIN_V3 if self.version == 3 else MAIN_V2
        self.main.write_text(template.replace("@W@", str(self.work)).replace("@PAUSE@", pause_image))

    def env(self) -> dict:
        # The 2.x shim must come first on PATH: containerd starts "containerd-shim-runc-v2" by name.
        return dict(ENV, PATH=f"{self.bin_dir}:{ENV['PATH']}")

    def start(self, version: str) -> None:
        self.driver = version
        self._spawn([self.binary, "--config", self.main], version, self.env())
        self._wait_ready(lambda: self.ctr("version", check=False).returncode == 0)
        plugins = self.ctr("plugins", "ls").stdout.splitlines()
        cri = [ln for ln in plugins if ln.split()[1:2] == ["cri"] and "grpc" in ln.split()[0]]
        assert cri and all(ln.split()[-1] == "ok" for ln in cri), (cri, self.log.read_text()[-4000:])

    def restart(self) -> None:
        """``systemctl restart containerd``: SIGTERM (tasks and their shims live on), then start it again,
        re-reading its configuration; the host driver it saw last is kept."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.proc = None
        self.start(self.driver)

    def ctr(self, *args, check=True, timeout=120) -> subprocess.CompletedProcess:
        return sh(self.ctr_binary, "-a", self.sock, *args, check=check, timeout=timeout, env=self.env())

    def import_images(self, tar: Path) -> None:
        for ns in ("default", "k8s.io"):
            self.ctr("-n", ns, "images", "import", "--base-name", "docker.io/library/bb", tar)

    def before_stop(self) -> None:
        for ns in ("default", "k8s.io"):
            for cid in self.ctr("-n", ns, "containers", "ls", "-q", check=False).stdout.split():
                self.ctr("-n", ns, "tasks", "kill", "-s", "KILL", cid, check=False)
                self.ctr("-n", ns, "tasks", "delete", "-f", cid, check=False)
                self.ctr("-n", ns, "containers", "rm", cid, check=False)


# The node's main config (the tests' own root, state, socket, CNI dir, runc root).
# restrict_oom_score_adj: the sandbox's oomScoreAdj -998 needs CAP_SYS_RESOURCE, which
# root lacks on the CI machine kind (docs/background.md "Test machines"); this clamps it to
# containerd's own score, as on a rootless node. It is containerd's setting, not compat-hook's.
MAIN_V2 = """\
version = 2
root = "@W@/root"
state = "@W@/state"
oom_score = 0
imports = ["@W@/etc/conf.d/*.toml"]

[grpc]
  address = "@W@/containerd.sock"

[ttrpc]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "@W@/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "@PAUSE@"
  stream_server_address = "127.0.0.1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "@W@/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "@W@/runc"
        SystemdCgroup = false
"""

MAIN_V3 = """\
version = 3
root = "@W@/root"
state = "@W@/state"
imports = ["@W@/etc/conf.d/*.toml"]

[grpc]
  address = "@W@/containerd.sock"

[ttrpc]
  address = ""

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "@W@/opt"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "@PAUSE@"
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "@W@/cni"
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          Root = "@W@/runc"
          SystemdCgroup = false
"""


# containerd 1.6 started directly (no driver namespace): the host driver is a fake host root that
# compat-hook's ``host_root:`` names. Own socket, root, state, runc root and CNI dir.
MAIN_DIRECT = """\
# containerd for compat-hook's tests: own socket, root and state
version = 2
root = "@W@/root"
state = "@W@/state"
oom_score = 0

[grpc]
  address = "@W@/containerd.sock"

[ttrpc]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/bb:pause"
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "@W@/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "@W@/runc"
        SystemdCgroup = false
"""


def config_dump(main, bin_dir=None) -> dict:
    """``containerd config dump`` of the config file ``main`` as plain dicts (``imports`` sorted); the
    system's containerd, or the one in ``bin_dir``."""
    import tomlkit

    binary = f"{bin_dir}/containerd" if bin_dir else "containerd"
    tree = tomlkit.parse(sh(binary, "--config", main, "config", "dump").stdout).unwrap()
    tree["imports"] = sorted(tree["imports"])
    return tree


def build_image(work: Path, libs: dict) -> Path:
    """The OCI layout (tags root, pause, base, compat, stale) as a tar for ``ctr images import``.

    ``libs``: ``{version: libcuda path}`` (tests/support/debs.py); ``compat`` and
    ``stale`` carry :data:`~tests.support.versions.COMPAT_550` in
    ``/usr/local/cuda-12.4/compat``, ``stale`` also names it on ``LD_LIBRARY_PATH``.
    """
    lay = work / "img"
    sh("umoci", "init", "--layout", lay)
    sh("umoci", "new", "--image", f"{lay}:root")
    sh("umoci", "unpack", "--image", f"{lay}:root", work / "u1")
    shutil.rmtree(work / "u1" / "rootfs")
    rootfs.build_rootfs(work / "u1" / "rootfs")
    sh("umoci", "repack", "--image", f"{lay}:root", work / "u1")
    sh("umoci", "config", "--image", f"{lay}:root", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin")
    sh("umoci", "config", "--image", f"{lay}:root", "--tag", "pause", "--config.cmd", "sleep", "--config.cmd", "3600")
    sh("umoci", "config", "--image", f"{lay}:root", "--tag", "base", "--config.env", "NVIDIA_VISIBLE_DEVICES=all",
       "--config.env", "CUDA_VERSION=12.4.1", "--config.cmd", "/usr/local/bin/probe")
    sh("umoci", "unpack", "--image", f"{lay}:base", work / "u2")
    r = work / "u2" / "rootfs"
    rootfs.install_libcuda(r, libs[COMPAT_550], "usr/local/cuda-12.4/compat")
    os.symlink("cuda-12.4", r / "usr/local/cuda")
    sh("umoci", "repack", "--image", f"{lay}:compat", work / "u2")
    sh("umoci", "config", "--image", f"{lay}:compat", "--tag", "stale",
       "--config.env", "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/lib")
    shutil.rmtree(work / "u1")
    shutil.rmtree(work / "u2")
    tar = work / "bb-oci.tar"
    sh("tar", "-C", lay, "-cf", tar, ".")
    return tar


class DirectContainerd(Daemon):
    """Debian's containerd started directly, not in a driver namespace, on :data:`MAIN_DIRECT`.

    For tests whose host driver is a fake host root (compat-hook's ``host_root:``).
    compat-hook's state dir is ``<work>/compat-hook-state`` (containerd's environment,
    which reaches the wrapper through the shims). :meth:`stop` returns what it had to
    clean up: ``{"containers": [...], "shims": [...], "mounts": [...], "runc": [...]}``.
    """

    name = "containerd"
    #: The runc roots under the work dir: the CRI's (MAIN_DIRECT) and ``ctr run --runc-root``'s.
    RUNC_ROOTS = ("runc", "runc-ctr")

    def __init__(self, work: Path, *, sock: Path | None = None, main_text: str = MAIN_DIRECT) -> None:
        super().__init__(work)
        self.sock = Path(sock) if sock is not None else self.work / "containerd.sock"
        self.sock.parent.mkdir(parents=True, exist_ok=True)
        self.main = self.work / "containerd" / "config.toml"
        self.main.parent.mkdir(exist_ok=True)
        (self.work / "cni").mkdir(exist_ok=True)
        self.main.write_text(main_text.replace('address = "@W@/containerd.sock"', f'address = "{self.sock}"')
                             .replace("@W@", str(self.work)))
        self.state_dir = self.work / "compat-hook-state"
        # containerd's own output (``log`` is free for a subclass's compat-hook log).
        self.daemon_log = self.work / "containerd.log"

    def start(self) -> None:
        env = dict(ENV, COMPAT_HOOK_STATE_DIR=str(self.state_dir))
        out = open(self.daemon_log, "wb")
        try:
            self.proc = subprocess.Popen(["containerd", "--config", str(self.main)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        finally:
            out.close()
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            assert self.proc.poll() is None, self.daemon_log.read_text()
            assert time.monotonic() < deadline, "containerd did not come up"
            time.sleep(0.05)
        plugins = self.ctr("plugins", "ls").stdout
        cri_line = [ln for ln in plugins.splitlines() if ln.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
        assert cri_line and cri_line[0].split()[-1] == "ok", (cri_line, self.daemon_log.read_text())

    def ctr(self, *args, check=True, timeout=120) -> subprocess.CompletedProcess:
        return sh("ctr", "-a", self.sock, *args, check=check, timeout=timeout)

    def shims(self) -> list:
        """PIDs of the shims started for this containerd (their argv names the work dir)."""
        pids = []
        for pid in self.children():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0]
            except OSError:
                continue
            if b"containerd-shim" in argv0:
                pids.append(pid)
        return pids

    def stop(self) -> dict:
        """Stop everything; returns what was left behind (see the class docstring)."""
        left = {"containers": [], "shims": [], "mounts": [], "runc": []}
        if self.proc is not None and self.proc.poll() is None:
            for ns in ("default", "k8s.io"):
                for cid in self.ctr("-n", ns, "containers", "ls", "-q", check=False).stdout.split():
                    left["containers"].append(f"{ns}/{cid}")
                    self.ctr("-n", ns, "tasks", "kill", "-s", "KILL", cid, check=False)
                    self.ctr("-n", ns, "tasks", "delete", "-f", cid, check=False)
                    self.ctr("-n", ns, "containers", "rm", cid, check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        for pid in self.shims():
            left["shims"].append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for ns_root in (self.work / r for r in self.RUNC_ROOTS):
            for ns in (ns_root.iterdir() if ns_root.is_dir() else ()):
                out = sh(rt.RUNC, "--root", ns, "list", "-q", check=False).stdout.split()
                left["runc"] += [f"{ns}/{c}" for c in out]
                for c in out:
                    sh(rt.RUNC, "--root", ns, "delete", "--force", c, check=False)
        left["mounts"] = rt.mounts_under(self.work)
        for mp in sorted(left["mounts"], key=len, reverse=True):
            sh("umount", "-l", mp, check=False)
        return left


class Dockerd(Daemon):
    """Debian's dockerd (and the containerd it starts) on private roots, recipe §11.1."""

    name = "dockerd"
    DOCKERD = "/usr/sbin/dockerd"
    #: The package's client (a newer one may be first on PATH and speak a newer API).
    DOCKER = "/usr/bin/docker"

    def __init__(self, work: Path, storage_driver: str = "vfs") -> None:
        super().__init__(work)
        self.storage_driver = storage_driver
        self.config = self.work / "daemon.json"
        self.sock = self.work / "docker.sock"
        # Its roots in daemon.json (not flags), where compat-hook's uninstall looks for Docker's containers.
        self.config.write_text(json.dumps({"data-root": str(self.work / "data"),
                                           "exec-root": str(self.work / "exec")}, indent=2) + "\n")
        self.version = None

    def start(self, version: str) -> None:
        # dockerd also writes /etc/docker/key.json and /run/docker/plugins whatever its roots are:
        # in its namespace, /etc/docker is an overlay and /run a tmpfs (its containerd's shim
        # sockets go there too), so the host keeps neither.
        upper, ovl = self.work / "etc-docker", self.work / "etc-docker.work"
        upper.mkdir(exist_ok=True)
        ovl.mkdir(exist_ok=True)
        self.version = version
        self._spawn([self.DOCKERD, "--config-file", self.config, "-H", f"unix://{self.sock}",
                     "--pidfile", self.work / "dockerd.pid", "--iptables=false", "--ip-masq=false",
                     "--bridge=none", f"--storage-driver={self.storage_driver}"], version, ENV,
                    overlays=[("/etc/docker", upper, ovl)], tmpfs=["/run"])
        self._wait_ready(lambda: self.docker("version", check=False).returncode == 0)

    def restart(self) -> None:
        """Stop dockerd (SIGTERM: it stops its containers, which stay, exited) and start it again,
        re-reading daemon.json, as ``systemctl restart docker`` does."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.proc = None
        self.start(self.version)

    def docker(self, *args, check=True, timeout=180) -> subprocess.CompletedProcess:
        env = dict(ENV, DOCKER_CONFIG=str(self.work / "client"))  # the client's own dir, not ~/.docker
        return sh(self.DOCKER, "-H", f"unix://{self.sock}", *args, check=check, timeout=timeout, env=env)

    def before_stop(self) -> None:
        ids = self.docker("ps", "-aq", check=False).stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, check=False)


# --------------------------------------------------------------------------- images


def docker_archive(layout: Path, tag: str, name: str, out: Path) -> Path:
    """A ``docker load`` archive of ``layout:tag`` named ``name`` (skopeo)."""
    sh("skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"docker-archive:{out}:{name}")
    return out


# --------------------------------------------------------------------------- containerd 2.x


def _apt_opts(a: Path) -> list:
    opts = {"Dir::Etc::SourceList": a / "sources.list", "Dir::Etc::SourceParts": a / "sources.list.d",
            "Dir::Etc::Preferences": a / "preferences", "Dir::Etc::PreferencesParts": a / "preferences.d",
            "Dir::State::Lists": a / "lists", "Dir::Cache": a / "cache", "APT::Sandbox::User": "root",
            "Acquire::Languages": "none"}
    out: list = []
    for k, v in opts.items():
        out += ["-o", f"{k}={v}"]
    return out


def _sid_version(a: Path) -> str:
    out = sh("apt-cache", *_apt_opts(a), "madison", "containerd").stdout
    have = [p[1].strip() for p in (ln.split("|") for ln in out.splitlines()) if len(p) >= 2]
    if CONTAINERD2_VERSION in have:
        return CONTAINERD2_VERSION
    twos = [v for v in have if v.startswith("2.")]
    if not twos:
        raise RuntimeError(f"no containerd 2.x in Debian sid's package lists (found {have})")
    return twos[0]


def containerd2() -> Path:
    """The bin dir of an unpacked containerd 2.x (``containerd``, ``ctr``, ``containerd-shim-runc-v2``)."""
    final = cache_dir() / "containerd2"

    def build(tmp: Path) -> None:
        with locked("apt-sid"):
            a = cache_dir() / "apt-sid"
            for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
                (a / sub).mkdir(parents=True, exist_ok=True)
            (a / "sources.list").write_text(f"deb [signed-by={KEYRING}] {MIRROR} sid main\n")
            sh("apt-get", *_apt_opts(a), "-q", "update", timeout=600)
            version = _sid_version(a)
            dl = tmp / "dl"
            dl.mkdir()
            sh("apt-get", *_apt_opts(a), "-q", "download", f"containerd={version}", cwd=dl, timeout=600)
            shutil.rmtree(a / "lists")  # ~30 MB, only needed for this download
        [deb] = dl.glob("containerd_*.deb")
        sh("dpkg-deb", "-x", deb, tmp / "x")
        (tmp / "root" / "usr").mkdir(parents=True)
        os.rename(tmp / "x" / "usr" / "bin", tmp / "root" / "usr" / "bin")  # the rest (CNI, fp shims) unused
        shutil.rmtree(tmp / "x")
        shutil.rmtree(dl)

    ensure_dir(final, build, lock="containerd2")
    bin_dir = final / "root" / "usr" / "bin"
    for b in ("containerd", "ctr", "containerd-shim-runc-v2"):
        assert (bin_dir / b).is_file(), f"{bin_dir / b} missing"
    return bin_dir


# --------------------------------------------------------------------------- crictl


def _go_version(go: str):
    try:
        p = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60, env=ENV)
    except OSError:
        return None
    v = p.stdout.strip()
    if p.returncode != 0 or not v.startswith("go"):
        return None
    try:
        return tuple(int(x) for x in v[2:].split(".")[:2])
    except ValueError:
        return None


def _go_from_proxy() -> str:
    """The Go toolchain module from the Go module proxy, unpacked into the cache (pinned SHA-256)."""
    final = cache_dir() / "go-toolchain" / GO_TOOLCHAIN

    def build(tmp: Path) -> None:
        import urllib.request

        url = f"{GO_PROXY}/golang.org/toolchain/@v/v0.0.1-{GO_TOOLCHAIN}.linux-amd64.zip"
        z = tmp / "toolchain.zip"
        with urllib.request.urlopen(url, timeout=300) as r, open(z, "wb") as f:
            shutil.copyfileobj(r, f)
        digest = hashlib.sha256(z.read_bytes()).hexdigest()
        if digest != GO_TOOLCHAIN_SHA256:
            raise RuntimeError(f"{url}: sha256 {digest}, expected {GO_TOOLCHAIN_SHA256}")
        prefix = f"golang.org/toolchain@v0.0.1-{GO_TOOLCHAIN}.linux-amd64/"
        root = (tmp / "go").resolve()
        with zipfile.ZipFile(z) as zf:
            for info in zf.infolist():
                if not info.filename.startswith(prefix) or info.is_dir():
                    continue
                dst = (root / info.filename[len(prefix):]).resolve()
                if root not in dst.parents:
                    raise RuntimeError(f"{url}: {info.filename} leaves the toolchain dir")
                dst.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dst, "wb") as out:
                    shutil.copyfileobj(src, out)
        z.unlink()
        # Module zips keep no modes: the binaries are what the go command marks executable.
        for d in (root / "bin", *sorted((root / "pkg" / "tool").glob("*"))):
            for p in d.iterdir():
                p.chmod(0o755)

    ensure_dir(final, build, lock="go-toolchain")
    return str(final / "go" / "bin" / "go")


def go_command() -> str:
    """A ``go`` that can build cri-tools: an installed Go >= 1.21 (it fetches newer toolchains), else the proxy's."""
    for cand in ("/usr/local/go/bin/go", shutil.which("go", path=ENV["PATH"]), "/usr/lib/go/bin/go"):
        if cand and os.path.isfile(cand):
            v = _go_version(cand)
            if v is not None and v >= (1, 21):
                return cand
    return _go_from_proxy()


def crictl() -> Path:
    """crictl ``CRICTL_VERSION``, built once into the cache (~70 s on 2 cores), without cgo."""
    final = cache_dir() / "crictl" / CRICTL_VERSION

    def build(tmp: Path) -> None:
        go = go_command()
        work = Path(tempfile.mkdtemp(prefix="go-", dir=tmp.parent))
        try:
            env = dict(ENV, GOPATH=str(work / "path"), GOCACHE=str(work / "build"), GOBIN=str(tmp),
                       GOFLAGS="-modcacherw", CGO_ENABLED="0", GOTOOLCHAIN="auto", GOPROXY=f"{GO_PROXY},direct",
                       GOTMPDIR=str(work))
            sh(go, "install", f"sigs.k8s.io/cri-tools/cmd/crictl@{CRICTL_VERSION}", env=env, timeout=900)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    ensure_dir(final, build, lock="crictl")
    return final / "crictl"


class Background:
    """Run ``fn()`` in a thread now; :meth:`result` waits for it (re-raising its error)."""

    def __init__(self, fn) -> None:
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # handed to the waiting test
            self._error = e

    def result(self, timeout: float = 900):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("background task still running")
        if self._error is not None:
            raise self._error
        return self._value


class Crictl:
    """crictl on one containerd socket, as the kubelet drives the CRI (RuntimeClass handler = runtime name)."""

    def __init__(self, binary: Path, sock: Path, work: Path) -> None:
        self.binary = binary
        self.cfg = work / "crictl.yaml"
        self.cfg.write_text(f"runtime-endpoint: unix://{sock}\nimage-endpoint: unix://{sock}\n"
                            f"timeout: 60\npull-image-on-create: false\n")
        self.work = work

    def __call__(self, *args, check=True, timeout=180) -> subprocess.CompletedProcess:
        return sh(self.binary, "--config", self.cfg, *args, check=check, timeout=timeout)

    def run(self, name: str, handler: str, image: str, *, command=None, mounts=(), envs=None, wait=60,
            share_pid: bool = False):
        """Pod + container (sandbox with ``handler``), run to exit: ``(exit_code, logs, container_id)``.

        Host network (no CNI); a pid namespace per container, as the kubelet does by default,
        or with ``share_pid`` the pod's (``shareProcessNamespace: true``).
        """
        import json

        pod_dir = self.work / "pods" / name
        pod_dir.mkdir(parents=True, exist_ok=True)
        pod = pod_dir / "pod.json"
        # NamespaceMode: POD 0, CONTAINER 1, NODE 2 (the kubelet sets the same on the pod and its containers).
        ns = {"network": 2, "pid": 0 if share_pid else 1}
        pod.write_text(json.dumps({
            "metadata": {"name": name, "namespace": "compat-hook-tests", "uid": f"uid-{name}", "attempt": 0},
            "log_directory": str(pod_dir), "linux": {"security_context": {"namespace_options": ns}}}))
        ctr = pod_dir / "container.json"
        spec = {"metadata": {"name": name}, "image": {"image": image}, "log_path": f"{name}.log",
                "linux": {"security_context": {"namespace_options": ns}},
                "mounts": [{"host_path": str(h), "container_path": c, "readonly": True} for h, c in mounts],
                "envs": [{"key": k, "value": v} for k, v in (envs or {}).items()]}
        if command:
            spec["command"] = list(command)
        ctr.write_text(json.dumps(spec))
        pod_id = self("runp", "--runtime", handler, pod).stdout.strip()
        cid = None
        try:
            cid = self("create", "--no-pull", pod_id, ctr, pod).stdout.strip()
            self("start", cid)
            deadline = time.monotonic() + wait
            while True:
                st = json.loads(self("inspect", cid).stdout)["status"]
                if st["state"] == "CONTAINER_EXITED" or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            logs = self("logs", cid).stdout
            return st.get("exitCode"), logs, cid
        finally:
            if cid:
                self("rm", "-f", cid, check=False)
            self("stopp", pod_id, check=False)
            self("rmp", "-f", pod_id, check=False)


# --------------------------------------------------------------------------- Podman

PODMAN = shutil.which("podman", path="/usr/bin:/bin") or "/usr/bin/podman"
UMOCI = shutil.which("umoci", path="/usr/bin:/bin") or "/usr/bin/umoci"
#: The tag :meth:`Podman.load` gives the image it loads.
PODMAN_IMAGE = "localhost/compat-hook-test:latest"
#: ``podman run`` flags every test uses: no network; nofile/nproc limits the CI machine kind allows.
RUN_FLAGS = ["--network=none", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def build_image_tar(work: Path, *, compat_lib=None) -> Path:
    """An OCI layout (umoci) of the harness rootfs, as a tar ``podman load`` takes; tag ``latest``."""
    layout, bundle = work / "layout", work / "unpacked"
    sh(UMOCI, "init", "--layout", layout)
    sh(UMOCI, "new", "--image", f"{layout}:latest")
    sh(UMOCI, "unpack", "--image", f"{layout}:latest", bundle)
    rootfs.build_rootfs(bundle / "rootfs", compat_lib=compat_lib)
    sh(UMOCI, "repack", "--image", f"{layout}:latest", bundle)
    sh(UMOCI, "config", "--image", f"{layout}:latest", "--config.cmd", "/usr/local/bin/probe",
       "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin")
    shutil.rmtree(bundle)
    tar = work / "image.tar"
    sh("tar", "-C", layout, "-cf", tar, ".")
    return tar


class Podman:
    """podman with private storage under ``base``; every call gets the same global flags."""

    def __init__(self, base: Path, driver: str = "overlay") -> None:
        self.base = base
        self.driver = driver
        # Everything of this instance is private, so concurrent test runs (and their
        # `system reset`) cannot touch each other: podman refuses a runroot longer than 50
        # characters (pytest's tmp paths are longer), its default tmpdir /run/libpod and
        # its SHM lock segment /dev/shm/libpod_lock are shared by every podman on the
        # machine, hence --tmpdir and file locks (lock_type, from a private containers.conf).
        self.private = Path(tempfile.mkdtemp(prefix="chpm-", dir="/tmp"))
        self.runroot = self.private / "run"
        self.tmpdir = self.private / "tmp"
        self.conf = self.private / "containers.conf"
        self.conf.write_text('[engine]\nlock_type = "file"\n')

    def argv(self, *args, hooks_dir=None) -> list:
        g = ["/usr/bin/env", f"CONTAINERS_CONF={self.conf}", PODMAN, "--root", self.base / "storage",
             "--runroot", self.runroot, "--tmpdir", self.tmpdir,
             "--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime=/usr/sbin/runc",
             f"--storage-driver={self.driver}"]
        if hooks_dir is not None:
            g += ["--hooks-dir", hooks_dir]
        return g + list(args)

    def __call__(self, *args, hooks_dir=None, check=True, timeout=120, env=None):
        return sh(*self.argv(*args, hooks_dir=hooks_dir), check=check, timeout=timeout, env=env or ENV)

    def load(self, tar: Path, tag: str = PODMAN_IMAGE) -> None:
        out = self("load", "-i", tar).stdout
        loaded = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Loaded image")]
        assert loaded, out
        self("tag", loaded[0], tag)

    def run(self, *args, hooks_dir=None, env=None) -> rt.Result:
        t0 = time.monotonic()
        p = self("run", "--rm", *RUN_FLAGS, *args, hooks_dir=hooks_dir, check=False, timeout=120, env=env)
        return rt.Result(p.returncode, p.stdout, p.stderr, "podman", "", time.monotonic() - t0)

    def reset(self) -> None:
        sh(*self.argv("system", "reset", "-f"), check=False, timeout=120)
        leftover = rt.mounts_under(self.base) + rt.mounts_under(self.private)
        for mp in sorted(leftover, key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)
        assert leftover == [], f"mounts left under {self.base}: {leftover}"


def start_podman(base: Path, tar: Path) -> Podman:
    """Load ``tar`` into private storage: overlay, or vfs where overlay cannot be mounted."""
    pm = Podman(base, "overlay")
    try:
        pm.load(tar)
    except AssertionError as e:
        pm.reset()
        if "overlay" not in str(e).lower() and "mount" not in str(e).lower():
            raise
        pm = Podman(base, "vfs")
        pm.load(tar)
    return pm
