"""compat_hook.jsonfast equals json.loads / json.dumps(separators=(",", ":"))."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from compat_hook import jsonfast

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

scalars = (st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text())
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=5)
                      | st.dictionaries(st.text(), kids, max_size=5), max_leaves=12)


def ref_dumps(obj, **kw):
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, **kw)


@settings(max_examples=100, deadline=None)
@given(values)
def test_dumps_equals_json(obj):
    assert jsonfast.dumps(obj) == ref_dumps(obj)
    assert jsonfast.dumps(obj, sort_keys=True) == ref_dumps(obj, sort_keys=True)


@settings(max_examples=100, deadline=None)
@given(values, st.sampled_from([None, 1, 2]))
def test_loads_equals_json(obj, indent):
    text = json.dumps(obj, indent=indent, ensure_ascii=bool(indent))
    assert jsonfast.loads(text) == json.loads(text)
    assert jsonfast.loads(text.encode("utf-8")) == json.loads(text)
    assert jsonfast.loads(jsonfast.dumps(obj)) == obj


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
    code = ("import sys\nsys.path.insert(0, %r)\nfrom compat_hook import jsonfast\n"
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
