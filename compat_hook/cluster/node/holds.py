"""What a hold is keyed by: the regressing *workloads*, not the pods that happen to run them now.

A StatefulSet pod being recreated, an evicted pod, a Job between two pods: for a few seconds the
node runs none of a regressing workload's pods. A pass in that gap that judged only the pods it
sees would lift the hold, and NVIDIA's upgrade controller moves a node past ``upgrade-required``
as soon as the skip label is gone (it cannot be held again there). So the agent keeps a record of
the regressing workloads (:func:`track`), and a workload recorded recently counts as present:

* a workload is its identity (:func:`identity`: image, the env and annotations that decide, the
  runtime; never a pod's name), hashed to a short id;
* a regressing workload that no pod runs any more is kept, with the time it was first missed
  (``gone``), until it has been absent for the *quiet time* (:func:`quiet_s`; by default twice the
  agent's interval and never less than :data:`MIN_QUIET_S`, the upgrade controller's requeue);
* the record is for one target driver: a new target starts a new one;
* while the agent's view of the pods is not current (a watch down) nobody's absence is counted;
* a pass without a target (the announcement unreadable, a typo in it) or an incomplete one carries
  the record over: it drops nothing and starts no absence (a workload it sees run is present);
  only complete passes on the record's target count a workload's absence and end it;
* the record travels in the Node's ``<prefix>/preflight`` annotation (``held``), so an agent that
  restarts reads the same clock, and ``cluster release`` (which removes that annotation) forgets it
  with the hold.

Pure functions: no clock, no I/O (``now`` is given).

>>> rec = track(None, target="470", regressing={"a1": "r/a:1"}, present=set(), now=100.0, quiet=30)
>>> rec.entries, rec.absent
({'a1': {'image': 'r/a:1', 'gone': None}}, [])
>>> rec = track(rec.doc(), target="470", regressing={}, present=set(), now=105.0, quiet=30)
>>> rec.entries["a1"]["gone"], [e["image"] for e in rec.absent], rec.next_expiry
(105, ['r/a:1'], 135)
>>> track(rec.doc(), target="470", regressing={}, present=set(), now=135.0, quiet=30).entries
{}
>>> track(rec.doc(), target="570", regressing={}, present=set(), now=106.0, quiet=30).entries
{}

A time of absence ahead of the clock (a clock set back) counts from now, not from that time:

>>> ahead = {"target": "470", "w": {"a1": ["r/a:1", 10**12]}}
>>> track(ahead, target="470", regressing={}, present=set(), now=200.0, quiet=30).entries["a1"]["gone"]
200

No target, or an incomplete pass: the record as it was, its clock included.

>>> kept = track(rec.doc(), target=None, regressing={}, present=set(), now=400.0, quiet=30)
>>> kept.target, kept.entries
('470', {'a1': {'image': 'r/a:1', 'gone': 105}})
>>> track(rec.doc(), target=None, regressing={}, present={"a1"}, now=400.0, quiet=30).entries  # seen running
{'a1': {'image': 'r/a:1', 'gone': None}}
>>> track(rec.doc(), target="470", regressing={}, present=set(), now=400.0, quiet=30, complete=False).entries
{'a1': {'image': 'r/a:1', 'gone': 105}}
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["identity", "workload_id", "track", "Record", "quiet_s", "MIN_QUIET_S", "MAX_ENTRIES"]

#: NVIDIA's upgrade controller re-checks a node about every 2 minutes (it does not watch pods): a
#: quiet time shorter than that could lift a hold between two of its reconciles unseen.
MIN_QUIET_S = 120.0
#: Workloads recorded at most (the annotation stays small); the present ones come first.
MAX_ENTRIES = 16
MAX_IMAGE = 160


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def identity(w: dict) -> list:
    """What a workload is, whichever pods run it: its image, the env and annotations that decide, and
    its runtime (never a pod's name: a Job's or a Deployment's pods come and go under new names)."""
    return [w.get("image"), list(w.get("env") or []), sorted((w.get("annotations") or {}).items()), w.get("runtime")]


def workload_id(w: dict) -> str:
    """A short stable id of :func:`identity`.

    >>> a = {"image": "r/a:1", "env": ["A=1"], "annotations": {}, "runtime": "toolkit", "name": "x (ml/p-1 c)"}
    >>> workload_id(a) == workload_id(dict(a, name="x (ml/p-2 c)")) != workload_id(dict(a, env=[]))
    True
    """
    return hashlib.sha256(json.dumps(identity(w)).encode()).hexdigest()[:12]


def quiet_s(configured, interval: float) -> float:
    """How long a regressing workload must be absent before its hold can lift: ``configured``
    (``cluster.hold_quiet_s``) when set, else twice the agent's interval, never less than
    :data:`MIN_QUIET_S`.

    >>> quiet_s(None, 300), quiet_s(None, 10), quiet_s(8, 300)
    (600.0, 120.0, 8.0)
    """
    if configured is not None:
        return float(configured)
    return max(2.0 * float(interval), MIN_QUIET_S)


class Record:
    """The regressing workloads of one target: ``entries`` (id -> ``{"image", "gone"}``, ``gone`` None
    while a pod runs it), ``absent`` (the entries held though absent), ``next_expiry`` (when the
    first of them stops counting; None: none)."""

    __slots__ = ("target", "entries", "_expiry")

    def __init__(self, target, entries: dict, quiet: float = MIN_QUIET_S) -> None:
        self.target, self.entries = target, entries
        self._expiry = self.expiry(quiet)

    @property
    def absent(self) -> list:
        return [e for e in self.entries.values() if e["gone"] is not None]

    def expiry(self, quiet: float):
        gone = [e["gone"] for e in self.entries.values() if e["gone"] is not None]
        return min(gone) + quiet if gone else None

    @property
    def next_expiry(self):
        return self._expiry

    def doc(self) -> dict | None:
        """The record as it goes into the Node's annotation (None: nothing recorded)."""
        if not self.entries:
            return None
        return {"target": self.target, "w": {k: [e["image"], e["gone"]] for k, e in sorted(self.entries.items())}}


def _entries(doc, target) -> dict:
    """The well-formed entries of a recorded ``doc`` for ``target`` (another target's: none)."""
    doc = _map(doc)
    if doc.get("target") != target:
        return {}
    out = {}
    for k, v in list(_map(doc.get("w")).items())[:MAX_ENTRIES]:
        if not (isinstance(k, str) and 0 < len(k) <= 16 and isinstance(v, list) and len(v) == 2):
            continue
        image, gone = v
        if not isinstance(image, str) or len(image) > MAX_IMAGE:
            continue
        if gone is not None and (isinstance(gone, bool) or not isinstance(gone, (int, float))):
            continue
        out[k] = {"image": image, "gone": gone}
    return out


def track(previous, *, target, regressing: dict, present: set, now: float, quiet: float,
          judged: set = frozenset(), current: bool = True, complete: bool = True) -> Record:
    """The record after this pass.

    ``previous``: the record last published (:meth:`Record.doc`, from the Node or this process);
    ``regressing``: id -> image of the workloads this pass found regressing on ``target``;
    ``present``: the ids of every workload a pod runs now; ``judged``: those of them this pass
    assessed (a regression or not); ``current``: whether the view of the pods is current (when not,
    no absence is started or ended and nothing is dropped); ``complete``: whether the pass read
    everything (when not, nothing is dropped and no absence starts or ends). With ``target`` None
    the record is carried over under its own target.
    """
    if target is None:
        # No target to judge on (the announcement unreadable, a typo): not a new target either. The
        # record goes on under its own, as after an incomplete pass (what this one found is keyed to
        # no target: left out).
        target, regressing, complete = _map(previous).get("target"), {}, False
        if target is None:
            return Record(None, {}, quiet)
    old = _entries(previous, target)
    new: dict = {}
    for k, image in regressing.items():
        new[k] = {"image": str(image)[:MAX_IMAGE], "gone": None}
    for k, e in old.items():
        if k in new:
            continue
        if current and complete and k in judged:
            continue  # a pod runs it and this complete pass judged it again: no regression now
        if k in present:
            new[k] = {"image": e["image"], "gone": None}  # a pod runs it, not judged now: it still counts
            continue
        if not current or not complete:
            new[k] = dict(e)  # absence cannot be told (or this pass cannot end it): as it was
            continue
        # A recorded time ahead of this pass's clock (a clock set back, a record written by a skewed
        # agent) starts the absence now: else the hold would wait for that moment, however far away.
        gone = e["gone"] if e["gone"] is not None and e["gone"] <= now else int(now)
        if now - gone >= quiet:
            continue  # absent for the quiet time: it stops counting
        new[k] = {"image": e["image"], "gone": gone}
    # bounded: the present ones first, then the most recently missed
    ordered = sorted(new.items(), key=lambda kv: (kv[1]["gone"] is not None, -(kv[1]["gone"] or 0), kv[0]))
    return Record(target, dict(ordered[:MAX_ENTRIES]), quiet)

