"""compat_hook.container: the request read from config.json."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from compat_hook.container import ENV_KEYS, Request, _pick_env


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
