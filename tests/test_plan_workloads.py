"""The plan's workloads (the cluster agent's pods, not images): each container's request is the image's
env overlaid by its own env, with its pod's annotations, and its outcome is that of the runtime it runs
through (compat-hook's, or the NVIDIA toolkit's alone).

The images are real OCI layouts made with umoci (tests/support/planimages.py): Debian's real libcuda
550 with NVIDIA's note added in ``/usr/local/cuda-12.4/compat`` (``CUDA_VERSION=12.4.1``,
``NVIDIA_VISIBLE_DEVICES=all`` in the image config), a plain image, and the compat image with a pip
CUDA 12.8 runtime wheel. The host is a fake R535 node with an H100 (and a V100 where the GPUs count).
"""

from __future__ import annotations

import functools
import json
import pathlib
import subprocess

import pytest

from compat_hook.core.config import from_mapping
from compat_hook.images.sources import open_source
from compat_hook.policy import preflight
from tests.conftest import elf
from tests.support.planimages import H100, images, layout  # noqa: F401  (the module-scoped images fixture)
from tests.support.toolkit import noted_compat_lib
from tests.support.trees import write_fake_host
from tests.support.versions import COMPAT_550, HOST_535

REPO = pathlib.Path(__file__).resolve().parent.parent
SITE = "usr/local/lib/python3.11/site-packages"
TARGET = "580.95.05"
LD_COMPAT = "LD_LIBRARY_PATH=/usr/local/cuda/compat"


@pytest.fixture(scope="module")
def wheel128(images) -> str:
    """The compat 550 image with ``nvidia-cuda-runtime-cu12`` 12.8 installed by pip."""
    work = images["work"]
    noted = noted_compat_lib(images["libs"][COMPAT_550], work / "noted-wheel")
    lay = layout(work, "wheel128", noted, extra_files={
        f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12": elf(soname="libcudart.so.12"),
        f"{SITE}/nvidia_cuda_runtime_cu12-12.8.90.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: nvidia-cuda-runtime-cu12\nVersion: 12.8.90\n"})
    return f"oci:{lay}:v1"


@pytest.fixture
def node(tmp_path):
    """A config reading a fake R535 host with an H100 (index 0) and a V100 (index 1)."""
    host = write_fake_host(tmp_path / "host", version=HOST_535,
                           gpus={"0000:17:00.0": H100, "0000:65:00.0": "Tesla V100-SXM2-16GB"})
    return from_mapping({"log_file": None, "nvml": "off", "host_root": str(host)})


class Counting:
    """An opener that counts how often each source is opened."""

    def __init__(self) -> None:
        self.opened: dict = {}

    def __call__(self, src, config):
        self.opened[src] = self.opened.get(src, 0) + 1
        return open_source(src, config)


def _plan(cfg, workloads, driver=TARGET, opener=None):
    opener = opener or Counting()
    return preflight.plan(cfg, [], driver=driver, workloads=workloads, opener=opener,
                          expander=functools.partial(list)), opener


def wl(source, name, runtime, env=(), annotations=None, **kw) -> dict:
    return dict({"source": source, "name": name, "env": list(env), "annotations": annotations or {},
                 "runtime": runtime, "unknown": None}, **kw)


def test_pod_ld_library_path_breaks_on_the_toolkit_runtime_not_through_compat_hook(images, node):
    """The pod spec's LD_LIBRARY_PATH names the compat dir: fine on R535 (compat 550 is newer), 803 on
    R580 for a pod the toolkit alone serves; compat-hook's wrapper takes it off on R580."""
    src = images["compat"]["oci"]
    r, opener = _plan(node, [wl(src, "ml/train-0 trainer", "toolkit", [LD_COMPAT]),
                             wl(src, "ml/train-1 trainer", "compat-hook", [LD_COMPAT]),
                             wl(src, "ml/train-2 trainer", "toolkit")])
    tk, ch, plain_env = r["images"]
    assert (tk["workload"], tk["runtime"], tk["name"], tk["image"]) == (True, "toolkit", "ml/train-0 trainer", src)
    assert tk["now"]["outcome"] == "compat"
    assert (tk["after"]["outcome"], tk["after"]["error"]) == ("broken", 803)
    assert tk["regression"] is True and tk["after"] == tk["toolkit_only_after"]
    # through compat-hook: the host driver on R580 (CUDA 13.0) serves the 12.4 image
    assert ch["after"]["outcome"] == "host" and ch["regression"] is False
    assert ch["after"] == ch["compat_hook_after"] and ch["toolkit_only_after"]["error"] == 803
    # the image's env alone (no LD_LIBRARY_PATH) on the toolkit runtime: its rule refuses compat 550 on 580
    assert plain_env["after"]["outcome"] == "host" and plain_env["regression"] is False
    assert r["summary"]["regressions"] == 1 and r["summary"]["broken_after"] == 1
    assert r["summary"]["fixed_by_compat_hook"] == 1  # train-1: broken under the toolkit alone, not through us
    # one image, three workloads: opened once
    assert opener.opened == {src: 1}
    assert preflight.gate(r, "regression") == (3, None)


@pytest.mark.parametrize("switch", [{"annotations": {"compat-hook/disable": "true"}},
                                    {"env": [LD_COMPAT, "COMPAT_HOOK_DISABLE=1"]}])
def test_the_opt_out_switches_leave_the_pod_to_the_toolkit(images, node, switch):
    src = images["compat"]["oci"]
    w = wl(src, "ml/opted-out", "compat-hook", [LD_COMPAT])
    w.update(switch)
    r, _ = _plan(node, [w])
    [row] = r["images"]
    # compat-hook stays out: on R535 the compat driver the pod names still works, on R580 it is 803
    assert row["now"]["outcome"] == "compat" and row["now"]["reason"] == "compat_newer_supported"
    assert (row["after"]["outcome"], row["after"]["error"]) == ("broken", 803)
    assert row["regression"] is True


@pytest.mark.parametrize("visible, broken", [(None, True), ("0", False), ("1", True)])
def test_the_pods_visible_devices_select_the_gpus_the_target_must_drive(images, node, visible, broken):
    """On R590 the V100 (index 1) has no driver: a pod given all GPUs (the image's NVIDIA_VISIBLE_DEVICES=all)
    or the V100 gets error 100; the pod's own NVIDIA_VISIBLE_DEVICES=0 overrides the image's all."""
    env = [f"NVIDIA_VISIBLE_DEVICES={visible}"] if visible else []
    r, _ = _plan(node, [wl(images["plain"]["oci"], "ml/infer", "compat-hook", env)], driver="590.44.01")
    [row] = r["images"]
    assert (row["after"]["outcome"] == "broken") is broken, row["after"]
    assert (row["after"].get("error") == 100) is broken
    assert row["regression"] is broken


def test_a_cuda_12_8_wheel_over_compat_550_is_compat_minor(wheel128, node):
    """Issue 27's case on a real image: compat 550 (CUDA 12.4) serving a pip CUDA 12.8 runtime on R535."""
    r, _ = _plan(node, [wl(wheel128, "ml/wheel", "compat-hook")], driver=HOST_535)
    [row] = r["images"]
    assert row["needs_cuda"] == "12.8" and row["needs_source"].startswith("wheel ")
    assert row["now"] == {"outcome": "compat-minor", "reason": "compat_newer_supported", "cuda": "12.4",
                          "error": 222}
    assert preflight.gate(r, "broken") == (0, None)


def test_plan_cli_on_the_wheel_image_passes_fail_on_broken(wheel128, tmp_path):
    host = write_fake_host(tmp_path / "host", version=HOST_535, gpus=[H100])
    conf = tmp_path / "c.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {host}\n")
    out = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "plan", wheel128, "--driver", HOST_535,
                          "--config", str(conf), "--json", "--fail-on", "broken"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["images"][0]["now"]["outcome"] == "compat-minor"


def test_unknown_and_unreadable_workloads_are_rows_without_an_outcome(images, node, tmp_path):
    src = images["plain"]["oci"]
    r, opener = _plan(node, [
        wl(src, "ml/a", "compat-hook", unknown="env LD_LIBRARY_PATH: valueFrom configMapKeyRef ml/cfg not found"),
        wl(src, "ml/b", "runc"),
        wl(None, "ml/c", "toolkit"),
        wl(f"oci:{tmp_path / 'gone'}:v1", "ml/d", "toolkit"),
        wl(src, "ml/e", "toolkit"),
    ])
    a, b, c, d, e = r["images"]
    assert a["unknown"] == "env LD_LIBRARY_PATH: valueFrom configMapKeyRef ml/cfg not found"
    assert a["now"] is None and a["after"] is None and a["regression"] is False
    assert "runtime 'runc'" in b["unknown"] and "no image source" in c["unknown"]
    assert d["error"] and d["now"] is None and d["workload"] is True and d["name"] == "ml/d"
    assert e["now"]["outcome"] == "host-minor"  # the others still assessed
    s = r["summary"]
    assert (s["images"], s["read"], s["unreadable"], s["unknown_workloads"]) == (5, 1, 1, 3)
    status, why = preflight.gate(r, None)
    assert status == 4 and "3 workload(s) not assessed" in why and "1 of 5 source(s) unreadable" in why
    assert opener.opened == {src: 1, f"oci:{tmp_path / 'gone'}:v1": 1}


def test_the_text_report_names_workloads_their_runtime_and_regressions(images, node):
    from compat_hook.commands.plan import render_text

    src = images["compat"]["oci"]
    r, _ = _plan(node, [wl(src, "ml/train-0", "toolkit", [LD_COMPAT]),
                        wl(src, "ml/train-1", "compat-hook", unknown="envFrom secret ml/s not readable")])
    lines = render_text(r).splitlines()
    assert lines[1].split()[:4] == ["ml/train-0", "[toolkit]", "12.4", "compat"], lines
    assert lines[2].split()[:3] == ["ml/train-1", "[compat-hook]", "-"] and "unknown" in lines[2]
    assert "unknown: ml/train-1 [compat-hook]: envFrom secret ml/s not readable" in lines
    assert "regression: ml/train-0 [toolkit]: compat 12.4 now, broken (803) after (compat_not_newer)" in lines
    assert "1 unreadable" not in lines[-1] and ", 1 not assessed;" in lines[-1]
