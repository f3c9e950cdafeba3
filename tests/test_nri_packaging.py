"""The NRI plugin as a newcomer gets it: built (``make nri-plugin``), in the package, in the image.

* ``packaging/nri/build.py`` (``make nri-plugin``) without a usable Go: one line saying what to
  install, exit 1, nothing written.
* ``build-image.sh`` refuses a package without the plugin (plain ``make deb``) in one line unless
  told ``--nri-plugin none``: no silent plugin-less image.
* The package built with the plugin (``make deb NRI_PLUGIN=...``, what ``make image`` runs) is
  architecture-specific, passes lintian, ships ``/usr/libexec/compat-hook/compat-hook-nri``, and
  ``compat-hook install containerd --via nri`` finds it there without ``--nri-plugin``; ``dpkg -r``
  takes it away (a real ``dpkg -i`` in a private overlay of this machine's root, as tests/test_deb.py).
* ``install containerd --via nri`` on Debian 12's containerd 1.6 says that 1.6 has no NRI, whatever
  its config file says or whether there is one.
"""

from __future__ import annotations

import pathlib
import shlex
import subprocess

import pytest

from tests.support import kubebuild
from tests.support.steps import NODE_OVERLAY, sections
from tests.test_live_engines import default_config

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
VERSION = __import__("compat_hook").__version__
PACKAGED = "/usr/libexec/compat-hook/compat-hook-nri"


def _run(argv, **kw):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=kw.pop("env", ENV), timeout=kw.pop("timeout", 300), **kw)


def _cli(*argv):
    return _run(["/usr/bin/python3", "-m", "compat_hook", *argv], cwd=REPO)


def test_nri_plugin_build_without_a_usable_go_says_what_to_install(tmp_path):
    out = tmp_path / "compat-hook-nri"
    p = _run(["/usr/bin/python3", REPO / "packaging/nri/build.py", "--out", out, "--go", "/bin/true"])
    assert p.returncode == 1 and "Traceback" not in p.stderr, p
    assert p.stderr.count("\n") == 1, p.stderr
    assert "is not a Go >= 1.24" in p.stderr and "install Go >= 1.24" in p.stderr, p.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_image_build_refuses_a_package_without_the_plugin(tmp_path):
    p = _run(["make", "-C", REPO, "deb", f"DEB_OUT={tmp_path}", "PY=/usr/bin/python3"])
    assert p.returncode == 0, p
    assert "no NRI plugin in this package" in p.stderr, p.stderr
    deb = tmp_path / f"compat-hook_{VERSION}_all.deb"
    assert PACKAGED.lstrip("/") not in _run(["dpkg-deb", "-c", deb]).stdout
    layout = tmp_path / "layout"
    p = _run([REPO / "packaging/oci-image/build-image.sh", "--deb", deb, "--layout", layout,
              "--tar", tmp_path / "image.tar"])
    assert p.returncode == 1 and p.stdout == "", p
    assert p.stderr.count("\n") == 1 and "carries no NRI plugin" in p.stderr and "make image" in p.stderr, p.stderr
    assert not layout.exists() and not (tmp_path / "image.tar").exists()


def test_via_nri_on_containerd_1_6_says_it_has_no_nri(tmp_path):
    """Debian 12's containerd 1.6: no config file (the case that used to say `set disable = false there`),
    its own default config, and that config with NRI "enabled" (1.6 ignores it): one line, nothing written."""
    version = _run(["containerd", "--version"]).stdout.split()[2]
    assert version.startswith("1.6"), version
    cfg = default_config(tmp_path / "c.yaml", tmp_path)
    default = _run(["containerd", "config", "default"]).stdout
    enabled = tmp_path / "enabled.toml"
    enabled.write_text(default +
                       f"\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n"
                       f"  plugin_path = \"{tmp_path}/plugins\"\n  plugin_config_path = \"{tmp_path}/conf.d\"\n")
    (tmp_path / "default.toml").write_text(default)
    for main in (tmp_path / "missing.toml", tmp_path / "default.toml", enabled):
        p = _cli("install", "containerd", "--via", "nri", "--engine-config", main, "--hook-config", cfg,
                 "--nri-plugin", kubebuild.nri_plugin())
        assert p.returncode == 1 and "Traceback" not in p.stderr, (main, p)
        assert p.stderr.count("\n") == 1, p.stderr
        assert "containerd 1.6 has no NRI (1.7 and later); register the runtime wrapper" in p.stderr, p.stderr
        assert "--via wrapper" in p.stderr and "disable = false" not in p.stderr, p.stderr
    assert not (tmp_path / "plugins").exists() and not (tmp_path / "conf.d").exists()
    assert not (tmp_path / "missing.toml").exists()


@pytest.fixture(scope="module")
def nri_deb(tmp_path_factory) -> pathlib.Path:
    """``make deb NRI_PLUGIN=...`` with the plugin the tests build (what ``make image`` ships)."""
    out = tmp_path_factory.mktemp("dist-nri")
    p = _run(["make", "-C", REPO, "deb", f"DEB_OUT={out}", "PY=/usr/bin/python3",
              f"NRI_PLUGIN={kubebuild.nri_plugin()}"])
    assert p.returncode == 0, p
    arch = _run(["dpkg", "--print-architecture"]).stdout.strip()
    deb = out / f"compat-hook_{VERSION}_{arch}.deb"
    assert str(deb) in p.stdout.splitlines() and deb.is_file(), p
    return deb


@pytest.mark.slow
def test_package_with_the_plugin_is_arch_specific_and_lintian_clean(nri_deb):
    arch = _run(["dpkg", "--print-architecture"]).stdout.strip()
    assert _run(["dpkg-deb", "-f", nri_deb, "Architecture"]).stdout.strip() == arch
    listing = _run(["dpkg-deb", "-c", nri_deb]).stdout
    line = next(ln for ln in listing.splitlines() if ln.endswith("." + PACKAGED))
    assert line.startswith("-rwxr-xr-x root/root"), line
    p = _run(["lintian", "--fail-on", "error", nri_deb], timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr


INSIDE = NODE_OVERLAY + r"""
rm -rf /usr/local/libexec/compat-hook /var/lib/compat-hook
dpkg -i {deb} >"$T/dpkg-install.log" 2>&1 || {{ cat "$T/dpkg-install.log"; exit 1; }}
mkdir -p "$T/ctrd"
printf "version = 3\n\n[plugins]\n  [plugins.'io.containerd.nri.v1.nri']\n    plugin_path = '%s'\n    plugin_config_path = '%s'\n" \
    "$T/nri/plugins" "$T/nri/conf.d" > "$T/ctrd/config.toml"
step dry-run
compat-hook install containerd --via nri --engine-config "$T/ctrd/config.toml" --dry-run
step install
compat-hook install containerd --via nri --engine-config "$T/ctrd/config.toml"
cmp "$T/nri/plugins/90-compat-hook" {plugin} && echo "the packaged plugin"
step uninstall
compat-hook uninstall containerd --via nri --engine-config "$T/ctrd/config.toml"
ls "$T/nri" 2>&1 || true
step remove
dpkg -r compat-hook >/dev/null 2>&1
ls {plugin} 2>&1 || true
step end
"""


@pytest.mark.containers
def test_via_nri_finds_the_packaged_plugin(nri_deb, tmp_path):
    script = tmp_path / "inside.sh"
    script.write_text(INSIDE.format(tmp=shlex.quote(str(tmp_path / "ovl")), deb=shlex.quote(str(nri_deb)),
                                    plugin=PACKAGED))
    p = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script])
    out = sections(p.stdout)
    assert p.returncode == 0 and "end" in out, p.stdout + p.stderr
    assert f"(the NRI plugin, from {PACKAGED})" in out["dry-run"], out["dry-run"]
    assert "90-compat-hook" in out["install"] and "the packaged plugin" in out["install"], out["install"]
    assert "No such file or directory" in out["uninstall"], out["uninstall"]
    assert "No such file or directory" in out["remove"], out["remove"]


def test_docs_build_the_image_with_make_image():
    """Every doc that builds the image says `make image` (plugin, package, image), none the plugin-less
    `make deb` + build-image.sh of before; the Makefile's target runs the three steps."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for doc in docs:
        text = doc.read_text()
        commands = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("packaging/oci-image/build-image.sh")]
        assert not commands, (doc.name, commands)
    for name in ("README.md", "docs/engines.md", "docs/cluster.md"):
        assert "make image" in (REPO / name).read_text(), name
    make = _run(["make", "-C", REPO, "-n", "image", "PY=/usr/bin/python3", "GO=/usr/local/go/bin/go"]).stdout
    steps = [ln for ln in make.splitlines() if "packaging/" in ln]
    assert "packaging/nri/build.py" in steps[0] and "--go /usr/local/go/bin/go" in steps[0], steps
    assert "build-deb.py" in steps[1] and "--nri-plugin dist/compat-hook-nri" in steps[1], steps
    assert "packaging/oci-image/build-image.sh --deb" in steps[-1], steps
