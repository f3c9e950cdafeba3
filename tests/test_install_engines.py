"""``compat-hook install|uninstall podman|crio|docker``: what each writes, idempotency,
atomic writes and backups, ``--dry-run`` diffs, and keeping other people's settings.

Every engine config path is a tmp path (``--config``, ``--hooks-dir``,
``--wrapper-path``); nothing under /etc or /usr is touched.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tomllib

import pytest

from compat_hook.commands import cli
from compat_hook.core import registration
from compat_hook.install import common, crio, docker, hooksd
from compat_hook.core.registration import hook_entry

PY = "/usr/bin/python3"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    # Keep the "is the wrapper still used elsewhere" scan and the dpkg ownership check off the real /etc, /var.
    monkeypatch.setattr(common, "ENGINE_FILES", (str(tmp_path / "none-ctrd.toml"),))
    monkeypatch.setattr(common, "DPKG_INFO", str(tmp_path / "dpkg-info"))


def run(capsys, *argv) -> tuple:
    code = cli.main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def files_in(d) -> list:
    return sorted(os.listdir(d))


# --------------------------------------------------------------------------- podman (hooks.d)


def test_podman_hooksd_document(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: ldconfig\n")
    code, out, _ = run(capsys, "install", "podman", "--hooks-dir", tmp_path / "h", "--hook-config", cfg)
    assert code == 0 and "wrote" in out
    path = tmp_path / "h" / "50-compat-hook.json"
    doc = json.loads(path.read_text())
    assert doc["version"] == "1.0.0"
    assert doc["when"] == {"always": True}  # hooks.d cannot match env; the hook skips non-GPU containers
    assert doc["stages"] == ["createContainer"]
    expect = hook_entry(stage="createContainer", config=str(cfg), log_file="/var/log/compat-hook.log")
    exe = hooksd.stable_interpreter(expect["path"])
    assert doc["hook"] == dict(expect, path=exe, args=[exe] + expect["args"][1:])
    assert doc["hook"]["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert "note: podman reads" in out  # a non-default dir needs --hooks-dir


def test_podman_idempotent_dry_run_and_uninstall(tmp_path, capsys):
    h = tmp_path / "h"
    code, out, _ = run(capsys, "install", "podman", "--hooks-dir", h, "--dry-run")
    assert code == 0 and not h.exists()
    assert out.startswith("--- /dev/null\n+++ b") and '+  "version": "1.0.0",' in out
    assert "nothing written" in out

    assert run(capsys, "install", "podman", "--hooks-dir", h)[0] == 0
    before = (h / "50-compat-hook.json").stat()
    code, out, _ = run(capsys, "install", "podman", "--hooks-dir", h)
    assert code == 0 and "already registered; nothing changed" in out
    after = (h / "50-compat-hook.json").stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)

    code, out, _ = run(capsys, "uninstall", "podman", "--hooks-dir", h, "--dry-run")
    assert code == 0 and "+++ /dev/null" in out and (h / "50-compat-hook.json").exists()
    code, out, _ = run(capsys, "uninstall", "podman", "--hooks-dir", h)
    assert code == 0 and "removed" in out
    assert not h.exists()  # our own generated file (no backup clutter), then the dir install created for it
    code, out, _ = run(capsys, "uninstall", "podman", "--hooks-dir", h)
    assert code == 0 and "already unregistered" in out


def test_podman_config_names_the_file_and_hook_config_change_rewrites(tmp_path, capsys):
    f = tmp_path / "d" / "10-mine.json"
    assert run(capsys, "install", "podman", "--engine-config", f)[0] == 0
    old = json.loads(f.read_text())
    assert "--config" not in old["hook"]["args"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("{}\n")
    code, out, _ = run(capsys, "install", "podman", "--engine-config", f, "--hook-config", cfg)
    assert code == 0 and "wrote" in out
    assert json.loads(f.read_text())["hook"]["args"][-2:] == ["--config", str(cfg)]


def test_podman_refuses_foreign_file(tmp_path, capsys):
    h = tmp_path / "h"
    h.mkdir()
    (h / "50-compat-hook.json").write_text('{"version": "1.0.0", "hook": {"path": "/bin/true"}}\n')
    code, _, err = run(capsys, "install", "podman", "--hooks-dir", h)
    assert code == 1 and "not compat-hook's" in err
    code, _, err = run(capsys, "uninstall", "podman", "--hooks-dir", h)
    assert code == 1 and "not compat-hook's" in err
    assert (h / "50-compat-hook.json").read_text().startswith('{"version": "1.0.0", "hook": {"path": "/bin/true"}}')


def test_package_owned_file_is_left_to_dpkg(tmp_path, capsys):
    h = tmp_path / "h"
    assert run(capsys, "install", "podman", "--hooks-dir", h)[0] == 0
    info = tmp_path / "dpkg-info"
    info.mkdir()
    (info / "compat-hook.list").write_text(f"/.\n{h}\n{h / '50-compat-hook.json'}\n")
    code, out, _ = run(capsys, "install", "podman", "--hooks-dir", h)  # identical: fine
    assert code == 0 and "already registered" in out
    code, _, err = run(capsys, "install", "podman", "--hooks-dir", h, "--hook-config", tmp_path / "x.yaml")
    assert code == 1 and "belongs to the compat-hook package" in err and "config.yaml" in err
    code, _, err = run(capsys, "uninstall", "podman", "--hooks-dir", h)
    assert code == 1 and "apt remove compat-hook" in err
    assert (h / "50-compat-hook.json").exists()
    # CRI-O: the packaged hook stays (a note says so), the runtime handler goes.
    dropin, w = tmp_path / "99-compat-hook.toml", tmp_path / "w"
    crio_args = ["--hooks-dir", h, "--engine-config", dropin, "--wrapper-path", w]
    assert run(capsys, "install", "crio", *crio_args)[0] == 0 and dropin.exists() and w.exists()
    code, out, _ = run(capsys, "uninstall", "crio", *crio_args)
    assert code == 0 and "note:" in out and "apt remove compat-hook" in out
    assert not dropin.exists() and not w.exists() and (h / "50-compat-hook.json").exists()


def test_podman_rejects_base_spec(tmp_path, capsys):
    code, _, err = run(capsys, "install", "podman", "--hooks-dir", tmp_path, "--via", "base-spec")
    assert code == 2 and "containerd-only" in err


def test_stable_interpreter(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    real = d / "python3.11"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    assert hooksd.stable_interpreter(str(real)) == str(real)  # no python3 next to it
    (d / "python3").symlink_to("python3.11")
    assert hooksd.stable_interpreter(str(real)) == str(d / "python3")
    other = d / "python3.12"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert hooksd.stable_interpreter(str(other)) == str(other)  # python3 is not this one
    assert hooksd.stable_interpreter("/opt/pyenv/shims/python") == "/opt/pyenv/shims/python"


def test_package_document_points_at_the_installed_locations():
    doc = hooksd.package_document()
    assert doc["hook"]["path"] == "/usr/bin/python3" == doc["hook"]["args"][0]
    assert doc["hook"]["args"][4] == registration.boot_code(["/usr/lib/python3/dist-packages"],
                                                            log_file="/var/log/compat-hook.log")
    assert doc["hook"]["args"][5:] == ["hook", "--stage", "createContainer"]


# --------------------------------------------------------------------------- docker (daemon.json)


DAEMON_4 = """{
    "log-driver": "json-file",
    "log-opts": {
        "max-size": "10m"
    },
    "runtimes": {
        "nvidia": {
            "path": "nvidia-container-runtime",
            "args": []
        }
    },
    "default-runtime": "nvidia"
}
"""


def _docker(capsys, tmp_path, verb, *extra):
    return run(capsys, verb, "docker", "--engine-config", tmp_path / "daemon.json",
               "--wrapper-path", tmp_path / "w" / "compat-hook-runtime", *extra)


def test_docker_adds_runtime_keeps_everything_else(tmp_path, capsys):
    p = tmp_path / "daemon.json"
    p.write_text(DAEMON_4)
    code, out, _ = _docker(capsys, tmp_path, "install", "--dry-run")
    assert code == 0 and p.read_text() == DAEMON_4 and not (tmp_path / "w").exists()
    assert '+    "cuda-compat": {' not in out and '+        "cuda-compat": {' in out  # 4-space indent kept
    assert files_in(tmp_path) == ["daemon.json"]

    code, out, _ = _docker(capsys, tmp_path, "install")
    assert code == 0
    data = json.loads(p.read_text())
    wrapper = str(tmp_path / "w" / "compat-hook-runtime")
    assert data == {"log-driver": "json-file", "log-opts": {"max-size": "10m"},
                    "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []},
                                 "cuda-compat": {"path": wrapper}},
                    "default-runtime": "nvidia"}
    assert list(data) == ["log-driver", "log-opts", "runtimes", "default-runtime"]  # order kept
    assert p.read_text() == json.dumps(data, indent=4) + "\n"
    backups = [f for f in files_in(tmp_path) if f.startswith("daemon.json.compat-hook-")]
    assert len(backups) == 1 and (tmp_path / backups[0]).read_text() == DAEMON_4
    w = tmp_path / "w" / "compat-hook-runtime"
    assert stat.S_IMODE(w.stat().st_mode) == 0o755 and w.read_text().startswith(hooksd.WRAPPER_MARK)

    text = p.read_text()
    code, out, _ = _docker(capsys, tmp_path, "install")
    assert code == 0 and "already registered; nothing changed" in out and p.read_text() == text
    assert len([f for f in files_in(tmp_path) if f.startswith("daemon.json.compat-hook-")]) == 1

    code, out, _ = _docker(capsys, tmp_path, "uninstall")
    assert code == 0 and p.read_text() == DAEMON_4 and not w.exists()


@pytest.mark.parametrize("indent", ["  ", "    ", "\t"])
def test_docker_detects_indent(tmp_path, capsys, indent):
    p = tmp_path / "daemon.json"
    original = json.dumps({"debug": True, "features": {"buildkit": True}}, indent=indent) + "\n"
    p.write_text(original)
    assert _docker(capsys, tmp_path, "install")[0] == 0
    data = json.loads(p.read_text())
    assert p.read_text() == json.dumps(data, indent=indent) + "\n"
    assert _docker(capsys, tmp_path, "uninstall")[0] == 0
    assert p.read_text() == original


def test_docker_one_line_and_missing_files(tmp_path, capsys):
    p = tmp_path / "daemon.json"
    p.write_text('{"debug": true}')
    assert _docker(capsys, tmp_path, "install")[0] == 0
    assert "\n" not in p.read_text().rstrip("\n")
    assert json.loads(p.read_text())["debug"] is True

    q = tmp_path / "new" / "daemon.json"
    code, _, _ = run(capsys, "install", "docker", "--engine-config", q, "--wrapper-path", tmp_path / "w2")
    assert code == 0 and json.loads(q.read_text()) == {"runtimes": {"cuda-compat": {"path": str(tmp_path / "w2")}}}
    assert q.read_text().startswith('{\n    "runtimes"')
    code, out, _ = run(capsys, "uninstall", "docker", "--engine-config", tmp_path / "absent.json")
    assert code == 0 and "does not exist" in out


def test_docker_set_as_default_and_uninstall_resets_only_ours(tmp_path, capsys):
    p = tmp_path / "daemon.json"
    p.write_text(DAEMON_4)
    code, out, _ = _docker(capsys, tmp_path, "install", "--set-as-default")
    assert code == 0 and json.loads(p.read_text())["default-runtime"] == "cuda-compat"
    assert "default-runtime was 'nvidia'" in out and "runtime: nvidia-container-runtime" in out
    assert "uninstall gives it back" in out
    assert _docker(capsys, tmp_path, "uninstall")[0] == 0
    data = json.loads(p.read_text())
    assert data["default-runtime"] == "nvidia" and "cuda-compat" not in data["runtimes"]  # given back, exactly
    assert p.read_text() == DAEMON_4 and not (tmp_path / "daemon.json.compat-hook-install").exists()

    # Without --set-as-default on an nvidia-default node, the command says what --runtime cuda-compat runs.
    p.write_text(DAEMON_4)
    code, out, _ = _docker(capsys, tmp_path, "install")
    assert code == 0 and "default-runtime is 'nvidia'" in out and "runtime: nvidia-container-runtime" in out, out
    assert _docker(capsys, tmp_path, "uninstall")[0] == 0 and p.read_text() == DAEMON_4

    # Someone else's default stays.
    p.write_text(DAEMON_4)
    assert _docker(capsys, tmp_path, "install")[0] == 0
    assert _docker(capsys, tmp_path, "uninstall")[0] == 0
    assert json.loads(p.read_text())["default-runtime"] == "nvidia"


def test_docker_existing_entry_keeps_its_args(tmp_path, capsys):
    p = tmp_path / "daemon.json"
    p.write_text(json.dumps({"runtimes": {"cuda-compat": {"path": "/old", "args": ["--debug"]}}}, indent=2))
    assert _docker(capsys, tmp_path, "install", "--runtime-name", "cuda-compat")[0] == 0
    assert json.loads(p.read_text())["runtimes"]["cuda-compat"] == {
        "path": str(tmp_path / "w" / "compat-hook-runtime"), "args": ["--debug"]}


def test_docker_bad_json_is_left_alone(tmp_path, capsys):
    p = tmp_path / "daemon.json"
    p.write_text('{"debug": true,}\n')
    code, _, err = _docker(capsys, tmp_path, "install")
    assert code == 1 and "not valid JSON" in err
    assert p.read_text() == '{"debug": true,}\n' and files_in(tmp_path) == ["daemon.json"]
    p.write_text("[1]\n")
    assert _docker(capsys, tmp_path, "install")[0] == 1


def test_docker_refuses_to_overwrite_a_foreign_wrapper(tmp_path, capsys):
    w = tmp_path / "w" / "compat-hook-runtime"
    w.parent.mkdir()
    w.write_text("#!/bin/sh\nexec runc \"$@\"\n")
    code, _, err = _docker(capsys, tmp_path, "install")
    assert code == 1 and "not compat-hook's runtime wrapper" in err
    assert not (tmp_path / "daemon.json").exists()


def test_rendered_wrapper_runs(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("runtime: crun\n")
    assert _docker(capsys, tmp_path, "install", "--hook-config", cfg)[0] == 0
    w = tmp_path / "w" / "compat-hook-runtime"
    p = subprocess.run([str(w), "--compat-hook-resolve"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and p.stdout.strip() == "runtime=crun", p.stdout + p.stderr
    # A non-editing verb goes straight to the real runtime.
    cfg.write_text("runtime: /bin/echo\n")
    p = subprocess.run([str(w), "state", "x1"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and p.stdout.strip() == "state x1", p.stdout + p.stderr


# --------------------------------------------------------------------------- crio (hooks.d + drop-in)


def _crio(capsys, tmp_path, verb, *extra, dropin=None):
    return run(capsys, verb, "crio", "--engine-config", dropin or tmp_path / "crio.conf.d" / "99-compat-hook.toml",
               "--hooks-dir", tmp_path / "hooks.d", "--wrapper-path", tmp_path / "w" / "compat-hook-runtime",
               *extra)


def test_crio_writes_hook_and_runtime_handler(tmp_path, capsys):
    code, out, _ = _crio(capsys, tmp_path, "install", "--dry-run")
    assert code == 0 and not (tmp_path / "crio.conf.d").exists() and not (tmp_path / "hooks.d").exists()
    assert '+[crio.runtime.runtimes.cuda-compat]' in out and '+runtime_type = "oci"' in out

    code, out, _ = _crio(capsys, tmp_path, "install")
    assert code == 0 and "systemctl restart crio" in out
    dropin = tmp_path / "crio.conf.d" / "99-compat-hook.toml"
    parsed = tomllib.loads(dropin.read_text())
    wrapper = str(tmp_path / "w" / "compat-hook-runtime")
    assert parsed == {"crio": {"runtime": {"runtimes": {"cuda-compat": {
        "runtime_path": wrapper, "runtime_type": "oci"}}}}}
    assert dropin.read_text().startswith("# compat-hook:")
    doc = json.loads((tmp_path / "hooks.d" / "50-compat-hook.json").read_text())
    assert doc["when"] == {"always": True} and doc["stages"] == ["createContainer"]

    text = dropin.read_text()
    code, out, _ = _crio(capsys, tmp_path, "install")
    assert code == 0 and "already registered; nothing changed" in out and dropin.read_text() == text

    code, out, _ = _crio(capsys, tmp_path, "uninstall")
    assert code == 0
    assert files_in(tmp_path / "crio.conf.d") == []  # no backup where CRI-O would load it
    assert not (tmp_path / "hooks.d").exists() and not os.path.exists(wrapper)  # install created hooks.d


def test_crio_set_as_default_and_foreign_content(tmp_path, capsys):
    dropin = tmp_path / "99-compat-hook.toml"
    dropin.write_text('# site settings\n[crio.runtime]\nlog_level = "info"\n\n'
                      '[crio.runtime.runtimes.kata]\nruntime_path = "/usr/bin/kata"\n')
    assert _crio(capsys, tmp_path, "install", "--set-as-default", dropin=dropin)[0] == 0
    text = dropin.read_text()
    assert text.startswith("# site settings\n")
    parsed = tomllib.loads(text)["crio"]["runtime"]
    assert parsed["default_runtime"] == "cuda-compat" and parsed["log_level"] == "info"
    assert set(parsed["runtimes"]) == {"kata", "cuda-compat"}

    assert _crio(capsys, tmp_path, "uninstall", dropin=dropin)[0] == 0
    assert tomllib.loads(dropin.read_text()) == {"crio": {"runtime": {
        "log_level": "info", "runtimes": {"kata": {"runtime_path": "/usr/bin/kata"}}}}}
    assert "# site settings" in dropin.read_text()


def test_crio_bad_toml_is_left_alone(tmp_path, capsys):
    dropin = tmp_path / "99-compat-hook.toml"
    dropin.write_text("[crio.runtime\n")
    code, _, err = _crio(capsys, tmp_path, "install", dropin=dropin)
    assert code == 1 and "not valid TOML" in err
    assert dropin.read_text() == "[crio.runtime\n" and not (tmp_path / "hooks.d").exists()


def test_shared_wrapper_survives_one_engines_uninstall(tmp_path, capsys, monkeypatch):
    daemon = tmp_path / "daemon.json"
    dropin = tmp_path / "crio.conf.d" / "99-compat-hook.toml"
    monkeypatch.setattr(common, "ENGINE_FILES", (str(daemon), str(dropin)))
    assert _docker(capsys, tmp_path, "install")[0] == 0
    assert _crio(capsys, tmp_path, "install")[0] == 0
    w = tmp_path / "w" / "compat-hook-runtime"
    code, out, _ = _docker(capsys, tmp_path, "uninstall")
    assert code == 0 and w.exists() and f"kept {w}" in out
    code, out, _ = _crio(capsys, tmp_path, "uninstall")
    assert code == 0 and not w.exists()


def test_engine_modules_expose_the_dispatcher_interface():
    from compat_hook.install import ENGINES, podman

    for mod in (podman, crio, docker):
        assert callable(mod.install) and callable(mod.uninstall)
    assert {"podman", "crio", "docker"} <= set(ENGINES)


def test_writes_are_atomic_renames(tmp_path, capsys):
    """The daemon.json inode changes (temp file + rename); a reader never sees a partial file."""
    p = tmp_path / "daemon.json"
    p.write_text(DAEMON_4)
    ino = p.stat().st_ino
    assert _docker(capsys, tmp_path, "install")[0] == 0
    assert p.stat().st_ino != ino
    assert not [f for f in files_in(tmp_path) if f.endswith(".tmp")]


def test_cli_subprocess_exit_codes(tmp_path):
    """The real command line, as a user runs it (exit 0, then 0 with 'nothing changed')."""
    argv = [PY, "-I", "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.commands.cli import main;"
            "sys.exit(main())", os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            "install", "podman", "--hooks-dir", str(tmp_path)]
    p1 = subprocess.run(argv, capture_output=True, text=True)
    p2 = subprocess.run(argv, capture_output=True, text=True)
    assert (p1.returncode, p2.returncode) == (0, 0), p1.stderr + p2.stderr
    assert "nothing changed" in p2.stdout
    doc = json.loads((tmp_path / "50-compat-hook.json").read_text())
    assert doc["hook"]["path"] == "/usr/bin/python3"  # the stable name, not python3.11


# --------------------------------------------------------------------------- one wrapper, one installation


def test_a_wrapper_of_another_installation_is_taken_over_loudly_and_never_removed(tmp_path, capsys):
    from compat_hook.install.wrapper import installation_of, render_wrapper, this_installation

    w = tmp_path / "w" / "compat-hook-runtime"
    w.parent.mkdir()
    theirs = render_wrapper(None, python="/usr/bin/python3", paths=["/opt/other-venv/lib"], log_file=None)
    assert installation_of(theirs) == "/usr/bin/python3 /opt/other-venv/lib"
    # uninstall from this installation: the other one's wrapper stays
    w.write_text(theirs)
    (tmp_path / "daemon.json").write_text(json.dumps({"runtimes": {"cuda-compat": {"path": str(w)}}}))
    code, out, _ = _docker(capsys, tmp_path, "uninstall")
    assert code == 0 and "runs another compat-hook installation (/usr/bin/python3 /opt/other-venv/lib)" in out, out
    assert w.read_text() == theirs
    # install from this installation: taken over, and it says so
    code, out, _ = _docker(capsys, tmp_path, "install")
    assert code == 0 and "taking it over" in out and "/opt/other-venv/lib" in out, out
    assert installation_of(w.read_text()) == this_installation()
    code, out, _ = _docker(capsys, tmp_path, "uninstall")
    assert code == 0 and not w.exists(), out


def test_install_makes_the_logs_spool_and_leaves_a_planted_one_alone(tmp_path, capsys):
    """A user-namespaced container's hook can only add a file to the log's spool, not make it: install makes it
    (mode 1733), so the first start on a fresh host may be such a container. An entry someone planted at the
    spool's path (a symlink) is left as it is, and install says so in one line; uninstall keeps the log's dir."""
    from compat_hook.core import logjson

    log = tmp_path / "logs" / "compat-hook.log"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"log_file: {log}\n")
    assert run(capsys, "install", "podman", "--hooks-dir", tmp_path / "h", "--hook-config", cfg, "--dry-run")[0] == 0
    assert not (tmp_path / "logs").exists()  # a dry run writes nothing
    code, _, err = run(capsys, "install", "podman", "--hooks-dir", tmp_path / "h", "--hook-config", cfg)
    spool = tmp_path / "logs" / ".compat-hook.log.spool"
    assert code == 0 and not err, err
    assert spool.is_dir() and not spool.is_symlink() and stat.S_IMODE(spool.stat().st_mode) == 0o1733
    assert not log.exists()  # the log itself is the first line's
    assert run(capsys, "uninstall", "podman", "--hooks-dir", tmp_path / "h", "--hook-config", cfg)[0] == 0
    assert spool.is_dir()  # the log and its spool are data: uninstall keeps them, the package's purge removes them

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    log2 = tmp_path / "logs2" / "compat-hook.log"
    log2.parent.mkdir()
    os.symlink(elsewhere, logjson.spool_dir(str(log2)))
    cfg.write_text(f"log_file: {log2}\n")
    code, _, err = run(capsys, "install", "podman", "--hooks-dir", tmp_path / "h2", "--hook-config", cfg)
    assert code == 0 and err.count("\n") == 1 and "could not make the log's spool" in err, err
    assert os.path.islink(logjson.spool_dir(str(log2))) and stat.S_IMODE(elsewhere.stat().st_mode) == 0o755
