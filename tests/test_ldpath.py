"""compat_hook.core.ldpath: LD_LIBRARY_PATH rewriting (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from compat_hook.core.ldpath import is_compat_entry, rewrite, rewrite_env

ENABLE = "/usr/local/cuda-12.9/compat"


@pytest.mark.parametrize("entry, compat", [
    ("/usr/local/cuda/compat", True), ("/usr/local/cuda-12.9/compat", True),
    ("/usr/local/cuda-12.9/compat/lib.real", True), ("/usr/local/cuda/compat/lib", True),
    ("/usr/local/cuda/compat_orin", True), ("/usr/local/cuda//compat/", True),
    ("/usr/local/cuda/./compat", True), ("/opt/cuda/compat", True),
    ("/usr/local/nvidia/lib", False), ("/usr/local/nvidia/lib64", False), ("/usr/local/cuda/lib64", False),
    ("/usr/local/cuda", False), ("/compat", False), ("", False), ("/usr/local/cudax/compat", False),
    ("/usr/lib/x86_64-linux-gnu", False),
])
def test_is_compat_entry(entry, compat):
    assert is_compat_entry(entry) is compat


def test_known_dirs_count():
    assert is_compat_entry("/opt/mycompat", known={"/opt/mycompat"})
    assert is_compat_entry("/opt/mycompat/", known={"/opt/mycompat"})
    assert not is_compat_entry("/opt/mycompat")


@pytest.mark.parametrize("value, enable, expected", [
    ("/usr/local/nvidia/lib:/usr/local/cuda/compat", None, "/usr/local/nvidia/lib"),
    ("/usr/local/nvidia/lib", ENABLE, f"{ENABLE}:/usr/local/nvidia/lib"),
    (None, ENABLE, ENABLE),
    ("", ENABLE, ENABLE),
    ("/usr/local/cuda/compat", None, None),
    (None, None, None),
    ("", None, ""),
    ("/a::/b:", None, "/a::/b:"),          # nothing to remove: byte for byte
    ("/a::/usr/local/cuda/compat:/b", None, "/a::/b"),
    (f"/a:{ENABLE}:/usr/local/cuda/compat/lib.real", ENABLE, f"{ENABLE}:/a"),
    (f"{ENABLE}:/a", ENABLE, f"{ENABLE}:/a"),
])
def test_rewrite(value, enable, expected):
    assert rewrite(value, enable) == expected


def test_rewrite_env():
    env = ["PATH=/bin", "LD_LIBRARY_PATH=/usr/local/cuda/compat:/x", "A=1"]
    assert rewrite_env(env, ENABLE) == (["PATH=/bin", f"LD_LIBRARY_PATH={ENABLE}:/x", "A=1"], True)
    assert rewrite_env(env, None) == (["PATH=/bin", "LD_LIBRARY_PATH=/x", "A=1"], True)
    assert rewrite_env(["PATH=/bin"], None) == (["PATH=/bin"], False)
    assert rewrite_env(["PATH=/bin"], ENABLE) == (["PATH=/bin", f"LD_LIBRARY_PATH={ENABLE}"], True)
    assert rewrite_env(["LD_LIBRARY_PATH=/usr/local/cuda/compat"], None) == ([], True)
    assert rewrite_env(["LD_LIBRARY_PATH=/x"], None) == (["LD_LIBRARY_PATH=/x"], False)
    # every entry is rewritten (the last one is what the process sees); non-strings kept
    env = ["LD_LIBRARY_PATH=/usr/local/cuda/compat", 5, "LD_LIBRARY_PATH=/y:/usr/local/cuda-12.4/compat"]
    assert rewrite_env(env, ENABLE) == ([f"LD_LIBRARY_PATH={ENABLE}", 5, f"LD_LIBRARY_PATH={ENABLE}:/y"], True)
    assert rewrite_env([f"LD_LIBRARY_PATH={ENABLE}:/y"], ENABLE) == ([f"LD_LIBRARY_PATH={ENABLE}:/y"], False)
    # a variable that only starts with the name is not it
    assert rewrite_env(["LD_LIBRARY_PATHX=/usr/local/cuda/compat"], None) == \
        (["LD_LIBRARY_PATHX=/usr/local/cuda/compat"], False)


# -- properties -------------------------------------------------------------------------
#
# Entries are non-empty here; the empty-entry edge cases are in test_rewrite above.

plain = (st.sampled_from(["/usr/local/nvidia/lib", "/usr/local/nvidia/lib64", "/opt/lib", "/usr/lib",
                          "relative/lib", "/usr/local/cuda/lib64", ".", "/usr/local/cuda"])
         | st.text(alphabet="/abcxyz0123456789._-", min_size=1, max_size=12))
compat = st.sampled_from(["/usr/local/cuda/compat", "/usr/local/cuda-12.4/compat", "/usr/local/cuda-12.9/compat/lib.real",
                          "/usr/local/cuda/compat_orin", "/usr/local/cuda//compat/", "/known/store", ENABLE])
entries = st.lists(plain | compat, max_size=10)
enable = st.sampled_from([None, ENABLE, "/usr/local/cuda/compat", "/known/store"])
KNOWN = {"/known/store"}


def split(value):
    return value.split(":") if value else []


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(entries, enable)
def test_rewrite_properties(parts, enable_dir):
    value = ":".join(parts) if parts else None
    out = rewrite(value, enable_dir, KNOWN)
    new = split(out)
    non_compat = [p for p in parts if not is_compat_entry(p, KNOWN)]
    if enable_dir:
        assert new[0] == enable_dir
        rest = new[1:]
    elif len(non_compat) == len(parts):
        assert out == value  # nothing to remove: untouched
        rest = new
    else:
        rest = new
    # never drops a non-compat entry, keeps the order of the rest ...
    assert rest == non_compat
    # ... and never duplicates the compat dir (no other compat entry survives)
    assert not any(is_compat_entry(p, KNOWN) for p in rest)
    assert rewrite(out, enable_dir, KNOWN) == out  # idempotent


env_items = st.sampled_from(["PATH=/bin", "A=1", "LD_LIBRARY_PATHX=/usr/local/cuda/compat", "LD_LIBRARY_PATH="]) | \
    entries.map(lambda p: "LD_LIBRARY_PATH=" + ":".join(p))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(env_items, max_size=5), enable)
def test_rewrite_env_properties(env, enable_dir):
    new, changed = rewrite_env(env, enable_dir, KNOWN)
    is_ld = lambda e: e.startswith("LD_LIBRARY_PATH=")  # noqa: E731
    assert [e for e in new if not is_ld(e)] == [e for e in env if not is_ld(e)]
    assert changed == (new != env)
    old_lds = [e for e in env if is_ld(e)]
    lds = [e for e in new if is_ld(e)]
    expected = []
    for e in old_lds:
        r = rewrite(e[len("LD_LIBRARY_PATH="):], enable_dir, KNOWN)
        if r is not None:
            expected.append("LD_LIBRARY_PATH=" + r)
    if enable_dir and not old_lds:
        expected = ["LD_LIBRARY_PATH=" + enable_dir]
    assert lds == expected
    if enable_dir:
        assert lds and all(split(e[len("LD_LIBRARY_PATH="):])[0] == enable_dir for e in lds)
