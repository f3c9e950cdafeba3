"""`compat-hook demo` shows the main job: the table of decisions and real runc containers."""

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
