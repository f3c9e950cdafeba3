r"""JSON from across a trust boundary, bounded before it is parsed: one answer, never an exception.

Node annotations, a probe's termination message, a ConfigMap's or a state file's data are written
by someone compat-hook does not trust (an agent on another node, a tenant's image). ``json.loads``
on such a text can raise more than ``ValueError``: a document nested a few thousand levels deep
(``[[[[...``) raises ``RecursionError`` in the C scanner, and one nested only a few hundred levels
passes the parser and then breaks the code that walks it (``str``, ``json.dumps``, ``copy``). So
:func:`parse` refuses, in this order and each with its reason code (:data:`REASONS`):

* ``not_text``: not a ``str`` (or ``bytes`` that are not UTF-8);
* ``too_large``: more than ``max_bytes`` (characters of a ``str``, bytes of ``bytes``);
* ``too_deep``: nesting deeper than ``max_depth``, found by a linear scan of the text's
  brackets outside its strings (:func:`depth`) before the parser sees it;
* ``not_json``: anything the parser refuses, ``NaN``/``Infinity`` included (not JSON; a float
  that is not finite breaks the clock arithmetic of whoever reads it), and any other exception
  it raises (an integer too long to convert, a ``RecursionError`` nevertheless);
* ``not_object``: :func:`parse_object` only, a valid document that is not a JSON object.

>>> parse('{"a": [1, {"b": null}]}')
({'a': [1, {'b': None}]}, None)
>>> parse("[" * 60000), parse('{"a": "[[[[["}', max_depth=1)
((None, 'too_deep'), ({'a': '[[[[['}, None))
>>> parse("x" * 10, max_bytes=4), parse(b"\xff"), parse(None), parse("NaN"), parse("{")
((None, 'too_large'), (None, 'not_text'), (None, 'not_text'), (None, 'not_json'), (None, 'not_json'))
>>> parse_object("[1]"), parse_object('{"v": 2}')
((None, 'not_object'), ({'v': 2}, None))
"""

from __future__ import annotations

import json
import re

__all__ = ["parse", "parse_object", "depth", "REASONS", "MAX_BYTES", "MAX_DEPTH"]

#: Every reason :func:`parse` and :func:`parse_object` can give.
REASONS = ("not_text", "too_large", "too_deep", "not_json", "not_object")
#: The defaults: 64 KiB (a Node annotation compat-hook writes is a few KiB) and 32 levels (its
#: documents are 4 deep at most).
MAX_BYTES = 64 << 10
MAX_DEPTH = 32

# The characters that matter to nesting: brackets, and the quote and backslash that say whether a
# bracket is inside a string. Everything else is skipped by the regex engine, not by a Python loop.
_SPECIAL = re.compile(r'[\[\]{}"\\]')


def depth(text: str, limit: int | None = None) -> int:
    r"""The deepest nesting of ``[``/``{`` outside strings in ``text`` (linear in its length); with
    ``limit``, the scan stops at the first level past it (the answer is then ``limit + 1``).

    >>> depth('{"a": [1, [2]], "b": "]]]{{{"}'), depth("[[[[", limit=2), depth('"\\\\"[')
    (3, 3, 1)
    """
    level = top = 0
    in_string = False
    escaped_at = -1
    for m in _SPECIAL.finditer(text):
        c, at = m.group(), m.start()
        if in_string:
            if at == escaped_at:
                continue  # the character after a backslash
            if c == "\\":
                escaped_at = at + 1
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif c in "[{":
            level += 1
            if level > top:
                top = level
                if limit is not None and top > limit:
                    return top
        elif c in "]}":
            level -= 1
    return top


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse(text, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> tuple:
    """``(value, None)`` or ``(None, reason)``: ``text`` parsed within the bounds (module docstring)."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > max_bytes:
            return None, "too_large"
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            return None, "not_text"
    if not isinstance(text, str):
        return None, "not_text"
    if len(text) > max_bytes:
        return None, "too_large"
    if depth(text, max_depth) > max_depth:
        return None, "too_deep"
    try:
        return json.loads(text, parse_constant=_no_constant), None
    except Exception:  # ValueError, an int past sys.get_int_max_str_digits, RecursionError: never raised on
        return None, "not_json"


def parse_object(text, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> tuple:
    """:func:`parse`, and the value must be a JSON object (``not_object`` otherwise)."""
    value, reason = parse(text, max_bytes=max_bytes, max_depth=max_depth)
    if reason is None and not isinstance(value, dict):
        return None, "not_object"
    return value, reason
