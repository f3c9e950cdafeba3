"""compat-hook as installed, on live engines: containerd 1.6, containerd 2.x, Docker and Podman.

Every engine is registered exactly as docs/engines.md tells a user
(``compat-hook install containerd|docker|podman``, pointed at the test
daemon's config file and given ``--hook-config``, ``--state-dir`` and, for
the wrapper, ``--wrapper-path`` so nothing is written outside the test's
dirs), with the default configuration: ``compat-hook config``'s output with
only its two paths (``log_file``, ``store_dir``) moved into the test dir.

The only fake is the kernel driver: each daemon (and each ``podman`` run)
lives in a private mount namespace whose ``/proc/driver/nvidia/version``
says 535.261.03 (an "old" host for the image's compat driver 550.163.01) or
555.58.02 (a "newer" host); see tests/support/engines.py. The host driver
library is a real Debian ``libcuda.so.<host>`` bind-mounted into each
container at ``/usr/lib/x86_64-linux-gnu/libcuda.so.<host>`` and
``libcuda.so.1``, as the NVIDIA runtime would (docker ``-v``, CRI mounts,
``ctr --mount``); the image carries the probe (tests/support/probe.c) and a
real compat libcuda 550 in ``/usr/local/cuda-12.4/compat`` and asks for a GPU
with ``NVIDIA_VISIBLE_DEVICES=all`` (tag ``compat``); tag ``root`` asks for none.

In each engine: the compat image on the old host loads the compat driver
(CUDA 12040), on the newer host the host's (12050), and a non-GPU container
is untouched (no drop-in, only ``no_gpu_request`` in the log).

Engines: containerd through the CRI as the kubelet drives it (crictl, a pod
sandbox with ``--runtime cuda-compat``, the RuntimeClass handler) and
through ``ctr run --runtime io.containerd.runc.v2 --runc-binary <the
registered wrapper>``; Docker through ``docker run --runtime cuda-compat``;
Podman through the hooks.d file at the default path
``/usr/share/containers/oci/hooks.d`` (an overlay in the namespace, so the
host's dir is untouched), with no ``--hooks-dir``.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time

import pytest

from tests.support import debs, engines
from tests.support.versions import COMPAT_550, HOST_535, HOST_555
from tests.support.engines import RUN_FLAGS, Podman

pytestmark = pytest.mark.containers

PY = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parents[1]
OLD, COMPAT, NEW = HOST_535, COMPAT_550, HOST_555
CUDA = {OLD: "12020", COMPAT: "12040", NEW: "12050"}
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
COMPAT_LIB = f"/usr/local/cuda-12.4/compat/libcuda.so.{COMPAT}"
IMAGE = "docker.io/library/bb"
RUNTIME = "cuda-compat"
DROPIN = "00-00-compat-hook.conf"
# What each container runs: the probe, then which ld.so.conf.d drop-ins it sees.
COMMAND = ["/bin/sh", "-c", "/usr/local/bin/probe; echo dropins=$(ls /etc/ld.so.conf.d | tr '\\n' ' ')"]


# --------------------------------------------------------------------------- helpers


def compat_hook(*argv, cwd=REPO, prefix=()) -> str:
    """``compat-hook ARGV`` as a user runs it (this tree's package, the OS interpreter)."""
    p = subprocess.run([*map(str, prefix), PY, "-m", "compat_hook", *map(str, argv)], cwd=cwd, capture_output=True,
                       text=True, env=engines.ENV, stdin=subprocess.DEVNULL, timeout=180)
    assert p.returncode == 0, (argv, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    return p.stdout


def default_config(path: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    """``compat-hook config`` (every default), with only the log and the store moved into ``work``."""
    text = compat_hook("config")
    for key, value in (("log_file", work / "compat-hook.log"), ("store_dir", work / "store")):
        lines = [ln for ln in text.splitlines() if ln.startswith(f"{key}: ")]
        assert len(lines) == 1, (key, lines)
        text = text.replace(lines[0] + "\n", f"{key}: {value}\n")
    path.write_text(text)
    return path


class Log:
    """The compat-hook log: records appended since :meth:`mark`."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.n = 0

    def all(self) -> list:
        if not self.path.exists():
            return []
        return [json.loads(ln) for ln in self.path.read_text().splitlines() if ln.strip()]

    def mark(self) -> None:
        self.n = len(self.all())

    def since(self, container_id: str | None = None) -> list:
        recs = self.all()[self.n:]
        return [r for r in recs if container_id is None or r.get("container_id") == container_id]


def outcome(stdout: str) -> dict:
    """``{"cuda": ..., "libcuda": ..., "dropins": [...]}`` from COMMAND's output."""
    kv = dict(ln.split("=", 1) for ln in stdout.splitlines() if "=" in ln)
    return {"cuda": kv.get("cuDriverGetVersion"), "libcuda": kv.get("libcuda", kv.get("dlopen-error")),
            "dropins": kv.get("dropins", "").split()}


def host_mounts(libs: dict, version: str) -> list:
    """``(host path, container path)`` of the host driver library, as the NVIDIA runtime mounts it."""
    return [(libs[version], f"{LIB_DIR}/libcuda.so.{version}"), (libs[version], f"{LIB_DIR}/libcuda.so.1")]


def check_compat(out: dict, recs: list, what: str, events=("runtime", "hook")) -> None:
    """The compat driver loaded; the wrapper (if any) and the hook each decided enable, once."""
    assert out["cuda"] == CUDA[COMPAT] and out["libcuda"] == COMPAT_LIB, (what, out, recs)
    assert sorted(r["event"] for r in recs) == sorted(events), (what, recs)
    assert all(r["decision"] == "enable" for r in recs), (what, recs)


def check_host(out: dict, recs: list, what: str, events=("runtime", "hook")) -> None:
    """The host driver loaded; every record says skip (compat_not_newer)."""
    assert out["cuda"] == CUDA[NEW] and out["libcuda"].startswith(f"{LIB_DIR}/libcuda.so."), (what, out, recs)
    assert sorted(r["event"] for r in recs) == sorted(events), (what, recs)
    assert all((r["decision"], r["reason"]) == ("skip", "compat_not_newer") for r in recs), (what, recs)


def check_untouched(out: dict, recs: list, what: str) -> None:
    assert out["cuda"] == CUDA[OLD], (what, out, recs)  # the host library, as mounted
    assert out["dropins"] == ["x86_64-linux-gnu.conf"], (what, out)
    assert recs and all(r["reason"] == "no_gpu_request" for r in recs), (what, recs)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def crictl_build():
    # Built once into .cache (~100 s on 2 cores the first time, toolchain fetch included): started
    # before anything else, it builds while the ctr, Docker and Podman tests run; the CRI tests come last.
    return engines.Background(engines.crictl)


@pytest.fixture(scope="module")
def libs() -> dict:
    return {v: debs.libcuda(v) for v in (OLD, COMPAT, NEW)}


@pytest.fixture(scope="module")
def image(tmp_path_factory, libs) -> dict:
    """The OCI layout (tags root, pause, base, compat, stale) and its tar (tests/test_containerd.py)."""
    work = tmp_path_factory.mktemp("image")
    tar = engines.build_image(work, libs)
    return {"layout": work / "img", "tar": tar, "work": work}


class Node:
    """One engine's registration: compat-hook's config, state, log and wrapper path under ``work``."""

    def __init__(self, work: pathlib.Path) -> None:
        self.work = work
        self.config = default_config(work / "compat-hook.yaml", work)
        self.state = work / "compat-hook-state"
        self.wrapper = work / "bin" / "compat-hook-runtime"
        self.log = Log(work / "compat-hook.log")


def _containerd(tmp_path_factory, image, bin_dir: str):
    work = tmp_path_factory.mktemp("ctrd")
    node = Node(work)
    daemon = engines.Containerd(work / "daemon", bin_dir=bin_dir, pause_image=f"{IMAGE}:pause")
    out = compat_hook("install", "containerd", "--engine-config", daemon.main, "--hook-config", node.config,
                      "--state-dir", node.state, "--wrapper-path", node.wrapper)
    assert "restart containerd" in out, out
    daemon.start(OLD)
    daemon.import_images(image["tar"])
    return node, daemon


@pytest.fixture(scope="module")
def ctrd16(tmp_path_factory, image):
    node, daemon = _containerd(tmp_path_factory, image, "/usr/bin")
    try:
        yield node, daemon
    finally:
        node.left = daemon.stop()


@pytest.fixture(scope="module")
def ctrd2(tmp_path_factory, image):
    node, daemon = _containerd(tmp_path_factory, image, str(engines.containerd2()))
    try:
        yield node, daemon
    finally:
        node.left = daemon.stop()


# --------------------------------------------------------------------------- containerd


def _registered_wrapper(daemon) -> str:
    """The BinaryName of runtime cuda-compat in containerd's merged config (what the install registered)."""
    import tomllib

    dump = tomllib.loads(engines.sh(daemon.binary, "--config", daemon.main, "config", "dump",
                                    env=daemon.env()).stdout)
    plugin = "io.containerd.cri.v1.runtime" if daemon.version == 3 else "io.containerd.grpc.v1.cri"
    rt = dump["plugins"][plugin]["containerd"]["runtimes"][RUNTIME]
    return rt["options"]["BinaryName"]


def _cri(node, daemon, crictl_build, libs, host: str, tag: str, name: str, share_pid: bool = False):
    daemon.set_driver(host)
    crictl = engines.Crictl(crictl_build.result(), daemon.sock, node.work)
    node.log.mark()
    code, logs, cid = crictl.run(name, RUNTIME, f"{IMAGE}:{tag}", command=COMMAND, mounts=host_mounts(libs, host),
                                 share_pid=share_pid)
    assert code == 0, (code, logs, daemon.log.read_text()[-3000:])
    return outcome(logs), node.log.since(cid if tag == "compat" else None)


def _ctr(node, daemon, libs, host: str, tag: str, name: str):
    daemon.set_driver(host)
    wrapper = _registered_wrapper(daemon)
    mounts = []
    for src, dst in host_mounts(libs, host):
        mounts += ["--mount", f"type=bind,src={src},dst={dst},options=rbind:ro"]
    node.log.mark()
    p = daemon.ctr("-n", "default", "run", "--rm", "--runtime", "io.containerd.runc.v2", "--runc-binary", wrapper,
                   "--runc-root", daemon.work / "runc-ctr", *mounts, f"{IMAGE}:{tag}", name, *COMMAND)
    return outcome(p.stdout), node.log.since(name)


@pytest.mark.parametrize("engine", ["ctrd16", "ctrd2"])
def test_containerd_ctr_run(engine, request, libs):
    node, daemon = request.getfixturevalue(engine)
    assert daemon.version == (3 if engine == "ctrd2" else 2)
    what = f"{engine} ctr run"
    out, recs = _ctr(node, daemon, libs, OLD, "compat", "old-host")
    check_compat(out, recs, f"{what}, old host")
    out, recs = _ctr(node, daemon, libs, NEW, "compat", "new-host")
    check_host(out, recs, f"{what}, newer host")
    out, recs = _ctr(node, daemon, libs, OLD, "root", "no-gpu")
    check_untouched(out, recs, f"{what}, non-GPU container")


# --------------------------------------------------------------------------- Docker


@pytest.fixture(scope="module")
def docker(tmp_path_factory, image):
    work = tmp_path_factory.mktemp("docker")
    node = Node(work)
    daemon = engines.Dockerd(work / "daemon")
    out = compat_hook("install", "docker", "--engine-config", daemon.config, "--hook-config", node.config,
                      "--state-dir", node.state, "--wrapper-path", node.wrapper)
    assert "restart the daemon" in out, out
    daemon.start(OLD)
    try:
        for tag in ("compat", "root"):
            tar = engines.docker_archive(image["layout"], tag, f"{IMAGE}:{tag}", work / f"{tag}.tar")
            daemon.docker("load", "-i", tar)
        yield node, daemon
    finally:
        node.left = daemon.stop()


def _docker(node, daemon, libs, host: str, tag: str):
    daemon.set_driver(host)
    vols = []
    for src, dst in host_mounts(libs, host):
        vols += ["-v", f"{src}:{dst}:ro"]
    node.log.mark()
    cid = daemon.docker("create", "--runtime", RUNTIME, "--network", "none", *vols, f"{IMAGE}:{tag}",
                        *COMMAND).stdout.strip()
    try:
        p = daemon.docker("start", "-a", cid)
    finally:
        daemon.docker("rm", "-f", cid, check=False)
    return outcome(p.stdout), node.log.since(cid)


def test_docker_run_with_the_runtime(docker, libs):
    node, daemon = docker
    runtimes = json.loads(daemon.docker("info", "--format", "{{json .Runtimes}}").stdout)
    assert runtimes[RUNTIME]["path"] == str(node.wrapper), runtimes
    out, recs = _docker(node, daemon, libs, OLD, "compat")
    check_compat(out, recs, "docker, old host")
    out, recs = _docker(node, daemon, libs, NEW, "compat")
    check_host(out, recs, "docker, newer host")
    out, recs = _docker(node, daemon, libs, OLD, "root")
    check_untouched(out, recs, "docker, non-GPU container")


# --------------------------------------------------------------------------- Podman


class PodmanNode(Node):
    """Podman with private storage (tests/support/engines.py), each run in a driver namespace whose
    /usr/share/containers shows an overlay: the default hooks.d dir, written by ``install podman``."""

    def __init__(self, work: pathlib.Path, pm: Podman) -> None:
        super().__init__(work)
        self.pm = pm
        self.driver_file = work / "driver-version"
        self.upper, self.ovl_work = work / "share-upper", work / "share-work"
        self.upper.mkdir()
        self.ovl_work.mkdir()

    def ns(self, version: str) -> list:
        self.driver_file.write_text(engines.driver_version_text(version))
        return engines.in_driver_namespace([], self.driver_file,
                                           overlays=[("/usr/share/containers", self.upper, self.ovl_work)])


@pytest.fixture(scope="module")
def podman(tmp_path_factory, image):
    work = tmp_path_factory.mktemp("podman")
    pm = Podman(work / "pm")
    node = PodmanNode(work, pm)
    try:
        for tag in ("compat", "root"):
            tar = engines.docker_archive(image["layout"], tag, f"{IMAGE}:{tag}", work / f"{tag}.tar")
            pm.load(tar, f"{IMAGE}:{tag}")
        out = compat_hook("install", "podman", "--hook-config", node.config, "--state-dir", node.state,
                          prefix=node.ns(OLD))
        assert "/usr/share/containers/oci/hooks.d/50-compat-hook.json" in out, out
        yield node
    finally:
        pm.reset()


def _podman(node, libs, host: str, tag: str):
    vols = []
    for src, dst in host_mounts(libs, host):
        vols += ["-v", f"{src}:{dst}:ro"]
    node.log.mark()
    argv = node.ns(host) + node.pm.argv("run", "--rm", *RUN_FLAGS, *vols, f"{IMAGE}:{tag}", *COMMAND)
    p = engines.sh(*argv, timeout=180)
    return outcome(p.stdout), node.log.since()


def test_podman_through_the_default_hooksd_dir(podman, libs):
    hooks = podman.upper / "oci" / "hooks.d" / "50-compat-hook.json"
    doc = json.loads(hooks.read_text())  # written through the overlay: the host's /usr/share is untouched
    assert doc["when"] == {"always": True} and str(podman.config) in doc["hook"]["args"]
    assert not pathlib.Path("/usr/share/containers/oci/hooks.d/50-compat-hook.json").exists() or \
        "compat_hook" not in pathlib.Path("/usr/share/containers/oci/hooks.d/50-compat-hook.json").read_text()
    out, recs = _podman(podman, libs, OLD, "compat")
    check_compat(out, recs, "podman, old host", events=("hook",))
    assert DROPIN in out["dropins"]
    out, recs = _podman(podman, libs, NEW, "compat")
    check_host(out, recs, "podman, newer host", events=("hook",))
    out, recs = _podman(podman, libs, OLD, "root")
    check_untouched(out, recs, "podman, non-GPU container")


def test_podman_uninstall_removes_the_hooksd_dirs_it_created(podman):
    """``install podman`` created what the host lacks of /usr/share/containers/oci/hooks.d (Debian's
    podman ships no oci/): ``uninstall podman`` takes the file and then those dirs out again (dirs the
    host has stay); a second install puts them back."""
    made = [d for d in ("/usr/share/containers/oci/hooks.d", "/usr/share/containers/oci")
            if not pathlib.Path(d).exists()]  # the host's view, below the overlay
    out = compat_hook("uninstall", "podman", prefix=podman.ns(OLD))
    for d in made:
        assert f"removed {d}/" in out.splitlines(), out
    assert not (podman.upper / "oci" / "hooks.d").exists() or "/usr/share/containers/oci/hooks.d" not in made
    assert "removed /usr/share/containers/\n" not in out  # the host's own dir stays
    out = compat_hook("install", "podman", "--hook-config", podman.config, "--state-dir", podman.state,
                      prefix=podman.ns(OLD))
    assert (podman.upper / "oci" / "hooks.d" / "50-compat-hook.json").is_file(), out


# --------------------------------------------------------------------------- the CRI (last: crictl may still be building)


@pytest.mark.parametrize("engine", ["ctrd16", "ctrd2"])
def test_containerd_cri_with_the_runtime_handler(engine, request, crictl_build, libs):
    node, daemon = request.getfixturevalue(engine)
    what = f"{engine} CRI"
    crictl = engines.Crictl(crictl_build.result(), daemon.sock, node.work)
    version = dict(ln.split(":", 1) for ln in crictl("version").stdout.splitlines() if ":" in ln)
    version = {k.strip(): v.strip() for k, v in version.items()}
    assert version["RuntimeName"] == "containerd", version
    assert version["RuntimeVersion"].startswith("1.6." if engine == "ctrd16" else "2."), version
    out, recs = _cri(node, daemon, crictl_build, libs, OLD, "compat", "old-host")
    check_compat(out, recs, f"{what}, old host")
    out, recs = _cri(node, daemon, crictl_build, libs, NEW, "compat", "new-host")
    check_host(out, recs, f"{what}, newer host")
    out, recs = _cri(node, daemon, crictl_build, libs, OLD, "root", "no-gpu")
    check_untouched(out, recs, f"{what}, non-GPU container")


def test_containerd_cri_pod_sharing_its_pid_namespace(ctrd16, crictl_build, libs):
    """``shareProcessNamespace: true``: the container's init is not pid 1 of its pid namespace."""
    node, daemon = ctrd16
    out, recs = _cri(node, daemon, crictl_build, libs, OLD, "compat", "shared-pid", share_pid=True)
    check_compat(out, recs, "ctrd16 CRI, shared pid namespace, old host")


# --------------------------------------------------------------------------- uninstall while containers live


def _passthrough(node) -> str:
    text = node.wrapper.read_text()
    assert text.startswith("#!/bin/sh\n# compat-hook-runtime pass-through:"), text[:200]
    assert "python" not in text and "compat_hook" not in text, text  # nothing of compat-hook runs
    return text


def _pod_files(node, name: str, command=("sleep", "600")):
    pod_dir = node.work / "pods" / name
    pod_dir.mkdir(parents=True, exist_ok=True)
    ns = {"network": 2, "pid": 1}
    (pod_dir / "pod.json").write_text(json.dumps({
        "metadata": {"name": name, "namespace": "compat-hook-tests", "uid": f"uid-{name}", "attempt": 0},
        "log_directory": str(pod_dir), "linux": {"security_context": {"namespace_options": ns}}}))
    (pod_dir / "ctr.json").write_text(json.dumps({
        "metadata": {"name": name}, "image": {"image": f"{IMAGE}:root"}, "log_path": f"{name}.log",
        "command": list(command), "linux": {"security_context": {"namespace_options": ns}}}))
    return pod_dir / "pod.json", pod_dir / "ctr.json"


def test_uninstall_containerd_leaves_running_pods_stoppable(ctrd16, crictl_build):
    """``uninstall containerd`` with a CRI pod of the runtime running: the pod stops and goes (crictl stopp,
    which runs the registered BinaryName); the pass-through left for it and for containerd itself (which
    keeps the runtime in memory) goes with the uninstall after containerd restarted."""
    node, daemon = ctrd16
    crictl = engines.Crictl(crictl_build.result(), daemon.sock, node.work)
    pod_json, ctr_json = _pod_files(node, "live")
    pod = crictl("runp", "--runtime", RUNTIME, pod_json).stdout.strip()
    cid = crictl("create", "--no-pull", pod, ctr_json, pod_json).stdout.strip()
    crictl("start", cid)
    try:
        out = compat_hook("uninstall", "containerd", "--config", daemon.main)
        assert "pass-through" in out and pod[:12] in out, out  # the sandbox's task is named
        assert f"containerd (pid {daemon.pid}) still runs with compat-hook's runtime in memory" in out, out
        _passthrough(node)
        # A second uninstall keeps it while the pod lives.
        out = compat_hook("uninstall", "containerd", "--config", daemon.main, "--wrapper-path", node.wrapper)
        assert "kept the pass-through" in out and node.wrapper.exists(), out
        # The kubelet's way out: stop the container, the pod sandbox, remove both.
        crictl("stop", "-t", "2", cid)
        crictl("rm", cid)
        crictl("stopp", pod)
        crictl("rmp", pod)
    finally:
        crictl("rmp", "-f", pod, check=False)
    # The pod is gone, but this containerd has not restarted: it would still start the runtime's pods there.
    out = compat_hook("uninstall", "containerd", "--config", daemon.main, "--wrapper-path", node.wrapper)
    assert f"containerd (pid {daemon.pid}) has not restarted" in out and node.wrapper.exists(), out
    daemon.restart()
    out = compat_hook("uninstall", "containerd", "--config", daemon.main, "--wrapper-path", node.wrapper)
    assert f"removed {node.wrapper}" in out and not node.wrapper.exists(), out
    # Registered again for what follows, and loaded.
    compat_hook("install", "containerd", "--config", daemon.main, "--hook-config", node.config,
                "--state-dir", node.state, "--wrapper-path", node.wrapper)
    daemon.restart()
    assert _registered_wrapper(daemon) == str(node.wrapper)


def test_uninstall_containerd_racing_a_pod_start(ctrd16, crictl_build):
    """Pods the kubelet starts after ``uninstall containerd`` but before containerd restarts: containerd
    still routes the runtime handler to the wrapper's path, which the uninstall left as a pass-through,
    so they start (with the real runtime, nothing of compat-hook). Before, the wrapper was gone and the
    sandbox failed: ``fork/exec <wrapper>: no such file or directory``."""
    node, daemon = ctrd16
    crictl = engines.Crictl(crictl_build.result(), daemon.sock, node.work)
    out = compat_hook("uninstall", "containerd", "--config", daemon.main)
    assert f"containerd (pid {daemon.pid}) still runs" in out and "created through" not in out, out
    text = _passthrough(node)
    assert f"# engine-process: containerd {daemon.pid} " in text, text
    node.log.mark()
    pod_json, ctr_json = _pod_files(node, "racing", ("/bin/sh", "-c", "echo started"))
    pod = crictl("runp", "--runtime", RUNTIME, pod_json).stdout.strip()
    try:
        cid = crictl("create", "--no-pull", pod, ctr_json, pod_json).stdout.strip()
        crictl("start", cid)
        deadline = time.monotonic() + 30
        while "started" not in (node.work / "pods" / "racing" / "racing.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, "the racing pod's container did not run"
            time.sleep(0.1)
        # It ran without compat-hook: no decision line was added for it.
        assert node.log.since(pod) == [] and node.log.since(cid) == [], node.log.since()
    finally:
        crictl("rmp", "-f", pod, check=False)
    # install replaces the pass-through with the wrapper: containerd (not restarted) uses it again at once.
    out = compat_hook("install", "containerd", "--config", daemon.main, "--hook-config", node.config,
                      "--state-dir", node.state, "--wrapper-path", node.wrapper)
    assert "was the pass-through an uninstall left" in out, out
    assert node.wrapper.read_text().startswith("#!/bin/sh\n# compat-hook-runtime:"), node.wrapper.read_text()[:100]


def test_uninstall_docker_keeps_its_containers_usable(docker):
    """``uninstall docker`` with one container of the runtime running and one created: the running one
    stops and goes; Docker, restarted, still knows the runtime, so the created one starts; once both are
    gone, ``uninstall docker`` again takes the entry out, and the pass-through once dockerd has restarted
    without the entry."""
    node, daemon = docker
    running = daemon.docker("run", "-d", "--runtime", RUNTIME, "--network", "none", f"{IMAGE}:root",
                            "sleep", "600").stdout.strip()
    created = daemon.docker("create", "--runtime", RUNTIME, "--network", "none", f"{IMAGE}:root",
                            "/bin/sh", "-c", "echo started-later").stdout.strip()
    try:
        out = compat_hook("uninstall", "docker", "--config", daemon.config)
        assert "pass-through" in out and running[:12] in out and created[:12] in out, out
        assert json.loads(daemon.config.read_text())["runtimes"][RUNTIME]["path"] == str(node.wrapper)
        _passthrough(node)
        daemon.docker("stop", "-t", "2", running)
        daemon.docker("rm", running)
        daemon.restart()  # reads daemon.json again, as after `systemctl restart docker`
        p = daemon.docker("start", "-a", created)
        assert p.stdout == "started-later\n", p
        daemon.docker("rm", created)
    finally:
        daemon.docker("rm", "-f", running, created, check=False)
    out = compat_hook("uninstall", "docker", "--config", daemon.config)
    assert RUNTIME not in json.loads(daemon.config.read_text()).get("runtimes", {}), out
    # The restarted dockerd loaded the entry kept for the created container: it still knows the runtime
    # until its next restart, so the pass-through stays for it.
    assert f"dockerd (pid {daemon.pid}) still runs" in out and node.wrapper.exists(), out
    assert f"`compat-hook uninstall docker --wrapper-path {node.wrapper}` again" in out, out
    daemon.restart()
    out = compat_hook("uninstall", "docker", "--config", daemon.config, "--wrapper-path", node.wrapper)
    assert not node.wrapper.exists(), out
    compat_hook("install", "docker", "--config", daemon.config, "--hook-config", node.config,
                "--state-dir", node.state, "--wrapper-path", node.wrapper)


# --------------------------------------------------------------------------- the end


def test_zz_daemons_stop_and_leave_nothing_behind(request):
    """Stopped by PID: no shim, no containerd of dockerd's, nothing mounted under the work dirs."""
    started = time.monotonic()
    for name in ("ctrd16", "ctrd2", "docker"):
        node, daemon = request.getfixturevalue(name)
        left = daemon.stop()
        assert left == {"processes": [], "mounts": []}, (name, left)
    assert time.monotonic() - started < 60
