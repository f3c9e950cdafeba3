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

Two more: in the ``gke`` layout the device plugin also mounts the host driver's companions
(``libnvidia-ptxjitcompiler.so.1``, ``libnvidia-nvvm.so.4``; small real ELF objects with those sonames,
Debian's libcuda1 debs carry none) and the probe dlopens them by soname after libcuda (``PROBE_ALSO``):
the compat dir's ptxjitcompiler maps, and the nvvm it has none of maps nowhere (``/dev/null``); and an
image whose ``libcuda.so.550.x`` in the multiarch dir has no link (its build removed ``libcuda.so.1``),
with the toolkit stand-in's ldconfig at startContainer, after compat-hook's hook: on a 535 GeForce host
the search and an absolute dlopen of that file map the host's library.
"""

from __future__ import annotations

import os
import subprocess

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
        else:  # the device plugin's mount (of lib64 only) is not in the image explain reads: a note says what the hook does
            assert any(n.startswith(f"LD_LIBRARY_PATH names {NV} before {C124}/compat")
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


# -- the driver's other libraries in a shadowing dir (GKE) ---------------------------------------------------

PTX, NVVM = "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"
COMPAT_PTX = f"{C124}/compat/libnvidia-ptxjitcompiler.so.{COMPAT_550}"
HOST_PTX, HOST_NVVM = f"{NV}/libnvidia-ptxjitcompiler.so.{HOST_535}", f"{NV}/libnvidia-nvvm.so.{HOST_535}"
#: Debian's libcuda1 debs carry no companion: a real ELF shared object with the companion's soname stands in,
#: one build per driver version (the number it returns tells them apart for a person; the tests use st_dev:st_ino)
COMPANION_C = "int companion_driver_version(void) {{ return {v}; }}\n"


@pytest.fixture(scope="module")
def companion_libs(tmp_path_factory) -> dict:
    """``{(soname, version): file}``: the ptxjitcompiler at 535 and 550, the nvvm at 535 (the compat dir has none)."""
    d = tmp_path_factory.mktemp("companions")
    out = {}
    for soname, ver in ((PTX, HOST_535), (PTX, COMPAT_550), (NVVM, HOST_535)):
        src = d / f"{soname}-{ver}.c"
        src.write_text(COMPANION_C.format(v=ver.split(".")[0]))
        lib = d / f"{soname.rsplit('.so.', 1)[0]}.so.{ver}"
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(lib), str(src)], check=True,
                       capture_output=True)
        out[(soname, ver)] = lib
    return out


def companion_box(tmp_path, libcuda, companion_libs, through) -> Box:
    """GKE: the device plugin mounts the host's 535 libcuda, ptxjitcompiler and nvvm at /usr/local/nvidia/lib64;
    the image's compat dir carries the 550 libcuda and ptxjitcompiler (no nvvm)."""
    _, model, img, opts = layout("gke", None)
    img.env.append(f"PROBE_ALSO={PTX},{NVVM}")
    img.copies = {COMPAT_PTX: companion_libs[(PTX, COMPAT_550)]}
    img.links = dict(img.links, **{f"{C124}/compat/{PTX}": COMPAT_PTX.rsplit("/", 1)[1]})
    extra = [(companion_libs[(PTX, HOST_535)], HOST_PTX.rsplit("/", 1)[1], PTX),
             (companion_libs[(NVVM, HOST_535)], HOST_NVVM.rsplit("/", 1)[1], NVVM)]
    if through == "wrapper-env":
        opts = dict(opts, mode="env")
    return Box(tmp_path, libcuda, HOST_535, img, model=model, host_extra=extra, **opts)


@pytest.mark.parametrize("through", THROUGH)
def test_the_compat_libcuda_gets_its_own_companions(tmp_path, libcuda, companion_libs, boxes, through):
    """Where compat is chosen over the host's driver dir on LD_LIBRARY_PATH, the companions the compat libcuda
    loads by soname are the compat dir's (or none), never the host driver's from that dir."""
    b = companion_box(tmp_path, libcuda, companion_libs, through)
    boxes.append(b)
    alone = b.alone()  # the layout is real: the search finds the host driver's libcuda and companions there
    assert alone.cuda == CUDA[HOST_535], (alone.pair(), alone.error)
    assert alone.also[PTX] == (HOST_PTX, file_id(companion_libs[(PTX, HOST_535)])), alone.also
    assert alone.also[NVVM] == (HOST_NVVM, file_id(companion_libs[(NVVM, HOST_535)])), alone.also
    root = b.fresh("start")
    got = start(b, through, root)
    assert (got.cuda, got.id) == (CUDA[COMPAT_550], file_id(root / COMPAT_FILE.lstrip("/"))), (
        got.pair(), got.error, b.why())
    compat_ptx = file_id(root / COMPAT_PTX.lstrip("/"))
    # the very file the compat dir carries, under whichever name the search reached it
    assert got.also[PTX][1] == compat_ptx, (through, got.also, b.why())
    rec = last_record(b)
    assert rec.get("effect") == "compat" and not rec.get("warnings"), rec
    said = rec.get("compat_over_shadow") or []
    if through == "wrapper-env":
        # env mode: the compat dir comes first on LD_LIBRARY_PATH and its ptxjitcompiler is found there; nothing
        # is covered (a companion the compat dir lacks is still found after it: not a shadowing entry)
        assert got.also[PTX][0] == COMPAT_PTX and not said, (got.also, rec)
        return
    # the host's nvvm is covered with /dev/null (the compat dir has no nvvm): no file maps, not the host's 535
    assert got.also[NVVM][0] is None, (got.also, b.why())
    assert f"{HOST_PTX} <- {COMPAT_PTX} (hook)" in said and f"{HOST_NVVM} <- /dev/null (hook)" in said, rec


def test_explain_names_the_companions_it_covers(tmp_path, libcuda, companion_libs, boxes):
    """explain, on a root holding what the device plugin mounts (what the hook reads at createContainer), lists
    each companion bind as its effect; on the bare image its note says the hook covers them too."""
    b = companion_box(tmp_path, libcuda, companion_libs, "hook-runc")
    boxes.append(b)
    bare = b.explain(b.fresh("explain"))
    assert any(n.startswith(f"LD_LIBRARY_PATH names {NV} before {C124}/compat")
               and "libnvidia-ptxjitcompiler" in n for n in bare["notes"]), bare["notes"]
    root = b.fresh("explain")
    nv = root / NV.lstrip("/")
    nv.mkdir(parents=True)
    for f, name, so in [(libcuda[HOST_535], f"libcuda.so.{HOST_535}", "libcuda.so.1"),
                        (companion_libs[(PTX, HOST_535)], HOST_PTX.rsplit("/", 1)[1], PTX),
                        (companion_libs[(NVVM, HOST_535)], HOST_NVVM.rsplit("/", 1)[1], NVVM)]:
        (nv / name).write_bytes(f.read_bytes())
        os.symlink(name, nv / so)
    report = b.explain(root)
    hook_fx = report["effects"]["hook"]
    assert (f"bind-mount {COMPAT_PTX} over {HOST_PTX} (ro, createContainer): the chosen compat dir's file of that "
            f"library over the driver companion that {NV}/{PTX} on LD_LIBRARY_PATH reaches first") in hook_fx, hook_fx
    assert (f"bind-mount /dev/null over {HOST_NVVM} (ro, createContainer): nothing the loader maps (the compat dir "
            f"has no file of that library) over the driver companion that {NV}/{NVVM} on LD_LIBRARY_PATH reaches "
            "first") in hook_fx, hook_fx
    kinds = {x["target"]: (x["source"], x["kind"]) for x in report["compat_over_shadow"]}
    assert kinds == {f"{NV}/libcuda.so.{HOST_535}": (COMPAT_FILE, "host"), HOST_PTX: (COMPAT_PTX, "companion"),
                     HOST_NVVM: ("/dev/null", "companion")}, kinds


# -- a userland libcuda no link leads to ---------------------------------------------------------------------

UNLINKED = f"{SYS}/{LIB550}"


@pytest.mark.parametrize("through", ["wrapper", "hook-runc", "hook-crun"])
def test_an_unlinked_userland_libcuda_maps_the_hosts(tmp_path, libcuda, boxes, through):
    """The image carries a regular libcuda.so.550.x in the multiarch dir and no link to it (its build removed
    libcuda.so.1): on a 535 GeForce host (no compat) an absolute dlopen of it, and the libcuda.so.1 search after
    the toolkit stand-in's ldconfig (which links the dir's highest version), map the host's library. The
    stand-in's ldconfig runs at startContainer, after compat-hook's hook: when the hook reads the image, no
    link leads to the file yet."""
    img = _image(copies={UNLINKED: libcuda[COMPAT_550]}, after_ldconfig=[f"{SYS}/libcuda.so.1"])
    b = Box(tmp_path, libcuda, HOST_535, img, model=GEFORCE, ldconfig_at_start=True)
    boxes.append(b)
    alone = b.alone()  # the layout is real: ldconfig at the start links libcuda.so.1 to the image's 550
    assert (alone.cuda, alone.path) == (CUDA[COMPAT_550], UNLINKED), (alone.pair(), alone.error)
    host = (CUDA[HOST_535], file_id(libcuda[HOST_535]))
    got = start(b, through, b.fresh("search"))
    assert (got.cuda, got.id) == host, (through, got.pair(), got.id, got.error, b.why())
    rec = last_record(b)
    assert rec.get("effect") == "host" and any(x.startswith(f"{UNLINKED} <- ") for x in rec.get("host_over_compat")
                                               or []), rec
    b.image.args = ["/usr/local/bin/probe", UNLINKED]  # numba's NUMBA_CUDA_DRIVER road: the file by its path
    got = start(b, through, b.fresh("absolute"))
    assert (got.cuda, got.id) == host, (through, got.pair(), got.id, got.error, b.why())
    if through == "hook-runc":
        b.image.args = ["/usr/local/bin/probe"]
        report = b.explain(b.fresh("explain"))
        assert {"path": UNLINKED, "name": LIB550, "version": COMPAT_550, "via": None} in report["image"]["userland"], \
            report["image"]["userland"]
        assert report["ldconfig_picks"] == {SYS: LIB550}, report["ldconfig_picks"]
        assert any(f"over {UNLINKED} (ro, createContainer): the host's libcuda over the image's userland driver" in e
                   for e in report["effects"]["hook"]), report["effects"]["hook"]
