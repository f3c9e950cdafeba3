"""The real runtime behind the wrapper: which one the configuration names, and where it is.

Shared by the wrapper (:mod:`compat_hook.commands.runtime`) and by the
installers that check a registration will start (:mod:`compat_hook.install.checks`,
:mod:`compat_hook.install.nvidia_toolkit`).

>>> read_runtime_line("runtime: crun\\nmode: both\\n")
('crun', True)
>>> read_runtime_line("runtime: &a crun\\n")
('runc', False)
"""

from __future__ import annotations

import os

__all__ = ["SAFE_PATH", "RuntimeNotFound", "read_runtime_line", "resolve_runtime"]

#: Where a bare ``runtime:`` name is looked up (never the caller's PATH).
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class RuntimeNotFound(Exception):
    pass


# The quick `runtime:` reader: the same rules as the shell wrapper's (compat_hook/data/compat-hook-runtime.sh).

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+-")
_KEY = frozenset("abcdefghijklmnopqrstuvwxyz_")
_YAML_WORDS = frozenset(("y Y n N yes Yes YES no No NO true True TRUE false False FALSE on On ON "
                         "off Off OFF null Null NULL").split())
_BLANK = " \t"
_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_/")


def _other_value_ok(v: str) -> bool:
    t = v.strip(_BLANK)
    if t.startswith('"'):
        r = t[1:]
        return "\\" not in r and '"' in r
    if t.startswith("'"):
        r = t[1:]
        while "''" in r:
            i = r.index("''")
            r = r[:i] + r[i + 2:]
        return "'" in r
    if t.startswith(("[", "{")):
        if "#" in t or '"' in t or "'" in t:
            return False
        return t.endswith(("]", "}"))
    return not t.startswith(("&", "*", "!", "|", ">", "%", "@", "`"))


def _runtime_value(v: str):
    """The value of a ``runtime:`` line, or ``None`` (unsure)."""
    if v and v[0] not in _BLANK:
        return None
    if "#" in v:
        pre = v[:v.index("#")]
        if not pre.endswith((" ", "\t")):
            return None
        v = pre
    v = v.strip(_BLANK)
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        v = v[1:-1]
    elif v[:1] and v[0] in _FIRST:
        if v in _YAML_WORDS:
            return None
    else:
        return None
    if not v or not _SAFE.issuperset(v):
        return None
    if "/" in v and not v.startswith("/"):
        return None
    return v


def read_runtime_line(text: str) -> tuple:
    """``(runtime, sure)`` from config text, the way the shell wrapper reads it.

    ``sure`` is False when the file uses YAML the line reader cannot vouch
    for; ``runtime`` is then the default ``"runc"`` (the caller parses the
    file properly).
    """
    rt = "runc"
    # `read` splits on \n only; a trailing \r stays part of the line.
    for line in text.split("\n"):
        if line.startswith("runtime:"):
            v = _runtime_value(line[len("runtime:"):])
            if v is None:
                return "runc", False
            rt = v
            continue
        if line in ("", "---", "...", "-") or line.startswith(("#", " ", "\t", "- ")):
            continue
        key, colon, after = line.partition(":")
        if (colon and key and key[0] in _KEY and (after == "" or after[0] in _BLANK)):
            if not _KEY.issuperset(key):
                return "runc", False
            if not _other_value_ok(after):
                return "runc", False
            continue
        return "runc", False
    return rt, True


def resolve_runtime(name: str, path: str = SAFE_PATH) -> str:
    """The absolute path of the real runtime ``name``."""
    if name.startswith("/"):
        return name
    for d in path.split(":"):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise RuntimeNotFound(f"runtime {name!r} not found in {path}")
