"""The toolkit watcher registers again by itself (compat_hook/install/watch.py ``--wrapper-path``).

The DaemonSet's loop (packaging/kubernetes/compat-hook-k8s.sh) runs the
watcher with ``--wrapper-path``: when the GPU Operator's toolkit container
deletes its dir and writes ``config.toml`` anew, the watcher registers
compat-hook again in its own process, before it says ``change``, and only
then does the shell's own check run. Here the watcher runs alone, on real
inotify, with no shell behind it: every rewrite is registered again (the
operator's settings kept), a file still being written (``os.Create`` and
then the write, as nvidia-ctk-installer does) is left alone until it is
closed, a registration that fails is one line on stderr and the watcher
goes on (the ``change`` line still comes, for the shell's fallback), and the
imports are done before ``ready`` (none at the first registration).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import tomllib

from tests.test_soak import PY, REPO, Lines

#: What nvidia-ctk-installer writes (abridged): its own runtimes, no compat-hook.
OPERATOR_TOML = """\
accept-nvidia-visible-devices-as-volume-mounts = false

[nvidia-container-cli]
  ldconfig = "@/run/nvidia/driver/sbin/ldconfig.real"
  root = "/run/nvidia/driver"

[nvidia-container-runtime]
  log-level = "info"
  mode = "auto"
  runtimes = ["docker-runc", "runc", "crun"]
"""


def _node(tmp_path):
    """``(config.toml, its toolkit dir, the wrapper path, compat-hook's config)`` under ``tmp_path``."""
    top = tmp_path / "toolkit"
    hook = tmp_path / "config.yaml"
    hook.write_text("runtime: runc\n")
    return top / ".config/nvidia-container-runtime/config.toml", top, tmp_path / "bin/compat-hook-runtime", hook


def _runtimes(cfg) -> list:
    return tomllib.loads(cfg.read_text())["nvidia-container-runtime"]["runtimes"]


def _operator_start(top, cfg) -> None:
    """nvidia-ctk-installer's start: the toolkit dir deleted, config.toml created, written, closed."""
    shutil.rmtree(top, ignore_errors=True)
    cfg.parent.mkdir(parents=True)
    with open(cfg, "w") as f:
        f.write(OPERATOR_TOML)


def _until_registered(cfg, wrapper) -> None:
    """Wait (10 s at most) until ``cfg`` names ``wrapper`` first: nothing but the watcher writes it here."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if _runtimes(cfg)[:1] == [str(wrapper)]:
                return
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            pass
        time.sleep(0.01)
    raise AssertionError(f"not registered again: {cfg.read_text() if cfg.exists() else 'no file'}")


def _drain(w) -> list:
    """The lines the watcher prints until it is quiet for 0.5 s."""
    out = []
    while (line := w.next(0.5)) is not None:
        out.append(line)
    return out


def test_watch_registers_every_rewrite_itself_and_survives_a_failure(tmp_path):
    cfg, top, wrapper, hook = _node(tmp_path)
    empty = tmp_path / "etc/config.toml"  # a second config, empty all along: never waited for
    empty.parent.mkdir()
    empty.write_text("")
    w = Lines("--every", 60, "--wrapper-path", wrapper, "--hook-config", hook, cfg, empty)
    try:
        assert w.next() == "ready"
        for _ in range(2):  # the operator's toolkit container, started twice
            _operator_start(top, cfg)
            _until_registered(cfg, wrapper)
            data = tomllib.loads(cfg.read_text())
            assert data["nvidia-container-runtime"]["runtimes"] == [str(wrapper), "docker-runc", "runc", "crun"]
            assert data["nvidia-container-cli"]["root"] == "/run/nvidia/driver"  # the operator's settings kept
            assert os.access(wrapper, os.X_OK) and wrapper.read_text().startswith("#!/bin/sh\n# compat-hook-runtime:")
            assert set(_drain(w)) <= {"change"}
        # the second start left the same bytes as the first: no line (the shell has nothing to check)
        assert cfg.read_text().count(str(wrapper)) == 2  # in runtimes and in the install's record

        # nvidia-ctk-installer: os.Create, then the write, then the close; nothing is read or
        # replaced before the close (the write would go to a file no longer there)
        shutil.rmtree(top)
        cfg.parent.mkdir(parents=True)
        with open(cfg, "w") as f:
            ino = os.stat(cfg).st_ino
            assert set(_drain(w)) <= {"change"}  # the deletion may be told
            assert cfg.read_text() == ""
            f.write(OPERATOR_TOML)
            f.flush()
            assert w.next(0.5) is None
            assert os.stat(cfg).st_ino == ino and cfg.read_text() == OPERATOR_TOML
        _until_registered(cfg, wrapper)
        assert tomllib.loads(cfg.read_text())["nvidia-container-cli"]["root"] == "/run/nvidia/driver"
        _drain(w)

        # a rewrite the install refuses: one line on stderr, the change told (the shell's fallback
        # runs on it), and the watcher goes on
        tmp = cfg.with_name(".new")
        tmp.write_text(OPERATOR_TOML + "broken = [\n")
        os.rename(tmp, cfg)
        assert w.next(10) == "change"
        assert w.p.poll() is None and "broken = [" in cfg.read_text()
        _operator_start(top, cfg)
        _until_registered(cfg, wrapper)
        assert set(_drain(w)) == {"change"}  # told after the registration's own line on stderr
    finally:
        err = w.close()
    failed = [ln for ln in err.splitlines() if "failed" in ln]
    assert len(failed) == 1 and failed[0].startswith(f"compat-hook watch: registering again under {cfg} failed: "), err
    assert "not valid TOML" in failed[0] and "Traceback" not in err, err
    assert err.count(f"compat-hook watch: registered again under {cfg}\n") == 4, err
    assert empty.read_text() == "" and str(empty) not in err, err


WARM = """
import io, sys
from compat_hook.install.watch import Reregister
register = Reregister(sys.argv[1], sys.argv[2], err=io.StringIO())
register.warm()
before = set(sys.modules)
assert register(sys.argv[3]) is True, register.err.getvalue()
print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("compat_hook", "tomlkit", "yaml")))
"""


def test_the_imports_are_done_before_ready(tmp_path):
    cfg, _, wrapper, hook = _node(tmp_path)
    cfg.parent.mkdir(parents=True)
    cfg.write_text(OPERATOR_TOML)
    p = subprocess.run([PY, "-I", "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); " + WARM, REPO,
                        wrapper, hook, cfg], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "[]\n", p.stdout + p.stderr
    assert _runtimes(cfg)[0] == str(wrapper)
