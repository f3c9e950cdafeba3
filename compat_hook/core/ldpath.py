"""``LD_LIBRARY_PATH`` rewriting for env mode (pure functions).

When compat is enabled the container-side compat dir goes first; every
other compat dir the image put on the path is removed, since a stale compat
path on a newer host is error 803 (many images set one). Non-compat
entries are never dropped, never duplicated, and keep their order.

>>> rewrite("/usr/local/nvidia/lib:/usr/local/cuda/compat", None)
'/usr/local/nvidia/lib'
>>> rewrite("/usr/local/nvidia/lib", "/usr/local/cuda-12.4/compat")
'/usr/local/cuda-12.4/compat:/usr/local/nvidia/lib'
>>> rewrite(None, "/usr/local/cuda-12.4/compat")
'/usr/local/cuda-12.4/compat'
>>> rewrite("/usr/local/cuda/compat", None) is None
True
>>> is_compat_entry("/usr/local/cuda-12.9/compat/lib.real"), is_compat_entry("/opt/conda/cuda-compat")
(True, True)
>>> is_compat_entry("/usr/local/cuda-12.4/compat-tools/lib")
False

In ldconfig mode the chosen compat dir may stay where the image put it:
``keep`` names entries that are never removed.

>>> rewrite("/usr/local/cuda-12.4/compat:/usr/local/cuda/compat:/opt/lib", None, keep=("/usr/local/cuda/compat",))
'/usr/local/cuda/compat:/opt/lib'
"""

from __future__ import annotations

from .fastos import path as posixpath  # no os import: ~1 ms of a container start (fastos)

__all__ = ["rewrite", "is_compat_entry", "rewrite_env"]


def is_compat_entry(entry: str, known=()) -> bool:
    """Whether an ``LD_LIBRARY_PATH`` entry points at a CUDA compat dir.

    ``known``: extra container paths that count (configured and resolved
    compat dirs, the host-store mount target).
    """
    if not entry:
        return False
    p = posixpath.normpath(entry)
    if p in known:
        return True
    parts = p.split("/")
    if "cuda-compat" in parts:  # conda's cuda-compat package: $PREFIX/cuda-compat
        return True
    # /usr/local/cuda[-X.Y]/compat[_orin][/lib.real|/lib]; not a sibling such as compat-tools
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if (part == "cuda" or part.startswith("cuda-")) and (nxt == "compat" or nxt.startswith("compat_")):
            return True
    return False


def rewrite(value: str | None, enable_dir: str | None, known=(), keep=()) -> str | None:
    """The new ``LD_LIBRARY_PATH`` value (``None``: leave the variable unset)."""
    entries = value.split(":") if value else []
    kept = [e for e in entries if e in keep or not is_compat_entry(e, known)]
    if enable_dir:
        kept.insert(0, enable_dir)
    elif value is not None and len(kept) == len(entries):
        return value  # nothing to remove: leave it byte for byte
    return ":".join(kept) if kept else None


def rewrite_env(env: list, enable_dir: str | None, known=(), keep=()) -> tuple:
    """Apply :func:`rewrite` to a spec's ``process.env`` list.

    Returns ``(new_env, changed)``. Every ``LD_LIBRARY_PATH=`` entry is
    rewritten (the last one is what the process sees); others are untouched.
    """
    out = []
    changed = False
    seen = False
    for item in env:
        if isinstance(item, str) and item.startswith("LD_LIBRARY_PATH="):
            seen = True
            old = item[len("LD_LIBRARY_PATH="):]
            new = rewrite(old, enable_dir, known, keep)
            if new is None:
                changed = True
                continue
            if new != old:
                changed = True
            out.append("LD_LIBRARY_PATH=" + new)
        else:
            out.append(item)
    if not seen and enable_dir:
        out.append("LD_LIBRARY_PATH=" + enable_dir)
        changed = True
    return out, changed
