"""Effects of ldconfig mode: the ld.so drop-in and a confined ld cache refresh.

The drop-in is ``/etc/ld.so.conf.d/00-00-compat-hook.conf`` in the rootfs,
holding the container-side resolved compat dir. Its name sorts before the
image's own drop-ins, NGC's ``00-cuda-compat.conf`` and the NVIDIA toolkit's
``00-compat-*`` / ``00-nvcr-*`` both in the C locale (``-`` < ``0`` < letters)
and under glibc's locale collation that ignores punctuation (``0000...``
before ``00c...`` / ``00n...``); ldconfig lets the earliest directory win for
a soname. The name is fixed, so two starts leave one file, and a later start
that decides "skip" finds and removes it: a container restarted after the
host driver was upgraded stops using the compat driver (the stale-drop-in
defect of NVIDIA's uuid-named files).

The ld cache is rebuilt by the *host's* ldconfig with ``-r <rootfs>``
(ldconfig chroots before reading anything, so the image's files are read in
the image), as a child with a timeout, rlimits, an explicit environment and
no inherited descriptors.

>>> plan_for(True, "/usr/local/cuda-12.4/compat", None)
[('write_dropin', '/usr/local/cuda-12.4/compat'), ('ldconfig', None)]
>>> plan_for(False, None, "/usr/local/cuda-12.4/compat\\n")
[('remove_dropin', None), ('ldconfig', None)]
>>> plan_for(False, None, None)
[]

When compat is wrong for the host (a skip whose ``effect`` is ``"host"``) the
same drop-in names the container dir holding the *host* driver's
``libcuda.so.<host version>`` instead: sorting first, it beats every compat
drop-in the image bakes (NGC ``00-cuda-compat.conf``, vLLM's) or the NVIDIA
toolkit's ``enable-cuda-compat`` writes (``00-compat-<uuid>.conf``, at this
start or a stale one from an earlier start), and it keeps winning when the
toolkit's ``update-ldcache`` rebuilds the cache after us
(measured with the toolkit's own v1.20 binaries: tests/test_toolkit_containers.py).

>>> plan_for(True, "/usr/lib/x86_64-linux-gnu", None, purpose="host")
[('write_dropin', '/usr/lib/x86_64-linux-gnu'), ('ldconfig', None)]
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start

from ..core.errors import CompatHookError, UnsafePath

__all__ = ["DROPIN_DIR", "DROPIN_NAME", "DROPIN_PATH", "LD_SO_CONF", "plan_for", "current_dropin",
           "apply", "apply_locked", "apply_mounted", "read_only", "run_ldconfig", "lock_rootfs", "LdconfigError",
           "ReadOnlyRoot", "LD_SO_CACHE"]

DROPIN_DIR = "/etc/ld.so.conf.d"
DROPIN_NAME = "00-00-compat-hook.conf"
DROPIN_PATH = f"{DROPIN_DIR}/{DROPIN_NAME}"
LD_SO_CONF = "/etc/ld.so.conf"
LD_SO_CACHE = "/etc/ld.so.cache"
#: Where the rebuilt cache of a read-only root is made for a moment (under a tmpfs of our own):
#: a dir every OCI container has, that ldconfig does not search.
SCRATCH_DIR = "/dev"
_LD_SO_CONF_TEXT = b"# created by compat-hook: the image had no /etc/ld.so.conf\ninclude /etc/ld.so.conf.d/*.conf\n"
_HEADER = "# compat-hook: CUDA forward compatibility for this container (rewritten at every start)\n"
#: The header of a drop-in naming the host driver's dir (compat is wrong on this host).
_HOST_HEADER = ("# compat-hook: the host driver's libcuda, not a compat one, is right on this host "
                "(rewritten at every start)\n")


def _header(purpose: str) -> str:
    return _HOST_HEADER if purpose == "host" else _HEADER


class LdconfigError(CompatHookError):
    code = "ldconfig_failed"


class LdConfUnfinished(CompatHookError):
    """The image's ld.so.conf tree is past what compat-hook reads (``ld_so_conf_bounded``) or was not read
    in time (``ld_so_conf_deadline``): ldconfig would read the same tree, for as long as it takes, so
    it is not run (the start goes on without the drop-in, at once, rather than at ``ldconfig_timeout``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ReadOnlyRoot(CompatHookError):
    """The root is read-only where the hook runs and the decision cannot be made by a mount either."""

    code = "read_only_root"


def read_only(root) -> bool:
    """Whether the container's root is mounted read-only where the hook runs (``ST_RDONLY``).

    crun applies ``root.readonly`` before the createContainer hooks; runc only
    after them, and prestart/createRuntime hooks see the bundle's rootfs as the
    host does.
    """
    try:
        return bool(os.statvfs(root.host_path).f_flag & 1)  # ST_RDONLY
    except OSError:
        return False


def dropin_text(compat_dir: str, purpose: str = "compat") -> str:
    return f"{_header(purpose)}{compat_dir}\n"


def dropin_bytes(compat_dir: str, purpose: str = "compat") -> bytes:
    """The drop-in as written: the dir's exact bytes (an image may use non-UTF-8 names).

    ld.so.conf has no quoting: a newline would split the name into lines the
    image chose, ``#`` starts a comment and ldconfig strips edge whitespace,
    so such a name cannot be written faithfully and is refused
    (:class:`UnsafePath`).
    """
    raw = os.fsencode(compat_dir)
    if (not raw.startswith(b"/") or raw != raw.strip() or b"#" in raw
            or any(c < 0x20 or c == 0x7F for c in raw)):
        raise UnsafePath(f"the compat dir {compat_dir!r} cannot be named in an ld.so.conf file "
                         "(control character, '#' or edge whitespace)")
    return _header(purpose).encode() + raw + b"\n"


def current_dropin(root) -> str | None:
    """Text of our drop-in in the rootfs, or ``None`` (a non-regular file counts as present)."""
    try:
        st = root.lstat(DROPIN_PATH)
    except OSError:
        return None
    import stat as _stat

    if not _stat.S_ISREG(st.st_mode):
        return ""  # something (a planted symlink?) squats our name: replace or remove it
    try:
        return root.read_file(DROPIN_PATH, 4096).decode("utf-8", "replace")
    except OSError:
        return ""


def plan_for(enable: bool, compat_dir: str | None, existing: str | None, purpose: str = "compat",
             refresh: bool = False) -> list:
    """The ordered actions for a decision, given the drop-in found (pure).

    ``enable``: our drop-in must name ``compat_dir`` (with ``purpose``
    ``"host"``: the host driver's dir); else it must not exist. Writing
    always refreshes the cache: another hook (the NVIDIA toolkit's) may have
    rebuilt it since the last start, and it is the only way to be sure our
    entry is first. ``refresh``: the cache must be rebuilt anyway (the hook
    masked a compat dir the image's cache still points into).

    >>> plan_for(False, None, None, "host", refresh=True)
    [('ldconfig', None)]
    """
    if enable:
        if existing == dropin_text(compat_dir, purpose):
            return [("ldconfig", None)]  # a restart: the drop-in is already right
        return [("write_dropin", compat_dir), ("ldconfig", None)]
    if existing is not None:
        return [("remove_dropin", None), ("ldconfig", None)]
    return [("ldconfig", None)] if refresh else []


def namespace_pid(state: dict):
    """The pid whose mount namespace ldconfig must run in, or ``None`` for our own.

    At prestart and createRuntime the hook runs in the host's mount
    namespace, where mounts the runtime or the NVIDIA toolkit made for the
    container (the bind-mounted host driver libraries) are invisible: an
    ldconfig run there sees their empty placeholder files and drops them from
    the cache. The state's ``pid`` is then the container's init on the host.
    At createContainer we are already in the container's namespace (runc
    reports pid 1, crun 0).
    """
    pid = state.get("pid") if isinstance(state, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return None
    try:
        ours = os.stat("/proc/self/ns/mnt")
        theirs = os.stat(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None
    return pid if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino) else None


def apply(root, actions: list, config, ns_pid=None, purpose: str = "compat") -> list:
    """Carry out ``actions`` in ``root``; returns what was done, for the log.

    On an error the exception carries what was done before it in ``done``.

    If ldconfig fails after a drop-in was written, the drop-in is taken out
    again: the cache did not change, and a drop-in left behind would turn
    compat on at the image's next own ldconfig run - the opposite of what
    the failure log says ("starts without compat").
    """
    done: list = []
    try:
        _apply(root, actions, config, ns_pid, purpose, done)
    except Exception as e:
        e.done = done
        raise
    return done


def _apply(root, actions, config, ns_pid, purpose, done) -> None:
    extra_dirs: list = []
    wrote = False
    for action, arg in actions:
        if action == "write_dropin":
            text = dropin_bytes(arg, purpose)  # refuse before changing anything
            if not root.exists(LD_SO_CONF):
                root.mkdirs("/etc")
                root.write_file(LD_SO_CONF, _LD_SO_CONF_TEXT, 0o644)
                done.append("created /etc/ld.so.conf")
            else:
                from ..facts.loader import ld_so_conf

                # the loader model's own reading (one parser): does an include read our drop-in?
                if ld_so_conf(root, skip=DROPIN_NAME).dropin_key(DROPIN_NAME) is None:
                    # The image's ld.so.conf ignores ld.so.conf.d: name the dir
                    # on ldconfig's command line, which it reads first.
                    extra_dirs.append(arg)
                    done.append("ld.so.conf lacks the conf.d include: compat dir passed to ldconfig")
            root.mkdirs(DROPIN_DIR)
            path = root.write_file(DROPIN_PATH, text, 0o644)
            wrote = True
            done.append(f"wrote {path}")
        elif action == "remove_dropin":
            if root.unlink(DROPIN_PATH):
                done.append(f"removed {DROPIN_PATH}")
        elif action == "ldconfig":
            try:
                ms = run_ldconfig(config.ldconfig, root.host_path, extra_dirs,
                                  config.ldconfig_timeout, ns_pid)
            except LdconfigError:
                if wrote and root.unlink(DROPIN_PATH):
                    done.append(f"removed {DROPIN_PATH} again (ldconfig failed)")
                raise
            done.append(f"ldconfig -r ({ms} ms" + (f", in the mount namespace of pid {ns_pid})"
                                                   if ns_pid else ")"))
        else:  # pragma: no cover - plan_for produces only these
            raise ValueError(action)


def apply_locked(root, target: str | None, purpose: str, config, state_dir: str, ns_pid=None,
                 refresh: bool = False) -> tuple:
    """Plan again under the rootfs lock and carry out: ``(actions, done, lock_note)``.

    ``target``: the dir our drop-in must name (``None``: no drop-in). The
    plan is made again once the lock is held, since a concurrent start may
    have changed the drop-in meanwhile. ``refresh``: as for :func:`plan_for`.
    """
    fd, note = lock_rootfs(state_dir, root, config.ldconfig_timeout)
    try:
        actions = plan_for(target is not None, target, current_dropin(root), purpose, refresh)
        return actions, apply(root, actions, config, ns_pid, purpose), note
    finally:
        if fd is not None:
            os.close(fd)


def apply_mounted(root, target: str | None, purpose: str, config, refresh: bool = False) -> tuple:
    """The decision on a read-only root, by a mount: ``(actions, done)``.

    Only in the container's mount namespace (createContainer), where the
    runtime made the root read-only itself. Nothing can be written in the
    rootfs, so no drop-in: the dir it would name goes on ldconfig's command
    line instead, which ldconfig reads before its configuration (first for the
    soname, as the drop-in would be), the cache is built in a tmpfs of our own
    and bind-mounted read-only over the image's ``/etc/ld.so.cache``. The
    loader reads only the cache, and nothing in a read-only container can
    rebuild it. Raises :class:`ReadOnlyRoot` where this cannot work: the image
    has no ``/etc/ld.so.cache`` to mount over, or a drop-in of ours from an
    earlier start would have to be removed.
    """
    import stat as _stat

    existing = current_dropin(root)
    if target is None and existing is not None:
        raise ReadOnlyRoot(f"the root is read-only: {DROPIN_PATH} from an earlier start cannot be removed")
    if target is None and not refresh:
        return [], []
    if target is not None:
        dropin_bytes(target, purpose)  # the same refusal of unnameable dirs as a drop-in
    try:
        regular = _stat.S_ISREG(root.lstat(LD_SO_CACHE).st_mode)
    except OSError:
        regular = False
    if not regular:
        raise ReadOnlyRoot(f"the root is read-only and the image has no regular {LD_SO_CACHE} to mount "
                           "a rebuilt cache over")
    from .mounts import bind_built_file

    ms: list = []

    def build(path: str) -> None:
        ms.append(run_ldconfig(config.ldconfig, root.host_path, [target] if target else [],
                               config.ldconfig_timeout, cache=path))

    done = bind_built_file(root, SCRATCH_DIR, "ld.so.cache", build, LD_SO_CACHE)
    if target is not None:
        done.insert(0, f"{target} passed to ldconfig (no drop-in: the root is read-only)")
    done.insert(len(done) - 1, f"ldconfig -r -C ({ms[0]} ms)")
    return [("ldconfig_mounted", target)], done


def lock_rootfs(state_dir: str, root, timeout: float) -> tuple:
    """An exclusive lock for changing this rootfs' ld cache: ``(fd or None, note or None)``.

    Concurrent hooks on one rootfs would race in ldconfig (its fixed
    ``/etc/ld.so.cache~`` temp file), so they are serialised; the caller
    plans again once it holds the lock and closes the fd when done. Host
    side (a file in the state dir, one of 1024 buckets by the rootfs' device
    and inode), so nothing in the image can hold it. Waits at most
    ``timeout`` seconds and then goes on unlocked (fd ``None``, the note
    says why) rather than failing.
    """
    import fcntl
    import time

    try:
        st = root.stat("/")
        d = os.path.join(state_dir, "locks")
        os.makedirs(d, mode=0o700, exist_ok=True)
        # 1024 buckets: unrelated rootfs rarely share one (32 at once: ~40% chance
        # of any collision, against ~99.9% with 64), and the files stay bounded.
        name = f"rootfs-{(st.st_dev * 1000003 + st.st_ino) % 1024:04d}.lock"
        fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        return None, f"not taken: {e.strerror or e}"
    deadline = time.monotonic() + timeout
    note = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, None
        except BlockingIOError:
            if time.monotonic() >= deadline:
                note = f"not taken: still held after {timeout} s"
                break
            time.sleep(0.005)
        except OSError as e:
            note = f"not taken: {e.strerror or e}"
            break
    os.close(fd)
    return None, note


def _wait(pid: int, deadline: float):
    """The child's wait status, or ``None`` once ``deadline`` (monotonic) passed."""
    import select
    import time

    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernel < 5.3: poll waitpid
        pidfd = None
    try:
        if pidfd is not None:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
        delay = 0.001
        while True:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                poller.poll(left * 1000)
            else:
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _spawn_limited(exe: str, argv: list, env: dict, w: int, limits) -> int:
    """``posix_spawn`` ``exe`` with stdout/stderr on ``w`` and the soft ``limits``."""
    import resource

    saved = []
    try:
        for res, val in limits:
            try:
                if res == resource.RLIMIT_CPU:
                    # The limit applies to our own CPU time while it is lowered:
                    # below what we have used, the kernel would kill *us*
                    # (SIGXCPU). The child starts counting at 0, so it gets the
                    # configured seconds plus what we had used (~0.03 s in a hook).
                    # The kernel checks its tick-sampled CPU time, which can run
                    # ahead of getrusage's (scaled to the precise runtime) by
                    # more than a second in a process that has run for minutes:
                    # a pytest run was killed so. Hence a margin that grows with it.
                    ru = resource.getrusage(resource.RUSAGE_SELF)
                    val += int((ru.ru_utime + ru.ru_stime) * 1.25) + 2
                soft, hard = resource.getrlimit(res)
                cap = val if hard == resource.RLIM_INFINITY else min(val, hard)
                if soft == resource.RLIM_INFINITY or soft > cap:
                    resource.setrlimit(res, (cap, hard))
                    saved.append((res, soft, hard))
            except (ValueError, OSError):
                pass
        return os.posix_spawn(exe, argv, env, setpgroup=0, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
    finally:
        for res, soft, hard in saved:
            try:
                resource.setrlimit(res, (soft, hard))
            except (ValueError, OSError):
                pass


def _setns_mount(pid: int) -> None:
    """Join the mount namespace of ``pid`` (child only: needs a single thread)."""
    import ctypes

    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x00020000) != 0:  # CLONE_NEWNS
        raise OSError(ctypes.get_errno(), "setns")
    os.close(fd)


def run_ldconfig(ldconfig: str, rootfs: str, extra_dirs=(), timeout: float = 10,
                 ns_pid: int | None = None, cache: str | None = None) -> int:
    """Run ``ldconfig -r rootfs``; returns its milliseconds, raises :class:`LdconfigError`.

    Not ``subprocess`` (whose import costs ~10 ms here). In our own mount
    namespace the child is started with ``posix_spawn`` (vfork: 0.6 ms
    against 1.3 ms for fork+exec of the hook's ~9 MB process) and inherits
    lowered *soft* rlimits, set around the spawn and restored after. With
    ``ns_pid`` it is a fork that joins that process's mount namespace first
    (see :func:`namespace_pid`) and sets its rlimits itself; the host
    ldconfig is opened before the join and executed from its descriptor, so
    the namespace cannot substitute it. The wait uses a pidfd with a timeout.
    ``cache``: the cache file to write, a path inside ``rootfs`` (``-C``).
    """
    import resource
    import time

    if not os.path.isabs(ldconfig) or not os.access(ldconfig, os.X_OK):
        raise LdconfigError(f"ldconfig not executable: {ldconfig}")
    argv = [ldconfig, "-r", rootfs] + (["-C", cache] if cache else []) + list(extra_dirs)  # argv[0] as configured
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    # Ubuntu's /sbin/ldconfig is a shell script around ldconfig.real: run
    # the real binary where it sits beside the configured one (as NVIDIA's
    # toolkit does).
    real = ldconfig + ".real"
    exe = real if os.access(real, os.X_OK) else ldconfig
    limits = ((resource.RLIMIT_CPU, int(timeout) + 1), (resource.RLIMIT_CORE, 0),
              (resource.RLIMIT_FSIZE, 64 << 20), (resource.RLIMIT_NOFILE, 1024),
              (resource.RLIMIT_AS, 4 << 30))
    # Output goes to a memfd, not a pipe: an image can make ldconfig print a
    # warning per file (500 files: 500 wake-ups, +4 ms), and a pipe that fills
    # would stall it. Only the tail is read, after it exits.
    w = os.memfd_create("compat-hook-ldconfig", os.MFD_CLOEXEC)
    t0 = time.monotonic()
    exe_fd = -1
    if not ns_pid:
        try:
            pid = _spawn_limited(exe, argv, env, w, limits)
        except OSError as e:
            os.close(w)
            raise LdconfigError(f"cannot start ldconfig: {e.strerror or e}") from None
    else:
        exe_fd = os.open(exe, os.O_RDONLY)
        pid = os.fork()
    if pid == 0:  # child: never return into Python code paths
        try:
            devnull = os.open("/dev/null", os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.closerange(3, exe_fd)
            os.closerange(exe_fd + 1, 65536)
            os.setpgid(0, 0)  # its own group: a timeout kills whatever it started
            _setns_mount(ns_pid)
            for res, val in limits:
                try:
                    soft, hard = resource.getrlimit(res)
                    cap = val if hard == resource.RLIM_INFINITY else min(val, hard)
                    resource.setrlimit(res, (cap, cap))
                except (ValueError, OSError):
                    pass
            os.chdir("/")
            # A script run from its descriptor needs /dev/fd/N open for its
            # interpreter (Python opens every fd close-on-exec).
            os.set_inheritable(exe_fd, True)
            os.execve(exe_fd, argv, env)  # fexecve: the binary opened before setns
        except BaseException as e:
            try:
                os.write(2, f"cannot start ldconfig: {e}\n".encode())
            except Exception:
                pass
        os._exit(127)
    if exe_fd >= 0:
        os.close(exe_fd)
    try:
        status = _wait(pid, t0 + timeout)
        if status is None:
            # SIGKILL to its process group (`import signal` pulls in enum, ~7 ms)
            try:
                os.killpg(pid, 9)
            except OSError:
                os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise LdconfigError(f"ldconfig timed out after {timeout} s")
        size = os.fstat(w).st_size
        out = os.pread(w, 8192, max(0, size - 8192))
    finally:
        os.close(w)
    ms = int((time.monotonic() - t0) * 1000)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        msg = out.decode("utf-8", "replace").strip().splitlines()
        raise LdconfigError(f"ldconfig exited {code}: {msg[-1][:200] if msg else 'no output'}")
    return ms
