"""The one bounded read: everything a reader gives, up to a limit, never more.

Every input compat-hook reads whole is attacker-sized: the OCI state on
stdin, a bundle's config.json, an image's manifest and config blobs. They all
go through :func:`read_all`, which stops one byte past the limit instead of
buffering whatever the other side sends.

>>> import io
>>> read_all(io.BytesIO(b"abcdef").read, 10, 4, lambda: ValueError("too big"))
b'abcdef'
>>> read_all(io.BytesIO(b"abcdef").read, 5, 4, lambda: ValueError("too big"))
Traceback (most recent call last):
    ...
ValueError: too big
"""

from __future__ import annotations

__all__ = ["read_all"]


def read_all(read, limit: int, step: int, too_big) -> bytes:
    """``read(step)`` until it returns nothing; more than ``limit`` bytes raises ``too_big()``.

    ``step``: how much to ask for at a time (a regular file's size + 1 reads
    it in one call and sees EOF in the next); ``too_big``: makes the caller's
    own named exception, with its own message.
    """
    chunks = []
    total = 0
    while True:
        b = read(step)
        if not b:
            break
        total += len(b)
        if total > limit:
            raise too_big()
        chunks.append(b)
    return b"".join(chunks)
