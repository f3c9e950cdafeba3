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
    (tests/support/warm.py). Under ``make test`` each process runs one lane's modules
    (tests/support/lanes.py)."""
    from tests.support import lanes, warm

    lane = os.environ.get(lanes.ENV)
    if lane:
        keep, dropped = [], []
        for it in items:
            (keep if lanes.lane_of(warm.module_of(it)) == lane else dropped).append(it)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
        if lane == "cluster":
            items.sort(key=lambda it: lanes.CLUSTER.index(warm.module_of(it)))  # stable: in-module order kept
            return
    warm.order(items)


def pytest_collection_finish(session):
    from tests.support import warm

    # one background builder per run: the cluster lane's builds come first in its order, and its fixtures
    # wait on (and hurry) that process rather than compile the same packages beside it
    from tests.support import lanes

    if not session.config.option.collectonly and os.environ.get(lanes.ENV) != "cluster":
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


# A passed test's tmp_path is removed once it is reported: a whole run made ~14 GB of them (rootfs copies,
# containerd roots, images), kept until the run ends, on a CI disk that also holds the ~12 GB cache.
# A failed test's stays, for its logs. Nothing is removed while anything is mounted under it here.
_tmp_paths: dict = {}  # nodeid -> (tmp_path, failed so far)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    path, failed = _tmp_paths.get(item.nodeid, (None, False))
    if path is None:
        got = getattr(item, "funcargs", {}).get("tmp_path")
        path = got if isinstance(got, pathlib.Path) else None
    _tmp_paths[item.nodeid] = (path, failed or rep.failed)


def pytest_runtest_logfinish(nodeid, location):
    path, failed = _tmp_paths.pop(nodeid, (None, True))
    if path is not None and not failed and path.is_dir():
        from tests.support.lanes import removable

        if removable(path):
            import shutil

            shutil.rmtree(path, ignore_errors=True)
