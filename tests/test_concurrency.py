"""Many hooks at once: 32 on 32 rootfs, and 8 on one rootfs (real ldconfig, shared log and state dir).

The runs are released together: every hook is started with its stdin still
empty, and once all are up (the interpreter has started and is waiting for
the state) the states are written to all of them at once.

Afterwards: every hook exited 0 and decided "enable"; each rootfs holds
exactly one drop-in with the right content and no temp file; its ld cache is
whole (``ldconfig -p -C`` reads it and finds the compat libcuda); every log
line is whole, valid JSON; every file in the state dir's cache is valid JSON
and no temp file is left.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time

import pytest

from tests.support import hostile as h
from tests.support import runtimes as rt

# Dozens of hook processes with real ldconfig runs: seconds, not the edit-test loop.
pytestmark = pytest.mark.slow

Path = pathlib.Path


@pytest.fixture(autouse=True)
def _no_leaks(tmp_path):
    yield
    assert rt.mounts_under(tmp_path) == []
    assert h.processes_mentioning(str(tmp_path)) == []


def _start(entry: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(entry["args"], executable=entry["path"], env=h.entry_env(entry), cwd=cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            close_fds=True, start_new_session=True)


def _run_together(entry: dict, bundles: list[Path]) -> list[tuple[int, bytes, bytes]]:
    procs = [_start(entry, b / "rootfs") for b in bundles]
    try:
        time.sleep(0.3 + 0.02 * len(procs))  # all started, each blocked reading its stdin
        for p, b in zip(procs, bundles):
            p.stdin.write(h.state_json(b))
        for p in procs:
            p.stdin.close()
            p.stdin = None  # communicate() must not flush it again
        out = []
        deadline = time.monotonic() + entry["timeout"]
        for p in procs:
            o, e = p.communicate(timeout=max(1, deadline - time.monotonic()))
            out.append((p.returncode, o, e))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


def _check_rootfs(root: Path) -> None:
    confd = root / "etc/ld.so.conf.d"
    assert sorted(os.listdir(confd)) == ["00-00-compat-hook.conf", "libc.conf"], os.listdir(confd)
    assert (root / h.DROPIN).read_text() == h.dropin_text(h.COMPAT_DIR)
    assert [n for n in os.listdir(root / "etc") if n.endswith(("~", ".tmp"))] == []
    p = subprocess.run(["/sbin/ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert f"{h.COMPAT_DIR}/libcuda.so.1" in p.stdout, p.stdout


def _check_shared(env: h.HookEnv, expect_lines: int) -> list[dict]:
    raw = env.log.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == expect_lines, len(lines)
    recs = [json.loads(line) for line in lines]  # each line whole, valid JSON
    assert all(isinstance(r, dict) and r["event"] == "hook" for r in recs)
    cache = env.state_dir / "cache"
    names = os.listdir(cache)
    assert names and not [n for n in names if not n.endswith(".json")], names
    for n in names:
        assert isinstance(json.loads((cache / n).read_bytes()), dict), n
    return recs


def _check_results(results, recs) -> None:
    for rc, out, err in results:
        assert rc == 0 and out == b"" and err == b"", (rc, out, err)
    for r in recs:
        assert r["decision"] == "enable" and r["compat_dir"] == h.COMPAT_DIR, r
        assert r["actions"][-1].startswith("ldconfig -r"), r


def test_32_hooks_on_32_rootfs(tmp_path):
    env = h.make_hook_env(tmp_path / "hookenv", ldconfig_timeout=20)
    bundles = []
    for i in range(32):
        b = h.write_bundle(tmp_path / f"bundle{i}")
        h.base_rootfs(b / "rootfs")
        bundles.append(b)
    results = _run_together(env.entry, bundles)
    recs = _check_shared(env, 32)
    _check_results(results, recs)
    assert sorted(r["rootfs"] for r in recs) == sorted(str(b / "rootfs") for b in bundles)
    for b in bundles:
        _check_rootfs(b / "rootfs")


@pytest.mark.parametrize("round_", range(3))
def test_8_hooks_on_one_rootfs(tmp_path, round_):
    env = h.make_hook_env(tmp_path / "hookenv", ldconfig_timeout=20)
    b = h.write_bundle(tmp_path / "bundle")
    h.base_rootfs(b / "rootfs")
    if round_ == 2:
        # A restart with a stale drop-in of another dir: all 8 must converge on the right one.
        (b / "rootfs" / h.DROPIN).write_text(h.dropin_text("/usr/local/cuda-11.0/compat"))
    results = _run_together(env.entry, [b] * 8)
    recs = _check_shared(env, 8)
    _check_results(results, recs)
    _check_rootfs(b / "rootfs")
