"""``make test``: the suite in two pytest processes at once, each lane a fixed set of whole modules.

On 2 cores one pytest process leaves a core idle much of the time: the control plane's modules wait on
an API server, etcd and their agents (leases, watches, deadlines), the rest on containers. Run one
after the other, a cold run took over 60 minutes. So:

* lane ``cluster``: the modules that need only the control plane (:data:`CLUSTER`: a real API server
  and etcd, kwok, helm, NVIDIA's upgrade state machine). Each starts its own API server and etcd on
  ports of its own, its own containerd or podman where it needs one (own sockets, state and storage);
  none of them runs compat-hook's hook on this machine's engines or writes this machine's log;
* lane ``main``: every other module, in the order tests/support/warm.py gives (the real kubelet node
  and the containerd releases last, while their builds end in the background).

Safe to run together: a module keeps every test in one process, and what a test checks on the machine
(runc's state dirs, ``/var/log/compat-hook.log``, the installed hooks) is touched only by modules of
the ``main`` lane. Each lane has its own ``--basetemp`` under one private temp dir, removed when both
pass (kept, and named, when one fails).

The ``cluster`` lane's output goes to a file; its progress lines (builds, failures) show at once,
prefixed, and its whole report follows the ``main`` lane's. The exit status is the first non-zero of
the two. ``COMPAT_HOOK_TEST_LANES=1`` runs one process, as plain pytest does.

    /usr/bin/python3 -m tests.support.lanes [pytest options]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["CLUSTER", "ENV", "exit_status", "lane_of", "removable", "main"]

#: The ``cluster`` lane, in its order: those that need only kube-apiserver and kwok first (its first
#: build), then NVIDIA's state machine (the harness), then helm.
CLUSTER = ("test_cluster_offline", "test_hostile_cluster", "test_validator_age", "test_cluster_churn",
           "test_cluster_runbook", "test_validator", "test_cluster", "test_fleet", "test_admission",
           "test_kubernetes")

#: Which lane this pytest process runs (unset: every module).
ENV = "COMPAT_HOOK_TEST_LANE"


def lane_of(module: str) -> str:
    """The lane of a test module (its file's stem).

    >>> lane_of("test_fleet"), lane_of("test_node")
    ('cluster', 'main')
    """
    return "cluster" if module in CLUSTER else "main"


def exit_status(main_rc: int, cluster_rc: int) -> int:
    """The run's exit status from the two lanes': the first failure's; a lane in which nothing was
    selected (pytest's 5, ``make test-only tests/test_node.py``) is not one, unless neither ran a test.

    >>> exit_status(0, 0), exit_status(0, 5), exit_status(5, 0), exit_status(5, 5)
    (0, 0, 0, 5)
    >>> exit_status(1, 0), exit_status(0, 1), exit_status(2, 1), exit_status(5, 1)
    (1, 1, 2, 1)
    """
    if {main_rc, cluster_rc} <= {0, 5}:
        return 5 if main_rc == cluster_rc == 5 else 0
    return next(rc for rc in (main_rc, cluster_rc) if rc not in (0, 5))


def removable(top: Path) -> bool:
    """True when nothing is mounted under ``top`` in this mount namespace (a live bind mount under it
    would make a tree removal reach the mount's source)."""
    at = str(top.resolve())
    try:
        with open("/proc/self/mountinfo") as f:
            return not any((mp := line.split()[4]) == at or mp.startswith(at + "/") for line in f)
    except OSError:
        return False


def _without_basetemp(args: list) -> tuple:
    """``(args without --basetemp, its value or None)``.

    >>> _without_basetemp(["-x", "--basetemp", "/tmp/b", "tests/test_a.py"])
    (['-x', 'tests/test_a.py'], '/tmp/b')
    >>> _without_basetemp(["--basetemp=/tmp/b"]), _without_basetemp(["-q"])
    (([], '/tmp/b'), (['-q'], None))
    """
    out, value, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == "--basetemp" and i + 1 < len(args):
            value, i = args[i + 1], i + 2
            continue
        if a.startswith("--basetemp="):
            value = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    return out, value


def _wait(p: subprocess.Popen, stopping: list) -> int:
    """``p``'s exit status; once the run is being stopped, at most 60 s more, then it is killed."""
    import time

    deadline = None
    while True:
        try:
            return p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        if stopping and deadline is None:
            deadline = time.monotonic() + 60
        if deadline is not None and time.monotonic() > deadline:
            p.kill()


def main(argv: list | None = None) -> int:
    import shutil

    args = list(sys.argv[1:] if argv is None else argv)
    base = [sys.executable, "-m", "pytest", "-ra", "--durations=25", "-p", "no:cacheprovider",
            "-p", "tests.support.progress"]
    if os.environ.get("COMPAT_HOOK_TEST_LANES") == "1":
        os.execv(sys.executable, base + args)
    args, given = _without_basetemp(args)
    if given:  # one pytest would empty the other's: each lane gets a dir of its own under it
        top = Path(given).resolve()
        top.mkdir(parents=True, exist_ok=True)
    else:
        top = Path(tempfile.mkdtemp(prefix="pytest-lanes-"))
    own_temp = not given
    out_path = top / "cluster.out"
    say_r, say_w = os.pipe()  # the cluster lane's progress lines, shown as they come
    env = dict(os.environ)
    with open(out_path, "wb") as out:
        cluster = subprocess.Popen(
            base + [f"--basetemp={top / 'cluster'}"] + args,
            env=dict(env, **{ENV: "cluster", "COMPAT_HOOK_PROGRESS_FD": str(say_w),
                             "COMPAT_HOOK_PROGRESS_PREFIX": "[cluster lane]"}),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, pass_fds=(say_w,),
            start_new_session=True)
    os.close(say_w)
    import threading

    def relay() -> None:
        with os.fdopen(say_r, "rb") as r:
            for line in r:
                sys.stderr.buffer.write(line)
                sys.stderr.flush()

    t = threading.Thread(target=relay, daemon=True)
    t.start()
    # its own session too: a terminal's Ctrl-C reaches only this runner, which passes it on once
    main = subprocess.Popen(base + [f"--basetemp={top / 'main'}"] + args, env=dict(env, **{ENV: "main"}),
                            start_new_session=True)

    # Ctrl-C or SIGTERM: each lane gets one SIGINT, which pytest turns into KeyboardInterrupt, so its
    # fixtures' teardown stops the daemons it started; one that is not done 60 s later is killed.
    stopping = []

    def stop(signum, _frame) -> None:
        if stopping:
            return
        stopping.append(signum)
        for p in (main, cluster):
            try:
                os.kill(p.pid, signal.SIGINT)
            except OSError:
                pass

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        main_rc = _wait(main, stopping)
        if cluster.poll() is None and not stopping:
            print("\n[compat-hook tests] the main lane is done; waiting for the cluster lane ...", flush=True)
        cluster_rc = _wait(cluster, stopping)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    t.join(5)
    print(f"\n{'=' * 30} the cluster lane's report {'=' * 30}", flush=True)
    sys.stdout.buffer.write(out_path.read_bytes())
    sys.stdout.flush()
    rc = exit_status(main_rc, cluster_rc)
    if rc == 0 and own_temp and removable(top):
        shutil.rmtree(top, ignore_errors=True)
    else:
        print(f"[compat-hook tests] lanes: main exit {main_rc}, cluster exit {cluster_rc}; their temp dirs: {top}",
              flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
