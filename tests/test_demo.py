"""`compat-hook demo` shows the main job: the table of decisions and real runc containers."""

import pathlib
import subprocess
import sys

import pytest


def _demo(*args):
    return subprocess.run([sys.executable, "-m", "compat_hook", "demo", *args],
                          capture_output=True, text=True, timeout=300)


def test_demo_explain_table():
    p = _demo("--no-containers")
    assert p.returncode == 0, p.stderr
    rows = {line.split()[0] + " " + line.split()[1]: line.split()[-2:]
            for line in p.stdout.splitlines() if line.startswith("R5")}
    assert rows["R535 LTS,"] == ["enable", "compat_newer_supported"]
    assert rows["R545, branch"] == ["skip", "host_branch_unsupported"]
    assert rows["R580 (newer"] == ["skip", "compat_not_newer"]
    assert rows["R535 on"] == ["skip", "device_unsupported"]
    assert "Traceback" not in p.stderr


@pytest.mark.containers
def test_demo_real_containers():
    # CI runs as root with runc and busybox-static installed: the container part must run.
    p = _demo()
    assert p.returncode == 0, p.stdout + p.stderr
    assert "drop-in: /usr/local/cuda-12.9/compat" in p.stdout
    assert "ld cache: /usr/local/cuda-12.9/compat/libcuda.so.1" in p.stdout
    assert "drop-in: none" in p.stdout
    assert "Proved:" in p.stdout


def test_demo_plans_an_upgrade():
    p = _demo("--no-containers")
    assert p.returncode == 0, p.stderr
    rows = {line.split()[0]: line.split()[1:] for line in p.stdout.splitlines() if line.startswith("cuda-")}
    assert rows["cuda-12.9-with-compat"][:5] == ["12.9", "compat", "12.9", "host", "13.0"]
    assert rows["cuda-12.9-no-compat"][:4] == ["12.9", "host-minor", "12.4", "(222)"]
    assert "3 image(s): 0 broken after the upgrade, 2 change outcome" in p.stdout


REPO = pathlib.Path(__file__).resolve().parents[1]


def test_demo_without_root():
    """The README's first try: an unprivileged user, no GPU, no runc needed."""
    import os
    import shutil
    import tempfile

    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is a test dependency")
    # A copy anyone can read: the clone may live under a private home (/root).
    top = tempfile.mkdtemp(prefix="compat-hook-nobody-")
    try:
        shutil.copytree(REPO / "compat_hook", os.path.join(top, "compat_hook"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d, _, files in os.walk(top):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, "-m", "compat_hook", "demo", "--no-containers"],
                           capture_output=True, text=True, timeout=120, cwd=top,
                           env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C"})
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "compat_newer_supported" in p.stdout and "device_unsupported" in p.stdout
    assert "Traceback" not in p.stderr


def test_readme_first_screen_lets_you_try_it():
    text = (REPO / "README.md").read_text()
    first_screen = "\n".join(text.splitlines()[:45])
    assert "pip install ." in first_screen and "compat-hook demo --no-containers" in first_screen
    assert "not on PyPI" in first_screen
    assert "pip install compat-hook" not in text  # not on PyPI
    assert "make wheel" in text
    # the two commands that set up a fresh Debian 12 (root) stay true
    for target in ("demo", "test"):
        assert f"apt-get update && apt-get install -y make && make {target}\n" in text
    # what a user needs; the benchmark table and implementation notes live elsewhere
    assert len(text.splitlines()) < 330
    assert "| hook, non-GPU container |" not in text and "posix_spawn" not in text
    assert "| hook, non-GPU container |" in (REPO / "benchmarks/README.md").read_text()
    assert "posix_spawn" in (REPO / "docs/design.md").read_text()
    # the Docker check must not need the NVIDIA toolkit's --gpus
    for doc in ("README.md", "docs/engines.md"):
        assert "--runtime cuda-compat --gpus" not in (REPO / doc).read_text(), doc
