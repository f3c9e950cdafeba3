"""A real single-node Kubernetes cluster on this machine, for the tests that need a kubelet.

The control plane is :class:`tests.support.kube.ControlPlane` (etcd, kube-apiserver) plus
kube-controller-manager and kube-scheduler; the node is a kubelet on Debian's containerd 1.6 with
its CRI plugin and a bridge CNI from containernetworking-plugins. Every binary is v1.34.2, built
from the ``k8s.io/kubernetes`` module into the test cache (:mod:`tests.support.kubebuild`).

**The node's files live in a private mount namespace** (``unshare -m --propagation private``,
held by one ``sleep`` process; containerd and the kubelet join it with ``nsenter``):

* overlays on ``/etc``, ``/opt``, ``/var/lib`` and ``/var/log`` (their upper dirs in the test's
  dir), so the chart's installer edits ``/etc/containerd/config.toml`` and copies itself to
  ``/opt/compat-hook`` as on a real node, and nothing of it reaches this machine;
* ``/var/lib/containerd`` and ``/var/lib/kubelet`` bound from plain dirs of the test's dir
  (containerd's overlay snapshotter cannot stack on an overlay);
* containerd's registry hosts in ``/etc/containerd/certs.d`` (``config_path``): a test's registry
  on this machine (tests/support/registry.py) is trusted over plain HTTP by
  :meth:`Node.trust_registry`, so a node can pull an image as a real one does;
* a tmpfs on ``/run`` (containerd's socket and state, runc's, the pods' network namespaces);
* a tmpfs on ``/proc/driver`` holding the fake NVIDIA kernel driver: ``nvidia/version`` and one
  H100 under ``nvidia/gpus``. Every process of the node (containerd, the hook it runs, a pod's
  hostPath ``/``) sees that driver. :meth:`Node.set_driver` changes it;
* the host driver's ``libcuda.so.1`` a GPU container gets: on a real node the NVIDIA runtime
  mounts it; here containerd's ``base_runtime_spec`` on the ``runc`` runtime binds
  ``/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1`` (the GPU Operator's driver root)
  into every container, and a runtime the installer copies from ``runc`` inherits it. The file
  is Debian's real ``libcuda1`` of the node's driver (tests/support/debs.py);
* the kernel tunables the kubelet insists on (``vm.overcommit_memory`` ...) are files bound over
  ``/proc/sys`` there holding the values it wants, so it writes none of them on this machine;
  ``makeIPTablesUtilChains: false`` keeps it out of iptables.

**No kube-proxy runs**, so ``10.96.0.1`` leads nowhere. The tests' stand-in, which lives here and
never in the chart: a MutatingAdmissionPolicy (``admissionregistration.k8s.io/v1beta1``, enabled
on this API server) puts every pod of :data:`RELEASE_NAMESPACE` that mounts a service-account
token (the kubelet's, or a projected volume's, as the agent's container does) on the host network
with ``KUBERNETES_SERVICE_HOST=127.0.0.1`` and the API server's port.
Its projected token and ``ca.crt`` then verify (the serving certificate names 127.0.0.1).

The pods' network is a ``bridge`` CNI with its own bridge name (no gateway, no masquerade: no
route, no iptables rule, no forwarding sysctl on this machine); :meth:`Node.stop` deletes the
bridge. It stops the kubelet, kills the node's containers (on containerd 2.x it first stops and
removes the pods through the CRI), stops containerd, unmounts the
kubelet's mounts deepest first, ends every process left in the namespace and checks that nothing
is left: :meth:`Node.stop` returns what it had to clean up.

**containerd 2.x, as the GPU Operator's CDI mode leaves it** (``Node(..., containerd_bin=
engines.containerd2())``): that build's ``containerd``, ``ctr`` and ``containerd-shim-runc-v2``
are bound over the node's ``/usr/bin`` ones in its namespace (so the chart's installer, chrooted
into the node, asks 2.x), and its config is :data:`CONTAINERD2_CONFIG`: ``enable_cdi``, the
default runtime plain runc with no base spec (the driver's files reach a GPU container through a
CDI spec's edits, which the test writes to ``/var/run/cdi``), NRI on with its defaults. The
node's GPU model is ``gpu_model`` (a GeForce for the brand's rules).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import time

from tests.support import debs, kubebuild
from tests.support.cache import cache_dir, ensure_dir
from tests.support.kube import ADMIN_TOKEN, Api, ApiError, ControlPlane, free_port

Path = pathlib.Path
REPO = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
CHART = REPO / "packaging" / "helm" / "compat-hook"
RELEASE_NAMESPACE = "compat-hook"
#: The dry-run pod that shows the host-network shim in effect (:meth:`Cluster.host_network_shim`).
SHIM_CHECK = "tests-shim-check"
#: The node's GPU (what GPU Feature Discovery and /proc/driver/nvidia/gpus say).
GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPU_BDF = "0000:17:00.0"
#: Where the GPU Operator's driver container puts the driver's user-space files on the node.
DRIVER_ROOT = "/run/nvidia/driver"
HOST_LIB_DIR = "usr/lib/x86_64-linux-gnu"
#: The kubelet's kernel tunables (pkg/kubelet/cm setupKernelTunables), bound over /proc/sys.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
OVERLAID = ("/etc", "/opt", "/var/lib", "/var/log")

_NS_SCRIPT = r"""set -eu
W=$1
for d in /etc /opt /var/lib /var/log; do
    n=$(echo "$d" | tr / _)
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$W/ov/$n/upper,workdir=$W/ov/$n/work" "$d"
done
mkdir -p /var/lib/containerd /var/lib/kubelet
mount --bind "$W/containerd-root" /var/lib/containerd
mount --bind "$W/kubelet-root" /var/lib/kubelet
mount -t tmpfs -o mode=0755 compat-hook-node-run /run
mount -t tmpfs -o size=1m,mode=0755 compat-hook-node-driver /proc/driver
cp -a "$W/driver/." /proc/driver/
for f in $(cd "$W/sysctl" && find . -type f); do
    mount --bind "$W/sysctl/$f" "/proc/sys/$f"
done
: > "$W/ns-ready"
exec sleep infinity
"""


def driver_version_text(version: str) -> str:
    """``/proc/driver/nvidia/version`` of the proprietary kernel module ``version``."""
    return (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Release Build  "
            f"(dvs-builder@U16-I3-B03-4-3)  Mon Dec  1 12:00:00 UTC 2026\n"
            f"GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def _sh(argv, *, check=True, timeout=300, env=None, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env or ENV, timeout=timeout,
                       stdin=kw.pop("stdin", subprocess.DEVNULL), **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def _spawn(argv, log: Path, env=None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env or ENV, start_new_session=True)


def _stop(p: subprocess.Popen | None, timeout: float = 30) -> None:
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


# --------------------------------------------------------------------------- images


def _image_inputs() -> bytes:
    """What the project's image is made of: the package's sources, the packaging and the Debian
    packages the image copies (their versions). Its cache key."""
    h = hashlib.sha256()
    files = _sh(["git", "-C", REPO, "ls-files", "-co", "--exclude-standard", "compat_hook", "packaging",
                 "config", "pyproject.toml", "Makefile"]).stdout.split()
    for rel in sorted(files):
        p = REPO / rel
        if p.is_file():
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    pkgs = _sh(["dpkg-query", "-W", "python3", "python3-kubernetes", "python3-yaml", "python3-pyelftools",
                "python3-tomlkit", "containerd", "busybox-static", "gcc", "libc6-dev", "binutils"]).stdout
    h.update(pkgs.encode())
    return h.hexdigest()[:16].encode()


def project_image() -> Path:
    """The project's image as a tar, built the way docs/engines.md says (``make deb``, then
    ``packaging/oci-image/build-image.sh``), once per content of its inputs (:func:`_image_inputs`)."""
    final = cache_dir() / "compat-hook-image" / _image_inputs().decode()

    def build(tmp: Path) -> None:
        t0 = time.monotonic()
        _sh(["make", "-C", REPO, "deb", f"DEB_OUT={tmp}", "PY=/usr/bin/python3"])
        (deb,) = tmp.glob("compat-hook_*_all.deb")
        _sh([REPO / "packaging/oci-image/build-image.sh", "--deb", deb, "--layout", tmp / "layout",
             "--tar", tmp / "image.tar", "--nri-plugin", kubebuild.nri_plugin()], timeout=900)
        shutil.rmtree(tmp / "layout")
        (tmp / "seconds").write_text(f"{time.monotonic() - t0:.1f}\n")

    ensure_dir(final, build, lock="compat-hook-image")
    return final / "image.tar"


# --------------------------------------------------------------------------- the control plane


class Cluster(ControlPlane):
    """etcd, kube-apiserver (with MutatingAdmissionPolicy on), kube-controller-manager, kube-scheduler."""

    #: Not the release namespace: `helm install --create-namespace` makes it, with the chart's Namespace
    #: (its Pod Security label), as docs/cluster.md says; one made before would not be Helm's to own.
    NAMESPACES = ("default", "apps")
    EXTRA_APISERVER_FLAGS = ("--kubelet-preferred-address-types=InternalIP",
                             "--feature-gates=MutatingAdmissionPolicy=true",
                             "--runtime-config=admissionregistration.k8s.io/v1beta1=true")

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.scheduler = None

    def start_apiserver(self) -> None:
        for flag in self.EXTRA_APISERVER_FLAGS:
            if flag not in self._apiserver_argv:
                self._apiserver_argv.append(flag)
        super().start_apiserver()

    def start(self) -> "Cluster":
        super().start()
        w = self.work
        certs = (w / "certs" / "apiserver.crt").read_text()
        blocks = re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n?", certs, re.S)
        assert len(blocks) == 2, f"apiserver.crt: {len(blocks)} certificates"
        (w / "ca.crt").write_text(blocks[1])  # the CA that signed the serving certificate
        kc = self.kubeconfig(ADMIN_TOKEN, "admin")
        self.start_controller_manager(extra=(f"--service-account-private-key-file={w / 'sa.key'}",
                                             f"--root-ca-file={w / 'ca.crt'}"))
        self.scheduler = _spawn([kubebuild.kube_scheduler(), f"--kubeconfig={kc}", "--leader-elect=false",
                                 f"--secure-port={free_port()}", "--bind-address=127.0.0.1"], w / "scheduler.log")
        # the root CA published for projected tokens (ca.crt) comes from the controller-manager
        self.admin.wait("kube-root-ca.crt in default", lambda: self.admin.get(
            "/api/v1/namespaces/default/configmaps/kube-root-ca.crt"), timeout=60)
        return self

    def stop(self) -> None:
        _stop(self.scheduler)
        super().stop()

    def host_network_shim(self, namespace: str = RELEASE_NAMESPACE) -> None:
        """The tests' stand-in for kube-proxy (module docstring): pods of ``namespace`` that mount a
        service-account token go on the host network and reach the API server at 127.0.0.1."""
        env = (f'[Object.spec.containers.env{{name: "KUBERNETES_SERVICE_HOST", value: "127.0.0.1"}}, '
               f'Object.spec.containers.env{{name: "KUBERNETES_SERVICE_PORT", value: "{self.port}"}}]')
        policy = {
            "apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": "tests-host-network-shim"},
            "spec": {
                "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                        "operations": ["CREATE"], "resources": ["pods"]}]},
                "matchConditions": [
                    # (and the dry-run check below: the release namespace is helm install's to make)
                    {"name": "release-namespace", "expression": f"request.namespace == '{namespace}' || "
                                                                f"(request.namespace == 'default' && "
                                                                f"object.metadata.name == '{SHIM_CHECK}')"},
                    # the token the kubelet mounts, or one a projected volume asks for (the agent's, in
                    # its container only, with automountServiceAccountToken: false)
                    {"name": "mounts-a-token", "expression": (
                        "!has(object.spec.automountServiceAccountToken) || object.spec.automountServiceAccountToken "
                        "|| (has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.projected) "
                        "&& has(v.projected.sources) && v.projected.sources.exists(s, has(s.serviceAccountToken))))")}],
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": (
                    "Object{spec: Object.spec{hostNetwork: true, containers: object.spec.containers.map(c, "
                    f"Object.spec.containers{{name: c.name, env: {env}}})}}}}")}}]}}
        self.admin.create("/apis/admissionregistration.k8s.io/v1beta1/mutatingadmissionpolicies", policy)
        self.admin.create("/apis/admissionregistration.k8s.io/v1beta1/mutatingadmissionpolicybindings", {
            "apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": "tests-host-network-shim"},
            "spec": {"policyName": "tests-host-network-shim"}})
        # The API server takes a new policy up through an informer: until it does, pods go unchanged.
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": SHIM_CHECK, "namespace": "default"},
                 "spec": {"containers": [{"name": "c", "image": "none"}]}}

        def mutated():
            got = self.admin.request("POST", "/api/v1/namespaces/default/pods", probe, query={"dryRun": "All"})
            return got.get("spec", {}).get("hostNetwork") is True

        self.admin.wait("the host-network shim in effect", mutated, timeout=60, interval=0.2)


# --------------------------------------------------------------------------- the node


CONTAINERD_CONFIG = """\
# the node's containerd (tests/support/node.py)
version = 2
oom_score = 0

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "@PAUSE@"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "/etc/containerd/nvidia-base-spec.json"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
"""

#: The node's containerd 2.x (``containerd_bin``): the GPU Operator's CDI mode. The toolkit sets
#: ``enable_cdi`` and leaves runc the default runtime; NRI is on by 2.x's default (no section).
CONTAINERD2_CONFIG = """\
# the node's containerd 2.x (tests/support/node.py)
version = 3
oom_score = 0

[plugins]
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "@PAUSE@"
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "/etc/cni/net.d"
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
"""
#: What ``containerd_bin`` binds over the node's /usr/bin.
CONTAINERD_BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2")

SOCKET = "/run/containerd/containerd.sock"


class Node:
    """One kubelet + containerd in a private mount namespace (module docstring), registered as ``name``."""

    def __init__(self, work: Path, cluster: Cluster, *, name: str | None = None, pause_image: str,
                 containerd_bin: Path | None = None, gpu_model: str = GPU_MODEL) -> None:
        """``containerd_bin``: a containerd 2.x's bin dir (module docstring), else Debian's 1.6."""
        self.work = Path(work)
        self.containerd_bin = Path(containerd_bin) if containerd_bin else None
        self.gpu_model = gpu_model
        self.work.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.name = name or f"gpu-node-{secrets.token_hex(3)}"
        self.bridge = f"chk{secrets.token_hex(4)}"
        self.pause_image = pause_image
        self.holder = self.containerd = self.kubelet = None
        self.ns = None
        self.driver = None
        self.container_ids: set = set()

    # ------------------------------------------------------------------ the namespace

    def path(self, node_path: str) -> Path:
        """``node_path`` as the node sees it (through the namespace holder's root)."""
        return Path(f"/proc/{self.holder.pid}/root") / node_path.lstrip("/")

    def nsenter(self, *argv) -> list:
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *map(str, argv)]

    def run(self, *argv, check=True, timeout=300) -> subprocess.CompletedProcess:
        """A command in the node's mount namespace."""
        return _sh(self.nsenter(*argv), check=check, timeout=timeout)

    def ctr(self, *args, check=True, timeout=300) -> subprocess.CompletedProcess:
        return self.run("ctr", "-a", SOCKET, "-n", "k8s.io", *args, check=check, timeout=timeout)

    def _prepare(self, driver: str) -> None:
        w = self.work
        for d in OVERLAID:
            n = d.replace("/", "_")
            (w / "ov" / n / "upper").mkdir(parents=True, exist_ok=True)
            (w / "ov" / n / "work").mkdir(parents=True, exist_ok=True)
        for d in ("containerd-root", "kubelet-root", "driver/nvidia/gpus/" + GPU_BDF):
            (w / d).mkdir(parents=True, exist_ok=True)
        (w / "driver/nvidia/version").write_text(driver_version_text(driver))
        (w / "driver/nvidia/gpus" / GPU_BDF / "information").write_text(
            f"Model: \t\t {self.gpu_model}\nIRQ:   \t\t 42\nBus Location: \t {GPU_BDF}\n")
        for rel, value in KUBELET_SYSCTLS.items():
            (w / "sysctl" / rel).parent.mkdir(parents=True, exist_ok=True)
            (w / "sysctl" / rel).write_text(value + "\n")
        # the node's own files, in the overlays' upper dirs (what an image of the node would hold)
        etc = w / "ov" / "_etc" / "upper"
        (etc / "containerd").mkdir(parents=True, exist_ok=True)
        config = CONTAINERD2_CONFIG if self.containerd_bin else CONTAINERD_CONFIG
        (etc / "containerd" / "config.toml").write_text(config.replace("@PAUSE@", self.pause_image))
        spec = json.loads(_sh(["ctr", "oci", "spec"]).stdout)
        spec["mounts"].append({"destination": f"/{HOST_LIB_DIR}/libcuda.so.1", "type": "bind",
                               "source": f"{DRIVER_ROOT}/{HOST_LIB_DIR}/libcuda.so.1",
                               "options": ["rbind", "ro", "nosuid", "nodev"]})
        (etc / "containerd" / "nvidia-base-spec.json").write_text(json.dumps(spec, indent=2) + "\n")
        (etc / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (etc / "cni" / "net.d" / "10-compat-hook-tests.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "compat-hook-tests",
            "plugins": [{"type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False,
                         "hairpinMode": False,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.213.0.0/24"}]]}}]}, indent=2))

    def _install_driver_files(self, version: str) -> None:
        """The driver's user-space libcuda where the base spec binds it from (a real Debian build)."""
        d = self.path(f"{DRIVER_ROOT}/{HOST_LIB_DIR}")
        d.mkdir(parents=True, exist_ok=True)
        lib = d / f"libcuda.so.{version}"
        if not lib.exists():
            shutil.copyfile(debs.libcuda(version), lib)
            lib.chmod(0o644)
        tmp = d / ".libcuda.so.1.new"
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(lib.name, tmp)
        os.replace(tmp, d / "libcuda.so.1")

    # ------------------------------------------------------------------ start / stop

    def start(self, driver: str) -> "Node":
        self.driver = driver
        self._cgroup_parents_before = {d.parent.name for d in Path("/sys/fs/cgroup").glob("*/k8s.io")}
        self._prepare(driver)
        self.holder = _spawn(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", _NS_SCRIPT, "sh",
                              self.work], self.work / "namespace.log")
        deadline = time.monotonic() + 30
        while not (self.work / "ns-ready").exists():
            assert self.holder.poll() is None, (self.work / "namespace.log").read_text()
            assert time.monotonic() < deadline, "the node's namespace did not come up"
            time.sleep(0.05)
        self.ns = _mount_ns(self.holder.pid)
        assert self.ns and self.ns != _mount_ns(os.getpid())
        if self.containerd_bin:
            for b in CONTAINERD_BINARIES:
                self.run("mount", "--bind", self.containerd_bin / b, f"/usr/bin/{b}")
        self._install_driver_files(driver)
        self.start_containerd()
        self._start_kubelet()
        return self

    def start_containerd(self) -> None:
        self.containerd = _spawn(self.nsenter("containerd", "--config", "/etc/containerd/config.toml"),
                                 self.work / "containerd.log")
        deadline = time.monotonic() + 60
        while self.run("ctr", "-a", SOCKET, "version", check=False, timeout=30).returncode != 0:
            assert self.containerd.poll() is None, (self.work / "containerd.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "containerd did not come up"
            time.sleep(0.2)
        cri = [ln for ln in self.run("ctr", "-a", SOCKET, "plugins", "ls").stdout.splitlines()
               if ln.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
        assert cri and cri[0].split()[-1] == "ok", (cri, (self.work / "containerd.log").read_text()[-4000:])

    def restart_containerd(self) -> None:
        """``systemctl restart containerd``: SIGTERM (its containers and their shims live on), then start
        it again; it reads its configuration anew."""
        _stop(self.containerd, timeout=60)
        self.start_containerd()

    def _start_kubelet(self) -> None:
        w = self.work
        port, healthz = free_port(), free_port()
        cfg = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
               "port": port, "healthzPort": healthz, "healthzBindAddress": "127.0.0.1", "readOnlyPort": 0,
               "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
               "failSwapOn": False, "failCgroupV1": False, "makeIPTablesUtilChains": False,
               "containerRuntimeEndpoint": f"unix://{SOCKET}",
               "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
               "authorization": {"mode": "AlwaysAllow"},
               "evictionHard": {"nodefs.available": "1%", "imagefs.available": "1%", "memory.available": "1Mi"},
               "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
               "podLogsDir": "/var/log/pods", "resolvConf": "/etc/resolv.conf", "syncFrequency": "10s",
               "serializeImagePulls": False, "shutdownGracePeriod": "0s"}
        (w / "kubelet.yaml").write_text(json.dumps(cfg, indent=2))
        labels = ",".join(f"{k}={v}" for k, v in {
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": self.gpu_model.replace(" ", "-"),
            "nvidia.com/gpu.deploy.driver": "true"}.items())
        kubeconfig = self.cluster.kubeconfig(ADMIN_TOKEN, "admin")
        self.kubelet = _spawn(self.nsenter(kubebuild.kubelet(), f"--kubeconfig={kubeconfig}",
                                           f"--config={w / 'kubelet.yaml'}", "--root-dir=/var/lib/kubelet",
                                           f"--hostname-override={self.name}", f"--node-labels={labels}"),
                              w / "kubelet.log")
        admin = self.cluster.admin

        def ready():
            assert self.kubelet.poll() is None, (w / "kubelet.log").read_text()[-4000:]
            try:
                node = admin.get(f"/api/v1/nodes/{self.name}")
            except ApiError:
                return False
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"

        admin.wait(f"node {self.name} Ready", ready, timeout=240, interval=0.5)
        self.set_gfd_labels(self.driver)

    def set_gfd_labels(self, version: str) -> None:
        """What GPU Feature Discovery labels the node with for its driver."""
        self.cluster.admin.merge(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": {
            "nvidia.com/cuda.driver-version.full": version}}})

    def set_driver(self, version: str) -> None:
        """The node's kernel driver and its user-space libcuda (what the driver container's reload
        changes on a real node), and GPU Feature Discovery's label."""
        self._install_driver_files(version)
        p = self.path("/proc/driver/nvidia/version")
        p.write_text(driver_version_text(version))
        assert p.read_text().split()[7] == version
        self.driver = version
        self.set_gfd_labels(version)

    def trust_registry(self, host: str) -> None:
        """Let the node's containerd pull from the plain-HTTP registry at ``host`` (tests/support/registry.py):
        its ``hosts.toml`` under the config's ``config_path``, which containerd reads at each pull."""
        from tests.support.registry import hosts_toml

        assert self.containerd_bin is None, "containerd 2.x's config names no config_path here"
        d = self.path(f"/etc/containerd/certs.d/{host}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(hosts_toml(host))

    def import_image(self, tar: Path, base_name: str) -> None:
        """``ctr -n k8s.io images import --base-name ...`` on the node (docs/engines.md)."""
        self.ctr("images", "import", "--base-name", base_name, tar, timeout=600)

    def helm(self, *args, check=True, timeout=300) -> subprocess.CompletedProcess:
        """helm (tests/support/kubebuild.py) as the cluster admin; its caches in the test's dir."""
        home = self.work / "helm"
        env = dict(ENV, KUBECONFIG=str(self.cluster.kubeconfig(ADMIN_TOKEN, "admin")),
                   HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
                   HELM_DATA_HOME=str(home / "data"))
        return _sh([kubebuild.helm(), *args], check=check, timeout=timeout, env=env)

    def pod_log(self, ns: str, pod: str, container: str | None = None) -> str:
        """``kubectl logs``: through the API server, which asks the kubelet."""
        import urllib.parse
        import urllib.request

        api = self.cluster.admin
        url = f"{api.url}/api/v1/namespaces/{ns}/pods/{pod}/log"
        if container:
            url += "?" + urllib.parse.urlencode({"container": container})
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api.token}"})
        with urllib.request.urlopen(req, context=api._ctx, timeout=30) as r:
            return r.read().decode(errors="replace")

    def processes(self) -> list:
        """PIDs in the node's mount namespace (but the holder)."""
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != self.holder.pid and _mount_ns(int(d)) == self.ns:
                out.append(int(d))
        return out

    def _remove_pods(self) -> None:
        """Stop and remove every pod sandbox through the CRI, as the kubelet does. On containerd 2.x the
        ``ctr`` kills below left the chart's pods' shims running after a containerd restart."""
        from tests import cri

        client = cri.Client(str(self.path(SOCKET)), self.work / "cri-gen")
        try:
            for sb in client.runtime.ListPodSandbox(client.pb.ListPodSandboxRequest(), timeout=60).items:
                client.remove_pod(sb.id)
        finally:
            client.close()

    def stop(self) -> dict:
        """Tear the node down (module docstring). Returns ``containers`` and ``cgroups`` it removed,
        ``processes`` it had to kill, and what is still there: ``mounts`` under the test's dir and
        ``bridge`` (both should be empty/False)."""
        left = {"containers": [], "processes": [], "mounts": [], "bridge": False, "cgroups": []}
        if self.holder is None:
            return left
        _stop(self.kubelet)
        if self.containerd_bin and self.containerd is not None and self.containerd.poll() is None:
            self._remove_pods()
        if self.containerd is not None and self.containerd.poll() is None:
            for cid in self.ctr("containers", "ls", "-q", check=False, timeout=60).stdout.split():
                self.container_ids.add(cid)
                left["containers"].append(cid)
                self.ctr("tasks", "kill", "-s", "KILL", cid, check=False, timeout=60)
                self.ctr("tasks", "delete", "-f", cid, check=False, timeout=60)
                self.ctr("containers", "rm", cid, check=False, timeout=60)
        _stop(self.containerd)
        if self.holder.poll() is None:
            mounts = self.run("sh", "-c", "awk '{print $5}' /proc/self/mountinfo", check=False).stdout.split()
            for mp in sorted({m for m in mounts if m.startswith("/var/lib/kubelet/")}, key=len, reverse=True):
                self.run("umount", mp, check=False)
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:  # shims exit once their tasks are gone
            time.sleep(0.1)
        for pid in self.processes():
            left["processes"].append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _stop(self.holder, timeout=10)
        if _sh(["ip", "link", "show", self.bridge], check=False).returncode == 0:  # the pods' CNI made it
            _sh(["ip", "link", "del", self.bridge], check=False)
            left["bridge"] = _sh(["ip", "link", "show", self.bridge], check=False).returncode == 0
        for cid in self.container_ids:  # runc removes them; a killed container's may stay (cgroup v1)
            for d in Path("/sys/fs/cgroup").glob(f"*/k8s.io/{cid}"):
                left["cgroups"].append(str(d))
                try:
                    d.rmdir()
                except OSError:
                    pass
        for d in Path("/sys/fs/cgroup").glob("*/k8s.io"):  # containerd's parent, when this node made it
            if d.parent.name not in self._cgroup_parents_before:
                try:
                    d.rmdir()
                except OSError:  # another containerd of the k8s.io namespace uses it now
                    pass
        from tests.support.runtimes import mounts_under

        left["mounts"] = mounts_under(self.work)
        self.holder = None
        return left


def stop_all(cluster: "Cluster", node: "Node | None", work: Path, logs=("node/kubelet.log", "node/containerd.log"),
             timings: dict | None = None, t0: float | None = None, label: str = "node") -> dict | None:
    """A module's teardown: the node stopped, then the control plane (also when the node's stop fails);
    ``timings`` gains ``teardown`` and ``total`` (from ``t0``) and is printed, then the tail of each of
    ``logs`` (paths under ``work``). Returns what :meth:`Node.stop` had to clean up (None: no node)."""
    t = time.monotonic()
    try:
        left = node.stop() if node is not None else None
    finally:
        cluster.stop()
    if timings is not None:
        timings["teardown"] = time.monotonic() - t
        if t0 is not None:
            timings["total"] = time.monotonic() - t0
        print(f"{label} fixture timings (s):", {k: round(v, 1) for k, v in timings.items()})
    for name in logs:
        f = work / name
        if f.exists():
            print(f"--- {name} (tail)\n" + f.read_text(errors="replace")[-2000:])
    return left


def workload_images(work: Path) -> Path:
    """The tests' images as one tar (tests/support/engines.py ``build_image``): ``pause``, ``base``
    (CUDA 12.4, no compat driver) and ``compat`` (CUDA 12.4 with Debian's real 550 libcuda in
    ``/usr/local/cuda-12.4/compat``), each running tests/support/probe.c."""
    from tests.support import engines
    from tests.support.versions import COMPAT_550

    return engines.build_image(Path(work), {COMPAT_550: debs.libcuda(COMPAT_550)})


def gpu_pod(name: str, node: str, image: str, *, runtime_class: str | None = "cuda-compat", ns: str = "apps",
            command=None) -> dict:
    """A GPU pod as the tests run it: the GPU request is ``NVIDIA_VISIBLE_DEVICES`` (no device plugin
    here), the image is already on the node."""
    spec = {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                            "command": command or ["/bin/sh", "-c", "probe; exec sleep 100000"]}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def probe_result(text: str) -> dict:
    """tests/support/probe.c's two lines (``cuDriverGetVersion=``, ``libcuda=``) as a dict."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k in ("cuDriverGetVersion", "libcuda", "dlopen-error", "probe-error"):
            out[k] = v
    return out


def wait_pod(api: Api, ns: str, name: str, pred, what: str, timeout: float = 120) -> dict:
    def check():
        pod = api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return pod if pred(pod) else None

    return api.wait(f"pod {ns}/{name} {what}", check, timeout=timeout, interval=0.5)


def running(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def ready(pod: dict) -> bool:
    conds = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
    return conds.get("Ready") == "True"
