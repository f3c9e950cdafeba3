"""JSON for the hot path, through the C accelerator of the standard library.

``import json`` costs ~15 ms on the CI machine kind (hyperfine, 40 runs:
``python3 -I -c pass`` 17.7 ms vs ``-c 'import json'`` 33.3 ms), because
``json.decoder`` and ``json.encoder`` import ``re`` (and with it ``enum``,
``functools``, ``collections``). The hook's whole budget is ~5 ms over the
interpreter's start (docs/design.md, "Hot path rules"), so the hot path drives the very same C scanner and encoder (``_json``) that ``json``
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

__all__ = ["loads", "loads_object", "LazyObject", "dumps"]

import _codecs  # builtin: free to import
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


def _make_skipper():
    # The same C scanner, so the same grammar and errors, but every object is
    # handed to ``len`` as a list of pairs and dropped at once: what a skipped
    # member allocates is freed while it is scanned and reused for the next
    # object, instead of growing the heap. Fresh heap pages are what a large
    # document costs in a short-lived process (~3 us per page fault on the CI
    # machine kind: a 1 MB config.json parsed whole is ~4 MB of objects).
    ctx = _Context()
    ctx.object_pairs_hook = len
    return _json.make_scanner(ctx)


_skipper = _make_skipper() if _json is not None else None


def _decode(text):
    if isinstance(text, (bytes, bytearray)):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"invalid JSON: not UTF-8 ({e.reason})") from None
    return text


def loads(text):
    """Parse a JSON document (str or UTF-8 bytes); ``ValueError`` if invalid."""
    text = _decode(text)
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


#: What JSON's short escapes decode to; no other character of a string's
#: value can come from an escape except through ``\u`` or ``\/``.
_SHORT_ESCAPED = frozenset('"\\\b\f\n\r\t')


def _raw_may_hold(text: str, start: int, end: int, needle: str, content: str | None = None) -> bool:
    """Whether a string inside ``text[start:end]`` could hold ``needle`` (``False`` only when sure).

    A string's raw text is its value but for escapes. Without ``\\u`` or
    ``\\/`` in the range, every escape decodes to one of ``_SHORT_ESCAPED``;
    a needle with none of those can then only occur verbatim in the raw text.
    ``content`` is the part of ``needle`` inside a string when that is not
    all of it (a name: ``"name"``).
    """
    if not needle or not _SHORT_ESCAPED.isdisjoint(needle if content is None else content):
        return True
    find = text.find
    if isinstance(text, str):
        bs, bsu, bss = "\\", "\\u", "\\/"
    else:  # the UTF-8 bytes of a document's tail (loads_object)
        needle, bs, bsu, bss = needle.encode("utf-8"), b"\\", b"\\u", b"\\/"
    if find(needle, start, end) >= 0:
        return True
    b = find(bs, start, end)  # one character: memchr, ~20x faster than a word
    return b >= 0 and (find(bsu, b, end) >= 0 or find(bss, b, end) >= 0)


class LazyObject:
    """A JSON object document whose members are parsed only when asked for.

    Made by :func:`loads_object`. The members named ``eager`` are parsed at
    once; the others are scanned (validated, not kept) and their place noted,
    so :meth:`get` parses one on first use. Duplicate names behave as in
    :func:`loads`: the last one wins.

    With ``stop_early``, scanning stops after the last ``eager`` member: the
    rest of the document (the *tail*) is searched as raw text by
    :meth:`may_contain`, and by :meth:`get` for a name not seen before the
    stop, and parsed only if a search cannot rule the name or needle out.
    The caller vouches for the tail: the document was parsed before (a
    runtime runs the hook only after it has parsed config.json itself), so
    an error there goes unseen unless the tail is read, and a name seen
    before the stop is not looked for again in it. (A repeated name is not
    worth ~0.5 ms a search: runc's Go decoder merges repeated members, which
    no last-one-wins parser reproduces anyway.)

    >>> doc = loads_object('{"a": 1, "b": {"c": [2, "/dev/x"]}, "a": 3}', eager=("a",))
    >>> doc.may_contain("b", "/dev/x"), doc.may_contain("b", "/dev/y")
    (True, False)
    >>> doc.get("a"), doc.get("b"), doc.get("z", "none")
    (3, {'c': [2, '/dev/x']}, 'none')
    """

    __slots__ = ("_text", "_values", "_spans", "_tail", "_data", "_tail_b")

    def __init__(self, text: str, values: dict | None = None) -> None:
        self._text = text
        self._values = {} if values is None else values
        self._spans: dict = {}  # name -> (start, end) of its value in the text
        self._tail: int | None = None  # where the unscanned rest starts in the text
        # Set when only a head of the document was decoded: its UTF-8 bytes,
        # and where the tail starts in them.
        self._data: bytes | None = None
        self._tail_b = 0

    def _tail_may_hold(self, needle: str, content: str | None = None) -> bool:
        if self._tail is None:
            return False
        if self._data is not None:
            return _raw_may_hold(self._data, self._tail_b, len(self._data), needle, content)
        return _raw_may_hold(self._text, self._tail, len(self._text), needle, content)

    def __contains__(self, key) -> bool:
        return self.get(key, _ABSENT) is not _ABSENT

    def keys(self) -> list:
        self._finish()
        return [*self._spans] if self._spans else [*self._values]

    def get(self, key, default=None):
        """The member's value (parsed now if it was skipped), else ``default``."""
        if not isinstance(key, str):
            return default
        if key not in self._spans and self._tail_may_name(key):
            self._finish()  # a name the tail may hold: scan it
        try:
            return self._values[key]
        except KeyError:
            pass
        span = self._spans.get(key)
        if span is None:
            return default
        with _NoGC():
            # Cannot fail: the skipper has scanned this very span.
            value, _ = _scanner(self._text, span[0])
        self._values[key] = value
        return value

    def _tail_may_name(self, key: str) -> bool:
        # A name's raw text is the name itself unless an escape is in it.
        return self._tail is not None and self._tail_may_hold('"' + key + '"', key)

    def may_contain(self, key, needle: str) -> bool:
        """Whether the member's strings could hold ``needle`` (``False`` only when sure).

        The member's text, and the unscanned tail, are searched as raw text
        (:func:`_raw_may_hold`). ``"\\0"`` asks whether any string may hold
        a NUL (only ``\\u0000`` can make one).
        """
        span = self._spans.get(key)
        if span is not None:  # seen: its text, not the tail's (see the class)
            return _raw_may_hold(self._text, span[0], span[1], needle)
        if key in self._values:  # from loads: no text positions
            return True
        return self._tail_may_hold(needle)

    def to_dict(self) -> dict:
        """Every member, parsed: what :func:`loads` returns (member order aside)."""
        for key in self.keys():
            self.get(key)
        return dict(self._values)

    def _finish(self) -> None:
        if self._tail is None:
            return
        if self._data is not None:
            # Only a head was decoded: decode it all (the head is its prefix,
            # so every position found so far stays right).
            self._text, self._data = _decode(self._data), None
        with _NoGC():
            ok = self._walk(self._tail, False, frozenset(), False)
        if not ok:
            loads(self._text)  # raises the error loads gives for this document
            raise ValueError("invalid JSON")  # pragma: no cover - loads raised

    def _walk(self, i: int, first: bool, eager: frozenset, stop_early: bool) -> bool:
        """Scan members from ``i`` (just after ``{`` when ``first``, else after a value).

        ``False`` on anything unusual, for :func:`loads` to judge.
        """
        text, values, spans = self._text, self._values, self._spans
        scanstring, n = _json.scanstring, len(text)
        pending = set(eager) if stop_early and eager else None
        self._tail = None
        try:
            while text[i] in _WS:
                i += 1
            if first and text[i] == "}":
                i += 1
            else:
                while True:
                    if not first:
                        c = text[i]
                        if c == "}":
                            i += 1
                            break
                        if c != ",":
                            return False
                        i += 1
                        while text[i] in _WS:
                            i += 1
                    first = False
                    if text[i] != '"':
                        return False
                    key, i = scanstring(text, i + 1, True)
                    while text[i] in _WS:
                        i += 1
                    if text[i] != ":":
                        return False
                    i += 1
                    while text[i] in _WS:
                        i += 1
                    start = i
                    if key in eager:
                        values[key], i = _scanner(text, i)
                    else:
                        _, i = _skipper(text, i)
                        values.pop(key, None)
                    spans[key] = (start, i)
                    while i < n and text[i] in _WS:
                        i += 1
                    if pending is not None:
                        pending.discard(key)
                        if not pending:
                            self._tail = i
                            return True
        except (IndexError, ValueError, StopIteration, RecursionError, SystemError):
            return False
        while i < n and text[i] in _WS:
            i += 1
        return i == n


_ABSENT = object()


class _NoGC:
    # The scanner builds only acyclic lists and dicts: nothing for the cyclic
    # GC to find while it runs (a 1 MB document otherwise triggers dozens of
    # collections, ~15% of the parse).
    __slots__ = ("on",)

    def __enter__(self):
        self.on = _gc.isenabled()
        _gc.disable()

    def __exit__(self, *exc):
        if self.on:
            _gc.enable()


def loads_object(text, eager=(), *, stop_early: bool = False) -> LazyObject:
    """Parse a JSON document that must be an object, the ``eager`` members only.

    ``ValueError`` exactly as :func:`loads` for an invalid document (in the
    part scanned, see :class:`LazyObject`); a valid document that is not an
    object raises ``TypeError``.

    Why: the hook reads 2 of a config.json's members (process, root) and
    looks for a few words in the rest; a 1 MB spec (thousands of mounts)
    parsed whole costs the hook ~7 ms more (benchmarks/README.md).
    """
    if stop_early and eager and isinstance(text, bytes) and len(text) >= _HEAD_MIN and _scanner is not None:
        doc = _head_only(text, eager)
        if doc is not None:
            return doc
    text = _decode(text)
    if _scanner is None:  # pragma: no cover
        return _whole(text)
    doc = LazyObject(text)
    i = 0
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    if i < n and text[i] == "{":
        with _NoGC():
            if doc._walk(i + 1, True, frozenset(eager), stop_early):
                return doc
    # Anything unusual (not an object, a syntax error, a BOM): the whole
    # parser decides, so errors and results are exactly those of loads.
    return _whole(text)


def _whole(text: str) -> LazyObject:
    obj = loads(text)
    if not isinstance(obj, dict):
        raise TypeError("not a JSON object")
    return LazyObject(text, obj)


#: Below this, a document is decoded whole: a head saves nothing worth a search.
_HEAD_MIN = 256 << 10
#: Decoded past the first place every eager name occurs: a whole config.json
#: ``root`` member, for one, is a few hundred bytes.
_HEAD_SLACK = 64 << 10


def _head_only(data: bytes, eager) -> LazyObject | None:
    """Decode and scan only a head of ``data`` holding every ``eager`` member, or ``None``.

    Why: a new 1 MB string costs the hook ~1 ms (fresh pages: ~3 us a page
    fault on the CI machine kind, and as much to free them at exit), and a
    config.json's process and root come first in every writer's order (Go's
    field order). The head ends ``_HEAD_SLACK`` past the first place where
    every eager name occurs as raw text; if the scan does not find them all
    inside it (another order, a name inside a string first), ``None``: the
    caller decodes the whole document.
    """
    cut = 0
    for name in eager:
        at = data.find(b'"' + name.encode("utf-8") + b'"')
        if at < 0:
            return None
        cut = max(cut, at)
    cut += _HEAD_SLACK
    if cut >= len(data):
        return None
    try:
        # final=False: a character cut in two at the end is left out.
        text, _ = _codecs.utf_8_decode(memoryview(data)[:cut], "strict", False)
    except UnicodeDecodeError:
        return None
    n = len(text)
    i = 0
    while i < n and text[i] in _WS:
        i += 1
    if i >= n or text[i] != "{":
        return None
    doc = LazyObject(text)
    with _NoGC():
        if not doc._walk(i + 1, True, frozenset(eager), True) or doc._tail is None:
            return None
    t = doc._tail
    doc._data = data
    doc._tail_b = t if text.isascii() else len(text[:t].encode("utf-8"))
    return doc


def _default(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


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
