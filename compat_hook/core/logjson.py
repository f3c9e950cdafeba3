"""One structured JSON line per run, appended to the log file.

runc discards a successful hook's output, so the log file is where every
decision is told. A line is written with a single ``write`` on an
``O_APPEND`` descriptor, so concurrent hooks never interleave within a line,
and only when it fits: on a full filesystem the line is left out whole
(reported on stderr) rather than torn. Logging never fails the hook: any
error is reported once on stderr.

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "log")
>>> write_line(p, {"event": "hook", "reason": "no_candidate"})
True
>>> open(p).read().startswith('{"time":')
True
"""

from __future__ import annotations

from . import fastos as os  # os without importing os: ~1 ms of a container start (fastos)
import sys
import time

from . import jsonfast

__all__ = ["write_line", "timestamp", "fail_open", "finish", "DEFAULT_LOG"]

#: The log file when no configuration could be read (config.py's ``log_file`` default).
DEFAULT_LOG = "/var/log/compat-hook.log"


def timestamp() -> str:
    """UTC time as ``2026-12-02T15:04:05.123Z`` (no datetime import)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def write_line(path: str | None, record: dict) -> bool:
    """Append ``record`` (with a leading ``time``) as one JSON line to ``path``."""
    line = dict(time=timestamp())
    line.update(record)
    try:
        data = (jsonfast.dumps(line) + "\n").encode()
    except (TypeError, ValueError) as e:
        data = (jsonfast.dumps({"time": line["time"], "event": record.get("event"),
                                "error": f"unloggable record: {e}"}) + "\n").encode()
    if not path:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
    except FileNotFoundError:
        try:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        except OSError as e:
            _complain(path, e)
            return False
    except OSError as e:
        _complain(path, e)
        return False
    try:
        if not _room(fd, len(data)):
            raise OSError(28, "No space left on device")  # ENOSPC: no torn line (below)
        n = os.write(fd, data)
        if n != len(data):
            # Filled up between the check and the write: end the fragment so that the next
            # start's line begins on a line of its own (best effort: it may not fit either).
            try:
                os.write(fd, b"\n")
            except OSError:
                pass
            raise OSError(28, "No space left on device")
        return True
    except OSError as e:
        _complain(path, e)
        return False
    finally:
        os.close(fd)


def _room(fd: int, size: int) -> bool:
    """Whether ``size`` more bytes fit: the free space plus what the file's last block has left.

    A write that runs out of space mid-line leaves a fragment without its newline, and the next
    line appended to it is lost with it (benchmarks/soak.py's full log filesystem showed it).
    Two syscalls (~2 us); a filesystem that cannot say is taken to have room.
    """
    try:
        vfs = os.fstatvfs(fd)
        if vfs.f_bavail * vfs.f_frsize >= size:
            return True
        st = os.fstat(fd)
        return vfs.f_bavail * vfs.f_frsize + max(0, st.st_blocks * 512 - st.st_size) >= size
    except OSError:
        return True


def _complain(path: str, e: OSError) -> None:
    try:
        sys.stderr.write(f"compat-hook: cannot write log {path}: {e.strerror or e}\n")
    except Exception:
        pass


def fail_open(record: dict, config, code: str, message: str, *, prog: str, stopped: str, goes_on: str) -> bool:
    """Record a failed run in ``record``; True when the operator chose fail-closed.

    The one fail-open rule of the hook and the runtime wrapper: a failure is
    one log record (``decision: error``, its reason code, the message, what
    happens to the container) and the container starts as if compat-hook were
    not there, unless the configuration says ``on_error: fail``; then one line
    goes to stderr (``prog: message``, which the runtime shows) and the caller
    returns its failure status. Without a configuration (it was the failure),
    the run fails open.

    >>> rec = {}
    >>> fail_open(rec, None, "bad_config", "mode: bad", prog="compat-hook", stopped="stopped",
    ...           goes_on="starts"), rec["outcome"]
    (False, 'starts (on_error: continue)')
    """
    fail = config is not None and config.on_error == "fail"
    record.update(decision="error", reason=code, error=message,
                  outcome=f"{stopped} (on_error: fail)" if fail else f"{goes_on} (on_error: continue)")
    if fail:
        sys.stderr.write(f"{prog}: {message}\n")
    return fail


def finish(record: dict, config, t0: float) -> bool:
    """Write a run's ``record`` with its ``duration_ms`` since ``t0`` (``time.monotonic()``) to the
    configured log (the default log when there is no configuration)."""
    record["duration_ms"] = round((time.monotonic() - t0) * 1000, 2)
    return write_line(config.log_file if config is not None else DEFAULT_LOG, record)
