"""compat_hook.effects.ldcache: the ldconfig child (timeout, rlimits, both start paths) and the plan."""

from __future__ import annotations

import os
import resource
import time

import pytest

from compat_hook.effects import ldcache


def script(tmp_path, body: str, name="ldconfig"):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


# ns_pid=None: posix_spawn with inherited soft limits; ns_pid=our own pid: the
# fork path (setns into our own mount namespace, then fexecve of the script).
PATHS = pytest.mark.parametrize("ns", [None, "self"], ids=["spawn", "fork-setns"])


def _ns(ns):
    return os.getpid() if ns == "self" else None


@PATHS
def test_success_returns_milliseconds(tmp_path, ns):
    out = tmp_path / "args"
    exe = script(tmp_path, f'echo "$@" > {out}')
    ms = ldcache.run_ldconfig(exe, "/some/rootfs", ["/extra"], 5, _ns(ns))
    assert isinstance(ms, int) and ms >= 0
    assert out.read_text().split() == ["-r", "/some/rootfs", "/extra"]


@PATHS
def test_failure_is_one_line_with_the_last_output_line(tmp_path, ns):
    exe = script(tmp_path, 'echo first; echo "ldconfig: boom" >&2; exit 3')
    with pytest.raises(ldcache.LdconfigError, match=r"^ldconfig exited 3: ldconfig: boom$"):
        ldcache.run_ldconfig(exe, "/r", (), 5, _ns(ns))


@pytest.mark.slow
@PATHS
def test_timeout_kills_the_child(tmp_path, ns):
    marker = tmp_path / "survived"
    exe = script(tmp_path, f"sleep 3; touch {marker}")
    t0 = time.monotonic()
    with pytest.raises(ldcache.LdconfigError, match="timed out"):
        ldcache.run_ldconfig(exe, "/r", (), 0.5, _ns(ns))
    assert time.monotonic() - t0 < 2.5
    time.sleep(3)
    # the shell was killed; its sleep child may finish, but the touch never runs
    assert not marker.exists()


@PATHS
def test_child_gets_the_rlimits_and_the_parent_keeps_its_own(tmp_path, ns):
    before = {r: resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_CORE,
                                                   resource.RLIMIT_CPU)}
    exe = script(tmp_path, 'echo "limits $(ulimit -n) $(ulimit -c) $(ulimit -t)"; exit 1')
    with pytest.raises(ldcache.LdconfigError) as e:
        ldcache.run_ldconfig(exe, "/r", (), 5, _ns(ns))
    nofile, core, cpu = str(e.value).split("limits ")[1].split()
    assert int(nofile) <= 1024 and core == "0"
    if ns is None:  # spawn: 6 s plus the CPU time this (pytest) process had used
        ru = resource.getrusage(resource.RUSAGE_SELF)
        assert 6 <= int(cpu) <= 6 + int((ru.ru_utime + ru.ru_stime) * 1.25) + 2
    else:
        assert int(cpu) == 6
    assert {r: resource.getrlimit(r) for r in before} == before


@pytest.mark.slow
def test_a_parent_that_used_more_cpu_than_the_limit_survives(tmp_path):
    """Lowering our own soft RLIMIT_CPU below the CPU already used would SIGXCPU us."""
    import subprocess
    import sys

    exe = script(tmp_path, "true")
    code = ("import time, sys; sys.path.insert(0, %r)\n"
            "from compat_hook.effects import ldcache\n"
            "t = time.process_time()\n"
            "while time.process_time() - t < 2.5: pass\n"
            "ldcache.run_ldconfig(%r, '/r', (), 0.5)\n"
            "print('alive')\n") % (os.getcwd(), exe)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "alive", (p.returncode, p.stderr)


@PATHS
def test_environment_is_explicit(tmp_path, ns, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    monkeypatch.setenv("SECRET", "x")
    out = tmp_path / "env"
    exe = script(tmp_path, f"env > {out}")
    ldcache.run_ldconfig(exe, "/r", (), 5, _ns(ns))
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert "SECRET" not in env and "LD_PRELOAD" not in env
    assert env["LC_ALL"] == "C"


def test_ldconfig_real_is_preferred(tmp_path):
    """Ubuntu: /sbin/ldconfig is a script wrapping ldconfig.real."""
    out = tmp_path / "which"
    exe = script(tmp_path, f"echo wrapper > {out}")
    script(tmp_path, f"echo real > {out}", name="ldconfig.real")
    ldcache.run_ldconfig(exe, "/r", (), 5)
    assert out.read_text().strip() == "real"


def test_not_executable_is_an_error(tmp_path):
    with pytest.raises(ldcache.LdconfigError, match="not executable"):
        ldcache.run_ldconfig(str(tmp_path / "missing"), "/r")
    with pytest.raises(ldcache.LdconfigError, match="not executable"):
        ldcache.run_ldconfig("relative/ldconfig", "/r")


def test_no_fd_leaks(tmp_path):
    exe = script(tmp_path, "true")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        ldcache.run_ldconfig(exe, "/r", (), 5)
    assert len(os.listdir("/proc/self/fd")) == before


def test_plan():
    d = "/usr/local/cuda-12.4/compat"
    assert ldcache.plan_for(True, d, None) == [("write_dropin", d), ("ldconfig", None)]
    assert ldcache.plan_for(True, d, ldcache.dropin_text(d)) == [("ldconfig", None)]
    assert ldcache.plan_for(True, d, "stale\n") == [("write_dropin", d), ("ldconfig", None)]
    assert ldcache.plan_for(False, None, "x") == [("remove_dropin", None), ("ldconfig", None)]
    assert ldcache.plan_for(False, None, None) == []


def test_namespace_pid():
    assert ldcache.namespace_pid({"pid": 1}) is None       # runc createContainer
    assert ldcache.namespace_pid({"pid": 0}) is None       # crun createContainer
    assert ldcache.namespace_pid({"pid": os.getpid()}) is None  # same namespace
    assert ldcache.namespace_pid({"pid": True}) is None
    assert ldcache.namespace_pid({}) is None
