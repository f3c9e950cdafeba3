"""Wait for a file that may be deleted and written anew, dirs and all: inotify through libc; register again.

The DaemonSet's installer (packaging/kubernetes/compat-hook-k8s.sh) registers
compat-hook under the NVIDIA toolkit's ``config.toml``. The GPU Operator's
toolkit container deletes ``/usr/local/nvidia/toolkit`` and writes that file
anew whenever it starts, without compat-hook's entry: until compat-hook is
registered again, containers started through the NVIDIA runtime miss the
wrapper. Polling every 30 s left that window open for up to 30 s; this
watcher wakes on the change itself and, given the wrapper, registers again
at once::

    python3 -m compat_hook.install.watch [--every SECONDS] [--settle MS]
        [--wrapper-path WRAPPER [--hook-config FILE]] PATH...

prints ``ready`` once its watches are armed (the caller checks once then, so
nothing between its last check and the arming is missed), ``change`` after
a change to one of the PATHs (created, written, renamed over, removed, or
any directory above it created, removed or renamed) that leaves one holding
other bytes than at the last line, and ``poll`` after
``--every`` seconds without a change: the polling fallback, kept so a missed
event (a full inotify queue, a filesystem that sends none) costs one period
at most. Changes within ``--settle`` milliseconds (default 50) of each other
are one ``change`` (events about other names, such as the toolkit's
binaries copied beside it, do not prolong the wait); a PATH closed after
writing or renamed into place ends that wait at once (it is whole). A PATH
being written (created or written and not closed since, or found empty
where it was not at the last line: ``os.Create`` and then the write, as
nvidia-ctk-installer does) holds the ``change`` back until it is closed: no
one is sent to read half a file. The poll still comes, and a writer silent
for a whole period is not waited for again.

With ``--wrapper-path``, at each change every PATH that exists and does not
name WRAPPER first in ``[nvidia-container-runtime] runtimes`` is registered
again *in this process*, before the ``change`` line: the code of
``compat-hook install nvidia-toolkit --engine-config PATH --wrapper-path
WRAPPER [--hook-config FILE]`` (:func:`compat_hook.install.run_install`),
its output on stderr. A new process for it would pay the interpreter's start
and the imports first (tomlkit, PyYAML): most of the window, and hundreds of
ms on a busy node (benchmarks/README.md). The imports are done before
``ready`` (a dry run on a sample file). A failed registration is one line on
stderr, never the end of the watcher: the ``change`` line follows as always,
and the caller's own check (the installer runs ``compat-hook install`` when
the file differs from what it registered) is the fallback.

Where inotify cannot be had (no ``inotify_init1`` in libc, the per-user
instance limit) it prints ``ready`` and then only ``poll``, with one line on
stderr saying why.

Why libc through ctypes: the inotify API is three libc calls; the DaemonSet
image carries busybox-static only, whose Debian build has no ``inotifyd``,
and the node's python3 is what compat-hook runs on anyway (no extra package
on the node). Every directory from ``/`` down to the deepest one that exists
is watched for the next name on the path; when that name appears, the watch
moves down (and looks again, so a directory made between two events is not
missed).

>>> w = Watcher(["/nonexistent-compat-hook/a/b.toml"])
>>> w.interest["/nonexistent-compat-hook"], w.interest["/nonexistent-compat-hook/a"]
({'a'}, {'b.toml'})
"""

from __future__ import annotations

import os
import select
import struct
import sys
import time

__all__ = ["Inotify", "InotifyUnavailable", "Watcher", "Reregister", "main"]

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
#: What a watched directory reports: names appearing, going, being written or renamed; itself going.
DIR_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
            | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class InotifyUnavailable(OSError):
    """inotify cannot be used here (no libc symbol, or the kernel refused an instance)."""


class Inotify:
    """One inotify instance (``inotify_init1``, ``inotify_add_watch``) and its raw events."""

    def __init__(self) -> None:
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._init, self._add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError) as e:
            raise InotifyUnavailable(f"no inotify in libc: {e}") from None
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._ctypes = ctypes
        fd = self._init(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyUnavailable(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd

    def add(self, path: str, mask: int = DIR_MASK) -> int | None:
        """The watch descriptor of ``path`` (the same one again for a watched path); None when it is gone."""
        wd = self._add(self.fd, os.fsencode(path), mask)
        return wd if wd >= 0 else None

    def read(self) -> list:
        """The pending events as ``(wd, mask, name)``; ``[]`` when none."""
        try:
            buf = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        out, i = [], 0
        while i + _EVENT.size <= len(buf):
            wd, mask, _cookie, n = _EVENT.unpack_from(buf, i)
            name = buf[i + _EVENT.size:i + _EVENT.size + n].split(b"\0", 1)[0]
            out.append((wd, mask, os.fsdecode(name)))
            i += _EVENT.size + n
        return out

    def close(self) -> None:
        os.close(self.fd)


class Watcher:
    """Watches on every existing directory above ``paths``, each for the next name on the way down."""

    def __init__(self, paths: list) -> None:
        self.paths = [os.path.abspath(p) for p in paths]
        #: dir -> the names in it that lead to (or are) a watched path
        self.interest: dict = {}
        for p in self.paths:
            d, name = os.path.split(p)
            while True:
                self.interest.setdefault(d, set()).add(name)
                if d == "/":
                    break
                d, name = os.path.split(d)
        self.wds: dict = {}
        self.ino: Inotify | None = None
        #: watched paths created or written and not closed since -> whether data was written
        #: (False: created or found empty, no write seen yet)
        self.writing: dict = {}

    def arm(self) -> None:
        """Watch each dir of interest that exists now (adding a watch twice is harmless)."""
        for d in sorted(self.interest, key=len):
            if d in self.wds.values() or not os.path.isdir(d):
                continue
            wd = self.ino.add(d)
            if wd is not None:
                self.wds[wd] = d

    def relevant(self, events: list) -> tuple:
        """``(hit, whole)``: whether ``events`` may have changed a watched path (dropping watches of
        dirs that went), and whether one was closed after writing or renamed into place."""
        hit = whole = False
        for wd, mask, name in events:
            if mask & IN_Q_OVERFLOW:
                self.writing.clear()  # its events are lost: no telling
                hit = True
                continue
            d = self.wds.get(wd)
            if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                if mask & IN_IGNORED:
                    self.wds.pop(wd, None)
                if d is not None:  # the dir went, and what was being written in it with it
                    for p in [p for p in self.writing if p.startswith(d.rstrip("/") + "/")]:
                        del self.writing[p]
                hit = True
            elif d is not None and name in self.interest.get(d, ()):
                hit = True
                path = os.path.join(d, name)
                if path not in self.paths:
                    continue
                if mask & IN_CREATE:
                    self.writing[path] = False
                elif mask & IN_MODIFY:
                    self.writing[path] = True
                elif mask & (IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM):
                    self.writing.pop(path, None)
                    whole = whole or bool(mask & (IN_CLOSE_WRITE | IN_MOVED_TO))
        return hit, whole

    def _half_written(self, told: tuple) -> None:
        """After a quiet spell: a file found empty that was not empty at the last line is one created
        and not written yet (``os.Create``, then the write: nvidia-ctk-installer), its creation seen
        or not; one created with no write seen that has content was linked in whole."""
        import stat

        for p, before in zip(self.paths, told):
            if self.writing.get(p):
                continue  # written and not closed
            try:
                st = os.lstat(p)
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == 0 and before != b"":
                self.writing[p] = False
            else:
                self.writing.pop(p, None)

    def settle(self, settle: float, whole: bool, told: tuple) -> bool:
        """Wait out a burst of events: until none about a watched path came for ``settle`` s, or
        one was closed whole just now (others, e.g. files copied beside it, do not prolong it).
        ``told``: what the paths held at the last line (:meth:`contents`).

        True: the watched paths may be read; False: one is still open for writing (its close is
        an event of its own).
        """
        until = time.monotonic() + settle
        while True:
            self.arm()  # at once: the events of what is made in a new dir next are seen
            if whole and not self.writing:
                return True
            left = until - time.monotonic()
            quiet = left <= 0 or not select.select([self.ino.fd], [], [], left)[0]
            if quiet:
                self._half_written(told)
                if self.writing:
                    return False
                if not select.select([self.ino.fd], [], [], 0)[0]:  # nothing came while looking
                    return True
            hit, now_whole = self.relevant(self.ino.read())
            if hit:
                whole, until = now_whole, time.monotonic() + settle
            elif quiet:
                return True

    def contents(self) -> tuple:
        """What each watched path holds now (bytes; None when it is missing or cannot be read)."""
        out = []
        for p in self.paths:
            try:
                with open(p, "rb") as f:
                    out.append(f.read())
            except OSError:
                out.append(None)
        return tuple(out)

    def run(self, out, every: float, settle: float, on_change=None) -> None:
        """Print ``ready``, then ``change``/``poll`` lines to ``out`` until it is closed.

        ``on_change(path)``: called for each watched path at each change, before the ``change``
        line (the re-registration).
        """
        self.ino = Inotify()
        self.arm()
        told = self.contents()
        out.write("ready\n")
        out.flush()
        last = time.monotonic()
        while True:
            left = max(0.0, last + every - time.monotonic())
            r, _, _ = select.select([self.ino.fd], [], [], left)
            if not r:
                self.writing.clear()  # a writer silent for a whole period: the poll's check reads it
                out.write("poll\n")
                out.flush()
                last = time.monotonic()
                continue
            hit, whole = self.relevant(self.ino.read())
            if not hit or not self.settle(settle, whole, told):
                continue
            if on_change is not None:
                for p in self.paths:
                    on_change(p)
            now = self.contents()
            if now == told:
                continue  # what the last line saw (its own write's echo, a rewrite undone by on_change)
            told = now
            out.write("change\n")
            out.flush()
            last = time.monotonic()


#: What the warm-up's dry run registers under (the toolkit's own defaults, abridged).
SAMPLE = '[nvidia-container-runtime]\n  runtimes = ["runc", "crun"]\n'


class Reregister:
    """``compat-hook install nvidia-toolkit --engine-config PATH --wrapper-path WRAPPER``, in this process.

    Its output goes to ``err`` (stdout is the watcher's lines), with one line of its own per
    registration or failure; no error leaves it.
    """

    def __init__(self, wrapper: str, hook_config: str | None = None, err=None) -> None:
        self.wrapper = os.path.abspath(wrapper)
        self.hook_config = hook_config
        self.err = sys.stderr if err is None else err

    def _install(self, path: str, dry_run: bool = False, out=None) -> int:
        import contextlib

        from . import Options, run_install

        opts = Options(engine="nvidia-toolkit", config=path, hook_config=self.hook_config,
                       wrapper_path=self.wrapper, dry_run=dry_run)
        with contextlib.redirect_stdout(self.err if out is None else out):
            return run_install(opts)

    def warm(self) -> None:
        """Import what the install needs now, by a dry run on a sample file (its errors are the real run's to say)."""
        import io
        import tempfile

        try:
            with tempfile.TemporaryDirectory(prefix="compat-hook-watch-") as d:
                sample = os.path.join(d, "config.toml")
                with open(sample, "w", encoding="utf-8") as f:
                    f.write(SAMPLE)
                self._install(sample, dry_run=True, out=io.StringIO())
        except (Exception, SystemExit):  # e.g. no runc on this node: the real run says so, once it is asked to
            pass
        # what writes the file and makes the log's spool: a dry run does not get there
        from ..core import atomic, logjson  # noqa: F401

    def __call__(self, path: str) -> bool | None:
        """Register under ``path``: True done, False failed (said on ``err``), None nothing to do there."""
        try:
            from .nvidia_toolkit import names_first

            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
            except OSError:
                return None  # gone, or not a file: nothing to register under (the caller's check says more)
            if not text.strip() or names_first(text, self.wrapper):
                return None  # empty: created, its content not written yet (seen or not); or registered already
            status = self._install(path)
            if status != 0:
                raise RuntimeError(f"exit status {status}")
        except (Exception, SystemExit) as e:
            from ..core.errors import describe

            self._say(f"registering again under {path} failed: {describe(e)[1]}; "
                      f"the installer's own check follows")
            return False
        self._say(f"registered again under {path}")
        return True

    def _say(self, msg: str) -> None:
        try:
            self.err.write(f"compat-hook watch: {msg}\n")
            self.err.flush()
        except (OSError, ValueError):
            pass


def _poll_only(out, every: float) -> None:
    out.write("ready\n")
    out.flush()
    while True:
        time.sleep(every)
        out.write("poll\n")
        out.flush()


USAGE = "[--every S] [--settle MS] [--wrapper-path WRAPPER [--hook-config FILE]] PATH..."


def main(argv: list | None = None) -> int:
    """Exit status: 2 bad usage; otherwise it runs until its output is closed (then 0)."""
    args = list(sys.argv[1:] if argv is None else argv)
    every, settle, wrapper, hook_config = 30.0, 0.05, None, None
    try:
        while args and args[0].startswith("--"):
            opt = args.pop(0)
            if opt == "--every":
                every = float(args.pop(0))
            elif opt == "--settle":
                settle = float(args.pop(0)) / 1000
            elif opt == "--wrapper-path":
                wrapper = args.pop(0)
            elif opt == "--hook-config":
                hook_config = args.pop(0)
            else:
                raise ValueError(f"unknown option {opt}")
        if not args or every <= 0 or settle < 0:
            raise ValueError("no PATH to watch" if not args else "--every must be > 0, --settle >= 0")
        if hook_config is not None and wrapper is None:
            raise ValueError("--hook-config goes with --wrapper-path")
    except (ValueError, IndexError) as e:
        print(f"compat-hook watch: {e or 'missing value'} (usage: {USAGE})", file=sys.stderr)
        return 2
    register = None
    if wrapper is not None:
        register = Reregister(wrapper, hook_config)
        register.warm()
    try:
        try:
            Watcher(args).run(sys.stdout, every, settle, register)
        except InotifyUnavailable as e:
            print(f"compat-hook watch: {e}; polling every {every:g}s", file=sys.stderr)
            _poll_only(sys.stdout, every)
    except (BrokenPipeError, KeyboardInterrupt):
        # the reader went away: leave quietly (no second error when stdout is flushed at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
