"""Every libcuda the container's loader can map: NGC, vLLM, pixi, micromamba 2 and ld.so.conf layouts (issue 32).

Real runc and crun containers, Debian's real libcuda builds (470, 535 and 555 as the host
driver, mounted by the NVIDIA toolkit stand-in at its versioned name; 550 as the compat driver
the images carry), a fake host whose ``/proc/driver/nvidia`` names the driver and one GPU (NVML
off: the brand comes from the model name). The probe ``dlopen()``\\s ``libcuda.so.1`` and
prints the file the loader mapped and its ``cuDriverGetVersion``.

What must load, whatever the layout: the 550 compat driver on a 470 or 535 host with a
data-center GPU (H100); the host's own driver on a 555 host (the compat driver is older) and on
a GeForce (forward compatibility is for data-center GPUs only).

Layouts (:data:`LAYOUTS`):

* ``ngc-*``: NGC's ``/usr/local/cuda-12.4/compat/lib.real`` (``/usr/local/cuda`` ->
  ``/etc/alternatives/cuda`` -> ``/usr/local/cuda-12.4``), ``00-cuda-compat.conf`` naming
  ``/usr/local/cuda/compat/lib``; the ``lib -> lib.real`` link removed after the build's ldconfig
  (``removed``) or kept (``kept``, a ``docker commit``); with ``LD_LIBRARY_PATH`` naming
  ``/usr/local/cuda/compat/lib`` (``-ld``) or without (a Kubernetes ``command:`` drops the entrypoint);
* ``vllm``: the compat dir (``/usr/local/cuda-12.4/compat``) in ``LD_LIBRARY_PATH`` and in
  ``/etc/ld.so.conf.d/cuda-compat.conf``; ``vllm-elsewhere``: the same with ``/opt/cuda-compat``, a dir
  only those two name (through the wrapper: the wrapper takes it off ``LD_LIBRARY_PATH``, and the
  hook it adds must still see the drop-in's);
* ``pixi``: ``/app/.pixi/envs/default/cuda-compat``, links in the env's ``lib``, the probe in the
  env's ``bin`` built with ``DT_RUNPATH $ORIGIN/../lib``, cwd ``/app``, the env's ``bin`` on ``PATH``,
  no ``CONDA_PREFIX``;
* ``micromamba``: micromamba 2's default root ``~/.local/share/mamba`` of ``mambauser`` (uid 1000,
  in ``/etc/passwd``), env ``x``, links and a RUNPATH probe as for pixi, the process runs as
  ``mambauser``, no env var names the env;
* ``dropin-only``: ``/opt/nvidia/compat`` named only by ``/etc/ld.so.conf.d/nvidia-compat.conf``;
* ``ldconf-order``: ``/opt/compat/lib`` on a line of ``/etc/ld.so.conf`` before its ``include``.

The matrix (not the full product: 168 tests, about 2.5 minutes measured on two shared cores):

* :func:`test_the_layout_alone`: every layout without compat-hook on the 470, 535 and 555 hosts:
  what glibc's loader maps on its own (this checks the layouts, and passes today);
* :func:`test_explain_never_denies_the_compat_library`: ``explain`` on every layout (555 host);
* :func:`test_the_hook`: every layout through the hook at createContainer, under runc on the
  470, 535 and 555 data-center hosts and the 535 GeForce host, under crun on 535 and 555
  data-center hosts;
* :func:`test_the_wrapper`: every layout through the runtime wrapper in ldconfig mode on the
  same four hosts as runc; in env and both modes the layouts that name the compat dir on
  ``LD_LIBRARY_PATH`` (``vllm``, ``vllm-elsewhere``, ``ngc-removed-ld``, ``ngc-kept-ld``) on the
  535 and 555 data-center hosts;
* :func:`test_containerd_through_the_wrapper`: the ``vllm-elsewhere`` and ``ngc-kept-ld`` images
  (built with umoci, imported into a real containerd of its own), started with
  ``ctr run --runc-binary <wrapper>`` (the wrapper chaining to a stand-in of
  nvidia-container-runtime that mounts the host library at ``libcuda.so.1``), in ldconfig and
  env mode, on the 535 and 555 data-center hosts (and :func:`test_containerd_alone`: both images
  on the 555 host through the stand-in alone, where the image's compat dir wins).

GeForce on the 470 and 555 hosts, crun with a GeForce and the product of everything are left to
tests/test_loader_differential.py, which draws them.
Each hook and wrapper test asserts what the probe maps (path and ``cuDriverGetVersion``), that
``explain --json`` on the same spec predicts it (``toolkit.with_hook`` / ``toolkit.with_wrapper``:
``result`` and the resolved compat ``dir``), and that compat-hook's log says it (the last record for
the container: ``effect`` ``compat`` with that ``compat_dir``, or ``host``).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from compat_hook.install.wrapper import render_wrapper
from tests.support import debs, engines, hookenv, loaderbox, rootfs, runtimes as rt, wrapperenv
from tests.support.loaderbox import BRANDS, SYS, Box, Image, Loaded, host_lib, outcome, predicted
from tests.support.versions import COMPAT_550, HOST_470, HOST_535, HOST_555

pytestmark = pytest.mark.containers

CUDA = debs.EXPECTED_CUDA
GPU_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all"]
LIB550 = f"libcuda.so.{COMPAT_550}"
C124 = "/usr/local/cuda-12.4"
NGC_REAL = f"{C124}/compat/lib.real"
PIXI = "/app/.pixi/envs/default"
MAMBA = "/home/mambauser/.local/share/mamba/envs/x"

_started: list = []


def _conda_meta(prefix: str) -> dict:
    return {f"{prefix}/conda-meta/cuda-compat-impl-{COMPAT_550}-h0_0.json":
            f'{{"name": "cuda-compat-impl", "version": "{COMPAT_550}", '
            f'"files": ["cuda-compat/{LIB550}"]}}\n',
            f"{prefix}/conda-meta/history": "==> 2026-01-01 00:00:00 <==\n"}


def ngc(*, link: bool, ld: bool) -> Image:
    return Image(
        libs={NGC_REAL: COMPAT_550},
        links={"/etc/alternatives/cuda": C124, "/usr/local/cuda": "/etc/alternatives/cuda",
               f"{C124}/compat/lib": "lib.real"},
        files={"/etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat/lib\n"},
        after_ldconfig=[] if link else [f"{C124}/compat/lib"],
        env=[*GPU_ENV, "CUDA_VERSION=12.4.1", *(["LD_LIBRARY_PATH=/usr/local/cuda/compat/lib"] if ld else [])])


def vllm() -> Image:
    return Image(libs={f"{C124}/compat": COMPAT_550}, links={"/usr/local/cuda": "cuda-12.4"},
                 files={"/etc/ld.so.conf.d/cuda-compat.conf": f"{C124}/compat\n"},
                 env=[*GPU_ENV, "CUDA_VERSION=12.4.1", "LD_LIBRARY_PATH=/usr/local/cuda/compat"])


def env_prefix(prefix: str, *, relative: bool) -> Image:
    """A conda-format env at ``prefix`` with cuda-compat, its links in ``lib`` and a RUNPATH probe in ``bin``."""
    target = "../cuda-compat/" if relative else f"{prefix}/cuda-compat/"
    return Image(libs={f"{prefix}/cuda-compat": COMPAT_550},
                 links={f"{prefix}/lib/{n}": target + n for n in ("libcuda.so", "libcuda.so.1", LIB550)},
                 files=_conda_meta(prefix), runpath_probe=f"{prefix}/bin/probe", args=[f"{prefix}/bin/probe"])


def pixi() -> Image:
    img = env_prefix(PIXI, relative=True)
    img.files["/app/pixi.toml"] = loaderbox.PIXI_TOML
    img.env = [f"PATH={PIXI}/bin:/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    img.cwd = "/app"
    return img


def micromamba() -> Image:
    img = env_prefix(MAMBA, relative=False)
    img.passwd = ["mambauser:x:1000:1000::/home/mambauser:/bin/sh"]
    img.env = list(GPU_ENV)
    img.uid = 1000
    return img


def vllm_elsewhere() -> Image:
    """As :func:`vllm`, the compat dir outside every place compat-hook searches by name."""
    return Image(libs={"/opt/cuda-compat": COMPAT_550},
                 files={"/etc/ld.so.conf.d/cuda-compat.conf": "/opt/cuda-compat\n"},
                 env=[*GPU_ENV, "CUDA_VERSION=12.4.1", "LD_LIBRARY_PATH=/opt/cuda-compat"])


def dropin_only() -> Image:
    return Image(libs={"/opt/nvidia/compat": COMPAT_550},
                 files={"/etc/ld.so.conf.d/nvidia-compat.conf": "/opt/nvidia/compat\n"}, env=list(GPU_ENV))


def ldconf_order() -> Image:
    return Image(libs={"/opt/compat/lib": COMPAT_550},
                 ld_so_conf="/opt/compat/lib\ninclude /etc/ld.so.conf.d/*.conf\n", env=list(GPU_ENV))


#: layout -> (image, the compat library's realpath in the container, whether it loads alone)
LAYOUTS = {
    "ngc-removed": (lambda: ngc(link=False, ld=False), f"{NGC_REAL}/{LIB550}", False),
    "ngc-kept": (lambda: ngc(link=True, ld=False), f"{NGC_REAL}/{LIB550}", True),
    "ngc-removed-ld": (lambda: ngc(link=False, ld=True), f"{NGC_REAL}/{LIB550}", False),
    "ngc-kept-ld": (lambda: ngc(link=True, ld=True), f"{NGC_REAL}/{LIB550}", True),
    "vllm": (vllm, f"{C124}/compat/{LIB550}", True),
    "vllm-elsewhere": (vllm_elsewhere, f"/opt/cuda-compat/{LIB550}", True),
    "pixi": (pixi, f"{PIXI}/cuda-compat/{LIB550}", True),
    "micromamba": (micromamba, f"{MAMBA}/cuda-compat/{LIB550}", True),
    "dropin-only": (dropin_only, f"/opt/nvidia/compat/{LIB550}", True),
    "ldconf-order": (ldconf_order, f"/opt/compat/lib/{LIB550}", True),
}
ENV_LAYOUTS = ["vllm", "vllm-elsewhere", "ngc-removed-ld", "ngc-kept-ld"]
#: host id -> (driver, brand)
HOSTS = {"470-dc": (HOST_470, "dc"), "535-dc": (HOST_535, "dc"), "555-dc": (HOST_555, "dc"),
         "535-geforce": (HOST_535, "geforce")}


@pytest.fixture(scope="module")
def libcuda() -> dict:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


def must_load(layout: str, host_id: str) -> tuple:
    """``(cuDriverGetVersion, path)`` the container must map (the issue's rule)."""
    driver, brand = HOSTS[host_id]
    if brand == "dc" and driver in (HOST_470, HOST_535):
        return CUDA[COMPAT_550], LAYOUTS[layout][1]
    return CUDA[driver], host_lib(driver)



def box(made: list, tmp_path, libcuda, layout: str, host_id: str, **config) -> Box:
    driver, brand = HOSTS[host_id]
    b = Box(tmp_path, libcuda, driver, LAYOUTS[layout][0](), model=BRANDS[brand], **config)
    _started.append(b.started)
    made.append(b)
    return b


def check(b: Box, got, want: tuple, report: dict, actor: str) -> None:
    """The start mapped ``want``, and explain's ``actor`` prediction names the same library."""
    assert got.pair() == want, (f"mapped {got.pair()} ({got.error or 'ok'}), must map {want}; "
                                f"compat-hook: {b.why()}")
    said = predicted(report, actor)
    real = outcome(got, b.host)
    assert said == real, (f"explain predicts {said} for {actor}, the container mapped {real}: "
                          f"{(report.get('toolkit') or {}).get(actor)}; summary: {report.get('summary')}")
    # The log says it too: the last word on this container (the hook's, else the wrapper's).
    recs = [r for r in hookenv.read_log(b.log) if r.get("container_id") == b.last.container_id]
    last = ([r for r in recs if r.get("event") == "hook"] or recs or [{}])[-1]
    logged = (last.get("effect"), last.get("compat_dir") if last.get("effect") == "compat" else None)
    assert logged == real, f"the log says {logged}, the container mapped {real}: {b.why()}"


# --------------------------------------------------------------------------- without compat-hook


@pytest.mark.parametrize("host", [HOST_470, HOST_535, HOST_555], ids=["470", "535", "555"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_layout_alone(tmp_path, libcuda, boxes, layout, host):
    """What glibc's loader maps on its own: the layouts are what they claim to be."""
    build, compat, loads = LAYOUTS[layout]
    b = Box(tmp_path, libcuda, host, build())
    _started.append(b.started)
    boxes.append(b)
    want = (CUDA[COMPAT_550], compat) if loads else (CUDA[host], host_lib(host))
    got = b.alone()
    assert got.pair() == want, got.error


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_explain_never_denies_the_compat_library(tmp_path, libcuda, boxes, layout):
    """The image carries a compat libcuda in every layout: explain never says it carries none."""
    b = box(boxes, tmp_path, libcuda, layout, "555-dc")
    report = b.explain(b.fresh("explain"))
    said = [f"{k}: {v['by']}" for k, v in (report.get("toolkit") or {}).items()
            if isinstance(v, dict) and "carries no compat libcuda" in str(v.get("by"))]
    assert said == [] and "carries no compat libcuda" not in report.get("summary", ""), (said, report.get("summary"))


# --------------------------------------------------------------------------- the hook


HOOK_CASES = [(lay, h, "runc") for lay in LAYOUTS for h in HOSTS] + \
             [(lay, h, "crun") for lay in LAYOUTS for h in ("535-dc", "555-dc")]


@pytest.mark.parametrize("layout, host_id, runtime", HOOK_CASES, ids=["-".join(c) for c in HOOK_CASES])
def test_the_hook(tmp_path, libcuda, boxes, layout, host_id, runtime):
    b = box(boxes, tmp_path, libcuda, layout, host_id)
    root = b.fresh("hook")
    report = b.explain(root)
    check(b, b.hook(runtime, root), must_load(layout, host_id), report, "with_hook")


# --------------------------------------------------------------------------- the wrapper


WRAPPER_CASES = [(lay, h, "ldconfig") for lay in LAYOUTS for h in HOSTS] + \
                [(lay, h, m) for m in ("env", "both") for lay in ENV_LAYOUTS for h in ("535-dc", "555-dc")]


@pytest.mark.parametrize("layout, host_id, mode", WRAPPER_CASES, ids=["-".join(c) for c in WRAPPER_CASES])
def test_the_wrapper(tmp_path, libcuda, boxes, layout, host_id, mode):
    b = box(boxes, tmp_path, libcuda, layout, host_id, mode=mode)
    root = b.fresh("wrapper")
    report = b.explain(root)
    check(b, b.wrapper(root), must_load(layout, host_id), report, "with_wrapper")


# --------------------------------------------------------------------------- containerd


CTRD_LAYOUTS = ["vllm-elsewhere", "ngc-kept-ld"]
CTRD_IMAGE = "docker.io/library/loader"
#: Where the containerd stand-in (tests/support/wrapperenv.py) mounts the host's library.
CTRD_HOST_LIB = f"{SYS}/libcuda.so.1"


class LoaderContainerd(engines.DirectContainerd):
    """A real containerd; compat-hook's wrapper (``ctr run --runc-binary``) chains to the stand-in of
    nvidia-container-runtime, which mounts the current fake host's libcuda at ``libcuda.so.1``."""

    def __init__(self, work: pathlib.Path, libcuda: dict) -> None:
        super().__init__(work)
        self.libcuda = libcuda
        self.wrapper = work / "bin" / "compat-hook-runtime"
        self.hook_config = work / "compat-hook.yaml"
        self.hook_log = work / "compat-hook.log"
        self.standin = work / "bin" / "nvidia-container-runtime"
        self.host = work / "host"
        self.images: dict = {}  # tag -> (unpacked rootfs kept for explain, Image)

    def prepare(self) -> None:
        w = self.work
        (w / "bin").mkdir()
        for v in (HOST_535, HOST_555):
            h = wrapperenv.fake_host(w / f"host{v.split('.')[0]}", v, self.libcuda[v])
            info = h / "proc/driver/nvidia/gpus/0000:17:00.0/information"
            info.parent.mkdir(parents=True)
            info.write_text(f"Model: \t\t {BRANDS['dc']}\nBus Location: \t 0000:17:00.0\nDevice Minor: \t 0\n")
        self.use_host(HOST_535)
        wrapperenv.standin_runtime(self.standin, w / "standin-argv.log", self.host / CTRD_HOST_LIB.lstrip("/"))
        self.wrapper.write_text(render_wrapper(str(self.hook_config), python=loaderbox.PY))
        self.wrapper.chmod(0o755)
        self.configure("env")
        lay = w / "img"
        engines.sh("umoci", "init", "--layout", lay)
        for tag in CTRD_LAYOUTS:
            image = LAYOUTS[tag][0]()
            u = w / f"u-{tag}"
            engines.sh("umoci", "new", "--image", f"{lay}:{tag}")
            engines.sh("umoci", "unpack", "--image", f"{lay}:{tag}", u)
            shutil.rmtree(u / "rootfs")
            image.build(rootfs.build_rootfs(u / "rootfs"), self.libcuda)
            engines.sh("umoci", "repack", "--image", f"{lay}:{tag}", u)
            cfg = [x for e in image.env for x in ("--config.env", e)] + \
                  [x for a in image.args for x in ("--config.cmd", a)]
            engines.sh("umoci", "config", "--image", f"{lay}:{tag}", *cfg)
            self.images[tag] = (u / "rootfs", image)
        self.image_tar = w / "loader-oci.tar"
        engines.sh("tar", "-C", lay, "-cf", self.image_tar, ".")

    def configure(self, mode: str) -> None:
        wrapperenv.write_config(self.hook_config, host_root=str(self.host), log_file=str(self.hook_log),
                                mode=mode, runtime=str(self.standin), wrapper_drop_oom_score_adj=True)

    def use_host(self, version: str) -> None:
        tmp = self.work / ".host-link"
        os.symlink(f"host{version.split('.')[0]}", tmp)
        os.replace(tmp, self.host)

    def run(self, tag: str, name: str) -> rt.Result:
        p = self.ctr("-n", "default", "run", "--rm", "--runc-binary", self.wrapper, "--runc-root",
                     self.work / "runc-ctr", f"{CTRD_IMAGE}:{tag}", name, check=False)
        _started.append([name])
        return rt.Result(p.returncode, p.stdout, p.stderr, "containerd", name)

    def explain(self, tag: str) -> dict:
        root, image = self.images[tag]
        b = self.work / f"explain-{tag}"
        rt.make_bundle(b, root, env=image.env, args=image.args, edit=image.spec_edit)
        p = subprocess.run([loaderbox.PY, "-m", "compat_hook", "explain", "--json", "--config", str(self.hook_config),
                            "--bundle", str(b)], cwd=str(loaderbox.REPO), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)


@pytest.fixture(scope="module")
def ctrd(tmp_path_factory, libcuda):
    c = LoaderContainerd(tmp_path_factory.mktemp("loader-ctrd"), libcuda)
    try:
        c.prepare()
        c.start()
        c.ctr("-n", "default", "images", "import", "--base-name", CTRD_IMAGE, c.image_tar)
        yield c
    finally:
        c.left = c.stop()
        if not rt.mounts_under(c.work):  # the images' copies (~200 MB); a leaked mount keeps them
            for d in ["img", "loader-oci.tar", "root", *(f"u-{t}" for t in CTRD_LAYOUTS)]:
                p = c.work / d
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


@pytest.mark.parametrize("layout", CTRD_LAYOUTS)
def test_containerd_alone(ctrd, layout):
    """The stand-in runtime alone (no compat-hook), on the 555 host: the image's compat dir wins."""
    ctrd.use_host(HOST_555)
    p = ctrd.ctr("-n", "default", "run", "--rm", "--runc-binary", ctrd.standin, "--runc-root", ctrd.work / "runc-ctr",
                 f"{CTRD_IMAGE}:{layout}", f"{layout}-alone", check=False)
    _started.append([f"{layout}-alone"])
    got = Loaded.of(rt.Result(p.returncode, p.stdout, p.stderr))
    assert got.pair() == (CUDA[COMPAT_550], LAYOUTS[layout][1]), got.error


@pytest.mark.parametrize("mode", ["ldconfig", "env"])
@pytest.mark.parametrize("host", [HOST_535, HOST_555], ids=["535-dc", "555-dc"])
@pytest.mark.parametrize("layout", CTRD_LAYOUTS)
def test_containerd_through_the_wrapper(ctrd, layout, host, mode):
    ctrd.use_host(host)
    ctrd.configure(mode)
    report = ctrd.explain(layout)
    res = ctrd.run(layout, f"{layout}-{host.split('.')[0]}-{mode}")
    want = (CUDA[COMPAT_550], LAYOUTS[layout][1]) if host == HOST_535 else (CUDA[host], CTRD_HOST_LIB)
    got = Loaded.of(res)
    recs = [r for r in hookenv.read_log(ctrd.hook_log) if r.get("container_id") == res.container_id]
    assert got.pair() == want, (f"mapped {got.pair()} ({got.error or 'ok'}), must map {want}; compat-hook: "
                                + "; ".join(f"{r.get('event')} {r.get('decision')}/{r.get('reason')} "
                                            f"{r.get('actions')}" for r in recs))
    real = ("host", None) if got.path == CTRD_HOST_LIB else ("compat", os.path.dirname(got.path))
    assert predicted(report, "with_wrapper") == real, (report["toolkit"]["with_wrapper"], report.get("summary"))


def test_containerd_leaves_nothing_behind(ctrd):
    assert ctrd.stop() == {"containers": [], "shims": [], "mounts": [], "runc": []}


# --------------------------------------------------------------------------- the end


# Keep last: pytest runs a module's tests in file order.
def test_nothing_left_behind(tmp_path_factory):
    assert any(_started), "no container ran"
    assert rt.mounts_under(tmp_path_factory.getbasetemp()) == []
    assert [d for d in rt.STATE_DIRS if d.exists()] == []
