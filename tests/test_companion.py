"""Beside the NVIDIA toolkit and the image's own compat setup: what compat-hook plans, what
``explain`` says of both sides, and the hostile rootfs for the new paths (drop-in scan, host
library lookup). Real containers with the toolkit's own binaries: tests/test_toolkit_containers.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time

import pytest

from compat_hook.effects import ldcache
from compat_hook.policy.assess import assess
from compat_hook.facts.container import Request
from compat_hook.facts.hostfacts import Gpu, HostFacts
from compat_hook.facts.rootfs import Root
from tests.conftest import Dir, Fifo, Symlink, build_tree, config_for, elf, snapshot_tree

REPO = str(pathlib.Path(__file__).resolve().parent.parent)
PYTHON = "/usr/bin/python3"
NOTE_550 = json.dumps({"format": 1, "CUDA version": "12.4", "driver": [470, 525, 535],
                       "device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]})
COMPAT = "usr/local/cuda-12.4/compat"
IMAGE = {f"{COMPAT}/libcuda.so.550.163.01": elf(NOTE_550),
         f"{COMPAT}/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
         "usr/local/cuda": Symlink("cuda-12.4"),
         "etc/ld.so.conf.d/x86_64-linux-gnu.conf": "/usr/lib/x86_64-linux-gnu\n"}
SYS = "/usr/lib/x86_64-linux-gnu"


def host(version: str, geforce: bool = False) -> HostFacts:
    from compat_hook.core.versions import parse_version

    gpus = [Gpu("0000:17:00.0", "NVIDIA GeForce RTX 4090" if geforce else "NVIDIA H100 80GB HBM3",
                5 if geforce else 14, "test")]
    return HostFacts(driver_version=parse_version(version), driver_source="test", gpus=gpus,
                     driver_text=version)


def run_assess(rootfs, h, env=("NVIDIA_VISIBLE_DEVICES=all",), actors=("hook",), mount_ns=True):
    cfg = config_for(None)
    spec = {"process": {"env": list(env)}, "root": {"path": str(rootfs)}}
    with Root(str(rootfs)) as root:
        return assess(cfg, Request.from_spec(spec), root, spec=spec, host=h, actors=actors, toolkit=True,
                      mount_ns=mount_ns,
                      hook_entry=lambda: {"path": "/usr/bin/python3", "args": ["python3", "compat_hook", "hook"]})


@pytest.mark.parametrize("dropin", ["00-cuda-compat.conf", "cuda-compat.conf", "zzz-cuda-compat.conf",
                                    "00-compat-4f1e2d3c-aaaa-bbbb-cccc-000011112222.conf"])
def test_a_skip_names_the_host_dir_whatever_compat_dropin_the_image_or_toolkit_left(tmp_path, dropin):
    rootfs = build_tree(tmp_path / "r", dict(IMAGE, **{
        f"etc/ld.so.conf.d/{dropin}": "/usr/local/cuda-12.4/compat\n",
        f"{SYS.lstrip('/')}/libcuda.so.555.58.02": b"host"}))
    a = run_assess(rootfs, host("555.58.02"))
    assert (a.decision.reason, a.effect) == ("compat_not_newer", "host")
    assert a.hook == [("write_dropin", SYS), ("ldconfig", None)] and a.hook_purpose == "host"
    by = "nvidia-toolkit" if dropin.startswith("00-compat-") else "image"
    assert [{k: d[k] for k in ("file", "dirs", "by")} for d in a.dropins] == \
        [{"file": dropin, "dirs": ["/usr/local/cuda-12.4/compat"], "by": by}]
    assert a.dropins[0]["path"] == f"/etc/ld.so.conf.d/{dropin}"
    # ldconfig order: our 00-00- name sorts before every one of them
    assert ldcache.DROPIN_NAME < dropin
    # what the toolkit alone would leave: vLLM's zzz- name loses to the multiarch drop-in
    assert a.toolkit["alone"]["result"] == ("host" if dropin.startswith("zzz") else "compat")
    assert a.toolkit["with_hook"]["result"] == "host"


def test_geforce_toolkit_would_enable_compat_hook_overrides(tmp_path, make_rootfs, fake_host):
    rootfs = make_rootfs(IMAGE)
    h = fake_host(version_line="NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Tue 2025",
                  gpus=["NVIDIA GeForce RTX 4090"])
    conf = tmp_path / "c.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {h}\n")
    out = subprocess.run([PYTHON, "-m", "compat_hook", "explain", "--rootfs", str(rootfs), "--config", str(conf),
                          "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert (r["decision"], r["reason"], r["effect"]) == ("skip", "device_unsupported", "host")
    assert r["toolkit"]["enables"] is True and r["toolkit"]["alone"]["result"] == "compat"
    assert r["summary"] == ("toolkit: would enable; compat-hook: skip device_unsupported -> host library, "
                            "compat-hook overrides it")
    text = subprocess.run([PYTHON, "-m", "compat_hook", "explain", "--rootfs", str(rootfs), "--config", str(conf)],
                          cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    assert "NVIDIA toolkit (enable-cuda-compat, v1.20 rules):\n  would enable: the note lists branch 535" in text
    assert "result: toolkit: would enable; compat-hook: skip device_unsupported -> host library" in text


def test_leave_alone_cases_say_so(tmp_path):
    rootfs = build_tree(tmp_path / "r", dict(IMAGE, **{"etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat\n"}))
    unknown = HostFacts(driver_version=None)
    a = run_assess(rootfs, unknown)
    assert (a.decision.reason, a.effect, a.hook) == ("host_driver_unknown", "leave", [])
    assert "left_alone" in a.log_fields()
    a = run_assess(rootfs, host("555.58.02"), env=("NVIDIA_VISIBLE_DEVICES=all", "COMPAT_HOOK_DISABLE=1"))
    assert (a.decision.reason, a.effect, a.hook) == ("opt_out", "leave", [])


def test_image_ld_library_path_hook_masks_or_warns_wrapper_strips(tmp_path):
    rootfs = build_tree(tmp_path / "r", dict(IMAGE, **{f"{SYS.lstrip('/')}/libcuda.so.555.58.02": b"host"}))
    env = ("NVIDIA_VISIBLE_DEVICES=all", "LD_LIBRARY_PATH=/usr/local/cuda/compat:/opt/lib")
    # at createContainer (the container's mount namespace) the hook hides the dir
    masked = run_assess(rootfs, host("555.58.02"), env=env)
    assert masked.hook_masks == ["/usr/local/cuda-12.4/compat"] and masked.warnings == []
    # the dir hidden, keeping only its compat libcuda file, with the host's library over it (an absolute dlopen
    # of that file maps the host's)
    hook = masked.effects()["hook"]
    assert hook[0].startswith("mask /usr/local/cuda-12.4/compat with a read-only tmpfs holding only libcuda.so."), hook
    assert hook[1].startswith("bind-mount /usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02 (in the container) over "
                              "/usr/local/cuda-12.4/compat/libcuda.so."), hook
    # at prestart it can do neither: a warning that names the fix
    hook_only = run_assess(rootfs, host("555.58.02"), env=env, mount_ns=False)
    assert hook_only.hook_masks == []
    [w] = hook_only.warnings
    assert "LD_LIBRARY_PATH names /usr/local/cuda/compat" in w and "compat-hook install containerd" in w
    assert hook_only.log_fields()["warnings"] == [w]
    assert hook_only.toolkit["with_hook"]["result"] == "compat"      # the env beats any ld cache
    wrapper = run_assess(rootfs, host("555.58.02"), env=env, actors=("wrapper",))
    assert wrapper.warnings == []
    assert wrapper.spec_edits[0] == "LD_LIBRARY_PATH=/opt/lib"
    assert wrapper.toolkit["with_wrapper"]["result"] == "host"


# -- hostile rootfs for the new paths ---------------------------------------------------------------

@pytest.mark.slow
def test_hostile_dropins_are_confined_bounded_and_never_block(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.conf").write_text("/usr/local/cuda/compat\n")
    entries = dict(IMAGE)
    entries.update({
        "etc/ld.so.conf.d/00-fifo.conf": Fifo(),                                  # never opened
        "etc/ld.so.conf.d/01-out.conf": Symlink(str(outside / "secret.conf")),     # resolved in the root
        "etc/ld.so.conf.d/02-dotdot.conf": Symlink("../../../../../../" + str(outside / "secret.conf")),
        "etc/ld.so.conf.d/03-dir.conf": Dir(),
        "etc/ld.so.conf.d/04-paths.conf": "../../usr/local/cuda/compat\n/usr/local/cuda/compat/../../../../etc\n",
        f"{SYS.lstrip('/')}/libcuda.so.555.58.02": Symlink("/etc/passwd"),       # not a regular file
    })
    for i in range(5000):
        entries[f"etc/ld.so.conf.d/5{i:05d}-many.conf"] = "/opt/x\n"
    rootfs = build_tree(tmp_path / "r", entries)
    snap = snapshot_tree(tmp_path)
    t0 = time.monotonic()
    a = run_assess(rootfs, host("555.58.02"))
    assert time.monotonic() - t0 < 10
    assert snapshot_tree(tmp_path) == snap  # read-only
    files = [d["file"] for d in a.dropins]
    assert "00-fifo.conf" not in files and "01-out.conf" not in files and "02-dotdot.conf" not in files
    assert any("only the first 512 read" in n for n in a.notes)
    # the host library is a symlink in the image: not the runtime's mount, nothing to name
    assert a.hook_target is None and a.effect == "host"


# a dir whose name only starts with "compat" is no compat dir (found when a run's temp dir was named so)
@pytest.mark.parametrize("where", ["hostlibs", "compat-tools/hostlibs", "compatibility/lib"])
def test_host_lib_dir_through_a_symlink_out_of_the_rootfs_stays_inside(tmp_path, where):
    outside = tmp_path / where
    build_tree(outside, {"libcuda.so.555.58.02": b"host"})
    rootfs = build_tree(tmp_path / "r", dict(IMAGE, **{"usr/lib/x86_64-linux-gnu": Symlink(str(outside))}))
    a = run_assess(rootfs, host("555.58.02"))
    assert a.hook_target is None  # the link resolves inside the rootfs, where there is no such file
    build_tree(rootfs / str(outside).lstrip("/"), {"libcuda.so.555.58.02": b"in-root copy"})
    a = run_assess(rootfs, host("555.58.02"))
    assert a.hook_target == str(outside)  # the in-root path the container sees, never a host path


@pytest.mark.slow
def test_hook_with_hostile_dropins_fails_open_and_writes_only_its_own_file(tmp_path):
    entries = dict(IMAGE)
    entries.update({"etc/ld.so.conf.d/00-fifo.conf": Fifo(),
                    f"{SYS.lstrip('/')}/libcuda.so.555.58.02": b"host",
                    "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n"})
    bundle = tmp_path / "b"
    build_tree(bundle / "rootfs", entries)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                    "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}))
    hroot = build_tree(tmp_path / "host", {"proc/driver/nvidia/version":
                                           "NVRM version: NVIDIA UNIX x86_64 Kernel Module  555.58.02  x\n"})
    log = tmp_path / "log"
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"host_root": str(hroot), "nvml": "off", "log_file": str(log),
                                "ldconfig_timeout": 2}))  # ldconfig blocks on the FIFO: bounded
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1, "bundle": str(bundle)})
    before = snapshot_tree(bundle / "rootfs")
    # a createContainer hook runs in the container's mount namespace: a private one here, so the host's
    # library it mounts over the compat file goes with it
    p = subprocess.run(["unshare", "-m", "--propagation", "private", PYTHON, "-m", "compat_hook", "hook", "--stage",
                        "createContainer", "--config", str(conf), "--state-dir", str(tmp_path / "state")],
                       input=state, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr
    rec = json.loads(log.read_text().splitlines()[-1])
    assert rec["effect"] == "host" and rec["actions"][0].startswith("bind-mounted "), rec
    assert rec["actions"][1] == f"wrote {ldcache.DROPIN_PATH}", rec
    # ldconfig itself blocks reading the image's FIFO: killed at the timeout, our drop-in taken
    # out again, and the container starts without a change (fail-open)
    assert (rec["decision"], rec["reason"]) == ("error", "ldconfig_failed"), rec
    assert f"removed {ldcache.DROPIN_PATH} again (ldconfig failed)" in rec["actions"]
    assert not os.path.lexists(bundle / "rootfs" / ldcache.DROPIN_PATH.lstrip("/"))
    after = snapshot_tree(bundle / "rootfs")
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {b"etc/ld.so.conf.d/00-00-compat-hook.conf", b"etc/ld.so.cache", b"etc/ld.so.conf.d",
                       b"etc", b"usr/local/cuda-12.4/compat", b"usr/local/cuda-12.4/compat/libcuda.so.1",
                       b"usr/lib/x86_64-linux-gnu"}, changed
    assert os.path.exists(bundle / "rootfs/etc/ld.so.conf.d/00-fifo.conf")


# -- the log line an operator reads during an incident -----------------------------------------------

@pytest.mark.parametrize("annotations, want", [
    ({"io.kubernetes.cri.sandbox-name": "train-0", "io.kubernetes.cri.sandbox-namespace": "ml",
      "io.kubernetes.cri.container-name": "trainer", "io.kubernetes.cri.image-name": "nvcr.io/x/app:1"},
     {"pod": "train-0", "namespace": "ml", "container_name": "trainer", "image": "nvcr.io/x/app:1"}),
    ({"io.kubernetes.pod.name": "p", "io.kubernetes.pod.namespace": "n", "io.kubernetes.container.name": "c",
      "io.kubernetes.cri-o.ImageName": "quay.io/y:2"},
     {"pod": "p", "namespace": "n", "container_name": "c", "image": "quay.io/y:2"}),
    ({}, {}),
], ids=["containerd-cri", "cri-o", "none"])
def test_log_line_names_the_pod_and_says_what_was_tried(tmp_path, annotations, want):
    bundle = tmp_path / "b"
    build_tree(bundle / "rootfs", IMAGE)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"}, "annotations": annotations,
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}))
    nohost = tmp_path / "host"
    nohost.mkdir()
    log = tmp_path / "log"
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"host_root": str(nohost), "nvml": "off", "log_file": str(log)}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1, "bundle": str(bundle)})
    p = subprocess.run([PYTHON, "-m", "compat_hook", "hook", "--stage", "createContainer", "--config", str(conf),
                        "--state-dir", str(tmp_path / "state")], input=state, capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr
    rec = json.loads(log.read_text().splitlines()[-1])
    assert {k: rec[k] for k in want} == want and not set(want) ^ ({"pod", "namespace", "container_name",
                                                                   "image"} & set(rec))
    # a skip still names the compat driver it kept away; an unknown driver says where it looked
    assert (rec["reason"], rec["effect"], rec["compat_version"]) == ("host_driver_unknown", "leave", "550.163.01")
    assert rec["host_driver_tried"][:2] == ["/proc/driver/nvidia/version", "/sys/module/nvidia/version"]
    assert rec["left_alone"].startswith("host_driver_unknown: ")


def test_a_compat_dir_linked_elsewhere_is_never_masked(tmp_path):
    """Hostile: /usr/local/cuda/compat -> /etc with LD_LIBRARY_PATH naming it: /etc is not hidden."""
    entries = {k: v for k, v in IMAGE.items() if not k.startswith("usr/local/cuda")}
    entries.update({"usr/local/cuda/compat": Symlink("/etc"), "etc/libcuda.so.550.163.01": elf(NOTE_550),
                    f"{SYS.lstrip('/')}/libcuda.so.555.58.02": b"host"})
    rootfs = build_tree(tmp_path / "r", entries)
    a = run_assess(rootfs, host("555.58.02"), env=("NVIDIA_VISIBLE_DEVICES=all",
                                                    "LD_LIBRARY_PATH=/usr/local/cuda/compat"))
    assert a.effect == "host" and a.hook_masks == []
    assert any("resolves to /etc, not a compat dir: not masked" in n for n in a.notes)


# -- a baked compat drop-in beside a host library mounted as libcuda.so.1 only ----------------------

BAKED = dict(IMAGE, **{"etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat\n",
                       f"{SYS.lstrip('/')}/libcuda.so.1": b"host, mounted unversioned"})


def assess_spec(rootfs, h, spec_extra=None, actors=("hook",), mount_ns=True):
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "root": {"path": str(rootfs)}, **(spec_extra or {})}
    with Root(str(rootfs)) as root:
        return assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=h, actors=actors,
                      toolkit=True, mount_ns=mount_ns,
                      hook_entry=lambda: {"path": "/usr/bin/python3", "args": ["python3", "compat_hook", "hook"]})


def test_unversioned_host_lib_beside_a_baked_dropin_masks_the_compat_dir_at_create_container(tmp_path):
    rootfs = build_tree(tmp_path / "r", BAKED)
    a = assess_spec(rootfs, host("555.58.02"))
    assert (a.decision.reason, a.effect, a.hook_target) == ("compat_not_newer", "host", None)
    assert a.hook_masks == ["/usr/local/cuda-12.4/compat"] and a.hook_refresh is True
    # the image's ld cache points into the masked dir: it is rebuilt after the mask
    assert a.hook == [("ldconfig", None)] and a.warnings == []
    assert a.effects()["hook"] == [
        "mask /usr/local/cuda-12.4/compat with an empty read-only tmpfs (createContainer)",
        "refresh the container's ld cache (ldconfig -r)"]


def test_unversioned_host_lib_beside_a_baked_dropin_warns_at_prestart(tmp_path):
    rootfs = build_tree(tmp_path / "r", BAKED)
    a = assess_spec(rootfs, host("555.58.02"), mount_ns=False)
    assert (a.effect, a.hook_masks, a.hook) == ("host", [], [])
    [w] = a.warnings
    assert w.startswith("/etc/ld.so.conf.d/00-cuda-compat.conf names /usr/local/cuda/compat, a compat dir")
    assert "libcuda.so.555.58.02" in w and "register the hook at createContainer" in w
    assert a.log_fields()["warnings"] == [w]


def test_unversioned_host_lib_named_by_a_spec_mount_takes_the_dropin_route(tmp_path):
    """A hand-written runtime config mounts the host library as libcuda.so.1: the spec says where it
    is, so our drop-in names that dir (at prestart too: ldconfig runs in the container's namespace)."""
    rootfs = build_tree(tmp_path / "r", BAKED)
    mounts = {"mounts": [{"destination": f"{SYS}/libcuda.so.1", "type": "bind", "options": ["ro", "rbind"],
                          "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02"}]}
    for mount_ns in (True, False):
        a = assess_spec(rootfs, host("555.58.02"), mounts, mount_ns=mount_ns)
        assert a.hook == [("write_dropin", SYS), ("ldconfig", None)] and a.hook_purpose == "host"
        assert a.hook_masks == [] and a.warnings == []
        assert f"the spec bind-mounts the host driver's library at {SYS}/libcuda.so.1: its dir goes first" in a.notes
    # a mount into a compat dir is never the host library's dir
    into_compat = {"mounts": [{"destination": "/usr/local/cuda/compat/libcuda.so.1", "type": "bind",
                               "source": "/x/libcuda.so.1"}]}
    a = assess_spec(rootfs, host("555.58.02"), into_compat)
    assert a.hook_target is None and a.hook_masks == ["/usr/local/cuda-12.4/compat"]


def test_wrapper_adds_the_create_container_hook_that_masks(tmp_path):
    rootfs = build_tree(tmp_path / "r", BAKED)
    w = assess_spec(rootfs, host("555.58.02"), actors=("wrapper",))
    assert w.effect == "host" and w.wrapper["hooks"][0][0] == "createContainer"
    assert "added createContainer hook /usr/bin/python3" in w.spec_edits
    assert w.warnings == [] and w.hook_masks == []  # the hook it adds does the masking


def test_a_baked_dropin_naming_a_dir_linked_elsewhere_is_never_masked(tmp_path):
    entries = {k: v for k, v in BAKED.items() if not k.startswith("usr/local/cuda")}
    entries.update({"etc/libcuda.so.550.163.01": elf(NOTE_550), "usr/local/cuda/compat": Symlink("/etc"),
                    "etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat\n"})
    rootfs = build_tree(tmp_path / "r", entries)
    a = assess_spec(rootfs, host("555.58.02"))
    assert a.effect == "host" and a.hook_masks == [] and a.hook == []
    assert any("drop-in entry /usr/local/cuda/compat resolves to /etc, not a compat dir" in n for n in a.notes)
    [w] = a.warnings  # nothing it may do: it says so rather than a silent "host"
    assert "resolves to no compat dir compat-hook may hide" in w and "libcuda.so.555.58.02" in w


def test_env_mode_warns_the_hook_alone_only_where_the_compat_dir_is_not_first(tmp_path):
    """mode: env with the hook alone writes no drop-in, so the compat driver does not map, and the hook says so;
    the hook the runtime wrapper adds meets the LD_LIBRARY_PATH the wrapper wrote (the compat dir first): the
    compat driver maps, and the hook must not claim otherwise."""
    rootfs = build_tree(tmp_path / "r", IMAGE)
    cfg = config_for(None, mode="env")
    hook = lambda: {"path": "/usr/bin/python3", "args": ["python3", "compat_hook", "hook"]}  # noqa: E731
    said = {}
    for name, env in (("alone", ["NVIDIA_VISIBLE_DEVICES=all"]),
                      ("wrapper wrote it", ["NVIDIA_VISIBLE_DEVICES=all",
                                            "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/cuda/lib64/stubs"])):
        spec = {"process": {"env": env}, "root": {"path": str(rootfs)}}
        with Root(str(rootfs)) as root:
            a = assess(cfg, Request.from_spec(spec), root, spec=spec, host=host("535.261.03"), actors=("hook",),
                       toolkit=True, mount_ns=True, hook_entry=hook)
        assert (a.decision.action, a.effect) == ("enable", "compat"), a.decision
        said[name] = [w for w in a.warnings if w.startswith("mode: env: the hook writes no drop-in")]
    assert len(said["alone"]) == 1 and said["wrapper wrote it"] == [], said
