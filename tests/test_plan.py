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
    assert r["summary"] == {"images": 2, "read": 2, "unreadable": 0, "unknown_workloads": 0, "broken_after": 0,
                            "regressions": 0, "broken_now_and_after": 0, "changed": 1,
                            "broken_after_toolkit_only": 0, "fixed_by_compat_hook": 0}
    assert b["regression"] is False and p["regression"] is False


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
    (["--driver", "580.65.06", "--host-root", "/nonexistent-dir/compat-hook-test"], "no such directory"),
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
    # one source unreadable: exit 4, one line on stderr; the table still shows what was read
    assert out.returncode == 4, out.stderr
    assert out.stderr == "compat-hook: 1 of 2 source(s) unreadable (--allow-unreadable to accept)\n"
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["IMAGE", "NEEDS", "NOW", "550.54.15"]
    # the row says unreadable; the error is on a line of its own, not in the TOOLKIT ALONE column
    assert lines[2].split()[1:] == ["-", "unreadable", "-", "-", "-"] and "missing" in lines[2]
    assert lines[3] == f"unreadable: {world['tmp'] / 'missing'}: {world['tmp'] / 'missing'}: not a directory, " \
                       "nor oci:..., oci-archive:..., docker-archive:..., containerd:..., docker:..., " \
                       "containers-storage:..."
    assert lines[-1].startswith("2 image(s): 0 broken after the upgrade, 1 change outcome, 1 unreadable")
    ok = plan(str(world["img"]), str(world["tmp"] / "missing"), "--driver", "580.65.06", "--config", world["conf"],
              "--allow-unreadable")
    assert ok.returncode == 0 and ok.stderr == "" and ok.stdout == out.stdout


# --------------------------------------------------------------------------- the gate on nothing read


@pytest.mark.parametrize("fail_on", ["broken", "change", None])
def test_nothing_read_is_exit_4_not_a_green_gate(world, fail_on):
    # a path of the test's own: a shared machine's /nonexistent may exist (a tool's HOME=/nonexistent cache)
    missing = str(world["tmp"] / "nonexistent")
    args = [missing, "--driver", "580.65.06", "--config", world["conf"], "--json"]
    args += ["--fail-on", fail_on] if fail_on else []
    out = plan(*args)
    assert out.returncode == 4, (out.returncode, out.stderr)
    assert out.stderr.splitlines() == ["compat-hook: 1 of 1 source(s) unreadable, nothing read: the gate "
                                       "checked nothing (--allow-unreadable to accept)"]
    r = json.loads(out.stdout)
    [row] = r["images"]
    assert row["error"] == f"{missing}: not a directory, nor oci:..., oci-archive:..., docker-archive:..., " \
                           "containerd:..., docker:..., containers-storage:..." and row["error_code"] == "usage"
    assert row["toolkit_only_after"] is None and r["summary"]["read"] == 0
    allowed = plan(*args, "--allow-unreadable")
    assert allowed.returncode == 0 and allowed.stderr == "" and json.loads(allowed.stdout)["allow_unreadable"]


def test_containerd_without_a_socket_anywhere_is_exit_4_naming_every_place(world):
    out = plan("containerd:", "--driver", "580.65.06", "--config", world["conf"], "--json", "--fail-on", "broken")
    assert out.returncode == 4, out.stderr
    r = json.loads(out.stdout)
    host = world["tmp"] / "host"
    assert r["containerd"] == {"address": None, "found_by": None, "namespace": "k8s.io", "error": r["containerd"]["error"]}
    assert r["images"][0]["error"] == (
        f"containerd: no socket at {host}/run/containerd/containerd.sock (containerd default), "
        f"{host}/run/k3s/containerd/containerd.sock (k3s/RKE2), "
        f"{host}/var/snap/microk8s/common/run/containerd.sock (microk8s): give --address")


# --------------------------------------------------------------------------- --gpu names


@pytest.mark.parametrize("name, model, brand, cc", [
    ("H100", "NVIDIA H100", "NVIDIA", "9.0"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA", "9.0"),
    ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "NVIDIA H100 80GB HBM3", "NVIDIA", "9.0"),
    ("L40S", "NVIDIA L40S", "NVIDIA", "8.9"),
    ("V100", "Tesla V100", "TESLA", "7.0"),
    ("T4", "Tesla T4", "TESLA", "7.5"),
    ("B200", "NVIDIA B200", "NVIDIA", "10.0"),
    ("RTX 4090", "NVIDIA GeForce RTX 4090", "GEFORCE", "8.9"),
    ("NVIDIA-GeForce-RTX-4090", "NVIDIA GeForce RTX 4090", "GEFORCE", "8.9"),
    ("RTX A6000", "NVIDIA RTX A6000", "NVIDIA_RTX", "8.6"),
    ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", "NVIDIA_RTX", "8.9"),
    ("NVIDIA TITAN RTX", "NVIDIA TITAN RTX", "TITAN", "7.5"),
])
def test_gpu_names_operators_type(world, name, model, brand, cc):
    r = _json(plan(str(world["plain"]), "--driver", "580.65.06", "--gpu", name, "--config", world["conf"], "--json"))
    [g] = r["gpus"]
    assert (g["model"], g["brand_name"], g["compute_capability"]) == (model, brand, cc)


def test_gpu_h100_short_name_is_a_data_center_gpu_not_unknown(world):
    """``--gpu H100`` predicted what ``--gpu NVIDIA-H100-80GB-HBM3`` does (it was brand UNKNOWN: 804)."""
    args = [str(world["bundle"]), "--driver", "535.183.01", "--config", world["conf"], "--json"]
    short = _json(plan(*args, "--gpu", "H100"))
    label = _json(plan(*args, "--gpu", "NVIDIA-H100-80GB-HBM3"))
    assert short["images"] == label["images"]
    assert short["images"][0]["after"]["outcome"] == "compat", short["images"][0]


def test_gpu_arch_check_uses_the_named_gpus_compute_capability(world):
    """A V100 (7.0) gets no R590+ compat driver: ``gpu_arch_unsupported``; an H100 gets it."""
    from tests.elfgen import NOTE_590

    build_tree(world["tmp"] / "img590", {"usr/local/cuda-13.1/compat/libcuda.so.590.44.01": elf(NOTE_590),
                                         "usr/local/cuda": Symlink("cuda-13.1")})
    args = [str(world["tmp"] / "img590"), "--driver", "580.65.06", "--config", world["conf"], "--json"]
    assert _json(plan(*args, "--gpu", "V100"))["images"][0]["after"]["reason"] == "gpu_arch_unsupported"
    assert _json(plan(*args, "--gpu", "H100"))["images"][0]["after"]["reason"] != "gpu_arch_unsupported"


@pytest.mark.parametrize("name", ["H1OO", "banana", "NVIDIA Graphics Device"])
def test_unknown_gpu_name_is_exit_2_listing_the_forms(world, name):
    out = plan(str(world["plain"]), "--driver", "580.65.06", "--gpu", name, "--config", world["conf"])
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert line.startswith(f"compat-hook: --gpu {name!r}: not a GPU name compat-hook knows; give an NVML name")
    for form in ("NVIDIA-H100-80GB-HBM3", "MIG-1g.5gb", "H100", "L40S", "RTX 4090", "GeForce ..."):
        assert form in line


# --------------------------------------------------------------------------- the runtime the image carries

LIBCUDART_13 = {"usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.13.0.48": elf(soname="libcudart.so.13"),
                "usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.13": Symlink("libcudart.so.13.0.48"),
                "usr/local/cuda-13.0/lib64": Symlink("targets/x86_64-linux/lib"),
                "usr/local/cuda": Symlink("cuda-13.0")}
SITE = "usr/local/lib/python3.11/site-packages"
WHEEL_12 = {f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12": elf(soname="libcudart.so.12"),
            f"{SITE}/nvidia_cuda_runtime_cu12-12.4.127.dist-info/METADATA":
                "Metadata-Version: 2.1\nName: nvidia-cuda-runtime-cu12\nVersion: 12.4.127\n\nCUDA Runtime\n"}
TORCH_128 = {f"{SITE}/torch/version.py": "from typing import Optional\n__version__ = '2.7.0+cu128'\n"
                                         "cuda: Optional[str] = '12.8'\ngit_version = 'abc'\n"}
CONDA_129 = {"opt/conda/conda-meta/cuda-cudart-12.9.79-h5888daf_0.json": '{"name": "cuda-cudart"}',
             "opt/conda/conda-meta/cuda-cudart-dev-13.1.0-0.json": '{"name": "not the runtime"}',
             "opt/conda/lib/libcudart.so.12": Symlink("libcudart.so.12.9.79"),
             "opt/conda/lib/libcudart.so.12.9.79": elf(soname="libcudart.so.12")}


@pytest.mark.parametrize("files, needs, source, path", [
    (LIBCUDART_13, "13.0", "libcudart", "/usr/local/cuda/lib64/libcudart.so.13.0.48"),
    (WHEEL_12, "12.4", "wheel", f"/{SITE}/nvidia_cuda_runtime_cu12-12.4.127.dist-info/METADATA"),
    (TORCH_128, "12.8", "torch", f"/{SITE}/torch/version.py"),
    (CONDA_129, "12.9", "libcudart", "/opt/conda/lib/libcudart.so.12.9.79"),
], ids=["libcudart", "wheel", "torch", "conda"])
def test_image_without_cuda_version_needs_the_runtime_it_carries(world, files, needs, source, path):
    img = build_tree(world["tmp"] / "rt", dict(files, **{"etc/os-release": "ID=debian\n"}))
    out = plan(str(img), "--driver", "535.261.03", "--config", world["conf"], "--json", "--fail-on", "broken")
    r = _json(out)
    [row] = r["images"]
    assert (row["needs_cuda"], row["needs_source"]) == (needs, f"{source} {path}"), row
    # R535 gives CUDA 12.2: a 13.0 runtime is error 35; a 12.x runtime runs under minor-version compat
    want = {"outcome": "broken", "reason": "no_candidate", "cuda": "12.2", "error": 35} if needs == "13.0" else \
        {"outcome": "host-minor", "reason": "no_candidate", "cuda": "12.2", "error": 222}
    assert row["after"] == want
    assert out.returncode == (3 if needs == "13.0" else 0)
    assert "warnings" not in row


def test_conda_meta_alone_is_a_source(world):
    img = build_tree(world["tmp"] / "conda", {k: v for k, v in CONDA_129.items() if "conda-meta" in k})
    [row] = _json(plan(str(img), "--driver", "535.261.03", "--config", world["conf"], "--json"))["images"]
    assert row["needs_source"] == "conda /opt/conda/conda-meta/cuda-cudart-12.9.79-h5888daf_0.json"
    assert row["needs_sources"] == [{"source": "conda", "path": "/opt/conda/conda-meta/cuda-cudart-12.9.79-h5888daf_0.json",
                                     "version": "12.9.79"}]


def test_sources_that_disagree_take_the_highest_and_warn(world):
    bundle = world["tmp"] / "mixed-bundle"
    build_tree(bundle / "rootfs", dict(LIBCUDART_13, **WHEEL_12, **TORCH_128))
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                    "process": {"env": ["CUDA_VERSION=12.4.1"]}}))
    out = plan(str(bundle), "--driver", "535.261.03", "--config", world["conf"], "--json")
    [row] = _json(out)["images"]
    assert row["needs_cuda"] == "13.0" and row["needs_source"].startswith("libcudart ")
    assert [s["source"] for s in row["needs_sources"]] == ["libcudart", "libcudart", "wheel", "torch", "env"]
    [w] = row["warnings"]
    assert w.startswith("the image names several CUDA versions: 13.0 (libcudart ") and \
        w.endswith("12.4 (wheel /usr/local/lib/python3.11/site-packages/nvidia_cuda_runtime_cu12-12.4.127.dist-info/"
                   "METADATA), 12.8 (torch /usr/local/lib/python3.11/site-packages/torch/version.py); planned for "
                   "the highest, 13.0"), w
    assert row["after"]["outcome"] == "broken"
    text = plan(str(bundle), "--driver", "535.261.03", "--config", world["conf"]).stdout.splitlines()
    assert text[0].split()[-2:] == ["NEEDS", "FROM"]
    assert text[1].split()[1] == "13.0" and text[1].split()[-1] == "libcudart"
    assert text[2].startswith(f"warning: {bundle}: the image names several CUDA versions: 13.0")


def test_cuda_version_env_alone_still_counts(world):
    """The env is a source too: the 13.0 image with CUDA_VERSION=13.0.0 and no files is predicted the same."""
    bundle = world["tmp"] / "env-only"
    build_tree(bundle / "rootfs", {"etc/os-release": "x"})
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                    "process": {"env": ["CUDA_VERSION=13.0.0"]}}))
    [row] = _json(plan(str(bundle), "--driver", "535.261.03", "--config", world["conf"], "--json"))["images"]
    assert row["needs_source"] == "env CUDA_VERSION" and row["after"]["error"] == 35


# --------------------------------------------------------------------------- CUDA's minor-version compatibility

NOTE_550 = '{"format":1,"CUDA version":"12.4","driver":[470,525,535],"device":[1,2,7,8,9,10,11,12,13,14]}'
COMPAT_550_FILES = {"usr/local/cuda-12.4/compat/libcuda.so.550.163.01": elf(NOTE_550),
                    "usr/local/cuda-12.4/compat/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                    "usr/local/cuda": Symlink("cuda-12.4")}


def _wheel(version: str) -> dict:
    major = version.split(".")[0]
    return {f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.{major}": elf(soname=f"libcudart.so.{major}"),
            f"{SITE}/nvidia_cuda_runtime_cu{major}-{version}.dist-info/METADATA":
                f"Metadata-Version: 2.1\nName: nvidia-cuda-runtime-cu{major}\nVersion: {version}\n"}


def test_compat_550_with_a_cuda_12_8_wheel_on_535_is_compat_minor_not_broken(world):
    """Minor-version compatibility holds whoever provides the driver API: compat 12.4 serving a 12.8
    runtime runs (the PTX caveat, 222) exactly like a native R550 host serving it (host-minor)."""
    img = build_tree(world["tmp"] / "c550w128", dict(COMPAT_550_FILES, **_wheel("12.8.90")))
    args = [str(img), "--from-driver", "535.261.03", "--config", world["conf"], "--json", "--fail-on", "broken"]
    out = plan(*args, "--driver", "535.261.03")
    assert out.returncode == 0, out.stdout
    [row] = _json(out)["images"]
    assert row["needs_cuda"] == "12.8"
    assert row["now"] == {"outcome": "compat-minor", "reason": "compat_newer_supported", "cuda": "12.4", "error": 222}
    assert row["after"] == row["now"] and row["regression"] is False
    # the NVIDIA toolkit alone enables the same compat driver (550 > 535, 535 in its list): the same outcome
    assert row["toolkit_only_after"]["outcome"] == "compat-minor"
    # the same runtime on a native R550 host, without compat: host-minor, and the gate passes both alike
    plain = build_tree(world["tmp"] / "w128", _wheel("12.8.90"))
    out = plan(str(plain), "--from-driver", "550.163.01", "--driver", "550.163.01", "--config", world["conf"],
               "--json", "--fail-on", "broken")
    assert out.returncode == 0
    assert _json(out)["images"][0]["now"]["outcome"] == "host-minor"


def test_compat_serving_an_older_major_is_broken_with_35(world):
    img = build_tree(world["tmp"] / "c550w13", dict(COMPAT_550_FILES, **_wheel("13.0.48")))
    out = plan(str(img), "--from-driver", "535.261.03", "--driver", "535.261.03", "--config", world["conf"],
               "--json", "--fail-on", "broken")
    assert out.returncode == 3
    [row] = _json(out)["images"]
    assert row["now"] == {"outcome": "broken", "reason": "compat_newer_supported", "cuda": "12.4", "error": 35}
    # broken before and after alike: not a regression, counted apart
    assert row["regression"] is False
    r = _json(out)
    assert (r["summary"]["broken_now_and_after"], r["summary"]["regressions"]) == (1, 0)
    assert plan(str(img), "--from-driver", "535.261.03", "--driver", "535.261.03", "--config", world["conf"],
                "--fail-on", "regression").returncode == 0


# --------------------------------------------------------------------------- --fail-on regression


def test_fail_on_regression_is_about_what_works_now(world):
    """An image that works on 550 (compat 575) and is broken on a rollback to 470 (no compat for it, CUDA
    11.4: a major-version gap) fails --fail-on regression; the same driver before and after is none."""
    (world["bundle"] / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": ["CUDA_VERSION=12.9.0"]}}))
    out = plan(str(world["bundle"]), "--driver", "470.256.02", "--config", world["conf"], "--json",
               "--fail-on", "regression")
    assert out.returncode == 3
    [row] = _json(out)["images"]
    assert row["now"]["outcome"] == "compat" and row["after"]["outcome"] == "broken" and row["regression"] is True
    assert row["after"]["error"] == 35
    same = plan(str(world["bundle"]), "--driver", "470.256.02", "--from-driver", "470.256.02",
                "--config", world["conf"], "--json", "--fail-on", "regression")
    assert same.returncode == 0 and _json(same)["images"][0]["regression"] is False


def test_help_lists_every_fail_on(world):
    out = subprocess.run([PYTHON, "-m", "compat_hook", "plan", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    assert "{broken,regression,change}" in out.stdout
    text = " ".join(out.stdout.split())
    assert "works now and is broken after it (regression)" in text


def test_the_images_other_libcuda_files_are_shown(world):
    """A symlinked compat file and a userland driver in the image's system lib dir are facts of the row,
    with what ldconfig links in that dir (the image's 575 over the host's 550 mounted beside it)."""
    img = build_tree(world["tmp"] / "other", {
        "opt/nv/libcuda.so.575.57.08": elf(NOTE_575),
        "usr/local/cuda-12.9/compat/libcuda.so.575.57.08": Symlink("/opt/nv/libcuda.so.575.57.08"),
        "usr/local/cuda": Symlink("cuda-12.9"),
        "usr/lib/x86_64-linux-gnu/libcuda.so.575.57.08": elf(NOTE_575),
        "usr/lib/x86_64-linux-gnu/libcuda.so.1": Symlink("libcuda.so.575.57.08")})
    r = _json(plan(str(img), "--driver", "580.65.06", "--config", world["conf"], "--json"))
    [row] = r["images"]
    sys_dir = "/usr/lib/x86_64-linux-gnu"
    assert row["image_libcuda"] == {
        "symlinked": {"/usr/local/cuda-12.9/compat/libcuda.so.575.57.08": "/opt/nv/libcuda.so.575.57.08"},
        "userland": [f"{sys_dir}/libcuda.so.575.57.08"], "ldconfig_picks": {sys_dir: "libcuda.so.575.57.08"}}
    assert row["now"]["outcome"] == "compat"  # the symlinked compat driver is a candidate, not "no compat"
    text = plan(str(img), "--driver", "580.65.06", "--config", world["conf"])
    assert f"userland libcuda {sys_dir}/libcuda.so.575.57.08" in text.stdout, text.stdout
    assert "links to /opt/nv/libcuda.so.575.57.08" in text.stdout
