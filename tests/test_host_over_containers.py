"""When the host's driver is chosen, no compat libcuda stays loadable by any road (issue 42).

Real runc and crun containers; Debian's real libcuda builds: 555 as the host driver (mounted by
the NVIDIA toolkit stand-in at its versioned name, which also links ``libcuda.so`` as the
toolkit's CDI specs do), 550 as the compat driver the image carries in
``/usr/local/cuda-12.4/compat`` (``/usr/local/cuda`` -> ``cuda-12.4``). The compat driver is
older than the host's, so the host's must map, whatever road the process takes to libcuda:

* ``rpath``: the app is built with ``DT_RPATH`` naming ``/usr/local/cuda/compat``;
* ``preload``: ``LD_PRELOAD`` names the compat ``libcuda.so.1``; ``ld-so-preload``: ``/etc/ld.so.preload`` does;
* ``absolute``: ``dlopen("/usr/local/cuda/compat/libcuda.so.1")`` (numba's ``NUMBA_CUDA_DRIVER``);
* ``shell``: ``sh -c 'LD_LIBRARY_PATH=/usr/local/cuda/compat:$LD_LIBRARY_PATH exec app'``;
* ``numba``: ``dlopen("libcuda.so")`` with a vLLM-style drop-in naming the compat dir.

compat-hook puts the host's libcuda in the compat file's place (a read-only bind mount: the
runtime wrapper's spec mount, the hook's mount at createContainer), so a road that names the
compat file maps the host's library under that name. The probe tells files apart by
``st_dev:st_ino`` and ``cuDriverGetVersion``, never by name: each start must map the very file
the host's ``libcuda.so.555`` is. On a 535 data-center host compat is chosen, and the absolute
road still maps the compat driver (nothing is masked then). And a host driver dir whose path
merely starts with the word (``/opt/compat-tools/hostlibs``, ``/srv/compatibility/lib``: the image's
multiarch dir links there) is the host's dir, not a compat dir: the log names it and the host's
library maps there.
"""

from __future__ import annotations

import os

import pytest

from tests.support import debs, hookenv
from tests.support.loaderbox import DATA_CENTER, Box, Image
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

pytestmark = pytest.mark.containers

CUDA = debs.EXPECTED_CUDA
#: PROBE_ID: the probe also prints the mapped file's st_dev:st_ino
GPU_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all", "PROBE_ID=1"]
C124 = "/usr/local/cuda-12.4"
COMPAT = "/usr/local/cuda/compat"
LIB550 = f"libcuda.so.{COMPAT_550}"
PROBE = "/usr/local/bin/probe"


def _image(**kw) -> Image:
    kw.setdefault("env", list(GPU_ENV))
    return Image(libs={f"{C124}/compat": COMPAT_550}, links={"/usr/local/cuda": "cuda-12.4"}, **kw)


ROADS = {
    "rpath": lambda: _image(rpath_probe=("/usr/local/bin/probe-rpath", COMPAT), args=["/usr/local/bin/probe-rpath"]),
    "preload": lambda: _image(env=[*GPU_ENV, f"LD_PRELOAD={COMPAT}/libcuda.so.1"]),
    "ld-so-preload": lambda: _image(files={"/etc/ld.so.preload": f"{COMPAT}/libcuda.so.1\n"}),
    "absolute": lambda: _image(args=[PROBE, f"{COMPAT}/libcuda.so.1"]),
    "shell": lambda: _image(args=["/bin/sh", "-c", f"LD_LIBRARY_PATH={COMPAT}:$LD_LIBRARY_PATH exec {PROBE}"]),
    "numba": lambda: _image(files={"/etc/ld.so.conf.d/cuda-compat.conf": f"{C124}/compat\n"},
                            args=[PROBE, "libcuda.so"]),
}


@pytest.fixture(scope="module")
def libcuda() -> dict:
    return {v: debs.libcuda(v) for v in (COMPAT_550, HOST_535, HOST_555)}



def file_id(path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def start(b: Box, through: str):
    if through.startswith("wrapper"):
        return b.wrapper()
    return b.hook(through.split("-", 1)[1])


def box(tmp_path, libcuda, host, image, through) -> Box:
    """A Box whose wrapper runs in env mode for ``wrapper-env``, else the default (ldconfig)."""
    mode = {"mode": "env"} if through == "wrapper-env" else {}
    return Box(tmp_path, libcuda, host, image, model=DATA_CENTER, **mode)


def last_record(b: Box) -> dict:
    recs = [r for r in hookenv.read_log(b.log) if r.get("container_id") == b.last.container_id]
    return ([r for r in recs if r.get("event") == "hook"] or recs or [{}])[-1]


#: the runtime wrapper in ldconfig mode (the default) and env mode, the hook under runc and crun
THROUGH = ["wrapper", "wrapper-env", "hook-runc", "hook-crun"]


@pytest.mark.parametrize("through", THROUGH)
@pytest.mark.parametrize("road", list(ROADS))
def test_the_host_library_by_every_road(tmp_path, libcuda, boxes, road, through):
    b = box(tmp_path, libcuda, HOST_555, ROADS[road](), through)
    boxes.append(b)
    alone = b.alone()  # the road is real: without compat-hook it reaches the compat driver
    assert alone.cuda == CUDA[COMPAT_550], (alone.pair(), alone.error)
    got = start(b, through)
    assert (got.cuda, got.id) == (CUDA[HOST_555], file_id(libcuda[HOST_555])), (
        f"{road} through {through} mapped {got.pair()} id {got.id} ({got.error or 'ok'}), "
        f"must map the host's libcuda {HOST_555}; compat-hook: {b.why()}")
    rec = last_record(b)
    assert rec.get("effect") == "host", rec
    # the log says what took the compat file's place
    over = rec.get("host_over_compat") or []
    wrapper_recs = [r for r in b.records("runtime") if r.get("container_id") == b.last.container_id]
    said = over + [x for r in wrapper_recs for x in r.get("host_over_compat") or []]
    assert any(x.startswith(f"{C124}/compat/{LIB550} <- ") for x in said), (rec, wrapper_recs)


def test_explain_names_what_takes_the_compat_files_place(tmp_path, libcuda, boxes):
    img = _image()
    img.files = {f"{C124}/compat/libnvidia-ptxjitcompiler.so.{COMPAT_550}": "not the host's\n"}
    b = Box(tmp_path, libcuda, HOST_555, img, model=DATA_CENTER)
    boxes.append(b)
    report = b.explain(b.fresh("explain"))
    target = f"{C124}/compat/{LIB550}"
    wrapper, hook = report["effects"]["wrapper"], report["effects"]["hook"]
    # the wrapper adds compat-hook's createContainer hook, which decides again on the image's own compat
    # files and then puts the host's library over them (a spec mount would hand it the host's file to read)
    assert any(e.startswith("added createContainer hook") for e in wrapper), wrapper
    assert not any(f"at {target}" in e for e in wrapper), wrapper
    assert any(f"over {target} (ro, createContainer): the host's libcuda" in e for e in hook), hook
    # the companion has no host file of the host's version in the fake host: /dev/null covers it
    comp = f"{C124}/compat/libnvidia-ptxjitcompiler.so.{COMPAT_550}"
    assert f"bind-mount /dev/null over {comp} (ro, createContainer): a compat companion masked" in hook, hook


@pytest.mark.parametrize("through", THROUGH)
def test_compat_chosen_is_not_masked(tmp_path, libcuda, boxes, through):
    """A 535 data-center host gets the compat driver, by its absolute path too: nothing is masked."""
    b = box(tmp_path, libcuda, HOST_535, ROADS["absolute"](), through)
    boxes.append(b)
    got = start(b, through)
    assert (got.cuda, got.path) == (CUDA[COMPAT_550], f"{C124}/compat/{LIB550}"), (got.pair(), got.error, b.why())
    rec = last_record(b)
    assert rec.get("effect") == "compat" and not rec.get("host_over_compat"), rec


#: the image's multiarch dir is a link into a dir whose path merely starts with the word "compat"
NOT_COMPAT = {"compat-tools": "/opt/compat-tools/hostlibs", "compatibility": "/srv/compatibility/lib"}


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("where", list(NOT_COMPAT))
def test_a_dir_named_like_compat_is_the_hosts(tmp_path, libcuda, boxes, where, runtime):
    """The runtime mounts the host's driver into the multiarch dir, which the image links to
    /opt/compat-tools/hostlibs (or /srv/compatibility/lib): that dir is no compat dir
    (imagefacts.in_compat_dir), so compat-hook names it as the host driver's dir, and the container maps the
    host's 555 there, where the image's drop-in alone makes the compat 550 map."""
    from tests.support import rootfs

    real = NOT_COMPAT[where]
    b = Box(tmp_path, libcuda, HOST_555,
            _image(files={"/etc/ld.so.conf.d/cuda-compat.conf": f"{C124}/compat\n"}), model=DATA_CENTER)
    boxes.append(b)
    multiarch = b.pristine / "usr/lib/x86_64-linux-gnu"
    (b.pristine / real.lstrip("/")).parent.mkdir(parents=True)
    os.rename(multiarch, b.pristine / real.lstrip("/"))
    # relative: the stand-in's mount, made through the host's view of the rootfs, stays inside it
    os.symlink(os.path.relpath(real, "/usr/lib"), multiarch)
    rootfs.run_ldconfig(b.pristine)
    alone = b.alone(runtime)  # the layout is real: the image's drop-in, read first, leads to the compat driver
    assert alone.cuda == CUDA[COMPAT_550], (alone.pair(), alone.error)
    got = b.hook(runtime)
    host_file = f"{real}/libcuda.so.{HOST_555}"
    assert (got.cuda, got.path, got.id) == (CUDA[HOST_555], host_file, file_id(libcuda[HOST_555])), (
        got.pair(), got.id, got.error, b.why())
    rec = last_record(b)
    assert rec.get("effect") == "host" and rec.get("host_lib_dir") == real and rec.get("maps") == host_file, rec
