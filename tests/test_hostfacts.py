"""compat_hook.facts.hostfacts on fake host trees (docs/background.md "Host facts")."""

from __future__ import annotations

import os

import pytest

from compat_hook.facts import hostfacts
from compat_hook.facts.hostfacts import BRAND_NAMES, brand_from_model, parse_proc_version
from tests.conftest import Symlink, config_for

PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76  Mon Sep 12 19:21:56 UTC 2022"
OPEN_X86 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
            "(dvs-builder@U16)  Tue May 20 2025")
OPEN_ARM = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build  "
            "(dvs-builder@U16-I3-A13-1-1)  Wed Jul 16 2025")
LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.mark.parametrize("line, version", [
    (PROPRIETARY, "515.76"), (OPEN_X86, "575.57.08"), (OPEN_ARM, "580.65.06"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024", "550.54.15"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.44.01  Release Build", "590.44.01"),
    ("", None),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module", None),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  abc  Mon", None),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550  Mon", None),  # NGC's regex needs a dot
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64", None),
    ("GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)", None),
])
def test_parse_proc_version(line, version):
    assert parse_proc_version(line + "\nGCC version:  gcc version 12.2.0\n") == version


def test_parse_proc_version_equals_ngc_regex():
    import re

    rx = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
    for line in (PROPRIETARY, OPEN_X86, OPEN_ARM):
        assert parse_proc_version(line) == rx.search(line + "\n").group(1)


@pytest.mark.parametrize("line, version, text", [
    (PROPRIETARY, (515, 76, 0), "515.76"),
    (OPEN_X86, (575, 57, 8), "575.57.08"),
    (OPEN_ARM, (580, 65, 6), "580.65.06"),
])
def test_proc_lines(fake_host, line, version, text):
    h = fake_host(version_line=line, sys_version="999.1.1\n", libcuda=["libcuda.so.888.1.1"])
    f = hostfacts.gather(config_for(h))
    assert (f.driver_version, f.driver_source) == (version, "/proc/driver/nvidia/version")
    assert f.driver_text == text
    assert f.to_dict()["driver_version"] == f.driver_text
    assert not f.tegra


def test_leading_zeros_kept_for_display(fake_host):
    f = hostfacts.gather(config_for(fake_host(version_line=OPEN_X86)))
    assert f.driver_text == "575.57.08" and f.to_dict()["driver_version"] == "575.57.08"


def test_sys_fallback(fake_host):
    h = fake_host(sys_version="550.54.15\n", libcuda=["libcuda.so.888.1.1"])
    f = hostfacts.gather(config_for(h))
    assert (f.driver_version, f.driver_source, f.driver_text) == ((550, 54, 15), "/sys/module/nvidia/version",
                                                                  "550.54.15")


def test_sys_used_when_proc_has_no_version(fake_host):
    h = fake_host(version_line="NVRM version: something else", sys_version="550.54.15\n")
    f = hostfacts.gather(config_for(h))
    assert f.driver_source == "/sys/module/nvidia/version"
    assert any("no Kernel Module version" in n for n in f.notes)


@pytest.mark.parametrize("content", ["garbage\n", "550\n", "1.2.3.4\n"])
def test_sys_not_a_version(fake_host, content):
    f = hostfacts.gather(config_for(fake_host(sys_version=content)))
    assert f.driver_version is None
    assert any("/sys/module/nvidia/version is not a version" in n for n in f.notes)


def test_empty_sys_is_silent(fake_host):
    f = hostfacts.gather(config_for(fake_host(sys_version="")))
    assert f.driver_version is None and f.notes == []


def test_libcuda_fallback_single(fake_host):
    h = fake_host(libcuda={"libcuda.so.535.261.03": b"x", "libcuda.so.1": Symlink("libcuda.so.535.261.03"),
                           "libcuda.so": Symlink("libcuda.so.1")})
    f = hostfacts.gather(config_for(h))
    assert f.driver_version == (535, 261, 3)
    assert f.driver_source == f"libcuda:{LIB}/libcuda.so.535.261.03"
    assert f.driver_text == "535.261.03"


def test_libcuda_link_target_wins(fake_host):
    h = fake_host(libcuda={"libcuda.so.535.261.03": b"x", "libcuda.so.550.163.01": b"y",
                           "libcuda.so.1": Symlink("libcuda.so.550.163.01")})
    f = hostfacts.gather(config_for(h))
    assert f.driver_version == (550, 163, 1)
    assert f.notes == []


def test_libcuda_link_target_as_absolute_path(fake_host):
    h = fake_host(libcuda={"libcuda.so.535.261.03": b"x", "libcuda.so.550.163.01": b"y",
                           "libcuda.so.1": Symlink(f"{LIB}/libcuda.so.535.261.03")})
    assert hostfacts.gather(config_for(h)).driver_version == (535, 261, 3)


def test_libcuda_several_without_link_is_unknown(fake_host):
    h = fake_host(libcuda=["libcuda.so.535.261.03", "libcuda.so.550.163.01"])
    f = hostfacts.gather(config_for(h))
    assert f.driver_version is None and f.driver_source is None
    assert any("several host libcuda versions" in n and "535.261.03" in n and "550.163.01" in n for n in f.notes)


def test_libcuda_tegra_name_ignored(fake_host):
    # libcuda.so.1.1 is Tegra's soname-style name (NVIDIA toolkit issue #1271).
    h = fake_host(libcuda={"libcuda.so.1.1": b"x", "libcuda.so.1": Symlink("libcuda.so.1.1")}, tegra=True)
    f = hostfacts.gather(config_for(h))
    assert f.driver_version is None
    assert f.tegra


def test_libcuda_symlink_and_dir_ignored(fake_host):
    h = fake_host(libcuda={"libcuda.so.535.261.03": Symlink("elsewhere"), "libcuda.so.1": Symlink("libcuda.so.535.261.03")})
    os.mkdir(os.path.join(h, LIB.lstrip("/"), "libcuda.so.550.54.15"))
    assert hostfacts.gather(config_for(h)).driver_version is None


def test_libcuda_in_another_configured_dir(fake_host):
    h = fake_host(libcuda=["libcuda.so.555.58.02"], lib_dir="/usr/lib/x86_64-linux-gnu/nvidia/current")
    f = hostfacts.gather(config_for(h))
    assert f.driver_version == (555, 58, 2)
    assert f.driver_source.endswith("/nvidia/current/libcuda.so.555.58.02")
    f = hostfacts.gather(config_for(h, driver_lib_dirs=["/usr/lib64"]))
    assert f.driver_version is None


def test_nothing_known(fake_host):
    f = hostfacts.gather(config_for(fake_host()))
    assert f.driver_version is None and f.cuda_version is None and not f.tegra and f.gpus == []
    d = f.to_dict()
    assert d["driver_version"] is None and d["gpus"] == [] and d["tegra"] is False


def test_proc_wins_over_sys_and_libs(fake_host):
    h = fake_host(version_line=PROPRIETARY, sys_version="550.54.15\n", libcuda=["libcuda.so.535.1.1"])
    assert hostfacts.gather(config_for(h)).driver_source == "/proc/driver/nvidia/version"


# -- GPUs ---------------------------------------------------------------------------

@pytest.mark.parametrize("model, brand", [
    ("NVIDIA GeForce RTX 3090 Ti", 5), ("GeForce GTX 1080 Ti", 5), ("NVIDIA GeForce RTX 4090", 5),
    ("NVIDIA TITAN V", 6), ("NVIDIA TITAN RTX", 6), ("Quadro RTX 6000", 12), ("Quadro P4000", 1),
    ("Tesla V100-SXM2-16GB", 2), ("Tesla T4", 2), ("NVIDIA RTX A6000", 13), ("NVIDIA RTX 6000 Ada Generation", 13),
    ("NVIDIA H100 80GB HBM3", 14), ("NVIDIA A100-SXM4-80GB", 14), ("NVIDIA L40S", 14), ("Orin (nvgpu)", 14),
    ("", 0), ("Graphics Device", 0), ("NVIDIA Graphics Device", 0), ("unknown", 0), ("  ", 0), ("Some Board", 0),
])
def test_brand_from_model(model, brand):
    assert brand_from_model(model) == brand
    assert brand in BRAND_NAMES


def test_gpus_from_proc(fake_host):
    h = fake_host(version_line=PROPRIETARY, gpus={"0000:3b:00.0": "NVIDIA GeForce RTX 4090",
                                                   "0000:17:00.0": "NVIDIA H100 80GB HBM3"})
    f = hostfacts.gather(config_for(h))
    assert [(g.bus_id, g.model, g.brand, g.brand_source) for g in f.gpus] == [
        ("0000:17:00.0", "NVIDIA H100 80GB HBM3", 14, "proc-model-name"),
        ("0000:3b:00.0", "NVIDIA GeForce RTX 4090", 5, "proc-model-name"),
    ]
    assert f.gpus_source == "/proc/driver/nvidia/gpus"
    d = f.to_dict()["gpus"][1]
    assert d["brand_name"] == "GEFORCE" and d["compute_capability"] is None


def test_gpu_dir_without_information_is_skipped(fake_host):
    h = fake_host(gpus=["NVIDIA H100 80GB HBM3"])
    os.makedirs(os.path.join(h, "proc/driver/nvidia/gpus/0000:99:00.0"))
    f = hostfacts.gather(config_for(h))
    assert [g.bus_id for g in f.gpus] == ["0000:17:00.0"]


def test_gpu_information_without_model_is_unknown(fake_host):
    h = fake_host()
    d = os.path.join(h, "proc/driver/nvidia/gpus/0000:01:00.0")
    os.makedirs(d)
    with open(os.path.join(d, "information"), "w") as fh:
        fh.write("IRQ: 1\nBus Type: PCIe\n")
    f = hostfacts.gather(config_for(h))
    assert [(g.model, g.brand) for g in f.gpus] == [("", 0)]


def _information(host, bus, text):
    d = os.path.join(host, "proc/driver/nvidia/gpus", bus)
    os.makedirs(d)
    with open(os.path.join(d, "information"), "w") as fh:
        fh.write(text)


# A real R535 file (tabs and spaces as the driver writes them), the minor and UUID differing per GPU.
REAL_INFORMATION = ("Model: \t\t NVIDIA {model}\nIRQ:     \t\t 154\nGPU UUID: \t {uuid}\n"
                    "Video BIOS: \t 96.00.89.00.01\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
                    "DMA Mask: \t 0x7fffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
                    "GPU Excluded:\t No\n")


def test_gpu_index_uuid_and_minor_from_proc(fake_host):
    """Index = place in PCI bus id order (not creation order, not the minor); UUID and minor as the
    driver says; the minor need not follow the index (the driver numbers nodes as it probes)."""
    h = fake_host()
    rows = [("0000:b3:00.0", "GeForce RTX 4090", "GPU-cccccccc-0000-0000-0000-000000000003", 0),
            ("0000:17:00.0", "H100 80GB HBM3", "GPU-aaaaaaaa-0000-0000-0000-000000000001", 2),
            ("0000:3B:00.0", "L40S", "GPU-bbbbbbbb-0000-0000-0000-000000000002", 1)]
    for bus, model, uuid, minor in rows:
        _information(h, bus, REAL_INFORMATION.format(model=model, uuid=uuid, bus=bus, minor=minor))
    f = hostfacts.gather(config_for(h))
    assert [(g.index, g.bus_id, g.minor, g.uuid[:12], g.brand) for g in f.gpus] == [
        (0, "0000:17:00.0", 2, "GPU-aaaaaaaa", 14),
        (1, "0000:3B:00.0", 1, "GPU-bbbbbbbb", 14),
        (2, "0000:b3:00.0", 0, "GPU-cccccccc", 5)]
    d = f.to_dict()["gpus"][0]
    assert (d["index"], d["minor"], d["uuid"], d["mig_devices"]) == (0, 2, "GPU-aaaaaaaa-0000-0000-0000-000000000001", [])


@pytest.mark.parametrize("text, uuid, minor", [
    ("Model: NVIDIA H100\nGPU UUID: GPU-5a1c\nDevice Minor: 3\n", "GPU-5a1c", 3),
    ("Model: NVIDIA H100\n", None, None),                                   # old drivers, trimmed files
    ("Model: NVIDIA H100\nGPU UUID: ????????\nDevice Minor: x\n", None, None),  # a masked UUID, junk
    ("Device Minor: 12\nGPU UUID: \t GPU-ab:cd\n", "GPU-ab:cd", 12),
    ("\0\xff garbage without colons", None, None),
])
def test_gpu_information_fields_are_parsed_or_absent(fake_host, text, uuid, minor):
    h = fake_host()
    _information(h, "0000:01:00.0", text)
    [g] = hostfacts.gather(config_for(h)).gpus
    assert (g.uuid, g.minor, g.index) == (uuid, minor, 0)


def test_unreadable_gpu_entry_keeps_the_others_indexes(fake_host):
    """A bus dir without an information file still holds its place in the enumeration order."""
    h = fake_host()
    os.makedirs(os.path.join(h, "proc/driver/nvidia/gpus/0000:17:00.0"))
    _information(h, "0000:65:00.0", REAL_INFORMATION.format(model="H100", uuid="GPU-1", bus="0000:65:00.0", minor=1))
    [g] = hostfacts.gather(config_for(h)).gpus
    assert (g.index, g.bus_id, g.minor) == (1, "0000:65:00.0", 1)


# -- Tegra ----------------------------------------------------------------------------

def test_tegra_via_dev_nvgpu(fake_host):
    f = hostfacts.gather(config_for(fake_host(tegra=True)), cuda_version="13.1")
    assert f.tegra and f.driver_version is None
    assert (f.cuda_version, f.cuda_source) == ((13, 1, 0), "command line")
    assert f.to_dict()["cuda_version"] == "13.1"


def test_not_tegra_with_a_kernel_driver(fake_host):
    f = hostfacts.gather(config_for(fake_host(tegra=True, version_line=OPEN_ARM)))
    assert not f.tegra and f.driver_version == (580, 65, 6)


# -- overrides ----------------------------------------------------------------------------

def test_config_override(fake_host):
    h = fake_host(version_line=PROPRIETARY)
    f = hostfacts.gather(config_for(h, host_driver_version="550.54.15", host_cuda_version="12.4"))
    assert (f.driver_version, f.driver_source, f.driver_text) == ((550, 54, 15), "config", "550.54.15")
    assert (f.cuda_version, f.cuda_source) == ((12, 4, 0), "config")


def test_cli_override_beats_config(fake_host):
    h = fake_host(version_line=PROPRIETARY)
    f = hostfacts.gather(config_for(h, host_driver_version="550.54.15", host_cuda_version="12.4"),
                         driver_version=" 575.57.08 ", cuda_version="12.9")
    assert (f.driver_version, f.driver_source, f.driver_text) == ((575, 57, 8), "command line", "575.57.08")
    assert (f.cuda_version, f.cuda_source) == ((12, 9, 0), "command line")


def test_bad_cli_override_is_unknown_with_a_note(fake_host):
    # No fallback to /proc: a given version replaces detection.
    h = fake_host(version_line=PROPRIETARY)
    f = hostfacts.gather(config_for(h), driver_version="abc", cuda_version="x")
    assert f.driver_version is None and f.cuda_version is None
    assert any("'abc'" in n for n in f.notes) and any("'x'" in n for n in f.notes)
    assert f.to_dict()["driver_version"] is None


def test_nvml_never_used_on_a_fake_root(fake_host, monkeypatch):
    import sys
    import types

    calls = []
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    h = fake_host(tegra=True)
    os.makedirs(os.path.join(h, "dev"), exist_ok=True)
    open(os.path.join(h, "dev/nvidiactl"), "w").close()
    f = hostfacts.gather(config_for(h, nvml="auto"))
    assert calls == [] and f.driver_version is None


def test_source_recorded_for_each_fact(fake_host):
    h = fake_host(version_line=OPEN_X86, gpus=["NVIDIA H100 80GB HBM3"])
    d = hostfacts.gather(config_for(h), cuda_version="12.9").to_dict()
    assert d["driver_source"] == "/proc/driver/nvidia/version"
    assert d["cuda_source"] == "command line"
    assert d["gpus_source"] == "/proc/driver/nvidia/gpus"
    assert d["gpus"][0]["brand_source"] == "proc-model-name"
    assert d["arch"] == os.uname().machine
