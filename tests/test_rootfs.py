"""compat_hook.facts.rootfs: the confined accessor.

NVIDIA's container-root_test table (docs/background.md "The NVIDIA toolkit") mapped onto
Root.mkdirs / open_regular / write_file / exists / listdir, then the escapes:
relative and absolute symlinks out of the root, ``..`` beyond it, loops, and
special files that must never be opened. A canary tree outside the root is
compared before and after every hostile case.
"""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest

from compat_hook.facts import imagefacts
from compat_hook.core.errors import UnsafePath
from compat_hook.facts.rootfs import MAX_SYMLINKS, Root
from tests.conftest import CharDev, Dir, Fifo, Symlink, build_tree, snapshot_tree


@pytest.fixture
def canary(tmp_path):
    """A host dir outside every root, with files an escape would read or change."""
    base = tmp_path / "host-canary"
    build_tree(base, {"etc/passwd": "root:x:0:0::/root:/bin/sh\n", "x/foo": "host foo\n",
                      "compat/libcuda.so.999.99.99": b"\x7fELF host",
                      "etc/ld.so.conf.d/host.conf": "/host/lib\n"})
    before = snapshot_tree(base)
    yield base
    assert snapshot_tree(base) == before, "the host canary tree changed"


def rootfs(make_rootfs, entries=None):
    return Root(str(make_rootfs(entries or {})))


# -- NVIDIA's table ------------------------------------------------------------

class TestMkdirAll:
    def test_empty_path_is_the_root(self, make_rootfs):
        with rootfs(make_rootfs) as r:
            assert r.mkdirs("") == "/"

    def test_single(self, make_rootfs):
        p = make_rootfs()
        with Root(str(p)) as r:
            assert r.mkdirs("foo") == "/foo"
        assert (p / "foo").is_dir()

    def test_nested(self, make_rootfs):
        p = make_rootfs()
        with Root(str(p)) as r:
            assert r.mkdirs("/path/to/foo") == "/path/to/foo"
            assert r.mkdirs("/path/to/foo") == "/path/to/foo"  # idempotent
        assert (p / "path/to/foo").is_dir()

    def test_through_relative_link_to_existing(self, make_rootfs):
        p = make_rootfs({"x": Dir(), "path/to": Symlink("../x")})
        with Root(str(p)) as r:
            assert r.mkdirs("/path/to/foo") == "/x/foo"
        assert (p / "x/foo").is_dir()

    def test_through_absolute_link_stays_in_root(self, make_rootfs, canary):
        p = make_rootfs({"x": Dir(), "path/to": Symlink("/x")})
        with Root(str(p)) as r:
            assert r.mkdirs("/path/to/foo") == "/x/foo"
        assert (p / "x/foo").is_dir()

    def test_through_dangling_link_is_refused(self, make_rootfs):
        p = make_rootfs({"path/to": Symlink("../x")})
        with Root(str(p)) as r:
            with pytest.raises(UnsafePath):
                r.mkdirs("/path/to/foo")
        assert not (p / "x").exists()

    def test_dangling_link_to_host_path_is_refused(self, make_rootfs, canary):
        target = str(canary / "newdir")
        p = make_rootfs({"etc": Symlink(target)})
        with Root(str(p)) as r:
            with pytest.raises(UnsafePath):
                r.mkdirs("/etc/ld.so.conf.d")
        assert not os.path.exists(target)

    def test_file_in_the_way(self, make_rootfs):
        with rootfs(make_rootfs, {"path": "a file"}) as r:
            with pytest.raises(NotADirectoryError):
                r.mkdirs("/path/to")


class TestOpen:
    def test_empty_path_is_the_root_dir(self, make_rootfs):
        with rootfs(make_rootfs) as r:
            assert r.realpath("") == "/"
            with pytest.raises(UnsafePath):  # a directory, not a regular file
                r.open_regular("")

    def test_missing(self, make_rootfs):
        with rootfs(make_rootfs) as r:
            with pytest.raises(FileNotFoundError):
                r.open_regular("foo")

    def test_nested(self, make_rootfs):
        with rootfs(make_rootfs, {"path/to/foo": "foo"}) as r:
            with r.open_regular("/path/to/foo") as f:
                assert f.read() == b"foo"

    def test_via_relative_link(self, make_rootfs):
        with rootfs(make_rootfs, {"x/foo": "xfoo", "path/to": Symlink("../x")}) as r:
            assert r.read_file("/path/to/foo") == b"xfoo"
            assert r.realpath("/path/to/foo") == "/x/foo"

    def test_via_absolute_link_missing_file(self, make_rootfs, canary):
        # The host has /x/foo (canary), the root only /x/bar: foo is not found.
        link = str(canary / "x")
        with rootfs(make_rootfs, {"x/bar": "bar", "path/to": Symlink("/x"), "other": Symlink(link)}) as r:
            with pytest.raises(FileNotFoundError):
                r.open_regular("/path/to/foo")
            with pytest.raises(FileNotFoundError):
                r.open_regular("/other/foo")

    def test_via_link_beyond_root_is_clamped(self, make_rootfs, canary):
        with rootfs(make_rootfs, {"x/foo": "in-root foo", "path/to": Symlink("../../x")}) as r:
            assert r.read_file("/path/to/foo") == b"in-root foo"


class TestCreate:
    def test_empty_name(self, make_rootfs):
        with rootfs(make_rootfs) as r:
            with pytest.raises(UnsafePath):
                r.write_file("", b"x")
            with pytest.raises(UnsafePath):
                r.write_file("/a/..", b"x")

    def test_simple(self, make_rootfs):
        p = make_rootfs()
        with Root(str(p)) as r:
            assert r.write_file("foo", b"data") == "/foo"
        assert (p / "foo").read_bytes() == b"data"
        assert stat.S_IMODE((p / "foo").stat().st_mode) == 0o644

    def test_no_parent(self, make_rootfs):
        with rootfs(make_rootfs) as r:
            with pytest.raises(FileNotFoundError):
                r.write_file("/path/to/foo", b"x")

    def test_parent_exists(self, make_rootfs):
        p = make_rootfs({"path/to": Dir()})
        with Root(str(p)) as r:
            assert r.write_file("/path/to/foo", b"x", mode=0o600) == "/path/to/foo"
        assert stat.S_IMODE((p / "path/to/foo").stat().st_mode) == 0o600

    @pytest.mark.parametrize("link", ["../x", "/x", "../../x", "../../../../x"])
    def test_via_parent_link(self, make_rootfs, canary, link):
        p = make_rootfs({"x": Dir(), "path/to": Symlink(link)})
        with Root(str(p)) as r:
            assert r.write_file("/path/to/foo", b"created") == "/x/foo"
            assert r.read_file("/path/to/foo") == b"created"  # then openable in root
        assert (p / "x/foo").read_bytes() == b"created"

    def test_no_temp_file_left(self, make_rootfs):
        p = make_rootfs({"etc": Dir()})
        with Root(str(p)) as r:
            r.write_file("/etc/a", b"1")
            r.write_file("/etc/a", b"2")
        assert os.listdir(p / "etc") == ["a"]
        assert (p / "etc/a").read_bytes() == b"2"

    def test_directory_in_the_way(self, make_rootfs):
        with rootfs(make_rootfs, {"etc/x.conf": Dir()}) as r:
            with pytest.raises(UnsafePath):
                r.write_file("/etc/x.conf", b"x")


class TestHasPath:
    def test_missing(self, make_rootfs):
        with rootfs(make_rootfs) as r:
            assert not r.exists("/foo")

    @pytest.mark.parametrize("path", ["/path/to", "path/to", "/path/to/", "./path/./to"])
    def test_dir(self, make_rootfs, path):
        with rootfs(make_rootfs, {"path/to": Dir()}) as r:
            assert r.exists(path) and r.is_dir(path)

    def test_file(self, make_rootfs):
        with rootfs(make_rootfs, {"path/to/file": "x"}) as r:
            assert r.exists("/path/to/file") and not r.is_dir("/path/to/file")

    @pytest.mark.parametrize("link", ["../x", "../../x", "/x"])
    def test_via_link(self, make_rootfs, link):
        with rootfs(make_rootfs, {"x": Dir(), "foo/bar": Symlink(link)}) as r:
            assert r.exists("/foo/bar")
            assert r.realpath("/foo/bar") == "/x"


def _glob(r, d):
    """NVIDIA's globFiles(<d>/libcuda.so.*.*): regular files only, sorted, in-root paths."""
    resolved, candidates, _ = imagefacts.scan_compat_dir(r, d)
    return [f"{resolved.rstrip('/')}/{n}" for n in candidates]


class TestGlobFiles:
    def test_missing_dir(self, make_rootfs):
        with rootfs(make_rootfs) as r:
            with pytest.raises(FileNotFoundError):
                _glob(r, "/path/to/dir")

    def test_root_dir(self, make_rootfs):
        with rootfs(make_rootfs, {"libcuda.so.1.1": "x"}) as r:
            assert _glob(r, "/") == ["/libcuda.so.1.1"]
            assert [n for n, _ in r.listdir("")] == ["libcuda.so.1.1"]

    def test_only_other_libs(self, make_rootfs):
        with rootfs(make_rootfs, {"path/to/dir/libfoo.so.1.1": "x", "path/to/dir/libcuda.so.1": "x"}) as r:
            assert _glob(r, "/path/to/dir") == []

    def test_one(self, make_rootfs):
        with rootfs(make_rootfs, {"path/to/dir/libcuda.so.1.1": "x"}) as r:
            assert _glob(r, "/path/to/dir") == ["/path/to/dir/libcuda.so.1.1"]

    def test_two_sorted(self, make_rootfs):
        with rootfs(make_rootfs, {"path/to/dir/libcuda.so.2.2": "x", "path/to/dir/libcuda.so.1.1": "x"}) as r:
            assert _glob(r, "/path/to/dir") == ["/path/to/dir/libcuda.so.1.1", "/path/to/dir/libcuda.so.2.2"]

    def test_symlink_ignored(self, make_rootfs):
        with rootfs(make_rootfs, {"path/to/dir/real": "x", "path/to/dir/libcuda.so.1.1": Symlink("real")}) as r:
            assert _glob(r, "/path/to/dir") == []
            assert dict(r.listdir("/path/to/dir"))["libcuda.so.1.1"] == "symlink"

    def test_dir_ignored(self, make_rootfs):
        with rootfs(make_rootfs, {"path/to/dir/libcuda.so.1.1": Dir()}) as r:
            assert _glob(r, "/path/to/dir") == []
            assert r.listdir("/path/to/dir") == [("libcuda.so.1.1", "dir")]

    def test_parent_link_to_other_dir(self, make_rootfs):
        with rootfs(make_rootfs, {"otherDir/dir/libcuda.so.1.1": "x", "path/to": Symlink("../otherDir")}) as r:
            assert _glob(r, "/path/to/dir") == ["/otherDir/dir/libcuda.so.1.1"]

    def test_parent_link_beyond_root(self, make_rootfs, tmp_path, canary):
        # "../../" is the root itself; the file that really is outside is not found.
        p = make_rootfs({"path/to": Symlink("../../")})
        os.makedirs(os.path.join(os.path.dirname(p), "dir"))
        with open(os.path.join(os.path.dirname(p), "dir", "libcuda.so.1.1"), "w") as f:
            f.write("outside")
        with Root(str(p)) as r:
            with pytest.raises(FileNotFoundError):
                _glob(r, "/path/to/dir")


# -- escapes ---------------------------------------------------------------------

ESCAPES = [
    ("rel_link", {"usr/local/cuda": Symlink("../../../../../../../../../HOST")}),
    ("abs_link", {"usr/local/cuda": Symlink("HOST")}),
    ("dotdot_chain", {"usr/local/cuda": Symlink("../../.."), "usr/local/x": Dir()}),
]


@pytest.mark.parametrize("name, entries", ESCAPES, ids=[e[0] for e in ESCAPES])
def test_symlinks_out_of_the_root_are_clamped(make_rootfs, canary, name, entries):
    host = str(canary)
    ents = {k: Symlink(v.target.replace("HOST", host.lstrip("/") if name == "rel_link" else host))
            for k, v in entries.items() if isinstance(v, Symlink)}
    with rootfs(make_rootfs, ents) as r:
        for p in ("/usr/local/cuda/etc/passwd", "/usr/local/cuda/compat/libcuda.so.999.99.99",
                  "/usr/local/cuda/../../../../etc/passwd"):
            assert not r.exists(p)
            with pytest.raises(FileNotFoundError):
                r.open_regular(p)
        with pytest.raises(FileNotFoundError):
            imagefacts.scan_compat_dir(r, "/usr/local/cuda/compat")


def test_dotdot_beyond_the_root(make_rootfs, canary):
    p = make_rootfs({"etc/passwd": "container passwd\n"})
    rel = os.path.relpath(canary, p)  # ../host-canary
    with Root(str(p)) as r:
        assert r.realpath("/../../../..") == "/"
        assert r.read_file("/../../etc/passwd") == b"container passwd\n"
        assert r.read_file("../../../../../../etc/passwd") == b"container passwd\n"
        assert not r.exists(f"{rel}/x/foo")
        assert not r.exists(f"/{rel}/etc/passwd")


def test_absolute_link_restarts_at_the_root(make_rootfs):
    with rootfs(make_rootfs, {"a/b/c": Symlink("/d"), "d/e": "in root"}) as r:
        assert r.read_file("/a/b/c/e") == b"in root"
        assert r.realpath("/a/b/c/../d/e") == "/d/e"


@pytest.mark.parametrize("entries, path", [
    ({"loop": Symlink("loop")}, "/loop"),
    ({"a": Symlink("b"), "b": Symlink("a")}, "/a/x"),
    ({"a": Symlink("/a/b")}, "/a"),
])
def test_symlink_loops_are_eloop(make_rootfs, entries, path):
    with rootfs(make_rootfs, entries) as r:
        with pytest.raises(OSError) as e:
            _with_timeout(lambda: r.open_regular(path))
        assert e.value.errno == errno.ELOOP
        assert not _with_timeout(lambda: r.exists(path))
        with pytest.raises(OSError):
            _with_timeout(lambda: r.mkdirs(path + "/sub"))


def test_long_but_finite_chain(make_rootfs):
    n = MAX_SYMLINKS
    entries = {f"l{i}": Symlink(f"l{i + 1}") for i in range(n - 1)}
    entries[f"l{n - 1}"] = Symlink("target")
    entries["target"] = "end"
    with rootfs(make_rootfs, entries) as r:
        assert r.read_file("/l0") == b"end"
    entries = {f"l{i}": Symlink(f"l{i + 1}") for i in range(n)}
    entries[f"l{n}"] = Symlink("target")
    entries["target"] = "end"
    with rootfs(make_rootfs, entries) as r:
        with pytest.raises(OSError) as e:
            _with_timeout(lambda: r.read_file("/l0"))
        assert e.value.errno == errno.ELOOP


# -- libcuda as something other than a regular file --------------------------------

COMPAT = "usr/local/cuda/compat"
LIB = f"/{COMPAT}/libcuda.so.575.57.08"


def _with_timeout(fn, seconds=5):
    """Run ``fn`` in a thread; fail (instead of hanging) if it blocks."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked: a special file was opened"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_fifo_is_refused_without_opening(make_rootfs):
    p = make_rootfs({LIB.lstrip("/"): Fifo()})
    with Root(str(p)) as r:
        with pytest.raises(UnsafePath, match="FIFO"):
            _with_timeout(lambda: r.open_regular(LIB))
        assert dict(r.listdir(COMPAT))["libcuda.so.575.57.08"] == "other"
    # Nobody is blocked on the FIFO's other end: a non-blocking writer finds no reader.
    with pytest.raises(OSError) as e:
        os.open(p / LIB.lstrip("/"), os.O_WRONLY | os.O_NONBLOCK)
    assert e.value.errno == errno.ENXIO


def test_device_node_is_refused_without_opening(make_rootfs):
    p = make_rootfs({LIB.lstrip("/"): CharDev()})
    with Root(str(p)) as r:
        with pytest.raises(UnsafePath, match="character device"):
            _with_timeout(lambda: r.open_regular(LIB))
        with pytest.raises(UnsafePath):
            r.read_file(LIB)


def test_directory_is_refused(make_rootfs):
    with rootfs(make_rootfs, {LIB.lstrip("/"): Dir()}) as r:
        with pytest.raises(UnsafePath, match="directory"):
            r.open_regular(LIB)


def test_symlink_not_followed_when_asked(make_rootfs, canary):
    target = str(canary / "compat/libcuda.so.999.99.99")
    p = make_rootfs({LIB.lstrip("/"): Symlink("libcuda.so.real"), f"{COMPAT}/libcuda.so.real": "in root",
                     f"{COMPAT}/libcuda.so.999.1": Symlink(target)})
    with Root(str(p)) as r:
        with pytest.raises(UnsafePath, match="symlink"):
            r.open_regular(LIB, follow=False)
        assert r.read_file(LIB) == b"in root"  # followed, inside the root
        with pytest.raises(FileNotFoundError):  # the host target is not in the root
            r.open_regular(f"/{COMPAT}/libcuda.so.999.1")


def test_special_candidates_are_not_candidates(make_rootfs, fake_host):
    from tests.conftest import config_for

    p = make_rootfs({f"{COMPAT}/libcuda.so.575.57.08": Fifo(), f"{COMPAT}/libcuda.so.550.54.15": CharDev(),
                     f"{COMPAT}/libcuda.so.560.1.1": Symlink("/etc/passwd"), f"{COMPAT}/libcuda.so.570.1": Dir()})
    with Root(str(p)) as r:
        img = _with_timeout(lambda: imagefacts.gather(r, config_for(fake_host())))
    assert img.status == "none" and img.candidates == []


# -- writes --------------------------------------------------------------------------

def test_write_through_symlinked_parent_stays_inside(make_rootfs, canary):
    host_dir = str(canary / "etc/ld.so.conf.d")
    p = make_rootfs({"etc": Dir(), "etc/ld.so.conf.d": Symlink(host_dir)})
    with Root(str(p)) as r:
        # The absolute target is resolved in the root, where it does not exist.
        with pytest.raises(FileNotFoundError):
            r.write_file("/etc/ld.so.conf.d/00-x.conf", b"/evil\n")
        with pytest.raises(UnsafePath):
            r.mkdirs("/etc/ld.so.conf.d")
        # Once it exists in the root, the write lands there.
        r.mkdirs(host_dir)
        assert r.write_file("/etc/ld.so.conf.d/00-x.conf", b"/ok\n") == host_dir + "/00-x.conf"
    assert (p / host_dir.lstrip("/") / "00-x.conf").read_bytes() == b"/ok\n"


def test_write_over_planted_symlink_replaces_the_link(make_rootfs, canary):
    host_file = canary / "etc/ld.so.conf.d/host.conf"
    p = make_rootfs({"etc/ld.so.conf.d/00-00-compat-hook.conf": Symlink(str(host_file)),
                     "etc/ld.so.conf.d/rel.conf": Symlink("../../../../../.." + str(host_file))})
    with Root(str(p)) as r:
        r.write_file("/etc/ld.so.conf.d/00-00-compat-hook.conf", b"/usr/local/cuda/compat\n")
        r.write_file("/etc/ld.so.conf.d/rel.conf", b"rel\n")
    for name, data in (("00-00-compat-hook.conf", b"/usr/local/cuda/compat\n"), ("rel.conf", b"rel\n")):
        f = p / "etc/ld.so.conf.d" / name
        assert not f.is_symlink() and f.read_bytes() == data
    assert host_file.read_bytes() == b"/host/lib\n"


def test_write_over_hardlink_does_not_write_through(make_rootfs, canary):
    host_file = canary / "x/foo"
    p = make_rootfs({"etc": Dir()})
    os.link(host_file, p / "etc/foo")
    with Root(str(p)) as r:
        r.write_file("/etc/foo", b"replaced")
    assert (p / "etc/foo").read_bytes() == b"replaced"
    assert host_file.read_bytes() == b"host foo\n"


def test_unlink_removes_the_link_not_the_target(make_rootfs, canary):
    p = make_rootfs({"etc/a": "target", "etc/l": Symlink("a"), "etc/h": Symlink(str(canary / "x/foo"))})
    with Root(str(p)) as r:
        assert r.unlink("/etc/l") and r.unlink("/etc/h")
        assert not r.unlink("/etc/missing")
    assert (p / "etc/a").read_bytes() == b"target"
    assert not os.path.lexists(p / "etc/l")


def test_swapped_parent_after_open_cannot_escape(make_rootfs, canary):
    # The root is pinned by a descriptor: renaming the rootfs dir away and
    # putting a link to the host in its place changes nothing for the Root.
    p = make_rootfs({"etc/x": "root x"})
    with Root(str(p)) as r:
        moved = str(p) + ".moved"
        os.rename(p, moved)
        os.symlink(str(canary), p)
        try:
            assert r.read_file("/etc/x") == b"root x"
            assert not r.exists("/etc/passwd")
            r.write_file("/etc/new", b"n")
        finally:
            os.unlink(p)
            os.rename(moved, p)
    assert (p / "etc/new").read_bytes() == b"n"


# -- odd names -------------------------------------------------------------------------

def test_names_with_newlines_and_non_utf8_bytes(make_rootfs):
    p = make_rootfs({"d": Dir()})
    raw = [b"line\nbreak", b"bad\xff\xfeutf8", b"libcuda.so.550.54.15\n", "é".encode()]
    for n in raw:
        with open(os.path.join(os.fsencode(p), b"d", n), "wb") as f:
            f.write(n)
    with Root(str(p)) as r:
        names = dict(r.listdir("/d"))
        assert set(names) == {os.fsdecode(n) for n in raw}
        for n in raw:
            name = os.fsdecode(n)
            assert names[name] == "file"
            assert r.read_file(f"/d/{name}") == n
            assert r.exists("d/" + name)
        # NVIDIA's glob libcuda.so.*.* matches it (its version is refused later)
        _, candidates, _ = imagefacts.scan_compat_dir(r, "/d")
        assert candidates == ["libcuda.so.550.54.15\n"]
        r.write_file("/d/" + os.fsdecode(b"new\xffname"), b"w")
    assert open(os.path.join(os.fsencode(p), b"d", b"new\xffname"), "rb").read() == b"w"


def test_candidate_name_with_newline_is_not_a_version(make_rootfs, fake_host):
    from tests.conftest import config_for, elf

    p = make_rootfs({f"{COMPAT}/libcuda.so.550.54.15\n": elf(None)})
    with Root(str(p)) as r:
        img = imagefacts.gather(r, config_for(fake_host()))
    # It is a candidate by NVIDIA's glob, but its version does not parse.
    assert img.status == "found" and img.compat_version is None


def test_root_must_be_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        Root(str(f))
    with pytest.raises(FileNotFoundError):
        Root(str(tmp_path / "missing"))
    os.symlink(tmp_path, tmp_path / "link")
    with pytest.raises(OSError):  # O_NOFOLLOW: the root path itself must not be a link
        Root(str(tmp_path / "link"))


def test_no_descriptor_leaks(make_rootfs):
    p = make_rootfs({"a/b/c": "x", "l": Symlink("a/b"), "loop": Symlink("loop"), "fifo": Fifo()})
    before = len(os.listdir("/proc/self/fd"))
    with Root(str(p)) as r:
        for _ in range(50):
            r.read_file("/l/c")
            r.exists("/loop")
            r.exists("/missing/x")
            r.listdir("/a")
            for bad in ("/fifo", "/a"):
                with pytest.raises(UnsafePath):
                    r.open_regular(bad)
            r.write_file("/a/w", b"w")
            r.mkdirs("/a/m/n")
    assert len(os.listdir("/proc/self/fd")) == before
