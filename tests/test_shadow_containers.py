"""Every libcuda the image carries is a fact, and none of them shadows the decision (issue 42).

Real runc and crun containers, through compat-hook's runtime wrapper (ldconfig and env mode) and its
hook at createContainer; Debian's real libcuda builds (535 and 555 as host drivers, 550 as the compat
driver the image carries in ``/usr/local/cuda-12.4/compat``). Four layouts where another libcuda
than the decision's used to map:

* ``stub``: ``LD_LIBRARY_PATH`` names ``/usr/local/cuda/lib64/stubs`` holding a ``libcuda.so.1``
  (a link-time stub: an ELF whose ``cuDriverGetVersion`` returns 34, ``CUDA_ERROR_STUB_LIBRARY``);
  on a 535 data-center host compat is chosen, and the hook puts the compat libcuda over the stub;
* ``userland``: the image carries its own ``libcuda.so.550`` in ``/usr/lib/x86_64-linux-gnu``
  (``cuda-drivers`` installed in the image): ldconfig keeps the higher version of the dir, so on a
  535 GeForce host (no compat there) the host's libcuda must take that file's place;
* ``symlinked``: the compat dir's ``libcuda.so.*`` link into ``/opt/nv``: the candidate is the
  link's target, and on a 555 host the host's libcuda takes its place;
* ``gke``: the host's driver is mounted at ``/usr/local/nvidia/lib64`` (a device plugin), which the
  image's ``LD_LIBRARY_PATH`` names: on a 535 data-center host the hook puts the compat libcuda over
  the host's file there, so the search (which the ld cache cannot change) maps compat.

Each start is judged by the probe (``st_dev:st_ino`` of the mapped file, ``cuDriverGetVersion``),
then against what ``explain`` predicted and what the log record says.
"""

from __future__ import annotations

import os

import pytest

from tests.support import debs, hookenv
from tests.support.loaderbox import DATA_CENTER, GEFORCE, SYS, Box, Image, build_stub
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

pytestmark = pytest.mark.containers

CUDA = debs.EXPECTED_CUDA
GPU_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all", "PROBE_ID=1"]
C124 = "/usr/local/cuda-12.4"
LIB550 = f"libcuda.so.{COMPAT_550}"
COMPAT_FILE = f"{C124}/compat/{LIB550}"
STUBS = f"{C124}/lib64/stubs"
NV = "/usr/local/nvidia/lib64"
#: the runtime wrapper in ldconfig mode (the default) and env mode, the hook under runc and crun
THROUGH = ["wrapper", "wrapper-env", "hook-runc", "hook-crun"]

@pytest.fixture(scope="module")
def libcuda() -> dict:
    return {v: debs.libcuda(v) for v in (COMPAT_550, HOST_535, HOST_555)}


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    return build_stub(tmp_path_factory.mktemp("stub"))



def _image(**kw) -> Image:
    kw.setdefault("env", list(GPU_ENV))
    libs = {f"{C124}/compat": COMPAT_550, **kw.pop("libs", {})}
    return Image(libs=libs, links={"/usr/local/cuda": "cuda-12.4", **kw.pop("links", {})}, **kw)


def layout(name: str, stub_file) -> tuple:
    """``(host version, GPU model, image, box options)`` of one layout."""
    if name == "stub":
        return HOST_535, DATA_CENTER, _image(copies={f"{STUBS}/libcuda.so.1": stub_file},
                                             env=[*GPU_ENV, "LD_LIBRARY_PATH=/usr/local/cuda/lib64/stubs"]), {}
    if name == "userland":
        return HOST_535, GEFORCE, _image(libs={SYS: COMPAT_550}), {}
    if name == "symlinked":
        img = Image(libs={"/opt/nv": COMPAT_550}, env=list(GPU_ENV),
                    links={"/usr/local/cuda": "cuda-12.4", f"{C124}/compat/libcuda.so.1": f"/opt/nv/{LIB550}",
                           f"{C124}/compat/{LIB550}": f"/opt/nv/{LIB550}"},
                    files={"/etc/ld.so.conf.d/cuda-compat.conf": f"{C124}/compat\n"})
        return HOST_555, DATA_CENTER, img, {}
    assert name == "gke"
    return HOST_535, DATA_CENTER, _image(env=[*GPU_ENV, "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"]), \
        {"host_dir": NV}


def file_id(path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def start(b: Box, through: str, root):
    if through.startswith("wrapper"):
        return b.wrapper(root)
    return b.hook(through.split("-", 1)[1], root)


def last_record(b: Box) -> dict:
    recs = [r for r in hookenv.read_log(b.log) if r.get("container_id") == b.last.container_id]
    return ([r for r in recs if r.get("event") == "hook"] or recs or [{}])[-1]


#: layout -> (what the image alone maps (CUDA version), what compat-hook must make it map: "host" or "compat")
WANT = {"stub": (34, "compat"), "userland": (CUDA[COMPAT_550], "host"), "symlinked": (CUDA[COMPAT_550], "host"),
        "gke": (CUDA[HOST_535], "compat")}


@pytest.mark.parametrize("through", THROUGH)
@pytest.mark.parametrize("name", list(WANT))
def test_the_decision_holds(tmp_path, libcuda, stub, boxes, name, through):
    host, model, img, opts = layout(name, stub)
    if through == "wrapper-env":
        opts = dict(opts, mode="env")
    b = Box(tmp_path, libcuda, host, img, model=model, **opts)
    boxes.append(b)
    alone_cuda, want = WANT[name]
    alone = b.alone()  # the layout is real: without compat-hook another libcuda than the decision's maps
    if alone_cuda == 34:
        assert alone.cuda is None and "returned 34" in alone.error, (alone.pair(), alone.error)
    else:
        assert alone.cuda == alone_cuda, (alone.pair(), alone.error)
    report = b.explain(b.fresh("explain"))
    root = b.fresh("start")
    got = start(b, through, root)
    if want == "host":
        expect = (CUDA[host], file_id(libcuda[host]))
    else:
        expect = (CUDA[COMPAT_550], file_id(root / COMPAT_FILE.lstrip("/")))
    assert (got.cuda, got.id) == expect, (
        f"{name} through {through} mapped {got.pair()} id {got.id} ({got.error or 'ok'}), must map the {want} "
        f"libcuda {expect}; compat-hook: {b.why()}")
    rec = last_record(b)
    assert rec.get("effect") == want and not rec.get("warnings"), rec
    hook_fx = report["effects"]["hook"]
    tk = report["toolkit"]
    if want == "compat":
        # explain and the log name the compat file as what maps, and the file it takes the place of
        assert rec.get("maps") == COMPAT_FILE, rec
        assert tk["with_hook"]["maps"] == COMPAT_FILE and tk["with_wrapper"]["maps"] == COMPAT_FILE, tk
        shadow = (f"{STUBS}/libcuda.so.1" if name == "stub" else f"{NV}/libcuda.so.{host}")
        if through == "wrapper-env":
            # env mode: the wrapper puts the compat dir first on LD_LIBRARY_PATH, so nothing needs covering
            wrec = [r for r in b.records("runtime") if r.get("container_id") == b.last.container_id]
            assert any(a.startswith(f"LD_LIBRARY_PATH={C124}/compat:") for r in wrec for a in r.get("actions") or []), wrec
        else:
            assert f"{shadow} <- {COMPAT_FILE} (hook)" in (rec.get("compat_over_shadow") or []), rec
        if name == "stub":
            assert any(e.startswith(f"bind-mount {COMPAT_FILE} over {shadow} (ro, createContainer): the chosen "
                                    "compat libcuda") for e in hook_fx), hook_fx
        else:  # the device plugin's mount is not in the image explain reads: a note says what the hook does
            assert any(n.startswith(f"LD_LIBRARY_PATH names /usr/local/nvidia/lib, {NV} before {C124}/compat")
                       for n in report["notes"]), report["notes"]
    else:
        covered = f"{SYS}/{LIB550}" if name == "userland" else f"/opt/nv/{LIB550}"
        said = list(rec.get("host_over_compat") or [])
        assert any(x.startswith(f"{covered} <- ") for x in said), rec
        assert any(f"over {covered} (ro, createContainer): the host's libcuda" in e for e in hook_fx), hook_fx
        if name == "userland":
            # the image's userland driver is a fact, and so is what ldconfig links without compat-hook
            assert [u["path"] for u in report["image"]["userland"]] == [covered], report["image"]
            assert report["ldconfig_picks"] == {SYS: LIB550}
            # alone, the image's 550 maps (the toolkit's compat drop-in, or ldconfig's pick in the dir), not the host's
            assert tk["alone"]["maps"] in (covered, COMPAT_FILE), tk["alone"]
        else:
            assert report["image"]["link_targets"] == {LIB550: covered}, report["image"]
            assert report["image"]["candidate"] == LIB550 and tk["alone"]["result"] == "compat", tk["alone"]


def test_a_prestart_hook_says_the_stub_maps(tmp_path, libcuda, stub, boxes):
    """Where compat-hook cannot put the compat libcuda over the stub (a hook outside the container's
    mount namespace), its log says so before the start and names the file that maps."""
    host, model, img, opts = layout("stub", stub)
    b = Box(tmp_path, libcuda, host, img, model=model, **opts)
    boxes.append(b)
    from compat_hook.core import registration

    root = b.fresh("prestart")
    hooks = {"prestart": [b._standin(root), registration.hook_entry(stage="prestart", config=str(b.config),
                                                                    state_dir=str(b.state))]}
    got = b._run(root, hooks, "runc")
    assert got.cuda is None and "returned 34" in got.error, (got.pair(), got.error)
    rec = last_record(b)
    assert rec.get("effect") == "compat" and "maps" not in rec and not rec.get("compat_over_shadow"), rec
    assert any(f"reaches /usr/local/cuda/lib64/stubs/libcuda.so.1 ({STUBS}/libcuda.so.1)" in w
               for w in rec.get("warnings") or []), rec
