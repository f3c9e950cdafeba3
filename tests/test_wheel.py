"""The README's pip route: ``make wheel``, the wheel installed in a fresh venv, the commands run from it.

compat-hook is not on PyPI: a clone builds the wheel (``make wheel``, offline) and
pip installs that file. The venv sees the system's PyYAML, pyelftools and tomlkit
(``--system-site-packages``), so nothing is downloaded; pip still checks the
wheel's requirements against them.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
#: What a fresh clone holds (the build must not depend on anything else in the tree).
_NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".cache", "dist", "build", "*.egg-info", "__pycache__",
                                         ".pytest_cache", ".hypothesis", "results")


def _version() -> str:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.slow
def test_make_wheel_then_the_commands_from_a_fresh_venv(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(REPO, clone, ignore=_NOT_IN_A_CLONE)
    p = subprocess.run(["make", "wheel"], cwd=clone, capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    whl = clone / "dist" / f"compat_hook-{_version()}-py3-none-any.whl"
    assert [x.name for x in (clone / "dist").iterdir()] == [whl.name]
    assert not (clone / "build").exists() and not list(clone.glob("*.egg-info"))  # the tree stays clean
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
    assert "compat_hook/data/compat-hook-runtime.sh" in names and "compat_hook/install/wrapper.py" in names

    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--system-site-packages", str(venv)], check=True, env=ENV, timeout=120)
    p = subprocess.run([str(venv / "bin/pip"), "install", "--no-index", str(whl)],
                       capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    shutil.rmtree(clone)  # what runs below can only be the installed copy

    def ch(*args):
        return subprocess.run([str(venv / "bin/compat-hook"), *args], capture_output=True, text=True,
                              env=ENV, timeout=120, cwd=tmp_path)

    where = subprocess.run([str(venv / "bin/python"), "-c", "import compat_hook; print(compat_hook.__file__)"],
                           capture_output=True, text=True, env=ENV, timeout=60, cwd=tmp_path)
    assert where.stdout.startswith(str(venv / "lib")), where.stdout + where.stderr

    v = ch("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"compat-hook {_version()}", v.stdout + v.stderr
    demo = ch("demo", "--no-containers")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "R535 LTS, A100" in demo.stdout and "compat_newer_supported" in demo.stdout

    rootfs, host = tmp_path / "rootfs", tmp_path / "host"
    rootfs.mkdir()
    host.mkdir()
    (tmp_path / "c.yaml").write_text(f"log_file: {tmp_path}/log\n")
    ex = ch("explain", "--rootfs", str(rootfs), "--host-root", str(host), "--host-driver-version", "535.183.01",
            "--config", str(tmp_path / "c.yaml"), "--json")
    assert ex.returncode == 0, ex.stderr
    assert '"reason": "no_candidate"' in ex.stdout and '"driver_version": "535.183.01"' in ex.stdout
