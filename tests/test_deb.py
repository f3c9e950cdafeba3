"""The Debian package: ``make deb``, lintian, and a real ``dpkg -i`` into a throwaway root.

The throwaway root is this machine's own root seen through overlays: in a
private mount namespace (``unshare -m``), ``/usr``, ``/etc`` and ``/var`` get
an overlay whose upper layer is in the test's tmp dir. ``dpkg -i`` there runs
the real maintainer scripts against the real dpkg database and the real
Python, the installed ``compat-hook`` and hook run from their installed
locations, and Podman (default hooks dir, no ``--hooks-dir``) picks up the
packaged hooks.d file, all without changing this machine: the overlays vanish
with the namespace.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import subprocess

import pytest

from tests.support.trees import write_fake_host
from tests.support import debs
from tests.support.debpkg import deb  # noqa: F401  (the module-scoped .deb fixture)
from tests.support.steps import NODE_OVERLAY, sections as _sections
from tests.support.engines import PODMAN_IMAGE as IMAGE, RUN_FLAGS, build_image_tar, start_podman
from tests.support.rootfs import COMPAT_LIBCUDA as COMPAT_LIB, HOST_LIBCUDA as SYS_LIB
from tests.support.versions import COMPAT_550, HOST_535

REPO = pathlib.Path(__file__).resolve().parent.parent
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
VERSION = __import__("compat_hook").__version__


def _run(argv, *, timeout=300, check=True, **kw):
    p = subprocess.run([str(a) for a in argv], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout, env=kw.pop("env", ENV), **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def _field(deb, name):
    return _run(["dpkg-deb", "-f", deb, name]).stdout.strip()


def test_control_and_contents(deb):
    assert _field(deb, "Package") == "compat-hook"
    assert _field(deb, "Version") == VERSION
    assert _field(deb, "Architecture") == "all"
    depends = _field(deb, "Depends")
    for dep in ("python3", "python3-yaml", "python3-pyelftools"):
        assert dep in depends, depends
    assert "python3-tomlkit" in _field(deb, "Recommends")
    files = {ln.split()[-1].lstrip(".") for ln in _run(["dpkg-deb", "-c", deb]).stdout.splitlines()}
    for f in ("/usr/bin/compat-hook", "/usr/bin/compat-hook-runtime",
              "/usr/share/containers/oci/hooks.d/50-compat-hook.json", "/etc/compat-hook/config.yaml",
              "/usr/share/man/man8/compat-hook.8.gz", "/usr/share/doc/compat-hook/copyright",
              "/usr/share/doc/compat-hook/changelog.gz",
              "/usr/lib/python3/dist-packages/compat_hook/commands/hook.py",
              "/usr/lib/python3/dist-packages/compat_hook/install/podman.py"):
        assert f in files, f
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    if (REPO / "compat_hook/data/compat-hook-runtime.sh").is_file():
        assert "/usr/libexec/compat-hook/compat-hook-runtime" in files
    x = pathlib.Path(str(deb) + ".ctl")
    _run(["dpkg-deb", "-e", deb, x])
    assert (x / "conffiles").read_text() == "/etc/compat-hook/config.yaml\n/etc/logrotate.d/compat-hook\n"
    for script in ("postinst", "prerm", "postrm"):
        text = (x / script).read_text()
        for word in ("systemctl", "service ", "invoke-rc.d", "restart", "reload"):
            assert word not in text.replace("restarted", "").replace("no daemon is started or restarted", ""), \
                (script, word)
    shutil.rmtree(x)

    tree = pathlib.Path(str(deb) + ".x")
    _run(["dpkg-deb", "-x", deb, tree])
    doc = json.loads((tree / "usr/share/containers/oci/hooks.d/50-compat-hook.json").read_text())
    assert doc["version"] == "1.0.0" and doc["when"] == {"always": True} and doc["stages"] == ["createContainer"]
    assert doc["hook"]["path"] == "/usr/bin/python3" == doc["hook"]["args"][0]
    assert doc["hook"]["args"][1:4] == ["-I", "-S", "-c"]
    assert "['/usr/lib/python3/dist-packages']" in doc["hook"]["args"][4]
    assert doc["hook"]["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"]
    src_cfg = REPO / "config/compat-hook.yaml"
    if src_cfg.is_file():
        assert (tree / "etc/compat-hook/config.yaml").read_bytes() == src_cfg.read_bytes()
    # the log is rotated by rename (the hook reopens it at every start: benchmarks/soak.py)
    rot = (tree / "etc/logrotate.d/compat-hook").read_text()
    assert "/var/log/compat-hook.log {" in rot and "copytruncate" not in rot.split("{", 1)[1], rot
    assert {"maxsize 50M", "rotate 8", "missingok", "compress"} <= {ln.strip() for ln in rot.splitlines()}, rot
    assert (tree / "usr/bin/compat-hook").read_text().startswith("#!/usr/bin/python3 -I\n")
    shutil.rmtree(tree)


@pytest.mark.slow
def test_lintian_reports_no_errors(deb):
    if shutil.which("lintian") is None:  # CI installs it (Makefile TEST_DEPS); fetch it where missing
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "lintian"], timeout=600,
             env=dict(ENV, DEBIAN_FRONTEND="noninteractive"))
    p = _run(["lintian", "--fail-on", "error", "--no-tag-display-limit", deb], check=False, timeout=300)
    errors = [ln for ln in p.stdout.splitlines() if ln.startswith("E:")]
    assert p.returncode == 0 and not errors, p.stdout + p.stderr


INSIDE = NODE_OVERLAY + r"""
step install
dpkg -i {deb} >"$T/dpkg-install.log" 2>&1 || {{ cat "$T/dpkg-install.log"; exit 1; }}
dpkg-query -W -f '${{Status}} ${{Version}}\n' compat-hook
step module
cd /
python3 -I -c 'import compat_hook, sys; print(compat_hook.__file__)'
step pycache
ls /usr/lib/python3/dist-packages/compat_hook/commands/__pycache__ | grep -c 'hook.cpython' || true
step version
compat-hook --version
step runtime
/usr/libexec/compat-hook/compat-hook-runtime --compat-hook-resolve
compat-hook-runtime --version | head -n1
step explain
env -i PATH=/usr/bin:/bin compat-hook explain --rootfs {rootfs} --host-root {host} --json
step hook
cat > /etc/compat-hook/config.yaml <<EOF
host_root: {host}
log_file: {log}
nvml: "off"
EOF
{podman_run} -e NVIDIA_VISIBLE_DEVICES=all -v {lib535}:{syslib}:ro {image} 2>"$T/podman1.err" || \
    {{ echo "podman-exit=$?"; cat "$T/podman1.err"; }}
step install-podman
compat-hook install podman --dry-run
step install-podman-other
compat-hook install podman --hook-config /etc/compat-hook/other.yaml --dry-run >/dev/null 2>"$T/other.err" \
    && echo "exit=0" || echo "exit=$?"
cat "$T/other.err"
step purge
dpkg --purge compat-hook >"$T/dpkg-purge.log" 2>&1 || {{ cat "$T/dpkg-purge.log"; exit 1; }}
grep -i warning "$T/dpkg-purge.log" || echo "no warnings"
for f in /usr/bin/compat-hook /usr/share/containers/oci/hooks.d/50-compat-hook.json \
         /etc/compat-hook/config.yaml /usr/lib/python3/dist-packages/compat_hook; do
    if [ -e "$f" ]; then echo "left: $f"; fi
done
step after-purge
{podman_run} -e NVIDIA_VISIBLE_DEVICES=all -v {lib535}:{syslib}:ro {image} 2>"$T/podman2.err" || \
    {{ echo "podman-exit=$?"; cat "$T/podman2.err"; }}
step end
"""


@pytest.mark.containers
def test_install_into_throwaway_root_runs_explain_and_hook(deb, tmp_path):
    """dpkg -i (overlay root) -> the installed explain, the packaged hook under Podman, purge."""
    libs = {v: debs.libcuda(v) for v in (HOST_535, COMPAT_550)}
    host = write_fake_host(tmp_path / "host", version_line=(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {HOST_535}  Release Build  Mon Dec  1 2026"))
    work = tmp_path / "image"
    tar = build_image_tar(work, compat_lib=libs[COMPAT_550])
    explain_root = tmp_path / "explain-rootfs"
    from tests.support import rootfs as rfs

    rfs.build_rootfs(explain_root, compat_lib=libs[COMPAT_550])
    pm = start_podman(tmp_path / "pm", tar)
    try:
        podman_run = " ".join(shlex.quote(str(a)) for a in pm.argv("run", "--rm", *RUN_FLAGS))
        log = tmp_path / "hook.log"
        script = tmp_path / "inside.sh"
        script.write_text(INSIDE.format(
            tmp=shlex.quote(str(tmp_path / "ovl")), deb=shlex.quote(str(deb)), rootfs=shlex.quote(str(explain_root)),
            host=host, log=log, podman_run=podman_run, lib535=libs[HOST_535], syslib=SYS_LIB, image=IMAGE))
        p = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script], check=False, timeout=300)
        out = _sections(p.stdout)
        assert p.returncode == 0 and "end" in out, p.stdout + p.stderr

        assert out["install"].strip() == f"install ok installed {VERSION}", out["install"]
        assert out["module"].strip() == "/usr/lib/python3/dist-packages/compat_hook/__init__.py"
        assert int(out["pycache"].strip() or 0) >= 1, out["pycache"]  # postinst byte-compiled
        assert out["version"].strip() == f"compat-hook {VERSION}"
        resolved, real = out["runtime"].splitlines()
        assert resolved == "runtime=runc" and real.startswith("runc version"), out["runtime"]
        report = json.loads(out["explain"])
        assert report["decision"] == "enable" and report["reason"] == "compat_major_newer", report

        probe = dict(ln.split("=", 1) for ln in out["hook"].splitlines() if "=" in ln)
        assert probe == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}, out["hook"] + p.stderr
        recs = [json.loads(ln) for ln in log.read_text().splitlines()]
        assert [r["decision"] for r in recs] == ["enable"], recs

        assert "podman: already registered; nothing changed" in out["install-podman"], out["install-podman"]
        assert "exit=1" in out["install-podman-other"] and "belongs to the compat-hook package" in \
            out["install-podman-other"], out["install-podman-other"]

        assert "left:" not in out["purge"] and "no warnings" in out["purge"], out["purge"]
        probe = dict(ln.split("=", 1) for ln in out["after-purge"].splitlines() if "=" in ln)
        assert probe == {"cuDriverGetVersion": "12020", "libcuda": SYS_LIB}, out["after-purge"]
        assert len(log.read_text().splitlines()) == 1  # no hook after the purge
    finally:
        pm.reset()
    # Nothing of it reached this machine.
    assert not os.path.exists("/usr/share/containers/oci/hooks.d/50-compat-hook.json") or \
        _installed_on_host()
    assert not pathlib.Path("/usr/lib/python3/dist-packages/compat_hook").exists() or _installed_on_host()


def _installed_on_host() -> bool:
    return _run(["dpkg-query", "-W", "compat-hook"], check=False).returncode == 0
