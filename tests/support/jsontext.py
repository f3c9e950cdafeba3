"""JSON text with the escapes a writer may choose: the inputs raw-text searches must survive.

``json.dumps`` writes one spelling of a document; another writer may escape
any character as ``\\uXXXX`` and ``/`` as ``\\/`` (both valid JSON for the
same value). :func:`encode` writes a value with such escapes chosen at random,
so a test can check that a raw-text shortcut answers as a parse would.
"""

from __future__ import annotations

import json
import random

__all__ = ["encode"]


def _string(s: str, rnd: random.Random, escape_rate: float) -> str:
    out = ['"']
    for ch in s:
        r = rnd.random()
        if ch == "/" and r < escape_rate:
            out.append("\\/")
        elif r < escape_rate / 2 and ch not in '"\\':
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else json.dumps(ch)[1:-1])
        else:
            out.append(json.dumps(ch, ensure_ascii=False)[1:-1])
    out.append('"')
    return "".join(out)


def encode(value, seed: int = 0, *, escape_rate: float = 0.2, indent: bool = False) -> str:
    """``value`` as JSON text, some characters escaped at random (``seed``)."""
    rnd = random.Random(seed)
    ws = (lambda: rnd.choice(["", " ", "\n  ", "\t"])) if indent else (lambda: "")

    def enc(v) -> str:
        if isinstance(v, str):
            return _string(v, rnd, escape_rate)
        if isinstance(v, dict):
            return "{" + ",".join(f"{ws()}{_string(k, rnd, escape_rate)}{ws()}:{ws()}{enc(x)}"
                                  for k, x in v.items()) + ws() + "}"
        if isinstance(v, list):
            return "[" + ",".join(ws() + enc(x) for x in v) + ws() + "]"
        return json.dumps(v)

    return enc(value)
