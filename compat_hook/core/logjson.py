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

__all__ = ["write_line", "timestamp", "fail_open", "finish", "DEFAULT_LOG", "SPOOL_SUFFIX", "spool_dir",
           "spooled", "merge_spool", "prepare_spool"]

#: ``.<log file name>.spool`` beside the log (hidden: ``<log>*`` globs never meet it): where a hook that
#: cannot open the log (a user-namespaced container's createContainer hook runs as an unprivileged host
#: uid) leaves its line, one file each.
SPOOL_SUFFIX = ".spool"
#: At most this many spooled lines are merged by one run, each at most this long: anyone on the host
#: can put files in the spool, and a start must stay cheap.
_SPOOL_BATCH, _SPOOL_LINE = 32, 65536
_EACCES, _EPERM, _EROFS = 13, 1, 30

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
    except PermissionError as e:
        # A hook in a user namespace (createContainer) runs as a host uid the log is closed to:
        # its line goes to the spool, which the next run on the host merges into the log.
        if _to_spool(path, data):
            return True
        _complain(path, e)
        return False
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
        if n == len(data):
            merge_spool(path, fd)
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


def spool_dir(path: str) -> str:
    """The spool dir of the log file ``path``: beside it, hidden, so that what reads or rotates the log's
    copies (``<log>*``: logrotate, a shell glob) never meets a dir.

    >>> spool_dir("/var/log/compat-hook.log")
    '/var/log/.compat-hook.log.spool'
    """
    head, _, name = path.rpartition("/")
    return f"{head}/.{name}{SPOOL_SUFFIX}" if head or path.startswith("/") else f".{name}{SPOOL_SUFFIX}"


def prepare_spool(path: str) -> bool:
    """Make the log's dir and its spool (mode 1733) if missing; True when the spool is a dir of that mode.

    ``compat-hook install`` calls it, so that the very first start on a host may be a user-namespaced
    one (its hook cannot create the spool); the first line written on the host makes it too. An existing
    entry is never changed: a spool that is not a real dir of mode 1733 (a symlink planted there) stays
    as it is and the answer is False.
    """
    d = spool_dir(path)
    try:
        os.makedirs(os.path.dirname(d) or ".", mode=0o755, exist_ok=True)
        # made 0700 first: nobody else can add to it before it has its sticky bit
        os.mkdir(d, 0o700)
        os.chmod(d, 0o1733)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return st.st_mode & 0o170000 == 0o040000 and st.st_mode & 0o7777 == 0o1733


def _to_spool(path: str, data: bytes) -> bool:
    """Leave one line in the log's spool (a new file, never one that exists); True when done."""
    name = f"{spool_dir(path)}/{time.time_ns()}-{os.getpid()}-{os.urandom(4).hex()}.json"
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    try:
        return os.write(fd, data) == len(data)
    except OSError:
        return False
    finally:
        os.close(fd)


def spooled(fd: int, uid: int) -> bytes | None:
    """A spooled file's line as the log takes it, marked with the uid that wrote it, or None.

    Anyone on the host may write into the spool (mode 1733), so a line is taken only as
    :func:`write_line` writes one (the time first, one line, bounded), and it says who wrote it:
    ``spooled_by_uid``, the file's owner, a container's mapped root or someone else.
    """
    data = os.read(fd, _SPOOL_LINE + 1)
    if (len(data) > _SPOOL_LINE or not data.startswith(b'{"time":"') or data[33:35] != b'",' or
            data.count(b"\n") != 1 or not data.endswith(b"\n")):
        return None
    return data[:35] + b'"spooled_by_uid":%d,' % uid + data[35:]


def merge_spool(path: str, log_fd: int | None = None) -> int:
    """Append the spooled lines of the log ``path`` to it and remove them; returns how many.

    Run on the host after each line written (at most a batch read from the dir, the dir made here the
    first time, mode 1733: anyone may add a file, only its owner may remove it, nobody else may list
    it) and by ``report``. Files that are not one well-formed line are removed unmerged.
    """
    d = spool_dir(path)
    try:
        # at most a batch read from the dir, however many files someone put there: a start stays cheap
        with os.scandir(d) as it:
            # dirs (which only their owner could empty) are passed over, within a bounded scan
            names = [e.name for _, e in zip(range(8 * _SPOOL_BATCH), it)
                     if not e.is_dir(follow_symlinks=False)][:_SPOOL_BATCH]
    except FileNotFoundError:
        prepare_spool(path)
        return 0
    except OSError:
        return 0
    if not names:
        return 0
    own = log_fd is None
    n = 0
    try:
        if own:
            log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
        for name in sorted(names):
            f = f"{d}/{name}"
            line = None
            try:  # a link, a FIFO, a dir: dropped unread (O_NOFOLLOW, O_NONBLOCK, regular files only)
                fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
                try:
                    st = os.fstat(fd)
                    line = spooled(fd, st.st_uid) if st.st_mode & 0o170000 == 0o100000 else None
                finally:
                    os.close(fd)
            except OSError:
                pass
            try:
                os.unlink(f)
            except OSError:
                continue  # not ours to take: merged by whoever can remove it
            if line is not None and _room(log_fd, len(line)) and os.write(log_fd, line) == len(line):
                n += 1
    except OSError:
        pass
    finally:
        if own and log_fd is not None:
            os.close(log_fd)
    return n


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
