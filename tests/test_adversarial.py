"""Hostile images: the hook, run exactly as registered, against crafted rootfs trees.

Each case is one image an attacker could ship (symlinks out of the rootfs,
pre-planted ld.so files pointing at the host, a libcuda candidate that is a
FIFO / device / 2 GB sparse file / broken ELF, a read-only rootfs, names with
newlines and non-UTF-8 bytes). For every one:

* the hook finishes well within its timeout and exits 0 (fail-open: the
  default ``on_error: continue``), with no traceback and one whole JSON log line;
* nothing outside the rootfs is created, changed or read: a host canary tree
  (the targets of the hostile symlinks) keeps content, mode, owner, inode,
  size, mtime, ctime and atime (see tests/support/hostile.py for why atimes
  are reliable here), no new entries appear in it or next to the bundle, and
  no host ``/etc/ld.so.conf.d/00-00-compat-hook.conf`` appears;
* the case's own expectation on the decision holds (no compat from a host
  file; a drop-in only where it belongs).

A few representative images also start as real runc/crun containers with the
hook registered at createContainer (the container must still start).
"""

from __future__ import annotations

import os
import pathlib
import resource
import struct
import subprocess

import pytest

from compat_hook.core import logjson
from tests.support import hostile as h
from tests.support import runtimes as rt

Path = pathlib.Path

HOST_DROPIN = Path("/etc/ld.so.conf.d/00-00-compat-hook.conf")

#: the host tree every hostile symlink points into
CANARY_FILES = {
    "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n# host file\n",
    "etc/ld.so.conf.d/host.conf": "/host/only/lib\n",
    "etc/ld.so.conf.d/00-00-compat-hook.conf": "# the host's own file of that name\n",
    "etc/ld.so.cache": b"host ld cache\0",
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
    "cuda/compat/" + h.COMPAT_NAME: h.elf(),
    "usrlocal/cuda/compat/" + h.COMPAT_NAME: h.elf(),
    "usr/local/cuda/compat/" + h.COMPAT_NAME: h.elf(),
    "lib/libcuda.so.host": h.elf(),
    "planted": "a host file\n",
}
CANARY_MISSING = ("missing-dir", "etc/ld.so.conf.d/.compat-hook-probe")


class Case:
    def __init__(self, name, build, *, expect=None, compat=True, timeout=None):
        self.name, self.build, self.expect, self.compat = name, build, expect, compat
        self.timeout = timeout


CASES: list[Case] = []


def case(name, *, expect=None, compat=True):
    def deco(fn):
        CASES.append(Case(name, fn, expect=expect, compat=compat))
        return fn
    return deco


def _compat(root: Path) -> Path:
    return root / h.COMPAT_DIR.lstrip("/")


def _replace_compat_dir(root: Path, target: str) -> None:
    h.rm_tree(_compat(root))
    os.symlink(target, _compat(root))


def _candidate(root: Path) -> bytes:
    return os.path.join(os.fsencode(_compat(root)), h.COMPAT_NAME.encode())


def _replace_candidate(root: Path, node) -> None:
    os.unlink(_candidate(root))
    node(_candidate(root))


# -- expectations on the log record -------------------------------------------------


def no_candidate(rec, root, host):
    assert rec.get("candidate") is None, rec
    assert rec["decision"] != "enable", rec
    assert not os.path.lexists(h.resolve_in_root(root, h.DROPIN)), "a drop-in for a compat dir not in the image"


def not_enabled(rec, root, host):
    assert rec["decision"] != "enable" or rec.get("reason") != "compat_newer_supported" or \
        not os.path.isfile(h.resolve_in_root(root, h.DROPIN)), rec


def failed_open(rec, root, host):
    """The hook could not apply the decision: logged as an error, the container starts without compat."""
    assert rec["decision"] == "error", rec
    assert rec["outcome"].startswith("container starts without compat"), rec


def candidate_refused(rec, root, host):
    """The candidate is a regular file but unusable: handled as a decision, never an error."""
    assert rec["candidate"] == h.COMPAT_NAME, rec
    assert rec["decision"] in ("enable", "skip"), rec


def not_elf_skip(rec, root, host):
    candidate_refused(rec, root, host)
    assert rec["decision"] == "skip", rec


def enabled_in_root(rec, root, host):
    assert rec["decision"] == "enable", rec
    assert h.read_in_root(root, h.DROPIN).decode() == h.dropin_text(rec["compat_dir"]), rec
    cache = h.resolve_in_root(root, "/etc/ld.so.cache")
    assert os.path.isfile(cache) and not os.path.islink(cache)


# -- 1. the compat dir, or a parent, escaping the rootfs ---------------------------


@case("compat-dir-symlink-relative-escape", expect=no_candidate)
def _(root, host):
    _replace_compat_dir(root, h.escape(host / "cuda/compat"))


@case("compat-dir-symlink-absolute-host-path", expect=no_candidate)
def _(root, host):
    _replace_compat_dir(root, str(host / "cuda/compat"))


@case("compat-dir-symlink-absolute-dotdot", expect=no_candidate)
def _(root, host):
    _replace_compat_dir(root, "/../../../../.." + str(host / "cuda/compat"))


@case("cuda-parent-symlink-relative-escape", expect=no_candidate)
def _(root, host):
    h.rm_tree(root / "usr/local/cuda")
    os.symlink(h.escape(host / "cuda"), root / "usr/local/cuda")


@case("cuda-parent-symlink-absolute", expect=no_candidate)
def _(root, host):
    h.rm_tree(root / "usr/local/cuda")
    os.symlink(str(host / "cuda"), root / "usr/local/cuda")


@case("usr-local-symlink-absolute", expect=no_candidate)
def _(root, host):
    h.rm_tree(root / "usr/local")
    os.symlink(str(host / "usrlocal"), root / "usr/local")


@case("usr-symlink-relative-escape", expect=no_candidate)
def _(root, host):
    h.rm_tree(root / "usr")
    os.symlink(h.escape(host / "usr", depth=3), root / "usr")


@case("compat-dir-symlink-loop", expect=no_candidate)
def _(root, host):
    h.rm_tree(root / "usr/local/cuda")
    os.symlink("cuda", root / "usr/local/cuda")


@case("compat-dir-symlink-chain-of-60", expect=no_candidate)
def _(root, host):
    h.rm_tree(root / "usr/local/cuda")
    for i in range(60):
        os.symlink(f"l{i + 1}", root / f"usr/local/l{i}")
    os.symlink(str(host / "cuda"), root / "usr/local/l60")
    os.symlink("l0", root / "usr/local/cuda")


# -- 2. /etc, ld.so.conf(.d), ld.so.cache and the drop-in pre-planted as links -------


@case("etc-symlink-absolute-host", expect=failed_open)
def _(root, host):
    h.rm_tree(root / "etc")
    os.symlink(str(host / "etc"), root / "etc")


@case("etc-symlink-relative-escape", expect=failed_open)
def _(root, host):
    h.rm_tree(root / "etc")
    os.symlink(h.escape(host / "etc"), root / "etc")


@case("etc-symlink-absolute-mirrored-in-root", expect=enabled_in_root)
def _(root, host):
    # The link's in-root target exists: everything lands there, inside the image.
    h.rm_tree(root / "etc")
    mirror = root / str(host / "etc").lstrip("/")
    (mirror / "ld.so.conf.d").mkdir(parents=True)
    (mirror / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    os.symlink(str(host / "etc"), root / "etc")


@case("ld.so.conf.d-symlink-absolute-host", expect=failed_open)
def _(root, host):
    h.rm_tree(root / "etc/ld.so.conf.d")
    os.symlink(str(host / "etc/ld.so.conf.d"), root / "etc/ld.so.conf.d")


@case("ld.so.conf.d-symlink-relative-escape", expect=failed_open)
def _(root, host):
    h.rm_tree(root / "etc/ld.so.conf.d")
    os.symlink(h.escape(host / "etc/ld.so.conf.d"), root / "etc/ld.so.conf.d")


@case("ld.so.conf.d-symlink-dangling-host-dir", expect=failed_open)
def _(root, host):
    h.rm_tree(root / "etc/ld.so.conf.d")
    os.symlink(str(host / "missing-dir"), root / "etc/ld.so.conf.d")


@case("ld.so.conf-symlink-absolute-host", expect=enabled_in_root)
def _(root, host):
    os.unlink(root / "etc/ld.so.conf")
    os.symlink(str(host / "etc/ld.so.conf"), root / "etc/ld.so.conf")


@case("ld.so.conf-symlink-relative-escape", expect=enabled_in_root)
def _(root, host):
    os.unlink(root / "etc/ld.so.conf")
    os.symlink(h.escape(host / "etc/ld.so.conf"), root / "etc/ld.so.conf")


@case("ld.so.cache-symlink-absolute-host", expect=enabled_in_root)
def _(root, host):
    os.symlink(str(host / "etc/ld.so.cache"), root / "etc/ld.so.cache")


@case("ld.so.cache-symlink-relative-escape", expect=enabled_in_root)
def _(root, host):
    os.symlink(h.escape(host / "etc/ld.so.cache"), root / "etc/ld.so.cache")


@case("dropin-symlink-absolute-host-file", expect=enabled_in_root)
def _(root, host):
    os.symlink(str(host / "etc/ld.so.conf.d/00-00-compat-hook.conf"), root / h.DROPIN)


@case("dropin-symlink-relative-escape", expect=enabled_in_root)
def _(root, host):
    os.symlink(h.escape(host / "planted"), root / h.DROPIN)


@case("dropin-symlink-dangling-host-path", expect=enabled_in_root)
def _(root, host):
    os.symlink(str(host / "missing-dir/dropin.conf"), root / h.DROPIN)


@case("dropin-name-is-a-directory", expect=failed_open)
def _(root, host):
    (root / h.DROPIN).mkdir()
    (root / h.DROPIN / "keep").write_text("x")


@case("ld.so.conf.d-is-a-file", expect=failed_open)
def _(root, host):
    h.rm_tree(root / "etc/ld.so.conf.d")
    (root / "etc/ld.so.conf.d").write_text("not a dir\n")


@case("ld.so.conf-is-a-fifo", expect=failed_open)
def _(root, host):
    # compat-hook refuses to read it; the host ldconfig (in its chroot) would
    # block on it forever and is killed at ldconfig_timeout.
    os.unlink(root / "etc/ld.so.conf")
    os.mkfifo(root / "etc/ld.so.conf")


@case("ld.so.cache-tempfile-is-a-fifo", expect=failed_open)
def _(root, host):
    os.mkfifo(root / "etc/ld.so.cache~")


@case("ld.so.conf-8GB-sparse", expect=failed_open)
def _(root, host):
    # One 8 GiB line: more than ldconfig may buffer (RLIMIT_AS 4 GiB) and
    # more than it reads within ldconfig_timeout, so it fails either way.
    # (At 2 GiB it sometimes finished inside the 3 s timeout: a flaky case.)
    os.unlink(root / "etc/ld.so.conf")
    h.sparse(8 << 30, b"include /etc/ld.so.conf.d/*.conf\n")(os.fsencode(root / "etc/ld.so.conf"))


# -- 3. the libcuda candidate itself -----------------------------------------------


@case("candidate-symlink-absolute-host-file", expect=no_candidate)
def _(root, host):
    _replace_candidate(root, h.symlink(str(host / "lib/libcuda.so.host")))


@case("candidate-symlink-relative-escape", expect=no_candidate)
def _(root, host):
    _replace_candidate(root, h.symlink(h.escape(host / "lib/libcuda.so.host")))


@case("candidate-fifo", expect=no_candidate)
def _(root, host):
    _replace_candidate(root, h.fifo)


@case("candidate-char-device-dev-zero", expect=no_candidate)
def _(root, host):
    _replace_candidate(root, h.chardev(1, 5))


@case("candidate-unix-socket", expect=no_candidate)
def _(root, host):
    _replace_candidate(root, h.unix_socket)


@case("candidate-directory", expect=no_candidate)
def _(root, host):
    _replace_candidate(root, h.directory)


@case("candidate-0-bytes", expect=not_elf_skip)
def _(root, host):
    _replace_candidate(root, lambda p: open(p, "wb").close())


@case("candidate-2GB-sparse-zeros", expect=not_elf_skip)
def _(root, host):
    _replace_candidate(root, h.sparse(2 << 30))


@case("candidate-2GB-sparse-elf-table-at-end", expect=candidate_refused)
def _(root, host):
    _replace_candidate(root, h.sparse_elf_table_at_end(2 << 30))


@case("candidate-truncated-elf-header", expect=not_elf_skip)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf()[:40]))


@case("candidate-truncated-elf-sections", expect=not_elf_skip)
def _(root, host):
    data = h.elf()
    _replace_candidate(root, lambda p: h.put(b"/", p, data[: len(data) - 100]))


@case("candidate-elf-shnum-0xffff", expect=not_elf_skip)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(shnum_override=0xFFFF)))


@case("candidate-elf-shoff-2**63", expect=not_elf_skip)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(shoff_override=1 << 63)))


@case("candidate-elf-extended-numbering-2**64-sections", expect=not_elf_skip)
def _(root, host):
    data = bytearray(h.elf(shnum_override=0))
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    struct.pack_into("<Q", data, shoff + 0x20, (1 << 64) - 1)  # section 0 sh_size
    _replace_candidate(root, lambda p: h.put(b"/", p, bytes(data)))


@case("candidate-elf-shentsize-bogus", expect=not_elf_skip)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(shentsize_override=7)))


@case("candidate-elf-shstrndx-out-of-range", expect=not_elf_skip)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(shstrndx_override=0xFFF0)))


@case("candidate-note-namesz-4GiB", expect=candidate_refused)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(note_namesz=0xFFFFFFFF)))


@case("candidate-note-descsz-4GiB", expect=candidate_refused)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(note_descsz=0xFFFFFFFF)))


@case("candidate-note-claims-100MB-desc", expect=candidate_refused)
def _(root, host):
    _replace_candidate(root, h.big_note_elf(100 << 20, 110 << 20))


@case("candidate-note-section-size-2**63", expect=candidate_refused)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(note_section_size=1 << 63)))


@case("candidate-note-json-nested-30000-deep", expect=candidate_refused)
def _(root, host):
    _replace_candidate(root, lambda p: h.put(b"/", p, h.elf(note="[" * 30000 + "]" * 30000)))


@case("compat-dir-1000-candidates", expect=no_candidate)
def _(root, host):
    for i in range(1000):
        (_compat(root) / f"libcuda.so.590.{i}.01").write_bytes(b"")


@case("compat-dir-4000-other-entries", expect=enabled_in_root)
def _(root, host):
    for i in range(4000):
        os.symlink("/nowhere", _compat(root) / f"x{i}")


def _deep_compat(root: Path, levels: int) -> None:
    """/usr/local/cuda -> deep/d/d/.../d (``levels`` deep, past PATH_MAX) holding compat/libcuda."""
    fd = os.open(root / "usr/local", os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir("deep", dir_fd=fd)
    cur = os.open("deep", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    for _ in range(levels):
        os.mkdir("d", dir_fd=cur)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = nxt
    os.mkdir("compat", dir_fd=cur)
    lib = os.open("compat/" + h.COMPAT_NAME, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=cur)
    os.write(lib, h.elf())
    os.close(lib)
    os.close(cur)
    h.rm_tree(root / "usr/local/cuda")
    os.symlink("deep/" + "d/" * levels, root / "usr/local/cuda")


def deep_enabled(rec, root, host):
    assert rec["decision"] == "enable", rec["decision"]
    assert rec["compat_dir"] == "/usr/local/deep" + "/d" * 1500 + "/compat", rec["compat_dir"][:100]


@case("compat-dir-1500-levels-deep", expect=deep_enabled)
def _(root, host):
    _deep_compat(root, 1500)


LOW_NOFILE = "compat-dir-1500-levels-deep-with-256-fds"


@case(LOW_NOFILE, expect=no_candidate)
def _(root, host):
    _deep_compat(root, 1500)  # the walk runs out of descriptors (EMFILE): no compat, no crash


# -- 4. names with newlines and non-UTF-8 bytes --------------------------------------


def _move_cuda(root: Path, name: bytes) -> None:
    local = os.fsencode(root / "usr/local")
    os.rename(os.path.join(local, b"cuda"), os.path.join(local, name))
    os.symlink(name, os.path.join(local, b"cuda"))


def no_raw_control_chars(rec, root, host):
    """Whatever the decision, a drop-in never holds a line the image smuggled in."""
    try:
        text = h.read_in_root(root, h.DROPIN)
    except FileNotFoundError:
        return
    lines = text.decode("utf-8", "surrogateescape").splitlines()
    assert len(lines) == 2 and lines[0] == h.DROPIN_HEADER.rstrip("\n"), text
    assert rec["decision"] == "enable" and lines[1] == rec["compat_dir"], (text, rec)


@case("cuda-dir-name-with-newline", expect=no_raw_control_chars)
def _(root, host):
    _move_cuda(root, b"cuda-12.4\ninclude host.conf\n")


@case("cuda-dir-name-non-utf8", expect=no_raw_control_chars)
def _(root, host):
    _move_cuda(root, b"cuda-\xff\xfe\x80")


@case("candidate-name-with-newline", expect=not_enabled)
def _(root, host):
    os.rename(_candidate(root), os.path.join(os.fsencode(_compat(root)), b"libcuda.so.590.44.01\n"))


@case("candidate-name-non-utf8", expect=not_enabled)
def _(root, host):
    os.rename(_candidate(root), os.path.join(os.fsencode(_compat(root)), b"libcuda.so.590.44.\xff"))


# -- 5. a read-only rootfs --------------------------------------------------------------

READONLY = "rootfs-read-only-bind-mount"


def read_only_refused(rec, root, host):
    failed_open(rec, root, host)
    # said as such, before anything is written; and a failed run claims no maps
    assert rec["reason"] == "read_only_root" and "is read-only" in rec["error"] and "maps" not in rec, rec


@case(READONLY, expect=read_only_refused)
def _(root, host):
    pass  # made read-only in the hook's own mount namespace (see test_hostile_image)


# ------------------------------------------------------------------------------- the test


@pytest.fixture(autouse=True)
def _no_leaks(tmp_path):
    yield
    assert rt.mounts_under(tmp_path) == [], "a mount leaked"
    assert h.processes_mentioning(str(tmp_path)) == [], "a process outlived its test"


@pytest.fixture
def canary(tmp_path):
    c = h.Canary(tmp_path / "host-canary", CANARY_FILES, CANARY_MISSING)
    yield c
    c.close()


def test_case_count():
    assert len(CASES) >= 25
    assert len({c.name for c in CASES}) == len(CASES)


def test_canary_detects_reads_writes_and_creates(canary):
    canary.self_test()


def _host_side(tmp_path: Path, bundle: Path, env: h.HookEnv) -> dict:
    # the log's spool (made beside the log by the first line written) is the log's own
    return h.host_tree_snapshot(tmp_path, exclude=[str(bundle), str(env.state_dir), str(env.log),
                                                logjson.spool_dir(str(env.log)), str(tmp_path / "host-canary")])


# Seconds each: the first three wait out the hook's ldconfig_timeout (a blocked or endless
# ldconfig is killed), the others build thousands of entries or levels.
SLOW_CASES = {"ld.so.conf-is-a-fifo", "ld.so.cache-tempfile-is-a-fifo", "ld.so.conf-8GB-sparse",
              "compat-dir-4000-other-entries", "compat-dir-1500-levels-deep", LOW_NOFILE,
              "compat-dir-1000-candidates"}


@pytest.mark.parametrize("c", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.name in SLOW_CASES else [])
                               for c in CASES])
def test_hostile_image(c, tmp_path, canary):
    env = h.make_hook_env(tmp_path / "hookenv")
    bundle = h.write_bundle(tmp_path / "bundle")
    root = h.base_rootfs(bundle / "rootfs", compat=c.compat)
    c.build(root, canary.base)
    canary.arm()
    before = _host_side(tmp_path, bundle, env)
    host_dropin = HOST_DROPIN.exists()

    pre = h.readonly_rootfs_preexec(root) if c.name == READONLY else None
    if "levels-deep" in c.name:
        # Holding 1500 directory fds needs more than a 1024 soft limit; the other deep case has 256.
        nofile = 256 if c.name == LOW_NOFILE else min(8192, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        pre = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))  # noqa: E731
    try:
        res = h.run_hook(env.entry, h.state_json(bundle), cwd=root, preexec_fn=pre)
    finally:
        if "levels-deep" in c.name:
            h.rm_tree(root / "usr/local/deep")  # past shutil.rmtree's recursion limit: pytest could not

    assert res.rc == 0, res
    assert res.duration < h.HOOK_TIMEOUT / 2, res
    assert b"Traceback" not in res.stdout + res.stderr, res
    assert canary.changes() == []
    assert _host_side(tmp_path, bundle, env) == before, "something was created next to the bundle"
    assert HOST_DROPIN.exists() == host_dropin
    recs = env.log_records()
    assert len(recs) == 1, recs
    rec = recs[0]
    assert "Traceback" not in str(rec)
    assert rec["decision"] in ("enable", "skip", "error"), rec
    if rec["decision"] == "error":
        assert rec["reason"] != "internal_error", rec
    confd = os.fsencode(root / "etc/ld.so.conf.d")
    if os.path.isdir(confd) and not os.path.islink(confd):
        assert [n for n in os.listdir(confd) if n.endswith(b".tmp")] == []
    if c.expect is not None:
        c.expect(rec, root, canary.base)


# ------------------------------------------------------------------- races (TOCTOU)

_FLIPPER = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
pairs = [(a.encode(), b.encode()) for a, b in zip(sys.argv[1::2], sys.argv[2::2])]
print("ready", flush=True)
while True:
    for a, b in pairs:
        libc.renameat2(-100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE: an atomic swap
"""


@pytest.mark.slow
def test_paths_swapped_for_escaping_links_during_the_run(tmp_path, canary):
    """While hooks run, another process keeps swapping real dirs/files with links to the host.

    The walk is one component at a time on O_PATH descriptors, never ``..`` on
    disk, creates are O_EXCL|O_NOFOLLOW under a confined dir fd: whichever
    state each lookup sees, it stays in the rootfs.
    """
    env = h.make_hook_env(tmp_path / "hookenv")
    bundle = h.write_bundle(tmp_path / "bundle")
    root = h.base_rootfs(bundle / "rootfs")
    os.symlink(str(canary.base / "etc/ld.so.conf.d"), root / "etc/.alt-confd")
    os.symlink(h.escape(canary.base / "cuda"), root / "usr/local/.alt-cuda")
    os.symlink(str(canary.base / "etc"), root / ".alt-etc")
    (root / "etc/ld.so.conf.d/.alt-dropin").symlink_to(canary.base / "planted")
    (root / "etc/.alt-ld.so.conf").symlink_to(canary.base / "etc/ld.so.conf")
    (_compat(root) / ".alt-lib").symlink_to(canary.base / "lib/libcuda.so.host")
    pairs = [root / "etc/ld.so.conf.d", root / "etc/.alt-confd",
             root / "usr/local/cuda", root / "usr/local/.alt-cuda",
             root / "etc", root / ".alt-etc",
             root / "etc/ld.so.conf", root / "etc/.alt-ld.so.conf",
             root / h.DROPIN, root / "etc/ld.so.conf.d/.alt-dropin",
             _compat(root) / h.COMPAT_NAME, _compat(root) / ".alt-lib"]
    canary.arm()
    flip = subprocess.Popen([h.HOOK_PYTHON, "-I", "-S", "-c", _FLIPPER, *map(str, pairs)],
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert flip.stdout.readline() == b"ready\n"
        decisions = []
        for _ in range(25):
            res = h.run_hook(env.entry, h.state_json(bundle), cwd=root)
            assert res.rc == 0 and b"Traceback" not in res.stderr, res
            rec = env.last_record()
            assert rec.get("reason") != "internal_error", rec
            decisions.append(rec["decision"])
    finally:
        os.killpg(flip.pid, 9)
        flip.wait()
        flip.stdout.close()
    assert canary.changes() == [], decisions
    assert len(env.log_records()) == 25


def test_mkdirs_entry_that_appears_mid_call(tmp_path):
    """Deterministic form of a race the swap test above found (TypeError, internal_error).

    mkdirs saw /etc missing (twice), and by its create-lookup it was back: a
    walk result, not the (parent, name) pair it unpacked. It must check it
    like any entry: a directory is fine, a file is NotADirectoryError.
    """
    from compat_hook.facts.rootfs import Root

    fds = len(os.listdir("/proc/self/fd"))
    for kind in ("dir", "file"):
        root = tmp_path / kind
        root.mkdir()

        class Racy(Root):
            misses = 2

            def _walk(self, path, follow=True, missing_ok=False):
                if path == "/etc" and not missing_ok and self.misses:
                    self.misses -= 1
                    if not self.misses:  # the swap lands between the lookups and the create
                        (root / "etc").mkdir() if kind == "dir" else (root / "etc").write_text("x")
                    raise FileNotFoundError(2, "No such file or directory", path)
                return super()._walk(path, follow, missing_ok)

        with Racy(str(root)) as r:
            if kind == "dir":
                assert r.mkdirs("/etc/ld.so.conf.d") == "/etc/ld.so.conf.d"
            else:
                with pytest.raises(NotADirectoryError):
                    r.mkdirs("/etc/ld.so.conf.d")
        assert len(os.listdir("/proc/self/fd")) == fds, "a descriptor leaked"


# ------------------------------------------------------------------- real containers

CONTAINER_CASES = ["compat-dir-symlink-relative-escape", "dropin-symlink-absolute-host-file",
                   "etc-symlink-absolute-host", "candidate-fifo", "cuda-dir-name-non-utf8"]
SHOW = ("echo container-started; cat /etc/ld.so.conf.d/00-00-compat-hook.conf 2>/dev/null"
        " || echo no-dropin")


def _container(tmp_path, canary, c: Case | None, runtime: str):
    env = h.make_hook_env(tmp_path / "hookenv")
    root = h.busybox_rootfs(tmp_path / "bundle" / "rootfs")
    if c is not None:
        c.build(root, canary.base)
    bundle = rt.make_bundle(tmp_path / "bundle", root, args=["/bin/sh", "-c", SHOW],
                            env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"],
                            hooks={"createContainer": [env.entry]})
    canary.arm()
    res = rt.run_container(bundle, runtime, timeout=60)
    return res, env, root


@pytest.mark.containers
@pytest.mark.parametrize("name", CONTAINER_CASES)
def test_hostile_image_container_still_starts_runc(name, tmp_path, canary):
    c = next(c for c in CASES if c.name == name)
    res, env, root = _container(tmp_path, canary, c, "runc")
    assert res.rc == 0, str(res)
    assert "container-started" in res.stdout, str(res)
    assert canary.changes() == []
    rec = env.last_record()
    assert rec["stage"] == "createContainer" and rec["decision"] in ("enable", "skip", "error"), rec
    if c.expect is not None:
        c.expect(rec, root, canary.base)


@pytest.mark.containers
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_benign_image_container_gets_dropin(runtime, tmp_path, canary):
    """The control: the same rootfs without the hostile edit gets compat, under runc and crun."""
    res, env, root = _container(tmp_path, canary, None, runtime)
    assert res.rc == 0, str(res)
    assert "container-started" in res.stdout and h.COMPAT_DIR in res.stdout, str(res)
    rec = env.last_record()
    assert rec["decision"] == "enable" and rec["compat_dir"] == h.COMPAT_DIR, rec
    assert canary.changes() == []


@pytest.mark.containers
def test_hostile_image_container_crun(tmp_path, canary):
    c = next(c for c in CASES if c.name == "dropin-symlink-relative-escape")
    res, env, root = _container(tmp_path, canary, c, "crun")
    assert res.rc == 0 and "container-started" in res.stdout, str(res)
    assert canary.changes() == []
    c.expect(env.last_record(), root, canary.base)
