"""``make test``'s two lanes (tests/support/lanes.py) and the run's own hygiene (tests/conftest.py).

What makes two pytest processes at once safe is a property of the modules, so it is checked here on
their text: every module is in one lane; a ``cluster`` module touches nothing of this machine that a
``main`` module checks (runc's state dirs, compat-hook's log, the engines' hook dirs, the installers).
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import lanes, warm

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MODULES = sorted(p.stem for p in TESTS.glob("test_*.py"))


def test_every_module_is_in_one_lane_and_every_named_module_exists():
    assert set(lanes.CLUSTER) <= set(MODULES), set(lanes.CLUSTER) - set(MODULES)
    assert len(set(lanes.CLUSTER)) == len(lanes.CLUSTER)
    by_lane = {m: lanes.lane_of(m) for m in MODULES}
    assert set(by_lane.values()) == {"main", "cluster"}
    # the kubelet node and the containerd releases stay in the lane that runs them after their builds
    for m in ("test_node", "test_node_cdi", "test_node_dra", "test_node_validator", "test_nri", "test_nri_required"):
        assert by_lane[m] == "main", m
    # every cluster module is one the background builder knows to wait for
    assert set(lanes.CLUSTER) <= warm.NEEDS_BUILDS


#: What a ``main`` module checks on this machine, and so what no ``cluster`` module may use.
HOST_WIDE = re.compile(r"support\.runtimes|support import [^\n]*\bruntimes\b|STATE_DIRS|/var/log/compat-hook"
                       r"|hooks\.d|compat_hook\.install|\binstall_(?:node|engines)\b")


@pytest.mark.parametrize("module", lanes.CLUSTER)
def test_a_cluster_module_touches_nothing_a_main_module_checks_on_this_machine(module):
    text = (TESTS / f"{module}.py").read_text()
    found = sorted({m.group(0) for m in HOST_WIDE.finditer(text)})
    assert found == [], f"{module} uses {found}: it belongs in the main lane"


def test_the_runner_docstrings_hold():
    for mod in (lanes,):
        failed, _ = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert failed == 0, mod.__name__


def test_a_busy_mount_keeps_a_dir_and_a_plain_dir_may_go(tmp_path):
    plain = tmp_path / "plain"
    (plain / "a").mkdir(parents=True)
    assert lanes.removable(plain)
    mounted = tmp_path / "mounted"
    (mounted / "m").mkdir(parents=True)
    # a mount in a private namespace of a child: not this process's, so it cannot hold the dir ...
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f"mount -t tmpfs x {mounted / 'm'} && grep -c ' {mounted / 'm'} ' /proc/self/mountinfo"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "1", r
    assert lanes.removable(mounted)
    # ... one in this process's namespace does (a removal would reach into the mount)
    if os.geteuid() != 0:
        pytest.fail("needs root, as the suite does")
    subprocess.run(["mount", "-t", "tmpfs", "x", str(mounted / "m")], check=True)
    try:
        assert not lanes.removable(mounted)
    finally:
        subprocess.run(["umount", str(mounted / "m")], check=True)
    assert lanes.removable(mounted)


def _tree(tmp: Path, files: dict) -> dict:
    """A small suite of its own: ``files`` under ``tmp/tests``, with the repository's conftest (its lane split),
    ``tests.support`` and compat_hook importable; returns the environment to run it in."""
    t = tmp / "tests"
    t.mkdir()
    (t / "__init__.py").write_text("")
    (t / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    os.symlink(TESTS / "support", t / "support")
    for helper in TESTS.glob("*.py"):  # the suite's own helper modules (tests/elfgen.py)
        if not helper.name.startswith("test_") and helper.name not in ("__init__.py", "conftest.py"):
            os.symlink(helper, t / helper.name)
    for name, text in files.items():
        (t / name).write_text(text)
    os.symlink(REPO / "compat_hook", tmp / "compat_hook")
    (tmp / "tmp").mkdir()
    # the runner's temp dir (kept when a lane fails) under the test's own
    env = dict(os.environ, COMPAT_HOOK_TEST_WARM="0", TMPDIR=str(tmp / "tmp"))
    env.pop(lanes.ENV, None)
    return env


def _runner(tmp: Path, files: dict, *args) -> subprocess.CompletedProcess:
    """tests/support/lanes.py on :func:`_tree`."""
    env = _tree(tmp, files)
    return subprocess.run([sys.executable, "-m", "tests.support.lanes", "tests", *args],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def test_both_lanes_run_and_a_failure_in_the_cluster_lane_shows_at_once_and_fails_the_run(tmp_path):
    r = _runner(tmp_path, {
        "test_fleet.py": "def test_in_cluster():\n    assert 1 + 1 == 3, 'cluster lane failure'\n",
        "test_decision.py": "import os\n\ndef test_in_main():\n    assert os.environ['COMPAT_HOOK_TEST_LANE'] == 'main'\n",
    })
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "[cluster lane] FAILED (call" in out and "test_fleet.py::test_in_cluster" in out, out
    assert "the cluster lane's report" in out and "1 failed" in out and "1 passed" in out, out
    assert "their temp dirs:" in out, out  # kept for the failure's logs, and named
    kept = Path(re.search(r"their temp dirs: (\S+)", out).group(1))
    assert (kept / "cluster.out").is_file() and kept.parent == tmp_path / "tmp", kept


def test_a_passing_run_removes_its_temp_dirs_and_a_passed_tests_tmp_path(tmp_path):
    r = _runner(tmp_path, {
        "test_fleet.py": "def test_in_cluster(tmp_path):\n    (tmp_path / 'f').write_text('x')\n",
        "test_decision.py": ("import pathlib\n\ndef test_in_main(tmp_path):\n"
                             "    pathlib.Path(__file__).with_name('seen').write_text(str(tmp_path))\n"),
    })
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "their temp dirs:" not in out
    seen = Path((tmp_path / "tests" / "seen").read_text())
    assert not seen.exists()  # the passed test's tmp_path went after it was reported
    assert not seen.parents[1].exists()  # and the lanes' temp dir when both passed


def test_a_given_basetemp_holds_one_dir_per_lane_and_stays(tmp_path):
    bt = tmp_path / "bt"
    r = _runner(tmp_path, {
        "test_fleet.py": "def test_in_cluster(tmp_path):\n    assert 'cluster' in tmp_path.parts\n",
        "test_decision.py": "def test_in_main(tmp_path):\n    assert 'main' in tmp_path.parts\n",
    }, f"--basetemp={bt}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert sorted(p.name for p in bt.iterdir() if p.is_dir()) == ["cluster", "main"], out  # neither emptied the other


def test_sigterm_stops_both_lanes_through_their_teardown(tmp_path):
    """SIGTERM to the runner: each lane's pytest gets SIGINT and runs its fixtures' teardown (the daemons a
    fixture started are stopped), then the runner exits non-zero."""
    marks = tmp_path / "marks"
    marks.mkdir()
    body = ("import pathlib, time, pytest\n\n@pytest.fixture\ndef daemon():\n    yield\n"
            f"    pathlib.Path({str(marks)!r}, '{{}}').write_text('torn down')\n\n"
            f"def test_long(daemon):\n    pathlib.Path({str(marks)!r}, '{{}}-started').write_text('x')\n"
            "    time.sleep(120)\n")
    files = {"test_fleet.py": body.format("cluster", "cluster"), "test_decision.py": body.format("main", "main")}
    import signal
    import time

    t = tmp_path / "t"
    t.mkdir()
    env = _tree(t, files)
    p = subprocess.Popen([sys.executable, "-m", "tests.support.lanes", "tests"], cwd=t, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not ((marks / "main-started").exists() and (marks / "cluster-started").exists()):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()[0]
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=90)[0].decode()
    assert p.returncode != 0, out
    assert (marks / "main").read_text() == "torn down" and (marks / "cluster").read_text() == "torn down", out


def test_the_builder_builds_in_order_of_need_and_puts_off_what_another_process_holds(tmp_path):
    """tests/support/warm.py: a build another process holds is put off, and the next one free is built; once it
    is free again the first in the order comes first (not the queue's rotation: a cold run once built a
    containerd release, needed last, while a test waited for kube-controller-manager)."""
    script = f"""
import sys
from tests.support import cache, warm
calls = []
busy = {{"apiserver": 1}}  # held elsewhere at the first try
def make(name):
    def build():
        calls.append(name)
        if busy.get(name):
            busy[name] -= 1
            raise cache.Busy(name)
        return name
    return build
warm._builders = lambda: {{n: make(n) for n in ("toolkit", "apiserver", "kubelet", "release")}}
import time
time.sleep = lambda s: None
warm.main(["toolkit", "apiserver", "kubelet", "release"])
print(" ".join(calls))
"""
    env = dict(os.environ, COMPAT_HOOK_TEST_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # apiserver held: kubelet is built meanwhile; then apiserver (first in order) before the release
    assert r.stdout.split("\n")[-2] == "toolkit apiserver kubelet apiserver release", r.stdout
