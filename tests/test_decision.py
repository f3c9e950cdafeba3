"""compat_hook.policy.decision: every rule of its docstring, NVIDIA's conformance tables
(docs/background.md "The NVIDIA toolkit") driven through real generated rootfs trees, the
device/architecture/Tegra rules, the host store, and "no I/O".
"""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys

import pytest

from compat_hook.policy import decision as decision_mod
from compat_hook.facts import hostfacts, imagefacts
from compat_hook.core.config import from_mapping
from compat_hook.facts.container import Request
from compat_hook.policy.decision import REASONS, Decision, decide, decide_store
from compat_hook.facts.elfnote import inspect_elf
from compat_hook.facts.hostfacts import Gpu, HostFacts
from compat_hook.facts.imagefacts import ImageFacts
from compat_hook.facts.rootfs import Root
from compat_hook.core.versions import parse_version, try_parse_version
from tests.conftest import HOST_ARCH, Symlink, config_for, elf
from tests.elfgen import NOTE_575, NOTE_590, NOTE_ORIN, make_elf, orin_overrun_elf
from tests.support.measured import CUDA_ONLY, ELF575, ELF590, NOELF590, TESTDATA_575, measured_rootfs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OTHER_ARCH = "aarch64" if HOST_ARCH == "x86_64" else "x86_64"
NOTE_NO_DRIVER = '{"format":1,"CUDA version":"12.9"}'
NOTE_EMPTY_DRIVER = '{"format":1,"CUDA version":"12.9","driver":[],"device":[1,2]}'
NOTE_NO_CUDA = '{"format":1,"driver":[535,550,570]}'
NOTE_NO_DEVICE = '{"format":1,"CUDA version":"12.9","driver":[535,550,570]}'
CFG = from_mapping({"nvml": "off"})
WARN = from_mapping({"nvml": "off", "device_check": "warn"})
ORIN129_DIR = "/usr/local/cuda-12.9/compat_orin"


# -- fact builders (no rootfs: the pure decision) ----------------------------

def image(version="575.57.08", note=NOTE_575, *, data=None, compat_dir="/usr/local/cuda-12.9/compat",
          **elfkw) -> ImageFacts:
    """ImageFacts for one candidate ``libcuda.so.<version>`` with these bytes."""
    if data is None:
        elfkw.setdefault("machine", HOST_ARCH)
        data = make_elf(note_json=note, **elfkw)
    f = ImageFacts()
    f.status = "found"
    f.candidate = f"libcuda.so.{version}"
    f.candidates = [f.candidate]
    f.compat_dir = f.configured_dir = compat_dir
    f.compat_version_text = version
    if version == "1.1":
        f.tegra_lib = True
    else:
        f.compat_version = try_parse_version(version)
    f.elf = inspect_elf(io.BytesIO(data))
    f.elf_source = "parsed"
    return f


def host(driver=None, cuda=None, gpus=(), arch=HOST_ARCH, tegra=False) -> HostFacts:
    return HostFacts(driver_version=parse_version(driver) if driver else None,
                     driver_source="test" if driver else None,
                     cuda_version=parse_version(cuda) if cuda else None,
                     cuda_source="test" if cuda else None,
                     gpus=list(gpus), gpus_source="test" if gpus else None, tegra=tegra, arch=arch)


def gpu(brand, model="GPU", cc=None) -> Gpu:
    return Gpu("0000:17:00.0", model, brand, "nvml", cc)


def proc_gpu(model, pci_id=None) -> Gpu:
    """A GPU as hostfacts reads it without NVML: /proc's model name, sysfs' PCI device ID, no compute capability."""
    return Gpu("0000:17:00.0", model, hostfacts.brand_from_model(model), "proc-model-name", index=0, minor=0,
               pci_id=pci_id)


def req(*env, devices=(), **annotations) -> Request:
    spec = {"process": {"env": list(env)}, "annotations": annotations}
    if devices:
        spec["linux"] = {"devices": [{"path": p, "type": "c", "major": 195, "minor": int(p[11:])}
                                     for p in devices]}
    return Request.from_spec(spec)


H100_UUID = "GPU-5a1c0d3e-0000-4a4a-8b8b-000000000001"
RTX_UUID = "GPU-9e8d7c6b-0000-4b4b-8c8c-000000000002"


def two_gpus(first=(14, "NVIDIA H100 80GB HBM3", None), second=(5, "NVIDIA GeForce RTX 4090", None),
             mig=()) -> list:
    """An H100 at index 0 (minor 0) and a GeForce RTX 4090 at index 1 (minor 1), by default."""
    return [Gpu("0000:17:00.0", first[1], first[0], "nvml", first[2], index=0, uuid=H100_UUID, minor=0, mig=mig),
            Gpu("0000:65:00.0", second[1], second[0], "nvml", second[2], index=1, uuid=RTX_UUID, minor=1)]


def mixed(driver="550.54.15"):
    return host(driver, gpus=two_gpus())


GPU_REQ = req("NVIDIA_VISIBLE_DEVICES=all")


def none_image() -> ImageFacts:
    return ImageFacts()


def ambiguous_image() -> ImageFacts:
    f = ImageFacts()
    f.status = "ambiguous"
    f.compat_dir = "/usr/local/cuda/compat"
    f.candidates = ["libcuda.so.550.54.15", "libcuda.so.575.57.08"]
    return f


def unread_image() -> ImageFacts:
    f = image("575.57.08")
    f.elf = None
    return f


# (id, () -> (host, image, request, config), action, reason). One row per rule
# of decision.py's docstring and per reason code decide() can return.
CASES = [
    # 1. opt-out / no GPU request
    ("opt_out_annotation", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=all", **{"compat-hook/disable": "true"}), CFG), "skip", "opt_out"),
    ("opt_out_env", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=all", "COMPAT_HOOK_DISABLE=1"), CFG), "skip", "opt_out"),
    ("opt_out_beats_everything", lambda: (host(), none_image(), req("COMPAT_HOOK_DISABLE=yes"), CFG), "skip", "opt_out"),
    ("no_gpu_void", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=void"), CFG), "skip", "no_gpu_request"),
    ("no_gpu_none", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=none"), CFG), "skip", "no_gpu_request"),
    ("no_gpu_empty", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES="), CFG), "skip", "no_gpu_request"),
    ("no_gpu_unset", lambda: (host("550.54.15"), image(), req("PATH=/bin"), CFG), "skip", "no_gpu_request"),
    ("no_gpu_not_required", lambda: (host("550.54.15"), image(), req("PATH=/bin"), CFG.replace(require_gpu_request=False)), "enable", "compat_newer_supported"),
    ("gpu_by_device_node", lambda: (host("550.54.15"), image(), Request.from_spec({"linux": {"devices": [{"path": "/dev/nvidia0"}]}}), CFG), "enable", "compat_newer_supported"),
    ("gpu_by_cdi_annotation", lambda: (host("550.54.15"), image(), req(**{"cdi.k8s.io/nvidia": "nvidia.com/gpu=all"}), CFG), "enable", "compat_newer_supported"),
    ("dri_is_not_a_gpu_request", lambda: (host("550.54.15"), image(), Request.from_spec({"linux": {"devices": [{"path": "/dev/dri/card0"}]}}), CFG), "skip", "no_gpu_request"),
    # 2. no candidate / several
    ("no_candidate", lambda: (host("550.54.15"), none_image(), GPU_REQ, CFG), "skip", "no_candidate"),
    ("ambiguous", lambda: (host("550.54.15"), ambiguous_image(), GPU_REQ, CFG), "skip", "ambiguous_candidates"),
    ("unreadable", lambda: (host("550.54.15"), unread_image(), GPU_REQ, CFG), "skip", "candidate_unreadable"),
    # 3. not a loadable ELF for this host
    ("not_elf_text", lambda: (host("550.54.15"), image(data=b"this is not an ELF file\n"), GPU_REQ, CFG), "skip", "not_elf"),
    ("not_elf_empty", lambda: (host("550.54.15"), image(data=b""), GPU_REQ, CFG), "skip", "not_elf"),
    ("elf_class_32", lambda: (host("550.54.15"), image(elf_class=32, machine="i386"), GPU_REQ, CFG), "skip", "elf_class"),
    ("elf_machine_other", lambda: (host("550.54.15"), image(machine=OTHER_ARCH), GPU_REQ, CFG), "skip", "elf_machine"),
    ("elf_machine_unknown_host_arch", lambda: (host("550.54.15", arch="riscv64"), image(), GPU_REQ, CFG), "skip", "elf_machine"),
    ("elf_type_exec", lambda: (host("550.54.15"), image(elf_type=2), GPU_REQ, CFG), "skip", "elf_type"),
    ("soname_other", lambda: (host("550.54.15"), image(soname="libcuda.so.2"), GPU_REQ, CFG), "skip", "soname"),
    ("no_soname_is_fine", lambda: (host("550.54.15"), image(soname=None), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    # 4. host-CUDA path: a Tegra host only (Orin's compat_orin with a versioned libcuda here)
    ("cuda_path_newer", lambda: (host(cuda="12.8", tegra=True), image(compat_dir=ORIN129_DIR), GPU_REQ, CFG), "enable", "compat_cuda_newer"),
    ("cuda_path_equal", lambda: (host(cuda="12.9", tegra=True), image(compat_dir=ORIN129_DIR), GPU_REQ, CFG), "skip", "compat_cuda_not_newer"),
    ("cuda_path_12_10", lambda: (host(cuda="12.10", tegra=True), image(compat_dir=ORIN129_DIR), GPU_REQ, CFG), "skip", "compat_cuda_not_newer"),
    ("cuda_path_no_note", lambda: (host(cuda="12.8", tegra=True), image(note=None, compat_dir=ORIN129_DIR), GPU_REQ, CFG), "skip", "note_cuda_missing"),
    ("cuda_path_note_without_cuda", lambda: (host(cuda="12.8", tegra=True), image(note=NOTE_NO_CUDA, compat_dir=ORIN129_DIR), GPU_REQ, CFG), "skip", "note_cuda_missing"),
    # ... never on a dGPU host whose driver version is unknown, whatever CUDA version is known (issue 32)
    ("dgpu_host_cuda_only_is_driver_unknown", lambda: (host(cuda="12.8"), image(), GPU_REQ, CFG), "skip", "host_driver_unknown"),
    ("dgpu_host_cuda_only_590", lambda: (host(cuda="12.4"), image("590.44.01", NOTE_590), GPU_REQ, CFG), "skip", "host_driver_unknown"),
    ("dgpu_host_cuda_only_no_note", lambda: (host(cuda="12.4"), image("580.65.06", None), GPU_REQ, CFG), "skip", "host_driver_unknown"),
    ("tegra_newer", lambda: (host(cuda="13.1", tegra=True), image("1.1", NOTE_ORIN), GPU_REQ, CFG), "enable", "compat_cuda_newer"),
    ("tegra_equal", lambda: (host(cuda="13.2", tegra=True), image("1.1", NOTE_ORIN), GPU_REQ, CFG), "skip", "compat_cuda_not_newer"),
    ("tegra_no_host_cuda", lambda: (host(tegra=True), image("1.1", NOTE_ORIN), GPU_REQ, CFG), "skip", "host_cuda_unknown"),
    ("tegra_lib_no_note_with_driver", lambda: (host("550.54.15", tegra=True), image("1.1", None), GPU_REQ, CFG), "skip", "compat_version_invalid"),
    ("tegra_lib_no_note", lambda: (host(cuda="13.1", tegra=True), image("1.1", None), GPU_REQ, CFG), "skip", "note_cuda_missing"),
    # 3b. Orin's compat only on an Orin host, the SBSA/dGPU compat never there (NVIDIA's PR #1690)
    ("orin_lib_on_dgpu_host", lambda: (host("550.54.15"), image("1.1", None), GPU_REQ, CFG), "skip", "compat_orin_not_tegra"),
    ("orin_lib_on_dgpu_host_with_nvml_cuda", lambda: (host("550.54.15", cuda="12.4"), image("1.1", NOTE_ORIN), GPU_REQ, CFG), "skip", "compat_orin_not_tegra"),
    ("compat_orin_dir_on_dgpu_host", lambda: (host("550.54.15"), image(compat_dir="/usr/local/cuda-12.9/compat_orin"), GPU_REQ, CFG), "skip", "compat_orin_not_tegra"),
    ("dgpu_compat_on_orin_host", lambda: (host(cuda="12.8", tegra=True), image(), GPU_REQ, CFG), "skip", "compat_dgpu_on_tegra"),
    ("dgpu_compat_host_cuda_only_not_tegra", lambda: (host(cuda="12.8"), image(), GPU_REQ, CFG), "skip", "host_driver_unknown"),
    # ... and Orin's compat on no host not known to be Tegra, a driver version known or not (issue 32)
    ("orin_lib_host_unknown", lambda: (host(), image("1.1", NOTE_ORIN), GPU_REQ, CFG), "skip", "compat_orin_not_tegra"),
    ("orin_lib_host_cuda_only_not_tegra", lambda: (host(cuda="13.1"), image("1.1", NOTE_ORIN), GPU_REQ, CFG), "skip", "compat_orin_not_tegra"),
    ("compat_orin_dir_host_cuda_only_not_tegra", lambda: (host(cuda="12.8"), image(compat_dir=ORIN129_DIR), GPU_REQ, CFG), "skip", "compat_orin_not_tegra"),
    # 1b. NVIDIA_DRIVER_CAPABILITIES: no compute, no libcuda from NVIDIA's runtime
    ("caps_utility_only", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"), CFG), "skip", "no_compute_capability"),
    ("caps_graphics_display", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=graphics, display"), CFG), "skip", "no_compute_capability"),
    ("caps_compute_utility", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility, Compute"), CFG), "enable", "compat_newer_supported"),
    ("caps_all", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"), CFG), "enable", "compat_newer_supported"),
    ("caps_empty_is_the_default", lambda: (host("550.54.15"), image(), req("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES="), CFG), "enable", "compat_newer_supported"),
    ("caps_utility_but_libcuda_mounted", lambda: (host("550.54.15"), image(), Request.from_spec({
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"]},
        "mounts": [{"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "type": "bind",
                    "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"}]}), CFG), "enable", "compat_newer_supported"),
    # the file name must carry the version
    ("compat_version_invalid", lambda: (host("550.54.15"), image("575.57.08.1"), GPU_REQ, CFG), "skip", "compat_version_invalid"),
    # 5. host driver unknown
    ("host_driver_unknown", lambda: (host(), image(), GPU_REQ, CFG), "skip", "host_driver_unknown"),
    ("host_driver_unknown_no_note", lambda: (host(), image(note=None), GPU_REQ, CFG), "skip", "host_driver_unknown"),
    # 6. compat <= host (full version)
    ("compat_equal", lambda: (host("575.57.08"), image(), GPU_REQ, CFG), "skip", "compat_not_newer"),
    ("compat_older_same_branch", lambda: (host("575.99.99"), image(), GPU_REQ, CFG), "skip", "compat_not_newer"),
    ("compat_older_pr1697", lambda: (host("580.126.16"), image("580.82.07", None), GPU_REQ, CFG), "skip", "compat_not_newer"),
    ("same_branch_upgrade", lambda: (host("575.10.10"), image(), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    # 7. note driver list
    ("branch_not_listed_545", lambda: (host("545.23.08"), image(), GPU_REQ, CFG), "skip", "host_branch_unsupported"),
    ("branch_not_listed_560_for_590", lambda: (host("560.35.03"), image("590.44.01", NOTE_590), GPU_REQ, CFG), "skip", "host_branch_unsupported"),
    ("note_without_driver_list", lambda: (host("550.54.15"), image(note=NOTE_NO_DRIVER), GPU_REQ, CFG), "skip", "note_without_driver_list"),
    ("note_with_empty_driver_list", lambda: (host("550.54.15"), image(note=NOTE_EMPTY_DRIVER), GPU_REQ, CFG), "skip", "note_without_driver_list"),
    ("branch_listed", lambda: (host("570.211.01"), image(), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    # a note NVIDIA's parser refuses counts as absent (the legacy major rule applies)
    ("bad_note_is_no_note", lambda: (host("550.54.15"), image(note='{"format":1,"CUDA version":"13.2",}'), GPU_REQ, CFG), "enable", "compat_major_newer"),
    # 8. no note: the major rule
    ("no_note_major_newer", lambda: (host("535.261.03"), image("550.163.01", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("no_note_same_major", lambda: (host("550.54.15"), image("550.163.01", None), GPU_REQ, CFG), "skip", "compat_major_not_newer"),
    # 9. device list
    ("geforce", lambda: (host("550.54.15", gpus=[gpu(5, "NVIDIA GeForce RTX 4090")]), image(), GPU_REQ, CFG), "skip", "device_unsupported"),
    ("titan", lambda: (host("550.54.15", gpus=[gpu(6, "NVIDIA TITAN V")]), image(), GPU_REQ, CFG), "skip", "device_unsupported"),
    ("one_geforce_among_teslas", lambda: (host("550.54.15", gpus=[gpu(2), gpu(5), gpu(2)]), image(), GPU_REQ, CFG), "skip", "device_unsupported"),
    ("geforce_warn", lambda: (host("550.54.15", gpus=[gpu(5)]), image(), GPU_REQ, CFG.replace(device_check="warn")), "enable", "compat_newer_supported"),
    ("geforce_off", lambda: (host("550.54.15", gpus=[gpu(5)]), image(), GPU_REQ, CFG.replace(device_check="off")), "enable", "compat_newer_supported"),
    ("brand_unknown", lambda: (host("550.54.15", gpus=[gpu(0, "Graphics Device")]), image(), GPU_REQ, CFG), "skip", "device_unknown"),
    ("brand_none", lambda: (host("550.54.15", gpus=[gpu(None, "")]), image(), GPU_REQ, CFG), "skip", "device_unknown"),
    ("brand_unknown_warn", lambda: (host("550.54.15", gpus=[gpu(0)]), image(), GPU_REQ, CFG.replace(device_check="warn")), "enable", "compat_newer_supported"),
    ("no_gpus_known", lambda: (host("550.54.15", gpus=[]), image(), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    ("tesla", lambda: (host("550.54.15", gpus=[gpu(2, "NVIDIA H100 80GB HBM3"), gpu(14)]), image(), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    # 9b. no device list (no note, or a note without one): NVIDIA's compatibility guide -- data
    # center and select NGC Server Ready RTX only; GeForce/TITAN never, the rest per device_check
    ("no_note_geforce", lambda: (host("535.261.03", gpus=[gpu(5, "NVIDIA GeForce GTX 1650")]), image("550.163.01", None), GPU_REQ, CFG), "skip", "device_consumer"),
    ("no_note_geforce_rtx", lambda: (host("535.261.03", gpus=[gpu(15)]), image("550.163.01", None), GPU_REQ, CFG), "skip", "device_consumer"),
    ("no_note_titan", lambda: (host("535.261.03", gpus=[gpu(6, "NVIDIA TITAN V")]), image("550.163.01", None), GPU_REQ, CFG), "skip", "device_consumer"),
    ("no_note_titan_rtx", lambda: (host("535.261.03", gpus=[gpu(16)]), image("550.163.01", None), GPU_REQ, CFG), "skip", "device_consumer"),
    ("no_note_geforce_warn_still_skips", lambda: (host("535.261.03", gpus=[gpu(5)]), image("550.163.01", None), GPU_REQ, CFG.replace(device_check="warn")), "skip", "device_consumer"),
    ("no_note_geforce_off", lambda: (host("535.261.03", gpus=[gpu(5)]), image("550.163.01", None), GPU_REQ, CFG.replace(device_check="off")), "enable", "compat_major_newer"),
    ("no_note_geforce_among_teslas", lambda: (host("535.261.03", gpus=[gpu(2), gpu(5)]), image("550.163.01", None), GPU_REQ, CFG), "skip", "device_consumer"),
    ("no_note_tesla", lambda: (host("535.261.03", gpus=[gpu(2, "Tesla T4")]), image("550.163.01", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("no_note_nvidia_h100", lambda: (host("535.261.03", gpus=[gpu(14, "NVIDIA H100 80GB HBM3")]), image("550.163.01", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("no_note_rtx_pro", lambda: (host("535.261.03", gpus=[gpu(13, "NVIDIA RTX A6000"), gpu(12)]), image("550.163.01", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("no_note_vgpu", lambda: (host("535.261.03", gpus=[gpu(10)]), image("550.163.01", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("no_note_brand_unknown", lambda: (host("535.261.03", gpus=[gpu(0, "Graphics Device")]), image("550.163.01", None), GPU_REQ, CFG), "skip", "device_unknown"),
    ("no_note_brand_unknown_warn", lambda: (host("535.261.03", gpus=[gpu(0)]), image("550.163.01", None), GPU_REQ, CFG.replace(device_check="warn")), "enable", "compat_major_newer"),
    ("no_note_grid", lambda: (host("535.261.03", gpus=[gpu(4)]), image("550.163.01", None), GPU_REQ, CFG), "skip", "device_unsupported"),
    ("no_note_grid_warn", lambda: (host("535.261.03", gpus=[gpu(4)]), image("550.163.01", None), GPU_REQ, CFG.replace(device_check="warn")), "enable", "compat_major_newer"),
    ("no_note_no_gpus_known", lambda: (host("535.261.03"), image("550.163.01", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("note_without_device_list_geforce", lambda: (host("550.54.15", gpus=[gpu(5)]), image(note=NOTE_NO_DEVICE), GPU_REQ, CFG), "skip", "device_consumer"),
    ("note_without_device_list_tesla", lambda: (host("550.54.15", gpus=[gpu(2)]), image(note=NOTE_NO_DEVICE), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    # 9c. the GPUs the container gets: an H100 at index 0, a GeForce RTX 4090 at index 1
    ("mixed_index_0", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=0"), CFG), "enable", "compat_newer_supported"),
    ("mixed_index_1", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=1"), CFG), "skip", "device_unsupported"),
    ("mixed_all", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=all"), CFG), "skip", "device_unsupported"),
    ("mixed_both", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=1,0"), CFG), "skip", "device_unsupported"),
    ("mixed_uuid", lambda: (mixed(), image(), req(f"NVIDIA_VISIBLE_DEVICES={H100_UUID}"), CFG), "enable", "compat_newer_supported"),
    ("mixed_uuid_upper", lambda: (mixed(), image(), req(f"NVIDIA_VISIBLE_DEVICES=gpu-{H100_UUID[4:].upper()}"), CFG), "enable", "compat_newer_supported"),
    ("mixed_rtx_uuid", lambda: (mixed(), image(), req(f"NVIDIA_VISIBLE_DEVICES={RTX_UUID}"), CFG), "skip", "device_unsupported"),
    ("mixed_mig_by_gpu_uuid", lambda: (mixed(), image(), req(f"NVIDIA_VISIBLE_DEVICES=MIG-{H100_UUID}/1/0"), CFG), "enable", "compat_newer_supported"),
    ("mixed_mig_by_index", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=0:1"), CFG), "enable", "compat_newer_supported"),
    ("mixed_mig_uuid_known", lambda: (host("550.54.15", gpus=two_gpus(mig=["MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"])), image(), req("NVIDIA_VISIBLE_DEVICES=MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), CFG), "enable", "compat_newer_supported"),
    ("mixed_mig_uuid_unknown_is_all", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), CFG), "skip", "device_unsupported"),
    ("mixed_unknown_index_is_all", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=0,7"), CFG), "skip", "device_unsupported"),
    ("mixed_cdi_name_in_env", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"), CFG), "enable", "compat_newer_supported"),
    ("mixed_cdi_annotation", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=all", **{"cdi.k8s.io/nvidia-device-plugin_gpu": "nvidia.com/gpu=0"}), CFG), "enable", "compat_newer_supported"),
    ("mixed_cdi_annotation_uuid", lambda: (mixed(), image(), req(**{"cdi.k8s.io/gpu": f"k8s.device-plugin.nvidia.com/gpu={H100_UUID}"}), CFG), "enable", "compat_newer_supported"),
    ("mixed_cdi_annotation_all", lambda: (mixed(), image(), req(**{"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), CFG), "skip", "device_unsupported"),
    ("mixed_cdi_annotation_rtx", lambda: (mixed(), image(), req(**{"cdi.k8s.io/gpu": "nvidia.com/gpu=0,nvidia.com/gpu=1"}), CFG), "skip", "device_unsupported"),
    ("mixed_device_node_0", lambda: (mixed(), image(), req(devices=["/dev/nvidia0"]), CFG), "enable", "compat_newer_supported"),
    ("mixed_device_node_1", lambda: (mixed(), image(), req(devices=["/dev/nvidia1"]), CFG), "skip", "device_unsupported"),
    ("mixed_env_0_device_node_1", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=0", devices=["/dev/nvidia1"]), CFG), "skip", "device_unsupported"),
    ("mixed_env_0_device_node_0", lambda: (mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=0", devices=["/dev/nvidia0"]), CFG), "enable", "compat_newer_supported"),
    ("mixed_no_request_is_all", lambda: (mixed(), image(), None, CFG), "skip", "device_unsupported"),
    ("mixed_no_note_index_0", lambda: (mixed("535.261.03"), image("550.163.01", None), req("NVIDIA_VISIBLE_DEVICES=0"), CFG), "enable", "compat_major_newer"),
    ("mixed_no_note_index_1", lambda: (mixed("535.261.03"), image("550.163.01", None), req("NVIDIA_VISIBLE_DEVICES=1"), CFG), "skip", "device_consumer"),
    # 10. a GPU the compat driver's branch does not drive (R590+: below compute capability 7.5)
    ("cc_60_590", lambda: (host("550.54.15", gpus=[gpu(2, "Tesla P100", (6, 0))]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    ("cc_70_590", lambda: (host("550.54.15", gpus=[gpu(2, "Tesla V100", (7, 0))]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    ("cc_75_590", lambda: (host("550.54.15", gpus=[gpu(2, "Tesla T4", (7, 5))]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    ("cc_60_580_no_note", lambda: (host("550.54.15", gpus=[gpu(2, "Tesla P100", (6, 0))]), image("580.65.06", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("cc_60_575", lambda: (host("550.54.15", gpus=[gpu(2, "Tesla P100", (6, 0))]), image(), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    ("cc_unknown_590", lambda: (host("550.54.15", gpus=[gpu(2)]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    ("cc_60_590_no_note", lambda: (host("550.54.15", gpus=[gpu(2, "Tesla P100", (6, 0))]), image("590.44.01", None), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    # ... on the GPUs the container gets: a P100 at index 0, an H100 at index 1
    ("cc_mixed_container_gets_h100", lambda: (host("550.54.15", gpus=two_gpus((2, "Tesla P100", (6, 0)), (14, "NVIDIA H100", (9, 0)))), image("590.44.01", NOTE_590), req("NVIDIA_VISIBLE_DEVICES=1"), CFG), "enable", "compat_newer_supported"),
    ("cc_mixed_container_gets_p100", lambda: (host("550.54.15", gpus=two_gpus((2, "Tesla P100", (6, 0)), (14, "NVIDIA H100", (9, 0)))), image("590.44.01", NOTE_590), req("NVIDIA_VISIBLE_DEVICES=0"), CFG), "skip", "gpu_arch_unsupported"),
    ("cc_mixed_all", lambda: (host("550.54.15", gpus=two_gpus((2, "Tesla P100", (6, 0)), (14, "NVIDIA H100", (9, 0)))), image("590.44.01", NOTE_590), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    # ... placed without NVML as plan places it: the PCI device ID, else the model name (issue 32)
    ("v100_proc_name_590", lambda: (host("580.95.05", gpus=[proc_gpu("Tesla V100-SXM2-16GB")]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    ("v100_pci_id_590", lambda: (host("580.95.05", gpus=[proc_gpu("NVIDIA Graphics Device", "0x1db1")]), image("590.44.01", NOTE_590), GPU_REQ, WARN), "skip", "gpu_arch_unsupported"),
    ("pci_id_before_name_590", lambda: (host("580.95.05", gpus=[proc_gpu("Tesla T4", "0x1db1")]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    ("t4_proc_name_590", lambda: (host("580.95.05", gpus=[proc_gpu("Tesla T4")]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    ("h100_pci_id_590", lambda: (host("580.95.05", gpus=[proc_gpu("NVIDIA H100 80GB HBM3", "0x2330")]), image("590.44.01", NOTE_590), GPU_REQ, CFG), "enable", "compat_newer_supported"),
    ("v100_proc_name_580", lambda: (host("550.54.15", gpus=[proc_gpu("Tesla V100-SXM2-16GB")]), image("580.65.06", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    ("unknown_name_no_pci_590", lambda: (host("580.95.05", gpus=[proc_gpu("NVIDIA Graphics Device")]), image("590.44.01", NOTE_590), GPU_REQ, WARN), "enable", "compat_newer_supported"),
    # ... a dropped architecture's last branch: Kepler's is R470, so a 535 compat driver is no driver for a K80
    ("k80_470_compat_535", lambda: (host("470.256.02", gpus=[proc_gpu("Tesla K80", "0x102d")]), image("535.261.03", None), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    ("k80_nvml_cc_470_compat_535", lambda: (host("470.256.02", gpus=[gpu(2, "Tesla K80", (3, 7))]), image("535.261.03", None), GPU_REQ, CFG), "skip", "gpu_arch_unsupported"),
    ("k80_460_compat_470", lambda: (host("460.106.00", gpus=[proc_gpu("Tesla K80", "0x102d")]), image("470.256.02", None), GPU_REQ, CFG), "enable", "compat_major_newer"),
    # ... a Tegra host's GPU is not judged by the desktop branches
    ("tegra_gpu_not_judged", lambda: (host(cuda="12.8", tegra=True, gpus=[gpu(14, "Orin (nvgpu)", (8, 7))]), image("590.44.01", NOTE_590, compat_dir=ORIN129_DIR), GPU_REQ, CFG), "enable", "compat_cuda_newer"),
    # request None = explain --rootfs: a GPU container without opt-out
    ("request_none", lambda: (host("550.54.15"), image(), None, CFG), "enable", "compat_newer_supported"),
]


@pytest.mark.parametrize("build, action, reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule(build, action, reason):
    h, img, r, cfg = build()
    d = decide(h, img, r, cfg)
    assert isinstance(d, Decision)
    assert (d.action, d.reason) == (action, reason), d.to_dict()
    assert d.reason in REASONS
    assert d.message == REASONS[d.reason]
    if d.enable:
        assert d.compat_dir == img.compat_dir
        assert d.compat_version == img.compat_version_text
        assert d.source == "image"
    else:
        assert d.compat_dir is None


# -- several candidate dirs: each decided alone, the newest that may be used is chosen ----------

def several(*imgs, origins=()) -> ImageFacts:
    """The first image is the primary, the others its further candidate dirs."""
    primary, *rest = imgs
    primary.others = list(rest)
    for img, origin in zip(imgs, origins):
        img.origin = origin
    return primary


C124, C128, CONDA = "/usr/local/cuda-12.4/compat", "/usr/local/cuda-12.8/compat", "/opt/conda/cuda-compat"
ORIN_DIR = "/usr/local/cuda-13.2/compat_orin"


@pytest.mark.parametrize("h, imgs, action, reason, chosen, reasons", [
    pytest.param(host("535.261.03"), lambda: [image("550.163.01", None, compat_dir=C124),
                                             image("570.86.10", None, compat_dir=C128)],
                 "enable", "compat_major_newer", C128, ["compat_major_newer", "compat_major_newer"],
                 id="both-enable-newest-wins"),
    pytest.param(host("560.35.03"), lambda: [image("570.86.10", None, compat_dir=C128),
                                             image("550.163.01", None, compat_dir=C124)],
                 "enable", "compat_major_newer", C128, ["compat_major_newer", "compat_not_newer"],
                 id="the-issue-case-560-host"),
    pytest.param(host("560.35.03"), lambda: [image("550.163.01", None, compat_dir=C124),
                                             image("570.86.10", None, compat_dir=CONDA)],
                 "enable", "compat_major_newer", CONDA, ["compat_not_newer", "compat_major_newer"],
                 id="only-the-second-enables"),
    pytest.param(host("580.65.06"), lambda: [image("550.163.01", None, compat_dir=C124),
                                             image("570.86.10", None, compat_dir=CONDA)],
                 "skip", "compat_not_newer", None, ["compat_not_newer", "compat_not_newer"],
                 id="none-enables-first-reason"),
    pytest.param(host(cuda="13.1", tegra=True), lambda: [image(), image("1.1", NOTE_ORIN, compat_dir=ORIN_DIR)],
                 "enable", "compat_cuda_newer", ORIN_DIR, ["compat_dgpu_on_tegra", "compat_cuda_newer"],
                 id="orin-host-takes-compat_orin-not-sbsa"),
    pytest.param(host(cuda="13.2", tegra=True), lambda: [image(), image("1.1", NOTE_ORIN, compat_dir=ORIN_DIR)],
                 "skip", "compat_cuda_not_newer", None, ["compat_dgpu_on_tegra", "compat_cuda_not_newer"],
                 id="orin-host-none-enables-the-orin-dirs-reason"),
    pytest.param(host("575.10.10", cuda="12.9"), lambda: [image(), image("1.1", NOTE_ORIN, compat_dir=ORIN_DIR)],
                 "enable", "compat_newer_supported", "/usr/local/cuda-12.9/compat",
                 ["compat_newer_supported", "compat_orin_not_tegra"], id="dgpu-host-never-compat_orin"),
    pytest.param(host("550.54.15"), lambda: [ambiguous_image(), image("575.57.08", compat_dir=CONDA)],
                 "enable", "compat_newer_supported", CONDA, ["ambiguous_candidates", "compat_newer_supported"],
                 id="an-ambiguous-dir-loses-to-a-good-one"),
])
def test_several_candidate_dirs(h, imgs, action, reason, chosen, reasons):
    img = several(*imgs())
    d = decide(h, img, GPU_REQ, CFG)
    assert (d.action, d.reason, d.compat_dir) == (action, reason, chosen), d.to_dict()
    assert [c["decision"] for c in d.details["compat_dirs"]] == reasons
    assert [c["chosen"] for c in d.details["compat_dirs"]] == [c.compat_dir == chosen for c in img.all()]
    if d.enable:
        assert d.compat_version == next(c.compat_version_text for c in img.all() if c.compat_dir == chosen)


def test_geforce_warn_mode_carries_a_warning():
    d = decide(host("550.54.15", gpus=[gpu(5, "NVIDIA GeForce RTX 4090")]), image(), GPU_REQ,
               CFG.replace(device_check="warn"))
    assert d.enable
    assert any("GeForce RTX 4090" in w and "brand 5" in w for w in d.warnings), d.warnings
    d = decide(host("550.54.15", gpus=[gpu(5)]), image(), GPU_REQ, CFG.replace(device_check="off"))
    assert d.enable and d.warnings == []


def test_device_unsupported_details_list_the_gpus_and_allowed_brands():
    d = decide(host("550.54.15", gpus=[gpu(5, "NVIDIA GeForce RTX 4090")]), image(), GPU_REQ, CFG)
    assert d.details["allowed"] == [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]
    assert d.details["gpus"][0]["model"] == "NVIDIA GeForce RTX 4090"


def test_selected_gpus_are_in_the_details():
    d = decide(mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=0"), CFG)
    assert d.details["gpus_checked"] == {"gpus": ["0 0000:17:00.0 NVIDIA H100 80GB HBM3"],
                                         "why": "named by NVIDIA_VISIBLE_DEVICES: 0"}
    d = decide(mixed(), image(), req("NVIDIA_VISIBLE_DEVICES=all"), CFG)
    assert d.details["gpus_checked"]["why"] == "all GPUs: NVIDIA_VISIBLE_DEVICES names all"
    assert [g["index"] for g in d.details["gpus"]] == [0, 1]
    d = decide(mixed(), image(), req(devices=["/dev/nvidia1"]), CFG)
    assert d.details["gpus_checked"] == {"gpus": ["1 0000:65:00.0 NVIDIA GeForce RTX 4090"],
                                         "why": "named by device /dev/nvidia1: 1"}
    assert [g["model"] for g in d.details["gpus"]] == ["NVIDIA GeForce RTX 4090"]


def test_no_note_policy_details_name_the_default_list():
    d = decide(host("535.261.03", gpus=[gpu(4, "NVIDIA GRID K520")]), image("550.163.01", None), GPU_REQ, CFG)
    assert d.details["allowed"] == list(decision_mod.DEFAULT_DEVICE_BRANDS) and d.details["device_list"] == "default"
    d = decide(host("535.261.03", gpus=[gpu(4, "NVIDIA GRID K520")]), image("550.163.01", None), GPU_REQ,
               CFG.replace(device_check="warn"))
    assert d.enable and d.warnings == ["GPU brand outside the default device list (no note lists one): "
                                       "NVIDIA GRID K520 (brand 4, nvml)"]


def test_default_device_list_is_what_nvidia_notes_carry():
    from compat_hook.facts.elfnote import inspect_elf as _i

    for note in (NOTE_575, NOTE_590):
        assert list(_i(io.BytesIO(make_elf(note_json=note))).note.device) == list(decision_mod.DEFAULT_DEVICE_BRANDS)
    assert not decision_mod.CONSUMER_BRANDS & set(decision_mod.DEFAULT_DEVICE_BRANDS)


def test_consumer_brands_are_outside_every_known_device_list():
    # docs/background.md "The ELF note": the device list is the non-consumer nvmlBrandType_t values.
    from compat_hook.facts.elfnote import inspect_elf as _i

    for note in (NOTE_575, NOTE_590):
        devices = _i(io.BytesIO(make_elf(note_json=note))).note.device
        # nvmlBrandType_t of consumer boards: GEFORCE, TITAN, GEFORCE_RTX, TITAN_RTX
        assert not {5, 6, 15, 16} & set(devices)
        assert 0 not in devices


def test_branch_unsupported_details_name_the_list():
    d = decide(host("545.23.08"), image(), GPU_REQ, CFG)
    assert d.details["supported"] == [535, 550, 560, 565, 570, 575]
    assert d.details["host_driver"] == "545.23.08"  # as the driver spells it


def test_bad_note_warns():
    d = decide(host("550.54.15"), image(note='{"format":1,"CUDA version":"13.2",}'), GPU_REQ, CFG)
    assert d.enable and any(w.startswith("note ignored") for w in d.warnings)


STORE_CASES = ["store_package", "no_store_package", "store_not_needed"]


def test_every_reason_code_is_exercised():
    seen = {c[3] for c in CASES} | set(STORE_CASES) | {"host_driver_unknown"}
    assert seen == set(REASONS), set(REASONS) ^ seen


# -- NVIDIA's TestUseCompat / TestCompatLibsWithElfHeader (docs/background.md "The NVIDIA toolkit") --
#
# Root testdata/, cudaCompatContainerRoot "compat/575.57.08". NVIDIA accepts a
# relative root; our compat_dirs must be absolute, so the dir is "/compat/575.57.08".

def _e2e(make_rootfs, fake_host, entries, *, driver=None, cuda=None, gpus=None, request=None, **cfg):
    rootfs = make_rootfs(entries)
    h = fake_host(gpus=gpus)
    config = config_for(h, **cfg)
    with Root(str(rootfs)) as r:
        img = imagefacts.gather(r, config)
    facts = hostfacts.gather(config, driver_version=driver, cuda_version=cuda)
    return decide(facts, img, request, config), img, facts


@pytest.mark.parametrize("driver, cuda, action, reason", [
    # NVIDIA compares the CUDA versions here (W for 12.8); on a dGPU host that is rule 5 for us
    (None, "12.8", *CUDA_ONLY),
    (None, "12.9", *CUDA_ONLY),
    (None, "12.10", *CUDA_ONLY),
    # NVIDIA: false, "not in list". 590.44.01 is also newer than the compat
    # driver, and our rule 6 (compat <= host) comes before rule 7 (the list).
    ("590.44.01", None, "skip", "compat_not_newer"),
    ("570.211.01", None, "enable", "compat_newer_supported"),
    ("575.10.10", None, "enable", "compat_newer_supported"),
    ("575.57.08", None, "skip", "compat_not_newer"),
    ("575.99.99", None, "skip", "compat_not_newer"),
    # the rows' principle on its own: a listed-out branch whose compat is newer
    ("545.23.08", None, "skip", "host_branch_unsupported"),
])
def test_nvidia_compat_libs_with_elf_header(make_rootfs, fake_host, driver, cuda, action, reason):
    d, img, _ = _e2e(make_rootfs, fake_host, TESTDATA_575, driver=driver, cuda=cuda,
                     compat_dirs=["/compat/575.57.08"])
    assert (d.action, d.reason) == (action, reason), d.to_dict()
    assert d.compat_dir == ("/compat/575.57.08" if action == "enable" else None)
    assert img.elf.note.cuda_version == "12.9"


@pytest.mark.parametrize("driver, cuda, action, reason", ELF590)
def test_measured_elf590(make_rootfs, fake_host, driver, cuda, action, reason):
    d, img, facts = _e2e(make_rootfs, fake_host, measured_rootfs(elf(NOTE_590)), driver=driver, cuda=cuda)
    assert (d.action, d.reason) == (action, reason), d.to_dict()
    if action == "enable":
        # The resolved dir, as NVIDIA's e2e tests expect (/usr/local/cuda-13.1/compat).
        assert d.compat_dir == "/usr/local/cuda-13.1/compat"
        assert d.compat_version == "590.44.01"
    if driver == "abc":
        assert facts.driver_version is None and any("abc" in n for n in facts.notes)


@pytest.mark.parametrize("driver, cuda, action, reason", ELF575)
def test_measured_elf575(make_rootfs, fake_host, driver, cuda, action, reason):
    entries = {"usr/local/cuda-12.9/compat/libcuda.so.575.57.08": elf(NOTE_575),
               "usr/local/cuda": Symlink("cuda-12.9")}
    d, _, _ = _e2e(make_rootfs, fake_host, entries, driver=driver, cuda=cuda)
    assert (d.action, d.reason) == (action, reason), d.to_dict()
    if action == "enable":
        assert d.compat_dir == "/usr/local/cuda-12.9/compat"


@pytest.mark.parametrize("driver, cuda, action, reason", NOELF590)
def test_measured_noelf590(make_rootfs, fake_host, driver, cuda, action, reason):
    d, img, _ = _e2e(make_rootfs, fake_host, measured_rootfs(elf(None)), driver=driver, cuda=cuda)
    assert img.elf.note is None and img.elf.error is None
    assert (d.action, d.reason) == (action, reason), d.to_dict()


@pytest.mark.parametrize("driver, cuda, nvidia_writes", [
    ("535.183.01", None, True), ("550.54.15", None, True), ("570.133.20", None, True),
    ("580.65.06", None, True), ("590.30.01", None, False), ("600.10", None, False),
    (None, "12.8", False),
])
@pytest.mark.parametrize("garbage", [b"#!/bin/sh\necho this is not a library\n", b""], ids=["text", "empty"])
def test_measured_garbage590(make_rootfs, fake_host, driver, cuda, nvidia_writes, garbage):
    # Stricter than NVIDIA on purpose: v1.20.0 applies its major rule to a
    # non-ELF file and *would enable* the 535-580 rows (nvidia_writes). A file
    # the loader cannot load is never worth a drop-in for us.
    d, img, _ = _e2e(make_rootfs, fake_host, measured_rootfs(garbage), driver=driver, cuda=cuda)
    assert img.elf.error is not None
    assert (d.action, d.reason) == ("skip", "not_elf"), d.to_dict()


# -- TestCompatLibs: layouts and the no-note fallback (docs/background.md "The NVIDIA toolkit") --
#
# NVIDIA uses 0-byte libs, which do not parse; for us a 0-byte file is not_elf
# (checked above), so the same rows use valid no-note ELF stubs.

STUB = elf(None)
DEFAULT_DIR = "usr/local/cuda/compat"


@pytest.mark.parametrize("entries, driver, action, reason, compat_dir, compat_dirs", [
    pytest.param({}, "222.55.66", "skip", "no_candidate", None, None, id="empty_root"),
    pytest.param({f"{DEFAULT_DIR}/libcuda.so.333.88.99": STUB}, "222.55.66", "enable", "compat_major_newer",
                 "/usr/local/cuda/compat", None, id="newer_no_cache"),
    pytest.param({f"{DEFAULT_DIR}/libcuda.so.333.88.99": STUB, "etc/ld.so.cache": b""}, "222.55.66", "enable",
                 "compat_major_newer", "/usr/local/cuda/compat", None, id="newer_with_cache"),
    pytest.param({f"{DEFAULT_DIR}/libcuda.so.111.88.99": STUB, "etc/ld.so.cache": b""}, "222.55.66", "skip",
                 "compat_not_newer", None, None, id="older"),
    pytest.param({f"{DEFAULT_DIR}/libcuda.so.222.88.99": STUB, "etc/ld.so.cache": b""}, "222.55.66", "skip",
                 "compat_major_not_newer", None, None, id="same_major"),
    pytest.param({f"{DEFAULT_DIR}/libcuda.so.222.88.99": STUB, "etc/ld.so.cache": b""}, "99.55.66", "enable",
                 "compat_major_newer", "/usr/local/cuda/compat", None, id="numeric_not_lexicographic"),
    pytest.param({f"{DEFAULT_DIR}/libcuda.so.222.88.99": STUB, "etc/ld.so.cache": b""}, None, "skip",
                 "host_driver_unknown", None, None, id="no_host_version"),
    pytest.param({"etc/alternatives/cuda/compat/libcuda.so.333.88.99": STUB,
                  "usr/local/cuda": Symlink("/etc/alternatives/cuda")}, "222.55.66", "enable",
                 "compat_major_newer", "/etc/alternatives/cuda/compat", None, id="alternatives"),
    pytest.param({"compat/libcuda.so.333.88.99": STUB, "usr/local/cuda": Symlink("../../../../../../")},
                 "222.55.66", "enable", "compat_major_newer", "/compat", None, id="clamped_to_root"),
    pytest.param({f"{DEFAULT_DIR}/libcuda.so.111.88.99": STUB,
                  "usr/local/cuda/compat-other/libcuda.so.333.88.99": STUB}, "222.55.66", "enable",
                 "compat_major_newer", "/usr/local/cuda/compat-other", ["/usr/local/cuda/compat-other"],
                 id="compat_other_root"),
])
def test_nvidia_compat_libs_layouts(make_rootfs, fake_host, entries, driver, action, reason, compat_dir,
                                    compat_dirs):
    cfg = {"compat_dirs": compat_dirs} if compat_dirs else {}
    d, img, _ = _e2e(make_rootfs, fake_host, entries, driver=driver, **cfg)
    assert (d.action, d.reason) == (action, reason), d.to_dict()
    assert d.compat_dir == compat_dir


def test_clamped_symlink_never_reaches_the_host(make_rootfs, fake_host, tmp_path):
    # The same "../../../../../../" link, with a tempting lib at the host's
    # /compat-like place next to the rootfs: only the in-root /compat counts.
    outside = tmp_path / "compat"
    outside.mkdir()
    (outside / "libcuda.so.999.1.1").write_bytes(STUB)
    d, img, _ = _e2e(make_rootfs, fake_host, {"usr/local/cuda": Symlink("../../../../../../")},
                     driver="222.55.66")
    assert (d.action, d.reason) == ("skip", "no_candidate")


# -- Tegra through the rootfs (compat_orin) ------------------------------------

@pytest.mark.parametrize("cuda, action, reason", [
    ("13.1", "enable", "compat_cuda_newer"),
    ("13.2", "skip", "compat_cuda_not_newer"),
    (None, "skip", "host_cuda_unknown"),
])
def test_tegra_orin_rootfs(make_rootfs, fake_host, cuda, action, reason):
    # NVIDIA's Orin file overruns its note section (descsz 41 in a 39-byte
    # descriptor area); built for this machine so the loader check passes.
    data = make_elf(machine=HOST_ARCH, soname=None, note_json=NOTE_ORIN.encode() + b"\0" * (38 - len(NOTE_ORIN)),
                    note_descsz=41, note_section_size=12 + 20 + 39)
    entries = {"usr/local/cuda-13.2/compat_orin/libcuda.so.1.1": data,
               "usr/local/cuda": Symlink("cuda-13.2")}
    rootfs = make_rootfs(entries)
    h = fake_host(tegra=True)
    config = config_for(h)
    with Root(str(rootfs)) as r:
        img = imagefacts.gather(r, config)
    facts = hostfacts.gather(config, cuda_version=cuda)
    assert facts.tegra and facts.driver_version is None
    assert img.tegra_lib and img.elf.note.cuda_version == "13.2"
    d = decide(facts, img, None, config)
    assert (d.action, d.reason) == (action, reason), d.to_dict()
    if d.enable:
        assert d.compat_dir == "/usr/local/cuda-13.2/compat_orin"


def test_nvidias_aarch64_orin_fixture_is_refused_on_another_machine():
    if HOST_ARCH == "aarch64":
        h = host(cuda="13.1", tegra=True, arch="x86_64")
    else:
        h = host(cuda="13.1", tegra=True)
    d = decide(h, image("1.1", data=orin_overrun_elf()), None, CFG)
    assert (d.action, d.reason) == ("skip", "elf_machine")


# -- device check through the host tree (/proc model names) ----------------------

@pytest.mark.parametrize("models, mode, action, reason", [
    (["NVIDIA GeForce RTX 4090"], "enforce", "skip", "device_unsupported"),
    (["NVIDIA GeForce RTX 4090"], "warn", "enable", "compat_newer_supported"),
    (["NVIDIA GeForce RTX 4090"], "off", "enable", "compat_newer_supported"),
    (["Graphics Device"], "enforce", "skip", "device_unknown"),
    (["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], "enforce", "enable", "compat_newer_supported"),
    (["NVIDIA H100 80GB HBM3", "NVIDIA TITAN RTX"], "enforce", "skip", "device_unsupported"),
    (None, "enforce", "enable", "compat_newer_supported"),
])
def test_device_check_from_proc_models(make_rootfs, fake_host, models, mode, action, reason):
    entries = {"usr/local/cuda-12.9/compat/libcuda.so.575.57.08": elf(NOTE_575),
               "usr/local/cuda": Symlink("cuda-12.9")}
    d, _, facts = _e2e(make_rootfs, fake_host, entries, driver="550.54.15", gpus=models, device_check=mode)
    assert (d.action, d.reason) == (action, reason), d.to_dict()
    assert len(facts.gpus) == len(models or [])
    if mode == "warn":
        assert d.warnings


# -- the host store ----------------------------------------------------------------

def store_pkg(version, note=None) -> ImageFacts:
    return image(version, note, compat_dir=f"/var/lib/compat-hook/store/{version}")


NEED_12_9 = ((12, 9, 0), "CUDA_VERSION")


def test_store_not_needed_when_host_native_cuda_suffices():
    d = decide_store(host("570.124.06"), GPU_REQ, [store_pkg("575.57.08", NOTE_575)], CFG,
                     ((12, 8, 0), "CUDA_VERSION"))
    assert (d.action, d.reason) == ("skip", "store_not_needed")
    assert d.details["host_cuda"] == "12.8"
    d = decide_store(host("580.65.06"), GPU_REQ, [store_pkg("590.44.01", NOTE_590)], CFG, NEED_12_9)
    assert d.reason == "store_not_needed"


def test_store_newest_fitting_package_wins():
    pkgs = [store_pkg("575.57.08", NOTE_575), store_pkg("570.124.06"), store_pkg("580.65.06"),
            store_pkg("575.51.03", NOTE_575)]
    d = decide_store(host("550.54.15"), GPU_REQ, pkgs, CFG, NEED_12_9)
    assert (d.action, d.reason, d.source) == ("enable", "store_package", "store")
    assert d.compat_version == "580.65.06"
    assert d.compat_dir == "/var/lib/compat-hook/store/580.65.06"
    fits = {t["version"]: t["fits"] for t in d.details["tried"]}
    # 570 provides only CUDA 12.8 < the 12.9 the image needs.
    assert fits == {"575.57.08": True, "570.124.06": False, "580.65.06": True, "575.51.03": True}
    assert d.details["rule"] == "compat_major_newer"


def test_store_package_failing_the_rules_is_not_chosen():
    # 590.44.01 is the newest and provides 13.1, but its note does not list 560.
    pkgs = [store_pkg("590.44.01", NOTE_590), store_pkg("575.57.08", NOTE_575)]
    d = decide_store(host("560.35.03"), GPU_REQ, pkgs, CFG, ((12, 9, 0), "CUDA_VERSION"))
    assert (d.action, d.compat_version) == ("enable", "575.57.08")
    tried = {t["version"]: t["decision"] for t in d.details["tried"]}
    assert tried["590.44.01"] == "host_branch_unsupported"
    # ... and a GeForce host gets none of the noted packages.
    d = decide_store(host("560.35.03", gpus=[gpu(5)]), GPU_REQ, pkgs, CFG, NEED_12_9)
    assert (d.action, d.reason) == ("skip", "no_store_package")


def test_store_no_package_fits():
    d = decide_store(host("550.54.15"), GPU_REQ, [store_pkg("570.124.06")], CFG, NEED_12_9)
    assert (d.action, d.reason) == ("skip", "no_store_package")
    d = decide_store(host("550.54.15"), GPU_REQ, [], CFG, NEED_12_9)
    assert (d.action, d.reason) == ("skip", "no_store_package")


def test_store_other_skips():
    pkgs = [store_pkg("580.65.06")]
    assert decide_store(host("550.54.15"), GPU_REQ, pkgs, CFG, (None, None)).reason == "no_candidate"
    assert decide_store(host("550.54.15"), GPU_REQ, pkgs, CFG, None).reason == "no_candidate"
    assert decide_store(host(), GPU_REQ, pkgs, CFG, NEED_12_9).reason == "host_driver_unknown"
    assert decide_store(host("550.54.15"), req("COMPAT_HOOK_DISABLE=1"), pkgs, CFG, NEED_12_9).reason == "opt_out"
    assert decide_store(host("550.54.15"), req(), pkgs, CFG, NEED_12_9).reason == "no_gpu_request"
    # only a host CUDA (Tegra-like): it is the native capability
    assert decide_store(host(cuda="13.0"), GPU_REQ, pkgs, CFG, NEED_12_9).reason == "store_not_needed"


def test_store_need_from_the_request():
    r = req("NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=12.9.1")
    d = decide_store(host("550.54.15"), r, [store_pkg("580.65.06")], CFG, r.required_cuda())
    assert d.enable and d.details["need"] == "12.9" and d.details["need_source"] == "CUDA_VERSION"


# -- the decision does no I/O ----------------------------------------------------

_WATCHED = ("open", "os.listdir", "os.scandir", "os.walk", "os.mkdir", "os.rename", "os.remove",
            "os.unlink", "os.symlink", "os.chmod", "os.utime", "os.truncate", "os.system", "os.exec",
            "os.posix_spawn", "os.fork", "subprocess.Popen", "socket.connect", "socket.__new__",
            "socket.bind", "import", "ctypes.dlopen", "shutil.copyfile", "glob.glob")
_events: list = []
_armed = [False]


def _audit(event, args):
    if _armed[0] and event in _WATCHED:
        _events.append((event, repr(args)[:200]))


sys.addaudithook(_audit)  # cannot be removed; it only records while armed


def test_decide_does_no_io():
    # Rule 10 imports the architecture table (facts/gpusupport, facts/gpunames) on first use:
    # loading code is no I/O of the decision's; imported here first, so that what is watched is decide().
    import compat_hook.facts.gpunames  # noqa: F401
    import compat_hook.facts.gpusupport  # noqa: F401

    inputs = [c[1]() for c in CASES]
    store_inputs = [
        (host("550.54.15"), GPU_REQ, [store_pkg("575.57.08", NOTE_575), store_pkg("580.65.06")], CFG, NEED_12_9),
        (host("570.124.06"), GPU_REQ, [store_pkg("575.57.08", NOTE_575)], CFG, NEED_12_9),
    ]
    _events.clear()
    _armed[0] = True
    try:
        # A probe that the hook sees what it must: an open is recorded.
        os.close(os.open(os.devnull, os.O_RDONLY))
        probe = list(_events)
        _events.clear()
        results = [decide(*i) for i in inputs]
        results += [decide_store(*i) for i in store_inputs]
        for d in results:
            d.to_dict()
            d.message
    finally:
        _armed[0] = False
    assert probe and probe[0][0] == "open"
    assert _events == []
    assert len(results) == len(CASES) + 2


def test_decision_module_imports_nothing_that_does_io():
    tree = ast.parse(open(decision_mod.__file__).read())
    imported, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
            if node.module == "facts.gpusupport":
                names |= {a.name for a in node.names}
        elif isinstance(node, ast.Name):
            assert node.id not in ("open", "print", "input", "exec", "eval", "__import__"), node.id
    assert imported <= {"__future__", "..core.versions", "..facts.gpusupport"}, imported
    # of gpusupport, only the table and the pure placing of a GPU (not pci_gpus, which reads sysfs)
    assert names <= {"branch_text", "of_gpu", "supports"}, names


HOT_MODULES = ("core.versions", "core.config", "facts.hostfacts", "facts.imagefacts", "facts.container",
               "policy.decision", "core.ldpath", "core.jsonfast", "core.cache", "facts.rootfs", "facts.elfnote",
               "policy.assess", "effects.ldcache", "policy.toolkit")
FORBIDDEN = ("re", "json", "typing", "dataclasses", "subprocess", "argparse", "signal", "enum",
             "logging", "datetime", "yaml", "elftools")


def test_hot_path_modules_keep_the_import_rules():
    code = (f"import sys\nsys.path.insert(0, {REPO!r})\nbefore = set(sys.modules)\n"
            + "".join(f"import compat_hook.{m}\n" for m in HOT_MODULES)
            + "print(' '.join(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
            + repr(FORBIDDEN) + ")))\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"hot-path modules import {out.stdout.strip()}"
