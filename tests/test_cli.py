"""The command line: bad usage is one line on stderr and exit 2, never a traceback."""

import subprocess
import sys

import pytest


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "compat_hook", *args], capture_output=True,
                          text=True, timeout=60, **kw)


@pytest.mark.parametrize("argv", [
    [], ["bogus"], ["explain"], ["explain", "--rootfs", "/", "--bogus"],
    ["explain", "--rootfs", "/", "--bundle", "/"], ["store"], ["store", "remove"],
    ["install", "nosuchengine"], ["hook-entry", "--stage", "poststop"],
    ["explain", "--rootfs", "/nonexistent-root"],
    ["explain", "--rootfs", "/", "--config", "/nonexistent.yaml"],
])
def test_bad_usage_is_one_line_and_exit_2(argv):
    p = _run(*argv)
    assert p.returncode == 2, (argv, p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    if argv:  # no command at all prints the help on stdout
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert p.stderr.startswith("compat-hook"), p.stderr


def test_bad_config_value_names_the_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("device_check: sometimes\n")
    p = _run("explain", "--rootfs", str(tmp_path), "--config", str(cfg))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "compat-hook: device_check: must be one of enforce, warn, off, got 'sometimes'"]


def test_version_and_config_defaults():
    assert _run("--version").stdout.strip().startswith("compat-hook ")
    p = _run("config")
    assert p.returncode == 0 and "device_check: enforce" in p.stdout
