"""The GPUs a container gets: its request's device names (``NVIDIA_VISIBLE_DEVICES``, CDI
annotations and names, ``/dev/nvidiaN`` nodes) mapped to the host's GPUs (index, UUID, MIG UUID,
device minor), as the brand and architecture checks see them."""

from __future__ import annotations

import json

import pytest

from compat_hook.facts import oci
from compat_hook.facts.container import Request, parse_gpu_name
from compat_hook.policy.decision import select_gpus
from compat_hook.facts.hostfacts import Gpu

H100 = Gpu("0000:17:00.0", "NVIDIA H100 80GB HBM3", 14, "proc-model-name", index=0,
           uuid="GPU-5a1c0d3e-0000-4a4a-8b8b-000000000001", minor=2,
           mig=["MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"])
RTX = Gpu("0000:65:00.0", "NVIDIA GeForce RTX 4090", 5, "proc-model-name", index=1,
          uuid="GPU-9e8d7c6b-0000-4b4b-8c8c-000000000002", minor=0)
HOST = [H100, RTX]
#: The 4090's UUID as a request may spell it: NVML prints lower-case hex, a user may not.
RTX_UPPER_HEX = "GPU-" + RTX.uuid[len("GPU-"):].upper()
RTX_LOWER_PREFIX = "gpu-" + RTX.uuid[len("GPU-"):].upper()
#: One hex digit off: names no GPU here.
RTX_TYPO = RTX.uuid[:-1] + ("3" if RTX.uuid[-1] != "3" else "4")


def spec(env=(), devices=(), annotations=None, mounts=None) -> dict:
    s = {"process": {"env": list(env)}, "root": {"path": "rootfs"}}
    if devices:
        s["linux"] = {"devices": [{"path": p, "type": "c", "major": 195, "minor": 0} for p in devices]}
    if annotations is not None:
        s["annotations"] = annotations
    if mounts is not None:
        s["mounts"] = mounts
    return s


def chosen(s: dict, state_annotations=None):
    sel, why = select_gpus(HOST, Request.from_spec(s, None, state_annotations).gpu_names())
    return [g.index for g in sel], why


@pytest.mark.parametrize("s, want", [
    (spec(["NVIDIA_VISIBLE_DEVICES=0"]), [0]),
    (spec(["NVIDIA_VISIBLE_DEVICES=1"]), [1]),
    (spec(["NVIDIA_VISIBLE_DEVICES= 1 , 0 "]), [0, 1]),
    (spec(["NVIDIA_VISIBLE_DEVICES=all"]), [0, 1]),
    (spec(["NVIDIA_VISIBLE_DEVICES=ALL"]), [0, 1]),
    (spec([f"NVIDIA_VISIBLE_DEVICES={H100.uuid}"]), [0]),
    (spec([f"NVIDIA_VISIBLE_DEVICES={RTX_UPPER_HEX}"]), [1]),              # UUIDs match case-insensitively
    (spec([f"NVIDIA_VISIBLE_DEVICES={RTX_LOWER_PREFIX}"]), [1]),
    (spec([f"NVIDIA_VISIBLE_DEVICES={RTX_TYPO}"]), [0, 1]),                 # another UUID: all GPUs
    (spec([f"NVIDIA_VISIBLE_DEVICES=MIG-{H100.uuid}/3/0"]), [0]),          # MIG, pre-R470 form
    (spec(["NVIDIA_VISIBLE_DEVICES=MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"]), [0]),  # MIG UUID (NVML)
    (spec(["NVIDIA_VISIBLE_DEVICES=0:1"]), [0]),                            # <gpu>:<mig> index
    (spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"]), [1]),               # CDI name in the env
    (spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"]), [0, 1]),
    (spec(devices=["/dev/nvidia0"]), [1]),                                  # minor 0 is the 4090 here
    (spec(devices=["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]), [0]),
    (spec(["NVIDIA_VISIBLE_DEVICES=1"], devices=["/dev/nvidia2"]), [0, 1]),  # both: the union
    (spec(["NVIDIA_VISIBLE_DEVICES=all"], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}), [0]),
    (spec(annotations={"cdi.k8s.io/x": f"k8s.device-plugin.nvidia.com/gpu={RTX.uuid}"}), [1]),
    (spec(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0,nvidia.com/gpu=1"}), [0, 1]),
    (spec(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"}), [0, 1]),
    (spec(["NVIDIA_VISIBLE_DEVICES=1"], annotations={"cdi.k8s.io/x": "example.com/net=eth0"}), [1]),
])
def test_request_to_gpus(s, want):
    assert chosen(s)[0] == want


def test_the_uuid_spellings_differ_from_the_hosts():
    """The case rows above test something only if their text is not the host's UUID itself."""
    assert len({RTX.uuid, RTX_UPPER_HEX, RTX_LOWER_PREFIX, RTX_TYPO}) == 4
    assert RTX_UPPER_HEX.lower() == RTX_LOWER_PREFIX.lower() == RTX.uuid.lower() != RTX_TYPO.lower()
    assert chosen(spec([f"NVIDIA_VISIBLE_DEVICES={RTX_UPPER_HEX}"]))[1] == \
        f"named by NVIDIA_VISIBLE_DEVICES: {RTX_UPPER_HEX}"


@pytest.mark.parametrize("s, why", [
    (spec(["NVIDIA_VISIBLE_DEVICES=all"]), "all GPUs: NVIDIA_VISIBLE_DEVICES names all"),
    (spec(["NVIDIA_VISIBLE_DEVICES=void"]), "all GPUs: the request names none in particular"),
    (spec(["PATH=/bin"]), "all GPUs: the request names none in particular"),
    (spec(["NVIDIA_VISIBLE_DEVICES=0,5"]), "all GPUs: 5 (NVIDIA_VISIBLE_DEVICES) names no GPU known here"),
    (spec(["NVIDIA_VISIBLE_DEVICES=MIG-77ab"]), "all GPUs: MIG-77ab (NVIDIA_VISIBLE_DEVICES) names no GPU known here"),
    (spec(["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"]),
     "all GPUs: /var/run/nvidia-container-devices (NVIDIA_VISIBLE_DEVICES) names no GPU known here"),
    (spec(devices=["/dev/nvidia7"]), "all GPUs: 7 (device /dev/nvidia7) names no GPU known here"),
])
def test_unresolvable_or_unnamed_requests_fall_back_to_all_gpus_and_say_why(s, why):
    assert chosen(s) == ([0, 1], why)


def test_the_state_repeats_the_spec_annotations_once():
    ann = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
    assert chosen(spec(annotations=ann), state_annotations=dict(ann)) == (
        [0], "named by CDI annotation cdi.k8s.io/gpu: 0")


def test_hook_reads_the_request_from_a_lazily_parsed_spec(tmp_path):
    """The hook parses only process/root up front; the devices and CDI annotations are read on demand."""
    s = spec(["NVIDIA_VISIBLE_DEVICES=all"], devices=["/dev/nvidia2"],
             annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0", **{f"k{i}": "v" * 50 for i in range(2000)}},
             mounts=[{"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "type": "bind",
                      "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02"}])
    (tmp_path / "config.json").write_text(json.dumps(s))
    lazy = Request.from_spec(oci.load_spec(str(tmp_path), members=oci.HOOK_MEMBERS))
    full = Request.from_spec(s)
    assert lazy.gpu_names() == full.gpu_names() == [
        ("index", "0", "CDI annotation cdi.k8s.io/gpu"), ("minor", "2", "device /dev/nvidia2")]
    assert lazy.libcuda_mounts() == full.libcuda_mounts() == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]


@pytest.mark.parametrize("bad", [
    {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "linux": {"devices": "x"}, "annotations": [1]},
    {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "linux": {"devices": [None, {"path": 3}]},
     "annotations": {"cdi.k8s.io/gpu": 7}, "mounts": [None, {"destination": 1}, {"destination": "libcuda.so.1"}]},
])
def test_malformed_parts_count_as_absent(bad):
    r = Request.from_spec(bad)
    assert r.gpu_names() == [("index", "0", "NVIDIA_VISIBLE_DEVICES")] and r.libcuda_mounts() == []


def test_libcuda_mounts_takes_bind_mounts_of_libcuda_files_only():
    r = Request.from_spec(spec(mounts=[
        {"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "options": ["rbind", "ro"], "source": "/a"},
        {"destination": "/usr/lib64/libcuda.so.555.58.02", "type": "bind", "source": "/b"},
        {"destination": "/usr/lib/libcuda.so.1", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/usr/lib/libcudart.so.12", "type": "bind", "source": "/c"},
        {"destination": "relative/libcuda.so.1", "type": "bind", "source": "/d"}]))
    assert r.libcuda_mounts() == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.555.58.02"]


@pytest.mark.parametrize("name, want", [
    ("0", ("index", "0")), (" 3 ", ("index", "3")), ("all", ("all", "all")),
    ("GPU-5a1c", ("uuid", "GPU-5a1c")), ("gpu-5a1c", ("uuid", "gpu-5a1c")),
    ("MIG-GPU-5a1c/1/0", ("uuid", "GPU-5a1c")), ("MIG-77ab", ("mig", "MIG-77ab")),
    ("1:0", ("index", "1")), ("nvidia.com/gpu=GPU-5a1c", ("uuid", "GPU-5a1c")),
    ("nvidia.com/mig=MIG-77ab", ("mig", "MIG-77ab")), ("other.com/gpu=0", ("unknown", "other.com/gpu=0")),
    ("none-of-these", ("unknown", "none-of-these")), ("", ("unknown", "")),
])
def test_parse_gpu_name(name, want):
    assert parse_gpu_name(name) == want
