"""The verdict of a pass (:func:`verdict`) over the assessed workloads:

* ``fail``: a workload that works on the node's driver now breaks on the target
  (a regression);
* ``warn``: no regression, but an outcome changes, a workload is broken now and
  after (reported, never held: the upgrade makes it no worse), or something
  could not be read or assessed;
* ``pass``: every workload keeps its outcome;
* ``unknown``: no target, or the node's driver is unknown.

>>> c = counts([{"now": {"outcome": "compat"}, "after": {"outcome": "broken"}, "regression": True},
...             {"now": {"outcome": "broken"}, "after": {"outcome": "broken"}}])
>>> (c["regressions"], c["broken_now_and_after"], verdict(c, target_known=True, report=True))
(1, 1, 'fail')
>>> verdict(counts([{"now": {"outcome": "broken"}, "after": {"outcome": "broken"}}]), target_known=True, report=True)
'warn'
"""

from __future__ import annotations

__all__ = ["MAX_STR", "regression", "counts", "verdict", "label_value"]

MAX_STR = 200


def _s(v, n: int = MAX_STR):
    if v is None:
        return None
    t = "".join(c if c.isprintable() else "?" for c in str(v))
    return t if len(t) <= n else t[:n] + "..."


def _outcome(r) -> str | None:
    return r.get("outcome") if isinstance(r, dict) else None


def regression(row: dict) -> bool:
    """The policy layer's ``regression`` of a row; where a row lacks it, the same rule: works now,
    broken after (the target differs from the driver now, or the row would not break)."""
    if "regression" in row:
        return bool(row["regression"])
    return _outcome(row.get("now")) not in (None, "broken") and _outcome(row.get("after")) == "broken"


def counts(rows: list) -> dict:
    """The counts a verdict is made of, over the workload rows of a plan report."""
    c = {"workloads": len(rows), "assessed": 0, "regressions": 0, "broken_now_and_after": 0, "changed": 0,
         "unreadable": 0, "unknown_workloads": 0}
    for r in rows:
        if r.get("unknown"):
            c["unknown_workloads"] += 1
            continue
        if r.get("now") is None or r.get("after") is None:
            c["unreadable"] += 1
            continue
        c["assessed"] += 1
        now, after = _outcome(r["now"]), _outcome(r["after"])
        if regression(r):
            c["regressions"] += 1
        elif now == "broken" and after == "broken":
            c["broken_now_and_after"] += 1
        if now != after:
            c["changed"] += 1
    return c


def verdict(c: dict, *, target_known: bool, report: bool, incomplete: bool = False) -> str:
    if not target_known or not report:
        return "unknown"
    if c["regressions"]:
        return "fail"
    if (c["changed"] or c["unreadable"] or c["unknown_workloads"] or c["broken_now_and_after"]
            or c.get("not_in_store") or incomplete):
        return "warn"
    return "pass"


def label_value(v) -> str | None:
    """``v`` as a label value (63 chars of [A-Za-z0-9._-], alphanumeric at both ends), else None.

    >>> label_value("550.163.01"), label_value("a b"), label_value(None)
    ('550.163.01', None, None)
    """
    if v is None:
        return None
    t = str(v)
    ok = 0 < len(t) <= 63 and t[0].isalnum() and t[-1].isalnum() and t.isascii() and \
        all(c.isalnum() or c in "._-" for c in t)
    return t if ok else None
