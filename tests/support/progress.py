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

__all__ = ["start", "done", "pytest_configure"]

_config = None
#: What each line starts with (packaging/nri/build.py says ``nri-plugin:``).
PREFIX = "[compat-hook tests]"


def pytest_configure(config) -> None:
    global _config
    _config = config


def _terminal_fd() -> int | None:
    """The stderr pytest saved before its fd capture, or None (no pytest, no capture, -s)."""
    capman = _config.pluginmanager.getplugin("capturemanager") if _config is not None else None
    capturing = getattr(capman, "_global_capturing", None)
    fd = getattr(getattr(capturing, "err", None), "targetfd_save", None)
    return fd if isinstance(fd, int) else None


def _say(line: str) -> None:
    data = f"{PREFIX} {line}\n".encode()
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
