"""``compat-hook report``: what the hook and the wrapper decided, per host driver version.

Reads the JSON-lines decision log (one line per run, :mod:`compat_hook.core.logjson`)
as a stream - a 1 GB log costs time, not memory - and splits it into
*periods*: consecutive runs of records with the same host driver version, so
the time before and after a driver upgrade shows as two periods. Records that
name no driver (a start that failed before reading it, one that needed none)
are one period of their own, listed last (``driver`` null): they neither count
in nor split the driver periods around them. Per period:
the starts by decision and reason (hook and wrapper records counted apart),
by image and by pod where the log names them (``image``, ``namespace``,
``pod``), the failures (``decision: error``) and the warnings.

Times are compared as logjson writes them (UTC, ``...T..:..:...mmmZ``); a
record whose ``time`` is not one is counted (``bad_time``) and, under
``since``, left out (``excluded_no_time``, and a note): it cannot be shown to
be recent. A failure record names the container (``container_id``,
``bundle``) where the hook got that far; Docker and ``ctr`` put no image in
the OCI spec, so their records name none (``no_image`` counts them).

Damaged input is skipped and counted, never fatal: a line that is not a JSON
object, not UTF-8, or longer than :data:`MAX_LINE`, and the unreadable tail
of a truncated ``.gz``. A log file given is read with its logrotate siblings
(``FILE.1``, ``FILE.2.gz``, ..., oldest first) unless ``rotated=False``.
Tables keep at most :data:`MAX_KEYS` images / pods / warnings per period (the
rest is counted as ``(others)``) and the last :data:`MAX_FAILURES` failures,
so memory stays bounded whatever the log holds.

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "log")
>>> with open(p, "w") as f:
...     _ = f.write('{"time":"2026-01-01T00:00:00.000Z","event":"hook","decision":"enable",'
...                 '"reason":"compat_major_newer","host_driver_version":"535.104.05"}\\nnot json\\n')
>>> r = report([p])
>>> r["records"], r["bad_lines"], r["periods"][0]["driver"], r["periods"][0]["decisions"][0]["count"]
(1, 1, '535.104.05', 1)
"""

from __future__ import annotations

import os

from ..core.errors import UsageError

__all__ = ["report", "render_text", "exit_status", "parse_since", "valid_time", "log_files", "MAX_LINE",
           "MAX_KEYS"]

#: A longer line is not one compat-hook wrote (its records are < 64 KiB).
MAX_LINE = 1 << 20
#: Distinct images / pods / warnings kept per period.
MAX_KEYS = 200
#: Failures kept (the last ones) per period.
MAX_FAILURES = 20
#: Driver periods kept; a log that flips between drivers more often than
#: this (merged logs of several nodes?) gets the rest summed in the last one.
MAX_PERIODS = 100
_OTHERS = "(others)"
_SEVERAL = "(several)"


def parse_since(text: str, now: float | None = None) -> str:
    """``--since``: ISO 8601 (``2026-12-02T15:00:00Z``, a date, an offset) or ``30m``/``2h``/``3d``/``45s``
    ago; returns the log's time format (UTC, ``...T..:..:...mmmZ``).

    >>> parse_since("2h", now=7200.0), parse_since("2026-12-02T16:00:00+01:00")
    ('1970-01-01T00:00:00.000Z', '2026-12-02T15:00:00.000Z')
    >>> parse_since("yesterday")
    Traceback (most recent call last):
        ...
    compat_hook.core.errors.UsageError: --since 'yesterday': not an ISO time (2026-12-02T15:00:00Z) nor an age (30m, 2h, 3d)
    """
    import time as _time

    t = (text or "").strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if len(t) >= 2 and t[-1] in units and t[:-1].replace(".", "", 1).isdigit():
        at = (now if now is not None else _time.time()) - float(t[:-1]) * units[t[-1]]
        return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"
    from datetime import datetime, timezone

    try:
        dt = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    except ValueError:
        raise UsageError(f"--since {text!r}: not an ISO time (2026-12-02T15:00:00Z) nor an age (30m, 2h, 3d)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    dt = dt.astimezone(timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{dt.microsecond // 1000:03d}Z"


def valid_time(t) -> bool:
    """Whether ``t`` is a time as logjson writes it (``2026-12-02T15:00:00.000Z``, UTC, ms).

    Only such strings compare in time order (``--since`` compares them as text).

    >>> valid_time("2026-12-02T15:00:00.000Z"), valid_time("zz"), valid_time("2026-12-02 15:00:00"), valid_time(5)
    (True, False, False, False)
    """
    if not isinstance(t, str) or len(t) != 24 or t[23] != "Z":
        return False
    for i, c in enumerate(t[:23]):
        want = {4: "-", 7: "-", 10: "T", 13: ":", 16: ":", 19: "."}.get(i)
        if (c != want) if want else not ("0" <= c <= "9"):
            return False
    return "01" <= t[5:7] <= "12" and "01" <= t[8:10] <= "31" and t[11:13] <= "23" and t[14:16] <= "59" \
        and t[17:19] <= "60"


def log_files(paths: list, rotated: bool = True) -> list:
    """``paths`` with their logrotate siblings (``X.1``, ``X.2.gz`` ...), oldest first, each once."""
    out: list = []
    seen: set = set()
    for p in paths:
        group = []
        if rotated:
            d, base = os.path.split(p)
            try:
                names = os.listdir(d or ".")
            except OSError:
                names = []
            rot = []
            for n in names:
                if not n.startswith(base + "."):
                    continue
                suffix = n[len(base) + 1:]
                num = suffix[:-3] if suffix.endswith(".gz") else suffix
                if num.isdigit():
                    rot.append((int(num), os.path.join(d, n)))
            group = [q for _, q in sorted(rot, reverse=True)]
        group.append(p)
        for q in group:
            key = os.path.realpath(q)
            if key not in seen:
                seen.add(key)
                out.append(q)
    return out


def _lines(path: str, stats: dict):
    """Raw lines of one file (gzip told by its magic); over-long lines and a damaged tail counted bad."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    with f:
        if f.read(2) == b"\x1f\x8b":
            import gzip

            f.seek(0)
            stream = gzip.GzipFile(fileobj=f, mode="rb")
        else:
            f.seek(0)
            stream = f
        try:
            while True:
                line = stream.readline(MAX_LINE)
                if not line:
                    return
                if len(line) == MAX_LINE and not line.endswith(b"\n"):
                    stats["bad_lines"] += 1
                    # Skip the rest of the monster line, bounded reads.
                    while True:
                        more = stream.readline(MAX_LINE)
                        if not more or more.endswith(b"\n"):
                            break
                    continue
                yield line
        except (OSError, EOFError) as e:
            # A truncated or corrupt .gz (rotation in progress): what was read counts.
            stats["bad_lines"] += 1
            stats["notes"].append(f"{path}: stopped reading: {e}")


def _spooled(path: str):
    """The lines a user-namespaced container's hook left in the log's spool, not merged yet
    (:func:`compat_hook.core.logjson.merge_spool` merges them at the next start on the host)."""
    from ..core import logjson

    d = logjson.spool_dir(path)
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return
    for name in names:
        try:
            fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            line = logjson.spooled(fd, st.st_uid) if st.st_mode & 0o170000 == 0o100000 else None
        except OSError:
            line = None
        finally:
            os.close(fd)
        if line is not None:
            yield line


def _bump(table: dict, key, n: int = 1, cap: int = MAX_KEYS):
    if key not in table and len(table) >= cap:
        key = _OTHERS
    table[key] = table.get(key, 0) + n
    return key


class _Period:
    __slots__ = ("driver", "first", "last", "records", "events", "decisions", "images", "pods",
                 "failures", "failure_reasons", "last_failures", "warnings", "no_image")

    def __init__(self, driver) -> None:
        self.driver = driver
        self.first = self.last = None
        self.records = 0
        self.events: dict = {}
        self.decisions: dict = {}      # (decision, reason) -> {event: n}
        self.images: dict = {}         # image -> {"decision/reason": n}
        self.pods: dict = {}           # "ns/pod" -> {"decision/reason": n}
        self.failures = 0
        self.failure_reasons: dict = {}
        self.last_failures: list = []
        self.warnings: dict = {}
        self.no_image: dict = {}       # event -> records that name no image

    def add(self, r: dict) -> None:
        t = r.get("time") if isinstance(r.get("time"), str) else None
        if t:
            self.first = self.first or t
            self.last = t
        self.records += 1
        event = str(r.get("event") or "?")
        # The path that reached the container, where it is not the event itself: the hook an NRI
        # plugin added ("via": "nri") and that plugin's own lines count as "hook/nri", "fail_open/nri".
        via = r.get("via") if isinstance(r.get("via"), str) else ("nri" if r.get("component") == "nri" else None)
        if via:
            event = f"{event}/{via[:32]}"
        _bump(self.events, event, cap=16)
        decision, reason = str(r.get("decision") or "?"), str(r.get("reason") or "?")
        key = (decision, reason)
        if key not in self.decisions and len(self.decisions) >= MAX_KEYS:
            key = (_OTHERS, _OTHERS)
        _bump(self.decisions.setdefault(key, {}), event, cap=16)
        what = f"{decision}/{reason}"
        image = r.get("image")
        if isinstance(image, str) and image:
            key = image if image in self.images or len(self.images) < MAX_KEYS else _OTHERS
            _bump(self.images.setdefault(key, {}), what, cap=32)
        else:
            _bump(self.no_image, event, cap=16)
        pod = r.get("pod")
        if isinstance(pod, str) and pod:
            ns = r.get("namespace")
            name = f"{ns}/{pod}" if isinstance(ns, str) and ns else pod
            key = name if name in self.pods or len(self.pods) < MAX_KEYS else _OTHERS
            _bump(self.pods.setdefault(key, {}), what, cap=32)
        if decision == "error":
            self.failures += 1
            _bump(self.failure_reasons, reason)
            self.last_failures.append({k: r.get(k) for k in ("time", "event", "container_id", "bundle", "namespace",
                                                              "pod", "container_name", "image", "reason", "error")
                                       if r.get(k) is not None})
            if len(self.last_failures) > MAX_FAILURES:
                del self.last_failures[0]
        warnings = r.get("warnings")
        if isinstance(warnings, list):
            for w in warnings:
                if isinstance(w, str) and w:
                    _bump(self.warnings, w[:300])

    def to_dict(self) -> dict:
        def ranked(table: dict) -> list:
            return sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))

        return {
            "driver": self.driver, "from": self.first, "to": self.last, "records": self.records,
            "events": dict(ranked(self.events)),
            "decisions": sorted(({"decision": d, "reason": r, "count": sum(ev.values()), "events": dict(ev)}
                                 for (d, r), ev in self.decisions.items()),
                                key=lambda x: (-x["count"], x["decision"], x["reason"])),
            "images": [{"image": k, "count": sum(v.values()), "decisions": dict(ranked(v))}
                       for k, v in sorted(self.images.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))],
            "pods": [{"pod": k, "count": sum(v.values()), "decisions": dict(ranked(v))}
                     for k, v in sorted(self.pods.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))],
            "failures": {"count": self.failures, "by_reason": dict(ranked(self.failure_reasons)),
                         "last": list(self.last_failures)},
            "warnings": [{"warning": w, "count": n} for w, n in ranked(self.warnings)],
            # Records that name no image: Docker and ctr put none in the OCI spec (only the CRI
            # plugins' annotations do), so their starts are counted here, by event.
            "no_image": dict(ranked(self.no_image)),
        }


def report(paths: list, *, since: str | None = None, rotated: bool = True) -> dict:
    """The report over the log files ``paths`` (see the module docstring).

    ``since``: keep records at or after this time (:func:`parse_since`'s
    format). Raises :class:`UsageError` when a file cannot be read.
    """
    import json

    files = log_files(paths, rotated)
    for p in files:
        if not os.access(p, os.R_OK):
            try:
                open(p, "rb").close()
            except OSError as e:
                raise UsageError(f"cannot read {p}: {e.strerror or e}") from None
    stats = {"bad_lines": 0, "notes": [], "bad_time": 0, "no_time_excluded": 0}
    periods: list = []
    cur = nodrv = None
    total = before = 0
    loads = json.loads
    for p, src in [(p, _lines(p, stats)) for p in files] + [(p, _spooled(p)) for p in paths]:
        for line in src:
            if since is not None and line.startswith(b'{"time":"'):
                # logjson writes the time first: most old lines are dropped
                # before they are parsed (a time that is not one is decided below).
                t = line[9:33].decode("ascii", "replace")
                if valid_time(t) and t < since:
                    before += 1
                    continue
            if not line.strip():
                continue
            try:
                r = loads(line)
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                stats["bad_lines"] += 1
                continue
            if not isinstance(r, dict):
                stats["bad_lines"] += 1
                continue
            t = r.get("time")
            valid = valid_time(t)
            if since is not None and not valid:
                # No time to compare: it cannot be shown to be recent, so --since leaves it out (counted).
                stats["bad_time"] += 1
                stats["no_time_excluded"] += 1
                continue
            if since is not None and t < since:
                before += 1
                continue
            total += 1
            if not valid:
                stats["bad_time"] += 1
            drv = r.get("host_driver_version")
            drv = drv if isinstance(drv, str) and drv else None
            if drv is None:
                # No driver in the record (a failure before it was read, a start that
                # needed none: not_gpu, opted out): counted apart, in a period of its own,
                # never credited to a driver it may not have run on; nor does it split one.
                if nodrv is None:
                    nodrv = _Period(None)
                nodrv.add(r)
                continue
            if cur is None:
                cur = _Period(drv)
                periods.append(cur)
            elif drv != cur.driver and cur.driver != _SEVERAL:
                if len(periods) >= MAX_PERIODS:
                    cur.driver = _SEVERAL
                    stats["notes"].append(f"more than {MAX_PERIODS} driver periods: the rest are summed in the last")
                else:
                    cur = _Period(drv)
                    periods.append(cur)
            cur.add(r)
    out = [p.to_dict() for p in periods + ([nodrv] if nodrv is not None else [])]
    if stats["no_time_excluded"]:
        stats["notes"].append(f"{stats['no_time_excluded']} record(s) without a valid time left out by --since")
    return {
        "files": files, "since": since, "records": total, "skipped_before_since": before,
        "bad_lines": stats["bad_lines"], "bad_time": stats["bad_time"],
        "excluded_no_time": stats["no_time_excluded"], "notes": stats["notes"], "periods": out,
        "summary": {"periods": len(out), "drivers": [p["driver"] for p in out],
                    "failures": sum(p["failures"]["count"] for p in out),
                    "warnings": sum(w["count"] for p in out for w in p["warnings"])},
    }


def exit_status(rep: dict, fail_on: str | None) -> int:
    """0, or 3 with ``fail_on="failures"`` when any record failed."""
    return 3 if fail_on == "failures" and rep["summary"]["failures"] else 0


def _table(rows: list, indent: str = "  ") -> list:
    if not rows:
        return []
    widths = [max(len(str(r[k])) for r in rows) for k in range(len(rows[0]))]
    return [indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render_text(rep: dict) -> str:
    """The report as text: a header, then one block per period."""
    from ..core.errors import one_line

    out = [f"{rep['records']} record(s) from {', '.join(rep['files'])}"
           + (f" since {rep['since']}" if rep["since"] else "")
           + (f"; {rep['bad_lines']} bad line(s) skipped" if rep["bad_lines"] else "")
           + (f"; {rep['bad_time']} record(s) without a valid time" if rep.get("bad_time") else "")]
    out += [f"note: {n}" for n in rep["notes"]]
    for p in rep["periods"]:
        events = ", ".join(f"{k} {v}" for k, v in p["events"].items())
        out.append("")
        head = f"host driver {p['driver']}" if p["driver"] else "no host driver in the record"
        out.append(f"{head}: {p['from'] or '?'} .. {p['to'] or '?'}, {p['records']} record(s) ({events})")
        rows = [("DECISION", "REASON", "COUNT", "BY")]
        rows += [(d["decision"], d["reason"], d["count"], ", ".join(f"{k} {v}" for k, v in d["events"].items()))
                 for d in p["decisions"]]
        out += _table(rows)
        for title, key, items in (("image", "image", p["images"]), ("pod", "pod", p["pods"])):
            if items or (title == "image" and p.get("no_image")):
                out.append(f"  by {title}:")
                out += _table([(one_line(i[key]), i["count"],
                                ", ".join(f"{k} {v}" for k, v in i["decisions"].items())) for i in items], "    ")
                if title == "image" and p.get("no_image"):
                    out.append(f"    (no image named: {sum(p['no_image'].values())} record(s), "
                               + ", ".join(f"{k} {v}" for k, v in p["no_image"].items())
                               + "; Docker and ctr put no image in the OCI spec)")
        f = p["failures"]
        if f["count"]:
            out.append(f"  failures: {f['count']} (" + ", ".join(f"{k} {v}" for k, v in f["by_reason"].items()) + ")")
            for x in f["last"]:
                who = x.get("container_id") or (f"bundle {x['bundle']}" if x.get("bundle") else "?")
                if x.get("pod"):
                    who += f" ({x.get('namespace') or ''}/{x['pod']})"
                out.append(f"    {x.get('time', '?')} {x.get('event', '?')} {one_line(who)}: {x.get('reason')}: "
                           f"{one_line(str(x.get('error') or ''))[:200]}")
        if p["warnings"]:
            out.append(f"  warnings: {sum(w['count'] for w in p['warnings'])}")
            for w in p["warnings"]:
                out.append(f"    {w['count']}x {one_line(w['warning'])[:200]}")
    s = rep["summary"]
    out.append("")
    drivers = [d for d in s["drivers"] if d]
    out.append(f"{len(drivers)} driver period(s) ({' -> '.join(drivers) or 'none'})"
               + (", and records without a driver" if len(drivers) < len(s["drivers"]) else "") + ", "
               f"{s['failures']} failure(s), {s['warnings']} warning(s)")
    return "\n".join(out) + "\n"
