"""Shared on-disk cache for the test harness (debs, extracted libcuda, probe binary).

Location: ``$COMPAT_HOOK_TEST_CACHE`` or ``<repo>/.cache/`` (git-ignored).

Every producer follows the same pattern so that several pytest processes can
call it at once: take an exclusive ``flock`` on ``<cache>/.locks/<name>.lock``,
re-check whether the final entry exists, build it in a temp dir inside the
cache (same filesystem) and ``rename`` it into place.  A crashed producer
leaves only a ``.tmp-*`` directory behind, never a half-built final entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import tempfile
from typing import Callable, Iterator

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def cache_dir() -> pathlib.Path:
    env = os.environ.get("COMPAT_HOOK_TEST_CACHE")
    d = pathlib.Path(env) if env else REPO_ROOT / ".cache"
    d.mkdir(parents=True, exist_ok=True)
    return d.resolve()


class Busy(Exception):
    """Another process builds it now (raised instead of waiting where :data:`WAIT` is False)."""


#: False in the background builder (tests/support/warm.py): a build another process holds is put off
#: (:class:`Busy`), and the builder goes on with the next, rather than wait.
WAIT = True


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    locks = cache_dir() / ".locks"
    locks.mkdir(exist_ok=True)
    with open(locks / f"{name}.lock", "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process builds it (tests/support/warm.py): say why the run waits
            if not WAIT:
                raise Busy(name) from None
            from . import progress

            t0 = progress.start(f"waiting for {name}, held by another process (the background builds' log: "
                                f"{cache_dir() / 'warm.log'})")
            from . import warm

            warm.hurry()
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            warm.hurry(done=True)
            progress.done(t0, f"{name} ready")
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def go_compiling() -> Iterator[None]:
    """Held around each Go compile that shares the one build cache of tests/support/kubebuild.py (Kubernetes'
    binaries, kwok, helm, the harness, the plugin, containerd): one at a time. Each ``go`` already keeps
    both cores busy, and two at once compile what they share twice (the second finds nothing in the build
    cache until the first ends: a cold run built kube-apiserver and kube-controller-manager side by side
    for minutes). The toolkit and crictl have build caches of their own and share little: they go on
    beside, so a test that needs one does not wait out a Kubernetes build."""
    global _compiling
    if _compiling:  # this process holds it already (a build's steps each ask): a second flock would wait on itself
        yield
        return
    with locked("go-k8s-compile"):
        _compiling = True
        try:
            yield
        finally:
            _compiling = False


_compiling = False


def ensure_dir(final: pathlib.Path, build: Callable[[pathlib.Path], None], *, lock: str) -> pathlib.Path:
    """Return ``final``; if missing, ``build(tmpdir)`` under ``lock`` and rename tmpdir to ``final``."""
    if final.is_dir():
        return final
    with locked(lock):
        if final.is_dir():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
        try:
            build(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
