"""compat_hook.core.fastos behaves as ``os`` for everything the start path asks of it.

It stands in for ``os`` in the modules a container start imports (importing
``os`` is ~1 ms of a start), so each of its own functions is compared with the
real one on generated and hand-picked input, on a real tree of files, dirs and
symlinks; everything else must be the real ``os``'s very object.
"""

from __future__ import annotations

import os
import pathlib
import posixpath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compat_hook.core import fastos

PATH_FUNCS = ("join", "split", "dirname", "basename", "isabs", "normpath", "abspath")
# Paths made of the parts that matter to these functions: separators, dots, names, odd characters.
parts = st.sampled_from(["", "/", "//", "///", ".", "..", "a", "b.c", "..d", "e..", " ", "\udcff", "é", "x/"])
paths = st.lists(parts, max_size=8).map("".join)


def _same(fn: str, *args) -> None:
    def call(f):
        try:
            return "ok", f(*args)
        except Exception as e:  # the same exception type is the same behaviour
            return "raises", type(e)
    assert call(getattr(fastos.path, fn)) == call(getattr(posixpath, fn)), (fn, args)


@settings(max_examples=400, deadline=None)
@given(paths, st.lists(paths, max_size=3))
def test_path_functions_match_posixpath(a, rest):
    for fn in PATH_FUNCS:
        _same(fn, a)
    _same("join", a, *rest)


@pytest.mark.parametrize("arg", [b"/a//b/../c", pathlib.PurePosixPath("/a/./b"), b"", b"rel/x/"])
def test_other_argument_types_go_to_the_real_functions(arg):
    for fn in PATH_FUNCS:
        _same(fn, arg)
    _same("join", arg, arg)
    _same("join", "/a", b"b")  # mixed: the real function's TypeError


def test_abspath_of_a_relative_path_uses_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert fastos.path.abspath("x/../y") == posixpath.abspath("x/../y") == str(tmp_path / "y")


@pytest.fixture
def tree(tmp_path) -> pathlib.Path:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "link-file").symlink_to("file")
    (tmp_path / "link-dir").symlink_to("dir")
    (tmp_path / "dangling").symlink_to("nowhere")
    (tmp_path / "loop").symlink_to("loop")
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


@pytest.mark.parametrize("name", ["dir", "file", "link-file", "link-dir", "dangling", "loop", "fifo", "missing",
                                  "file/below", "dir/", "link-dir/", "nul\0byte", ""])
@pytest.mark.parametrize("fn", ["exists", "lexists", "isfile", "isdir", "islink"])
def test_file_tests_match_os_path(tree, name, fn):
    for arg in (str(tree / name) if name else "", os.fsencode(tree) + b"/" + name.encode(), tree / name):
        assert getattr(fastos.path, fn)(arg) == getattr(os.path, fn)(arg), (fn, arg)


@pytest.mark.parametrize("target", ["a/b/c", "a/b/c/", "a/./b", "file/x", "dir", "file", "a/../e"])
@pytest.mark.parametrize("exist_ok", [False, True])
def test_makedirs_matches_os(tmp_path, target, exist_ok):
    outcomes = []
    for module, base in ((os, tmp_path / "real"), (fastos, tmp_path / "fast")):
        base.mkdir()
        (base / "dir").mkdir()
        (base / "file").write_text("x")
        try:
            module.makedirs(str(base / target), 0o750, exist_ok=exist_ok)
            outcome = "ok"
        except OSError as e:
            outcome = type(e)
        listing = sorted((str(p.relative_to(base)), p.is_dir(), oct(p.stat().st_mode & 0o777))
                         for p in base.rglob("*"))
        outcomes.append((outcome, listing))
    assert outcomes[0] == outcomes[1], outcomes


@pytest.mark.parametrize("value", ["plain", "\udcff-surrogate", "é", b"bytes\xff", pathlib.PurePosixPath("/p")])
def test_fsencode_and_fsdecode_match_os(value):
    assert fastos.fsencode(value) == os.fsencode(value)
    assert fastos.fsdecode(value) == os.fsdecode(value)
    with pytest.raises(TypeError):
        fastos.fsencode(3)


def test_fdopen_matches_os(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"line\n")
    for mode in ("rb", "r"):
        with fastos.fdopen(os.open(p, os.O_RDONLY), mode) as a, os.fdopen(os.open(p, os.O_RDONLY), mode) as b:
            assert (type(a), a.read()) == (type(b), b.read())
    with pytest.raises(TypeError):
        fastos.fdopen("0")


def test_everything_else_is_the_real_os():
    for name in dir(os):
        if name.startswith("_") or name in fastos.__all__ or name in ("path",):
            continue
        assert getattr(fastos, name) is getattr(os, name), name
    assert fastos.environ is os.environ  # str -> str, not posix's bytes mapping
    assert fastos.path.realpath is posixpath.realpath
    assert (fastos.SEEK_SET, fastos.SEEK_CUR, fastos.SEEK_END) == (os.SEEK_SET, os.SEEK_CUR, os.SEEK_END)
    for module in (fastos, fastos.path):
        with pytest.raises(AttributeError):
            module.__path__  # noqa: B018 - the import system's probe must not import os
