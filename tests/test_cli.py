"""The command line: bad usage is one line on stderr and exit 2, never a traceback."""

import json
import pathlib
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


# -- explain's host flags agree with the same keys in a config -----------------------------

def _explain(tmp_path, *extra, config=None):
    (tmp_path / "rootfs").mkdir(exist_ok=True)
    (tmp_path / "host").mkdir(exist_ok=True)
    args = ["explain", "--rootfs", str(tmp_path / "rootfs"), "--json", *extra]
    if "--host-root" not in extra:
        args += ["--host-root", str(tmp_path / "host")]
    if config is not None:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(config)
        args += ["--config", str(cfg)]
    return _run(*args)


def _one_line_exit_2(p) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.mark.parametrize("flag, key", [("--host-driver-version", "host_driver_version"),
                                       ("--host-cuda-version", "host_cuda_version")])
@pytest.mark.parametrize("value", ["banana", "1.2.3.4", "550..1", ""])
def test_explain_bad_version_flag_is_exit_2_like_the_config(tmp_path, flag, key, value):
    line = _one_line_exit_2(_explain(tmp_path, flag, value))
    assert line == f"compat-hook: {flag}: not a version of 1-3 numeric parts, got {value!r}"
    from_config = _one_line_exit_2(_explain(tmp_path, config=f'{key}: "{value}"\n'))
    assert from_config.startswith(f"compat-hook: {key}: not a version"), from_config


def test_explain_good_version_flag_is_used(tmp_path):
    p = _explain(tmp_path, "--host-driver-version", "535.104.05")
    assert p.returncode == 0, p.stderr
    host = json.loads(p.stdout)["host"]
    assert host["driver_version"] == "535.104.05" and host["driver_source"] == "command line"


def test_explain_missing_host_root_is_exit_2(tmp_path):
    missing = tmp_path / "no-such-host"
    line = _one_line_exit_2(_explain(tmp_path, "--host-root", str(missing)))
    assert line == f"compat-hook: --host-root {missing}: no such directory"
    # a file is not a host root either
    (tmp_path / "afile").write_text("")
    line = _one_line_exit_2(_explain(tmp_path, "--host-root", str(tmp_path / "afile")))
    assert line.endswith(": no such directory")
    # an existing (empty) host tree is fine: the driver is then unknown
    p = _explain(tmp_path, "--host-root", str(tmp_path / "host"))
    assert p.returncode == 0 and json.loads(p.stdout)["host"]["driver_version"] is None, p.stderr


# -- config --check names the file ---------------------------------------------------------

@pytest.mark.parametrize("text, rest", [
    ("mode: nope\n", "mode: must be one of ldconfig, env, both, got 'nope'"),
    ("modee: env\n", "modee: unknown key (did you mean mode?)"),
    ("host_driver_version: banana\n", "host_driver_version: not a version"),
    ("- a list\n", "(top level): must be a mapping of keys, got list"),
    ("mode: [unclosed\n", "not valid YAML at line"),
])
def test_config_check_error_names_the_file(tmp_path, text, rest):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    line = _one_line_exit_2(_run("config", "--check", str(f)))
    assert line.startswith(f"compat-hook: {f}: {rest}"), line
    assert line.count(str(f)) == 1, line  # named once, also where load() already names it


def test_config_check_missing_file_names_it(tmp_path):
    f = tmp_path / "nope.yaml"
    assert _one_line_exit_2(_run("config", "--check", str(f))) == f"compat-hook: {f}: no such file"


def test_config_check_good_file(tmp_path):
    f = tmp_path / "ok.yaml"
    f.write_text("mode: env\n")
    p = _run("config", "--check", str(f))
    assert p.returncode == 0 and json.loads(p.stdout)["mode"] == "env", p.stderr


# -- --help has text for every install/uninstall option ------------------------------------

@pytest.mark.parametrize("verb", ["install", "uninstall"])
def test_every_install_option_has_help(verb):
    import argparse

    from compat_hook.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    parsers = [sub.choices[verb]]
    # engines may come as sub-commands of their own: check those too
    for p in list(parsers):
        parsers += [c for a in p._actions if isinstance(a, argparse._SubParsersAction)
                    for c in a.choices.values()]
    missing = [(p.prog, a.dest) for p in parsers for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not missing, missing
    out = _run(verb, "--help")
    assert out.returncode == 0 and "--runtime-name" in out.stdout


# -- docs link only to what a clone has ----------------------------------------------------

def test_doc_links_stay_inside_the_repo():
    import pathlib
    import re

    repo = pathlib.Path(__file__).resolve().parent.parent
    bad = []
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (doc.parent / target.split("#")[0]).resolve()
            if repo not in path.parents:
                bad.append(f"{doc.relative_to(repo)}: {target}")
        if "../shared/" in doc.read_text():
            bad.append(f"{doc.relative_to(repo)}: names ../shared/, which a clone does not have")
    assert not bad, bad


def test_config_check_says_what_cannot_take_effect(tmp_path):
    """The same checks as install: a setting that cannot take effect on a registration path."""
    p = tmp_path / "c.yaml"
    p.write_text("mode: ldconfig\nwrapper_add_hook: false\n")
    out = _run("config", "--check", str(p))
    assert out.returncode == 0, out.stderr
    [w] = out.stderr.splitlines()
    assert w.startswith(f"compat-hook: {p}: warning when registered through the runtime wrapper: wrapper_add_hook")
    p.write_text("mode: env\nruntime: no-such-runtime\n")
    out = _run("config", "--check", str(p))
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert any("warning when registered as a hook alone" in ln and "mode: env" in ln for ln in lines)
    assert any("error when registered through the runtime wrapper" in ln and "no-such-runtime" in ln for ln in lines)
    # the shipped configuration has nothing to say
    shipped = _run("config", "--check", str(pathlib.Path(__file__).resolve().parent.parent / "config/compat-hook.yaml"))
    assert shipped.returncode == 0 and shipped.stderr == ""
