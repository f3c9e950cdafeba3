"""``compat-hook plan``: outcomes per image and driver, the target from manifests, exit statuses.

Sources here are rootfs and bundle dirs; images read without unpacking them are in
tests/test_plan_images.py. The outcome comes from the same assessment the hook runs, so a
few rows are checked against the hook's own decision on the same rootfs.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from tests.conftest import Symlink, build_tree, elf
from tests.elfgen import NOTE_575

REPO = str(pathlib.Path(__file__).resolve().parent.parent)
PYTHON = "/usr/bin/python3"

IMG_575 = {"usr/local/cuda-12.9/compat/libcuda.so.575.57.08": elf(NOTE_575),
           "usr/local/cuda-12.9/compat/libcuda.so.1": Symlink("libcuda.so.575.57.08"),
           "usr/local/cuda": Symlink("cuda-12.9")}


def plan(*args, cwd=REPO):
    return subprocess.run([PYTHON, "-m", "compat_hook", "plan", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def world(tmp_path):
    build_tree(tmp_path / "host", {"proc/driver/nvidia/version":
                                   "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Mon 2025\n"})
    img = build_tree(tmp_path / "img575", IMG_575)
    bundle = tmp_path / "bundle"
    build_tree(bundle / "rootfs", IMG_575)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"env": ["CUDA_VERSION=12.9.0", "NVIDIA_REQUIRE_CUDA=cuda>=12.9 brand=tesla,driver>=535"]}}))
    plain = build_tree(tmp_path / "plain", {"etc/os-release": "x"})
    conf = tmp_path / "c.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {tmp_path / 'host'}\nstore_dir: {tmp_path / 'store'}\n")
    return {"img": img, "bundle": bundle, "plain": plain, "conf": str(conf), "tmp": tmp_path}


def _json(out):
    assert out.returncode in (0, 3), out.stderr
    assert out.stderr == ""
    return json.loads(out.stdout)


def test_outcomes_now_and_after(world):
    r = _json(plan(str(world["bundle"]), str(world["plain"]), "--driver", "580.65.06", "--config", world["conf"],
                   "--json"))
    assert r["driver"] == {"now": "550.54.15", "after": "580.65.06", "target_from": "--driver"}
    b, p = r["images"]
    # host 550 (CUDA 12.4) needs the 575 compat driver for 12.9; 580 (13.0) runs it natively
    assert b["needs_cuda"] == "12.9"
    assert b["now"] == {"outcome": "compat", "reason": "compat_newer_supported", "cuda": "12.9", "error": None}
    assert b["after"] == {"outcome": "host", "reason": "compat_not_newer", "cuda": "13.0", "error": None}
    # the toolkit alone: its v1.20 rule refuses the older compat driver too (no image drop-in here)
    assert b["toolkit_only_after"]["outcome"] == "host"
    assert p["now"]["outcome"] == "host" and p["after"]["outcome"] == "host"
    assert r["summary"] == {"images": 2, "unreadable": 0, "broken_after": 0, "changed": 1,
                            "broken_after_toolkit_only": 0, "fixed_by_compat_hook": 0}


def test_baked_dropin_breaks_the_toolkit_alone_but_not_compat_hook(world):
    build_tree(world["bundle"] / "rootfs", {"etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat\n"})
    r = _json(plan(str(world["bundle"]), "--driver", "580.65.06", "--config", world["conf"], "--json"))
    [b] = r["images"]
    assert b["toolkit_only_after"] == {"outcome": "broken", "reason": "compat_not_newer", "cuda": None, "error": 803}
    assert b["after"]["outcome"] == "host"
    assert r["summary"]["fixed_by_compat_hook"] == 1


def test_geforce_gets_the_host_driver_and_minor_version_compat(world):
    r = _json(plan(str(world["bundle"]), "--driver", "570.133.20", "--gpu", "NVIDIA-GeForce-RTX-4090",
                   "--config", world["conf"], "--json"))
    [b] = r["images"]
    # compat 575 would be 804 on a GeForce: compat-hook keeps the host driver (12.8 < 12.9: same major)
    assert b["after"] == {"outcome": "host-minor", "reason": "device_unsupported", "cuda": "12.8", "error": 222}
    assert b["toolkit_only_after"]["error"] == 804
    assert r["gpus"][0]["brand_name"] == "GEFORCE"


def test_broken_after_and_fail_on(world):
    (world["bundle"] / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": ["CUDA_VERSION=13.1.0"]}}))
    # 545 is not in the note's branches: the host driver (12.3) for a 13.1 image is error 35
    out = plan(str(world["bundle"]), "--driver", "545.23.08", "--config", world["conf"], "--json",
               "--fail-on", "broken")
    assert out.returncode == 3
    r = _json(out)
    assert r["images"][0]["after"] == {"outcome": "broken", "reason": "host_branch_unsupported", "cuda": "12.3",
                                       "error": 35}
    assert r["images"][0]["now"]["error"] == 35  # the 575 compat driver gives 12.9, the image needs 13.1
    # 580 (13.0) runs a 13.1 image under minor-version compatibility: a risk (222), not broken
    out = plan(str(world["bundle"]), "--driver", "580.65.06", "--config", world["conf"], "--json",
               "--fail-on", "broken")
    assert out.returncode == 0
    assert _json(out)["images"][0]["after"] == {"outcome": "host-minor", "reason": "compat_not_newer",
                                                "cuda": "13.0", "error": 222}
    assert plan(str(world["plain"]), "--driver", "580.65.06", "--config", world["conf"],
                "--fail-on", "change").returncode == 0
    assert plan(str(world["img"]), "--driver", "580.65.06", "--config", world["conf"],
                "--fail-on", "change").returncode == 3


def test_same_decision_as_explain_on_each_driver(world):
    """plan reuses the assessment: its reasons are explain's for the same rootfs and driver."""
    for drv in ("535.183.01", "575.51.03", "575.57.08", "590.44.01"):
        r = _json(plan(str(world["img"]), "--driver", drv, "--config", world["conf"], "--json"))
        ex = subprocess.run([PYTHON, "-m", "compat_hook", "explain", "--rootfs", str(world["img"]),
                             "--host-driver-version", drv, "--config", world["conf"], "--json"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
        assert ex.returncode == 0, ex.stderr
        assert r["images"][0]["after"]["reason"] == json.loads(ex.stdout)["reason"], drv


MANIFESTS = {
    "clusterpolicy": ("apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cluster-policy}\n"
                      "spec:\n  driver:\n    version: \"580.65.06\"\n", 0, "580.65.06"),
    "nvidiadriver-multidoc": ("---\nkind: ConfigMap\nmetadata: {name: x}\n---\napiVersion: nvidia.com/v1alpha1\n"
                              "kind: NVIDIADriver\nmetadata: {name: h100}\nspec:\n  version: 575.57.08\n"
                              "  nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}\n", 0, "575.57.08"),
    "digest": ("kind: ClusterPolicy\nspec:\n  driver:\n    version: sha256:0123abcd\n", 2, "image digest"),
    "branch-only": ("kind: NVIDIADriver\nspec:\n  version: \"580\"\n", 2, "not a full driver version"),
    "nothing": ("kind: ConfigMap\n", 2, "no ClusterPolicy"),
    "bad-yaml": ("kind: [\n", 2, "not valid YAML"),
}


@pytest.mark.parametrize("name", MANIFESTS)
def test_target_from_manifest(world, name):
    text, rc, want = MANIFESTS[name]
    m = world["tmp"] / "m.yaml"
    m.write_text(text)
    out = plan(str(world["img"]), "--manifest", str(m), "--config", world["conf"], "--json")
    assert out.returncode == rc, out.stderr
    if rc == 0:
        assert json.loads(out.stdout)["driver"]["after"] == want
    else:
        assert out.stdout == "" and len(out.stderr.splitlines()) == 1 and want in out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, want", [
    (["--driver", "banana"], "not a full driver version"),
    (["--driver", "580.65.06", "--from-driver", "x"], "--from-driver"),
    (["--driver", "580.65.06", "--host-root", "/nonexistent-dir"], "no such directory"),
    ([], "one of the arguments --driver --manifest is required"),
])
def test_bad_usage_is_one_line_exit_2(world, args, want):
    out = plan(str(world["img"]), *args, "--config", world["conf"])
    assert out.returncode == 2 and want in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def test_unknown_host_driver_needs_from_driver(world, tmp_path):
    conf = tmp_path / "empty-host.yaml"
    (tmp_path / "nohost").mkdir()
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {tmp_path / 'nohost'}\n")
    out = plan(str(world["img"]), "--driver", "580.65.06", "--config", str(conf))
    assert out.returncode == 2 and "--from-driver" in out.stderr
    ok = plan(str(world["img"]), "--driver", "580.65.06", "--from-driver", "535.183.01", "--config", str(conf))
    assert ok.returncode == 0 and "NOW 535.183.01" in ok.stdout


def test_text_table_and_unreadable_source(world):
    out = plan(str(world["img"]), str(world["tmp"] / "missing"), "--driver", "580.65.06", "--config", world["conf"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["IMAGE", "NEEDS", "NOW", "550.54.15"]
    assert "unreadable" in lines[2] and "missing" in lines[2]
    assert lines[-1].startswith("2 image(s): 0 broken after the upgrade, 1 change outcome, 1 unreadable")
