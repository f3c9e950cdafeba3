"""JSON for the hot path, through the C accelerator of the standard library.

``import json`` costs ~15 ms on the CI machine kind (hyperfine, 40 runs:
``python3 -I -c pass`` 17.7 ms vs ``-c 'import json'`` 33.3 ms), because
``json.decoder`` and ``json.encoder`` import ``re`` (and with it ``enum``,
``functools``, ``collections``). The whole hook budget is ~5 ms, so the hot
path drives the very same C scanner and encoder (``_json``) that ``json``
uses, without the Python wrappers. Behaviour matches ``json.loads`` /
``json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)``;
tests compare the two on random documents.

>>> loads('{"a": [1, 2.5, "x", null, true]}')
{'a': [1, 2.5, 'x', None, True]}
>>> dumps({"b": "\\u00e9", "n": None})
'{"b":"\\\\u00e9","n":null}'
>>> loads('{"a": 1,}')
Traceback (most recent call last):
    ...
ValueError: invalid JSON: Expecting property name enclosed in double quotes at offset 8
"""

from __future__ import annotations

__all__ = ["loads", "dumps"]

import gc as _gc  # builtin: free to import

try:
    import _json
except ImportError:  # pragma: no cover - every CPython has it
    _json = None

_WS = " \t\n\r"


def _no_constant(name: str):
    # json.loads accepts NaN/Infinity; strict JSON (and the OCI spec) does not.
    raise ValueError(f"non-standard constant {name}")


class _Context:
    # The attributes c_make_scanner reads from a json.JSONDecoder.
    __slots__ = ("strict", "object_hook", "object_pairs_hook", "parse_float",
                 "parse_int", "parse_constant", "memo")

    def __init__(self) -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = None
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = _no_constant
        self.memo = {}


_scanner = _json.make_scanner(_Context()) if _json is not None else None
_encoder = None


def loads(text):
    """Parse a JSON document (str or UTF-8 bytes); ``ValueError`` if invalid."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"invalid JSON: not UTF-8 ({e.reason})") from None
    if _scanner is None:  # pragma: no cover
        import json

        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"invalid JSON: {e.msg} at offset {e.pos}") from None
    if text.startswith("\ufeff"):
        raise ValueError("invalid JSON: unexpected UTF-8 BOM")
    n = len(text)
    i = 0
    while i < n and text[i] in _WS:
        i += 1
    # The scanner builds only acyclic lists/dicts, so the cyclic GC has
    # nothing to find while it runs; a 1 MB config.json otherwise triggers
    # dozens of collections (~15% of the parse, benchmarks/README.md).
    gc_on = _gc.isenabled()
    _gc.disable()
    try:
        try:
            obj, end = _scanner(text, i)
        except SystemError:
            # The C scanner builds its error from json.decoder.JSONDecodeError
            # but only looks it up in sys.modules (_PyImport_GetModule), so on
            # the first syntax error it has nothing to raise. Errors are the
            # slow path anyway: load json.decoder and scan again.
            import json.decoder  # noqa: F401

            obj, end = _scanner(text, i)
    except StopIteration as e:
        raise ValueError(f"invalid JSON: expecting value at offset {e.value}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deeply") from None
    except ValueError as e:
        # _json raises json.decoder.JSONDecodeError when json is loaded, else
        # a plain ValueError-compatible error built from (msg, doc, pos).
        msg = getattr(e, "msg", None)
        pos = getattr(e, "pos", None)
        if msg is None and len(e.args) == 3:
            msg, _, pos = e.args
        if msg is None:
            raise ValueError(f"invalid JSON: {e}") from None
        raise ValueError(f"invalid JSON: {msg} at offset {pos}") from None
    finally:
        if gc_on:
            _gc.enable()
    while end < n and text[end] in _WS:
        end += 1
    if end != n:
        raise ValueError(f"invalid JSON: extra data at offset {end}")
    return obj


def _default(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _floatstr(o: float) -> str:
    if o != o or o in (float("inf"), float("-inf")):
        raise ValueError("Out of range float values are not JSON compliant")
    return float.__repr__(o)


def dumps(obj, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """Serialise to compact ASCII JSON (one line unless ``indent`` is given)."""
    global _encoder
    if indent is not None or _json is None:
        import json

        return json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False)
    if sort_keys:
        enc = _json.make_encoder({}, _default, _json.encode_basestring_ascii, None,
                                 ":", ",", True, False, False)
    else:
        if _encoder is None:
            # Markers dict {} turns on circular-reference detection, as in json.
            _encoder = _json.make_encoder({}, _default, _json.encode_basestring_ascii,
                                          None, ":", ",", False, False, False)
        enc = _encoder
    # c_make_encoder(markers, default, encoder, indent, key_sep, item_sep,
    #                sort_keys, skipkeys, allow_nan); the float repr argument is
    # the one json.encoder passes (floatstr) in 3.11 via _make_iterencode only,
    # so NaN rejection is done by allow_nan=False here.
    return "".join(enc(obj, 0))
