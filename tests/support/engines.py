"""Live container engines for the tests, each started by the tests on private sockets and dirs.

* :class:`Containerd`: Debian's containerd 1.6 (``/usr/bin``) or containerd 2.x
  (:func:`containerd2`: Debian sid's package, fetched with a private apt state
  and unpacked with ``dpkg-deb -x`` into ``<cache>/containerd2/``; its
  binaries link only libc and run on Debian 12, docs/background.md "Test machines");
* :class:`Dockerd`: Debian's docker.io with its own data, exec root, socket
  and pidfile, ``--iptables=false --bridge=none --storage-driver=vfs`` (§11.1);
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

from tests.support import runtimes as rt
from tests.support.cache import cache_dir, ensure_dir, locked

Path = pathlib.Path

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
UNSHARE = rt.UNSHARE
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

#: containerd 2.x from Debian sid (docs/background.md "Test machines"); any 2.x there is taken when this one is gone.
CONTAINERD2_VERSION = "2.1.9+ds1-5"
CRICTL_VERSION = "v1.37.0"
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
        self._spawn([self.binary, "--config", self.main], version, self.env())
        self._wait_ready(lambda: self.ctr("version", check=False).returncode == 0)
        plugins = self.ctr("plugins", "ls").stdout.splitlines()
        cri = [ln for ln in plugins if ln.split()[1:2] == ["cri"] and "grpc" in ln.split()[0]]
        assert cri and all(ln.split()[-1] == "ok" for ln in cri), (cri, self.log.read_text()[-4000:])

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


class Dockerd(Daemon):
    """Debian's dockerd (and the containerd it starts) on private roots, recipe §11.1."""

    name = "dockerd"
    DOCKERD = "/usr/sbin/dockerd"
    #: The package's client (a newer one may be first on PATH and speak a newer API).
    DOCKER = "/usr/bin/docker"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
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
                     "--bridge=none", "--storage-driver=vfs"], version, ENV,
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
