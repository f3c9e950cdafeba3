"""compat-hook's NRI plugin on a real containerd 2.x, driven through the CRI as the kubelet drives it.

containerd 2.x (Debian sid's, tests/support/engines.py ``containerd2()``) runs as the GPU
Operator sets it up in CDI mode: ``enable_cdi``, the default runtime plain runc (no
RuntimeClass, no wrapper), NRI on. A CDI spec for ``nvidia.com/gpu`` carries what the
toolkit's would: the device node (``/dev/nvidia0``, here backed by ``/dev/null``: no GPU),
the host's real Debian ``libcuda.so.<host>`` mounted at ``libcuda.so.1``, and
``NVIDIA_VISIBLE_DEVICES=void`` (which overrides the CUDA image's ``all``). Containers
name the device as the kubelet passes a device plugin's or a DRA claim's: the CRI
``CDI_devices`` field. The host driver is the only fake (a private mount namespace whose
``/proc/driver/nvidia/version`` says 535.261.03, older than the image's compat 550).

One more spec, ``nvidia.com/gputk``, carries the toolkit's real v1.20.2 ``nvidia-cdi-hook`` hooks
(create-symlinks, enable-cuda-compat, update-ldcache) as a generated spec does, for a GeForce host
(``/proc/driver/nvidia/gpus/*/information`` in containerd's namespace). NVIDIA's own NRI plugin
(``nvidia-ctk-installer --enable-nri-plugin``, index 10) runs next to compat-hook's in one test:
the CDI device comes from a pod annotation only.

compat-hook is registered with ``compat-hook install containerd --via nri`` (the plugin
built from packaging/nri into the test cache), pointed at the test containerd's config,
so the plugin lands in the NRI directories that config names. What the container really
loads is the probe's answer (tests/support/probe.c): the compat driver (CUDA 12040) when
compat-hook's hook ran and enabled it, the host's (12020) when it did not.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import time

import pytest

from tests import cri
from tests.support import debs, engines, kubebuild
from tests.support.versions import COMPAT_550, HOST_535
from tests.test_live_engines import Log, compat_hook, default_config, outcome

pytestmark = pytest.mark.containers

OLD, COMPAT = HOST_535, COMPAT_550
IMAGE = "docker.io/library/bb"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
COMPAT_LIB = f"/usr/local/cuda-12.4/compat/libcuda.so.{COMPAT}"
COMMAND = ["/bin/sh", "-c", "/usr/local/bin/probe; echo dropins=$(ls /etc/ld.so.conf.d | tr '\\n' ' ')"]
GPU = "nvidia.com/gpu=0"
REPO = pathlib.Path(__file__).resolve().parents[1]


def nri_dropin(work: pathlib.Path) -> str:
    """NRI on with the test's own socket and dirs; CDI on with the test's spec dir (containerd 2.x merges it)."""
    return f"""\
version = 3

[plugins]
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = "{work}/nri.sock"
    plugin_path = "{work}/nri/plugins"
    plugin_config_path = "{work}/nri/conf.d"
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    cdi_spec_dirs = ["{work}/cdi"]
"""


def cdi_spec(libs: dict, host: str) -> dict:
    lib = str(libs[host])
    opts = ["ro", "nosuid", "nodev", "bind"]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]}}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [{"hostPath": lib, "containerPath": f"{LIB_DIR}/libcuda.so.{host}", "options": opts},
                       {"hostPath": lib, "containerPath": f"{LIB_DIR}/libcuda.so.1", "options": opts}]},
    }


class NriNode:
    """containerd 2.x with NRI and CDI on, compat-hook registered through NRI, one pod sandbox on runc."""

    def __init__(self, work: pathlib.Path, tar: pathlib.Path, libs: dict, bin_dir: pathlib.Path | None = None) -> None:
        self.work = work
        #: containerd's bin dir: Debian sid's 2.1 unless given (tests/test_nri_required.py: 2.2, 2.4).
        self.bin_dir = bin_dir or engines.containerd2()
        self.libs = libs
        self.config = default_config(work / "compat-hook.yaml", work)
        self.state = work / "compat-hook-state"
        self.log = Log(work / "compat-hook.log")
        self.daemon = engines.Containerd(work / "daemon", bin_dir=str(self.bin_dir),
                                         pause_image=f"{IMAGE}:pause")
        d = self.daemon.work
        (self.daemon.main.parent / "conf.d").mkdir(exist_ok=True)
        (self.daemon.main.parent / "conf.d" / "10-nri-cdi.toml").write_text(nri_dropin(d))
        (d / "cdi").mkdir()
        (d / "cdi" / "nvidia.json").write_text(json.dumps(cdi_spec(libs, OLD)))
        self.plugin_src = kubebuild.nri_plugin()
        self.install_out = self.install()
        self.daemon.start(OLD)
        self.daemon.import_images(tar)
        self.client = cri.Client(str(self.daemon.sock), work / "gen")
        self.kept: list = []
        self.pods = work / "pods"
        self.pods.mkdir()
        self.sandbox = self.client.sandbox_config("nri", str(self.pods))
        self.pod = self.client.run_pod(self.sandbox, "")  # the default runtime: plain runc

    def install(self, *extra) -> str:
        return compat_hook("install", "containerd", "--via", "nri", "--engine-config", self.daemon.main,
                           "--hook-config", self.config, "--state-dir", self.state,
                           "--nri-plugin", self.plugin_src, *extra, prefix=self.path_prefix())

    def path_prefix(self) -> list:
        # `compat-hook install` finds containerd on PATH (its `config dump` says where NRI's dirs are).
        return ["/usr/bin/env", f"PATH={self.bin_dir}:{engines.ENV['PATH']}"]

    @property
    def plugin_file(self) -> pathlib.Path:
        return self.daemon.work / "nri" / "plugins" / "90-compat-hook"

    @property
    def conf_file(self) -> pathlib.Path:
        return self.daemon.work / "nri" / "conf.d" / "90-compat-hook.conf"

    def plugin_pids(self) -> list:
        pids = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.readlink(f"/proc/{pid}/exe") == str(self.plugin_file):
                        pids.append(int(pid))
                except OSError:
                    pass
        return pids

    def wait_plugin(self, present: bool, timeout: float = 20) -> list:
        deadline = time.monotonic() + timeout
        while True:
            pids = self.plugin_pids()
            if bool(pids) == present or time.monotonic() > deadline:
                return pids
            time.sleep(0.1)

    def run(self, name: str, tag: str, cdi=(), annotations=None, keep: bool = False, pod=None):
        """Run the probe: ``(outcome, compat-hook log records of this container)``.

        ``keep``: the container sleeps on after the probe and stays (containerd lists running
        containers to a plugin that connects later). ``pod``: ``(sandbox id, its config)`` of
        another pod than the node's own (its log directory must be ``self.pods``)."""
        pod_id, sandbox = pod or (self.pod, self.sandbox)
        self.log.mark()
        log = self.pods / f"{name}.log"
        if not keep:
            st, cid = self.client.run_container(pod_id, sandbox, name, f"{IMAGE}:{tag}", command=COMMAND,
                                                cdi_devices=cdi, annotations=annotations)
            text = cri.read_log(log)
            assert st.exit_code == 0, (st, text, self.daemon.log.read_text()[-3000:])
            self.client.remove_container(cid)
            return outcome(text), self.log.since(cid)
        command = [*COMMAND[:2], COMMAND[2] + "; exec sleep 600"]
        cfg = self.client.container_config(name, f"{IMAGE}:{tag}", command, annotations=annotations, cdi_devices=cdi)
        cid = self.client.create_container(pod_id, sandbox, cfg)
        self.kept.append(cid)
        self.client.runtime.StartContainer(self.client.pb.StartContainerRequest(container_id=cid), timeout=60)
        deadline = time.monotonic() + 60
        while not (log.exists() and "dropins=" in cri.read_log(log)):
            assert time.monotonic() < deadline, "the probe did not answer"
            time.sleep(0.05)
        return outcome(cri.read_log(log)), self.log.since(cid)

    def reconnect(self, gen: str) -> None:
        old, self.client = self.client, cri.Client(str(self.daemon.sock), self.work / gen)
        old.close()

    def close(self) -> dict:
        try:
            for cid in self.kept:
                self.client.runtime.StopContainer(self.client.pb.StopContainerRequest(container_id=cid, timeout=0),
                                                  timeout=60)
                self.client.remove_container(cid)
            self.client.remove_pod(self.pod)
        finally:
            self.client.close()
        return self.daemon.stop()


@pytest.fixture(scope="module")
def libs() -> dict:
    return {v: debs.libcuda(v) for v in (OLD, COMPAT)}


@pytest.fixture(scope="module")
def node(tmp_path_factory, libs):
    work = tmp_path_factory.mktemp("nri")
    tar = engines.build_image(work / "image", libs)
    n = NriNode(work, tar, libs)
    try:
        yield n
    finally:
        n.left = n.close()


@contextlib.contextmanager
def geforce_host_with_toolkit_spec(node):
    """A GeForce host (``/proc/driver/nvidia/gpus/*/information`` in containerd's namespace) and the
    CDI spec ``nvidia.com/gputk`` whose edits carry the toolkit's real v1.20.2 hooks, while in the block."""
    from tests.support import toolkit as tks

    tk = tks.ensure()
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gputk",
            "devices": [{"name": "0", "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]}}],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                               "mounts": tks.cdi_mounts(node.libs[OLD], OLD), "hooks": tks.cdi_hooks(tk, OLD)}}
    (node.daemon.work / "cdi" / "nvidia-toolkit.json").write_text(json.dumps(spec))
    gpus = pathlib.Path(f"/proc/{node.daemon.pid}/root/proc/driver/nvidia/gpus/0000:01:00.0")
    gpus.mkdir(parents=True)
    (gpus / "information").write_text("Model: \t\t NVIDIA GeForce RTX 4090\nBus Location: \t 0000:01:00.0\n"
                                      "Device Minor: \t 0\n")
    try:
        yield
    finally:
        (gpus / "information").unlink()
        gpus.rmdir()
        (node.daemon.work / "cdi" / "nvidia-toolkit.json").unlink()


def _enabled(out: dict, recs: list, what: str) -> None:
    """compat-hook's hook ran (once) and the container loads the compat driver."""
    assert out["cuda"] == "12040" and out["libcuda"] == COMPAT_LIB, (what, out, recs)
    assert [(r["event"], r["decision"], r.get("via")) for r in recs] == [("hook", "enable", "nri")], (what, recs)


def _untouched(out: dict, recs: list, what: str) -> None:
    """No compat-hook hook ran at all; the container loads what it was given (the host's 535 driver)."""
    assert out["cuda"] == "12020" and out["libcuda"].startswith(f"{LIB_DIR}/libcuda.so."), (what, out, recs)
    assert recs == [], (what, recs)


def test_install_places_the_plugin_where_containerd_reads_it(node):
    assert "restart containerd" in node.install_out, node.install_out
    assert node.plugin_file.stat().st_mode & 0o111
    doc = json.loads(node.conf_file.read_text())
    # The same hook entry the hooks.d file carries (one renderer), plus the plugin's trace target.
    compat_hook("install", "podman", "--hook-config", node.config, "--state-dir", node.state,
                "--hooks-dir", node.work / "hooksd")
    hooksd = json.loads((node.work / "hooksd" / "50-compat-hook.json").read_text())
    assert doc["hook"]["args"][-2:] == ["--via", "nri"], doc  # what the log line will say
    assert dict(doc["hook"], args=doc["hook"]["args"][:-2]) == hooksd["hook"], (doc, hooksd)
    assert doc["stages"] == hooksd["stages"] == ["createContainer"], doc
    assert doc["hook"]["args"][-6:-2] == ["--config", str(node.config), "--state-dir", str(node.state)], doc
    assert doc["log_file"] == str(node.work / "compat-hook.log"), doc
    # containerd started it (pre-registered, index 90 from its name).
    assert node.wait_plugin(True), node.daemon.log.read_text()[-3000:]
    # A second install changes nothing.
    assert "nothing changed" in node.install()


def test_gpu_container_by_cdi_devices_gets_the_decision(node):
    out, recs = node.run("gpu", "compat", cdi=[GPU])
    _enabled(out, recs, "CDI_devices")


def test_explain_names_the_path(node):
    out, recs = node.run("gpu-explained", "compat", cdi=[GPU], keep=True)
    _enabled(out, recs, "kept")
    bundle = node.daemon.work / "state" / "io.containerd.runtime.v2.task" / "k8s.io" / node.kept[-1]
    # In containerd's own mount namespace (the driver namespace), where the rootfs is mounted.
    p = engines.sh("nsenter", "-t", node.daemon.pid, "-m", f"--wd={REPO}", "/usr/bin/python3", "-m", "compat_hook",
                   "explain", "--bundle", bundle, "--config", node.config, "--json")
    rep = json.loads(p.stdout)
    assert rep["path"] == "nri: compat-hook's NRI plugin added the hook", rep["path"]
    assert rep["request"]["gpu_requested"], rep["request"]


def test_gpu_container_by_cdi_annotation_gets_the_decision(node):
    # The device plugin's older form: a cdi.k8s.io/ annotation (containerd's CRI applies it as CDI too).
    out, recs = node.run("gpu-annotated", "compat", annotations={"cdi.k8s.io/gpu": GPU})
    _enabled(out, recs, "cdi.k8s.io annotation")


def test_nvidia_nri_annotation_is_routed(node):
    # What the NVIDIA toolkit's own NRI plugin injects CDI devices from (on the pod, as it reads it:
    # test_under_nvidias_own_nri_plugin); here on the container, without that plugin: no device,
    # but compat-hook's hook runs (and decides from the spec).
    out, recs = node.run("gpu-nvidia-annotation", "root",
                         annotations={"nvidia.cdi.k8s.io/container.gpu-nvidia-annotation": GPU})
    assert [(r["event"], r.get("via")) for r in recs] == [("hook", "nri")], recs


def test_geforce_host_with_the_toolkits_own_hooks(node):
    """The GPU Operator's CDI mode as generated: the spec's edits carry the toolkit's real v1.20.2
    hooks (create-symlinks, enable-cuda-compat, update-ldcache). On a GeForce host the toolkit alone
    enables the compat driver (it never checks the brand); compat-hook's hook, added by the plugin and
    run after the toolkit's, has the last word: the host's library."""
    with geforce_host_with_toolkit_spec(node):
        # Without compat-hook (opted out: the plugin leaves it): the toolkit's enable-cuda-compat stands.
        out, recs = node.run("geforce-toolkit-alone", "compat", cdi=["nvidia.com/gputk=0"],
                             annotations={"compat-hook/disable": "true"})
        assert out["cuda"] == "12040" and out["libcuda"] == COMPAT_LIB, out
        assert recs == [], recs
        # With compat-hook through NRI: the host's library.
        out, recs = node.run("geforce-routed", "compat", cdi=["nvidia.com/gputk=0"])
        assert out["cuda"] == "12020" and out["libcuda"].startswith(f"{LIB_DIR}/libcuda.so."), (out, recs)
        [rec] = recs
        assert (rec["event"], rec["via"], rec["decision"], rec["reason"], rec["effect"]) == \
            ("hook", "nri", "skip", "device_consumer", "host"), rec


C_DIR = "/usr/local/cuda/compat"
#: The roads to libcuda that do not search (tests/test_host_over_containers.py runs them under runc, crun and
#: the wrapper): ``(image tag, command, env)``; the ``roads`` tag adds a probe built with ``DT_RPATH`` naming the
#: compat dir and a vLLM-style drop-in naming it, ``roads-preload`` an ``/etc/ld.so.preload`` naming its file.
ROADS = {
    "rpath": ("roads", ["/usr/local/bin/probe-rpath"], None),
    "preload": ("compat", ["/usr/local/bin/probe"], {"LD_PRELOAD": f"{C_DIR}/libcuda.so.1"}),
    "ld-so-preload": ("roads-preload", ["/usr/local/bin/probe"], None),
    "absolute": ("compat", ["/usr/local/bin/probe", f"{C_DIR}/libcuda.so.1"], None),
    "shell": ("compat", ["/bin/sh", "-c", f"LD_LIBRARY_PATH={C_DIR}:$LD_LIBRARY_PATH exec /usr/local/bin/probe"], None),
    "numba": ("roads", ["/usr/local/bin/probe", "libcuda.so"], None),
}


def import_tags(node, tar, tags) -> None:
    """Import the layout ``tar`` and wait until the CRI knows each of ``tags``: containerd's CRI plugin learns of an
    imported image from an event, after the import returns."""
    node.daemon.import_images(tar)
    pb = node.client.pb
    deadline = time.monotonic() + 60
    for tag in tags:
        while not node.client.images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=f"{IMAGE}:{tag}")),
                                                 timeout=30).image.id:
            assert time.monotonic() < deadline, f"the CRI does not know {IMAGE}:{tag}"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def road_images(node):
    """The ``roads`` and ``roads-preload`` tags, made from ``compat`` in the module's layout and imported."""
    from tests.support import rootfs

    lay = node.work / "image" / "img"
    for tag in ("roads", "roads-preload"):
        u = node.work / f"u-{tag}"
        engines.sh("umoci", "unpack", "--image", f"{lay}:compat", u)
        r = u / "rootfs"
        if tag == "roads":
            (r / "usr/local/bin/probe-rpath").write_bytes(rootfs.probe_binary(rpath=C_DIR).read_bytes())
            (r / "usr/local/bin/probe-rpath").chmod(0o755)
            (r / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
            (r / "etc/ld.so.conf.d/cuda-compat.conf").write_text("/usr/local/cuda-12.4/compat\n")
        else:
            (r / "etc/ld.so.preload").write_text(f"{C_DIR}/libcuda.so.1\n")
        rootfs.run_ldconfig(r)  # the image's own build-time ldconfig
        engines.sh("umoci", "repack", "--image", f"{lay}:{tag}", u)
        import shutil

        shutil.rmtree(u)
    tar = node.work / "roads.tar"
    engines.sh("tar", "-C", lay, "-cf", tar, ".")
    import_tags(node, tar, ("roads", "roads-preload"))
    return tar


@pytest.mark.parametrize("road", list(ROADS))
def test_every_road_maps_the_host_library_through_nri(node, road_images, road):
    """Issue 42's rows through NRI: on a GeForce host (the compat driver unsupported) the host's library maps by
    every road, also those that never search (RPATH, a preload, an absolute dlopen, a shell prepending the compat
    dir after every hook ran, numba's ``libcuda.so``): the hook the plugin added puts the host's library in the
    compat file's place. Without compat-hook the same road reaches the compat driver."""
    tag, command, envs = ROADS[road]
    with geforce_host_with_toolkit_spec(node):
        name = f"road-{road}"
        st, cid = node.client.run_container(node.pod, node.sandbox, f"{name}-alone", f"{IMAGE}:{tag}", command=command,
                                            envs=envs, cdi_devices=["nvidia.com/gputk=0"],
                                            annotations={"compat-hook/disable": "true"})
        alone = outcome(cri.read_log(node.pods / f"{name}-alone.log"))
        node.client.remove_container(cid)
        assert alone["cuda"] == "12040", (road, alone)  # the road is real: it reaches the compat driver
        node.log.mark()
        st, cid = node.client.run_container(node.pod, node.sandbox, name, f"{IMAGE}:{tag}", command=command, envs=envs,
                                            cdi_devices=["nvidia.com/gputk=0"])
        out = outcome(cri.read_log(node.pods / f"{name}.log"))
        recs = node.log.since(cid)
        node.client.remove_container(cid)
    assert st.exit_code == 0 and out["cuda"] == "12020", (road, out, recs)  # the host's 535 driver
    [rec] = recs
    assert (rec["via"], rec["effect"]) == ("nri", "host"), rec
    assert any(x.startswith(f"/usr/local/cuda-12.4/compat/libcuda.so.{COMPAT} <- ") for x in rec["host_over_compat"]), rec


STUB_C = "int cuInit(unsigned f) { (void)f; return 34; }\nint cuDriverGetVersion(int *v) { (void)v; return 34; }\n"
NV_DIR = "/usr/local/nvidia/lib64"


@pytest.fixture(scope="module")
def shadow_images(node):
    """Issue 42's layouts where another libcuda than the decision's used to map (tests/test_shadow_containers.py runs
    them under runc, crun and the wrapper), as tags made from ``compat`` and imported: ``shadow-stub`` (the CUDA
    toolkit's stub in ``lib64/stubs``), ``shadow-userland`` (the image's own 550 in the system lib dir),
    ``shadow-symlinked`` (the compat dir's files link into ``/opt/nv``)."""
    import shutil
    import subprocess

    from tests.support import rootfs

    lay = node.work / "image" / "img"
    for tag in ("shadow-stub", "shadow-userland", "shadow-symlinked"):
        u = node.work / f"u-{tag}"
        engines.sh("umoci", "unpack", "--image", f"{lay}:compat", u)
        r = u / "rootfs"
        if tag == "shadow-stub":
            d = r / "usr/local/cuda-12.4/lib64/stubs"
            d.mkdir(parents=True)
            (u / "stub.c").write_text(STUB_C)
            subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(d / "libcuda.so.1"),
                            str(u / "stub.c")], check=True, capture_output=True)
            (u / "stub.c").unlink()
        elif tag == "shadow-userland":
            rootfs.install_libcuda(r, node.libs[COMPAT], "usr/lib/x86_64-linux-gnu")
        else:
            c = r / "usr/local/cuda-12.4/compat"
            shutil.rmtree(c)
            rootfs.install_libcuda(r, node.libs[COMPAT], "opt/nv")
            c.mkdir()
            for n in ("libcuda.so.1", f"libcuda.so.{COMPAT}"):
                os.symlink(f"/opt/nv/libcuda.so.{COMPAT}", c / n)
            (r / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
            (r / "etc/ld.so.conf.d/cuda-compat.conf").write_text("/usr/local/cuda-12.4/compat\n")
        rootfs.run_ldconfig(r)
        engines.sh("umoci", "repack", "--image", f"{lay}:{tag}", u)
        shutil.rmtree(u)
    tar = node.work / "shadow.tar"
    engines.sh("tar", "-C", lay, "-cf", tar, ".")
    import_tags(node, tar, ("shadow-stub", "shadow-userland", "shadow-symlinked"))
    return tar


@contextlib.contextmanager
def gke_spec(node):
    """A CDI spec ``nvidia.com/gke`` that mounts the host's library where GKE's driver installer puts it
    (``/usr/local/nvidia/lib64``), for a data-center host, while in the block."""
    lib = str(node.libs[OLD])
    opts = ["ro", "nosuid", "nodev", "bind"]
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gke",
            "devices": [{"name": "0", "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]}}],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                               "mounts": [{"hostPath": lib, "containerPath": f"{NV_DIR}/libcuda.so.{OLD}", "options": opts},
                                          {"hostPath": lib, "containerPath": f"{NV_DIR}/libcuda.so.1", "options": opts}]}}
    path = node.daemon.work / "cdi" / "nvidia-gke.json"
    path.write_text(json.dumps(spec))
    try:
        yield
    finally:
        path.unlink()


#: layout -> (image tag, CDI device, env, what must map: "compat" (12040) or "host" (12020), what maps alone)
SHADOWS = {
    "stub": ("shadow-stub", GPU, {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64/stubs"}, "compat", "34"),
    "userland": ("shadow-userland", "nvidia.com/gputk=0", None, "host", "12040"),
    "symlinked": ("shadow-symlinked", "nvidia.com/gputk=0", None, "host", "12040"),
    "gke": ("compat", "nvidia.com/gke=0", {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"},
            "compat", "12020"),
}


@pytest.mark.parametrize("layout", list(SHADOWS))
def test_nothing_the_image_carries_shadows_the_decision_through_nri(node, shadow_images, layout):
    """Issue 42's shadow rows through NRI on containerd 2.1.9: a stub on LD_LIBRARY_PATH and GKE's driver dir
    named before the compat dir (a 535 data-center host: compat must map), the image's own userland 550 in the
    system lib dir and a compat dir whose files link elsewhere (a GeForce: the host's must map). Without
    compat-hook (opted out) the same container maps the other libcuda."""
    tag, device, envs, want, alone_cuda = SHADOWS[layout]
    ctx = geforce_host_with_toolkit_spec(node) if device.startswith("nvidia.com/gputk") else (
        gke_spec(node) if layout == "gke" else contextlib.nullcontext())
    with ctx:
        name = f"shadow-{layout}"
        st, cid = node.client.run_container(node.pod, node.sandbox, f"{name}-alone", f"{IMAGE}:{tag}",
                                            command=["/usr/local/bin/probe"], envs=envs, cdi_devices=[device],
                                            annotations={"compat-hook/disable": "true"})
        text = cri.read_log(node.pods / f"{name}-alone.log")
        node.client.remove_container(cid)
        assert (outcome(text)["cuda"] or ("34" if "returned 34" in text else None)) == alone_cuda, (layout, text)
        node.log.mark()
        st, cid = node.client.run_container(node.pod, node.sandbox, name, f"{IMAGE}:{tag}",
                                            command=["/usr/local/bin/probe"], envs=envs, cdi_devices=[device])
        out = outcome(cri.read_log(node.pods / f"{name}.log"))
        recs = node.log.since(cid)
        node.client.remove_container(cid)
    assert st.exit_code == 0 and out["cuda"] == ("12040" if want == "compat" else "12020"), (layout, out, recs)
    [rec] = recs
    assert (rec["via"], rec["effect"]) == ("nri", want), rec
    if want == "compat":  # the chosen compat libcuda over what LD_LIBRARY_PATH reaches first
        assert rec.get("compat_over_shadow"), rec
    else:  # the host's libcuda over the image's other driver file
        covered = "/usr/lib/x86_64-linux-gnu" if layout == "userland" else "/opt/nv"
        assert any(x.startswith(f"{covered}/libcuda.so.{COMPAT} <- ") for x in rec["host_over_compat"]), rec


def test_under_nvidias_own_nri_plugin(node):
    """The GPU Operator's NRI mode: NVIDIA's own plugin (the toolkit container's ``nvidia-ctk-installer
    --enable-nri-plugin``, index 10, an external plugin on containerd's NRI socket) adds the CDI device
    that the pod annotation ``nvidia.cdi.k8s.io/container.<name>`` names; the CRI request names none.
    compat-hook's plugin (index 90) routes the same container, and its decision is what the container
    loads: the compat driver on a data-center host; on a GeForce host, the host's library, although
    the device NVIDIA's plugin added carries the toolkit's enable-cuda-compat and update-ldcache and
    containerd puts them after compat-hook's hook (CDI devices from an NRI adjustment are resolved
    after its hooks are appended)."""
    import shutil
    import subprocess

    from tests.support import toolkit as tks

    nv = node.work / "nvidia-nri"
    for d in ("artifacts", "xdg", "host"):
        (nv / d).mkdir(parents=True)
    shutil.copyfile(node.daemon.main, nv / "config.toml")
    before = (node.daemon.main.read_bytes(), (nv / "config.toml").read_bytes())
    # With --enable-nri-plugin the installer leaves the engine's config alone (a no-op configurer;
    # --no-runtime-config says so too, and every path it could use is private). It still installs
    # the toolkit first: from an empty source root into a private dir, which fails without the
    # toolkit's C parts (libnvidia-container) unless --ignore-errors, NVIDIA's flag for testing.
    argv = [str(tks.installer()), "--debug", "--enable-nri-plugin", "--nri-plugin-index", "10",
            "--nri-socket", str(node.daemon.work / "nri.sock"), "--nri-namespace", "gpu-operator",
            "--runtime", "containerd", "--no-runtime-config", "--config", str(nv / "config.toml"),
            "--drop-in-config", str(nv / "conf.d" / "99-nvidia.toml"), "--restart-mode", "none",
            "--host-root", str(nv / "host"), "--pid-file", str(nv / "run" / "toolkit.pid"),
            "--toolkit-install-dir", str(nv / "root"), "--toolkit-source-root", str(nv / "artifacts"),
            "--ignore-errors"]
    names = {"dc": "nvop-dc", "plain": "nvop-plain", "alone": "nvop-geforce-alone", "geforce": "nvop-geforce"}
    sandbox = node.client.sandbox_config("gpu-operator-pod", str(node.pods))
    for k in ("dc", "plain"):
        sandbox.annotations["nvidia.cdi.k8s.io/container." + names[k]] = GPU
    for k in ("alone", "geforce"):
        sandbox.annotations["nvidia.cdi.k8s.io/container." + names[k]] = "nvidia.com/gputk=0"
    err = nv / "installer.log"
    with open(err, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(engines.ENV, XDG_CONFIG_HOME=str(nv / "xdg")), start_new_session=True)
    pod = None
    try:
        deadline = time.monotonic() + 20
        while b"Started plugin 10-nvidia-ctk-installer" not in err.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        pod = (node.client.run_pod(sandbox, ""), sandbox)

        # A data-center host: the plain spec (no toolkit hooks): only compat-hook enables the compat driver.
        out, recs = node.run(names["dc"], "compat", pod=pod)
        _enabled(out, recs, "a device from NVIDIA's NRI plugin, data-center host")
        assert f"{names['dc']}: injecting CDI devices [{GPU}]" in err.read_text(), err.read_text()[-3000:]
        # An image that names no GPU itself (no NVIDIA_VISIBLE_DEVICES): the pod annotation alone
        # routes it (the device NVIDIA's plugin adds is resolved after both plugins answered).
        out, recs = node.run(names["plain"], "root", pod=pod)
        assert out["cuda"] == "12020", out  # the device's host library: NVIDIA's plugin added it
        assert [(r["event"], r.get("via")) for r in recs] == [("hook", "nri")], recs

        with geforce_host_with_toolkit_spec(node):
            # compat-hook opted out: the toolkit's hooks, from the device NVIDIA's plugin added, enable
            # the compat driver on a GeForce (without that device the container has no libcuda at all).
            out, recs = node.run(names["alone"], "compat", annotations={"compat-hook/disable": "true"}, pod=pod)
            assert out["cuda"] == "12040" and out["libcuda"] == COMPAT_LIB, out
            assert recs == [], recs
            # Both plugins: compat-hook's decision loads, the host's library.
            out, recs = node.run(names["geforce"], "compat", keep=True, pod=pod)
            cid = node.kept.pop()  # stopped here, not by the node (its own pod's containers only)
            spec = json.loads(pathlib.Path(f"/proc/{node.daemon.pid}/root{node.daemon.work}/state/"
                                           f"io.containerd.runtime.v2.task/k8s.io/{cid}/config.json").read_text())
            node.client.runtime.StopContainer(node.client.pb.StopContainerRequest(container_id=cid, timeout=0),
                                              timeout=60)
            node.client.remove_container(cid)
        assert out["cuda"] == "12020" and out["libcuda"].startswith(f"{LIB_DIR}/libcuda.so."), (out, recs)
        [rec] = recs
        assert (rec["event"], rec["via"], rec["decision"], rec["reason"], rec["effect"]) == \
            ("hook", "nri", "skip", "device_consumer", "host"), rec
        # The order containerd gave the hooks: compat-hook's first, the toolkit's after it.
        order = [h["args"][1] if h["path"].endswith("nvidia-cdi-hook") else
                 "compat-hook" if h["args"][-2:] == ["--via", "nri"] else h["path"]
                 for h in spec["hooks"]["createContainer"]]
        assert order == ["compat-hook", "create-symlinks", "enable-cuda-compat", "update-ldcache"], order
    finally:
        if pod is not None:
            node.client.remove_pod(pod[0])
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=10)  # the toolkit container's own stop: SIGTERM
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
    assert code == 0 and b"Completed nvidia-ctk-installer" in err.read_bytes(), err.read_text()[-3000:]
    # Nothing left: its pid file gone, containerd's config and the copy it was given untouched.
    assert not (nv / "run" / "toolkit.pid").exists() and not (nv / "conf.d").exists()
    assert (node.daemon.main.read_bytes(), (nv / "config.toml").read_bytes()) == before


def test_non_gpu_container_is_not_routed(node):
    out, recs = node.run("plain", "root")
    assert out["cuda"] is None and recs == [], (out, recs)  # no driver at all, and no hook ran


def test_cuda_image_without_a_device_is_not_routed(node):
    # The CUDA image says NVIDIA_VISIBLE_DEVICES=all, but nothing gave it a device: the plugin
    # routes by env as NVIDIA's runtime would; the hook then decides (and finds the host's library missing).
    out, recs = node.run("env-only", "compat")
    assert [r["event"] for r in recs] == ["hook"], recs


def test_opt_out_annotation_is_honoured(node):
    out, recs = node.run("opted-out", "compat", cdi=[GPU], annotations={"compat-hook/disable": "true"})
    _untouched(out, recs, "compat-hook/disable")


def test_a_pods_switches_reach_the_hook_through_the_plugin(node):
    """containerd copies a pod's annotations into a container's only where its runtime's
    ``pod_annotations`` lists them (here none); the plugin sees them on the sandbox: the pod's
    ``compat-hook/disable`` keeps it away, and its ``compat-hook/dry-run`` reaches the hook (the
    agent predicts both: compat_hook/cluster/workload/runs.py, tests/test_runs.py)."""
    pods = []
    try:
        for name, anns in (("pod-opted-out", {"compat-hook/disable": "true"}),
                           ("pod-dry-run", {"compat-hook/dry-run": "true"})):
            sandbox = node.client.sandbox_config(name, str(node.pods))
            for k, v in anns.items():
                sandbox.annotations[k] = v
            pods.append((node.client.run_pod(sandbox, ""), sandbox))
        out, recs = node.run("opted-out-by-its-pod", "compat", cdi=[GPU], pod=pods[0])
        _untouched(out, recs, "the pod's compat-hook/disable")
        out, recs = node.run("dry-run-by-its-pod", "compat", cdi=[GPU], pod=pods[1])
        # the hook ran, decided to enable, and changed nothing: the host's driver loads
        assert [(r["event"], r["decision"], r.get("via"), r["dry_run"]) for r in recs] == \
            [("hook", "enable", "nri", True)], recs
        assert out["cuda"] == "12020" and out["libcuda"].startswith(f"{LIB_DIR}/libcuda.so."), out
    finally:
        for pod_id, _ in pods:
            node.client.remove_pod(pod_id)


def test_killed_plugin_fails_open_and_a_restart_brings_it_back(node):
    [pid] = node.wait_plugin(True)
    os.kill(pid, signal.SIGKILL)
    assert not node.wait_plugin(False), "the plugin is still there"
    # Fail-open (containerd 2.1 cannot require a plugin): the GPU container is created, without
    # compat-hook, and promptly.
    t = time.monotonic()
    out, recs = node.run("gpu-unrouted", "compat", cdi=[GPU], keep=True)
    assert time.monotonic() - t < 10
    _untouched(out, recs, "plugin killed")
    unrouted = node.kept[-1]
    # containerd's restart starts the pre-registered plugin again; at its connection it finds the
    # GPU container created without it and says so in compat-hook's log (what `report` counts).
    node.log.mark()
    node.daemon.restart()
    assert node.wait_plugin(True), node.daemon.log.read_text()[-3000:]
    node.reconnect("gen2")
    deadline = time.monotonic() + 10
    while not node.log.since() and time.monotonic() < deadline:
        time.sleep(0.1)
    trace = node.log.since()
    assert [(r["event"], r["decision"], r["reason"], r["component"], r["container_id"], r["container_name"])
            for r in trace] == [("fail_open", "error", "nri_plugin_missing", "nri", unrouted, "gpu-unrouted")], trace
    assert trace[0]["pod"] == "nri" and trace[0]["namespace"] == "compat-hook-tests", trace
    # The next container is routed again.
    out, recs = node.run("gpu-after-restart", "compat", cdi=[GPU])
    _enabled(out, recs, "after containerd's restart")
    # Another restart: the same container is not reported twice; routed containers never are.
    node.log.mark()
    node.daemon.restart()
    assert node.wait_plugin(True)
    node.reconnect("gen3")
    out, recs = node.run("gpu-after-second-restart", "compat", cdi=[GPU])
    _enabled(out, recs, "after a second restart")
    assert [r for r in node.log.since() if r.get("component") == "nri"] == []


def test_report_counts_the_fail_open(node):
    rep = json.loads(compat_hook("report", "--config", node.config, "--json"))
    failures = [f for p in rep["periods"] for f in p["failures"]["last"]]
    assert [(f["event"], f["reason"], f["container_id"], f["pod"]) for f in failures] == \
        [("fail_open", "nri_plugin_missing", node.kept[1], "nri")], rep
    # The path is named: the hooks the plugin added, and its own line.
    events = {}
    for p in rep["periods"]:
        for k, v in p["events"].items():
            events[k] = events.get(k, 0) + v
    assert events["fail_open/nri"] == 1 and events["hook/nri"] >= 3, events
    text = compat_hook("report", "--config", node.config)
    assert "hook/nri" in text and "nri_plugin_missing" in text, text


def test_uninstall_removes_the_plugin(node):
    node.saved_conf = node.work / "external.conf"
    node.saved_conf.write_text(node.conf_file.read_text())  # for the external plugin, below
    out = compat_hook("uninstall", "containerd", "--via", "nri", "--engine-config", node.daemon.main,
                      "--hook-config", node.config, "--state-dir", node.state, prefix=node.path_prefix())
    assert f"removed {node.plugin_file}" in out and f"removed {node.conf_file}" in out, out
    assert not (node.daemon.work / "nri").exists(), list((node.daemon.work / "nri").rglob("*"))
    node.daemon.restart()
    assert not node.wait_plugin(True, timeout=3)
    node.reconnect("gen4")
    out, recs = node.run("gpu-uninstalled", "compat", cdi=[GPU])
    _untouched(out, recs, "uninstalled")


def test_external_plugin_reconnects_after_a_restart(node):
    """The same binary as an external plugin (a DaemonSet's form): it connects to the NRI socket and,
    when containerd restarts, connects again by itself."""
    import subprocess

    err = node.work / "external.err"
    with open(err, "wb") as f:
        proc = subprocess.Popen([str(node.plugin_src), "-socket", str(node.daemon.work / "nri.sock"),
                                 "-config", str(node.saved_conf)], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=engines.ENV, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while b"connected to containerd" not in err.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        out, recs = node.run("gpu-external", "compat", cdi=[GPU])
        _enabled(out, recs, "external plugin")
        node.daemon.restart()
        node.reconnect("gen5")
        deadline = time.monotonic() + 30
        while err.read_bytes().count(b"connected to containerd") < 2:
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        out, recs = node.run("gpu-external-again", "compat", cdi=[GPU])
        _enabled(out, recs, "external plugin after containerd's restart")
        out, recs = node.run("plain-external", "root")
        assert recs == [], recs
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)  # prompt exit on SIGTERM
    assert code == 0, err.read_text()


def test_zz_stop_leaves_nothing_behind(node):
    left = node.close()
    node.close = lambda: left
    assert not any(left.values()), left


# --------------------------------------------------------------------------- the install command alone


def _cli(*argv, env_path=engines.ENV["PATH"]):
    import subprocess

    argv = ["/usr/bin/env", f"PATH={env_path}", "/usr/bin/python3", "-m", "compat_hook", *map(str, argv)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)


def _v3_config(tmp_path, nri: str) -> pathlib.Path:
    main = tmp_path / "config.toml"
    main.write_text(f"version = 3\n\n[plugins]\n  [plugins.'io.containerd.nri.v1.nri']\n{nri}")
    return main


def test_install_refuses_nri_off_and_writes_nothing(tmp_path):
    main = _v3_config(tmp_path, f"    disable = true\n    plugin_path = '{tmp_path}/p'\n")
    p = _cli("install", "containerd", "--via", "nri", "--engine-config", main, "--nri-plugin", kubebuild.nri_plugin(),
             "--hook-config", default_config(tmp_path / "c.yaml", tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p
    assert p.stderr.count("\n") == 1 and "NRI is off" in p.stderr, p.stderr
    assert not (tmp_path / "p").exists()


def test_install_dry_run_then_foreign_files_refused_and_uninstall_idempotent(tmp_path):
    plugins, confs = tmp_path / "nri" / "plugins", tmp_path / "nri" / "conf.d"
    main = _v3_config(tmp_path, f"    plugin_path = '{plugins}'\n    plugin_config_path = '{confs}'\n")
    cfg = default_config(tmp_path / "c.yaml", tmp_path)
    args = ["containerd", "--via", "nri", "--engine-config", main, "--hook-config", cfg,
            "--nri-plugin", kubebuild.nri_plugin()]
    p = _cli("install", *args, "--dry-run")
    assert p.returncode == 0 and f"would write {plugins}/90-compat-hook" in p.stdout and "--via" in p.stdout, p
    assert not (tmp_path / "nri").exists()
    p = _cli("install", *args)
    assert p.returncode == 0 and (plugins / "90-compat-hook").is_file(), p
    # Uninstall removes both files and the dirs install created; a second uninstall changes nothing.
    p = _cli("uninstall", *args[:-2])
    assert p.returncode == 0 and not (tmp_path / "nri").exists(), (p, list(tmp_path.rglob("*")))
    p = _cli("uninstall", *args[:-2])
    assert p.returncode == 0 and "nothing changed" in p.stdout, p
    # Somebody else's plugin at our name: refused, untouched.
    plugins.mkdir(parents=True)
    (plugins / "90-compat-hook").write_text("#!/bin/sh\nexit 0\n")
    p = _cli("install", *args)
    assert p.returncode == 1 and "is not compat-hook's NRI plugin" in p.stderr, p
    assert (plugins / "90-compat-hook").read_text() == "#!/bin/sh\nexit 0\n"
    # Not our binary as --nri-plugin: refused.
    p = _cli("install", *args[:-1], plugins / "90-compat-hook")
    assert p.returncode == 1 and "is not compat-hook's NRI plugin" in p.stderr, p


def test_via_nri_is_containerds_only(tmp_path):
    p = _cli("install", "docker", "--via", "nri", "--dry-run", "--engine-config", tmp_path / "daemon.json")
    assert p.returncode == 2 and p.stderr.strip() == \
        "compat-hook: --via nri is containerd's (2.x); docker is registered without it", p


def _detect(main, containerd: str | None = "/usr/bin/containerd"):
    """The installer's own call (packaging/kubernetes/compat-hook-k8s.sh: nri_detect), with ``containerd``
    as the node's /usr/bin/containerd (bind-mounted in a private mount namespace: compat-hook looks for it
    on a fixed PATH only); None: no containerd at all."""
    import subprocess

    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.install.nri import detect_main; "
            "sys.exit(detect_main())")
    # /dev/null has no x bit: no containerd is found
    bind = "/dev/null" if containerd is None else containerd
    script = 'mount --bind "$1" /usr/bin/containerd && shift && exec /usr/bin/env -i PATH=/usr/bin:/bin "$@"'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", bind,
                           "/usr/bin/python3", "-I", "-c", code, str(REPO), str(main)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)


def test_chart_detection_on_containerd_2_and_1_6(tmp_path):
    """What the chart's installer (registration.path=auto) asks the node: containerd 2.1.9's NRI is on
    with its defaults and off when disabled; Debian's containerd 1.6 has none, even when its file says
    disable = false (1.6 knows no NRI plugin)."""
    import subprocess

    two = str(engines.containerd2() / "containerd")
    p = _detect(_v3_config(tmp_path, ""), two)
    assert (p.returncode, p.stdout) == (0, "nri /opt/nri/plugins/90-compat-hook\n"), p
    p = _detect(_v3_config(tmp_path, "    plugin_path = '/x/plugins'\n"), two)
    assert (p.returncode, p.stdout) == (0, "nri /x/plugins/90-compat-hook\n"), p
    p = _detect(_v3_config(tmp_path, "    disable = true\n"), two)
    assert p.returncode == 1 and p.stdout.count("\n") == 1 and "NRI is off" in p.stdout, p
    # containerd 1.6's own default config (version 2), written by `containerd config default`.
    assert subprocess.run(["containerd", "--version"], capture_output=True, text=True).stdout.split()[2] < "1.7"
    main = tmp_path / "config-1.6.toml"
    main.write_text(subprocess.run(["containerd", "config", "default"], capture_output=True, text=True,
                                   check=True).stdout)
    p = _detect(main)
    assert p.returncode == 1 and "has no NRI" in p.stdout, p
    main.write_text(main.read_text() + "\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n")
    p = _detect(main)
    assert p.returncode == 1 and "has no NRI" in p.stdout, p
    # no containerd on the node, a file that is not TOML: one line each, no traceback
    p = _detect(main, None)
    assert p.returncode == 1 and p.stdout == "no containerd binary on the node's PATH\n", p
    (tmp_path / "bad.toml").write_text("version = [\n")
    p = _detect(tmp_path / "bad.toml", two)
    assert p.returncode == 1 and "not valid TOML" in p.stdout and p.stdout.count("\n") == 1, p
    assert "Traceback" not in p.stderr, p
    # no file at all: containerd 2.x's defaults, NRI on
    p = _detect(tmp_path / "missing.toml", two)
    assert (p.returncode, p.stdout) == (0, "nri /opt/nri/plugins/90-compat-hook\n"), p


def test_plugin_unit_tests():
    """packaging/nri's own Go tests (routing rules, configuration, the start time it reads)."""
    # kubebuild._go: the shared build cache's compile slot (the background builder trims that cache at its
    # end); a failing `go test` raises with its output
    out = kubebuild._go("test", "-count=1", "./...", cwd=kubebuild.NRI_PLUGIN, timeout=900)
    assert out.startswith("ok"), out
