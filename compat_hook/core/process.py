"""Helpers for the child processes compat-hook reads from (zstd, ctr, skopeo): stderr kept, big pipes.

>>> import subprocess, sys
>>> p = subprocess.Popen([sys.executable, "-c", "import sys; print('one', 'two', sep=chr(10), file=sys.stderr)"],
...                      stderr=subprocess.PIPE)
>>> t = StderrTail(p.stderr); p.wait(); t.last_line()
0
'two'
>>> t.close()
"""

from __future__ import annotations

__all__ = ["StderrTail", "big_pipe"]


class StderrTail:
    """The last 4 KiB a child writes to stderr, drained by a thread (a pipe: nothing on disk)."""

    def __init__(self, pipe) -> None:
        import threading

        self.pipe = pipe
        self.data = b""
        self.thread = threading.Thread(target=self._drain, name="stderr-tail", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        try:
            while True:
                b = self.pipe.read(4096)
                if not b:
                    break
                self.data = (self.data + b)[-4096:]
        except (OSError, ValueError):
            pass

    def last_line(self) -> str:
        self.thread.join(5)
        lines = self.data.decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    def close(self) -> None:
        self.thread.join(5)
        try:
            self.pipe.close()
        except OSError:
            pass


def big_pipe(fd: int, size: int = 1 << 20) -> None:
    """A 1 MiB pipe buffer (Linux F_SETPIPE_SZ): a 64 KiB one costs a context switch per 64 KiB
    (zstd -dc of a 271 MB layer read 0.41 s in 4195 reads; ~4x fewer with it)."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, size)  # F_SETPIPE_SZ
    except (OSError, ImportError):
        pass
