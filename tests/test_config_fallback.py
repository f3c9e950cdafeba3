"""A configuration file that does not load, at container start: the built-in defaults decide.

The hook and the runtime wrapper (``core.config.load_for_start``) no longer step
aside when their configuration is invalid YAML, has a bad value, cannot be read
or is missing: the built-in defaults decide and the decision is applied, with
what the registration itself fixed (its log file; the wrapper's ``runtime:``
when its line reader is sure). The start's log line is the decision's, plus
``"config": "defaults"`` and ``config_error``. A fail-closed registration
(``on_error: fail`` at registration: ``--fail-closed``) still stops the start.
Nothing of the invalid file is cached: the fixed file decides the next start.

Everything runs as the engine runs it: the registered hook entry with the OCI
state on stdin, the rendered shell wrapper with runc's argv. The defaults read
the host driver at ``/``: this machine's ``/proc/driver`` is replaced by a fake
host's in a private mount namespace (``tests.support.trees.machine_driver_argv``).
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess

import pytest

from compat_hook.core.registration import hook_entry
from compat_hook.install.wrapper import render_wrapper
from tests.support import hostile as H
from tests.support.trees import machine_driver_argv, write_fake_host

PY = "/usr/bin/python3"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
DROPIN = H.DROPIN
GPU = "NVIDIA A100-SXM4-80GB"

#: (how the file is broken, the config_error it gives; {path}: the file)
BROKEN = {
    "yaml": ("mode: env\nmode: [\n", "{path}: not valid YAML at line 3: expected the node content, but found "
                                     "'<stream end>'"),
    "value": ("mode: sideways\n", "mode: must be one of ldconfig, env, both, got 'sideways'"),
    "unreadable": (None, "{path}: cannot read: Is a directory"),
    "missing": (False, "{path}: no such file"),
}


def _break(path: pathlib.Path, how: str) -> str:
    """Break the config file at ``path`` the way ``how`` says; returns the expected config_error."""
    text, error = BROKEN[how]
    if text is None:
        path.unlink()
        path.mkdir()
    elif text is False:
        path.unlink()
    else:
        path.write_text(text)
    return error.format(path=path)


def _config_cache(state_dir: pathlib.Path) -> list:
    """The texts of the parsed configs cached in the state dir."""
    return [json.load(open(p))["text"] for p in glob.glob(os.path.join(state_dir, "cache", "config-*.json"))]


# --------------------------------------------------------------------------- the hook


def _hook_start(env: H.HookEnv, bundle: pathlib.Path, node: pathlib.Path, cid: str) -> H.HookResult:
    """One start of the registered hook entry, on this machine with ``node``'s driver."""
    prefix = machine_driver_argv(node)
    entry = dict(env.entry, path=prefix[0], args=prefix + list(env.entry["args"]))
    return H.run_hook(entry, H.state_json(bundle, id=cid))


def _hook_world(tmp_path, on_error="continue"):
    env = H.make_hook_env(tmp_path / "reg", on_error=on_error)
    bundle = tmp_path / "bundle"
    H.base_rootfs(bundle / "rootfs")
    H.write_bundle(bundle)
    node = write_fake_host(tmp_path / "node", version=H.HOST_DRIVER, gpus=[GPU])
    return env, bundle, node


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_hook_decides_with_the_defaults(tmp_path, how):
    env, bundle, node = _hook_world(tmp_path)
    error = _break(env.config, how)
    res = _hook_start(env, bundle, node, "c1")
    assert res.rc == 0, res
    # The defaults (mode ldconfig) on the older host driver: the image's compat driver is used.
    assert (bundle / "rootfs" / DROPIN).read_text() == H.dropin_text(H.COMPAT_DIR)
    [rec] = env.log_records()   # the registration's log file, though the file naming it is broken
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("enable", "compat_newer_supported", "compat"), rec
    assert (rec["config"], rec["config_error"]) == ("defaults", error)
    assert rec["host_driver_version"] == H.HOST_DRIVER and rec["container_id"] == "c1"
    assert rec["actions"][0] == "wrote /etc/ld.so.conf.d/00-00-compat-hook.conf", rec["actions"]
    assert rec["actions"][1].startswith("ldconfig -r ") and len(rec["actions"]) == 2, rec["actions"]
    assert res.stderr.decode() == (f"compat-hook: invalid configuration ({error}): "
                                   "the built-in defaults decided\n")
    assert _config_cache(env.state_dir) == []


def test_hook_without_a_usable_config_still_sees_the_host_as_it_is(tmp_path):
    """The defaults' decision follows the host driver, as the file's would: a newer host keeps compat off."""
    env, bundle, _ = _hook_world(tmp_path)
    newer = write_fake_host(tmp_path / "newer", version="595.45.04", gpus=[GPU])
    _break(env.config, "value")
    res = _hook_start(env, bundle, newer, "c2")
    assert res.rc == 0, res
    [rec] = env.log_records()
    assert (rec["decision"], rec["reason"], rec["config"]) == ("skip", "compat_not_newer", "defaults"), rec
    assert not (bundle / "rootfs" / DROPIN).exists()


def test_fail_closed_hook_stops_the_start(tmp_path):
    env, bundle, node = _hook_world(tmp_path, on_error="fail")
    assert "--fail-closed" in env.entry["args"]
    error = _break(env.config, "value")
    res = _hook_start(env, bundle, node, "c3")
    assert res.rc == 1, res
    assert res.stderr.decode() == f"compat-hook: {error}\n"
    assert not (bundle / "rootfs" / DROPIN).exists()
    [rec] = env.log_records()
    assert (rec["decision"], rec["reason"], rec["error"]) == ("error", "bad_config", error)
    assert rec["outcome"] == "container stopped (on_error: fail)" and rec["container_id"] == "c3"


def test_fail_closed_registration_rendered_before_the_log_file_global_still_stops(tmp_path):
    """A registration written by an earlier release (its boot code names no log_file global) is
    fail-closed all the same: the flag is the boot code's `f`. Its line goes to the default log,
    a tmpfs here."""
    env, bundle, node = _hook_world(tmp_path, on_error="fail")
    args = list(env.entry["args"])
    [i] = [n for n, a in enumerate(args) if "from compat_hook.cli import entry" in a]
    assert f"log_file={str(env.log)!r}\n" in args[i]
    args[i] = args[i].replace(f"log_file={str(env.log)!r}\n", "")
    _break(env.config, "value")
    prefix = machine_driver_argv(node) + ["/bin/sh", "-c", 'mount -t tmpfs none /var/log && exec "$@"', "sh"]
    res = H.run_hook(dict(env.entry, path=prefix[0], args=prefix + args), H.state_json(bundle, id="c4"))
    assert res.rc == 1, res
    assert res.stderr.decode() == "compat-hook: mode: must be one of ldconfig, env, both, got 'sideways'\n"
    assert not (bundle / "rootfs" / DROPIN).exists() and env.log_records() == []


def test_hook_uses_the_fixed_config_at_the_next_start(tmp_path):
    env, bundle, node = _hook_world(tmp_path)
    good = env.config.read_text()
    res = _hook_start(env, bundle, node, "c1")
    assert res.rc == 0 and res.stderr == b"", res
    assert _config_cache(env.state_dir) == [good]
    _break(env.config, "yaml")
    assert _hook_start(env, bundle, node, "c2").rc == 0
    assert _config_cache(env.state_dir) == [good]   # the invalid text is never cached
    fixed = good.replace("dry_run: false\n", "dry_run: true\n")
    assert fixed != good
    env.config.write_text(fixed)
    res = _hook_start(env, bundle, node, "c3")
    assert res.rc == 0 and res.stderr == b"", res
    first, second, third = env.log_records()
    assert "config_error" not in first and first["dry_run"] is False
    assert second["config_error"].startswith(f"{env.config}: not valid YAML") and second["dry_run"] is False
    # The fixed file decides: dry_run from it, no config error.
    assert third["dry_run"] is True and "config_error" not in third and "config" not in third
    assert third["container_id"] == "c3" and third["decision"] == "enable"
    assert _config_cache(env.state_dir) == [fixed]


# --------------------------------------------------------------------------- the runtime wrapper


def _recorder(path: pathlib.Path, log: pathlib.Path) -> pathlib.Path:
    """A stand-in real runtime: records its argv and what the wrapper told it."""
    path.write_text("#!/bin/sh\n"
                    f"printf '%s\\037' \"$@\" >> {log}\n"
                    f"printf 'ACTIVE=%s\\n' \"$COMPAT_HOOK_RUNTIME_ACTIVE\" >> {log}\n")
    path.chmod(0o755)
    return path


class WrapperWorld:
    """A rendered wrapper registered with a valid config, a stand-in runtime, a bundle, a node driver."""

    def __init__(self, tmp: pathlib.Path, *, fail_closed: bool = False) -> None:
        self.tmp = tmp
        self.calls = tmp / "calls.log"
        self.real = _recorder(tmp / "real-runtime", self.calls)
        self.log = tmp / "compat-hook.log"
        self.state = tmp / "state"
        self.cfg = tmp / "config.yaml"
        self.cfg.write_text(f"runtime: {self.real}\nlog_file: {self.log}\nnvml: \"off\"\n")
        self.wrapper = tmp / "bin" / "compat-hook-runtime"
        self.wrapper.parent.mkdir()
        self.wrapper.write_text(render_wrapper(str(self.cfg), python=PY, fail_closed=fail_closed))
        self.wrapper.chmod(0o755)
        self.bundle = tmp / "bundle"
        H.base_rootfs(self.bundle / "rootfs")
        H.write_bundle(self.bundle)
        self.spec_before = json.loads((self.bundle / "config.json").read_text())
        self.node = write_fake_host(tmp / "node", version=H.HOST_DRIVER, gpus=[GPU])

    def create(self, cid: str) -> subprocess.CompletedProcess:
        (self.bundle / "config.json").write_text(json.dumps(self.spec_before))
        argv = ["--root", str(self.tmp / "runc-state"), "create", "--bundle", str(self.bundle), cid]
        p = subprocess.run(machine_driver_argv(self.node) + [str(self.wrapper), *argv], capture_output=True,
                           text=True, env=dict(ENV, COMPAT_HOOK_STATE_DIR=str(self.state)), timeout=120)
        p.argv = argv
        return p

    def runtime_calls(self) -> list:
        if not self.calls.exists():
            return []
        return [line.split("\x1f") for line in self.calls.read_text().splitlines()]

    @property
    def spec_after(self) -> dict:
        return json.loads((self.bundle / "config.json").read_text())

    def records(self) -> list:
        if not self.log.exists():
            return []
        return [r for r in map(json.loads, self.log.read_text().splitlines()) if r.get("event") == "runtime"]


def test_wrapper_create_decides_with_the_defaults_and_runs_the_runtime(tmp_path):
    w = WrapperWorld(tmp_path)
    # A bad value under a runtime: line the shell reader is sure of: that runtime still runs.
    w.cfg.write_text(f"runtime: {w.real}\nmode: sideways\n")
    error = "mode: must be one of ldconfig, env, both, got 'sideways'"
    p = w.create("c1")
    assert p.returncode == 0, p
    assert w.runtime_calls() == [p.argv + ["ACTIVE=1"]]
    # The defaults (mode ldconfig, wrapper_add_hook) on the older host: compat-hook's hook is added,
    # naming the same config file and the registration's log file.
    want = json.loads(json.dumps(w.spec_before))
    want.setdefault("hooks", {})["createContainer"] = [
        hook_entry(stage="createContainer", config=str(w.cfg), state_dir=str(w.state), log_file=str(w.log))]
    assert w.spec_after == want
    [rec] = w.records()
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("enable", "compat_newer_supported", "compat"), rec
    assert (rec["config"], rec["config_error"], rec["runtime"]) == ("defaults", error, str(w.real))
    assert rec["actions"][0].startswith("added createContainer hook "), rec["actions"]
    assert p.stderr == f"compat-hook-runtime: invalid configuration ({error}): the built-in defaults decided\n"
    assert _config_cache(w.state) == []


@pytest.mark.containers
def test_wrapper_with_an_unsure_runtime_line_runs_the_default_runtime(tmp_path):
    """When the line reader cannot vouch for `runtime:` (and the file does not load), the default runc
    runs (the bundle is no real container: runc refuses it, and is made to forget it)."""
    w = WrapperWorld(tmp_path)
    w.cfg.write_text(f"runtime: [{w.real}]\n")
    try:
        p = w.create("c2")
    finally:
        subprocess.run(["runc", "--root", str(tmp_path / "runc-state"), "delete", "--force", "c2"],
                       capture_output=True, env=ENV)
    assert w.runtime_calls() == []
    [rec] = w.records()
    assert rec["runtime"].endswith("/runc") and rec["config"] == "defaults", rec
    assert rec["config_error"].startswith("runtime: must be a runtime name"), rec
    assert p.stderr.startswith("compat-hook-runtime: invalid configuration (runtime: must be"), p.stderr


def test_fail_closed_wrapper_creates_nothing(tmp_path):
    w = WrapperWorld(tmp_path, fail_closed=True)
    error = _break(w.cfg, "yaml")
    p = w.create("c3")
    assert p.returncode == 1, p
    assert p.stderr == f"compat-hook-runtime: {error}\n"
    assert w.runtime_calls() == [] and w.spec_after == w.spec_before
    [rec] = w.records()
    assert (rec["decision"], rec["reason"], rec["error"]) == ("error", "bad_config", error)
    assert rec["outcome"] == "container not created (on_error: fail)" and rec["container_id"] == "c3"


def test_wrapper_uses_the_fixed_config_at_the_next_create(tmp_path):
    w = WrapperWorld(tmp_path)
    w.cfg.write_text(f"runtime: {w.real}\nlog_file: {w.log}\nmode: env: now\n")  # not YAML; the line reader is sure
    assert w.create("c1").returncode == 0
    assert "hooks" in w.spec_after and _config_cache(w.state) == []
    fixed = f"runtime: {w.real}\nlog_file: {w.log}\nmode: env\nnvml: \"off\"\n"
    w.cfg.write_text(fixed)
    p = w.create("c2")
    assert p.returncode == 0 and p.stderr == "", p
    # mode: env from the fixed file: the compat dir goes on LD_LIBRARY_PATH, no hook is added.
    assert "hooks" not in w.spec_after
    assert f"LD_LIBRARY_PATH={H.COMPAT_DIR}" in w.spec_after["process"]["env"]
    first, second = w.records()
    assert first["config"] == "defaults" and "config_error" not in second and "config" not in second
    assert second["actions"] == [f"LD_LIBRARY_PATH={H.COMPAT_DIR}"], second
    assert _config_cache(w.state) == [fixed]
