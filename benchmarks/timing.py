"""Process timing: posix_spawn + os.wait4 (wall time and the child's ru_maxrss)."""

from __future__ import annotations

import os
import statistics
import time

DEVNULL = os.open("/dev/null", os.O_RDWR)


def spawn(argv, env=None, stdin_path=None, cwd_fd=None):
    fin = os.open(stdin_path, os.O_RDONLY) if stdin_path else DEVNULL
    try:
        acts = [(os.POSIX_SPAWN_DUP2, fin, 0), (os.POSIX_SPAWN_DUP2, DEVNULL, 1),
                (os.POSIX_SPAWN_DUP2, DEVNULL, 2)]
        return os.posix_spawn(argv[0], argv, env if env is not None else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                              file_actions=acts)
    finally:
        if stdin_path:
            os.close(fin)


def run_once(argv, env=None, stdin_path=None):
    """(milliseconds, exit code, ru_maxrss KiB)."""
    t0 = time.perf_counter()
    pid = spawn(argv, env, stdin_path)
    _, status, ru = os.wait4(pid, 0)
    ms = (time.perf_counter() - t0) * 1000
    return ms, os.waitstatus_to_exitcode(status), ru.ru_maxrss


TIME = "/usr/bin/time"


def peak_rss_kb(argv, env=None, stdin_path=None):
    """The child's own peak RSS (KiB), measured through GNU time.

    ru_maxrss from os.wait4 on a child of this (30 MB) runner is useless: Linux
    carries the parent's high-water mark over fork/vfork + exec. GNU time is a
    ~2 MB C program, so its child's figure is the program's own.
    """
    if not os.access(TIME, os.X_OK):
        return None
    out = f"/tmp/.bench-rss-{os.getpid()}"
    ms, rc, _ = run_once([TIME, "-f", "%M", "-o", out, *argv], env, stdin_path)
    try:
        with open(out) as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass


def concurrent(n, argv, env, stdin_paths):
    """Start n at once; per-process latency from the common start to its own exit."""
    t0 = time.perf_counter()
    pids = {spawn(argv, env, stdin_paths[i % len(stdin_paths)]): i for i in range(n)}
    lat, errors, rss = [], 0, 0
    while pids:
        pid, status, ru = os.wait4(-1, 0)
        if pid in pids:
            del pids[pid]
            lat.append((time.perf_counter() - t0) * 1000)
            errors += os.waitstatus_to_exitcode(status) != 0
            rss = max(rss, ru.ru_maxrss)
    return lat, errors, rss


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(xs):
    return statistics.median(xs) if xs else float("nan")
