"""Wait for a file that may be deleted and written anew, dirs and all: inotify through libc.

The DaemonSet's installer (packaging/kubernetes/compat-hook-k8s.sh) registers
compat-hook under the NVIDIA toolkit's ``config.toml``. The GPU Operator's
toolkit container deletes ``/usr/local/nvidia/toolkit`` and writes that file
anew whenever it starts, without compat-hook's entry: until the installer
registers again, containers started through the NVIDIA runtime miss the
wrapper. Polling every 30 s left that window open for up to 30 s; this
watcher wakes the installer on the change itself::

    python3 -m compat_hook.install.watch [--every SECONDS] [--settle MS] PATH...

prints ``ready`` once its watches are armed (the caller checks once then, so
nothing between its last check and the arming is missed), ``change`` after
each change to one of the PATHs (created, written, renamed over, removed, or
any directory above it created, removed or renamed), and ``poll`` after
``--every`` seconds without a change: the polling fallback, kept so a missed
event (a full inotify queue, a filesystem that sends none) costs one period
at most. Changes within ``--settle`` milliseconds (default 50) of each other
are one ``change``. Where inotify cannot be had (no ``inotify_init1`` in
libc, the per-user instance limit) it prints ``ready`` and then only
``poll``, with one line on stderr saying why.

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

__all__ = ["Inotify", "InotifyUnavailable", "Watcher", "main"]

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

    def arm(self) -> None:
        """Watch each dir of interest that exists now (adding a watch twice is harmless)."""
        for d in sorted(self.interest, key=len):
            if d in self.wds.values() or not os.path.isdir(d):
                continue
            wd = self.ino.add(d)
            if wd is not None:
                self.wds[wd] = d

    def relevant(self, events: list) -> bool:
        """Whether ``events`` may have changed a watched path (dropping watches of dirs that went)."""
        hit = False
        for wd, mask, name in events:
            if mask & IN_Q_OVERFLOW:
                hit = True
                continue
            d = self.wds.get(wd)
            if mask & IN_IGNORED:
                self.wds.pop(wd, None)
                hit = True
            elif mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                hit = True
            elif d is not None and name in self.interest.get(d, ()):
                hit = True
        return hit

    def run(self, out, every: float, settle: float) -> None:
        """Print ``ready``, then ``change``/``poll`` lines to ``out`` until it is closed."""
        self.ino = Inotify()
        self.arm()
        out.write("ready\n")
        out.flush()
        last = time.monotonic()
        while True:
            left = max(0.0, last + every - time.monotonic())
            r, _, _ = select.select([self.ino.fd], [], [], left)
            if not r:
                out.write("poll\n")
                out.flush()
                last = time.monotonic()
                continue
            if not self.relevant(self.ino.read()):
                continue
            while select.select([self.ino.fd], [], [], settle)[0]:  # one change, not one per event
                self.relevant(self.ino.read())
            self.arm()
            out.write("change\n")
            out.flush()
            last = time.monotonic()


def _poll_only(out, every: float) -> None:
    out.write("ready\n")
    out.flush()
    while True:
        time.sleep(every)
        out.write("poll\n")
        out.flush()


def main(argv: list | None = None) -> int:
    """Exit status: 2 bad usage; otherwise it runs until its output is closed (then 0)."""
    args = list(sys.argv[1:] if argv is None else argv)
    every, settle = 30.0, 0.05
    try:
        while args and args[0].startswith("--"):
            opt = args.pop(0)
            if opt == "--every":
                every = float(args.pop(0))
            elif opt == "--settle":
                settle = float(args.pop(0)) / 1000
            else:
                raise ValueError(f"unknown option {opt}")
        if not args or every <= 0 or settle < 0:
            raise ValueError("no PATH to watch" if not args else "--every must be > 0, --settle >= 0")
    except (ValueError, IndexError) as e:
        print(f"compat-hook watch: {e or 'missing value'} (usage: [--every S] [--settle MS] PATH...)",
              file=sys.stderr)
        return 2
    try:
        try:
            Watcher(args).run(sys.stdout, every, settle)
        except InotifyUnavailable as e:
            print(f"compat-hook watch: {e}; polling every {every:g}s", file=sys.stderr)
            _poll_only(sys.stdout, every)
    except (BrokenPipeError, KeyboardInterrupt):
        # the reader went away: leave quietly (no second error when stdout is flushed at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
