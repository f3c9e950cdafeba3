"""compat-hook beside the NVIDIA Container Toolkit's own binaries, in real runc and crun containers.

The toolkit is the real thing: ``nvidia-cdi-hook``, ``nvidia-container-runtime``
and ``nvidia-ctk`` v1.20.2 built from the Go module proxy
(:mod:`tests.support.toolkit`). They run as they run in production:

* **the CDI hook trio** in config.json, in a generated CDI spec's order
  (``create-symlinks``, ``enable-cuda-compat --host-driver-version=V``,
  ``update-ldcache``; env ``NVIDIA_CTK_DEBUG=false``) plus the host libcuda bind
  mount a CDI spec carries, with compat-hook's createContainer hook placed
  *before* the trio (the toolkit's ``update-ldcache`` then runs after
  compat-hook) or *after* it;
* **nvidia-container-runtime in ``cdi`` mode** with a CDI spec written here
  (its config.toml through ``NVIDIA_CTK_CONFIG_FILE_PATH``; the container asks
  for ``NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all``), chained both ways with
  compat-hook's runtime wrapper: wrapper -> toolkit -> runc|crun, and toolkit
  (``runtimes = [wrapper]``) -> wrapper -> runc|crun.

No GPU is needed: the "host driver" is a real Debian libcuda build
(:mod:`tests.support.debs`) bind-mounted where the toolkit mounts it, and
compat-hook's host facts come from a fake host tree (``host_root``) whose
``/proc/driver/nvidia/version`` names the same version the toolkit is told and
whose ``/proc/driver/nvidia/gpus/*/information`` names the GPU. The image's
compat driver is Debian's 550.163.01, whose note lists branches 470/525/535
and datacenter device classes (docs/background.md "The NVIDIA toolkit").

What is asserted is what the container's own probe loaded
(``dlopen("libcuda.so.1")``), compat-hook's log line and the image's files.

libnvidia-container (the toolkit's legacy path) is C and in no registry
these tests can reach; the legacy test uses the harness's *stand-in* for its
documented effects (tests/support/runtimes.py ``nvidia_standin_hook``: bind
mount + ldconfig), and says so.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from compat_hook.core import registration
from compat_hook.install.wrapper import render_wrapper
from tests.support.trees import write_fake_host
from tests.support import debs, hookenv, rootfs, runtimes as rt
from tests.support.versions import COMPAT_550, HOST_535, HOST_555
from tests.support.toolkit import toolkit  # noqa: F401  (the session fixture)
from tests.support.toolkit import (CDI_KIND, CDI_MODE_CONFIG, cdi_hooks, cdi_mounts, create_start, noted_compat_lib,
                                   oci_hook, oci_mount, write_cdi_spec)

pytestmark = pytest.mark.containers
RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "crun"])
ORDERS = pytest.mark.parametrize("order", ["before", "after"])

CUDA = {HOST_535: 12020, COMPAT_550: 12040, HOST_555: 12050}
SYS_DIR = "/usr/lib/x86_64-linux-gnu"
COMPAT_DIR = "/usr/local/cuda-12.4/compat"
COMPAT_LIB = f"{COMPAT_DIR}/libcuda.so.{COMPAT_550}"
DATACENTER = "NVIDIA H100 80GB HBM3"
GEFORCE = "NVIDIA GeForce RTX 4090"
GPU_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all")

_started: list[str] = []


def host_lib(version: str) -> str:
    return f"{SYS_DIR}/libcuda.so.{version}"


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict:
    """The Debian builds by version; ``"compat"``: the 550 one with NVIDIA's note added."""
    out = {v: debs.libcuda(v) for v in debs.VERSIONS}
    out["compat"] = noted_compat_lib(out[COMPAT_550], tmp_path_factory.mktemp("noted"))
    return out


# --------------------------------------------------------------------------- one node


class Node:
    """A fake host (version file + GPU information), compat-hook's config and log, one container rootfs.

    ``host=None``: a host whose driver compat-hook cannot find (no ``/proc/driver/nvidia/version``);
    the toolkit is still told ``toolkit_host`` (its generated spec knows it).
    """

    def __init__(self, tmp: pathlib.Path, libs: dict, tk, *, host: str | None = HOST_535,
                 gpu: str = DATACENTER, toolkit_host: str | None = None, extra_files: dict | None = None,
                 **config):
        self.tmp, self.libs, self.tk = tmp, libs, tk
        self.toolkit_host = toolkit_host or host
        line = (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {host}  Release Build  "
                f"(dvs-builder@U16)  Mon Sep 1 2025") if host else None
        self.host_root = write_fake_host(tmp / "host", version_line=line, gpus=[gpu]).resolve()
        self.log = tmp / "compat-hook.log"
        self.state = tmp / "state"
        self.config_extra = config
        self.config = self.write_config()
        self.bundle = tmp / "bundle"
        self.rootfs = rootfs.build_rootfs(self.bundle / "rootfs", compat_lib=libs["compat"],
                                          extra_files=extra_files)

    def write_config(self, **more) -> pathlib.Path:
        return hookenv.write_config(self.tmp / "config.yaml", host_root=self.host_root, log_file=self.log,
                                    nvml="off", **{**self.config_extra, **more})

    def upgrade(self, version: str) -> None:
        """The host driver went to ``version``: compat-hook's facts and what the toolkit is told."""
        hookenv.set_host_version(self.host_root, version)
        self.toolkit_host = version

    def ours(self) -> dict:
        return registration.hook_entry(stage="createContainer", config=str(self.config),
                                       state_dir=str(self.state))

    def run_trio(self, runtime: str, order: str, *, env=GPU_ENV) -> rt.Result:
        """Start the container with the CDI hook trio and compat-hook's hook ``order`` it
        (``"none"``: the toolkit alone)."""
        v = self.toolkit_host
        trio = [oci_hook(h) for h in cdi_hooks(self.tk, v)]
        hooks = {"before": [self.ours(), *trio], "after": [*trio, self.ours()], "none": trio}[order]
        bundle = rt.make_bundle(self.bundle, self.rootfs, env=list(env), hooks={"createContainer": hooks},
                                mounts_extra=[oci_mount(m) for m in cdi_mounts(self.libs[v], v)])
        res = rt.run_container(bundle, runtime)
        _started.append(res.container_id)
        return res

    def records(self, res: rt.Result, event: str = "hook") -> list:
        return [r for r in hookenv.read_log(self.log)
                if r.get("event") == event and r.get("container_id") == res.container_id]

    def record(self, res: rt.Result) -> dict:
        recs = self.records(res)
        assert len(recs) == 1, hookenv.read_log(self.log)
        return recs[0]

    def dropins(self) -> list:
        return sorted(os.listdir(self.rootfs / "etc/ld.so.conf.d"))

    def toolkit_dropins(self) -> list:
        return [n for n in self.dropins() if n.startswith("00-compat-")]


def assert_loaded(res: rt.Result, lib: str, cuda: int) -> None:
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": str(cuda), "libcuda": lib}, str(res)


# --------------------------------------------------------------------------- the CDI hook trio


@pytest.mark.parametrize("case,loads", [
    ("geforce", "compat"), ("restart", "compat"), ("00-cuda-compat.conf", "compat"),
    ("cuda-compat.conf", "compat"), ("zzz-cuda-compat.conf", "host"),
])
def test_without_compat_hook_the_toolkit_loads(tmp_path, case, loads, libs, toolkit):
    """The baseline the tests below change: the toolkit's trio alone (docs/background.md "The NVIDIA toolkit")."""
    kw = {"host": HOST_555, "gpu": DATACENTER}
    if case == "geforce":
        kw = {"host": HOST_535, "gpu": GEFORCE}
    elif case == "restart":
        kw = {"host": HOST_535, "gpu": DATACENTER}
    else:
        kw["extra_files"] = {f"etc/ld.so.conf.d/{case}": "/usr/local/cuda/compat\n"}
    node = Node(tmp_path, libs, toolkit, **kw)
    if case == "restart":
        assert_loaded(node.run_trio("runc", "none"), COMPAT_LIB, CUDA[COMPAT_550])
        node.upgrade(HOST_555)
    res = node.run_trio("runc", "none")
    if loads == "compat":
        assert_loaded(res, COMPAT_LIB, CUDA[COMPAT_550])  # 804 (GeForce) / 803 (newer host) on real hardware
    else:
        assert_loaded(res, host_lib(node.toolkit_host), CUDA[node.toolkit_host])
    assert hookenv.read_log(node.log) == []


@RUNTIMES
@ORDERS
def test_datacenter_host535_loads_compat(tmp_path, runtime, order, libs, toolkit):
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=DATACENTER)
    res = node.run_trio(runtime, order)
    assert_loaded(res, COMPAT_LIB, CUDA[COMPAT_550])
    rec = node.record(res)
    assert (rec["decision"], rec["effect"]) == ("enable", "compat"), rec
    # the toolkit decided "use" too: its uuid drop-in names the resolved compat dir
    [tk_dropin] = node.toolkit_dropins()
    assert (node.rootfs / "etc/ld.so.conf.d" / tk_dropin).read_text() == COMPAT_DIR + "\n"


@RUNTIMES
@ORDERS
def test_geforce_host535_loads_host_lib(tmp_path, runtime, order, libs, toolkit):
    """The toolkit ignores the note's device list and enables; compat-hook's skip must win (else 804)."""
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=GEFORCE)
    res = node.run_trio(runtime, order)
    assert_loaded(res, host_lib(HOST_535), CUDA[HOST_535])
    rec = node.record(res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "device_unsupported", "host"), rec
    assert len(node.toolkit_dropins()) == 1  # the toolkit did enable: compat-hook overrode it


@RUNTIMES
@ORDERS
def test_restart_after_host_upgrade_loads_host_lib(tmp_path, runtime, order, libs, toolkit):
    """Same rootfs, host 535 -> 555: the toolkit's drop-in from the first start is still there."""
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=DATACENTER)
    assert_loaded(node.run_trio(runtime, order), COMPAT_LIB, CUDA[COMPAT_550])
    stale = node.toolkit_dropins()
    assert len(stale) == 1
    node.upgrade(HOST_555)
    res = node.run_trio(runtime, order)
    assert_loaded(res, host_lib(HOST_555), CUDA[HOST_555])
    rec = node.record(res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "compat_not_newer", "host"), rec
    # 555 is not in the note's branch list: the toolkit wrote nothing new this time
    assert set(node.toolkit_dropins()) <= set(stale)


@RUNTIMES
@ORDERS
@pytest.mark.parametrize("name,target", [
    ("00-cuda-compat.conf", "/usr/local/cuda/compat"),       # NGC images
    ("cuda-compat.conf", "/usr/local/cuda-12.4/compat"),     # vLLM before PR #34226
    ("zzz-cuda-compat.conf", "/usr/local/cuda/compat"),      # vLLM after it
])
def test_image_baked_dropin_on_newer_host_loads_host_lib(tmp_path, runtime, order, name, target, libs, toolkit):
    rel = f"etc/ld.so.conf.d/{name}"
    node = Node(tmp_path, libs, toolkit, host=HOST_555, gpu=DATACENTER, extra_files={rel: target + "\n"})
    res = node.run_trio(runtime, order)
    assert_loaded(res, host_lib(HOST_555), CUDA[HOST_555])
    rec = node.record(res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "compat_not_newer", "host"), rec
    assert (node.rootfs / rel).read_text() == target + "\n"  # the image's own file is never edited
    assert node.toolkit_dropins() == []                      # 555 is not in the note: the toolkit stays out


@RUNTIMES
@ORDERS
def test_host_driver_unknown_leaves_the_toolkit_alone(tmp_path, runtime, order, libs, toolkit):
    """compat-hook cannot decide: the toolkit's "use" stands, and the log line says compat-hook left it."""
    node = Node(tmp_path, libs, toolkit, host=None, toolkit_host=HOST_535, gpu=GEFORCE)
    res = node.run_trio(runtime, order)
    assert_loaded(res, COMPAT_LIB, CUDA[COMPAT_550])
    rec = node.record(res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "host_driver_unknown", "leave"), rec
    if order == "after":  # the toolkit's drop-in is there to see: the line names what was left alone
        assert "host_driver_unknown" in rec["left_alone"] and rec["compat_dropins"] == [
            f"{node.toolkit_dropins()[0]} (nvidia-toolkit)"], rec
    assert rec["actions"] == [], rec
    assert len(node.toolkit_dropins()) == 1


#: Where compat-hook would override the toolkit (GeForce: 804 on real hardware) if it decided.
OPT_OUT_ENV = (*GPU_ENV, "COMPAT_HOOK_DISABLE=1")
#: The toolkit's trio is in the spec but compat-hook sees no GPU request: a generated CDI spec sets
#: NVIDIA_VISIBLE_DEVICES=void (and no NVIDIA device node is visible here).
NO_GPU_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=void")


@RUNTIMES
@ORDERS
@pytest.mark.parametrize("case,env,reason", [("opted out", OPT_OUT_ENV, "opt_out"),
                                              ("no GPU", NO_GPU_ENV, "no_gpu_request")])
def test_opted_out_or_no_gpu_leaves_the_toolkit_alone(tmp_path, runtime, order, case, env, reason, libs, toolkit):
    """A GeForce host, where compat-hook's own decision would be the host library: the container opted
    out, or requests no GPU compat-hook can see, so compat-hook leaves it and the toolkit's "use" stands
    (the compat driver loads; on real GeForce hardware that is the toolkit's 804, not compat-hook's)."""
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=GEFORCE)
    res = node.run_trio(runtime, order, env=env)
    assert_loaded(res, COMPAT_LIB, CUDA[COMPAT_550])
    rec = node.record(res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", reason, "leave"), rec
    assert rec["actions"] == [], rec
    if reason == "opt_out":  # the line says what is left alone (no facts are read for a no-GPU start)
        assert rec["left_alone"].startswith("opt_out: compat-hook leaves"), rec
    assert len(node.toolkit_dropins()) == 1
    assert not (node.rootfs / "etc/ld.so.conf.d/00-00-compat-hook.conf").exists()


@RUNTIMES
def test_toolkit_update_ldcache_again_after_compat_hook(tmp_path, runtime, libs, toolkit):
    """create-symlinks, enable-cuda-compat, compat-hook, update-ldcache, then update-ldcache once more."""
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=GEFORCE)
    create, enable, update = (oci_hook(h) for h in cdi_hooks(toolkit, HOST_535))
    bundle = rt.make_bundle(node.bundle, node.rootfs, env=list(GPU_ENV),
                            hooks={"createContainer": [create, enable, node.ours(), update, update]},
                            mounts_extra=[oci_mount(m) for m in cdi_mounts(libs[HOST_535], HOST_535)])
    res = rt.run_container(bundle, runtime)
    _started.append(res.container_id)
    assert_loaded(res, host_lib(HOST_535), CUDA[HOST_535])
    # each update-ldcache run leaves its own zz-nvcr-* drop-in: both ran
    assert len([n for n in node.dropins() if n.startswith("zz-nvcr-")]) == 2


@RUNTIMES
def test_legacy_standin_with_toolkit_hook_mode(tmp_path, runtime, libs, toolkit):
    """Legacy mode, ``cuda-compat-mode = "hook"``, GeForce host.

    libnvidia-container is a STAND-IN here (it is in no reachable registry):
    its prestart effects as documented are a bind mount of the host libcuda
    plus ``ldconfig`` with the image's compat dir as an extra directory (its
    ``ldconfig`` mode). The toolkit's real ``enable-cuda-compat`` +
    ``update-ldcache`` follow at createContainer, as the runtime adds them in
    the ``hook`` mode, then compat-hook.
    """
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=GEFORCE)
    work = tmp_path / "work"
    _, enable, update = (oci_hook(h) for h in cdi_hooks(toolkit, HOST_535))
    hooks = {"prestart": [rt.nvidia_standin_hook(libs[HOST_535], work, "prestart"),
                          rt.container_ns_hook([rt.LDCONFIG, "-r", "{rootfs}", COMPAT_DIR], work, "prestart")],
             "createContainer": [enable, update, node.ours()]}
    bundle = rt.make_bundle(node.bundle, node.rootfs, env=list(GPU_ENV), hooks=hooks)
    res = rt.run_container(bundle, runtime)
    _started.append(res.container_id)
    assert_loaded(res, host_lib(HOST_535), CUDA[HOST_535])
    assert node.record(res)["reason"] == "device_unsupported"


# --------------------------------------------------------------------------- nvidia-container-runtime, cdi mode


class Chain:
    """nvidia-container-runtime (mode cdi) and compat-hook's wrapper, chained one way or the other.

    ``wrapper-first``: the engine runs the wrapper, whose ``runtime:`` is the
    toolkit, whose ``runtimes`` is runc or crun. ``toolkit-first``: the engine
    runs the toolkit, whose ``runtimes`` is the wrapper, whose ``runtime:`` is
    runc or crun.
    """

    def __init__(self, node: Node, way: str, runtime: str = "runc"):
        self.node, self.way = node, way
        tmp = node.tmp
        self.low = low_level(runtime, tmp)
        self.wrapper = tmp / "compat-hook-runtime"
        self.toolkit_config = tmp / "nvidia-container-runtime/config.toml"
        self.toolkit_log = tmp / "nvidia-container-runtime.log"
        self.spec_dir = tmp / "cdi"
        self.spec_dir.mkdir()
        self.toolkit_config.parent.mkdir()
        next_of_toolkit = self.low if way == "wrapper-first" else str(self.wrapper)
        self.toolkit_config.write_text(CDI_MODE_CONFIG.format(
            log=self.toolkit_log, runtimes=json.dumps(next_of_toolkit), kind=CDI_KIND, spec_dir=self.spec_dir))
        node.config = node.write_config(runtime=str(node.tk.runtime) if way == "wrapper-first" else self.low)
        self.wrapper.write_text(render_wrapper(config_path=str(node.config), state_dir=str(node.state)))
        self.wrapper.chmod(0o755)
        self.entry = str(self.wrapper) if way == "wrapper-first" else str(node.tk.runtime)
        self.write_cdi_spec()

    def write_cdi_spec(self) -> None:
        v = self.node.toolkit_host
        write_cdi_spec(self.spec_dir, self.node.tk, self.node.libs[v], v)

    def start(self, env=("PATH=/usr/local/bin:/usr/bin:/bin", f"NVIDIA_VISIBLE_DEVICES={CDI_KIND}=all")):
        bundle = rt.make_bundle(self.node.bundle, self.node.rootfs, env=list(env))
        res = create_start(self.entry, bundle, {"NVIDIA_CTK_CONFIG_FILE_PATH": str(self.toolkit_config)},
                           runc=self.low)
        _started.append(res.container_id)
        return res

    def final_spec(self) -> dict:
        return json.loads((self.node.bundle / "config.json").read_text())


def low_level(runtime: str, work: pathlib.Path) -> str:
    """The low-level runtime's path for the chain: runc, or crun the way tests/support/runtimes.py runs it.

    crun refuses hybrid cgroups (docs/background.md "Test machines"): there a
    script runs it in a private mount namespace without the cgroup2 mount;
    the toolkit and the wrapper exec it as they would exec crun.
    """
    if runtime == "runc":
        return rt.RUNC
    if not rt.cgroup_hybrid():
        return rt.CRUN
    script = work / "crun-private"
    script.write_text(f"#!/bin/sh\n# crun without the hybrid cgroup2 mount, in a private mount namespace\n"
                      f"exec {rt.UNSHARE} -m --propagation private /bin/sh -c "
                      f"'umount {rt.CGROUP2_HYBRID} && exec \"$@\"' sh {rt.CRUN} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


CHAINS = pytest.mark.parametrize("way", ["wrapper-first", "toolkit-first"])


def assert_toolkit_ran(chain: Chain, res: rt.Result) -> None:
    """The toolkit applied the CDI spec: its hooks and mount are in the final config.json."""
    spec = chain.final_spec()
    hooks = spec.get("hooks", {}).get("createContainer", [])
    assert [h["args"][1] for h in hooks if h["path"] == str(chain.node.tk.cdi_hook)] == \
        ["create-symlinks", "enable-cuda-compat", "update-ldcache"], (spec.get("hooks"), str(res))
    assert any(m["destination"] == host_lib(chain.node.toolkit_host) for m in spec["mounts"])
    ours = [i for i, h in enumerate(hooks) if any("compat_hook" in a for a in h["args"])]
    assert len(ours) == 1, hooks  # compat-hook's hook, added once by the wrapper
    # the wrapper adds it to the spec it sees: before the CDI trio when it runs first, after it otherwise
    assert ours == ([0] if chain.way == "wrapper-first" else [len(hooks) - 1]), hooks


@RUNTIMES
@CHAINS
def test_chain_datacenter_loads_compat(tmp_path, way, runtime, libs, toolkit):
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=DATACENTER)
    chain = Chain(node, way, runtime)
    res = chain.start()
    assert_loaded(res, COMPAT_LIB, CUDA[COMPAT_550])
    assert_toolkit_ran(chain, res)
    assert (node.record(res)["decision"], node.record(res)["effect"]) == ("enable", "compat")
    assert len(node.records(res, "runtime")) == 1


@RUNTIMES
@CHAINS
def test_chain_geforce_loads_host_lib(tmp_path, way, runtime, libs, toolkit):
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=GEFORCE)
    chain = Chain(node, way, runtime)
    res = chain.start()
    assert_loaded(res, host_lib(HOST_535), CUDA[HOST_535])
    assert_toolkit_ran(chain, res)
    rec = node.record(res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "device_unsupported", "host"), rec
    assert len(node.toolkit_dropins()) == 1  # the toolkit enabled; compat-hook's decision won


@RUNTIMES
@CHAINS
def test_chain_restart_after_host_upgrade_loads_host_lib(tmp_path, way, runtime, libs, toolkit):
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=DATACENTER)
    chain = Chain(node, way, runtime)
    assert_loaded(chain.start(), COMPAT_LIB, CUDA[COMPAT_550])
    node.upgrade(HOST_555)
    chain.write_cdi_spec()  # the node's CDI spec is regenerated for the new driver
    res = chain.start()
    assert_loaded(res, host_lib(HOST_555), CUDA[HOST_555])
    assert len(node.toolkit_dropins()) == 1  # the stale one from the first start


@RUNTIMES
@CHAINS
def test_chain_image_ld_library_path_on_newer_host_loads_host_lib(tmp_path, way, runtime, libs, toolkit):
    """The image's ENV puts its compat dir on LD_LIBRARY_PATH; host 555: the wrapper strips it."""
    node = Node(tmp_path, libs, toolkit, host=HOST_555, gpu=DATACENTER)
    chain = Chain(node, way, runtime)
    res = chain.start(env=("PATH=/usr/local/bin:/usr/bin:/bin", f"NVIDIA_VISIBLE_DEVICES={CDI_KIND}=all",
                           "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/lib"))
    assert_loaded(res, host_lib(HOST_555), CUDA[HOST_555])
    assert "LD_LIBRARY_PATH=/usr/local/lib" in chain.final_spec()["process"]["env"]


@RUNTIMES
@CHAINS
def test_chain_opted_out_leaves_the_toolkit_alone(tmp_path, way, runtime, libs, toolkit):
    """Through nvidia-container-runtime (cdi) and the wrapper: an opted-out container on a GeForce host
    keeps the toolkit's result, and the wrapper changes nothing of the spec."""
    node = Node(tmp_path, libs, toolkit, host=HOST_535, gpu=GEFORCE)
    chain = Chain(node, way, runtime)
    res = chain.start(env=("PATH=/usr/local/bin:/usr/bin:/bin", f"NVIDIA_VISIBLE_DEVICES={CDI_KIND}=all",
                           "COMPAT_HOOK_DISABLE=1"))
    assert_loaded(res, COMPAT_LIB, CUDA[COMPAT_550])
    spec = chain.final_spec()
    hooks = spec.get("hooks", {}).get("createContainer", [])
    assert [h["args"][1] for h in hooks if h["path"] == str(toolkit.cdi_hook)] == \
        ["create-symlinks", "enable-cuda-compat", "update-ldcache"], hooks
    assert not [h for h in hooks if any("compat_hook" in a for a in h["args"])], hooks  # no hook added
    runtime_recs = node.records(res, "runtime")
    assert len(runtime_recs) == 1 and runtime_recs[0]["reason"] == "opt_out", runtime_recs
    assert len(node.toolkit_dropins()) == 1


# Keep last: pytest runs a module's tests in file order.
def test_nothing_left_behind(tmp_path_factory):
    assert _started, "no container ran"
    assert rt.mounts_under(tmp_path_factory.getbasetemp()) == []
    assert [d for d in rt.STATE_DIRS if d.exists()] == []
