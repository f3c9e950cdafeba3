"""compat_hook.facts.container: the request read from config.json."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from compat_hook.facts.container import ENV_KEYS, Request, _pick_env


def naive(items):
    env = {}
    for item in items:
        if isinstance(item, str):
            k, sep, v = item.partition("=")
            if sep and k in ENV_KEYS:
                env[k] = v
    return env


keys = st.sampled_from(list(ENV_KEYS) + ["PATH", "NVIDIA_VISIBLE", "XNVIDIA_VISIBLE_DEVICES", ""])
values = st.text(alphabet=st.sampled_from("ab=\0\n :,/"), max_size=8)
entries = st.one_of(st.builds(lambda k, v: f"{k}={v}", keys, values), st.text(max_size=6),
                    st.integers(), st.none())


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(st.lists(entries, max_size=12))
def test_pick_env_equals_the_plain_loop(items):
    """The NUL-join fast path gives exactly what the obvious loop gives, NULs and junk included."""
    assert _pick_env(items) == naive(items)


def test_last_entry_wins_and_prefix_names_do_not_match():
    env = _pick_env(["NVIDIA_VISIBLE_DEVICES=0", "XNVIDIA_VISIBLE_DEVICES=9",
                     "NVIDIA_VISIBLE_DEVICES_X=8", "NVIDIA_VISIBLE_DEVICES=all"])
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all"}


def test_large_env_from_spec():
    spec = {"process": {"env": [f"V{i}=x" for i in range(4000)] + ["CUDA_VERSION=12.4.1",
                                                                   "NVIDIA_VISIBLE_DEVICES=all"]}}
    r = Request.from_spec(spec)
    assert r.gpu_requested and r.env == {"CUDA_VERSION": "12.4.1", "NVIDIA_VISIBLE_DEVICES": "all"}
    assert r.required_cuda() == ((12, 4, 0), "CUDA_VERSION")


# --- A large spec read lazily (the hook) gives the request a full parse gives ---

import json  # noqa: E402
import random  # noqa: E402

from compat_hook.core import jsonfast
from compat_hook.facts import oci  # noqa: E402
from tests.support.jsontext import encode  # noqa: E402

paths = st.sampled_from(["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvgpu", "/dev/nvidia",
                         "/dev/dri/card0", "/dev/null", "/mnt/dev/nvidia0", "/dev/nvidia12"])
ann_keys = st.sampled_from(["compat-hook/disable", "compat-hook/dry-run", "compat-hook/require-cuda",
                            "cdi.k8s.io/gpu", "cdi.k8s.io/other", "io.kubernetes.cri.container-type",
                            "compat-hook/other", "x"])
ann_values = st.sampled_from(["true", "1", "no", "nvidia.com/gpu=0", "vendor.com/x=1", "12.8", ""])
env_entries = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(list(ENV_KEYS) + ["PATH", "X"]),
                        st.sampled_from(["all", "void", "", "0,1", "12.4.1", "cuda>=12.8", "1", "/usr/lib\0x"]))
specs = st.fixed_dictionaries({
    "process": st.fixed_dictionaries({"env": st.lists(env_entries, max_size=6),
                                      "args": st.lists(env_entries, max_size=2)}),
    "root": st.just({"path": "rootfs"}),
    "mounts": st.lists(st.fixed_dictionaries({"destination": paths, "source": paths}), max_size=4),
    "linux": st.fixed_dictionaries({"devices": st.lists(st.fixed_dictionaries({"path": paths}), max_size=3)}),
    "annotations": st.dictionaries(ann_keys, ann_values, max_size=4),
})


def same(a: Request, b: Request) -> None:
    assert a.to_dict() == b.to_dict()
    assert (a.env, a.annotations) == (b.env, b.annotations)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(specs, st.integers(0, 1 << 30), st.booleans(), st.sampled_from([None, {"cdi.k8s.io/s": "nvidia.com/gpu=1"}]))
def test_lazy_spec_gives_the_request_a_full_parse_gives(spec, seed, indent, state_annotations):
    """Member order, escapes (\\uXXXX, \\/) and whitespace at random: the same request."""
    order = list(spec)
    random.Random(seed).shuffle(order)
    text = encode({k: spec[k] for k in order}, seed, indent=indent)
    full = Request.from_spec(json.loads(text), None, state_annotations)
    lazy = Request.from_spec(jsonfast.loads_object(text, oci.HOOK_MEMBERS, stop_early=True), None,
                             state_annotations)
    same(full, lazy)


def test_lazy_spec_reads_only_process_and_root_when_nothing_else_can_matter(tmp_path):
    spec = {"ociVersion": "1.0.2", "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "root": {"path": "r"},
            "mounts": [{"destination": f"/m/{i}", "source": "/s"} for i in range(100)],
            "annotations": {"io.kubernetes.cri.container-type": "container"}, "linux": {"devices": []}}
    (tmp_path / "config.json").write_text(json.dumps(spec, indent=2))
    doc = oci.load_spec(str(tmp_path), members=oci.HOOK_MEMBERS)
    r = Request.from_spec(doc)
    assert r.gpu_requested and r.annotations == {}
    assert doc._tail is not None  # mounts, annotations and linux were never scanned
    # An opt-out in the annotations is seen: the text holds "compat-hook/".
    spec["annotations"]["compat-hook/disable"] = "true"
    (tmp_path / "config.json").write_text(json.dumps(spec, indent=2))
    r = Request.from_spec(oci.load_spec(str(tmp_path), members=oci.HOOK_MEMBERS))
    assert r.disabled and r.disabled_reason == "annotation compat-hook/disable"
    # Without NVIDIA_VISIBLE_DEVICES the devices decide, written with \/ escapes here.
    spec["annotations"] = {}
    spec["process"]["env"] = []
    spec["linux"]["devices"] = [{"path": "/dev/nvidia0"}]
    (tmp_path / "config.json").write_text(json.dumps(spec).replace("/", "\\/"))
    r = Request.from_spec(oci.load_spec(str(tmp_path), members=oci.HOOK_MEMBERS))
    assert r.gpu_requested and r.gpu_reason == "device /dev/nvidia0"


def test_annotations_hold_compat_hooks_own_only():
    r = Request.from_spec({"annotations": {"compat-hook/dry-run": "true", "cdi.k8s.io/a": "nvidia.com/gpu=0",
                                           "other": "x", "compat-hookx": "y"}})
    assert r.annotations == {"compat-hook/dry-run": "true"}
    assert r.dry_run and r.gpu_requested and r.gpu_reason == "CDI annotation cdi.k8s.io/a"
