"""Installing on a node: one wrapper per node, nothing left behind, the options every engine honours.

* ``uninstall`` after ``install`` (and a re-install that changed a setting,
  which backs files up) leaves the dirs exactly as they were: no drop-in, no
  wrapper, no backups of files compat-hook created, no dir it created;
* ``--state-dir`` reaches the hook entry and the wrapper of every engine;
* a configuration the registration cannot honour is refused (the wrapper's
  ``runtime:`` missing) or warned about (``mode: env`` on the hook alone);
* ``install`` takes an :class:`~compat_hook.install.Options`, which the
  command line builds;
* ``pip``: the wheel requires tomlkit and installs both console scripts; a
  venv install registers the OS interpreter with the venv's site-packages;
* the Debian package (real ``dpkg -i`` into overlays of /usr, /etc and /var
  in a private mount namespace, as tests/test_deb.py does): ``install
  containerd`` and ``install docker`` with every default name the packaged
  wrapper and write no second one; ``apt remove`` undoes them; nothing of
  compat-hook stays.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess

import pytest

from compat_hook.install import Options, run_install
from tests.conftest import snapshot_tree
from tests.support.steps import NODE_OVERLAY, sections
from tests.support.debpkg import deb  # noqa: F401  (the module-scoped .deb fixture)

PY = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}


def cli(*argv, cwd=REPO, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([PY, "-m", "compat_hook", *map(str, argv)], cwd=cwd, capture_output=True, text=True,
                       env=ENV, stdin=subprocess.DEVNULL, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    if check:
        assert p.returncode == 0, (argv, p.stdout, p.stderr)
    return p


def tree(base) -> dict:
    """What is under ``base`` (types and contents; mtimes left out)."""
    return {k: (v[0], v[1], v[4]) for k, v in snapshot_tree(base).items()}


# --------------------------------------------------------------------------- nothing left behind


def test_containerd_uninstall_leaves_nothing_of_ours(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    main = etc / "config.toml"  # no main file, no conf.d: install creates both
    wrapper = tmp_path / "libexec" / "compat-hook" / "compat-hook-runtime"
    args = ["containerd", "--engine-config", main, "--wrapper-path", wrapper, "--state-dir", tmp_path / "state",
            "--hook-config", tmp_path / "compat-hook.yaml"]
    before = tree(tmp_path)
    cli("install", *args)
    record = etc / "config.toml.compat-hook-install"  # containerd 1.x: the runtime is in config.toml itself
    assert record.is_file() and wrapper.is_file() and main.is_file() and not (etc / "conf.d").exists()
    assert f"ch_state={tmp_path / 'state'}" in wrapper.read_text()
    cli("install", *args, "--set-as-default")  # a changed setting: the previous config.toml is backed up
    assert [p.name for p in etc.iterdir() if p.name.endswith(".bak")]
    out = cli("uninstall", *args).stdout
    assert f"removed {record}" in out and f"removed {wrapper}" in out and f"removed {main}" in out
    assert tree(tmp_path) == before, sorted(set(tree(tmp_path)) ^ set(before))


def test_docker_uninstall_leaves_nothing_of_ours(tmp_path):
    daemon = tmp_path / "docker" / "daemon.json"
    daemon.parent.mkdir()
    wrapper = tmp_path / "libexec" / "compat-hook" / "compat-hook-runtime"
    args = ["docker", "--engine-config", daemon, "--wrapper-path", wrapper, "--state-dir", tmp_path / "state"]
    before = tree(tmp_path)
    cli("install", *args)
    assert json.loads(daemon.read_text()) == {"runtimes": {"cuda-compat": {"path": str(wrapper)}}}
    assert f"ch_state={tmp_path / 'state'}" in wrapper.read_text()  # --state-dir reaches Docker's wrapper
    cli("install", *args, "--set-as-default")
    assert [p for p in daemon.parent.iterdir() if p.name.endswith(".bak")]
    cli("uninstall", *args)
    assert tree(tmp_path) == before, sorted(set(tree(tmp_path)) ^ set(before))


def test_docker_uninstall_keeps_the_users_file_and_backup(tmp_path):
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{\n  "log-level": "warn"\n}\n')
    args = ["docker", "--engine-config", daemon, "--wrapper-path", tmp_path / "compat-hook" / "compat-hook-runtime"]
    cli("install", *args)
    out = cli("uninstall", *args).stdout
    assert daemon.read_text() == '{\n  "log-level": "warn"\n}\n'
    # The file is what the install's backup holds: that backup goes, no new one is taken.
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".bak")] and "is back as it was" in out, out
    assert not (tmp_path / "compat-hook").exists()
    # Edited in between: after the uninstall the file differs from the backup, which stays.
    cli("install", *args)
    data = json.loads(daemon.read_text())
    daemon.write_text(json.dumps(dict(data, debug=True), indent=2) + "\n")
    cli("uninstall", *args)
    assert json.loads(daemon.read_text()) == {"log-level": "warn", "debug": True}
    [bak] = [p for p in tmp_path.iterdir() if p.name.endswith(".bak")]
    assert bak.read_text() == '{\n  "log-level": "warn"\n}\n'



def test_crio_state_dir_and_uninstall(tmp_path):
    dropin = tmp_path / "crio.conf.d" / "99-compat-hook.toml"
    hooks = tmp_path / "hooks.d"
    wrapper = tmp_path / "libexec" / "compat-hook" / "compat-hook-runtime"
    args = ["crio", "--engine-config", dropin, "--hooks-dir", hooks, "--wrapper-path", wrapper,
            "--state-dir", tmp_path / "state"]
    cli("install", *args)
    assert f"ch_state={tmp_path / 'state'}" in wrapper.read_text()
    doc = json.loads((hooks / "50-compat-hook.json").read_text())
    assert doc["hook"]["args"][-2:] == ["--state-dir", str(tmp_path / "state")]
    cli("uninstall", *args)
    # The dir CRI-O reads stays; hooks.d, which the install created for its file, goes with it.
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["crio.conf.d"]


def test_uninstall_removes_an_empty_state_dir_only(tmp_path):
    state = tmp_path / "state"
    (state / "cache").mkdir(parents=True)
    h = tmp_path / "h"
    cli("install", "podman", "--hooks-dir", h, "--state-dir", state)
    cli("uninstall", "podman", "--hooks-dir", h, "--state-dir", state)
    assert not state.exists()
    (state / "store").mkdir(parents=True)  # the host store lives there by default: the dir stays
    cli("install", "podman", "--hooks-dir", h, "--state-dir", state)
    cli("uninstall", "podman", "--hooks-dir", h, "--state-dir", state)
    assert (state / "store").is_dir()


# --------------------------------------------------------------------------- what the configuration allows


def test_a_missing_runtime_is_refused_and_env_mode_on_the_hook_alone_warned(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("runtime: /nonexistent/nvidia-container-runtime\n")
    p = cli("install", "docker", "--engine-config", tmp_path / "daemon.json", "--hook-config", cfg,
            "--wrapper-path", tmp_path / "w", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "every container" in p.stderr, p.stderr
    assert not (tmp_path / "daemon.json").exists() and not (tmp_path / "w").exists()

    cfg.write_text("mode: env\n")
    out = cli("install", "podman", "--hooks-dir", tmp_path / "h", "--hook-config", cfg).stdout
    assert "warning: mode: env" in out and "wrapper" in out, out
    out = cli("install", "docker", "--engine-config", tmp_path / "daemon.json", "--hook-config", cfg,
              "--wrapper-path", tmp_path / "w").stdout
    assert "warning" not in out, out  # the wrapper applies env mode

    cfg.write_text("mode: [\n")
    p = cli("install", "podman", "--hooks-dir", tmp_path / "h2", "--hook-config", cfg, check=False)
    assert p.returncode == 2 and "not valid YAML" in p.stderr and not (tmp_path / "h2").exists(), p.stderr


def test_on_error_fail_is_carried_into_the_registration(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("on_error: fail\n")
    cli("install", "podman", "--hooks-dir", tmp_path / "h", "--hook-config", cfg)
    args = json.loads((tmp_path / "h" / "50-compat-hook.json").read_text())["hook"]["args"]
    assert args[5] == "--fail-closed" and args[6] == "hook", args
    w = tmp_path / "w"
    cli("install", "docker", "--engine-config", tmp_path / "daemon.json", "--hook-config", cfg, "--wrapper-path", w)
    assert "ch_fail=1\n" in w.read_text()
    entry = json.loads(cli("hook-entry", "--config", cfg).stdout)
    assert "--fail-closed" in entry["args"]


def test_install_takes_an_options_object(tmp_path, capsys):
    opts = Options(engine="podman", hooks_dir=str(tmp_path / "h"), state_dir=str(tmp_path / "s"))
    assert run_install(opts) == 0
    assert "--state-dir" in (tmp_path / "h" / "50-compat-hook.json").read_text()
    assert run_install(Options(engine="podman", hooks_dir=str(tmp_path / "h")), uninstall=True) == 0
    assert not (tmp_path / "h" / "50-compat-hook.json").exists()
    from compat_hook.commands import cli as cli_mod

    ns = cli_mod._parser().parse_args(["install", "docker", "--set-as-default"])
    assert Options.from_namespace(ns) == Options(engine="docker", set_as_default=True)


# --------------------------------------------------------------------------- pip


@pytest.mark.slow
def test_the_wheel_brings_tomlkit_and_a_venv_registers_the_os_interpreter(tmp_path):
    """``pip install compat-hook``: tomlkit is a requirement; the hook runs the OS python on the venv's files."""
    import zipfile

    wheels = tmp_path / "wheels"
    p = subprocess.run([PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                        str(wheels), str(REPO)], capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    [whl] = wheels.glob("compat_hook-*.whl")
    with zipfile.ZipFile(whl) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        scripts = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
        assert "compat_hook/install/wrapper.py" in z.namelist()
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert any(r.startswith("tomlkit") and "extra" not in r for r in requires), requires
    assert "compat-hook = compat_hook.commands.cli:main" in scripts and "compat-hook-runtime" in scripts

    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--system-site-packages", str(venv)], check=True, env=ENV, timeout=120)
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index", "--no-deps", str(whl)],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    h = tmp_path / "hooks.d"
    p = subprocess.run([str(venv / "bin" / "compat-hook"), "install", "podman", "--hooks-dir", str(h)],
                       capture_output=True, text=True, env=ENV, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    hook = json.loads((h / "50-compat-hook.json").read_text())["hook"]
    assert hook["path"] == "/usr/bin/python3"  # the venv's base interpreter, by its stable name
    site = next(venv.glob("lib/python3*/site-packages"))
    assert repr(str(site)) in hook["args"][4]  # the package is found where pip put it


# --------------------------------------------------------------------------- the Debian package


INSIDE = NODE_OVERLAY + r"""
# What an earlier install on this machine left (its wrapper, its state) goes, inside the overlay only:
# the test sees what the package adds and removes, whatever the host had before.
rm -rf /usr/local/libexec/compat-hook /var/lib/compat-hook /var/log/.compat-hook.log.spool
mkdir -p /etc/containerd /etc/docker
[ -f /etc/containerd/config.toml ] || printf 'version = 2\n' > /etc/containerd/config.toml
cp /etc/containerd/config.toml "$T/config.toml.before"
[ ! -e /etc/docker/daemon.json ] || mv /etc/docker/daemon.json "$T/daemon.json.moved"
dpkg -i {deb} >"$T/dpkg-install.log" 2>&1 || {{ cat "$T/dpkg-install.log"; exit 1; }}
step install-containerd
compat-hook install containerd
step install-docker
compat-hook install docker
step install-other-config
compat-hook install docker --hook-config /etc/compat-hook/other.yaml 2>&1 && echo "exit=0" || echo "exit=$?"
step registered
stat -c 'spool %a %F' /var/log/.compat-hook.log.spool 2>&1 || true
grep -h 'BinaryName' /etc/containerd/config.toml
cat /etc/docker/daemon.json
ls /usr/local/libexec/compat-hook 2>&1 || true
step remove
dpkg -r compat-hook 2>&1
step after
ls /etc/containerd/conf.d 2>&1 || true
ls /etc/docker 2>&1
cmp /etc/containerd/config.toml "$T/config.toml.before" && echo "config.toml as before"
ls /usr/libexec/compat-hook /usr/local/libexec/compat-hook 2>&1 || true
find /etc /usr/local -name '*.compat-hook-*.bak' 2>/dev/null
dpkg --purge compat-hook >/dev/null 2>&1
ls /var/lib/compat-hook 2>&1 || true
ls -d /var/log/.compat-hook.log.spool 2>&1 || true
step end
"""


@pytest.mark.containers
def test_debian_package_one_wrapper_and_nothing_left_after_removal(deb, tmp_path):  # noqa: F811
    script = tmp_path / "inside.sh"
    script.write_text(INSIDE.format(tmp=shlex.quote(str(tmp_path / "ovl")), deb=shlex.quote(str(deb))))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", str(script)], capture_output=True,
                       text=True, env=ENV, timeout=300, stdin=subprocess.DEVNULL)
    out = sections(p.stdout)
    assert p.returncode == 0 and "end" in out, p.stdout + p.stderr
    packaged = "/usr/libexec/compat-hook/compat-hook-runtime"
    assert "wrote /etc/containerd/config.toml.compat-hook-install" in out["install-containerd"]
    assert "compat-hook-runtime" not in out["install-containerd"].replace(packaged, ""), out["install-containerd"]
    assert "wrote /etc/docker/daemon.json" in out["install-docker"] and "wrote /usr" not in out["install-docker"]
    assert "exit=1" in out["install-other-config"] and "--wrapper-path" in out["install-other-config"]
    reg = out["registered"]
    assert f'BinaryName = "{packaged}"' in reg and f'"path": "{packaged}"' in reg, reg
    assert "No such file or directory" in reg  # no /usr/local/libexec/compat-hook: one wrapper per node
    # the log's spool, made by install: a user-namespaced container's hook cannot make it, and may be the first
    assert "spool 1733 directory" in reg, reg
    assert "removed /etc/containerd/config.toml.compat-hook-install" in out["remove"], out["remove"]
    assert "removed /etc/docker/daemon.json" in out["remove"], out["remove"]
    after = out["after"]
    assert "config.toml as before" in after, after
    assert ".bak" not in after and "daemon.json" not in after, after
    # conf.d, both libexec dirs, /var/lib/compat-hook, the log's spool (purge)
    assert after.count("No such file or directory") >= 5, after
    assert "cannot access '/var/log/.compat-hook.log.spool'" in after, after
    assert not os.path.exists("/usr/libexec/compat-hook") or _installed_on_host()


def _installed_on_host() -> bool:
    return subprocess.run(["dpkg-query", "-W", "compat-hook"], capture_output=True).returncode == 0


# --------------------------------------------------------------------------- apt remove while a container runs

# A node in a private overlay: the package installed, containerd registered by the install command,
# containerd started and one task running through the package's wrapper.
LIVE_START = NODE_OVERLAY + r"""
W=$T/ctrd
mkdir -p /etc/containerd "$W"
cp {main} /etc/containerd/config.toml
dpkg -i {deb} >"$T/dpkg-install.log" 2>&1 || {{ cat "$T/dpkg-install.log"; exit 1; }}
step install
compat-hook install containerd --toolkit-config none
step start
containerd --config /etc/containerd/config.toml >"$T/containerd.log" 2>&1 &
echo $! > "$T/containerd.pid"
i=0; until ctr -a "$W/containerd.sock" version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done
ctr -a "$W/containerd.sock" images import --base-name docker.io/library/bb {image} >/dev/null
ctr -a "$W/containerd.sock" run -d --runtime io.containerd.runc.v2 \
    --runc-binary /usr/libexec/compat-hook/compat-hook-runtime --runc-root "$W/runc-ctr" \
    docker.io/library/bb:root live sleep 600
ctr -a "$W/containerd.sock" task ls
"""

REMOVE_LIVE = LIVE_START + r"""
step remove
dpkg -r compat-hook 2>&1
step after-remove
head -n 2 /usr/libexec/compat-hook/compat-hook-runtime
tail -n 1 /usr/libexec/compat-hook/compat-hook-runtime
grep "^# engine-process: containerd " /usr/libexec/compat-hook/compat-hook-runtime | cut -d' ' -f4
ls /usr/lib/python3/dist-packages/compat_hook 2>&1 || true
step stop
ctr -a "$W/containerd.sock" task kill -s KILL live && echo kill=0
i=0
while ctr -a "$W/containerd.sock" task ls | grep -q RUNNING; do i=$((i+1)); [ $i -lt 100 ] || break; sleep 0.1; done
ctr -a "$W/containerd.sock" task rm -f live && echo task-rm=0
ctr -a "$W/containerd.sock" containers rm live && echo rm=0
step restart
# containerd stopped (as by a restart): the registration it held in memory is gone with it
kill "$(cat "$T/containerd.pid")"
i=0; while kill -0 "$(cat "$T/containerd.pid")" 2>/dev/null; do i=$((i+1)); [ $i -lt 100 ] || break; sleep 0.1; done
step purge
dpkg --purge compat-hook >/dev/null 2>&1
ls /usr/libexec/compat-hook 2>&1 || true
step end
"""


def _run_live(script_text: str, deb, tmp_path) -> tuple:
    """Run a LIVE_START-based script in a private mount namespace: ``(process, sections)``."""
    from tests.support import engines, images, rootfs as rfs

    lay = tmp_path / "img"
    images.umoci("init", "--layout", lay)
    images.umoci("new", "--image", f"{lay}:root")
    images.umoci("unpack", "--image", f"{lay}:root", tmp_path / "u")
    import shutil

    shutil.rmtree(tmp_path / "u" / "rootfs")
    rfs.build_rootfs(tmp_path / "u" / "rootfs")
    images.umoci("repack", "--image", f"{lay}:root", tmp_path / "u")
    tar = tmp_path / "img.tar"
    subprocess.run(["tar", "-C", lay, "-cf", tar, "."], check=True)
    work = tmp_path / "ovl"
    main = tmp_path / "config.toml"
    main.write_text(engines.MAIN_V2.replace("@W@", str(work / "ctrd")).replace("@PAUSE@", "docker.io/library/bb:root"))
    script = tmp_path / "inside.sh"
    script.write_text(script_text.format(tmp=shlex.quote(str(work)), deb=shlex.quote(str(deb)),
                                         main=shlex.quote(str(main)), image=shlex.quote(str(tar))))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", str(script)], capture_output=True,
                       text=True, env=ENV, timeout=300, stdin=subprocess.DEVNULL)
    return p, sections(p.stdout)


@pytest.mark.containers
def test_apt_remove_with_a_running_container_leaves_a_pass_through(deb, tmp_path):  # noqa: F811
    """``apt remove`` while a container created through the package's wrapper runs (containerd 1.6, ``ctr``):
    the wrapper's path becomes a pass-through to runc, so ``ctr task kill`` and ``task rm`` work after the
    package is gone; ``apt purge`` removes the pass-through once no task names it and containerd has
    restarted (stopped here)."""
    p, out = _run_live(REMOVE_LIVE, deb, tmp_path)
    assert p.returncode == 0 and "end" in out, p.stdout + p.stderr
    assert "live" in out["start"] and "RUNNING" in out["start"], out["start"]
    assert "still exist (default/live)" in out["remove"], out["remove"]
    assert "# compat-hook-runtime pass-through:" in out["after-remove"], out["after-remove"]
    assert 'exec /usr/sbin/runc "$@"' in out["after-remove"] or 'exec /usr/bin/runc "$@"' in out["after-remove"]
    assert "No such file or directory" in out["after-remove"]  # the package's Python is gone
    # containerd, running since before the removal, keeps the registration in memory: the pass-through
    # names that very process, so a purge removes it only once containerd has restarted.
    pid = (tmp_path / "ovl" / "containerd.pid").read_text().strip()
    assert f"containerd (pid {pid}) runs with its registration in memory" in out["remove"], out["remove"]
    assert pid in out["after-remove"].splitlines(), out["after-remove"]  # its "# engine-process:" line
    assert "kill=0" in out["stop"] and "task-rm=0" in out["stop"] and "rm=0" in out["stop"], p.stdout + p.stderr
    assert "No such file or directory" in out["purge"], out["purge"]  # the pass-through went with the purge


UPGRADE_LIVE = LIVE_START + r"""
step upgrade
dpkg -i {deb} 2>&1
step registered
grep -c compat-hook-runtime /etc/containerd/config.toml
step after-upgrade
ctr -a "$W/containerd.sock" run -d --runtime io.containerd.runc.v2 \
    --runc-binary /usr/libexec/compat-hook/compat-hook-runtime --runc-root "$W/runc-ctr" \
    docker.io/library/bb:root second sleep 600
ctr -a "$W/containerd.sock" task ls
step log
tail -n 1 /var/log/compat-hook.log
step stop
for c in live second; do
    ctr -a "$W/containerd.sock" task kill -s KILL $c && echo kill-$c=0
done
i=0
while ctr -a "$W/containerd.sock" task ls | grep -q RUNNING; do i=$((i+1)); [ $i -lt 100 ] || break; sleep 0.1; done
for c in live second; do
    ctr -a "$W/containerd.sock" task rm -f $c && ctr -a "$W/containerd.sock" containers rm $c && echo rm-$c=0
done
kill "$(cat "$T/containerd.pid")"
step end
"""


@pytest.mark.containers
def test_package_upgrade_under_a_running_container(deb, tmp_path):  # noqa: F811
    """``apt install`` of the package over itself (dpkg's upgrade path: prerm upgrade, unpack, postinst)
    while a container created through its wrapper runs: the registration stays, the running task keeps
    running and can be stopped and removed, and a new container starts through the upgraded wrapper and
    is logged."""
    p, out = _run_live(UPGRADE_LIVE, deb, tmp_path)
    assert p.returncode == 0 and "end" in out, p.stdout + p.stderr
    assert "live" in out["start"] and "RUNNING" in out["start"], out["start"]
    assert "still exist" not in out["upgrade"], out["upgrade"]  # an upgrade is not a removal
    assert int(out["registered"].strip()) >= 1, out["registered"]  # containerd's config still names it
    after = out["after-upgrade"]
    assert after.count("RUNNING") == 2 and "live" in after and "second" in after, after  # old and new task
    rec = json.loads(out["log"].strip().splitlines()[-1])
    assert rec["container_id"] == "second" and rec["event"] == "runtime", rec
    assert "kill-live=0" in out["stop"] and "kill-second=0" in out["stop"], out["stop"]
    assert "rm-live=0" in out["stop"] and "rm-second=0" in out["stop"], p.stdout + p.stderr

