"""compat_hook.core.versions: parsing, formatting, the branch table (docs/background.md "Branches and CUDA")."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from compat_hook.core.errors import InvalidVersion
from compat_hook.core.versions import (BRANCH_MAX_CUDA, branch_max_cuda, decode_cuda_driver_version,
                                  format_version, parse_version, try_parse_version)


@pytest.mark.parametrize("text, expected", [
    ("575.57.08", (575, 57, 8)),
    ("575.57.8", (575, 57, 8)),
    ("515.76", (515, 76, 0)),
    ("570.26", (570, 26, 0)),
    ("12", (12, 0, 0)),
    ("007.010.000", (7, 10, 0)),
    ("0", (0, 0, 0)),
    (" 550.54.15\n", (550, 54, 15)),
    ("999999999.1", (999999999, 1, 0)),
])
def test_parse(text, expected):
    assert parse_version(text) == expected


def test_numeric_not_lexicographic_order():
    assert parse_version("12.10") > parse_version("12.9")
    assert parse_version("575.57.08") == parse_version("575.57.8")
    assert parse_version("580.126.16") > parse_version("580.82.07")
    assert parse_version("99.55.66") < parse_version("222.88.99")
    assert parse_version("1.10") > parse_version("1.9.9")


@pytest.mark.parametrize("text", [
    "1.2.3.4", "", "   ", "\n", "abc", "1.a", "1..2", ".1", "1.", "-1.2", "1.-2", "+1.2",
    "５５０.1", "550.１", "1_000.2", "1 2", "0x10.1", "1e3", "12.4.1-1", "v12.4",
    "1234567890.1",  # longer than 9 digits: not a driver version
])
def test_invalid(text):
    with pytest.raises(InvalidVersion):
        parse_version(text)
    assert try_parse_version(text) is None


@pytest.mark.parametrize("value", [None, 12.4, 550, b"550.54.15", ["550"]])
def test_not_a_string(value):
    with pytest.raises(InvalidVersion):
        parse_version(value)
    assert try_parse_version(value) is None


def test_invalid_version_is_a_value_error():
    assert issubclass(InvalidVersion, ValueError)


@pytest.mark.parametrize("version, parts, text", [
    ((550, 54, 15), 0, "550.54.15"),
    ((12, 4, 0), 0, "12.4"),
    ((12, 0, 0), 0, "12.0"),
    ((12, 4, 0), 3, "12.4.0"),
    ((12, 4, 1), 2, "12.4"),
    ((575, 57, 8), 3, "575.57.8"),
    (None, 0, None),
])
def test_format(version, parts, text):
    assert format_version(version, parts) == text


@pytest.mark.parametrize("value, expected", [
    (9020, (9, 2, 0)), (12020, (12, 2, 0)), (12040, (12, 4, 0)), (12050, (12, 5, 0)),
    (12090, (12, 9, 0)), (13000, (13, 0, 0)), (13010, (13, 1, 0)), (12100, (12, 10, 0)),
    ("12080", (12, 8, 0)),
])
def test_decode_cuda_driver_version(value, expected):
    assert decode_cuda_driver_version(value) == expected


@pytest.mark.parametrize("value", [0, -1, -12040])
def test_decode_rejects_non_positive(value):
    with pytest.raises(InvalidVersion):
        decode_cuda_driver_version(value)


# The branch table (docs/background.md "Branches and CUDA").
DOC_BRANCHES = {
    525: (12, 0), 530: (12, 1), 535: (12, 2), 545: (12, 3), 550: (12, 4), 555: (12, 5), 560: (12, 6),
    565: (12, 7), 570: (12, 8), 575: (12, 9), 580: (13, 0), 590: (13, 1), 595: (13, 2), 610: (13, 3),
    615: (13, 4), 616: (13, 4),
}


@pytest.mark.parametrize("branch, cuda", sorted(DOC_BRANCHES.items()))
def test_branch_table_matches_the_doc(branch, cuda):
    assert branch_max_cuda(branch)[:2] == cuda
    assert BRANCH_MAX_CUDA[branch][:2] == cuda


def test_branch_table_is_monotonic():
    keys = sorted(BRANCH_MAX_CUDA)
    values = [BRANCH_MAX_CUDA[k] for k in keys]
    assert values == sorted(values)


@pytest.mark.parametrize("branch, cuda", [
    (536, (12, 2, 0)),   # unknown branch between two known: the lower one
    (600, (13, 2, 0)),
    (470, (11, 4, 0)),
    (400, None),          # older than every entry
    (617, None),          # newer than every entry: unknown, never guessed
    (620, None),
])
def test_branch_between_or_outside(branch, cuda):
    assert branch_max_cuda(branch) == cuda


def test_decoded_cuda_matches_branch_table():
    # Debian libcuda builds return these values from cuDriverGetVersion (docs/background.md "The ELF note").
    for branch, value in ((535, 12020), (550, 12040), (555, 12050)):
        assert decode_cuda_driver_version(value) == branch_max_cuda(branch)


parts = st.integers(min_value=0, max_value=999_999_999)
triples = st.tuples(parts, parts, parts)


@given(triples)
def test_format_parse_roundtrip(t):
    assert parse_version(format_version(t)) == t
    assert parse_version(format_version(t, 3)) == t


@given(triples, triples)
def test_order_is_tuple_order(a, b):
    pa, pb = parse_version(format_version(a)), parse_version(format_version(b))
    assert (pa < pb) == (a < b)
    assert (pa == pb) == (a == b)


@given(triples, st.integers(min_value=0, max_value=3))
def test_leading_zeros_do_not_matter(t, zeros):
    text = ".".join("0" * zeros + str(n) if len(str(n)) + zeros <= 9 else str(n) for n in t)
    assert parse_version(text) == t


# -- a driver version is shown as the driver spells it -------------------------------------

@pytest.mark.parametrize("text, parts, shown", [
    ("535.183.01", 3, "535.183.01"),
    ("535.183.01", 0, "535.183.01"),
    ("575.57.08", 2, "575.57"),
    ("12.4", 3, "12.4.0"),
    ("550.54.00", 0, "550.54"),
    ("550.54.00", 3, "550.54.00"),
    (" 535.183.01\n", 3, "535.183.01"),
])
def test_format_keeps_the_parsed_spelling(text, parts, shown):
    v = parse_version(text)
    assert format_version(v, parts) == shown
    assert v == parse_version(text.replace(".0", "."))  # still compares as numbers
    assert try_parse_version(text) == v and format_version(try_parse_version(text), parts) == shown


def test_a_parsed_version_is_still_a_plain_tuple_to_its_users():
    import copy
    import json
    import pickle

    v = parse_version("535.183.01")
    assert repr(v) == "(535, 183, 1)" and hash(v) == hash((535, 183, 1)) and v == (535, 183, 1)
    assert v[0] == 535 and v > (535, 183, 0) and json.dumps(v) == "[535, 183, 1]"
    for w in (copy.copy(v), copy.deepcopy(v), pickle.loads(pickle.dumps(v))):
        assert w == v and format_version(w, 3) == "535.183.01"
