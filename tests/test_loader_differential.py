"""explain against the loader, over generated layouts, in real runc and crun containers (issue 32).

A seeded generator (:func:`generate`) draws layouts from the places images put a compat libcuda:
the toolkit's ``/usr/local/cuda-12.X/compat`` (with or without ``/usr/local/cuda``), NGC's
``compat/lib.real`` (through ``/etc/alternatives``, the ``lib`` link kept or removed after the
build's ldconfig, its ``00-cuda-compat.conf`` or not), pixi and micromamba 2 environments (links in
the env's ``lib`` or not, a probe built with ``DT_RUNPATH $ORIGIN/../lib`` in its ``bin`` or not),
conda's ``/opt/conda/cuda-compat``, ``/opt/nvidia/compat`` behind a drop-in, and a dir on an
``/etc/ld.so.conf`` line before or after its ``include``; one or two of them, the 550 or the 555
driver in each; extra drop-ins under sorting-sensitive names; ``LD_LIBRARY_PATH`` with compat
entries in any spelling, non-compat entries before them, missing dirs and the host driver's own
dir; a 470, 535 or 555 host with a data-center GPU or a GeForce; hook under runc or crun; the
wrapper in ldconfig, env or both mode. In a share of the layouts with one compat place the process
also takes a road that does not search (:data:`ROADS`): the app built with ``DT_RPATH`` naming the
compat dir, ``LD_PRELOAD`` or ``/etc/ld.so.preload`` naming the compat file, an absolute
``dlopen`` of it, a shell prepending the compat dir to ``LD_LIBRARY_PATH`` after every hook ran.
Independently of the roads, a share of all layouts (``COMPAT_HOOK_LOADER_VARIANTS``, default 0.15
each) also takes one or more of :data:`VARIANTS` (issue 42): ``stubs``, ``LD_LIBRARY_PATH`` naming a
toolkit's ``lib64/stubs`` (through ``/usr/local/cuda`` or not; first or anywhere) that holds a
link-time stub ``libcuda.so.1``; ``userland``, the image's own ``libcuda.so.<550 or 555>`` with its
``libcuda.so.1`` link in ``/usr/lib/x86_64-linux-gnu``, beside the host's; ``gke``, the host's driver
mounted at ``/usr/local/nvidia/lib64`` (a device plugin's stand-in, no ldconfig) and
``/usr/local/nvidia/lib:/usr/local/nvidia/lib64`` on ``LD_LIBRARY_PATH`` before or after the
layout's own entries; ``readonly``, ``root.readonly: true``; ``userns``, a user namespace. Roads and
variants come from streams of their own, so each seed's places, hosts and runtimes stay as they were.

For each layout:

1. without compat-hook, the container maps what glibc's search order says (:func:`glibc_maps`, an
   independent model of ld.so(8) and ldconfig(8)): a check of the generator, never of compat-hook;
2. ``explain --json``'s ``toolkit.with_hook`` prediction (result and resolved compat dir) equals
   what a container started with the hook at createContainer maps;
3. ``toolkit.with_wrapper`` equals what a container started through the runtime wrapper maps;
4. compat-hook's log (the last record for each container: ``effect`` and ``compat_dir``) says the same;
5. on a road, the driver the process maps (``cuDriverGetVersion``, not the file's name: the host's
   library takes a compat file's place under its name) is the one the logged ``effect`` chose:
   the host's for ``host``, the compat driver for ``compat``; where compat-hook stayed out, what the
   road maps without it;
6. where a record says its decision is not in effect (``not_in_effect``: a read-only root it could
   not rebuild the ld cache of), the probe maps the file its ``maps_instead`` names (and the record
   says no ``maps``); in a user namespace each start has its log line (the hook's, spooled by the
   mapped root and merged as the next start on the host merges it).

A mapped stub (``cuDriverGetVersion`` answers ``CUDA_ERROR_STUB_LIBRARY``) counts as ``("stub",
dir)``: no driver at all, whatever either side said.

``COMPAT_HOOK_LOADER_LAYOUTS`` (default 60) sets how many layouts run, ``COMPAT_HOOK_LOADER_SEED``
(default 32) the seed. The places are drawn with weights (NGC most, conda least). The test prints
how many ran and agreed (and how many took each variant), every disagreement, writes every layout and
outcome to ``loader-differential.json`` in its tmp dir, and asserts that all of them ran.
"""

from __future__ import annotations

import glob as globmod
import json
import os
import random

import pytest

from tests.support import debs, runtimes as rt
from tests.support.loaderbox import (BRANDS, MAPPED, PIXI_TOML, SYS, Box, Image, build_stub, host_lib, outcome,
                                     predicted, resolve)
from tests.support.versions import COMPAT_550, HOST_470, HOST_535, HOST_555

pytestmark = [pytest.mark.containers, pytest.mark.slow]

N = int(os.environ.get("COMPAT_HOOK_LOADER_LAYOUTS", "60"))
SEED = int(os.environ.get("COMPAT_HOOK_LOADER_SEED", "32"))
CUDA_DIR = {COMPAT_550: "/usr/local/cuda-12.4", HOST_555: "/usr/local/cuda-12.5"}
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Roads to libcuda that do not search, and the share of one-place layouts that take one.
ROADS = ("rpath", "preload", "ld-so-preload", "absolute", "shell")
ROAD_SHARE = float(os.environ.get("COMPAT_HOOK_LOADER_ROADS", "0.4"))
RPATH_PROBE = "/usr/local/bin/probe-rpath"
#: What a layout may also carry or start with (:func:`_variants`, its own stream again), and the share
#: of layouts that take each (independently of each other and of the roads).
VARIANTS = ("stubs", "userland", "gke", "readonly", "userns")
VARIANT_SHARE = float(os.environ.get("COMPAT_HOOK_LOADER_VARIANTS", "0.15"))
#: Where a device plugin mounts the host's driver on GKE, and the LD_LIBRARY_PATH CUDA images set for it.
NV = "/usr/local/nvidia/lib64"
NV_PATH = ["/usr/local/nvidia/lib", NV]


@pytest.fixture(scope="module")
def libcuda() -> dict:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    return build_stub(tmp_path_factory.mktemp("stub"))


# --------------------------------------------------------------------------- the generator


class Draft:
    """An :class:`Image` being drawn, and the names its compat dirs go by."""

    def __init__(self) -> None:
        # PROBE_ID: the probe says which file it mapped (st_dev:st_ino), so the host's library under a compat
        # file's name counts as the host's (loaderbox.outcome)
        self.image = Image(env=["NVIDIA_VISIBLE_DEVICES=all", "PROBE_ID=1"])
        self.path = [BASE_PATH]
        self.compat_names: list = []  # spellings of compat dirs (for drop-ins and LD_LIBRARY_PATH)
        self.lib_names: list = []  # env lib dirs holding links (LD_LIBRARY_PATH only)
        self.notes: list = []

    def dropin(self, name: str, text: str) -> None:
        p = f"/etc/ld.so.conf.d/{name}"
        self.image.files[p] = self.image.files.get(p, "") + text


def _toolkit(d: Draft, rng: random.Random, ver: str) -> None:
    base = CUDA_DIR[ver]
    d.image.libs[f"{base}/compat"] = ver
    d.compat_names.append(f"{base}/compat")
    if "/usr/local/cuda" not in d.image.links and rng.random() < 0.7:
        d.image.links["/usr/local/cuda"] = os.path.basename(base)
        d.compat_names.append("/usr/local/cuda/compat")
    d.notes.append(f"toolkit {base}/compat ({ver})")


def _ngc(d: Draft, rng: random.Random, ver: str) -> None:
    base = CUDA_DIR[ver]
    d.image.libs[f"{base}/compat/lib.real"] = ver
    d.image.links[f"{base}/compat/lib"] = "lib.real"
    kept = rng.random() < 0.5
    if not kept:
        d.image.after_ldconfig.append(f"{base}/compat/lib")
    d.compat_names += [f"{base}/compat/lib.real", f"{base}/compat/lib"]
    if "/usr/local/cuda" not in d.image.links:
        d.image.links["/etc/alternatives/cuda"] = base
        d.image.links["/usr/local/cuda"] = "/etc/alternatives/cuda"
        d.compat_names += ["/usr/local/cuda/compat/lib", "/usr/local/cuda/compat/lib.real"]
        if rng.random() < 0.8:
            d.dropin("00-cuda-compat.conf", "/usr/local/cuda/compat/lib\n")
    elif rng.random() < 0.8:
        d.dropin("00-cuda-compat.conf", f"{base}/compat/lib\n")
    d.notes.append(f"ngc {base}/compat/lib.real ({ver}, lib link {'kept' if kept else 'removed'})")


def _prefix(d: Draft, rng: random.Random, ver: str, prefix: str, kind: str) -> None:
    d.image.libs[f"{prefix}/cuda-compat"] = ver
    d.image.files[f"{prefix}/conda-meta/cuda-compat-impl-{ver}-h0_0.json"] = json.dumps(
        {"name": "cuda-compat-impl", "version": ver, "files": [f"cuda-compat/libcuda.so.{ver}"]}) + "\n"
    d.compat_names.append(f"{prefix}/cuda-compat")
    links = rng.random() < 0.75
    if links:
        rel = rng.random() < 0.5
        for n in ("libcuda.so", "libcuda.so.1", f"libcuda.so.{ver}"):
            d.image.links[f"{prefix}/lib/{n}"] = ("../cuda-compat/" if rel else f"{prefix}/cuda-compat/") + n
        d.lib_names.append(f"{prefix}/lib")
    probe = links and d.image.runpath_probe is None and rng.random() < 0.7
    if probe:
        d.image.runpath_probe = f"{prefix}/bin/probe"
        d.image.args = [f"{prefix}/bin/probe"]
    if rng.random() < 0.6:
        d.path.insert(0, f"{prefix}/bin")
    d.notes.append(f"{kind} {prefix}/cuda-compat ({ver}, links {'yes' if links else 'no'}, "
                   f"runpath probe {'yes' if probe else 'no'})")


def _pixi(d: Draft, rng: random.Random, ver: str) -> None:
    env = rng.choice(["default", "cuda", "prod"])
    d.image.files["/app/pixi.toml"] = PIXI_TOML
    d.image.cwd = rng.choice(["/app", "/"])
    _prefix(d, rng, ver, f"/app/.pixi/envs/{env}", "pixi")


def _mamba(d: Draft, rng: random.Random, ver: str) -> None:
    user = rng.choice(["mambauser", "app"])
    d.image.passwd.append(f"{user}:x:1000:1000::/home/{user}:/bin/sh")
    if rng.random() < 0.6:
        d.image.uid = 1000
    _prefix(d, rng, ver, f"/home/{user}/.local/share/mamba/envs/{rng.choice(['x', 'base-cuda'])}", "micromamba")


def _conda(d: Draft, rng: random.Random, ver: str) -> None:
    _prefix(d, rng, ver, "/opt/conda", "conda")
    if rng.random() < 0.5:
        d.image.env.append("CONDA_PREFIX=/opt/conda")


def _opt_nvidia(d: Draft, rng: random.Random, ver: str) -> None:
    d.image.libs["/opt/nvidia/compat"] = ver
    d.compat_names.append("/opt/nvidia/compat")
    if rng.random() < 0.8:
        d.dropin("nvidia-compat.conf", "/opt/nvidia/compat\n")
    d.notes.append(f"/opt/nvidia/compat ({ver})")


def _ld_so_conf(d: Draft, rng: random.Random, ver: str) -> None:
    d.image.libs["/opt/compat/lib"] = ver
    d.compat_names.append("/opt/compat/lib")
    before = rng.random() < 0.7
    inc = "include /etc/ld.so.conf.d/*.conf\n"
    d.image.ld_so_conf = ("/opt/compat/lib\n" + inc) if before else (inc + "/opt/compat/lib\n")
    d.notes.append(f"/opt/compat/lib ({ver}) in /etc/ld.so.conf {'before' if before else 'after'} its include")


PLACES = {"toolkit": _toolkit, "ngc": _ngc, "pixi": _pixi, "micromamba": _mamba, "conda": _conda,
          "opt-nvidia": _opt_nvidia, "ld.so.conf": _ld_so_conf}
PLACE_WEIGHT = {"toolkit": 2, "ngc": 3, "pixi": 2, "micromamba": 2, "conda": 1, "opt-nvidia": 1.5, "ld.so.conf": 1.5}
DROPIN_NAMES = ("00-cuda-compat.conf", "cuda-compat.conf", "zzz-cuda-compat.conf", "nvidia.conf", "y-compat.conf")
NOISE = ("/usr/local/nvidia/lib64", "/usr/local/lib", "/usr/local/cuda-12.9/compat", SYS)


def generate(rng: random.Random, roads: random.Random | None = None, variants: random.Random | None = None,
             stub=None) -> dict:
    """One layout: the image, the host (driver, brand), the hook's runtime and the wrapper's mode.

    ``roads``: the draw of a road (its own stream, so that adding roads left the seed's layouts as
    they were); ``variants``: the draw of :data:`VARIANTS` (another stream, for the same reason),
    ``stub`` the link-time stub file the ``stubs`` variant copies into the image."""
    d = Draft()
    places: list = []
    want = rng.choice([1, 1, 1, 2])
    while len(places) < want:  # weighted to the places images use most (NGC, the toolkit's, envs)
        p = rng.choices(sorted(PLACES), weights=[PLACE_WEIGHT[k] for k in sorted(PLACES)])[0]
        if p not in places:
            places.append(p)
    if "toolkit" in places and "ngc" in places and rng.random() < 0.5:
        places.reverse()  # which of the two owns /usr/local/cuda
    for i, place in enumerate(places):
        PLACES[place](d, rng, COMPAT_550 if i == 0 else rng.choice([COMPAT_550, HOST_555]))
    if d.compat_names and rng.random() < 0.3:
        name, named = rng.choice(DROPIN_NAMES), rng.choice(d.compat_names)
        d.dropin(name, named + "\n")
        d.notes.append(f"/etc/ld.so.conf.d/{name} names {named}")
    road = None
    if roads is not None and len(places) == 1 and roads.random() < ROAD_SHARE:
        road = _road(d, roads)
    if rng.random() < 0.55:
        pool = d.compat_names + d.lib_names
        entries = rng.sample(pool, min(len(pool), rng.choice([1, 1, 2])))
        entries += rng.sample(NOISE, rng.choice([0, 0, 1, 2]))
        rng.shuffle(entries)
        d.image.env.append("LD_LIBRARY_PATH=" + ":".join(entries))
    d.image.env.insert(0, "PATH=" + ":".join(d.path))
    host = rng.choice([HOST_470, HOST_535, HOST_555])
    brand = rng.choices(["dc", "geforce"], weights=[3, 1])[0]
    case = {"image": d.image, "host": host, "brand": brand, "places": d.notes, "road": road,
            "runtime": rng.choice(["runc", "crun"]), "mode": rng.choice(["ldconfig", "env", "both"]),
            "variants": [], "stub": None, "host_dir": None, "userland": None}
    if variants is not None:
        _variants(case, d, variants, stub)
    return case


def _ld_library_path(image: Image) -> list:
    for e in image.env:
        if e.startswith("LD_LIBRARY_PATH="):
            return e.split("=", 1)[1].split(":")
    return []


def _set_ld_library_path(image: Image, entries: list) -> None:
    image.env = [e for e in image.env if not e.startswith("LD_LIBRARY_PATH=")] + [
        "LD_LIBRARY_PATH=" + ":".join(entries)]


def _variants(case: dict, d: Draft, rng: random.Random, stub) -> None:
    """What else the layout carries or starts with, each drawn on its own (every draw made for every
    layout, so that each layout's draws stay where they were whatever the earlier layouts took):

    * ``stubs``: ``LD_LIBRARY_PATH`` names a CUDA toolkit's ``lib64/stubs`` (through ``/usr/local/cuda``
      or not) holding a link-time stub ``libcuda.so.1``;
    * ``userland``: the image carries its own userland driver (``libcuda.so.<550 or 555>`` and its
      ``libcuda.so.1`` link) in ``/usr/lib/x86_64-linux-gnu``, where the host's is mounted too;
    * ``gke``: the host's driver is mounted at ``/usr/local/nvidia/lib64`` (a device plugin's, no
      ldconfig), and ``LD_LIBRARY_PATH`` names ``/usr/local/nvidia/lib:/usr/local/nvidia/lib64``
      before or after the layout's own entries;
    * ``readonly``: ``root.readonly: true``; ``userns``: a user namespace (root mapped to MAPPED).
    """
    draws = {v: rng.random() for v in VARIANTS}
    detail = [rng.random() for _ in range(5)]  # one draw per choice: no two choices tied to each other
    image = d.image
    if draws["stubs"] < VARIANT_SHARE:
        cuda = image.links.get("/usr/local/cuda")
        if cuda is not None:
            cuda = image.links.get(cuda, cuda)
            base = cuda if cuda.startswith("/") else "/usr/local/" + cuda
            named = "/usr/local/cuda/lib64/stubs" if detail[0] < 0.5 else f"{base}/lib64/stubs"
        else:
            base = sorted(CUDA_DIR.values())[int(detail[0] * 2)]
            named = f"{base}/lib64/stubs"
        image.copies[f"{base}/lib64/stubs/libcuda.so.1"] = stub
        entries = _ld_library_path(image)
        entries.insert(0 if detail[1] < 0.5 else int(detail[3] * (len(entries) + 1)), named)  # first, or anywhere
        _set_ld_library_path(image, entries)
        case["stub"] = f"{base}/lib64/stubs/libcuda.so.1"
        d.notes.append(f"stubs {named}")
        case["variants"].append("stubs")
    if draws["userland"] < VARIANT_SHARE:
        ver = COMPAT_550 if detail[2] < 0.5 else HOST_555
        image.libs[SYS] = ver
        case["userland"] = ver
        d.notes.append(f"userland libcuda.so.{ver} in {SYS}")
        case["variants"].append("userland")
    if draws["gke"] < VARIANT_SHARE:
        case["host_dir"] = NV
        own = [e for e in _ld_library_path(image) if e]
        _set_ld_library_path(image, (NV_PATH + own) if detail[4] < 0.5 else (own + NV_PATH))
        d.notes.append(f"host driver at {NV}")
        case["variants"].append("gke")
    if draws["readonly"] < VARIANT_SHARE:
        image.readonly = True
        d.notes.append("read-only root")
        case["variants"].append("readonly")
    if draws["userns"] < VARIANT_SHARE:
        image.userns = True
        d.notes.append(f"user namespace (root is {MAPPED})")
        case["variants"].append("userns")


def _road(d: Draft, rng: random.Random) -> tuple:
    """The process also reaches the compat file of the layout's one place by a road that does not search:
    ``(road, dir or file, compat version)``."""
    libdir, ver = next(iter(d.image.libs.items()))
    f = f"{libdir}/libcuda.so.{ver}"  # the regular file: no link the layout may remove leads to it
    road = rng.choice([r for r in ROADS if r != "rpath" or d.image.runpath_probe is None])
    if road == "rpath":
        d.image.rpath_probe = (RPATH_PROBE, libdir)
        d.image.args = [RPATH_PROBE]
        named = libdir
    elif road == "preload":
        d.image.env.append(f"LD_PRELOAD={f}")
        named = f
    elif road == "ld-so-preload":
        d.image.files["/etc/ld.so.preload"] = f + "\n"
        named = f
    elif road == "absolute":
        d.image.args = [d.image.args[0], f]
        named = f
    else:  # the manual fix compat-hook replaces, run after every hook: nothing in the spec shows it
        d.image.args = ["/bin/sh", "-c", f"LD_LIBRARY_PATH={libdir}:$LD_LIBRARY_PATH exec {d.image.args[0]}"]
        named = libdir
    d.notes.append(f"road {road} naming {named}")
    return road, named, ver


# --------------------------------------------------------------------------- glibc's order


def conf_dirs(root, conf: str = "/etc/ld.so.conf", depth: int = 0) -> list:
    """The dirs ldconfig(8) caches, in its order: ``/etc/ld.so.conf`` line by line, an ``include``
    expanded in place (glob order), then the trusted dirs."""
    out: list = []
    p = root / conf.lstrip("/")
    if depth > 8 or not p.is_file():
        return out
    for line in p.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include "):
            for pat in line.split()[1:]:
                for f in sorted(globmod.glob(str(root) + pat)):
                    out += conf_dirs(root, f[len(str(root)):], depth + 1)
        else:
            out.append(line)
    return out + (["/lib/x86_64-linux-gnu", SYS] if depth == 0 else [])


def _version(name: str) -> tuple:
    return tuple(int(x) for x in name.rsplit("libcuda.so.", 1)[1].split("."))


def glibc_maps(root, image: Image, host: str, road: tuple | None = None, host_dir: str | None = None) -> str | None:
    """The file ``dlopen("libcuda.so.1")`` maps in a start of ``image`` on ``host`` without compat-hook
    (the toolkit stand-in has mounted the host library and run ldconfig): LD_LIBRARY_PATH, then the
    probe's DT_RUNPATH, then the ld cache; on a road (:func:`_road`), the file it names.

    The host's library sits beside an image's own userland driver in the system dir, where ldconfig
    links ``libcuda.so.1`` to the higher version. ``host_dir``: a device plugin mounted the host's
    library there instead (and ran no ldconfig: the ld cache is the image's build-time one, so an
    entry whose dir the build removed fails, and the loader falls back to the trusted dirs)."""
    def lib_in(d: str):
        if not d.startswith("/"):
            return None
        if host_dir is not None and os.path.normpath(d) == host_dir:
            return f"{host_dir}/libcuda.so.{host}"
        r = resolve(root, d)
        if r is None:
            return None
        if r == SYS and host_dir is None:
            userland = [n for n in os.listdir(root / SYS.lstrip("/")) if n.startswith("libcuda.so.")
                        and n.count(".") > 2 and not os.path.islink(root / SYS.lstrip("/") / n)]
            return f"{SYS}/" + max([f"libcuda.so.{host}", *userland], key=_version)
        return resolve(root, r + "/libcuda.so.1")

    def stale(d: str) -> bool:  # an ld cache entry of the build, its dir removed after the build's ldconfig
        parent = resolve(root, os.path.dirname(d))
        return host_dir is not None and parent is not None and \
            parent.rstrip("/") + "/" + os.path.basename(d) in image.after_ldconfig

    env = dict(e.split("=", 1) for e in image.env)
    if road is not None:  # a preload, an absolute dlopen: that file; an RPATH, a prepended dir: its libcuda.so.1
        name, named, _ = road
        return resolve(root, named if name in ("preload", "ld-so-preload", "absolute") else named + "/libcuda.so.1")
    dirs = [x for x in env.get("LD_LIBRARY_PATH", "").replace(";", ":").split(":") if x]
    if image.runpath_probe is not None and image.args[0] == image.runpath_probe:
        dirs.append(os.path.dirname(os.path.dirname(image.runpath_probe)) + "/lib")
    for d in dirs:
        got = lib_in(d)
        if got is not None:
            return got
    for d in conf_dirs(root):
        if stale(d):
            return lib_in("/lib/x86_64-linux-gnu") or lib_in(SYS)
        got = lib_in(d)
        if got is not None:
            return got
    return None


# --------------------------------------------------------------------------- the test


def describe(case: dict) -> str:
    img = case["image"]
    env = [e for e in img.env if e.startswith(("LD_LIBRARY_PATH=", "CONDA_PREFIX=", "PATH="))]
    drop = [f"{k.rsplit('/', 1)[1]}: {v.strip()}" for k, v in img.files.items() if k.startswith("/etc/ld.so.conf.d/")]
    return (f"host {case['host']} {case['brand']}; {'; '.join(case['places'])}; drop-ins {drop}; {env}; "
            f"args {img.args} cwd {img.cwd} uid {img.uid}; runtime {case['runtime']} mode {case['mode']}")


def test_explain_predicts_what_the_loader_maps(tmp_path, libcuda, stub):
    rng, roads_rng, variants_rng = random.Random(SEED), random.Random(SEED + 1), random.Random(SEED + 2)
    rows, layout_bugs, wrong, log_wrong, toolkit_only, roads, road_wrong = [], [], [], [], [], [], []
    variants: dict = {v: 0 for v in VARIANTS}
    not_in_effect, variant_wrong = [], []
    for i in range(N):
        case = generate(rng, roads_rng, variants_rng, stub)
        for v in case["variants"]:
            variants[v] += 1
        b = Box(tmp_path / f"l{i:03d}", libcuda, case["host"], case["image"], model=BRANDS[case["brand"]],
                mode=case["mode"], host_dir=case["host_dir"])
        _started.append(b.started)
        row = {"i": i, "layout": describe(case), "runtime": case["runtime"], "mode": case["mode"],
               "variants": case["variants"]}
        alone = b.alone(case["runtime"])
        want = glibc_maps(b.pristine, case["image"], case["host"], case["road"], case["host_dir"])
        row["alone"] = alone.path
        # the stub maps, and answers CUDA_ERROR_STUB_LIBRARY
        stubbed = want is not None and want == case["stub"] and "returned 34" in alone.error
        if alone.path != want or (alone.error and not stubbed):
            layout_bugs.append(f"#{i}: alone mapped {alone.path} {alone.error}, glibc's order says {want}: "
                               f"{row['layout']}")
        root = b.fresh("hook")
        try:
            report = b.explain(root)
        except AssertionError as e:  # recorded as a disagreement of both predictions, the loop goes on
            report = {"toolkit": {}, "explain_error": str(e)}
            row["explain_error"] = str(e)
        for actor, start in (("with_hook", lambda r: b.hook(case["runtime"], r)), ("with_wrapper", b.wrapper)):
            where = root if actor == "with_hook" else b.fresh("wrapper")
            got = start(where)
            said, real = predicted(report, actor), outcome(got, case["host"], where, libcuda[case["host"]])
            if case["stub"] is not None and got.path == case["stub"] and "returned 34" in got.error:
                real = ("stub", os.path.dirname(got.path))  # the link-time stub mapped: no driver at all
            # the image's own userland driver in the system dir (not the host's file under its name):
            # explain says so by the file its ``host`` result maps
            if real == ("compat", SYS):
                real = ("userland", SYS)
            said_maps = ((report.get("toolkit") or {}).get(actor) or {}).get("maps") or ""
            if said == ("host", None) and os.path.dirname(said_maps) == SYS and said_maps != host_lib(case["host"]):
                said = ("userland", SYS)
            recs = [r for r in b.log_records() if r.get("container_id") == b.last.container_id]
            last = ([r for r in recs if r.get("event") == "hook"] or recs or [{}])[-1]
            logged = (last.get("effect"), last.get("compat_dir") if last.get("effect") == "compat" else None)
            row[actor] = {"predicted": said, "mapped": real, "logged": logged, "path": got.path, "error": got.error}
            how = case["runtime"] if actor == "with_hook" else case["mode"]
            hooked = [r for r in recs if r.get("event") == "hook"]
            if case["image"].userns:
                # the hook runs as the mapped root, which the log is closed to: its line came by the spool
                if not recs or (actor == "with_hook" or case["mode"] != "env") and not hooked:
                    variant_wrong.append(f"#{i} {actor} ({how}): no log line for the user-namespaced start "
                                         f"({len(recs)} records): {row['layout']}")
                elif any(r.get("spooled_by_uid") != MAPPED for r in hooked):
                    variant_wrong.append(f"#{i} {actor} ({how}): a hook line not spooled by {MAPPED}: "
                                         f"{hooked}: {row['layout']}")
            if last.get("not_in_effect"):
                # the decision could not take effect (a read-only root): the line names what maps instead
                not_in_effect.append(f"#{i} {actor}")
                row[actor]["not_in_effect"] = [last.get("reason"), last.get("not_in_effect"), last.get("maps_instead")]
                if got.path != last.get("maps_instead") or "maps" in last:
                    variant_wrong.append(f"#{i} {actor} ({how}): the log says {last.get('reason')}, "
                                         f"{last.get('not_in_effect')} not in effect, maps instead "
                                         f"{last.get('maps_instead')}; mapped {got.path} ({got.error or 'ok'}): "
                                         f"{row['layout']}")
                continue
            if case["road"] is not None:
                # the effect holds by the road: the driver mapped is the chosen one, whatever the file's name
                road, _, ver = case["road"]
                cuda = debs.EXPECTED_CUDA
                chose = last.get("effect")
                want_cuda = {"host": cuda[case["host"]], "compat": cuda[ver]}.get(chose, alone.cuda)
                row[actor]["road"] = {"road": road, "effect": chose, "cuda": got.cuda, "want": want_cuda}
                roads.append(f"#{i} {actor}")
                if got.cuda != want_cuda:
                    road_wrong.append(f"#{i} {actor} ({how}): road {road}, the log's effect {chose} "
                                      f"({last.get('reason')}), mapped driver {got.cuda} [{got.path}] "
                                      f"({got.error or 'ok'}), want {want_cuda}: {row['layout']}")
                continue
            # the stand-in runs the toolkit's update-ldcache, not its enable-cuda-compat: a prediction
            # resting on that drop-in has nothing to compare with here (tests/test_toolkit_containers.py)
            if (report.get("toolkit", {}).get(actor) or {}).get("via") == "toolkit":
                toolkit_only.append(f"#{i} {actor}")
            elif said != real:
                wrong.append(f"#{i} {actor} ({how}): explain {said}, mapped {real} [{got.path}]: {row['layout']}")
            # a decision that cannot take effect on this path (the hook alone, in env mode or behind
            # an earlier host dir on LD_LIBRARY_PATH) must say so in the same line, never claim it
            owned = any("does not get the compat driver" in w or "the loader maps the host's" in w
                        for w in last.get("warnings", ()))
            # compat-hook stayed out because the loader can reach no compat libcuda: the host's maps
            nothing = logged == ("leave", None) and last.get("reason") == "no_candidate" and real == ("host", None)
            if logged != real and not owned and not nothing:
                log_wrong.append(f"#{i} {actor} ({how}): the log says {logged} ({last.get('reason')}; "
                                     f"warnings {last.get('warnings')}), "
                                 f"mapped {real}")
        rows.append(row)
        b.cleanup()
    (tmp_path / "loader-differential.json").write_text(json.dumps(rows, indent=1))
    searched = [r[a] for r in rows for a in ("with_hook", "with_wrapper") if "road" not in r[a]]
    agreed = sum(1 for x in searched if x["predicted"] == x["mapped"])
    logged = sum(1 for x in searched if x["logged"] == x["mapped"])
    print(f"loader differential: variants {variants}; {len(not_in_effect)} starts whose log said the decision "
          "was not in effect")
    print(f"loader differential: {len(rows)} layouts (seed {SEED}), {agreed}/{len(searched)} predictions "
          f"and {logged}/{len(searched)} log records of the starts that search agreed with the loader; {len(toolkit_only)} predictions "
          "rest on the toolkit's own enable-cuda-compat, which the stand-in does not run; "
          f"{len(roads) - len(road_wrong)}/{len(roads)} starts on a road that does not search mapped the chosen driver")
    for what, bad in (("layout", layout_bugs), ("prediction", wrong), ("log", log_wrong), ("road", road_wrong),
                      ("variant", variant_wrong)):
        for line in bad:  # every disagreement, whichever assertion below fails first
            print(f"loader differential: {what} disagrees: {line}")
    assert len(rows) == N, f"{len(rows)} of {N} layouts ran"
    assert not layout_bugs, "the generator's layouts do not load as glibc's order says:\n" + "\n".join(layout_bugs)
    assert not wrong, (f"{len(wrong)} of {2 * N} predictions disagree with the loader (seed {SEED}):\n"
                       + "\n".join(wrong))
    assert not log_wrong, (f"{len(log_wrong)} of {2 * N} log records disagree with the loader (seed {SEED}):\n"
                           + "\n".join(log_wrong))
    assert not variant_wrong, (f"{len(variant_wrong)} starts of a variant disagree (seed {SEED}):\n"
                               + "\n".join(variant_wrong))
    if N >= 40 and VARIANT_SHARE > 0:
        assert all(variants.values()), f"a variant no layout took: {variants}"
    assert roads, "no layout took a road that does not search"
    assert not road_wrong, (f"{len(road_wrong)} of {len(roads)} starts on a road mapped another driver than the "
                            f"one compat-hook chose (seed {SEED}):\n" + "\n".join(road_wrong))


_started: list = []


# Keep last: pytest runs a module's tests in file order.
def test_nothing_left_behind(tmp_path_factory):
    assert any(_started), "no container ran"
    assert rt.mounts_under(tmp_path_factory.getbasetemp()) == []
    assert [d for d in rt.STATE_DIRS if d.exists()] == []
