"""A registration outlives its installation: containers must still start (real runc).

The installation under test is a copy of ``compat_hook/`` in a temp dir,
registered from there exactly as a user does (``compat-hook hook-entry`` for
a config.json hook, ``compat-hook install docker --wrapper-path`` for the
runtime wrapper), then moved away (renamed), as when a venv is deleted or a
package is half removed. A second registration is made from a copy of the
interpreter itself, which is then deleted (a pyenv or /opt Python removed).

Then real runc containers, through the hook at createContainer and through
the wrapper as their runtime:

* configuration ``on_error: continue`` (the default): the container starts;
  the hook (run by hand with the state on stdin, as runc runs it) and the
  wrapper say so in one line on stderr;
* ``on_error: fail`` (read at registration): the container does not start,
  the runtime's error carries that one line; verbs other than create
  (``list``, ``delete``) still reach runc.

runc drops a successful hook's stderr, so each of them also appends one JSON
line to the log file the configuration named at registration
(``"event": "fail_open"`` or ``"fail_closed"``, ``"decision": "error"``,
``"reason": "installation_missing"``, the container id), and ``compat-hook
report --fail-on failures`` counts it.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from tests.support import rootfs, runtimes as rt

pytestmark = pytest.mark.containers

PY = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
GPU_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all")
ARGS = ("/bin/sh", "-c", "echo container-started")


def _cli(python, site, *argv) -> subprocess.CompletedProcess:
    """``compat-hook ARGV`` run by ``python`` from the installation in ``site``."""
    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.commands.cli import main; sys.exit(main())"
    p = subprocess.run([str(python), "-I", "-c", code, str(site), *map(str, argv)], capture_output=True,
                       text=True, env=ENV, stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 0, (argv, p.stdout, p.stderr)
    return p


class Registration:
    """One installation's hook entry and wrapper, for ``on_error`` continue or fail."""

    def __init__(self, base: pathlib.Path, python, site: pathlib.Path, on_error: str) -> None:
        base.mkdir(parents=True)
        self.cfg = base / "compat-hook.yaml"
        self.log = base / "compat-hook.log"
        self.cfg.write_text(f"on_error: {on_error}\nlog_file: {self.log}\n")
        self.entry = json.loads(_cli(python, site, "hook-entry", "--config", self.cfg,
                                     "--state-dir", base / "state").stdout)
        self.wrapper = base / "bin" / "compat-hook-runtime"
        out = _cli(python, site, "install", "docker", "--engine-config", base / "daemon.json", "--wrapper-path",
                   self.wrapper, "--hook-config", self.cfg, "--state-dir", base / "state").stdout
        assert f"wrote {self.wrapper}" in out, out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("failopen")
    site = base / "site"
    shutil.copytree(REPO / "compat_hook", site / "compat_hook", ignore=shutil.ignore_patterns("__pycache__"))
    py = base / "py" / "bin" / "python3"  # an interpreter outside /usr/bin, soon deleted
    py.parent.mkdir(parents=True)
    shutil.copy2(os.path.realpath(PY), py)
    regs = {
        "moved": Registration(base / "moved", PY, site, "continue"),
        "moved-fail": Registration(base / "moved-fail", PY, site, "fail"),
        "python-gone": Registration(base / "python-gone", py, site, "continue"),
        "python-gone-fail": Registration(base / "python-gone-fail", py, site, "fail"),
    }
    # While the installation is in place, the entries start compat-hook (a non-GPU state: a quick skip).
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1,
                        "bundle": str(base / "nowhere")})
    for r in regs.values():
        p = _run_entry(r.entry, state)
        assert "cannot start" not in p.stderr, p.stderr
        r.log.unlink(missing_ok=True)  # that start's own record: each test reads what the failure wrote
    os.rename(site, base / "site.moved")
    shutil.rmtree(py.parent.parent)
    rfs = rootfs.build_rootfs(base / "rootfs")
    return {"regs": regs, "rootfs": rfs, "base": base}


def _run_entry(entry: dict, state: str) -> subprocess.CompletedProcess:
    """The hook entry run the way runc runs it: argv, the entry's env only, the state on stdin."""
    env = dict(e.split("=", 1) for e in entry["env"])
    return subprocess.run(entry["args"], executable=entry["path"], input=state, capture_output=True, text=True,
                          env=env, timeout=60)


def _logged(reg: Registration, event: str, component: str, container_id: str) -> None:
    """One JSON line in the registration's log, which ``compat-hook report`` counts as a failure."""
    recs = [json.loads(ln) for ln in reg.log.read_text().splitlines()] if reg.log.exists() else []
    mine = [r for r in recs if r.get("container_id") == container_id]
    assert len(mine) == 1, recs
    r = mine[0]
    assert (r["event"], r["decision"], r["reason"], r["component"], r["container_id"]) == \
        (event, "error", "installation_missing", component, container_id), r
    assert r["time"].endswith("Z")
    p = subprocess.run([PY, "-m", "compat_hook", "report", "--log", str(reg.log), "--json", "--fail-on", "failures"],
                       cwd=REPO, capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 3, (p.stdout, p.stderr)
    rep = json.loads(p.stdout)
    assert rep["summary"]["failures"] == len(recs), rep  # every fail-open start is counted


def _bundle(world, name: str, hooks=None) -> pathlib.Path:
    return rt.make_bundle(world["base"] / "bundles" / name, world["rootfs"], args=ARGS, env=GPU_ENV, hooks=hooks)


def _hook_state(bundle: pathlib.Path) -> str:
    return json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle)})


@pytest.mark.parametrize("case", ["moved", "python-gone"])
def test_hook_whose_installation_is_gone_lets_the_container_start(world, case):
    reg = world["regs"][case]
    if case == "python-gone":
        assert reg.entry["path"] == "/bin/sh"  # a /bin/sh front checks a non-OS interpreter is still there
    else:
        assert reg.entry["path"] == PY and "--fail-closed" not in reg.entry["args"]
    bundle = _bundle(world, f"hook-{case}", hooks={"createContainer": [reg.entry]})
    p = _run_entry(reg.entry, _hook_state(bundle))
    lines = p.stderr.splitlines()
    assert p.returncode == 0 and len(lines) == 1, p.stderr
    assert lines[0].startswith("compat-hook: cannot start") and "starts without compat-hook" in lines[0]
    assert "Traceback" not in p.stderr
    _logged(reg, "fail_open", "hook", "c1")
    res = rt.run_container(bundle, "runc")
    assert res.rc == 0 and res.stdout == "container-started\n", str(res)


@pytest.mark.parametrize("case", ["moved-fail", "python-gone-fail"])
def test_hook_with_on_error_fail_stops_the_container(world, case):
    reg = world["regs"][case]
    assert "--fail-closed" in reg.entry["args"]
    bundle = _bundle(world, f"hook-{case}", hooks={"createContainer": [reg.entry]})
    p = _run_entry(reg.entry, _hook_state(bundle))
    lines = p.stderr.splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "on_error: fail" in lines[0], p.stderr
    _logged(reg, "fail_closed", "hook", "c1")
    res = rt.run_container(bundle, "runc")
    assert res.rc != 0 and "container-started" not in res.stdout, str(res)
    assert "compat-hook: cannot start" in res.stderr, str(res)  # runc shows a failed hook's stderr


def _through_wrapper(world, wrapper: pathlib.Path, name: str):
    bundle = _bundle(world, f"wrapper-{name}")
    state = world["base"] / "runc-state" / name
    state.mkdir(parents=True)
    cid = f"failopen-{name}"
    try:
        p = subprocess.run([str(wrapper), "--root", str(state), "run", "--bundle", str(bundle), cid],
                           capture_output=True, text=True, env=ENV, stdin=subprocess.DEVNULL, timeout=60)
        listed = subprocess.run([str(wrapper), "--root", str(state), "list", "-q"], capture_output=True,
                                text=True, env=ENV, stdin=subprocess.DEVNULL, timeout=60)
    finally:
        subprocess.run([rt.RUNC, "--root", str(state), "delete", "--force", cid], capture_output=True, env=ENV)
    assert listed.returncode == 0, listed.stderr  # a pass-through verb never needs compat-hook
    return p


@pytest.mark.parametrize("case", ["moved", "python-gone"])
def test_wrapper_whose_installation_is_gone_runs_the_real_runtime(world, case):
    p = _through_wrapper(world, world["regs"][case].wrapper, case)
    lines = p.stderr.splitlines()
    assert p.returncode == 0 and p.stdout == "container-started\n", (p.stdout, p.stderr)
    assert len(lines) == 1 and lines[0].startswith("compat-hook-runtime: ") and "without compat-hook" in lines[0], \
        p.stderr
    _logged(world["regs"][case], "fail_open", "runtime", f"failopen-{case}")  # only the create, not `list`


@pytest.mark.parametrize("case", ["moved-fail", "python-gone-fail"])
def test_wrapper_with_on_error_fail_creates_nothing(world, case):
    p = _through_wrapper(world, world["regs"][case].wrapper, case)
    lines = p.stderr.splitlines()
    assert p.returncode == 1 and "container-started" not in p.stdout, (p.stdout, p.stderr)
    assert len(lines) == 1 and "on_error: fail" in lines[0], p.stderr
