"""The real ``compat-hook hook`` in real runc and crun containers (issue 3, item 8).

Every test registers the hook exactly as users do (``registration.hook_entry``)
in config.json, AFTER a stand-in of the NVIDIA Container Toolkit legacy
prestart hook that bind-mounts the fake host's libcuda (a real Debian build)
into the container and runs ldconfig.  The fake host root's
``/proc/driver/nvidia/version`` names the same driver version.  Assertions are
on the container's own probe output (``cuDriverGetVersion`` and the path
``dlopen("libcuda.so.1")`` loaded), the rootfs, and the hook's JSON log.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from compat_hook.facts import elfgen
from compat_hook.effects import ldcache
from compat_hook.core import registration
from tests.support import debs, hookenv, rootfs, runtimes as rt
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

pytestmark = pytest.mark.containers
RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "crun"])

SYS_DIR = "/usr/lib/x86_64-linux-gnu"
COMPAT_DIR = "/usr/local/cuda-12.4/compat"
COMPAT_LIB = f"{COMPAT_DIR}/libcuda.so.{COMPAT_550}"
DROPIN_REL = ldcache.DROPIN_PATH.lstrip("/")
PYTHON = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parent.parent

_started: list[str] = []


def host_lib(version: str) -> str:
    return f"{SYS_DIR}/libcuda.so.{version}"


@pytest.fixture(scope="module")
def libs() -> dict[str, pathlib.Path]:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


class Env:
    """One fake host (version file + stand-in lib), one hook config, one log, one rootfs."""

    def __init__(self, tmp: pathlib.Path, runtime: str, libs: dict, host: str = HOST_535, *,
                 compat_lib: pathlib.Path | None = None, ld_so_conf: bool = True, extra_files=None,
                 gpus: dict | None = None, **config):
        self.tmp, self.runtime, self.libs, self.host = tmp, runtime, libs, host
        self.host_root = hookenv.fake_host(tmp / "host", host)
        for bus, (model, uuid, minor) in (gpus or {}).items():  # what the kernel driver tells of each GPU
            info = self.host_root / "proc/driver/nvidia/gpus" / bus / "information"
            info.parent.mkdir(parents=True)
            info.write_text(f"Model: \t\t {model}\nIRQ: \t\t 154\nGPU UUID: \t {uuid}\n"
                            f"Video BIOS: \t 96.00.89.00.01\nBus Type: \t PCIe\nBus Location: \t {bus}\n"
                            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")
        self.log = tmp / "compat-hook.log"
        self.state = tmp / "state"
        self.config = hookenv.write_config(tmp / "config.yaml", host_root=self.host_root,
                                           log_file=self.log, **config)
        self.bundle = tmp / "bundle"
        self.rootfs = rootfs.build_rootfs(
            self.bundle / "rootfs", compat_lib=libs[COMPAT_550] if compat_lib is None else compat_lib,
            ld_so_conf=ld_so_conf, extra_files=extra_files)

    def set_host(self, version: str) -> None:
        """The host driver was upgraded: new /proc version, the stand-in mounts the new lib."""
        self.host = version
        hookenv.set_host_version(self.host_root, version)

    def run(self, stage: str = "createContainer", *, ours: bool = True, env=None,
            annotations=None, args=None, standin: str | None = "versioned", mounts=None,
            devices=()) -> rt.Result:
        """``standin``: how the host library gets in: ``versioned`` (the toolkit stand-in, as
        libcuda.so.<version>), ``so1`` (a hook mounts it as libcuda.so.1 only) or None;
        ``mounts``: spec mounts; ``devices``: ``/dev/nvidiaN`` device nodes in the spec."""
        hooks: dict = {"prestart": []}
        if standin == "versioned":
            hooks["prestart"].append(rt.nvidia_standin_hook(self.libs[self.host], self.tmp / "work", "prestart"))
        elif standin == "so1":
            hooks["prestart"].append(rt._write_ns_hook(
                self.tmp / "work", "so1-standin", "mounts the host libcuda as libcuda.so.1 only", "prestart",
                bind=[(self.libs[self.host], f"{SYS_DIR}/libcuda.so.1")], run=[], timeout=10))
        if ours:
            hooks.setdefault(stage, []).append(
                registration.hook_entry(stage=stage, config=str(self.config), state_dir=str(self.state)))
        kw = {}
        if args is not None:
            kw["args"] = args
        if devices:
            def edit(spec):
                spec["linux"].setdefault("devices", []).extend(
                    {"path": p, "type": "c", "major": 195, "minor": int(p[len("/dev/nvidia"):]),
                     "fileMode": 0o666, "uid": 0, "gid": 0} for p in devices)
            kw["edit"] = edit
        bundle = rt.make_bundle(self.bundle, self.rootfs, hooks=hooks,
                                env=list(rt.DEFAULT_ENV if env is None else env),
                                annotations=annotations, mounts_extra=mounts, **kw)
        res = rt.run_container(bundle, self.runtime)
        _started.append(res.container_id)
        return res

    def records(self) -> list[dict]:
        return hookenv.read_log(self.log)

    def dropin(self) -> pathlib.Path:
        return self.rootfs / DROPIN_REL


def assert_probe(res: rt.Result, cuda: int, lib: str) -> None:
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": str(cuda), "libcuda": lib}, str(res)


def only_record(env: Env, res: rt.Result) -> dict:
    recs = [r for r in env.records() if r.get("container_id") == res.container_id]
    assert len(recs) == 1, env.records()
    return recs[0]


def explain(env: Env) -> dict:
    p = subprocess.run([PYTHON, "-m", "compat_hook", "explain", "--json", "--config", str(env.config),
                        "--rootfs", str(env.rootfs)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


# --------------------------------------------------------------------------- enable / skip


@RUNTIMES
@pytest.mark.parametrize("stage", ["createContainer", "prestart"])
def test_host535_compat550_loads_compat(tmp_path, runtime, libs, stage):
    env = Env(tmp_path, runtime, libs, HOST_535)
    res = env.run(stage)
    assert_probe(res, 12040, COMPAT_LIB)
    assert env.dropin().read_text() == ldcache.dropin_text(COMPAT_DIR)
    assert env.dropin().stat().st_mode & 0o7777 == 0o644
    rec = only_record(env, res)
    assert (rec["stage"], rec["decision"], rec["reason"]) == (stage, "enable", "compat_major_newer")
    assert rec["host_driver_version"] == HOST_535 and rec["compat_version"] == COMPAT_550
    assert rec["actions"][0] == f"wrote {ldcache.DROPIN_PATH}"
    assert rec["actions"][1].startswith("ldconfig -r (")
    if stage == "prestart":  # ldconfig joined the container's mount namespace (sees the stand-in's mount)
        assert "in the mount namespace of pid" in rec["actions"][1], rec


@RUNTIMES
def test_host555_compat550_keeps_host_lib(tmp_path, runtime, libs):
    env = Env(tmp_path, runtime, libs, HOST_555)
    res = env.run()
    assert_probe(res, 12050, host_lib(HOST_555))
    # compat is wrong here: our drop-in names the host driver's dir, so it wins
    # over any compat path the image or the NVIDIA toolkit adds (test_toolkit_*)
    assert env.dropin().read_text() == ldcache.dropin_text(SYS_DIR, "host")
    rec = only_record(env, res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "compat_not_newer", "host")
    assert rec["host_lib_dir"] == SYS_DIR and rec["compat_version"] == COMPAT_550
    acts = rec["actions"]
    # the host's library over the image's compat file first (any road to that file maps the host's), then
    # the drop-in and the ld cache
    assert acts[0].startswith(f"bind-mounted {host_lib(HOST_555)} over "), acts
    wrote = acts.index(f"wrote {ldcache.DROPIN_PATH}")
    assert acts[wrote + 1].startswith("ldconfig -r"), acts


@RUNTIMES
def test_restart_after_host_upgrade_drops_compat(tmp_path, runtime, libs):
    """Same rootfs, host 535 -> 555 between two starts: the stale drop-in is removed."""
    env = Env(tmp_path, runtime, libs, HOST_535)
    assert_probe(env.run(), 12040, COMPAT_LIB)
    assert env.dropin().is_file()
    env.set_host(HOST_555)
    res = env.run()
    assert_probe(res, 12050, host_lib(HOST_555))
    # still one file of ours: the compat drop-in was replaced by the host one
    assert sorted(os.listdir(env.rootfs / "etc/ld.so.conf.d")) == [ldcache.DROPIN_NAME, "x86_64-linux-gnu.conf"]
    assert env.dropin().read_text() == ldcache.dropin_text(SYS_DIR, "host")
    rec = only_record(env, res)
    assert (rec["decision"], rec["reason"]) == ("skip", "compat_not_newer")
    assert rec["host_driver_version"] == HOST_555
    acts = _after_host_over(rec, host_lib(HOST_555))
    # the 535 start's mount point (an empty libcuda.so.535.x: a restarted container keeps its rootfs) is a
    # userland libcuda by its name, no link to it: the host's 555 library goes over it too
    assert acts[0] == f"bind-mounted {host_lib(HOST_555)} over {SYS_DIR}/libcuda.so.{HOST_535} (ro)", acts
    assert acts[1] == f"wrote {ldcache.DROPIN_PATH}" and acts[2].startswith("ldconfig -r"), acts


# --------------------------------------------------------------------------- the note


def noted_lib(tmp: pathlib.Path, src: pathlib.Path, drivers: list) -> pathlib.Path:
    """A copy of the Debian 550 libcuda with a ``.note.cuda.fwd_compatibility`` listing ``drivers``."""
    payload = json.dumps({"format": 1, "CUDA version": "12.4", "driver": drivers,
                          "device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]}, separators=(",", ":"))
    tmp.mkdir(parents=True, exist_ok=True)
    note = tmp / "NOTE.bin"
    note.write_bytes(elfgen.note_bytes(payload))
    out = tmp / src.name
    shutil.copyfile(src, out)
    p = subprocess.run(["objcopy", f"--add-section={elfgen.NOTE_NAME}={note}",
                        f"--set-section-flags={elfgen.NOTE_NAME}=alloc,readonly", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


@RUNTIMES
@pytest.mark.parametrize("drivers,cuda,lib,reason", [
    ([550, 555, 560], 12020, host_lib(HOST_535), "host_branch_unsupported"),
    ([535, 550, 555], 12040, COMPAT_LIB, "compat_newer_supported"),
], ids=["host-branch-unlisted", "host-branch-listed"])
def test_note_driver_list(tmp_path, runtime, libs, drivers, cuda, lib, reason):
    lib_file = noted_lib(tmp_path / "noted", libs[COMPAT_550], drivers)
    env = Env(tmp_path, runtime, libs, HOST_535, compat_lib=lib_file)
    report = explain(env)
    assert report["image"]["elf"]["note"] is not None, report["image"]
    assert report["image"]["elf"]["note_error"] is None
    assert report["note"] is not None and list(report["image"]["elf"]["note"]["driver"]) == drivers
    assert report["reason"] == reason
    res = env.run()
    assert_probe(res, cuda, lib)
    rec = only_record(env, res)
    assert rec["reason"] == reason
    # enable: the drop-in names the compat dir; host branch unlisted: the host driver's dir
    want = ldcache.dropin_text(COMPAT_DIR) if cuda == 12040 else ldcache.dropin_text(SYS_DIR, "host")
    assert env.dropin().read_text() == want


def _after_host_over(rec: dict, source: str) -> list:
    """The record's actions after the first, which puts the host's library (``source``, in the
    container) over the image's compat file (at createContainer, the hook's first act when the host's
    driver is chosen over a compat file: tests/test_host_over_containers.py)."""
    acts = rec["actions"]
    assert acts[0].startswith(f"bind-mounted {source} over {COMPAT_DIR}/libcuda.so."), acts
    return acts[1:]


# --------------------------------------------------------------------------- changes nothing


def settled(e: Env, **run_kw) -> dict:
    """Start with only the stand-in, so its one-time edits are in the baseline: twice, as its ``libcuda.so``
    link (made after its ``ldconfig``, as the toolkit's ``create-symlinks`` hook runs after the cache
    update) reaches the ld cache at the next start."""
    for _ in range(2):
        assert e.run(ours=False, **run_kw).rc == 0
    return hookenv.snapshot(e.rootfs)


def assert_unchanged(before: dict, after: dict) -> None:
    """Only the stand-in's own ``ldconfig -r`` may touch ld.so.cache (same bytes, new mtime)."""
    changed = hookenv.diff(before, after)
    for path in ("etc", "etc/ld.so.cache"):
        if path in changed:
            b, a = changed.pop(path)
            assert (b[0], b[1], b[2], b[4]) == (a[0], a[1], a[2], a[4]), (path, b, a)
    assert changed == {}


@RUNTIMES
@pytest.mark.parametrize("how", ["config", "annotation"])
def test_dry_run_changes_nothing(tmp_path, runtime, libs, how):
    env = Env(tmp_path, runtime, libs, HOST_535, **({"dry_run": True} if how == "config" else {}))
    ann = {"compat-hook/dry-run": "true"} if how == "annotation" else None
    before = settled(env, annotations=ann)
    res = env.run("createContainer", annotations=ann)
    assert_probe(res, 12020, host_lib(HOST_535))
    assert_unchanged(before, hookenv.snapshot(env.rootfs))
    assert not os.path.lexists(env.dropin())
    rec = only_record(env, res)
    assert rec["dry_run"] is True and (rec["decision"], rec["reason"]) == ("enable", "compat_major_newer")
    assert rec["actions"] == [f"dry-run: would write_dropin {COMPAT_DIR}", "dry-run: would ldconfig"]


@RUNTIMES
def test_no_gpu_request_changes_nothing(tmp_path, runtime, libs):
    env = Env(tmp_path, runtime, libs, HOST_535)
    no_gpu = ["PATH=/usr/local/bin:/usr/bin:/bin"]
    before = settled(env, env=no_gpu)
    res = env.run("createContainer", env=no_gpu)
    assert_probe(res, 12020, host_lib(HOST_535))
    assert_unchanged(before, hookenv.snapshot(env.rootfs))
    rec = only_record(env, res)
    assert (rec["decision"], rec["reason"], rec["actions"]) == ("skip", "no_gpu_request", [])


# --------------------------------------------------------------------------- idempotence, log, distroless


@RUNTIMES
def test_two_starts_leave_one_dropin(tmp_path, runtime, libs):
    env = Env(tmp_path, runtime, libs, HOST_535)
    first = env.run("createContainer")
    second = env.run("prestart")
    for res in (first, second):
        assert_probe(res, 12040, COMPAT_LIB)
    confs = sorted(os.listdir(env.rootfs / "etc/ld.so.conf.d"))
    assert confs == [ldcache.DROPIN_NAME, "x86_64-linux-gnu.conf"]
    assert env.dropin().read_text() == ldcache.dropin_text(COMPAT_DIR)
    assert [p for p in os.listdir(env.rootfs / "etc") if "compat-hook" in p or p.startswith(".")] == []
    assert only_record(env, second).get("dropin") == "unchanged"


@RUNTIMES
def test_log_has_one_json_line_per_run(tmp_path, runtime, libs):
    env = Env(tmp_path, runtime, libs, HOST_535)
    runs = [(env.run("createContainer"), "createContainer"),
            (env.run("prestart", env=["PATH=/bin"], args=["/bin/true"]), "prestart")]
    assert all(r.rc == 0 for r, _ in runs), [str(r) for r, _ in runs]
    lines = env.log.read_text().splitlines()
    assert len(lines) == 2
    recs = [json.loads(line) for line in lines]
    for rec, (res, stage) in zip(recs, runs):
        assert rec["event"] == "hook" and rec["container_id"] == res.container_id
        assert rec["stage"] == stage and isinstance(rec["time"], str)
        assert isinstance(rec["duration_ms"], (int, float)) and 0 < rec["duration_ms"] < 10_000
        assert isinstance(rec["actions"], list) and "decision" in rec and "reason" in rec
    enable, skip = recs
    assert (enable["decision"], enable["reason"]) == ("enable", "compat_major_newer")
    assert enable["host_driver_version"] == HOST_535 and enable["compat_version"] == COMPAT_550
    assert enable["compat_dir"] == COMPAT_DIR and len(enable["actions"]) == 2
    assert (skip["decision"], skip["reason"]) == ("skip", "no_gpu_request")
    # no GPU request: the stale drop-in is still removed (decision skip undoes an earlier start)
    assert skip["actions"][0] == f"removed {ldcache.DROPIN_PATH}"


@RUNTIMES
def test_distroless_without_ld_so_conf(tmp_path, runtime, libs):
    env = Env(tmp_path, runtime, libs, HOST_535, ld_so_conf=False)
    assert not os.path.lexists(env.rootfs / "etc/ld.so.conf")
    res = env.run("createContainer")
    assert_probe(res, 12040, COMPAT_LIB)
    assert (env.rootfs / "etc/ld.so.conf").read_bytes() == ldcache._LD_SO_CONF_TEXT
    assert (env.rootfs / "etc/ld.so.conf").stat().st_mode & 0o7777 == 0o644
    assert "created /etc/ld.so.conf" in only_record(env, res)["actions"]


@RUNTIMES
def test_image_ld_library_path_to_a_stale_compat_dir_is_masked_at_create_container(tmp_path, runtime, libs):
    """Hook-only registration: the image's ENV points LD_LIBRARY_PATH at the compat dir on a newer
    host. At createContainer the hook hides the dir (an empty read-only tmpfs in the container's
    mount namespace), so the host driver loads; at prestart it cannot, and the log says what to do."""
    env_ld = [*rt.DEFAULT_ENV, "LD_LIBRARY_PATH=/usr/local/cuda/compat"]
    env = Env(tmp_path / "cc", runtime, libs, HOST_555)
    control = env.run(ours=False, env=env_ld)
    assert_probe(control, 12040, COMPAT_LIB)  # without compat-hook: the stale path wins (803 on hardware)
    res = env.run("createContainer", env=env_ld)
    assert_probe(res, 12050, host_lib(HOST_555))
    rec = only_record(env, res)
    # the dir hidden, keeping only its compat libcuda file, with the host's library over it
    acts = rec["actions"]
    assert acts[0].startswith(f"masked {COMPAT_DIR} (read-only tmpfs holding only libcuda.so."), rec
    assert acts[1].startswith(f"bind-mounted {host_lib(HOST_555)} over {COMPAT_DIR}/libcuda.so."), rec
    assert "warnings" not in rec
    assert sorted(os.listdir(env.rootfs / COMPAT_DIR.lstrip("/")))  # the image's files are untouched

    env = Env(tmp_path / "ps", runtime, libs, HOST_555)
    res = env.run("prestart", env=env_ld)
    assert_probe(res, 12040, COMPAT_LIB)
    [w] = only_record(env, res)["warnings"]
    assert "LD_LIBRARY_PATH names /usr/local/cuda/compat" in w and "createContainer" in w


# --------------------------------------------------------------------------- wrong library, wrong GPUs


BAKED_DROPIN = {"etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat\n"}  # as NGC, vLLM, VIAME
HOST_SO1 = f"{SYS_DIR}/libcuda.so.1"


@RUNTIMES
@pytest.mark.parametrize("stage", ["createContainer", "prestart"])
def test_baked_dropin_and_host_lib_spec_mounted_as_so1_loads_the_host_lib(tmp_path, runtime, libs, stage):
    """A hand-written runtime config bind-mounts the host driver's library as libcuda.so.1 alone,
    and the image bakes a drop-in naming its compat dir; the host driver is newer than the compat
    one. The spec's mount says where the host library is: our drop-in names that dir first."""
    env = Env(tmp_path, runtime, libs, HOST_555, extra_files=BAKED_DROPIN)
    mounts = [{"destination": HOST_SO1, "type": "bind", "source": str(libs[HOST_555]),
               "options": ["rbind", "ro", "nosuid", "nodev"]}]
    control = env.run(ours=False, standin=None, mounts=mounts)
    assert_probe(control, 12040, COMPAT_LIB)  # without compat-hook: the compat driver (803 on a GPU)
    res = env.run(stage, standin=None, mounts=mounts)
    assert_probe(res, 12050, HOST_SO1)
    assert env.dropin().read_text() == ldcache.dropin_text(SYS_DIR, "host")
    rec = only_record(env, res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "compat_not_newer", "host")
    assert rec["host_lib_dir"] == SYS_DIR and "warnings" not in rec, rec
    acts = _after_host_over(rec, HOST_SO1) if stage == "createContainer" else rec["actions"]
    assert acts[0] == f"wrote {ldcache.DROPIN_PATH}"


@RUNTIMES
def test_baked_dropin_and_host_lib_mounted_as_so1_masks_the_compat_dir(tmp_path, runtime, libs):
    """The same, but the host library is mounted by a hook (no spec mount names it): at
    createContainer the compat dir is hidden and the ld cache rebuilt; at prestart, where nothing
    can be done, the log line warns and names the fix."""
    env = Env(tmp_path / "cc", runtime, libs, HOST_555, extra_files=BAKED_DROPIN)
    control = env.run(ours=False, standin="so1")
    assert_probe(control, 12040, COMPAT_LIB)
    res = env.run("createContainer", standin="so1")
    assert_probe(res, 12050, HOST_SO1)
    rec = only_record(env, res)
    assert (rec["reason"], rec["effect"]) == ("compat_not_newer", "host")
    assert rec["actions"][0] == f"masked {COMPAT_DIR} (empty read-only tmpfs)", rec
    assert rec["actions"][1].startswith("ldconfig -r (") and "warnings" not in rec
    assert not os.path.lexists(env.dropin())
    assert (env.rootfs / COMPAT_LIB.lstrip("/")).is_file()  # the image's files are untouched
    report = explain(env)
    assert f"mask {COMPAT_DIR} with an empty read-only tmpfs (createContainer)" in report["effects"]["hook"]

    env = Env(tmp_path / "ps", runtime, libs, HOST_555, extra_files=BAKED_DROPIN)
    res = env.run("prestart", standin="so1")
    assert_probe(res, 12040, COMPAT_LIB)  # a hook in the host's mount namespace cannot help ...
    [w] = only_record(env, res)["warnings"]  # ... and says so
    assert w.startswith("/etc/ld.so.conf.d/00-cuda-compat.conf names /usr/local/cuda/compat"), w
    assert "register the hook at createContainer" in w and f"libcuda.so.{HOST_555}" in w


@RUNTIMES
def test_geforce_with_a_compat_lib_without_note_keeps_the_host_lib(tmp_path, runtime, libs):
    """Debian's 550 libcuda carries no .note.cuda.fwd_compatibility; the GPU is a GeForce: NVIDIA
    supports forward compatibility only on data-center and select RTX GPUs (804 here)."""
    env = Env(tmp_path, runtime, libs, HOST_535,
              gpus={"0000:01:00.0": ("NVIDIA GeForce GTX 1650", "GPU-11111111-2222-3333-4444-555555555555", 0)})
    report = explain(env)
    assert report["image"]["elf"]["note"] is None
    assert report["host"]["gpus"][0]["brand_name"] == "GEFORCE"
    assert (report["reason"], report["effect"]) == ("device_consumer", "host")
    res = env.run()
    assert_probe(res, 12020, host_lib(HOST_535))
    rec = only_record(env, res)
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "device_consumer", "host")
    assert rec["gpus_checked"]["gpus"] == ["0 0000:01:00.0 NVIDIA GeForce GTX 1650"]
    assert env.dropin().read_text() == ldcache.dropin_text(SYS_DIR, "host")


H100 = ("NVIDIA H100 80GB HBM3", "GPU-5a1c0d3e-0000-4a4a-8b8b-000000000001", 0)
RTX4090 = ("NVIDIA GeForce RTX 4090", "GPU-9e8d7c6b-0000-4b4b-8c8c-000000000002", 1)
NO_NVD = ["PATH=/usr/local/bin:/usr/bin:/bin"]


@RUNTIMES
@pytest.mark.parametrize("request_kw, cuda, reason, why", [
    ({"env": [*NO_NVD, "NVIDIA_VISIBLE_DEVICES=0"]}, 12040, "compat_newer_supported",
     "named by NVIDIA_VISIBLE_DEVICES: 0"),
    ({"env": [*NO_NVD, f"NVIDIA_VISIBLE_DEVICES={H100[1]}"]}, 12040, "compat_newer_supported",
     f"named by NVIDIA_VISIBLE_DEVICES: {H100[1]}"),
    ({"env": NO_NVD, "devices": ["/dev/nvidia0"]}, 12040, "compat_newer_supported",
     "named by device /dev/nvidia0: 0"),
    ({"annotations": {"cdi.k8s.io/nvidia-device-plugin_gpu": "nvidia.com/gpu=0"}}, 12040, "compat_newer_supported",
     "named by CDI annotation cdi.k8s.io/nvidia-device-plugin_gpu: 0"),
    ({"env": [*NO_NVD, "NVIDIA_VISIBLE_DEVICES=1"]}, 12020, "device_unsupported",
     "named by NVIDIA_VISIBLE_DEVICES: 1"),
    ({}, 12020, "device_unsupported", "all GPUs: NVIDIA_VISIBLE_DEVICES names all"),
], ids=["index-0", "uuid", "dev-nvidia0", "cdi-annotation", "index-1-geforce", "all"])
def test_two_gpu_host_decides_on_the_containers_gpus(tmp_path, runtime, libs, request_kw, cuda, reason, why):
    """An H100 at index 0 and a GeForce RTX 4090 at index 1; the compat library's note lists the
    data-center brands. A container given the H100 alone gets compat; one given the 4090, or all,
    keeps the host driver."""
    lib_file = noted_lib(tmp_path / "noted", libs[COMPAT_550], [535, 550, 555])
    env = Env(tmp_path, runtime, libs, HOST_535, compat_lib=lib_file,
              gpus={"0000:17:00.0": H100, "0000:65:00.0": RTX4090})
    res = env.run(**request_kw)
    assert_probe(res, cuda, COMPAT_LIB if cuda == 12040 else host_lib(HOST_535))
    rec = only_record(env, res)
    assert rec["reason"] == reason, rec
    assert rec["gpus_checked"]["why"] == why, rec


# Keep last: pytest runs a module's tests in file order.
def test_nothing_left_behind(tmp_path_factory):
    assert _started, "no container ran"
    assert rt.mounts_under(tmp_path_factory.getbasetemp()) == []
    assert rt.mounts_under(debs.cache_dir()) == []
    assert [d for d in rt.STATE_DIRS if d.exists()] == []

