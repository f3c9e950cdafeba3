"""Read-only roots and user-namespaced containers, in real runc and crun containers (issue 42).

What each runtime does, as these tests find it:

* ``root.readonly: true``: runc remounts the root read-only only after the
  createContainer hooks, so the hook writes its drop-in and rebuilds the ld
  cache as usual. crun does it before them: at createContainer the root is
  read-only, and the hook builds the cache in a tmpfs of its own and
  bind-mounts it over ``/etc/ld.so.cache``. An image without an
  ``/etc/ld.so.cache`` leaves nothing to mount over: the log says the decision
  did not take effect (``read_only_root``), never ``maps``, and names the file
  that maps instead. prestart/createRuntime hooks see the rootfs as the host
  does (writable) under both.
* a user namespace (``uidMappings``): the createContainer hook runs as the
  container's mapped root, a host uid the log is closed to; its line goes to the
  log's spool, which ``report`` reads and the next start on the host merges.

Every test judges what the probe in the container maps.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from compat_hook.commands.report import report
from compat_hook.core import logjson
from tests.support import hookenv, rootfs, runtimes as rt, wrapperenv
from tests.support.loaderbox import MAPPED, open_to_mapped, readonly_edit, userns_edit
from tests.support.versions import COMPAT_550, HOST_535, HOST_555
from tests.test_hook_containers import COMPAT_LIB, Env, explain, host_lib, libs, only_record  # noqa: F401
from tests.test_runtime_wrapper import render

pytestmark = pytest.mark.containers
RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "crun"])
#: host driver -> (what the probe's cuDriverGetVersion says, the libcuda that must map)
EXPECT = {HOST_535: (12040, COMPAT_LIB), HOST_555: (12050, host_lib(HOST_555))}
NO_GPU_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin"]
PYTHON = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parent.parent


def _run(box: Env, edit, stage: str = "createContainer", **kw) -> rt.Result:
    orig = rt.make_bundle

    def make(*a, **k):
        k["edit"] = edit
        return orig(*a, **k)

    rt.make_bundle = make
    try:
        return box.run(stage, **kw)
    finally:
        rt.make_bundle = orig


def assert_no_maps_beside_an_error(records: list) -> None:
    for r in records:
        assert not (r.get("decision") == "error" and "maps" in r), r


@RUNTIMES
@pytest.mark.parametrize("host,stage", [(HOST_535, "createContainer"), (HOST_555, "createContainer"),
                                        (HOST_535, "prestart")])
def test_readonly_root_through_the_hook(tmp_path, runtime, libs, host, stage):
    env = Env(tmp_path, runtime, libs, host)
    predicted = explain(env)["toolkit"]["with_hook"]["maps"]
    res = _run(env, readonly_edit, stage)
    cuda, lib = EXPECT[host]
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": str(cuda), "libcuda": lib}, str(res)
    rec = only_record(env, res)
    assert predicted == rec["maps"] == lib, (predicted, rec)
    assert rec["decision"] in ("enable", "skip"), rec
    if runtime == "crun" and stage == "createContainer":  # read-only already: the cache came by a mount
        assert any("bind-mounted a rebuilt ld cache over /etc/ld.so.cache" in a for a in rec["actions"]), rec
        assert not env.dropin().exists()
    else:  # runc: read-only only after the hook; prestart: the rootfs as the host sees it
        assert env.dropin().exists()
    assert_no_maps_beside_an_error(env.records())


@RUNTIMES
def test_readonly_root_without_an_ld_cache_says_what_maps_instead(tmp_path, runtime, libs):
    env = Env(tmp_path, runtime, libs, HOST_535)
    (env.rootfs / "etc/ld.so.cache").unlink()  # nothing to mount a rebuilt cache over ...
    res = _run(env, readonly_edit, standin="so1")  # ... nor does a hook before ours make one
    assert res.rc == 0, str(res)
    rec = only_record(env, res)
    assert_no_maps_beside_an_error(env.records())
    if runtime == "runc":  # runc: the root is still writable at createContainer
        assert res.probe["libcuda"] == COMPAT_LIB == rec["maps"], (str(res), rec)
        return
    # crun: the decision cannot take effect, and the line says so and what maps instead
    assert (rec["decision"], rec["reason"]) == ("error", "read_only_root"), rec
    assert rec["not_in_effect"] == COMPAT_LIB and "maps" not in rec, rec
    assert res.probe["libcuda"] != COMPAT_LIB, str(res)
    assert rec["maps_instead"] == res.probe["libcuda"], (rec, str(res))


@RUNTIMES
def test_readonly_root_through_the_wrapper(tmp_path, runtime, libs):
    """The wrapper (ldconfig mode) adds the createContainer hook; env mode edits only config.json."""
    runtime_bin = rt.RUNC if runtime == "runc" else rt.CRUN
    for mode in ("ldconfig", "env"):
        tmp = tmp_path / mode
        log = tmp / "compat-hook.log"
        host = wrapperenv.fake_host(tmp / "host", HOST_535)
        cfg = wrapperenv.write_config(tmp / "config.yaml", host_root=str(host), log_file=str(log), mode=mode,
                                      runtime=runtime_bin)
        wrapper = render(tmp / "bin" / "compat-hook-runtime", cfg, python=PYTHON)
        root = rootfs.build_rootfs(tmp / "bundle" / "rootfs", compat_lib=libs[COMPAT_550])
        bundle = rt.make_bundle(tmp / "bundle", root, hooks={"prestart": [rt.nvidia_standin_hook(
            libs[HOST_535], tmp / "work")]}, edit=readonly_edit)
        p = subprocess.run([PYTHON, "-m", "compat_hook", "explain", "--json", "--config", str(cfg),
                            "--bundle", str(bundle)], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert p.returncode == 0, p.stderr
        predicted = json.loads(p.stdout)["toolkit"]["with_wrapper"]["maps"]
        res = _wrapped(wrapper, runtime, bundle, tmp)
        assert res.rc == 0, str(res)
        assert res.probe == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}, str(res)
        recs = hookenv.read_log(log)
        assert recs and predicted == COMPAT_LIB, (predicted, recs)
        assert all(r.get("maps") in (None, COMPAT_LIB) for r in recs), recs
        assert any(r.get("maps") == COMPAT_LIB for r in recs), recs
        assert_no_maps_beside_an_error(recs)


def _wrapped(wrapper, runtime: str, bundle, tmp) -> rt.Result:
    """``compat-hook-runtime run`` as an engine runs it (crun: as tests/support/runtimes runs crun)."""
    cid = rt.new_container_id("rou")
    state = tmp / "rt-state"
    argv = [str(wrapper), "--root", str(state), "run", "--bundle", str(bundle), cid]
    if runtime == "crun" and rt.cgroup_hybrid():
        argv = [rt.UNSHARE, "-m", "--propagation", "private", "sh", "-c",
                f'umount {rt.CGROUP2_HYBRID} && exec "$@"', "sh", *argv]
    env = dict(rt.RUNTIME_ENV, COMPAT_HOOK_STATE_DIR=str(tmp / "state"))
    try:
        p = subprocess.run(argv, cwd=bundle, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           env=env, timeout=120)
    finally:
        rt._delete(runtime, state, cid)
    return rt.Result(p.returncode, p.stdout, p.stderr, runtime, cid)


# --------------------------------------------------------------------------- user namespaces

def _mapped_env(tmp_path, runtime: str, libs: dict) -> Env:
    """An Env whose rootfs the container's mapped root owns, its dirs passable by that uid (the
    rootfs, and the log's spool beside the log)."""
    env = Env(tmp_path, runtime, libs, HOST_535)
    open_to_mapped(tmp_path, env.rootfs)
    return env


def _plain(spec: dict) -> None:
    pass


@RUNTIMES
def test_user_namespaced_container_gets_its_log_line(tmp_path, runtime, libs):
    env = _mapped_env(tmp_path, runtime, libs)
    first = _run(env, _plain, env=NO_GPU_ENV)  # a start whose hook writes the log: the spool is made
    assert first.rc == 0, str(first)
    assert oct(os.stat(logjson.spool_dir(str(env.log))).st_mode & 0o7777) == "0o1733"
    res = _run(env, userns_edit)
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}, str(res)
    assert [r for r in env.records() if r.get("container_id") == res.container_id] == []  # the log is closed to it
    rep = report([str(env.log)])
    assert rep["records"] == 2, rep  # ... and report counts the spooled line
    [period] = [p for p in rep["periods"] if p["driver"] == HOST_535]
    assert [(d["decision"], d["count"]) for d in period["decisions"]] == [("enable", 1)], period
    _run(env, _plain, env=NO_GPU_ENV)  # the next start whose hook writes the log merges it
    rec = only_record(env, res)
    assert (rec["decision"], rec["maps"], rec["spooled_by_uid"]) == ("enable", COMPAT_LIB, MAPPED), rec
    assert os.listdir(logjson.spool_dir(str(env.log))) == []
    assert report([str(env.log)])["records"] == 3


@RUNTIMES
def test_user_namespaced_container_at_create_runtime_logs_directly(tmp_path, runtime, libs):
    """createRuntime runs in the runtime's namespaces, as its uid: the line goes to the log itself."""
    env = _mapped_env(tmp_path, runtime, libs)
    res = _run(env, userns_edit, "createRuntime")
    assert res.probe == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}, str(res)
    rec = only_record(env, res)
    assert (rec["decision"], rec["maps"]) == ("enable", COMPAT_LIB) and "spooled_by_uid" not in rec, rec
