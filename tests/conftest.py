"""Shared fixtures: fake container root filesystems and fake host trees.

``make_rootfs`` builds an image tree from a mapping of in-root paths::

    root = make_rootfs({
        "usr/local/cuda-12.4/compat/libcuda.so.550.54.15": elf(NOTE_575),
        "usr/local/cuda-12.4/compat/libcuda.so.1": Symlink("libcuda.so.550.54.15"),
        "usr/local/cuda": Symlink("cuda-12.4"),
        "etc": Dir(),
    })

``fake_host`` writes what the host tells about its driver (``/proc``, ``/sys``,
the driver library dirs, ``/dev/nvgpu``) under a directory used as
``host_root``, so host facts are read from it and never from this machine
(:func:`tests.support.trees.write_fake_host`, the one writer).
"""

from __future__ import annotations

import itertools
import os
import pathlib
import stat

import pytest

from tests.support.trees import (HOST_ARCH, HOST_LIB_DIR, CharDev, Dir, Fifo, Symlink, build_tree,  # noqa: F401
                                 elf, write_fake_host)

__all__ = ["HOST_ARCH", "Symlink", "Dir", "Fifo", "CharDev", "elf", "build_tree", "write_fake_host",
           "config_for", "snapshot_tree"]


_counter = itertools.count()


@pytest.fixture
def make_rootfs(tmp_path):
    """Factory: ``make_rootfs(entries=None, name=None) -> pathlib.Path`` of a new rootfs."""

    def make(entries: dict | None = None, name: str | None = None) -> pathlib.Path:
        d = tmp_path / (name or f"rootfs{next(_counter)}")
        d.mkdir(parents=True)
        return build_tree(d, entries or {})

    return make


@pytest.fixture
def fake_host(tmp_path):
    """Factory: ``fake_host(base=None, version_line=..., gpus=..., sys_version=..., libcuda=..., tegra=...)``."""

    def make(base=None, **kw) -> pathlib.Path:
        if base is None or pathlib.Path(base) == tmp_path:
            base = tmp_path / f"host{next(_counter)}"
        return write_fake_host(base, **kw)

    return make


def config_for(host_root=None, **values):
    """A validated Config reading host facts under ``host_root`` (NVML off)."""
    from compat_hook.core.config import from_mapping

    data = {"nvml": "off", "log_file": None}
    if host_root is not None:
        data["host_root"] = str(host_root)
    data.update(values)
    return from_mapping(data)


def snapshot_tree(base) -> dict:
    """Every entry under ``base``: path -> (type, mode, size, mtime_ns, content or link target)."""
    out = {}
    base = os.fsencode(base)
    for dirpath, dirnames, filenames in os.walk(base):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    extra = f.read()
            else:
                extra = None
            out[os.path.relpath(p, base)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                             st.st_size if not stat.S_ISDIR(st.st_mode) else None,
                                             st.st_mtime_ns, extra)
    return out


def pytest_collection_modifyitems(session, config, items):
    """The modules that need the cache's long builds run last, while those builds run in the background
    (tests/support/warm.py)."""
    from tests.support import warm

    warm.order(items)


def pytest_collection_finish(session):
    from tests.support import warm

    if not session.config.option.collectonly:
        warm.start(session.items)


def pytest_sessionfinish(session, exitstatus):
    from tests.support import warm

    warm.stop()


@pytest.fixture
def boxes():
    """The loader boxes (tests/support/loaderbox.py) a test makes; their rootfs copies are removed after it."""
    made: list = []
    yield made
    for b in made:
        b.cleanup()
