"""Hostile-image test support: rootfs builders, the registered hook, host canaries.

Everything here runs the hook the way a runtime does: the argv, path and env
of the entry ``compat-hook hook-entry`` prints (``/usr/bin/python3 -m
compat_hook hook-entry --stage createContainer --config CFG --state-dir DIR``),
the OCI state JSON on stdin, cwd = the rootfs (runc's createContainer; the
worst case, since the image controls it), no other descriptors.

Host canaries (:class:`Canary`)
-------------------------------
A tree of host files and directories that hostile symlinks in an image point
at.  "Nothing outside the rootfs is created, changed or read" is checked by
comparing, for every canary entry, type, mode, uid/gid, size, inode, mtime,
ctime, atime and content, and by listing every canary directory for new
entries.

Reads are detected through atime.  This machine (and the CI machine kind)
mounts ``/`` ext4 ``relatime``: the kernel updates atime on a read only when
the old atime is not newer than mtime/ctime (or is a day old).  So before each
run every canary's atime is set to a day *before* its mtime; then any read of
a file, and any ``readdir`` of a directory, moves atime to now (see
``touch_atime`` in fs/inode.c).  ``lstat`` and ``O_PATH`` lookups do not.
:meth:`Canary.self_test` proves it works on the filesystem in use (a read is
seen, a plain lstat is not); where it does not (``noatime``), the canary
tree is put on a tmpfs mounted ``strictatime`` (unmounted by :meth:`close`).
Contents are compared *after* the stat comparison, since reading them sets
atimes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import json
import os
import pathlib
import socket
import stat
import struct
import subprocess
import threading
import time

from compat_hook.facts import elfgen
from tests.support.versions import HOST_535

Path = pathlib.Path

REPO = Path(__file__).resolve().parents[2]
HOOK_PYTHON = "/usr/bin/python3"
BUSYBOX = "/bin/busybox"
HOST_DRIVER = HOST_535
HOST_VERSION_LINE = (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {HOST_DRIVER}  "
                     "Wed Jul  2 13:16:27 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
COMPAT_VERSION = "590.44.01"
COMPAT_NAME = f"libcuda.so.{COMPAT_VERSION}"
COMPAT_DIR = "/usr/local/cuda/compat"
DROPIN = "etc/ld.so.conf.d/00-00-compat-hook.conf"
DROPIN_HEADER = "# compat-hook: CUDA forward compatibility for this container (rewritten at every start)\n"
#: the registered entry's timeout, and what a test allows a run to take
HOOK_TIMEOUT = 30

_MACHINE = os.uname().machine if os.uname().machine in ("x86_64", "aarch64") else "x86_64"


def elf(note: str | None = elfgen.NOTE_590, **kw) -> bytes:
    """A valid libcuda-like ELF stub for this machine (note 13.1 / drivers 535..590 by default)."""
    kw.setdefault("machine", _MACHINE)
    return elfgen.make_elf(note_json=note, **kw)


def dropin_text(compat_dir: str) -> str:
    return DROPIN_HEADER + compat_dir + "\n"


def escape(host_path, depth: int = 24) -> str:
    """A relative symlink target that leaves any rootfs: ``../`` x depth + the absolute host path."""
    return "../" * depth + os.fspath(host_path).lstrip("/")


# --------------------------------------------------------------------------- hook environment


@dataclasses.dataclass
class HookEnv:
    """One test's host side: fake host root, config, state dir, log, the registered entry."""

    base: Path
    host_root: Path
    config: Path
    state_dir: Path
    log: Path
    store_dir: Path
    entry: dict

    def log_lines(self) -> list[str]:
        try:
            return self.log.read_text(errors="surrogateescape").splitlines(keepends=True)
        except FileNotFoundError:
            return []

    def log_records(self) -> list[dict]:
        """Every log line parsed; asserts each is one whole JSON object ending in a newline."""
        out = []
        for line in self.log_lines():
            assert line.endswith("\n"), f"partial log line: {line!r}"
            rec = json.loads(line)
            assert isinstance(rec, dict), line
            out.append(rec)
        return out

    def last_record(self) -> dict:
        recs = self.log_records()
        assert recs, f"no log line in {self.log}"
        return recs[-1]


def write_config(path: Path, **values) -> Path:
    """A YAML config file (values are written as JSON, which is YAML)."""
    lines = [f"{k}: {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_hook_env(base: Path, *, on_error: str = "continue", stage: str = "createContainer",
                  **config) -> HookEnv:
    """Fake host (driver 535.261.03), config, state dir and the registered entry under ``base``."""
    base = Path(base)
    host = base / "host"
    (host / "proc/driver/nvidia").mkdir(parents=True, exist_ok=True)
    (host / "proc/driver/nvidia/version").write_text(HOST_VERSION_LINE)
    state = base / "state"
    state.mkdir(exist_ok=True)
    store = base / "store"
    store.mkdir(exist_ok=True)
    log = base / "hook.log"
    values = {"host_root": str(host), "log_file": str(log), "on_error": on_error, "dry_run": False,
              "ldconfig": "/sbin/ldconfig", "ldconfig_timeout": 3, "nvml": "off",
              "store_dir": str(store)}
    values.update(config)
    cfg = write_config(base / "config.yaml", **values)
    return HookEnv(base, host, cfg, state, log, store, registered_entry(str(cfg), str(state), stage))


@functools.lru_cache(maxsize=None)
def _entry_json(config: str | None, state_dir: str | None, stage: str) -> str:
    argv = [HOOK_PYTHON, "-m", "compat_hook", "hook-entry", "--stage", stage]
    argv += ["--config", config] if config else []
    argv += ["--state-dir", state_dir] if state_dir else []
    p = subprocess.run(argv,
                       cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
    if p.returncode != 0:
        raise RuntimeError(f"hook-entry failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def registered_entry(config: str | None, state_dir: str | None, stage: str = "createContainer") -> dict:
    """The OCI hook entry exactly as ``compat-hook hook-entry`` prints it."""
    e = json.loads(_entry_json(config, state_dir, stage))
    assert set(e) == {"path", "args", "env", "timeout"}, e
    assert os.path.isabs(e["path"]) and e["args"][0] == e["path"], e
    return e


def entry_env(entry: dict) -> dict:
    env = {}
    for item in entry["env"]:
        k, _, v = item.partition("=")
        env[k] = v
    return env


def state_json(bundle, **extra) -> bytes:
    d = {"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1, "bundle": os.fspath(bundle)}
    d.update(extra)
    return json.dumps(d).encode()


def write_bundle(bundle: Path, root_path: str | None = "rootfs", env=("NVIDIA_VISIBLE_DEVICES=all",),
                 spec: dict | None = None) -> Path:
    """A minimal config.json (root.path, process.env) in ``bundle``."""
    bundle = Path(bundle)
    bundle.mkdir(parents=True, exist_ok=True)
    if spec is None:
        spec = {"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": list(env), "cwd": "/"}}
        if root_path is not None:
            spec["root"] = {"path": root_path}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


@dataclasses.dataclass
class HookResult:
    rc: int
    stdout: bytes
    stderr: bytes
    duration: float

    def __str__(self) -> str:
        return (f"rc={self.rc} in {self.duration:.2f}s\nstdout={self.stdout[-2000:]!r}\n"
                f"stderr={self.stderr[-2000:]!r}")


def run_hook(entry: dict, stdin=b"", *, cwd=None, env: dict | None = None, args: list | None = None,
             preexec_fn=None, timeout: float | None = None) -> HookResult:
    """Run ``entry`` like runc: exec ``path`` with ``args`` and exactly ``env``, state on stdin.

    ``stdin``: bytes (fed through a pipe by a thread, so a hook that stops
    reading early is fine), ``None`` (fd 0 closed), or an int fd / file object
    used as is. ``env`` replaces the entry's env (the "runtime ignores env"
    case). A run past ``timeout`` (default the entry's) is killed and fails.
    """
    argv = list(entry["args"] if args is None else args)
    environ = entry_env(entry) if env is None else dict(env)
    timeout = entry["timeout"] if timeout is None else timeout
    feed = None
    if isinstance(stdin, (bytes, bytearray)):
        stdin_arg = subprocess.PIPE
    elif stdin is None:
        stdin_arg = subprocess.DEVNULL  # replaced by a closed fd 0 below
    else:
        stdin_arg = stdin

    def pre():
        if stdin is None:
            os.close(0)
        if preexec_fn is not None:
            preexec_fn()

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, executable=entry["path"], stdin=stdin_arg, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env=environ, close_fds=True,
                            preexec_fn=pre if (stdin is None or preexec_fn) else None,
                            start_new_session=True)
    if stdin_arg is subprocess.PIPE:
        def writer(data=bytes(stdin), pipe=proc.stdin):
            try:
                view = memoryview(data)
                while view:
                    n = pipe.write(view[: 1 << 20])
                    view = view[n:]
            except (BrokenPipeError, OSError, ValueError):
                pass
            finally:
                try:
                    pipe.close()
                except OSError:
                    pass

        feed = threading.Thread(target=writer, daemon=True)
        feed.start()
    try:
        out, err = _communicate(proc, timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise AssertionError(f"hook ran past its timeout of {timeout} s: {argv[:3]}")
    finally:
        if feed is not None:
            feed.join(10)
    return HookResult(proc.returncode, out, err, time.monotonic() - t0)


def _communicate(proc, timeout):
    # proc.stdin belongs to the feeder thread: read stdout/stderr only.
    outs = {}

    def drain(name, pipe):
        outs[name] = pipe.read()

    ts = [threading.Thread(target=drain, args=(n, p), daemon=True)
          for n, p in (("out", proc.stdout), ("err", proc.stderr))]
    for t in ts:
        t.start()
    proc.wait(timeout)
    for t in ts:
        t.join(10)
    proc.stdout.close()
    proc.stderr.close()
    return outs.get("out", b""), outs.get("err", b"")


# --------------------------------------------------------------------------- rootfs building


def put(root: Path, rel, value) -> None:
    """Create ``root/rel`` (str or bytes path): bytes/str content, or one of the node helpers."""
    p = os.path.join(os.fsencode(root), os.fsencode(rel).lstrip(b"/"))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    if callable(value):
        value(p)
    else:
        with open(p, "wb") as f:
            f.write(value.encode() if isinstance(value, str) else bytes(value))


def symlink(target):
    return lambda p: os.symlink(target, p)


def fifo(p):
    os.mkfifo(p)


def chardev(major: int = 1, minor: int = 5):
    """A character device node; the default 1:5 is /dev/zero, endless if it were ever read."""
    return lambda p: os.mknod(p, stat.S_IFCHR | 0o644, os.makedev(major, minor))


def directory(p):
    os.makedirs(p, exist_ok=True)


def unix_socket(p):
    # bind() takes at most 108 bytes: bind the base name from inside the directory.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.chdir(os.path.dirname(p))
        s.bind(os.path.basename(p))
    finally:
        os.fchdir(old)
        os.close(old)
        s.close()


def sparse(size: int, head: bytes = b"", tail: bytes = b""):
    """A sparse file of ``size`` bytes with ``head`` at 0 and ``tail`` at the end."""
    def make(p):
        with open(p, "wb") as f:
            f.write(head)
            f.truncate(size)
            if tail:
                f.seek(size - len(tail))
                f.write(tail)
    return make


def base_rootfs(root: Path, *, compat: bool = True, ld_so_conf: bool = True) -> Path:
    """A small image tree: /etc/ld.so.conf(.d), and the compat lib in /usr/local/cuda/compat."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for d in ("etc/ld.so.conf.d", "usr/lib", "tmp", "proc", "sys", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    if ld_so_conf:
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/libc.conf").write_text("/usr/local/lib\n")
    if compat:
        d = root / COMPAT_DIR.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / COMPAT_NAME).write_bytes(elf())
        os.symlink(COMPAT_NAME, d / "libcuda.so.1")
    return root


def busybox_rootfs(root: Path, *, compat: bool = True) -> Path:
    """:func:`base_rootfs` plus a static busybox, enough for ``runc run``."""
    base_rootfs(root, compat=compat)
    (root / "bin").mkdir(exist_ok=True)
    dst = root / "bin/busybox"
    with open(BUSYBOX, "rb") as src, open(dst, "wb") as out:
        out.write(src.read())
    os.chmod(dst, 0o755)
    for a in ("sh", "cat", "ls", "echo", "true"):
        os.symlink("busybox", root / "bin" / a)
    return root


def resolve_in_root(root, path) -> bytes:
    """The host path of container path ``path``, resolved like RESOLVE_IN_ROOT (test-side, independent).

    Symlinks are followed with ``..`` and absolute targets clamped to ``root``;
    a missing component ends the walk (the rest is appended as is).
    """
    root = os.fsencode(root).rstrip(b"/")
    todo = [c for c in os.fsencode(path).split(b"/") if c and c != b"."][::-1]
    done: list = []
    links = 0
    while todo:
        c = todo.pop()
        if c == b"..":
            if done:
                done.pop()
            continue
        p = root + b"/" + b"/".join(done + [c])
        if os.path.islink(p):
            links += 1
            if links > 40:
                raise OSError(errno.ELOOP, "too many links", p)
            t = os.readlink(p)
            if t.startswith(b"/"):
                done = []
            todo.extend([x for x in t.split(b"/") if x and x != b"."][::-1])
            continue
        done.append(c)
        if not os.path.lexists(p):
            done.extend(reversed(todo))
            break
    return root + b"/" + b"/".join(done)


def read_in_root(root, path) -> bytes:
    with open(resolve_in_root(root, path), "rb") as f:
        return f.read()


def rm_tree(path) -> None:
    """Remove a tree that may hold FIFOs, devices, odd names or thousands of levels.

    Iterative, with one directory descriptor at a time (``..`` to go back up),
    so neither Python's recursion limit nor PATH_MAX nor RLIMIT_NOFILE gets
    in the way (pytest's own cleanup, shutil.rmtree, fails on such a tree).
    Never follows a symlink.
    """
    path = os.fsencode(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags)
    names: list = []
    try:
        while True:
            sub = None
            for name in os.listdir(fd):
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    sub = name
                    break
                os.unlink(name, dir_fd=fd)
            if sub is not None:
                nfd = os.open(sub, flags, dir_fd=fd)
                os.close(fd)
                fd = nfd
                names.append(sub)
                continue
            if not names:
                break
            up = os.open("..", flags & ~os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = up
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


# --------------------------------------------------------------------------- hostile ELF files


def _shdr_offset(data: bytes) -> tuple[int, int]:
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    return shoff, struct.unpack_from("<H", data, 0x3A)[0]


def note_section_index(data: bytes) -> int:
    """Index of the .note.cuda.fwd_compatibility section header in an elfgen ELF64 LE file."""
    shoff, shentsize = _shdr_offset(data)
    shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
    str_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        name = struct.unpack_from("<I", data, shoff + i * shentsize)[0]
        end = data.index(b"\0", str_off + name)
        if data[str_off + name:end] == elfgen.NOTE_NAME.encode():
            return i
    raise ValueError("no note section")


def big_note_elf(descsz: int, file_size: int):
    """A node factory: an ELF whose note (and section) claim ``descsz`` bytes, sparse to ``file_size``."""
    data = bytearray(elf(note_descsz=descsz))
    shoff, shentsize = _shdr_offset(data)
    i = note_section_index(bytes(data))
    struct.pack_into("<Q", data, shoff + i * shentsize + 0x20, descsz + 64)  # sh_size
    return sparse(file_size, bytes(data))


def sparse_elf_table_at_end(size: int):
    """A sparse file of ``size`` bytes: a valid ELF header whose section table sits at the very end."""
    data = elf()
    shoff, shentsize = _shdr_offset(data)
    table = data[shoff:]
    new_shoff = size - len(table)
    head = bytearray(data[:shoff])
    struct.pack_into("<Q", head, 0x28, new_shoff)
    return sparse(size, bytes(head), table)


# --------------------------------------------------------------------------- canaries


_DAY_NS = 86400 * 10**9


class Canary:
    """A host tree that must stay untouched (see the module docstring).

    ``files`` maps relative paths to contents; directories are created as
    needed. ``missing`` names paths that must still not exist afterwards
    (where a dangling hostile symlink points).
    """

    def __init__(self, base: Path, files: dict, missing=()) -> None:
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self._mounted = False
        if not self._atime_works(self.base):
            subprocess.run(["mount", "-t", "tmpfs", "-o", "strictatime,size=16m,mode=0755", "canary",
                            str(self.base)], check=True, capture_output=True)
            self._mounted = True
        self.files = {rel: (v.encode() if isinstance(v, str) else bytes(v)) for rel, v in files.items()}
        self.missing = [self.base / m for m in missing]
        dirs = {self.base}
        for rel, data in self.files.items():
            p = self.base / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            os.chmod(p, 0o640)
            d = p.parent
            while d != self.base:
                dirs.add(d)
                d = d.parent
        self.dirs = sorted(dirs)
        self.paths = self.dirs + [self.base / rel for rel in self.files]
        self.arm()

    @staticmethod
    def _atime_works(d: Path) -> bool:
        p = d / ".atime-probe"
        p.write_bytes(b"x")
        st = os.stat(p)
        os.utime(p, ns=(st.st_mtime_ns - _DAY_NS, st.st_mtime_ns))
        before = os.stat(p).st_atime_ns
        with open(p, "rb") as f:
            f.read()
        ok = os.stat(p).st_atime_ns != before
        os.unlink(p)
        return ok

    def arm(self) -> None:
        """Set every atime a day before its mtime (so the next read shows) and take the snapshot."""
        for p in self.paths:
            st = os.lstat(p)
            os.utime(p, ns=(st.st_mtime_ns - _DAY_NS, st.st_mtime_ns), follow_symlinks=False)
        self.before = {p: self._stat(p) for p in self.paths}
        self.listing = {d: sorted(os.listdir(d)) for d in self.dirs}
        # listdir read the directories: arm them again (only their atimes move).
        for d in self.dirs:
            st = os.lstat(d)
            os.utime(d, ns=(st.st_mtime_ns - _DAY_NS, st.st_mtime_ns))
        self.before = {p: self._stat(p) for p in self.paths}

    @staticmethod
    def _stat(p: Path) -> tuple:
        st = os.lstat(p)
        return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_ino,
                st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_atime_ns)

    def changes(self) -> list[str]:
        """What differs from the armed snapshot ([] when untouched). Re-arms afterwards."""
        out = []
        fields = ("type", "mode", "uid", "gid", "ino", "size", "mtime", "ctime", "atime")
        for p in self.paths:
            try:
                now = self._stat(p)
            except FileNotFoundError:
                out.append(f"{p}: removed")
                continue
            for name, a, b in zip(fields, self.before[p], now):
                if a != b:
                    out.append(f"{p}: {name} {a} -> {b}" + (" (read)" if name == "atime" else ""))
        for p in self.missing:
            if os.path.lexists(p):
                out.append(f"{p}: created")
        for rel, data in self.files.items():
            p = self.base / rel
            if p.is_file() and p.read_bytes() != data:
                out.append(f"{p}: content changed")
        for d in self.dirs:
            if d.is_dir():
                now = sorted(os.listdir(d))
                if now != self.listing[d]:
                    out.append(f"{d}: entries {self.listing[d]} -> {now}")
        self.arm()
        return out

    def self_test(self) -> None:
        """Prove that a read, a directory listing and a write are all detected here."""
        f = self.base / next(iter(self.files))
        os.lstat(f)
        assert self.changes() == [], "an lstat must not count as a read"
        f.read_bytes()
        assert any("atime" in c for c in self.changes()), "a file read went unnoticed"
        os.listdir(self.dirs[0])
        assert any("atime" in c for c in self.changes()), "a directory listing went unnoticed"
        (self.base / "new").write_bytes(b"")
        assert any("entries" in c for c in self.changes()), "a created file went unnoticed"
        os.unlink(self.base / "new")
        self.arm()

    def close(self) -> None:
        if self._mounted:
            subprocess.run(["umount", str(self.base)], check=True, capture_output=True)
            self._mounted = False


def host_tree_snapshot(base: Path, exclude=()) -> dict:
    """name -> (type, size, mtime) of everything under ``base`` except ``exclude`` subtrees (lstat only)."""
    out = {}
    exclude = {os.fsencode(s) for s in exclude}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(base)):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in exclude]
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if p in exclude:
                continue
            st = os.lstat(p)
            out[p] = (stat.S_IFMT(st.st_mode), st.st_size if not stat.S_ISDIR(st.st_mode) else 0,
                      st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else 0)
    return out


# --------------------------------------------------------------------------- namespaces, mounts, leaks

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def check_rc(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def readonly_rootfs_preexec(rootfs: Path):
    """A ``preexec_fn``: a private mount namespace in which ``rootfs`` is a read-only bind mount.

    It then proves the rootfs really is read-only there (a create must fail
    with EROFS) before the hook is exec'd; exit status 97 if it is not. The
    namespace dies with the hook, so nothing can leak onto the host.
    """
    r = os.fsencode(rootfs)

    def pre():
        check_rc(libc.unshare(CLONE_NEWNS), "unshare")
        check_rc(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        check_rc(libc.mount(r, r, None, MS_BIND | MS_REC, None), "bind")
        check_rc(libc.mount(None, r, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None), "remount ro")
        for probe in (b"/.rw-probe", b"/etc/.rw-probe", b"/etc/ld.so.conf.d/.rw-probe"):
            try:
                fd = os.open(r + probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError as e:
                if e.errno != errno.EROFS:
                    os._exit(97)
                continue
            os.close(fd)
            os._exit(97)

    return pre


def processes_mentioning(needle: str) -> list[str]:
    """``pid: cmdline`` of live processes whose cmdline or cwd contains ``needle``."""
    me = os.getpid()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
        except OSError:
            continue
        if needle in cmd or needle in cwd:
            out.append(f"{pid}: {cmd[:200]} (cwd {cwd})")
    return out


# --------------------------------------------------------------------------- LD_PRELOAD marker library

MARKER_SO_SRC = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void compat_hook_test_marker(void)
{
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "preloaded\n", 10); close(fd); }
}
"""


def build_marker_so(out: Path, marker: Path) -> Path:
    """Compile a shared object whose constructor appends to ``marker`` (gcc)."""
    src = out.with_suffix(".c")
    src.write_text(MARKER_SO_SRC)
    p = subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f'-DMARKER="{marker}"', "-o", str(out), str(src)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"gcc failed: {p.stderr.strip()}")
    return out


MARKER_EXE_SRC = r"""
#include <fcntl.h>
#include <unistd.h>
int main(void)
{
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "executed\n", 9); close(fd); }
    return 0;
}
"""


def build_marker_exe(out: Path, marker: Path) -> Path:
    """Compile a static program that appends to ``marker`` (stands in for a hostile "ldconfig")."""
    src = out.with_suffix(".c")
    src.write_text(MARKER_EXE_SRC)
    p = subprocess.run(["gcc", "-static", "-O1", f'-DMARKER="{marker}"', "-o", str(out), str(src)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"gcc failed: {p.stderr.strip()}")
    return out
