"""The cache's long builds in the background while the tests that need none of them run.

A cold ``make test`` builds the NVIDIA Container Toolkit's binaries, kube-apiserver, the kubelet, kwok,
helm, the upgrade harness, kubectl, crictl, the NRI plugin and two upstream containerd releases from Go (25-35
minutes on 2 cores) and fetches Debian's containerd 2.x. Built when a fixture
first asks, the suite waits for each in turn. Instead:

* :func:`order` runs the modules that need those builds last (each module stays whole, in its order);
* :func:`start` builds them in one background process (``python -m tests.support.warm``) while the
  rest of the suite runs. That process runs at nice 10 (inherited by the compilers it starts): it
  takes the CPU the tests leave idle (they wait on containers and daemons much of the time) and
  little of what they use;
* a fixture that needs a build still under way waits on the build's lock (tests/support/cache.py) and
  says so; the waiter raises the builder's process group to nice 0 (:func:`hurry`), since nothing of
  its own runs until that build ends. The build is the same code, so the result is the same as when
  built in the foreground.

Each build is atomic (a temp dir renamed into place), so stopping the process at the end of the
session (or a crash) leaves no half-built entry. ``COMPAT_HOOK_TEST_WARM=0`` turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["BUILDS", "NEEDS_BUILDS", "module_of", "order", "start", "stop", "hurry", "main"]

#: The test modules that need a build of :data:`BUILDS` (a real API server, a kubelet node, the plugin).
NEEDS_BUILDS = frozenset({
    "test_admission", "test_cluster", "test_cluster_churn", "test_cluster_offline", "test_cluster_runbook",
    "test_fleet", "test_hostile_cluster", "test_kubernetes", "test_node", "test_node_cdi", "test_node_dra",
    "test_node_validator", "test_nri", "test_nri_packaging", "test_nri_required", "test_validator",
    "test_validator_age",
})

#: What :func:`main` builds, in the order the modules first need them (the NVIDIA toolkit's binaries and
#: crictl: modules of the main lane's first half; the control plane's: the cluster lane, from its start).
BUILDS = ("toolkit", "crictl", "kube-apiserver", "kwok", "harness", "helm", "kube-controller-manager", "kube-scheduler",
          "kubelet", "kubectl", "containerd2", "nri", "containerd-v2.2.9", "containerd-v2.4.2")


def module_of(item) -> str:
    """A test item's module name (its file's stem)."""
    return Path(str(item.fspath)).stem



#: The modules of :data:`NEEDS_BUILDS` that need the late builds, by tier: 1, a kubelet node and Debian's
#: containerd 2.x with the NRI plugin; 2, upstream containerd releases (the last builds). The others (tier 0)
#: need only the control plane's, which come first.
LATE = {"test_node": 1, "test_node_dra": 1, "test_node_validator": 1, "test_nri": 1, "test_nri_packaging": 1,
        "test_node_cdi": 2, "test_nri_required": 2}


def order(items: list) -> None:
    """Move the items of :data:`NEEDS_BUILDS` modules after the others, those needing later builds later
    (:data:`LATE`), keeping every other order: a cold run waits for a build only when nothing else is left."""
    def key(it):
        m = module_of(it)
        return (m in NEEDS_BUILDS, LATE.get(m, 0))

    items[:] = sorted(items, key=key)  # sorted() is stable


_proc: subprocess.Popen | None = None


def start(items: list) -> None:
    """Start the background builds when the run includes a module that needs them."""
    global _proc
    if os.environ.get("COMPAT_HOOK_TEST_WARM", "1") == "0" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # only for a run that includes the tests that need them (not `make test-fast`: no daemons, nothing slow)
    if not any(module_of(it) in NEEDS_BUILDS and (it.get_closest_marker("containers") or it.get_closest_marker("slow"))
               for it in items):
        return
    from .cache import cache_dir

    log = cache_dir() / "warm.log"
    repo = Path(__file__).resolve().parents[2]
    with open(log, "ab") as out:
        _proc = subprocess.Popen([sys.executable, "-m", "tests.support.warm"], cwd=repo, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop() -> None:
    """End the background builds (a build under way is dropped: its temp dir is removed, nothing half-built)."""
    global _proc
    if _proc is not None and _proc.poll() is None:
        import signal

        try:
            os.killpg(_proc.pid, signal.SIGTERM)
            _proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(_proc.pid, signal.SIGKILL)
            except OSError:
                pass
            _proc.wait()
    _proc = None


#: The background builds' niceness: a CPU-bound test keeps ~90% of a core it shares with them (CFS
#: weights 1024 : 110), and they take every idle one. ``SCHED_IDLE`` would take only idle time: a test
#: lane waiting on one of them (tests/support/lanes.py) would then wait for the other lane to idle.
NICE = 10


def _pid_file() -> Path:
    from .cache import cache_dir

    return cache_dir() / ".locks" / "warm.pid"


def _write_pid() -> None:
    f = _pid_file()
    f.parent.mkdir(exist_ok=True)
    f.write_text(f"{os.getpgrp()}\n")


def hurry(done: bool = False) -> None:
    """Raise the background builds' process group to nice 0 while a test waits on a lock (tests/support/
    cache.py: one of its builds, or a compile slot it holds) and nothing else of that test goes on; back to
    :data:`NICE` once the wait is over (``done``). Best effort (root only)."""
    try:
        pgid = int(_pid_file().read_text().split()[0])
        # that builder still (a pid file of an earlier run may name another process now)
        if pgid > 1 and b"tests.support.warm" in Path(f"/proc/{pgid}/cmdline").read_bytes():
            os.setpriority(os.PRIO_PGRP, pgid, NICE if done else 0)
    except (OSError, ValueError, IndexError):
        pass


def _builders() -> dict:
    from . import engines, kubebuild, toolkit

    def nvidia_toolkit():
        built = toolkit.ensure()
        toolkit.installer()
        return built.dir

    return {"toolkit": nvidia_toolkit, "kube-apiserver": kubebuild.kube_apiserver, "kwok": kubebuild.kwok,
            "harness": kubebuild.upgrade_harness, "helm": kubebuild.helm, "kube-controller-manager": kubebuild.kube_controller_manager,
            "kube-scheduler": kubebuild.kube_scheduler, "kubelet": kubebuild.kubelet,
            "kubectl": kubebuild.kubectl, "crictl": engines.crictl,
            "containerd2": engines.containerd2, "nri": kubebuild.nri_plugin,
            **{f"containerd-{v}": (lambda v=v: kubebuild.containerd_release(v)) for v in kubebuild.CONTAINERD_RELEASES}}


def main(argv: list | None = None) -> int:
    """Build :data:`BUILDS` (or those named) one after the other, at nice :data:`NICE`, putting off one a test
    builds now; one failure is said and the rest go on (the fixture that needs it builds it again in the
    foreground and fails there, visibly)."""
    import signal
    import time

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: ensure_dir removes its temp dir
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except OSError:
        pass
    _write_pid()
    from . import cache

    cache.WAIT = False  # one a test builds now is put off, not waited for
    builders = _builders()
    pending = list(argv if argv else BUILDS)
    while pending:
        # the first in BUILDS' order that no other process builds now (a test's build, or one holding the
        # compile slot): the order stays the order of need, however long a test's build holds the others off
        for name in pending:
            t0 = time.monotonic()
            try:
                path = builders[name]()
            except cache.Busy:
                continue
            except Exception as e:  # noqa: BLE001 - said, and built again where it is needed
                print(f"warm: {name}: failed after {time.monotonic() - t0:.0f} s: {type(e).__name__}: {e}"[:2000],
                      flush=True)
            else:
                print(f"warm: {name}: {path} ({time.monotonic() - t0:.0f} s)", flush=True)
            pending.remove(name)
            break
        else:  # every one left is under way elsewhere, or waits for the compile slot
            time.sleep(5)
    _trim_build_cache()
    return 0


def _trim_build_cache() -> None:
    """Every build done: the Kubernetes builds' Go build cache (~6 GB) goes; it only speeds up a rebuild of
    what is built now (a changed plugin or harness compiles its packages again, in a minute or less). The
    module downloads stay. Not while a build of a test uses it (its lock)."""
    import shutil

    from . import cache, kubebuild

    root = Path(kubebuild.go_env()["GOCACHE"]).parent
    try:
        with cache.go_compiling():
            for d in [root / "build", *root.glob("go-build*")]:
                shutil.rmtree(d, ignore_errors=True)
    except cache.Busy:
        return
    print(f"warm: trimmed the Go build cache under {root}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
