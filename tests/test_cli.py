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


def test_config_check_reports_every_error_one_line_each(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("mode: nope\nmodee: env\ncompat_dirs: [/ok, rel]\nhost_driver_version: banana\n")
    p = _run("config", "--check", str(f))
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.splitlines() == [
        f"compat-hook: {f}: mode: must be one of ldconfig, env, both, got 'nope'",
        f"compat-hook: {f}: modee: unknown key (did you mean mode?)",
        f"compat-hook: {f}: compat_dirs[1]: must be an absolute path, got 'rel'",
        f"compat-hook: {f}: host_driver_version: not a version (quote it: \"550.54.15\"), got 'banana'",
    ]


def test_config_check_names_every_bad_cluster_key_and_refuses_others_prefixes(tmp_path):
    """``cluster:`` as the rest of the file: every bad key a line, and a label prefix that is the GPU Operator's
    or Kubernetes' own (nvidia.com, a subdomain of k8s.io) refused as the chart refuses it."""
    f = tmp_path / "bad.yaml"
    f.write_text("cluster:\n  label_prefix: nvidia.com\n  gate: true\n  gate_upgrade: maybe\n")
    p = _run("config", "--check", str(f))
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.splitlines() == [
        f"compat-hook: {f}: cluster.label_prefix: 'nvidia.com' is nvidia.com's (the GPU Operator's or Kubernetes' "
        "own keys): choose a domain of yours (compat-hook.io)",
        f"compat-hook: {f}: cluster.gate: unknown key (one of gate_upgrade, label_prefix, nfd_features_file, textfile, "
        "compat_runtime_classes, hold_quiet_s, validation_allow_unverified, validation_taint, workload_max_age_s)",
        f"compat-hook: {f}: cluster.gate_upgrade: must be true or false, got 'maybe'",
    ]
    for prefix in ("node.k8s.io", "kubernetes.io", "x.nvidia.com"):
        f.write_text(f"cluster: {{label_prefix: {prefix}}}\n")
        line = _one_line_exit_2(_run("config", "--check", str(f)))
        assert f"cluster.label_prefix: {prefix!r} is " in line, line
    f.write_text("cluster: {label_prefix: nvidia.com.example.org}\n")  # a domain of one's own that mentions it
    assert _run("config", "--check", str(f)).returncode == 0


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

    from compat_hook.commands.cli import _parser

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


# -- --help: exit 0, the help on stdout, nothing logged or written -------------------------

HELP_COMMANDS = [[], ["explain"], ["plan"], ["report"], ["hook"], ["hook-entry"], ["demo"], ["config"],
                 ["store"], ["store", "add"], ["store", "list"], ["store", "remove"],
                 ["install"], ["uninstall"]]


def _help_markers():
    """Lines a wrongly logged ``hook --help`` would leave in the default log."""
    try:
        with open("/var/log/compat-hook.log", errors="replace") as f:
            return sum("usage: compat-hook hook" in line for line in f)
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("cmd", HELP_COMMANDS, ids=lambda c: "-".join(c) or "top")
def test_help_exits_0_and_writes_nothing(tmp_path, cmd, flag):
    import os

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"log_file: {tmp_path}/log\nstore_dir: {tmp_path}/store\n")
    env = dict(os.environ, COMPAT_HOOK_CONFIG=str(cfg), COMPAT_HOOK_STATE_DIR=str(tmp_path / "state"),
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parent.parent))
    extra = ["--config", str(cfg), "--state-dir", str(tmp_path / "state")] if cmd == ["hook"] else []
    before = _help_markers()
    p = _run(*cmd, *extra, flag, env=env, cwd=tmp_path)
    assert p.returncode == 0, (p.returncode, p.stderr)
    assert p.stderr == "" and "Traceback" not in p.stdout
    assert p.stdout.startswith("usage: compat-hook" + "".join(" " + c for c in cmd)), p.stdout[:200]
    assert "usage: usage" not in p.stdout
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.yaml"]  # no log, no state, no store
    assert _help_markers() == before


def test_uninstall_help_is_its_own():
    ins, unins = _run("install", "--help").stdout, _run("uninstall", "--help").stdout
    assert "usage: compat-hook uninstall" in unins
    # install's description talks about registering; uninstall's about undoing it
    assert ins.split("positional arguments")[0].split("\n\n", 1)[1] != \
        unins.split("positional arguments")[0].split("\n\n", 1)[1], (ins[:400], unins[:400])
    assert "undo" in unins.split("positional arguments")[0].lower()
    for flag in ("--dry-run", "--engine-config", "--hook-config"):
        assert flag in unins and flag in ins


@pytest.mark.parametrize("form", ["shell wrapper", "console script"])
def test_runtime_wrapper_help_is_the_real_runtimes_and_writes_nothing(tmp_path, form):
    """``compat-hook-runtime --help`` is a non-editing call: the real runtime's help, exit 0, no log."""
    import os
    import shutil

    from compat_hook.install.wrapper import render_wrapper

    if shutil.which("runc") is None:
        pytest.fail("runc is a test dependency (make deps-test)")
    repo = str(pathlib.Path(__file__).resolve().parent.parent)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"log_file: {tmp_path}/log\nruntime: runc\n")
    env = dict(os.environ, COMPAT_HOOK_CONFIG=str(cfg), COMPAT_HOOK_STATE_DIR=str(tmp_path / "state"),
               PYTHONPATH=repo)
    if form == "shell wrapper":
        w = tmp_path / "compat-hook-runtime"
        w.write_text(render_wrapper(str(cfg), python=sys.executable, paths=[repo],
                                    state_dir=str(tmp_path / "state")))
        w.chmod(0o755)
        argv = [str(w), "--help"]
    else:
        argv = [sys.executable, "-c", "import sys; from compat_hook.commands.runtime import main; sys.exit(main())",
                "--help"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "runc" in p.stdout and "Traceback" not in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(["c.yaml"] + (["compat-hook-runtime"]
                                                                              if form == "shell wrapper" else []))


# -- --config is compat-hook's own config everywhere; the engine's file is --engine-config --

def _docker_install(tmp_path, flag):
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"log-level": "warn"}\n')
    p = _run("install", "docker", flag, str(daemon), "--wrapper-path", str(tmp_path / "w"),
             "--toolkit-config", "none", "--state-dir", str(tmp_path / "state"))
    return p, json.loads(daemon.read_text())


def test_install_engine_config_names_the_engines_file(tmp_path):
    p, daemon = _docker_install(tmp_path, "--engine-config")
    assert p.returncode == 0, p.stderr
    assert "deprecated" not in p.stderr
    assert daemon["runtimes"]["cuda-compat"]["path"] == str(tmp_path / "w") and daemon["log-level"] == "warn"
    u = _run("uninstall", "docker", "--engine-config", str(tmp_path / "daemon.json"),
             "--wrapper-path", str(tmp_path / "w"), "--toolkit-config", "none", "--state-dir", str(tmp_path / "state"))
    assert u.returncode == 0, u.stderr
    assert json.loads((tmp_path / "daemon.json").read_text()) == {"log-level": "warn"}


def test_install_config_is_a_deprecated_alias_with_a_one_line_notice(tmp_path):
    p, daemon = _docker_install(tmp_path, "--config")
    assert p.returncode == 0, p.stderr
    assert daemon["runtimes"]["cuda-compat"]["path"] == str(tmp_path / "w")
    notice = [ln for ln in p.stderr.splitlines() if "deprecated" in ln]
    assert notice == ["compat-hook: --config of install is deprecated: use --engine-config "
                      "(compat-hook's own config is --hook-config)"], p.stderr


def test_install_engine_config_and_its_alias_together_is_bad_usage(tmp_path):
    p = _run("install", "docker", "--engine-config", str(tmp_path / "a"), "--config", str(tmp_path / "b"),
             "--dry-run")
    assert p.returncode == 2 and "not allowed with" in p.stderr.splitlines()[-1], p.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("verb", ["install", "uninstall"])
def test_install_options_map_to_the_engine_and_compat_hook_configs(verb):
    from compat_hook.commands.cli import _parser
    from compat_hook.install import Options

    ns = _parser().parse_args([verb, "containerd", "--engine-config", "/e.toml", "--hook-config", "/c.yaml"])
    o = Options.from_namespace(ns)
    assert (o.config, o.hook_config) == ("/e.toml", "/c.yaml")


# -- the host driver is shown as the driver spells it (535.183.01, never 535.183.1) ----------

_LINE_01 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def test_driver_version_keeps_its_zero_padding_in_explain_plan_and_the_log(tmp_path):
    from tests.support import hostile as h

    env = h.make_hook_env(tmp_path / "env")
    (env.host_root / "proc/driver/nvidia/version").write_text(_LINE_01)
    bundle = tmp_path / "bundle"
    rootfs = h.base_rootfs(bundle / "rootfs")
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"args": ["/bin/true"], "env": ["NVIDIA_VISIBLE_DEVICES=all"], "cwd": "/"}}))
    outputs = {}
    for name, argv in {
        "explain --json": ["explain", "--rootfs", str(rootfs), "--json"],
        "explain": ["explain", "--rootfs", str(rootfs)],
        "plan --json": ["plan", str(rootfs), "--driver", "580.65.06", "--json"],
        "plan": ["plan", str(rootfs), "--driver", "580.65.06"],
    }.items():
        p = _run(*argv, "--host-root", str(env.host_root), "--config", str(env.config))
        assert p.returncode == 0, (name, p.stderr)
        outputs[name] = p.stdout
    res = h.run_hook(env.entry, h.state_json(bundle), cwd=rootfs)
    assert res.rc == 0, res
    [rec] = env.log_records()
    outputs["hook log"] = json.dumps(rec)
    for name, text in outputs.items():
        assert "535.183.01" in text, (name, text)
        assert "535.183.1" not in text.replace("535.183.01", ""), (name, text)
    assert json.loads(outputs["explain --json"])["details"]["host_driver"] == "535.183.01"


def test_explain_rootfs_says_the_gpu_is_assumed_without_doubled_parentheses(tmp_path):
    p = _explain(tmp_path)
    assert p.returncode == 0, p.stderr
    p = _run("explain", "--rootfs", str(tmp_path / "rootfs"), "--host-root", str(tmp_path / "host"))
    [line] = [ln for ln in p.stdout.splitlines() if "GPU requested" in ln]
    assert line.strip() == "GPU requested: yes, assumed (--rootfs)", line
    assert "((" not in p.stdout and "))" not in p.stdout


def test_man_page_names_the_engine_config_flag():
    man = (pathlib.Path(__file__).resolve().parent.parent / "packaging/man/compat-hook.8").read_text()
    synopsis = man.split(".SH DESCRIPTION")[0]
    install = synopsis.split('.BR "compat-hook install"')[1].split(".br")[0]
    assert "\\-\\-engine\\-config" in install and "\\-\\-config\n" not in install
    options = man.split(".SH OPTIONS")[1]
    assert ".BI \\-\\-engine\\-config" in options and "deprecated alias" in options


def test_a_sigterm_while_pid_1_is_starting_ends_it_at_once(tmp_path):
    """As a container's PID 1 (the cluster's agent, validator, fleet controller) a signal without a handler is
    ignored, so a SIGTERM before the command installs its own would make the kubelet wait out the grace period
    and SIGKILL it. Here the command blocks before any handler of its own (its kubeconfig is a FIFO nobody
    writes), in a PID namespace of its own where it is PID 1: the SIGTERM still ends it, with 143."""
    import os
    import signal
    import time

    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "compat_hook",
                          "cluster", "status", "--kubeconfig", str(fifo)], cwd=pathlib.Path(__file__).parents[1], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    try:
        child, deadline = None, time.monotonic() + 30
        while time.monotonic() < deadline:  # the command (PID 1 inside) blocked opening the FIFO
            kids = pathlib.Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            if kids and pathlib.Path(f"/proc/{kids[0]}/wchan").read_text() == "wait_for_partner":
                child = int(kids[0])
                break
            time.sleep(0.05)
        assert child is not None, "the command never blocked on its kubeconfig"
        assert pathlib.Path(f"/proc/{child}/status").read_text().count("NSpid:") == 1
        assert pathlib.Path(f"/proc/{child}/status").read_text().split("NSpid:")[1].split("\n")[0].split()[-1] == "1"
        os.kill(child, signal.SIGTERM)
        assert p.wait(10) == 128 + signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
