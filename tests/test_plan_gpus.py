"""``plan`` and the GPUs a driver branch drives: ``gpu_unsupported_by_driver`` (CUDA error 100).

The branch x architecture table (compat_hook/facts/gpusupport.py) is checked against its
sources in docs/background.md, the architecture of a GPU against two independent readings
(its name, its PCI device ID), and the outcome end to end: ``plan --gpu``, ``plan`` on a
host whose GPUs are read from ``/proc`` and the PCI bus (listed by the driver or not), and
the GPUs a container's ``NVIDIA_VISIBLE_DEVICES`` selects.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

import pytest

from compat_hook.core.config import from_mapping
from compat_hook.facts import gpunames, gpusupport
from compat_hook.policy import preflight
from tests.conftest import build_tree
from tests.support.trees import write_fake_host

REPO = pathlib.Path(__file__).resolve().parent.parent
PYTHON = "/usr/bin/python3"


def cli(*args):
    return subprocess.run([PYTHON, "-m", "compat_hook", "plan", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def bundle(tmp: pathlib.Path, env: list, name: str = "bundle") -> pathlib.Path:
    b = tmp / name
    build_tree(b / "rootfs", {"etc/os-release": "ID=debian\n"})
    (b / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                               "process": {"env": env}}))
    return b


def conf(tmp: pathlib.Path, host: pathlib.Path) -> pathlib.Path:
    c = tmp / "c.yaml"
    c.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {host}\n")
    return c


@pytest.fixture
def cuda118(tmp_path):
    host = write_fake_host(tmp_path / "host", version="535.261.03")
    return {"bundle": bundle(tmp_path, ["CUDA_VERSION=11.8.0"]), "conf": conf(tmp_path, host), "tmp": tmp_path}


# --------------------------------------------------------------------------- the table and its sources


def test_every_row_of_the_table_is_the_one_docs_background_sources():
    """docs/background.md's table (with its sources) and the code's table say the same branches."""
    text = (REPO / "docs/background.md").read_text()
    section = text.split("## GPU architectures and driver branches", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in gpusupport.BRANCHES:
            def branch(c):
                m = re.fullmatch(r"R(\d+)", c)
                return int(m.group(1)) if m else None
            rows[cells[0]] = (branch(cells[2]), branch(cells[3]))
            assert "https://" in cells[4], f"{cells[0]}: no public source: {line}"
    assert rows == gpusupport.BRANCHES


def test_dropped_and_new_architectures_as_nvidia_states_them():
    # Kepler: R470 is the last; Maxwell, Pascal, Volta: R580 is the last; Hopper and Blackwell: a first
    assert [gpusupport.supports(b, "Kepler") for b in (470, 495)] == [True, False]
    for arch in ("Maxwell", "Pascal", "Volta"):
        assert [gpusupport.supports(b, arch) for b in (580, 590)] == [True, False], arch
    assert [gpusupport.supports(b, "Hopper") for b in (470, 515, 520, 590)] == [False, False, True, True]
    assert [gpusupport.supports(b, "Blackwell") for b in (565, 570)] == [False, True]
    assert gpusupport.supports(390, None)  # an architecture nobody could tell is not judged


# --------------------------------------------------------------------------- a GPU's architecture


@pytest.mark.parametrize("name, pci_id", [
    ("Tesla K80", "0x102d"), ("Tesla M60", "0x13f2"), ("Tesla M40", "0x17fd"), ("Tesla P100-PCIE-16GB", "0x15f8"),
    ("Tesla P40", "0x1b38"), ("Tesla V100-SXM2-16GB", "0x1db1"), ("TITAN V", "0x1d81"), ("Tesla T4", "0x1eb8"),
    ("NVIDIA GeForce GTX 1660 SUPER", "0x21c4"), ("NVIDIA A100-SXM4-40GB", "0x20b0"), ("NVIDIA A10", "0x2236"),
    ("NVIDIA A2", "0x25b6"), ("NVIDIA H100 80GB HBM3", "0x2330"), ("NVIDIA H200", "0x2335"),
    ("NVIDIA L40S", "0x26b9"), ("NVIDIA L4", "0x27b8"), ("NVIDIA GeForce RTX 4090", "0x2684"),
    ("NVIDIA B200", "0x2901"), ("NVIDIA GeForce RTX 5090", "0x2b85"), ("NVIDIA B300 SXM6 AC", "0x3182"),
])
def test_the_name_and_the_pci_device_id_tell_the_same_architecture(name, pci_id):
    """Two independent readings (the model table with compute capabilities, the PCI ID blocks) agree."""
    by_name = gpunames.resolve(name).architecture
    assert by_name is not None and by_name == gpunames.architecture_of_pci(pci_id)
    assert by_name in gpusupport.BRANCHES


@pytest.mark.parametrize("pci_id", ["0x10f0", "0x1aef", "0x22ba", "0x1ad6", "0x3300", "0x0"])
def test_ids_outside_the_gpu_blocks_have_no_architecture(pci_id):
    """HDMI audio and USB functions of a board, and IDs newer than the table: no guess."""
    assert gpunames.architecture_of_pci(pci_id) is None


@pytest.mark.parametrize("name, arch", [
    ("Tesla K20Xm", "Kepler"), ("Quadro K6000", "Kepler"), ("Quadro M4000", "Maxwell"),
    ("NVIDIA GeForce GTX 980", "Maxwell"), ("Quadro P4000", "Pascal"), ("NVIDIA GeForce GTX 1080 Ti", "Pascal"),
    ("Quadro GV100", None), ("Orin", None), ("NVIDIA GeForce RTX 3090", "Ampere"), ("GB10", "Blackwell"),
])
def test_architecture_from_the_family_where_no_model_is_known(name, arch):
    assert gpunames.resolve(name).architecture == arch


# --------------------------------------------------------------------------- plan --gpu


def _row(out) -> dict:
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)["images"][0]


def test_h100_rolled_back_to_r470_is_broken_with_no_device(cuda118):
    args = [str(cuda118["bundle"]), "--gpu", "H100", "--from-driver", "535.261.03", "--driver", "470.256.02",
            "--config", str(cuda118["conf"]), "--json"]
    row = _row(cli(*args))
    # R470 alone would give a CUDA 11.8 image host-minor 11.4; it does not drive Hopper at all
    assert row["now"]["outcome"] == "host"
    assert row["after"]["outcome"] == "broken" and row["after"]["reason"] == "gpu_unsupported_by_driver"
    assert row["after"]["error"] == 100
    [why] = row["after"]["unsupported_gpus"]
    assert "Hopper" in why and "R520 and later" in why and "R470" in why
    assert row["toolkit_only_after"]["reason"] == "gpu_unsupported_by_driver"  # no runtime can help
    assert row["regression"] is True
    assert cli(*args, "--fail-on", "regression").returncode == 3
    assert cli(*args, "--fail-on", "broken").returncode == 3
    # the same node moving to R580 works
    fwd = _row(cli(*args[:-5], "--driver", "580.95.05", "--config", str(cuda118["conf"]), "--json"))
    assert fwd["after"]["outcome"] == "host" and fwd["regression"] is False


@pytest.mark.parametrize("driver, broken", [("590.44.01", True), ("580.95.05", False), ("595.45.04", True)])
def test_v100_is_driven_up_to_r580(cuda118, driver, broken):
    out = cli(str(cuda118["bundle"]), "--gpu", "Tesla V100-SXM2-16GB", "--driver", driver,
              "--config", str(cuda118["conf"]), "--json", "--fail-on", "regression")
    row = _row(out)
    assert (row["after"]["outcome"] == "broken") is broken
    assert (row["after"].get("reason") == "gpu_unsupported_by_driver") is broken
    assert out.returncode == (3 if broken else 0)
    r = json.loads(out.stdout)
    assert r["gpus"][0]["architecture"] == "Volta" and r["gpus"][0]["architecture_from"] == "compute capability 7.0"
    assert r["gpus"][0]["listed_by_driver"] is None  # named by --gpu: no driver listed it


def test_text_names_the_gpu_and_the_regression(cuda118):
    out = cli(str(cuda118["bundle"]), "--gpu", "V100", "--driver", "590.44.01", "--config", str(cuda118["conf"]))
    lines = out.stdout.splitlines()
    assert lines[1].split()[4:6] == ["broken", "(100)"], lines
    assert f"regression: {cuda118['bundle']}: host 12.2 now, broken (100) after (gpu_unsupported_by_driver)" in lines
    assert "no device after (590.44.01): Tesla V100 (Volta): driven by R384 to R580, not R590" in lines
    assert lines[-1].endswith("; 1 regression(s) (working now, broken after), 0 broken now and after")


# --------------------------------------------------------------------------- plan on a host


def _host_plan(tmp, host, env, driver, from_driver=None) -> dict:
    cfg = from_mapping({"log_file": None, "nvml": "off", "host_root": str(host)})
    b = bundle(tmp, env, f"b{sum(1 for _ in tmp.iterdir())}")
    return preflight.plan(cfg, [str(b)], driver=driver, from_driver=from_driver)


def test_host_gpus_read_from_proc_and_the_pci_bus(tmp_path):
    """A GPU the driver names only "NVIDIA Graphics Device" is placed by its PCI device ID; a GPU on the
    bus the driver does not list counts too (the target driver would list it)."""
    host = write_fake_host(tmp_path / "host", version="535.261.03", gpus={"0000:17:00.0": "NVIDIA Graphics Device"},
                           pci={"0000:17:00.0": "0x2330", "0000:65:00.0": "0x1db1"})
    r = _host_plan(tmp_path, host, ["CUDA_VERSION=12.2.0"], "590.44.01")
    listed, unlisted = r["gpus"]
    assert (listed["bus_id"], listed["architecture"], listed["architecture_from"], listed["listed_by_driver"]) == \
        ("0000:17:00.0", "Hopper", "PCI device ID 0x2330", True)
    assert (unlisted["bus_id"], unlisted["architecture"], unlisted["listed_by_driver"], unlisted["model"]) == \
        ("0000:65:00.0", "Volta", False, None)
    [row] = r["images"]
    # R590 drives the H100 but not the V100 beside it: a container asking for all GPUs gets error 100
    assert row["after"]["reason"] == "gpu_unsupported_by_driver"
    assert row["after"]["unsupported_gpus"] == ["PCI device 10de:1db1 at 0000:65:00.0 (Volta): driven by "
                                                "R384 to R580, not R590"]
    # the V100 is unlisted now: is 535 supposed to drive it? it does (R384 to R580): now works
    assert row["now"]["outcome"] == "host" and row["regression"] is True
    # a container given the H100 alone (index 0) is not affected
    [one] = _host_plan(tmp_path, host, ["CUDA_VERSION=12.2.0", "NVIDIA_VISIBLE_DEVICES=0"], "590.48.01")["images"]
    assert one["after"]["outcome"] == "host"


def test_a_current_driver_that_does_not_drive_the_gpu_is_reported_now(tmp_path):
    """R470 with an H100 on the bus: it lists no GPU, every container is broken now; R535 fixes it."""
    host = write_fake_host(tmp_path / "host", version="470.256.02", pci={"0000:17:00.0": "0x2330"})
    r = _host_plan(tmp_path, host, ["CUDA_VERSION=11.4.0"], "535.261.03")
    [row] = r["images"]
    assert (row["now"]["outcome"], row["now"]["error"]) == ("broken", 100)
    assert row["after"]["outcome"] == "host" and row["regression"] is False
    assert r["summary"]["broken_now_and_after"] == 0 and r["summary"]["changed"] == 1
    # staying on a driver that does not drive it: broken now and after, not a regression
    r = _host_plan(tmp_path, host, ["CUDA_VERSION=11.4.0"], "470.239.06")
    assert r["summary"]["broken_now_and_after"] == 1 and r["summary"]["regressions"] == 0
    assert preflight.gate(r, "regression") == (0, None) and preflight.gate(r, "broken")[0] == 3


def test_a_gpu_the_running_driver_lists_is_one_it_drives(tmp_path):
    """The running R590 lists a V100 (a branch the table says drops Volta): now is what the driver says."""
    host = write_fake_host(tmp_path / "host", version="590.44.01", gpus={"0000:17:00.0": "Tesla V100-SXM2-16GB"})
    [row] = _host_plan(tmp_path, host, ["CUDA_VERSION=12.2.0"], "595.45.04")["images"]
    assert row["now"]["outcome"] == "host"
    assert row["after"]["reason"] == "gpu_unsupported_by_driver"
    # the same GPU named by --from-driver instead of the running driver is judged by the table
    [row] = _host_plan(tmp_path, host, ["CUDA_VERSION=12.2.0"], "595.45.04", from_driver="590.48.01")["images"]
    assert row["now"]["reason"] == "gpu_unsupported_by_driver"


@pytest.mark.parametrize("visible, broken", [("0", False), ("1", True), ("all", True), ("GPU-beef", False)])
def test_only_the_gpus_the_container_uses_count(tmp_path, visible, broken):
    host = write_fake_host(tmp_path / "host", version="580.95.05",
                           gpus={"0000:17:00.0": "NVIDIA H100 80GB HBM3", "0000:65:00.0": "Tesla V100-SXM2-16GB"})
    # the fake host gives both GPUs one UUID; name the H100 by a UUID of its own
    info = host / "proc/driver/nvidia/gpus/0000:17:00.0/information"
    info.write_text(info.read_text().replace("GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-beef"))
    [row] = _host_plan(tmp_path, host, ["CUDA_VERSION=12.2.0", f"NVIDIA_VISIBLE_DEVICES={visible}"],
                       "590.44.01")["images"]
    assert (row["after"]["outcome"] == "broken") is broken, row["after"]


def test_an_architecture_nobody_can_tell_is_not_judged(tmp_path):
    host = write_fake_host(tmp_path / "host", version="535.261.03", pci={"0000:17:00.0": "0x3300"})
    r = _host_plan(tmp_path, host, ["CUDA_VERSION=11.4.0"], "470.256.02")
    assert r["gpus"][0]["architecture"] is None
    assert r["images"][0]["after"]["outcome"] == "host"  # R470 gives CUDA 11.4
