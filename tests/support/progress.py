"""One line when a long build starts and one when it ends, shown while pytest runs.

The cache's builds (the NVIDIA toolkit, kube-apiserver and the kubelet, crictl ...) take minutes
the first time; pytest captures a fixture's output, so ``make test`` would sit silent through them.
:func:`start` / :func:`done` write to the terminal pytest itself writes to: the Makefile loads this
module as a plugin (``-p tests.support.progress``), which keeps pytest's configuration, and the
lines go to the stderr pytest saved before capturing. Without the plugin (a plain ``pytest``
run, ``python3 -m tests.support.kubebuild``) they go to stderr as it is.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["start", "done", "pytest_configure", "pytest_sessionstart", "pytest_runtest_logreport",
           "pytest_runtest_logstart"]

_config = None
#: What each line starts with (packaging/nri/build.py says ``nri-plugin:``); a lane of ``make test``
#: (tests/support/lanes.py) names itself.
PREFIX = os.environ.get("COMPAT_HOOK_PROGRESS_PREFIX") or "[compat-hook tests]"
# Taken out of the environment: a child process has no such fd (or another file under that number).
try:
    _LANE_FD: int | None = int(os.environ.pop("COMPAT_HOOK_PROGRESS_FD"))
    os.set_inheritable(_LANE_FD, False)
except (KeyError, OSError, ValueError):
    _LANE_FD = None
os.environ.pop("COMPAT_HOOK_PROGRESS_PREFIX", None)
_T0 = time.monotonic()
_stamp = [_T0, ""]  # when the last "N min in" line was said; the module now running


def pytest_configure(config) -> None:
    global _config
    _config = config


#: A test (its fixtures included, so a cold build it waits for: 15 minutes at most seen) running longer than
#: this is named, and every thread's stack shown once: a run that CI stops at its limit then says where it was.
STILL_RUNNING_S = int(os.environ.get("COMPAT_HOOK_TEST_STILL_RUNNING_S", "1200"))
_current = [None, 0.0, False]  # the test running now, since when, its stacks shown


def _watch() -> None:
    import faulthandler

    while True:
        time.sleep(30)
        nodeid, since, shown = _current
        if nodeid is None or shown or time.monotonic() - since < STILL_RUNNING_S:
            continue
        _current[2] = True
        _say(f"still running after {(time.monotonic() - since) / 60:.0f} min: {nodeid}; every thread's stack:")
        fd = _lane_fd() if _lane_fd() is not None else _terminal_fd()
        try:
            faulthandler.dump_traceback(file=fd if fd is not None else sys.stderr, all_threads=True)
        except (OSError, ValueError):
            pass


def pytest_sessionstart(session) -> None:
    import threading

    threading.Thread(target=_watch, name="compat-hook-tests-watch", daemon=True).start()


def pytest_runtest_logstart(nodeid, location) -> None:
    """Every 10 minutes or more, at a module's start: how long the run has taken (CI shows only the
    output, and a run stopped at CI's limit prints no durations)."""
    _current[:] = [nodeid, time.monotonic(), False]
    module = nodeid.split("::", 1)[0]
    if module != _stamp[1]:
        _stamp[1] = module
        now = time.monotonic()
        if now - _stamp[0] >= 600:
            _stamp[0] = now
            _say(f"{(now - _T0) / 60:.0f} min in: {module}")


def pytest_runtest_logreport(report) -> None:
    """A failure's one line as it happens, not only in the summary at the end."""
    if not report.failed:
        return
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    lines = str(report.longrepr).strip().splitlines()
    why = (getattr(crash, "message", None) or (lines[-1] if lines else "")).strip()
    _say(f"FAILED ({report.when}, {report.duration:.0f} s, {(time.monotonic() - _T0) / 60:.0f} min in) "
         f"{report.nodeid}: {why.splitlines()[0][:300] if why else ''}")


def _lane_fd() -> int | None:
    """The pipe tests/support/lanes.py gave this lane for its progress lines, or None."""
    return _LANE_FD


def _terminal_fd() -> int | None:
    """The stderr pytest saved before its fd capture, or None (no pytest, no capture, -s)."""
    capman = _config.pluginmanager.getplugin("capturemanager") if _config is not None else None
    capturing = getattr(capman, "_global_capturing", None)
    fd = getattr(getattr(capturing, "err", None), "targetfd_save", None)
    return fd if isinstance(fd, int) else None


def _say(line: str) -> None:
    data = f"{PREFIX} {line}\n".encode()
    fd = _lane_fd()
    if fd is not None:  # a lane of make test: its runner shows the line at once
        try:
            os.write(fd, data)
            return
        except OSError:
            pass
    fd = _terminal_fd()
    try:
        if fd is not None:  # pytest's dots may be mid-line there
            os.write(fd, b"\n" + data)
            return
    except OSError:
        pass
    sys.stderr.write(data.decode())
    sys.stderr.flush()


def start(what: str) -> float:
    """Say that ``what`` starts; returns the time for :func:`done`."""
    _say(f"{what} ...")
    return time.monotonic()


def done(t0: float, what: str) -> None:
    """Say that ``what`` ended, with the seconds since :func:`start`."""
    _say(f"{what} in {time.monotonic() - t0:.0f} s")
