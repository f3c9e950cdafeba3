"""Rule 10 in real runc and crun containers: a V100 host without NVML keeps the host driver (issue 32).

The image's compat driver is a real libcuda (Debian's 550 build) carrying NVIDIA's R590 note
(CUDA 13.1, branches 535 ... 590) under an R590 file name, so the probe inside the container
can tell which library the loader really mapped: the compat one reports 12040 from
``cuDriverGetVersion``, the fake R535 host's 12020. The host's GPU is told only by
``/proc/driver/nvidia/gpus/<bdf>/information`` and sysfs' PCI device ID (NVML off), as on a
node without nvidia-ml-py. R590 dropped Volta: on the V100 the hook must keep the host driver,
as ``plan --gpu V100`` predicts; on an H100 the compat driver loads.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

from compat_hook.facts import elfgen
from tests import test_hook_containers as thc
from tests.support import debs
from tests.support.versions import COMPAT_550, HOST_535

pytestmark = pytest.mark.containers

R590 = "590.44.01"
BUS = "0000:17:00.0"
GPUS = {"v100": ("Tesla V100-SXM2-16GB", "0x1db1"), "h100": ("NVIDIA H100 80GB HBM3", "0x2330")}
COMPAT_LIB = f"{thc.COMPAT_DIR}/libcuda.so.{R590}"


@pytest.fixture(scope="module")
def libs() -> dict:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


def r590_lib(tmp: pathlib.Path, src: pathlib.Path) -> pathlib.Path:
    """Debian's 550 libcuda with NVIDIA's R590 note, named ``libcuda.so.590.44.01``."""
    tmp.mkdir(parents=True, exist_ok=True)
    note = tmp / "NOTE.bin"
    note.write_bytes(elfgen.note_bytes(elfgen.NOTE_590))
    out = tmp / f"libcuda.so.{R590}"
    shutil.copyfile(src, out)
    p = subprocess.run(["objcopy", f"--add-section={elfgen.NOTE_NAME}={note}",
                        f"--set-section-flags={elfgen.NOTE_NAME}=alloc,readonly", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return out


def _plan(env: thc.Env, gpu: str) -> dict:
    """``plan --gpu`` on the bundle the container ran from, the target driver the host's own."""
    p = subprocess.run([thc.PYTHON, "-m", "compat_hook", "plan", str(env.bundle), "--gpu", gpu, "--driver", HOST_535,
                        "--config", str(env.config), "--json"], cwd=thc.REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 3), p.stderr
    [row] = json.loads(p.stdout)["images"]
    return row


@thc.RUNTIMES
@pytest.mark.parametrize("gpu, cuda, reason", [
    ("v100", 12020, "gpu_arch_unsupported"),
    ("h100", 12040, "compat_newer_supported"),
])
def test_r590_compat_driver_on_a_gpu_told_by_proc_and_sysfs(tmp_path, runtime, libs, gpu, cuda, reason):
    model, pci = GPUS[gpu]
    env = thc.Env(tmp_path, runtime, libs, HOST_535, compat_lib=r590_lib(tmp_path / "lib", libs[COMPAT_550]),
                  gpus={BUS: (model, "GPU-0a1b2c3d-0000-1111-2222-333344445555", 0)}, nvml="off")
    dev = env.host_root / "sys/bus/pci/devices" / BUS
    dev.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("device", pci), ("class", "0x030200")):
        (dev / name).write_text(value + "\n")
    res = env.run()
    # what the container's loader really mapped: the host's R535 libcuda on the V100
    thc.assert_probe(res, cuda, COMPAT_LIB if cuda == 12040 else thc.host_lib(HOST_535))
    rec = thc.only_record(env, res)
    assert (rec["reason"], rec["compat_version"]) == (reason, R590), rec
    report = thc.explain(env)
    assert (report["reason"], report["host"]["gpus"][0]["pci_device_id"]) == (reason, pci), report["details"]
    row = _plan(env, gpu.upper())
    assert row["now"]["reason"] == reason, row
    assert (row["now"]["outcome"] in ("compat", "compat-minor")) is (cuda == 12040), row
