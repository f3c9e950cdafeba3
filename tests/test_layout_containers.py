"""Compat layouts beyond ``/usr/local/cuda/compat`` in real runc and crun containers (issue 27).

Real Debian libcuda builds (535 an older host, 550 a compat driver, 555 a newer host or a
newer compat driver), the harness rootfs and probe (``dlopen("libcuda.so.1")``, then the
path the loader mapped and ``cuDriverGetVersion``). The host's library comes in through the
NVIDIA toolkit stand-in (a prestart hook bind-mounting it at its versioned name and running
``ldconfig -r``); compat-hook runs as the hook alone (createContainer, and prestart where it
can only warn) or through its runtime wrapper (ldconfig, env and both modes). Each case first
runs without compat-hook, to show what the layout loads on its own.

* conda's ``cuda-compat`` package in ``/opt/conda/cuda-compat``: links baked into
  ``/opt/conda/lib`` and a binary built as conda builds them (RUNPATH ``$ORIGIN/../lib``),
  ``LD_LIBRARY_PATH=/opt/conda/lib``, ``LD_LIBRARY_PATH=/opt/conda/cuda-compat``;
* two versioned compat dirs, ``/usr/local/cuda -> cuda-12.5`` (the 555 compat driver) and
  ``LD_LIBRARY_PATH=/usr/local/cuda-12.4/compat`` (550): the one the decision chooses loads.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from compat_hook.core import registration
from compat_hook.install.wrapper import render_wrapper
from tests.support import debs, hookenv, rootfs, runtimes as rt
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

pytestmark = pytest.mark.containers

SYS = "/usr/lib/x86_64-linux-gnu"
PREFIX = "/opt/conda"
CONDA_COMPAT = f"{PREFIX}/cuda-compat"
C124, C125 = "/usr/local/cuda-12.4/compat", "/usr/local/cuda-12.5/compat"
PROBE, CONDA_PROBE = "/usr/local/bin/probe", f"{PREFIX}/bin/probe"
CUDA = debs.EXPECTED_CUDA  # version -> cuDriverGetVersion
PY = "/usr/bin/python3"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
GPU_ENV = list(rt.DEFAULT_ENV)

_started: list = []


@pytest.fixture(scope="module")
def libs() -> dict:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


def host_lib(version: str) -> str:
    return f"{SYS}/libcuda.so.{version}"


def install(root: pathlib.Path, lib: pathlib.Path, rel_dir: str) -> None:
    """The compat package's files: ``libcuda.so.<ver>`` and its two links, as NVIDIA and conda ship them."""
    rootfs.install_libcuda(root, lib, rel_dir)


def conda_image(root: pathlib.Path, libs: dict, *, links: bool) -> None:
    """conda-forge's cuda-compat 550 in /opt/conda; with ``links``, the activation script's links
    baked into /opt/conda/lib (an image built with the env active); a probe built as conda builds."""
    install(root, libs[COMPAT_550], CONDA_COMPAT)
    meta = root / PREFIX.lstrip("/") / "conda-meta"
    meta.mkdir(parents=True)
    (meta / f"cuda-compat-impl-{COMPAT_550}-h0_0.json").write_text(json.dumps(
        {"name": "cuda-compat-impl", "version": COMPAT_550, "files": [f"cuda-compat/libcuda.so.{COMPAT_550}"]}))
    lib = root / PREFIX.lstrip("/") / "lib"
    lib.mkdir(parents=True)
    if links:
        for name in ("libcuda.so", "libcuda.so.1", f"libcuda.so.{COMPAT_550}"):
            os.symlink(f"{CONDA_COMPAT}/{name}", lib / name)  # absolute, as activate.sh makes them
    bin_dir = root / PREFIX.lstrip("/") / "bin"
    bin_dir.mkdir(parents=True)
    probe = bin_dir / "probe"
    probe.write_bytes(rootfs.probe_binary(runpath="$ORIGIN/../lib").read_bytes())
    probe.chmod(0o755)


def two_dirs_image(root: pathlib.Path, libs: dict) -> None:
    """``/usr/local/cuda-12.4/compat`` (550) and ``/usr/local/cuda-12.5/compat`` (555), cuda -> cuda-12.5."""
    install(root, libs[COMPAT_550], C124)
    install(root, libs[HOST_555], C125)
    os.symlink("cuda-12.5", root / "usr/local/cuda")


class Box:
    """One fake host, one config, one log, one rootfs of a given layout."""

    def __init__(self, tmp: pathlib.Path, libs: dict, host: str, layout, **config) -> None:
        self.tmp, self.libs, self.host = tmp, libs, host
        self.host_root = hookenv.fake_host(tmp / "host", host)
        self.log = tmp / "compat-hook.log"
        self.state = tmp / "state"
        self.config = hookenv.write_config(tmp / "config.yaml", host_root=self.host_root, log_file=self.log,
                                           nvml="off", **config)
        self.bundle = tmp / "bundle"
        self.rootfs = rootfs.build_rootfs(self.bundle / "rootfs")
        layout(self.rootfs, libs)

    def _bundle(self, env, args, hooks) -> pathlib.Path:
        return rt.make_bundle(self.bundle, self.rootfs, hooks=hooks, env=env, args=args)

    def _standin(self) -> dict:
        return rt.nvidia_standin_hook(self.libs[self.host], self.tmp / "work", "prestart")

    def hook_run(self, stage: str | None, env, args) -> rt.Result:
        """compat-hook registered as a hook at ``stage`` (None: not at all), under runc or crun."""
        hooks: dict = {"prestart": [self._standin()]}
        if stage is not None:
            hooks.setdefault(stage, []).append(
                registration.hook_entry(stage=stage, config=str(self.config), state_dir=str(self.state)))
        res = rt.run_container(self._bundle(env, args, hooks), self.runtime)
        _started.append(res.container_id)
        return res

    def wrapper_run(self, env, args) -> rt.Result:
        """Through compat-hook's runtime wrapper (runc behind it), which edits config.json on create."""
        wrapper = self.tmp / "bin" / "compat-hook-runtime"
        if not wrapper.exists():
            wrapper.parent.mkdir(parents=True)
            wrapper.write_text(render_wrapper(str(self.config), python=PY))
            wrapper.chmod(0o755)
        bundle = self._bundle(env, args, {"prestart": [self._standin()]})
        cid = rt.new_container_id("lay")
        state = self.tmp / "runc-state"
        try:
            p = subprocess.run([str(wrapper), "--root", str(state), "run", "--bundle", str(bundle), cid],
                               cwd=bundle, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               env=dict(ENV, COMPAT_HOOK_STATE_DIR=str(self.state)), timeout=120)
        finally:
            subprocess.run([rt.RUNC, "--root", str(state), "delete", "--force", cid], capture_output=True, env=ENV)
        _started.append(cid)
        return rt.Result(p.returncode, p.stdout, p.stderr, str(wrapper), cid)

    def records(self, cid: str, event: str = "hook") -> list:
        return [r for r in hookenv.read_log(self.log) if r.get("event") == event
                and (r.get("container_id") == cid or event == "runtime")]

    def explain(self, env, args=("/bin/true",)) -> dict:
        spec = {"ociVersion": "1.0.2", "root": {"path": str(self.rootfs)},
                "process": {"args": list(args), "cwd": "/", "env": env, "user": {"uid": 0, "gid": 0}}}
        b = self.tmp / "explain-bundle"
        b.mkdir(exist_ok=True)
        (b / "config.json").write_text(json.dumps(spec))
        p = subprocess.run([PY, "-m", "compat_hook", "explain", "--json", "--config", str(self.config),
                            "--bundle", str(b)], cwd=str(pathlib.Path(__file__).resolve().parent.parent),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)


def loaded(res: rt.Result) -> tuple:
    assert res.rc == 0, str(res)
    got = res.probe
    return int(got["cuDriverGetVersion"]), got["libcuda"]


# --------------------------------------------------------------------------- conda's cuda-compat

CONDA_LAYOUTS = {
    # layout id: (build, env, probe)
    "baked-links-runpath": (lambda r, libs: conda_image(r, libs, links=True), GPU_ENV, CONDA_PROBE),
    "baked-links-ld-path-lib": (lambda r, libs: conda_image(r, libs, links=True),
                                [*GPU_ENV, f"LD_LIBRARY_PATH={PREFIX}/lib"], PROBE),
    "ld-path-cuda-compat": (lambda r, libs: conda_image(r, libs, links=False),
                            [*GPU_ENV, f"LD_LIBRARY_PATH={CONDA_COMPAT}", f"CONDA_PREFIX={PREFIX}"], PROBE),
}
CONDA_LIB = f"{CONDA_COMPAT}/libcuda.so.{COMPAT_550}"


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("layout", list(CONDA_LAYOUTS))
def test_conda_compat_loads_only_where_it_is_right(tmp_path, libs, runtime, layout):
    build, env, probe = CONDA_LAYOUTS[layout]
    # a newer host (555): without compat-hook the stale 550 package loads (error 803 on a GPU)
    box = Box(tmp_path / "newer", libs, HOST_555, build)
    box.runtime = runtime
    assert loaded(box.hook_run(None, env, [probe])) == (CUDA[COMPAT_550], CONDA_LIB)
    report = box.explain(env, [probe])  # the program's env's RUNPATH is what reaches the links
    assert (report["reason"], report["effect"], report["image"]["compat_dir"]) == \
        ("compat_not_newer", "host", CONDA_COMPAT)
    assert report["toolkit"]["alone"]["result"] == "compat" and report["toolkit"]["with_hook"]["result"] == "host"
    res = box.hook_run("createContainer", env, [probe])
    assert loaded(res) == (CUDA[HOST_555], host_lib(HOST_555))
    [rec] = box.records(res.container_id)
    assert (rec["decision"], rec["reason"], rec["effect"], rec["candidate"]) == \
        ("skip", "compat_not_newer", "host", f"libcuda.so.{COMPAT_550}")
    # hidden, keeping only its libcuda file as the host's (the links into it name libcuda.so.1, gone with the rest)
    assert any(a.startswith(f"masked {CONDA_COMPAT} (read-only tmpfs holding only libcuda.so.{COMPAT_550}")
               for a in rec["actions"]), rec
    assert rec["losing_compat_dirs"][0].startswith(f"{CONDA_COMPAT}: hidden under a read-only tmpfs keeping only"), rec
    assert "warnings" not in rec
    assert (box.rootfs / CONDA_LIB.lstrip("/")).is_file()  # the image's files are untouched
    # at prestart (the host's mount namespace) the hook cannot hide it, and says so
    res = box.hook_run("prestart", env, [probe])
    assert loaded(res) == (CUDA[COMPAT_550], CONDA_LIB)
    [rec] = box.records(res.container_id)
    assert any("createContainer" in w and CONDA_COMPAT in w for w in rec["warnings"]), rec

    # an older host (535): the package is right, and it loads
    box = Box(tmp_path / "older", libs, HOST_535, build)
    box.runtime = runtime
    res = box.hook_run("createContainer", env, [probe])
    assert loaded(res) == (CUDA[COMPAT_550], CONDA_LIB)
    [rec] = box.records(res.container_id)
    assert (rec["decision"], rec["reason"], rec["compat_dir"]) == ("enable", "compat_major_newer", CONDA_COMPAT)
    assert not any(a.startswith("masked") for a in rec["actions"]), rec


@pytest.mark.parametrize("mode", ["ldconfig", "env", "both"])
@pytest.mark.parametrize("layout", ["baked-links-runpath", "ld-path-cuda-compat"])
def test_conda_compat_through_the_wrapper(tmp_path, libs, mode, layout):
    build, env, probe = CONDA_LAYOUTS[layout]
    box = Box(tmp_path / "newer", libs, HOST_555, build, mode=mode)
    res = box.wrapper_run(env, [probe])
    assert loaded(res) == (CUDA[HOST_555], host_lib(HOST_555))
    [wrec] = box.records(res.container_id, "runtime")
    assert (wrec["reason"], wrec["effect"]) == ("compat_not_newer", "host")
    assert any(a.startswith("added createContainer hook") for a in wrec["actions"]), wrec
    box = Box(tmp_path / "older", libs, HOST_535, build, mode=mode)
    assert loaded(box.wrapper_run(env, [probe])) == (CUDA[COMPAT_550], CONDA_LIB)


# --------------------------------------------------------------------------- two versioned compat dirs

TWO_ENV = [*GPU_ENV, f"LD_LIBRARY_PATH={C124}"]
# host -> what must load: the 12.5 dir's 555 driver where it is newer than the host, else the host's
TWO_CASES = {HOST_535: (CUDA[HOST_555], f"{C125}/libcuda.so.{HOST_555}"),
             COMPAT_550: (CUDA[HOST_555], f"{C125}/libcuda.so.{HOST_555}"),
             HOST_555: (CUDA[HOST_555], host_lib(HOST_555))}


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("host", list(TWO_CASES), ids=["older-535", "between-550", "newer-555"])
def test_two_compat_dirs_the_chosen_one_loads(tmp_path, libs, runtime, host):
    box = Box(tmp_path, libs, host, two_dirs_image)
    box.runtime = runtime
    # alone, the LD_LIBRARY_PATH entry wins: the 550 driver, whatever the host
    assert loaded(box.hook_run(None, TWO_ENV, [PROBE])) == (CUDA[COMPAT_550], f"{C124}/libcuda.so.{COMPAT_550}")
    report = box.explain(TWO_ENV)
    chosen = [c for c in report["compat_dirs"] if c["chosen"]]
    assert [c["dir"] for c in report["compat_dirs"]] == [C125, C124]
    assert [c["dir"] for c in chosen] == ([C125] if host != HOST_555 else [])
    assert [x["dir"] for x in report["losing_compat_dirs"]] == ([C124] if host != HOST_555 else [C125, C124])
    res = box.hook_run("createContainer", TWO_ENV, [PROBE])
    assert loaded(res) == TWO_CASES[host]
    [rec] = box.records(res.container_id)
    # on the newer host the host's library over each compat file (tests/test_host_over_containers.py), the one in
    # the hidden dir inside its mask
    acts = [a for a in rec["actions"] if not a.startswith("bind-mounted ")]
    assert (len(acts) < len(rec["actions"])) is (host == HOST_555), rec
    assert acts[0].startswith(f"masked {C124} (" + ("read-only tmpfs holding only" if host == HOST_555
                                                     else "empty read-only tmpfs)")), rec
    assert rec["compat_dir"] == (C125 if host != HOST_555 else None)


@pytest.mark.parametrize("mode", ["ldconfig", "env", "both"])
@pytest.mark.parametrize("host", list(TWO_CASES), ids=["older-535", "between-550", "newer-555"])
def test_two_compat_dirs_through_the_wrapper_in_every_mode(tmp_path, libs, mode, host):
    box = Box(tmp_path, libs, host, two_dirs_image, mode=mode)
    res = box.wrapper_run(TWO_ENV, [PROBE])
    assert loaded(res) == TWO_CASES[host]
    [wrec] = box.records(res.container_id, "runtime")
    ld = [a for a in wrec["actions"] if a.startswith(("LD_LIBRARY_PATH=", "unset LD_LIBRARY_PATH"))]
    if host == HOST_555 or mode == "ldconfig":
        assert ld == [f"unset LD_LIBRARY_PATH (was {C124})"], wrec  # the losing entry comes off
    else:
        assert ld == [f"LD_LIBRARY_PATH={C125}"], wrec  # the chosen dir first, the other one gone


# --------------------------------------------------------------------------- explain after our own start


def toolkit_image(root: pathlib.Path, libs: dict) -> None:
    install(root, libs[COMPAT_550], C124)
    os.symlink("cuda-12.4", root / "usr/local/cuda")


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_explain_predicts_the_next_start_after_our_own(tmp_path, libs, runtime):
    """The rootfs is started on a newer host (our drop-in names the host driver's dir), then the
    host goes back to an older driver (a reused bundle, a committed container): explain predicts
    the compat library, and the next start loads it."""
    box = Box(tmp_path, libs, HOST_555, toolkit_image)
    box.runtime = runtime
    assert loaded(box.hook_run("createContainer", GPU_ENV, [PROBE])) == (CUDA[HOST_555], host_lib(HOST_555))
    dropin = box.rootfs / "etc/ld.so.conf.d/00-00-compat-hook.conf"
    assert SYS in dropin.read_text()
    box.host = HOST_535
    hookenv.set_host_version(box.host_root, HOST_535)
    report = box.explain(GPU_ENV)
    assert (report["decision"], report["toolkit"]["with_hook"]["result"]) == ("enable", "compat"), report["summary"]
    assert report["toolkit"]["with_hook"]["dir"] == C124
    assert any("compat-hook's own from an earlier start" in n for n in report["notes"]), report["notes"]
    assert loaded(box.hook_run("createContainer", GPU_ENV, [PROBE])) == (
        CUDA[COMPAT_550], f"{C124}/libcuda.so.{COMPAT_550}")


# Keep last: pytest runs a module's tests in file order.
def test_nothing_left_behind(tmp_path_factory):
    assert _started, "no container ran"
    assert rt.mounts_under(tmp_path_factory.getbasetemp()) == []
    assert [d for d in rt.STATE_DIRS if d.exists()] == []
