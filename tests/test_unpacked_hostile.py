"""Hostile unpacked layer dirs read merged (compat_hook.images.unpacked): real dirs, real whiteouts (char 0/0
made with mknod), real opaque xattrs, FIFOs, links out, a huge dir, a deep tree. Every read stays in
the layer dirs; what is too large or too slow is an ImageError, never a hang."""

from __future__ import annotations

import os
import pathlib
import stat
import threading
import time

import pytest

from compat_hook.core.errors import UnsafePath
from compat_hook.images.reader import ImageError
from compat_hook.images.unpacked import Layers


@pytest.fixture
def stack(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    for d in ("etc/ld.so.conf.d", "usr/local/cuda-12.4/compat", "opt/d"):
        (lower / d).mkdir(parents=True)
    (lower / "etc/removed").write_text("x")
    (lower / "etc/ld.so.conf.d/a.conf").write_text("/a\n")
    (lower / "opt/d/old").write_text("old")
    (lower / "usr/local/cuda-12.4/compat/libcuda.so.1").write_bytes(b"\x7fELF")
    (upper / "etc").mkdir(parents=True)
    (upper / "opt/d").mkdir(parents=True)
    (upper / "usr/local").mkdir(parents=True)
    os.mknod(upper / "etc/removed", stat.S_IFCHR | 0o600, os.makedev(0, 0))      # whiteout
    os.setxattr(upper / "opt/d", "trusted.overlay.opaque", b"y")                 # opaque
    (upper / "opt/d/new").write_text("new")
    (upper / "usr/local/cuda").symlink_to("cuda-12.4")
    (upper / "escape").symlink_to(str(outside))                                  # absolute, out
    (upper / "up").symlink_to("../../../../../../../../" + str(outside).lstrip("/"))
    (upper / "loop").symlink_to("loop")
    os.mkfifo(upper / "etc/pipe")
    return Layers([str(upper), str(lower)], what="img"), outside


def test_overlay_semantics(stack):
    r, _ = stack
    with r:
        assert not r.exists("/etc/removed") and "removed" not in dict(r.listdir("/etc"))
        assert dict(r.listdir("/opt/d")) == {"new": "file"}          # opaque: the lower "old" is gone
        assert r.read_file("/usr/local/cuda/compat/libcuda.so.1") == b"\x7fELF"
        assert r.realpath("/usr/local/cuda/../cuda/compat") == "/usr/local/cuda-12.4/compat"
        assert dict(r.listdir("/etc"))["ld.so.conf.d"] == "dir"


def test_no_read_outside_the_layers(stack):
    r, outside = stack
    with r:
        for p in ("/escape/secret", "/up/secret", "/escape/../../secret"):
            assert not r.exists(p), p
            with pytest.raises(OSError):
                r.read_file(p)
        with pytest.raises(FileNotFoundError):
            r.realpath("/up")   # clamped at the merged root, where that path does not exist
        with pytest.raises(OSError):
            r.stat("/loop")


def test_fifo_is_never_opened(stack):
    r, _ = stack
    done = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(UnsafePath, r.read_file, "/etc/pipe")),
                         daemon=True)
    t.start()
    t.join(5)
    assert done, "reading a FIFO hung"
    assert r.listdir("/etc") and dict(r.listdir("/etc"))["pipe"] == "other"
    r.close()


def test_huge_dir_and_slow_reads_are_image_errors(tmp_path):
    big = tmp_path / "big"
    (big / "d").mkdir(parents=True)
    for i in range(300):
        (big / "d" / f"f{i}").write_bytes(b"")
    with Layers([str(big)], what="img", max_dir_entries=100) as r:
        with pytest.raises(ImageError, match="img: /d: more than 100 entries"):
            r.listdir("/d")
    with Layers([str(big)], what="img", deadline=time.monotonic() - 1) as r:
        with pytest.raises(ImageError, match="took too long"):
            r.exists("/d")


def test_deep_tree_and_long_link_chains_end(tmp_path):
    deep = tmp_path / "deep"
    p = deep
    for _ in range(200):
        p = p / "d"
    p.mkdir(parents=True)
    (p / "f").write_text("bottom")
    chain = deep / "l0"
    for i in range(60):
        (deep / f"l{i}").symlink_to(f"l{i + 1}")
    with Layers([str(deep)], what="img") as r:
        assert r.read_file("/" + "d/" * 200 + "f") == b"bottom"
        with pytest.raises(OSError):
            r.stat(str(chain.name))
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            r.exists("/" + "d/" * 200 + "../" * 150 + "f")
        assert len(os.listdir("/proc/self/fd")) == before   # no descriptor left behind


def test_nothing_written_to_the_layers(stack, tmp_path):
    r, _ = stack
    def snapshot():
        return sorted((str(p), p.lstat().st_mtime_ns) for p in tmp_path.rglob("*"))
    before = snapshot()
    with r:
        for p in ("/etc", "/opt/d", "/usr/local/cuda/compat"):
            r.listdir(p)
        r.read_file("/usr/local/cuda/compat/libcuda.so.1")
    assert snapshot() == before
