"""The decision's GPU rules read the GPU facts ``plan`` reads (issue 32).

* Rule 10 (``gpu_arch_unsupported``): a compat driver whose branch does not drive the
  architecture of a GPU the container gets is refused. The architecture is told by
  NVML's compute capability, else the PCI device ID (sysfs), else the model name in
  ``/proc/driver/nvidia/gpus/<bdf>/information``, through the one branch x architecture
  table ``plan`` judges drivers by (compat_hook/facts/gpusupport.py). Without NVML the
  hook used to enable an R590 compat driver on a V100, where ``plan`` said ``host``.
* Rule 4's host-CUDA path is a Tegra host's only: a dGPU host whose driver version is
  unknown is ``host_driver_unknown``, whatever CUDA version is known.
* Rule 3b: Orin's compat (``libcuda.so.1.1``, ``compat_orin``) on no host not known to
  be Tegra.

The GPU is faked at the file boundary only (``/proc/driver/nvidia``, ``/sys/bus/pci``);
the hook runs as a real process, as a runtime starts it.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from compat_hook.core.config import from_mapping
from compat_hook.facts import gpunames, gpusupport, hostfacts, imagefacts
from compat_hook.facts.hostfacts import Gpu, HostFacts
from compat_hook.facts.rootfs import Root
from compat_hook.core.versions import parse_version
from compat_hook.policy import outcome, preflight
from compat_hook.policy.decision import REASONS, decide
from tests.conftest import Symlink, config_for, elf
from tests.elfgen import NOTE_590, NOTE_ORIN
from tests.support import hostile as h
from tests.support.trees import write_fake_host

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = "/usr/bin/python3"

V100, V100_PCI = "Tesla V100-SXM2-16GB", "0x1db1"
H100, H100_PCI = "NVIDIA H100 80GB HBM3", "0x2330"
BUS = "0000:17:00.0"
R580 = "580.95.05"

#: An image with NVIDIA's R590 compat driver (note: CUDA 13.1, branches 535 ... 590).
R590_ROOTFS = {"usr/local/cuda-13.1/compat/libcuda.so.590.44.01": elf(NOTE_590),
               "usr/local/cuda-13.1/compat/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
               "usr/local/cuda": Symlink("cuda-13.1")}
ORIN_ROOTFS = {"usr/local/cuda-13.2/compat_orin/libcuda.so.1.1": elf(NOTE_ORIN),
               "usr/local/cuda": Symlink("cuda-13.2")}


def _decide(make_rootfs, host_root, entries=R590_ROOTFS, **cfg):
    config = config_for(host_root, **cfg)
    with Root(str(make_rootfs(entries))) as r:
        img = imagefacts.gather(r, config)
    facts = hostfacts.gather(config)
    return decide(facts, img, None, config), facts


# --------------------------------------------------------------------------- host facts without NVML


def test_host_facts_read_each_gpus_pci_device_id(tmp_path):
    host = write_fake_host(tmp_path / "host", version=R580,
                           gpus={BUS: V100, "0000:65:00.0": "NVIDIA Graphics Device", "0000:b3:00.0": H100},
                           pci={BUS: V100_PCI, "0000:65:00.0": "0x2330"})
    (host / "sys/bus/pci/devices/0000:b3:00.0").mkdir(parents=True)
    (host / "sys/bus/pci/devices/0000:b3:00.0/device").write_text("not an id\n")
    f = hostfacts.gather(config_for(host))
    assert [(g.bus_id, g.model, g.pci_id, g.compute_capability) for g in f.gpus] == [
        (BUS, V100, V100_PCI, None), ("0000:65:00.0", "NVIDIA Graphics Device", "0x2330", None),
        ("0000:b3:00.0", H100, None, None)]  # a garbled sysfs file is no ID
    assert f.gpus[0].to_dict()["pci_device_id"] == V100_PCI
    # each placed as plan places it: the PCI device ID first, else the model name
    placed = [gpusupport.of_gpu(g, None, None) for g in f.gpus]
    assert [(a.arch, a.arch_from) for a in placed] == [
        ("Volta", f"PCI device ID {V100_PCI}"), ("Hopper", "PCI device ID 0x2330"), ("Hopper", f"model name {H100}")]


# --------------------------------------------------------------------------- rule 10 through the host facts


@pytest.mark.parametrize("gpus, pci, reason", [
    pytest.param({BUS: V100}, {}, "gpu_arch_unsupported", id="v100-model-name"),
    pytest.param({BUS: V100}, {BUS: V100_PCI}, "gpu_arch_unsupported", id="v100-pci-id"),
    pytest.param({BUS: "Tesla P100-PCIE-16GB"}, {}, "gpu_arch_unsupported", id="p100-model-name"),
    pytest.param({BUS: H100}, {BUS: H100_PCI}, "compat_newer_supported", id="h100"),
    pytest.param({BUS: "Tesla T4"}, {}, "compat_newer_supported", id="t4-turing"),
    # the container gets every GPU: one the compat driver does not drive is enough
    pytest.param({BUS: H100, "0000:65:00.0": V100}, {}, "gpu_arch_unsupported", id="h100-and-v100"),
])
def test_r590_compat_on_a_host_without_nvml(make_rootfs, tmp_path, gpus, pci, reason):
    host = write_fake_host(tmp_path / "host", version=R580, gpus=gpus, pci=pci)
    d, facts = _decide(make_rootfs, host)
    assert not any(g.compute_capability for g in facts.gpus)  # no NVML: no compute capability
    assert d.reason == reason, d.to_dict()
    if reason == "gpu_arch_unsupported":
        assert d.effect == "host"
        line = d.details["gpu"]
        assert ("(Volta)" in line or "(Pascal)" in line) and line.endswith(" to R580, not R590") or \
            line.endswith("(Pascal), from its model name Tesla P100-PCIE-16GB: driven by R580 and earlier, not R590"), line
        assert ("PCI device ID" in line) is bool(pci), line


def test_a_gpu_known_only_by_its_pci_id_is_placed_by_it(make_rootfs, tmp_path):
    """The driver names it "NVIDIA Graphics Device" (a board newer than its name table): sysfs' ID tells."""
    host = write_fake_host(tmp_path / "host", version=R580, gpus={BUS: "NVIDIA Graphics Device"},
                           pci={BUS: V100_PCI})
    d, _ = _decide(make_rootfs, host, device_check="warn")  # its brand is unknown: warn, not refuse
    assert d.reason == "gpu_arch_unsupported", d.to_dict()
    assert d.details["gpu"] == (f"NVIDIA Graphics Device at {BUS} (Volta), from its PCI device ID {V100_PCI}: "
                                "driven by R384 to R580, not R590")
    # nothing tells its architecture: not judged (a guess would be a wrong prediction either way)
    host2 = write_fake_host(tmp_path / "host2", version=R580, gpus={BUS: "NVIDIA Graphics Device"})
    assert _decide(make_rootfs, host2, device_check="warn")[0].reason == "compat_newer_supported"


def test_a_dropped_architectures_last_branch_refuses_a_newer_compat_driver(make_rootfs, tmp_path):
    """A K80 on R470 (Kepler's last branch): a 535 compat driver does not drive it."""
    host = write_fake_host(tmp_path / "host", version="470.256.02", gpus={BUS: "Tesla K80"}, pci={BUS: "0x102d"})
    entries = {"usr/local/cuda-12.2/compat/libcuda.so.535.261.03": elf(None),
               "usr/local/cuda": Symlink("cuda-12.2")}
    d, _ = _decide(make_rootfs, host, entries)
    assert d.reason == "gpu_arch_unsupported" and "driven by R470 and earlier, not R535" in d.details["gpu"], d.details
    # a T4 beside it on the same compat driver is fine when the container is given the T4 alone
    host2 = write_fake_host(tmp_path / "host2", version="470.256.02", gpus={BUS: "Tesla T4"})
    assert _decide(make_rootfs, host2, entries)[0].reason == "compat_major_newer"


def test_the_reason_is_one_code_of_the_one_table():
    assert "gpu_arch_unsupported" in REASONS and "gpu_unsupported_by_driver" not in REASONS
    assert set(outcome.OUTCOME_REASONS).isdisjoint(REASONS)
    readme = (REPO / "README.md").read_text()
    assert "`gpu_arch_unsupported`" in readme


# --------------------------------------------------------------------------- rules 3b and 4: Tegra only


def test_a_dgpu_host_with_a_cuda_version_but_no_driver_version_is_driver_unknown(make_rootfs, tmp_path):
    """No /proc version, no /sys version, no host libcuda; a CUDA version from the config. Before: the
    Tegra rule enabled an R590 compat driver on the note's CUDA 13.1 > 12.4."""
    host = write_fake_host(tmp_path / "host", gpus={BUS: H100})
    d, facts = _decide(make_rootfs, host, host_cuda_version="12.4")
    assert facts.driver_version is None and facts.cuda_version == (12, 4, 0) and not facts.tegra
    assert (d.reason, d.effect) == ("host_driver_unknown", "leave"), d.to_dict()


@pytest.mark.parametrize("cuda", [None, "13.1"])
def test_an_orin_library_is_refused_on_a_host_not_known_to_be_tegra(make_rootfs, tmp_path, cuda):
    host = write_fake_host(tmp_path / "host")  # no driver version, no /dev/nvgpu
    d, facts = _decide(make_rootfs, host, ORIN_ROOTFS, **({"host_cuda_version": cuda} if cuda else {}))
    assert facts.driver_version is None and not facts.tegra
    assert (d.reason, d.effect) == ("compat_orin_not_tegra", "host"), d.to_dict()


def test_an_orin_host_still_takes_the_host_cuda_path(make_rootfs, tmp_path):
    host = write_fake_host(tmp_path / "host", tegra=True)
    d, facts = _decide(make_rootfs, host, ORIN_ROOTFS, host_cuda_version="13.1")
    assert facts.tegra and (d.action, d.reason) == ("enable", "compat_cuda_newer"), d.to_dict()
    # ... and an SBSA/dGPU compat driver is never Orin's
    assert _decide(make_rootfs, host, R590_ROOTFS, host_cuda_version="13.0")[0].reason == "compat_dgpu_on_tegra"


# --------------------------------------------------------------------------- differential: decision vs outcome


def _r590_image(make_rootfs):
    config = config_for(None)
    with Root(str(make_rootfs(R590_ROOTFS))) as r:
        return imagefacts.gather(r, config)


#: device_check off: the brand rule (GeForce, TITAN) stays out of the architecture's way.
OFF = from_mapping({"nvml": "off", "log_file": None, "device_check": "off"})


def _model_names() -> list:
    return sorted(name for name, _ in gpunames.MODELS.values())


def test_decision_and_outcome_judge_every_known_gpu_alike_for_r590(make_rootfs):
    """For each GPU model of gpunames' table, in each form a host or plan knows it (NVML's compute
    capability, /proc's name, sysfs' PCI ID, plan's --gpu name): the decision refuses an R590 compat
    driver exactly where plan's outcome says branch R590 does not drive the GPU."""
    img = _r590_image(make_rootfs)
    request = outcome.gpu_request([])
    pci_of = {}  # a PCI device ID per architecture, from the table's blocks
    for first, _, arch in gpunames.PCI_BLOCKS:
        pci_of.setdefault(arch, f"0x{first:04x}")
    refused, judged = set(), 0
    for name in _model_names():
        [named] = preflight.gpus_from_names([name])
        arch = gpunames.resolve(name).architecture
        forms = {
            "nvml": Gpu(BUS, name, named.brand, "nvml", named.compute_capability, index=0),
            "proc": Gpu(BUS, name, named.brand, "proc-model-name", index=0),
            "plan --gpu": named,
        }
        if arch in pci_of:
            forms["pci"] = Gpu(BUS, "NVIDIA Graphics Device", 0, "proc-model-name", index=0, pci_id=pci_of[arch])
        want = bool(outcome.unsupported_gpus(HostFacts(driver_version=parse_version("590.44.01")), request,
                                             [gpusupport.of_gpu(named, None, None)]))
        for form, g in forms.items():
            d = decide(HostFacts(driver_version=parse_version(R580), gpus=[g]), img, request, OFF)
            assert d.reason in ("gpu_arch_unsupported", "compat_newer_supported"), (name, form, d.to_dict())
            assert (d.reason == "gpu_arch_unsupported") is want, (name, form, arch, d.details.get("gpu"))
            judged += 1
        if want:
            refused.add(arch)
    # the check can fail: R590 dropped these, and drives the others
    assert refused == {"Kepler", "Maxwell", "Pascal", "Volta"}, refused
    assert judged >= 3 * len(gpunames.MODELS)


# --------------------------------------------------------------------------- end to end: hook, explain, plan


def _explain(bundle: pathlib.Path, config: pathlib.Path) -> dict:
    p = subprocess.run([PYTHON, "-m", "compat_hook", "explain", "--bundle", str(bundle), "--config", str(config),
                        "--json"], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _plan(bundle: pathlib.Path, config: pathlib.Path, gpu: str) -> dict:
    p = subprocess.run([PYTHON, "-m", "compat_hook", "plan", str(bundle), "--gpu", gpu, "--driver", R580,
                        "--config", str(config), "--json"], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    assert p.returncode == 0, p.stderr
    [row] = json.loads(p.stdout)["images"]
    return row


@pytest.mark.parametrize("model, pci, gpu, reason, effect", [
    pytest.param(V100, {BUS: V100_PCI}, "V100", "gpu_arch_unsupported", "host", id="v100-pci"),
    pytest.param(V100, {}, "Tesla V100-SXM2-16GB", "gpu_arch_unsupported", "host", id="v100-name"),
    pytest.param(H100, {BUS: H100_PCI}, "H100", "compat_newer_supported", "compat", id="h100"),
])
def test_the_hook_explain_and_plan_agree_without_nvml(tmp_path, model, pci, gpu, reason, effect):
    """The registered hook as a runtime runs it, over an image carrying NVIDIA's R590 compat stub, on a
    fake R580 host whose GPU only /proc and sysfs tell (NVML off); explain on the same bundle, and
    ``plan --gpu`` on the same target driver, say the same."""
    host = write_fake_host(tmp_path / "host", version=R580, gpus={BUS: model}, pci=pci)
    env = h.make_hook_env(tmp_path / "hookenv", host_root=str(host))
    bundle = h.write_bundle(tmp_path / "bundle")
    root = h.base_rootfs(bundle / "rootfs")  # /usr/local/cuda/compat/libcuda.so.590.44.01, note R590
    r = h.run_hook(env.entry, h.state_json(bundle), cwd=bundle / "rootfs")
    assert r.rc == 0, str(r)
    rec = env.last_record()
    assert (rec["decision"], rec["reason"], rec["effect"]) == (
        "enable" if effect == "compat" else "skip", reason, effect), rec
    assert rec["compat_version"] == h.COMPAT_VERSION and rec["host_driver_version"] == R580
    assert rec["gpus_checked"]["gpus"] == [f"0 {BUS} {model}"], rec
    dropin = root / h.DROPIN
    if effect == "compat":
        assert dropin.read_text() == h.dropin_text(h.COMPAT_DIR)
    else:
        # compat is wrong here: nothing of ours names the compat dir
        assert not dropin.exists() or h.COMPAT_DIR not in dropin.read_text(), dropin.read_text()

    x = _explain(bundle, env.config)
    assert (x["reason"], x["effect"]) == (reason, effect), x["details"]
    if effect == "host":
        assert "(Volta)" in x["details"]["gpu"] and x["details"]["gpu"].endswith("not R590"), x["details"]
        assert ("PCI device ID" in x["details"]["gpu"]) is bool(pci)

    row = _plan(bundle, env.config, gpu)
    assert row["after"]["reason"] == reason, row
    assert (row["after"]["outcome"] in ("compat", "compat-minor")) is (effect == "compat"), row
    assert row["now"]["reason"] == reason  # now and after: the same R580 driver


def _imports(env: h.HookEnv, bundle: pathlib.Path) -> tuple:
    args = list(env.entry["args"])
    args[1:1] = ["-X", "importtime"]
    r = h.run_hook(env.entry, h.state_json(bundle), args=args, cwd=bundle / "rootfs")
    assert r.rc == 0, str(r)
    mods = {line.rsplit("|", 1)[1].strip() for line in r.stderr.decode(errors="replace").splitlines()
            if line.startswith("import time:") and "|" in line}
    return mods, env.last_record()


def test_the_architecture_table_is_loaded_only_where_a_compat_driver_may_be_enabled(tmp_path):
    """A GPU host without compat libs does not load the table; an enabling start loads it without ``os``."""
    host = write_fake_host(tmp_path / "host", version=R580, gpus={BUS: H100}, pci={BUS: H100_PCI})
    env = h.make_hook_env(tmp_path / "hookenv", host_root=str(host))
    plain = h.write_bundle(tmp_path / "plain")
    h.base_rootfs(plain / "rootfs", compat=False)
    _imports(env, plain)  # the first start caches the parsed config
    mods, rec = _imports(env, plain)
    assert rec["reason"] == "no_candidate", rec
    assert not {"compat_hook.facts.gpusupport", "compat_hook.facts.gpunames"} & mods
    bundle = h.write_bundle(tmp_path / "bundle")
    root = h.base_rootfs(bundle / "rootfs")
    _imports(env, bundle)  # the first sight of the library parses it (pyelftools) and caches its facts
    (root / h.DROPIN).unlink()
    mods, rec = _imports(env, bundle)
    assert (rec["decision"], rec["elf_source"]) == ("enable", "cache"), rec
    assert {"compat_hook.facts.gpusupport", "compat_hook.facts.gpunames"} <= mods
    assert not {"os", "re", "json", "yaml"} & mods, sorted(mods)
