"""Waits with jitter: retries after failures, and the delay before a pass that a change asked for.

Every agent of a fleet sees the same ClusterPolicy write and the same API
outage at the same moment; without jitter they would all come back at once.
So every wait here is random within its bounds:

* :class:`Backoff`: exponential (``base * 2**n``) with "equal jitter" (a
  uniform draw in the upper half, so a wait never collapses to zero), capped
  at ``cap``; a server's ``Retry-After`` (429, 503) is a floor, itself capped
  at :data:`MAX_RETRY_AFTER`. A success resets it.
* :func:`jittered`: ``seconds`` spread by +/- ``spread`` (the period between passes).
* :func:`herd_delay`: the wait before a pass a cluster-wide change started
  (a ClusterPolicy or NVIDIADriver write reaches every node's agent at once).

>>> import random
>>> b = Backoff(base=1.0, cap=60.0, rng=random.Random(7))
>>> waits = [b.next() for _ in range(8)]
>>> all(min(60, 2 ** n) / 2 <= w <= min(60, 2 ** n) for n, w in enumerate(waits))
True
>>> b.next(retry_after=90.0) >= 90.0, b.failures
(True, 9)
>>> b.reset(); b.failures
0
>>> 270 <= jittered(300.0, 0.1, random.Random(1)) <= 330
True
>>> 0.0 <= herd_delay(300.0, random.Random(2)) <= 30.0, herd_delay(1.0, random.Random(2)) <= 0.1
(True, True)
"""

from __future__ import annotations

import random as _random

__all__ = ["Backoff", "jittered", "herd_delay", "MAX_RETRY_AFTER"]

#: A server's Retry-After is honoured up to this many seconds.
MAX_RETRY_AFTER = 600.0
#: The widest spread of the passes a cluster-wide change starts (seconds): a thousand agents writing
#: three objects each come to about 100 requests a second.
HERD_WINDOW = 30.0


class Backoff:
    """Exponential backoff with jitter (see the module docstring); ``failures`` counts since the last reset."""

    __slots__ = ("base", "cap", "failures", "_rng")

    def __init__(self, base: float = 1.0, cap: float = 300.0, rng=None) -> None:
        self.base, self.cap, self.failures = float(base), float(cap), 0
        self._rng = rng or _random.Random()

    def next(self, retry_after: float | None = None) -> float:
        """The wait before the next try, counting one more failure."""
        ceiling = min(self.cap, self.base * (2.0 ** min(self.failures, 30)))
        self.failures += 1
        wait = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after is not None and retry_after > 0:
            wait = max(wait, min(float(retry_after), MAX_RETRY_AFTER))
        return wait

    def reset(self) -> None:
        self.failures = 0


def jittered(seconds: float, spread: float = 0.1, rng=None) -> float:
    """``seconds`` +/- ``spread`` (a fraction), drawn uniformly."""
    r = rng or _random
    return seconds * (1.0 + r.uniform(-spread, spread))


def herd_delay(interval: float, rng=None) -> float:
    """The wait before a pass a cluster-wide change asked for: uniform in
    ``[0, min(HERD_WINDOW, interval / 10)]`` (short intervals, as in a test, stay short)."""
    r = rng or _random
    return r.uniform(0, min(HERD_WINDOW, interval / 10.0))
