"""compat_hook.core.jsonfast equals json.loads / json.dumps(separators=(",", ":"))."""

from __future__ import annotations

import json
import random
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from compat_hook.core import jsonfast

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

scalars = (st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text())
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=5)
                      | st.dictionaries(st.text(), kids, max_size=5), max_leaves=12)


def ref_dumps(obj, **kw):
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, **kw)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(values)
def test_dumps_equals_json(obj):
    assert jsonfast.dumps(obj) == ref_dumps(obj)
    assert jsonfast.dumps(obj, sort_keys=True) == ref_dumps(obj, sort_keys=True)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(values, st.sampled_from([None, 1, 2]))
def test_loads_equals_json(obj, indent):
    text = json.dumps(obj, indent=indent, ensure_ascii=bool(indent))
    assert jsonfast.loads(text) == json.loads(text)
    assert jsonfast.loads(text.encode("utf-8")) == json.loads(text)
    assert jsonfast.loads(jsonfast.dumps(obj)) == obj


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(values, st.sampled_from(["", " ", "\n", "\t\r\n "]))
def test_surrounding_whitespace(obj, ws):
    text = ws + json.dumps(obj) + ws
    assert jsonfast.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", [
    "", " ", "{", "[1,]", '{"a": 1,}', "{'a': 1}", "01", "1 2", '{"a" 1}', "[1] x", "tru", "nul",
    '"unterminated', '"bad \\x escape"', '"\x01 control char"', "\ufeff{}", "+1", ".5", "[", "]",
])
def test_invalid_is_value_error(text):
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(ValueError) as e:
        jsonfast.loads(text)
    assert str(e.value).startswith("invalid JSON")


def test_bom_rejected_even_if_json_would_complain_differently():
    with pytest.raises(ValueError, match="BOM"):
        jsonfast.loads("\ufeff{}")


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "[NaN]", '{"a": Infinity}'])
def test_nan_rejected_on_load(text):
    assert json.loads(text) is not None  # the standard library accepts them
    with pytest.raises(ValueError):
        jsonfast.loads(text)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), [1, {"x": float("nan")}]])
def test_nan_rejected_on_dump(value):
    with pytest.raises(ValueError):
        jsonfast.dumps(value)


def test_not_utf8_bytes():
    with pytest.raises(ValueError, match="not UTF-8"):
        jsonfast.loads(b'{"a": "\xff"}')


def test_unserialisable_is_type_error():
    with pytest.raises(TypeError):
        jsonfast.dumps({"a": object()})
    with pytest.raises(TypeError):
        jsonfast.dumps({1j: 1})


def test_circular_reference_detected():
    a = []
    a.append(a)
    with pytest.raises(ValueError):
        jsonfast.dumps(a)


def test_deep_nesting_is_value_error():
    with pytest.raises(ValueError):
        jsonfast.loads("[" * 100000 + "]" * 100000)


def test_indent_uses_json():
    obj = {"b": [1, 2], "a": None}
    assert jsonfast.dumps(obj, indent=2) == json.dumps(obj, indent=2)
    assert jsonfast.dumps(obj, indent=2, sort_keys=True) == json.dumps(obj, indent=2, sort_keys=True)


def test_non_ascii_escaped():
    assert jsonfast.dumps({"é": "\u2028\U0001f600"}) == '{"\\u00e9":"\\u2028\\ud83d\\ude00"}'


def test_first_error_without_json_loaded():
    # The C scanner needs json.decoder to build its error; jsonfast loads it
    # on the first syntax error. Checked in a fresh interpreter that never
    # imported json.
    code = ("import sys\nsys.path.insert(0, %r)\nfrom compat_hook.core import jsonfast\n"
            "assert 'json' not in sys.modules and 're' not in sys.modules\n"
            "assert jsonfast.loads('{\"a\":[1,2.5,null]}') == {'a': [1, 2.5, None]}\n"
            "assert 'json' not in sys.modules\n"
            "assert jsonfast.dumps({'a': [1, True]}) == '{\"a\":[1,true]}'\n"
            "assert 'json' not in sys.modules\n"
            "for bad in ('{\"a\": 1,}', '[1,', 'NaN'):\n"
            "    try:\n        jsonfast.loads(bad)\n    except ValueError as e:\n        print(type(e).__name__, e)\n"
            "    else:\n        raise SystemExit('accepted ' + bad)\n") % REPO
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("ValueError ") for line in lines), out.stdout


# --- loads_object / LazyObject: parse some members, search the rest as text ---

from tests.support.jsontext import encode  # noqa: E402

names = st.sampled_from(["process", "root", "mounts", "annotations", "linux", "a", "é/x", 'q"', ""])
words = st.text(alphabet=st.sampled_from('ab/-.\\"\n\0é\u2028 '), max_size=6)
docs = st.dictionaries(names, st.recursive(
    st.none() | st.booleans() | st.integers() | words,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(words, kids, max_size=4), max_leaves=10),
    max_size=6)


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings_in(v)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(docs, st.lists(names, max_size=3), st.booleans(), st.integers(0, 1 << 30), st.booleans(), words)
def test_lazy_object_answers_as_loads(doc, eager, stop_early, seed, indent, needle):
    """Every member reads as json.loads reads it; may_contain is never False for a hit.

    The text comes with random ``\\uXXXX`` and ``\\/`` escapes, so a raw-text
    search that ignored them would miss.
    """
    text = encode(doc, seed, indent=indent)
    assert json.loads(text) == doc
    full = json.loads(text)
    lazy = jsonfast.loads_object(text, eager, stop_early=stop_early)
    for key in ["process", "root", "mounts", "annotations", "linux", "a", "é/x", 'q"', "", "zz"]:
        hit = any(needle in s for s in strings_in(full.get(key)))
        if hit:
            assert lazy.may_contain(key, needle), (key, needle, text)
    for key in ["zz", *doc]:
        assert lazy.get(key, "<absent>") == full.get(key, "<absent>"), (key, text)
        assert (key in lazy) == (key in full)
    assert lazy.to_dict() == full
    assert sorted(lazy.keys()) == sorted(full)


plain = st.text(alphabet=st.sampled_from("ab/-.é :"), max_size=6)  # nothing JSON escapes


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.dictionaries(names, st.recursive(plain, lambda k: st.lists(k, max_size=3)
                                           | st.dictionaries(plain, k, max_size=3), max_leaves=8),
                       max_size=5), st.booleans())
def test_stop_early_leaves_the_tail_unparsed(tail, indent):
    """After process and root, a tail without escapes and without the needle is never scanned."""
    tail = {k: v for k, v in tail.items() if k not in ("process", "root")}
    doc = {"process": {"env": ["A=1"]}, "root": {"path": "r"}, **tail}
    text = encode(doc, 0, escape_rate=0.0, indent=indent)
    lazy = jsonfast.loads_object(text, ("process", "root"), stop_early=True)
    assert lazy.get("process") == {"env": ["A=1"]} and lazy.get("root") == {"path": "r"}
    assert lazy.get("never-a-name") is None
    for key in ("mounts", "annotations", "linux", "zz"):
        assert not lazy.may_contain(key, "nowhere")
    assert lazy._tail is not None  # nothing above needed the tail scanned
    for key, value in tail.items():
        assert lazy.get(key) == value
    assert lazy._tail is None or not tail


def test_stop_early_does_not_see_a_repeated_name_after_the_stop():
    text = '{"process": 1, "root": 2, "process": 3, "mounts": [4]}'
    assert jsonfast.loads_object(text, ("process",)).get("process") == 3
    lazy = jsonfast.loads_object(text, ("process", "root"), stop_early=True)
    assert lazy.get("process") == 1  # documented: the first one, not looked for again
    assert lazy.get("mounts") == [4]  # a name not seen yet: the tail is scanned
    assert lazy.get("process") == 3  # ...and then the last one wins, as in loads


def test_stop_early_tail_error_shows_when_the_tail_is_read():
    text = '{"process": 1, "root": 2, "mounts": [1,], "x": 1}'
    lazy = jsonfast.loads_object(text, ("process", "root"), stop_early=True)
    assert lazy.get("process") == 1
    with pytest.raises(ValueError) as e:
        lazy.get("mounts")
    with pytest.raises(ValueError) as ref:
        jsonfast.loads(text)
    assert str(e.value) == str(ref.value)


@pytest.mark.parametrize("text", [
    "", " ", "{", '{"a": 1,}', "{'a': 1}", '{"a" 1}', '{"a": 1} x', '{"a": tru}', "\ufeff{}",
    '{"a": NaN}', '{"a": "\\x"}', '{"a": [1,]}', '{"a": 1 "b": 2}', '{,}', '{"a": 1,,"b": 2}',
])
@pytest.mark.parametrize("stop_early", [False, True])
def test_lazy_object_errors_are_those_of_loads(text, stop_early):
    with pytest.raises(ValueError) as ref:
        jsonfast.loads(text)
    with pytest.raises(ValueError) as e:
        jsonfast.loads_object(text, ("a",), stop_early=stop_early).to_dict()  # reads it all
    assert str(e.value) == str(ref.value)


@pytest.mark.parametrize("text", ["[]", "1", '"x"', "null", " [1, 2] "])
def test_lazy_object_not_an_object_is_type_error(text):
    with pytest.raises(TypeError):
        jsonfast.loads_object(text)


def test_lazy_object_non_string_name_is_absent():
    lazy = jsonfast.loads_object('{"a": 1, "b": 2}', ("a",), stop_early=True)
    assert lazy.get(["a"], "d") == "d" and lazy.get(None) is None and lazy.get(1) is None


def test_skipped_members_are_not_kept():
    # The point of skipping: a skipped member's objects are freed as it is
    # scanned, so they never pile up. Checked through the allocator's block
    # count, not time.
    big = json.dumps({"process": {"env": ["A=1"]}, "root": {"path": "r"},
                      "mounts": [{"destination": f"/m/{i}", "options": ["ro", "bind"]} for i in range(5000)]})
    before = sys.getallocatedblocks()
    lazy = jsonfast.loads_object(big, ("process", "root"))
    kept = sys.getallocatedblocks() - before
    assert kept < 1000, kept  # parsed whole, the mounts alone are >35000 blocks
    assert len(lazy.get("mounts")) == 5000
    assert sys.getallocatedblocks() - before > 20000


BIG_MOUNTS = [{"destination": f"/m/{i}", "source": f"/s/{i}", "options": ["ro", "bind"]} for i in range(6000)]
BIG_MOUNTS_JSON = json.dumps(BIG_MOUNTS)
SENTINEL = 918273645.25  # a number: written the same whatever the escapes


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(docs, st.integers(0, 1 << 30), st.booleans(), st.integers(0, 3), words)
def test_large_document_decoded_as_far_as_needed_answers_as_loads(doc, seed, indent, pad_shift, needle):
    """Bytes of >= 256 KiB: a head is decoded; the tail is searched as UTF-8 bytes.

    The padding of two-byte characters after root makes the head's end fall
    inside a character (pad_shift moves it), and puts non-ASCII text before
    the tail, so the tail's byte offset differs from its string index.
    """
    rnd = random.Random(seed)
    doc = {"process": {"env": ["é=1", "A=2"]}, "root": {"path": "r"},
           "pad": "é" * (33000 + pad_shift), **doc, "mounts": SENTINEL}
    order = list(doc)
    rnd.shuffle(order)
    if seed % 2:  # the usual order half the time: process and root first
        order = ["process", "root"] + [k for k in order if k not in ("process", "root")]
    doc = {k: doc[k] for k in order}
    # The mounts are spliced in as written once: encoding them each time is slow.
    data = encode(doc, seed, escape_rate=0.01, indent=indent).replace(json.dumps(SENTINEL), BIG_MOUNTS_JSON)
    data = data.encode("utf-8")
    assert len(data) >= 256 << 10
    full = json.loads(data)
    assert full["mounts"] == BIG_MOUNTS
    lazy = jsonfast.loads_object(data, ("process", "root"), stop_early=True)
    for key in ["process", "root", "mounts", "annotations", "linux", "a", "é/x", 'q"', "", "pad", "zz"]:
        if any(needle in s for s in strings_in(full.get(key))):
            assert lazy.may_contain(key, needle), (key, needle)
    for key in ["process", "root", "zz", *full]:
        assert lazy.get(key, "<absent>") == full.get(key, "<absent>"), key
    assert lazy.to_dict() == full


def test_large_document_head_only_when_the_order_allows():
    doc = {"ociVersion": "1", "process": {"env": ["A=é"]}, "root": {"path": "r"}, "mounts": BIG_MOUNTS,
           "annotations": {"compat-hook/disable": "true"}}
    data = json.dumps(doc, ensure_ascii=False).encode()
    lazy = jsonfast.loads_object(data, ("process", "root"), stop_early=True)
    assert lazy._data is not None and len(lazy._text) < len(data) // 2  # a head only
    assert lazy.may_contain("annotations", "compat-hook/")
    assert not lazy.may_contain("annotations", "cdi.k8s.io/")
    assert lazy.get("annotations") == {"compat-hook/disable": "true"}
    assert lazy._data is None and lazy.get("mounts") == BIG_MOUNTS
    # Non-ASCII in the head: the tail starts at a byte offset past its string
    # index; a search from the index would see the head's "compat-hook/".
    doc["process"]["env"].append("Z=" + "é" * 2000 + "cdi.k8s.io/")
    doc["root"]["path"] = "é" * 100
    lazy = jsonfast.loads_object(json.dumps(doc, ensure_ascii=False).encode(), ("process", "root"),
                                 stop_early=True)
    assert lazy._data is not None
    assert lazy.may_contain("process", "cdi.k8s.io/") and not lazy.may_contain("annotations", "cdi.k8s.io/")
    # root after mounts: no head, the whole document is decoded.
    doc2 = {"process": doc["process"], "mounts": BIG_MOUNTS, "root": {"path": "r"}}
    lazy = jsonfast.loads_object(json.dumps(doc2).encode(), ("process", "root"), stop_early=True)
    assert lazy._data is None and lazy.get("root") == {"path": "r"}


def test_large_document_invalid_utf8_in_the_tail_shows_when_read():
    data = json.dumps({"process": {}, "root": {}, "mounts": BIG_MOUNTS}).encode()
    data = data.replace(b'"/m/5999"', b'"/m/\xff999"')
    lazy = jsonfast.loads_object(data, ("process", "root"), stop_early=True)
    assert lazy.get("root") == {}
    with pytest.raises(ValueError, match="not UTF-8"):
        lazy.to_dict()
