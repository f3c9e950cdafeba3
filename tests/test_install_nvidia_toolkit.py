"""``compat-hook install|uninstall nvidia-toolkit`` on the toolkit's real config.toml, read back by its binaries.

The starting file is what the toolkit itself writes (``nvidia-ctk config
default``, v1.20.2 from :mod:`tests.support.toolkit`); after an install the
toolkit's own parser (``nvidia-ctk config --config-file``) must see the
wrapper first in ``runtimes``, and the last test runs a real container through
``nvidia-container-runtime`` -> compat-hook's wrapper -> runc before and
after the uninstall.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from compat_hook.install.files import backups_of
from compat_hook.install.wrapper import is_wrapper
from tests.support.trees import write_fake_host
from tests.support import debs, hookenv, rootfs, runtimes as rt
from tests.support.toolkit import create_start, noted_compat_lib, toolkit, write_cdi_spec  # noqa: F401

REPO = pathlib.Path(__file__).resolve().parent.parent
PYTHON = "/usr/bin/python3"


def cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", **(env or {})}
    return subprocess.run([PYTHON, "-m", "compat_hook", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=e)


def toolkit_view(tk, path: pathlib.Path) -> dict:
    """The configuration as the toolkit's own parser reads it."""
    import tomllib

    p = subprocess.run([str(tk.ctk), "--quiet", "config", "--config-file", str(path)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return tomllib.loads(p.stdout)


def default_config(tk) -> str:
    p = subprocess.run([str(tk.ctk), "config", "default"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "[nvidia-container-runtime]" in p.stdout, p.stderr
    return p.stdout


class Setup:
    """A toolkit config.toml plus the paths the registration names, all under ``tmp``."""

    def __init__(self, tmp: pathlib.Path, text: str, *, config: pathlib.Path | None = None):
        self.tmp = tmp
        self.config = config or tmp / "etc/nvidia-container-runtime/config.toml"
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(text)
        self.original = text
        self.hook_config = tmp / "compat-hook/config.yaml"
        self.wrapper = tmp / "libexec/compat-hook-runtime"
        self.state = tmp / "state"

    def args(self, *extra) -> list:
        return ["nvidia-toolkit", "--engine-config", str(self.config), "--hook-config", str(self.hook_config),
                "--wrapper-path", str(self.wrapper), "--state-dir", str(self.state), *extra]

    def install(self, *extra, env=None):
        return cli("install", *self.args(*extra), env=env)

    def uninstall(self, *extra, env=None):
        return cli("uninstall", *self.args(*extra), env=env)


@pytest.fixture
def setup(tmp_path, toolkit):
    return Setup(tmp_path, default_config(toolkit))


# --------------------------------------------------------------------------- the edit


def test_install_edits_only_runtimes_keeps_the_rest_and_backs_up(setup, toolkit):
    text = "# site settings, keep this comment\n" + setup.original.replace(
        'log-level = "info"', 'log-level = "info"   # loud on purpose')
    setup.config.write_text(text)
    p = setup.install()
    assert p.returncode == 0, p.stderr
    new = setup.config.read_text()
    changed = [(a, b) for a, b in zip(text.splitlines(), new.splitlines()) if a != b]
    assert len(text.splitlines()) == len(new.splitlines()) and len(changed) == 1, changed
    assert changed[0][0] == 'runtimes = ["runc", "crun"]'
    assert changed[0][1].startswith(f'runtimes = ["{setup.wrapper}", "runc", "crun"] # compat-hook-install: {{')
    [bak] = backups_of(str(setup.config))
    assert pathlib.Path(bak).read_text() == text
    view = toolkit_view(toolkit, setup.config)
    assert view["nvidia-container-runtime"]["runtimes"] == [str(setup.wrapper), "runc", "crun"]
    assert view["nvidia-container-runtime"]["log-level"] == "info"
    assert is_wrapper(setup.wrapper.read_text()) and os.access(setup.wrapper, os.X_OK)
    # the toolkit's first runtime (runc) is compat-hook's default: its config is not touched
    assert not setup.hook_config.exists()
    assert f"runtimes = [{setup.wrapper}, ...]; the wrapper runs runc" in p.stdout


def test_dry_run_writes_nothing(setup):
    before = hookenv.snapshot(setup.tmp)
    p = setup.install("--dry-run")
    assert p.returncode == 0, p.stderr
    assert f'+runtimes = ["{setup.wrapper}", "runc", "crun"]' in p.stdout
    assert "dry run" in p.stdout and "nothing written" in p.stdout
    assert hookenv.diff(before, hookenv.snapshot(setup.tmp)) == {}


def test_second_install_changes_nothing(setup):
    assert setup.install().returncode == 0
    before = hookenv.snapshot(setup.tmp)
    p = setup.install()
    assert p.returncode == 0, p.stderr
    assert "nvidia-toolkit: already registered; nothing changed" in p.stdout
    assert hookenv.diff(before, hookenv.snapshot(setup.tmp)) == {}


FORMS = {
    "multi-line": '[nvidia-container-runtime]\nmode = "cdi"\nruntimes = [\n  "runc",  # ours\n  "crun",\n]'
                  '   # why\n\n[nvidia-container-runtime.modes.cdi]\ndefault-kind = "nvidia.com/gpu"\n',
    "no-key": '[nvidia-container-runtime]\nmode = "cdi"\nlog-level = "info"\n\n[nvidia-ctk]\npath = "nvidia-ctk"\n',
    "implicit-table": 'disable-require = false\n\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["/etc/cdi"]\n',
    "no-table": '# nothing but top-level settings\ndisable-require = false\n',
    "dotted": 'nvidia-container-runtime.runtimes = ["runc"]\ndisable-require = false\n',
}


@pytest.mark.parametrize("form", ["default", *FORMS])
def test_uninstall_restores_the_file_exactly(tmp_path, toolkit, form):
    s = Setup(tmp_path, default_config(toolkit) if form == "default" else FORMS[form])
    p = s.install()
    assert p.returncode == 0, p.stderr
    runtimes = toolkit_view(toolkit, s.config)["nvidia-container-runtime"]["runtimes"]
    assert runtimes[0] == str(s.wrapper) and "runc" in runtimes
    p = s.uninstall()
    assert p.returncode == 0, p.stderr
    assert s.config.read_text() == s.original
    assert not s.wrapper.exists() and not s.wrapper.parent.exists()
    assert "not byte-for-byte" not in p.stdout
    again = s.uninstall()
    assert again.returncode == 0 and "names no compat-hook wrapper; nothing to remove" in again.stdout


def test_a_moved_wrapper_replaces_the_old_one(setup, toolkit):
    assert setup.install().returncode == 0
    old = setup.wrapper
    setup.wrapper = setup.tmp / "elsewhere/compat-hook-runtime"
    p = setup.install()
    assert p.returncode == 0, p.stderr
    assert toolkit_view(toolkit, setup.config)["nvidia-container-runtime"]["runtimes"] == [
        str(setup.wrapper), "runc", "crun"]
    assert not old.exists() and is_wrapper(setup.wrapper.read_text())
    assert setup.uninstall().returncode == 0
    assert setup.config.read_text() == setup.original and not setup.wrapper.exists()


def test_uninstall_after_someone_else_edited_removes_only_ours(setup, toolkit):
    assert setup.install().returncode == 0
    text = setup.config.read_text().replace('"runc", "crun"]', '"runc", "crun", "youki"]')
    setup.config.write_text(text.replace('mode = "auto"', 'mode = "cdi"'))
    p = setup.uninstall()
    assert p.returncode == 0, p.stderr
    view = toolkit_view(toolkit, setup.config)["nvidia-container-runtime"]
    assert view["runtimes"] == ["runc", "crun", "youki"] and view["mode"] == "cdi"
    assert "removed only its wrapper" in p.stdout and "not byte-for-byte" in p.stdout


# --------------------------------------------------------------------------- compat-hook's runtime:


def resolve(wrapper: pathlib.Path) -> str:
    """What the installed wrapper's own shell reader makes of compat-hook's config."""
    p = subprocess.run([str(wrapper), "--compat-hook-resolve"], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@pytest.mark.parametrize("existing", [None, "log_file: null\nnvml: 'off'"])
def test_the_toolkits_first_runtime_becomes_the_wrappers(tmp_path, toolkit, existing):
    text = default_config(toolkit).replace('runtimes = ["runc", "crun"]',
                                           'runtimes = ["docker-runc", "crun", "runc"]')
    s = Setup(tmp_path, text)
    if existing is not None:
        s.hook_config.parent.mkdir(parents=True)
        s.hook_config.write_text(existing)  # no trailing newline: the added line must still be its own
    p = s.install()
    assert p.returncode == 0, p.stderr
    # docker-runc is not installed, so the toolkit would have run crun: so does the wrapper now
    assert resolve(s.wrapper) == "runtime=crun"
    lines = s.hook_config.read_text().splitlines()
    assert lines[-1].startswith("runtime: crun  # added by compat-hook install nvidia-toolkit")
    assert lines[:-1] == ([] if existing is None else existing.splitlines())
    assert toolkit_view(toolkit, s.config)["nvidia-container-runtime"]["runtimes"] == [
        str(s.wrapper), "docker-runc", "crun", "runc"]
    before = hookenv.snapshot(tmp_path)
    again = s.install()
    assert again.returncode == 0 and "already registered; nothing changed" in again.stdout
    assert hookenv.diff(before, hookenv.snapshot(tmp_path)) == {}
    assert s.uninstall().returncode == 0
    assert s.config.read_text() == text
    if existing is None:
        assert not s.hook_config.exists()
    else:
        assert s.hook_config.read_text() == existing


def test_an_explicit_runtime_is_left_alone_with_a_warning(tmp_path, toolkit):
    s = Setup(tmp_path, default_config(toolkit).replace('runtimes = ["runc", "crun"]', 'runtimes = ["crun"]'))
    s.hook_config.parent.mkdir(parents=True)
    s.hook_config.write_text("runtime: runc\n")
    p = s.install()
    assert p.returncode == 0, p.stderr
    assert f"warning: {s.hook_config} says runtime: runc; the toolkit ran crun" in p.stdout
    assert s.hook_config.read_text() == "runtime: runc\n"
    assert resolve(s.wrapper) == "runtime=runc"


def test_a_wrapper_that_runs_the_toolkit_is_refused(setup):
    setup.hook_config.parent.mkdir(parents=True)
    setup.hook_config.write_text("runtime: nvidia-container-runtime\n")
    before = hookenv.snapshot(setup.tmp)
    p = setup.install()
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "would loop" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert hookenv.diff(before, hookenv.snapshot(setup.tmp)) == {}


# --------------------------------------------------------------------------- what it reports


@pytest.mark.parametrize("edit,level,words", [
    (('cuda-compat-mode = "ldconfig"', 'cuda-compat-mode = "mount"'), "warning",
     ['modes.legacy.cuda-compat-mode = "mount"', "bind-mounts", 'Set it to "ldconfig"']),
    (('cuda-compat-mode = "ldconfig"\n', '\n[features]\nallow-cuda-compat-libs-from-container = true\n'), "warning",
     ["allow-cuda-compat-libs-from-container = true", "mount", 'cuda-compat-mode = "ldconfig"']),
    (('mode = "auto"', 'mode = "legacy"'), "note", ['mode = "legacy"', "compat-hook install docker"]),
    (None, "note", ["containerd enable_cdi", "compat-hook install containerd"]),
], ids=["mount", "allow-container-compat", "legacy", "cdi-engines"])
def test_reports_what_it_cannot_override(tmp_path, toolkit, edit, level, words):
    text = default_config(toolkit)
    if edit:
        assert edit[0] in text
        text = text.replace(edit[0], edit[1])
    s = Setup(tmp_path, text)
    p = s.install()
    assert p.returncode == 0, p.stderr
    [line] = [ln for ln in p.stdout.splitlines() if all(w in ln for w in words)]
    assert line.startswith(f"{level}: ")


def test_the_gpu_operators_file_gets_the_lasting_way(tmp_path, toolkit):
    path = tmp_path / "usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
    s = Setup(tmp_path, default_config(toolkit), config=path)
    p = s.install()
    assert p.returncode == 0, p.stderr
    [line] = [ln for ln in p.stdout.splitlines() if "GPU Operator" in ln]
    assert line.startswith("warning: ") and "NVIDIA_CONTAINER_RUNTIME_RUNTIMES" in line
    assert "spec.toolkit.env" in line and str(tmp_path / "usr/local/nvidia/toolkit") in line


def test_the_toolkits_config_variable_is_honoured(tmp_path, toolkit):
    s = Setup(tmp_path, default_config(toolkit))
    args = [a for a in s.args() if a not in ("--engine-config", str(s.config))]
    p = cli("install", *args, env={"NVIDIA_CTK_CONFIG_FILE_PATH": str(s.config)})
    assert p.returncode == 0, p.stderr
    assert f"note: using $NVIDIA_CTK_CONFIG_FILE_PATH = {s.config}" in p.stdout
    assert toolkit_view(toolkit, s.config)["nvidia-container-runtime"]["runtimes"][0] == str(s.wrapper)


def test_nvidia_ctk_named_by_the_config_checks_the_result(tmp_path, toolkit):
    text = default_config(toolkit).replace('path = "nvidia-ctk"', f'path = "{toolkit.ctk}"')
    s = Setup(tmp_path, text)
    assert s.install().returncode == 0
    assert s.uninstall().returncode == 0 and s.config.read_text() == text
    # a nvidia-ctk that fails: the install is taken back, no wrapper left behind
    s = Setup(tmp_path / "b", default_config(toolkit).replace('path = "nvidia-ctk"', 'path = "/bin/false"'))
    p = s.install()
    assert p.returncode == 1 and "/bin/false config --config-file" in p.stderr
    assert "previous files are back in place" in p.stderr
    assert s.config.read_text() == s.original and not s.wrapper.exists()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("text,words", [
    ("[nvidia-container-runtime\nmode = 1\n", "not valid TOML"),
    ('[nvidia-container-runtime]\nruntimes = "runc"\n', "runtimes is not a list of strings"),
    ('nvidia-container-runtime = 3\n', "is not a table"),
    ('[nvidia-container-runtime]\nruntimes = ["docker-runc"]\n', "none of the toolkit's runtimes"),
])
def test_bad_config_one_line_nothing_written(tmp_path, text, words):
    s = Setup(tmp_path, text)
    before = hookenv.snapshot(tmp_path)
    p = s.install()
    assert p.returncode == 1, p
    assert p.stderr.count("\n") == 1 and words in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert hookenv.diff(before, hookenv.snapshot(tmp_path)) == {}


def test_missing_config_and_usage_errors(tmp_path):
    s = Setup(tmp_path, "")
    s.config.unlink()
    p = s.install()
    assert p.returncode == 1 and "does not exist: is the NVIDIA Container Toolkit installed?" in p.stderr
    p = s.uninstall()
    assert p.returncode == 0 and "does not exist; nothing to remove" in p.stdout
    s.config.write_text("")
    p = s.install("--set-as-default")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--set-as-default" in p.stderr
    assert cli("install", "nvidia-toolkit", "--via", "base-spec", "--engine-config", str(s.config)).returncode == 2


# --------------------------------------------------------------------------- a real container


@pytest.mark.containers
def test_real_toolkit_runs_compat_hook_after_install_and_not_after_uninstall(tmp_path, toolkit):
    """GeForce host 535, image compat 550: through the toolkit (mode cdi) the host library after the
    install (compat-hook decides skip), the compat one after the uninstall (the toolkit alone)."""
    host, lib = "535.261.03", debs.libcuda("535.261.03")
    compat = noted_compat_lib(debs.libcuda("550.163.01"), tmp_path / "noted")
    spec_dir = tmp_path / "cdi"
    write_cdi_spec(spec_dir, toolkit, lib, host)
    text = default_config(toolkit).replace('mode = "auto"', 'mode = "cdi"').replace(
        'spec-dirs = ["/etc/cdi", "/var/run/cdi"]', f'spec-dirs = ["{spec_dir}"]')
    s = Setup(tmp_path, text)
    host_root = write_fake_host(tmp_path / "host", gpus=["NVIDIA GeForce RTX 4090"], version_line=(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {host}  Release Build  (dvs-builder@U16)  Mon Sep 1 2025"))
    log = tmp_path / "compat-hook.log"
    hookenv.write_config(s.hook_config, host_root=host_root, log_file=log, nvml="off")
    p = s.install()
    assert p.returncode == 0, p.stderr

    def start(name: str) -> rt.Result:
        bundle = tmp_path / name
        root = rootfs.build_rootfs(bundle / "rootfs", compat_lib=compat)
        rt.make_bundle(bundle, root, env=["PATH=/usr/local/bin:/usr/bin:/bin",
                                          "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"])
        return create_start(str(toolkit.runtime), bundle, {"NVIDIA_CTK_CONFIG_FILE_PATH": str(s.config)},
                            runc=rt.RUNC)

    res = start("with")
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": "12020", "libcuda": f"/usr/lib/x86_64-linux-gnu/libcuda.so.{host}"}
    recs = [r for r in hookenv.read_log(log) if r.get("container_id") == res.container_id]
    assert [(r["event"], r["reason"]) for r in recs] == [("runtime", "device_unsupported"),
                                                          ("hook", "device_unsupported")], recs
    hooks = json.loads((tmp_path / "with/config.json").read_text())["hooks"]["createContainer"]
    assert [h["args"][1] for h in hooks[:3]] == ["create-symlinks", "enable-cuda-compat", "update-ldcache"]

    assert s.uninstall().returncode == 0
    res = start("without")
    assert res.rc == 0, str(res)
    assert res.probe == {"cuDriverGetVersion": "12040",
                         "libcuda": "/usr/local/cuda-12.4/compat/libcuda.so.550.163.01"}
    assert [r for r in hookenv.read_log(log) if r.get("container_id") == res.container_id] == []
    assert rt.mounts_under(tmp_path) == []


# --------------------------------------------------------------------------- from an engine install

@pytest.mark.parametrize("engine", ["docker", "containerd"])
def test_an_engine_install_registers_under_the_toolkit_it_finds_and_uninstall_undoes_both(tmp_path, toolkit,
                                                                                          engine):
    """``install docker|containerd`` also puts the same wrapper first in the toolkit's runtimes (the
    ``nvidia`` runtime then reaches compat-hook too); ``uninstall`` takes both out again."""
    s = Setup(tmp_path, default_config(toolkit))
    engine_cfg = tmp_path / ("daemon.json" if engine == "docker" else "containerd/config.toml")
    extra = ["--config-source", "file"] if engine == "containerd" else []
    base = [engine, "--engine-config", str(engine_cfg), "--hook-config", str(s.hook_config),
            "--wrapper-path", str(s.wrapper), "--state-dir", str(s.state), *extra]
    common = [*base, "--toolkit-config", str(s.config)]
    p = cli("install", *common)
    assert p.returncode == 0, p.stderr
    assert f"the NVIDIA Container Toolkit's {s.config} is on this node: registering there too" in p.stdout
    runtimes = toolkit_view(toolkit, s.config)["nvidia-container-runtime"]["runtimes"]
    assert runtimes[0] == str(s.wrapper) and os.access(s.wrapper, os.X_OK)
    registered = s.config.read_text()
    again = cli("install", *common)
    assert again.returncode == 0 and s.config.read_text() == registered
    p = cli("uninstall", *common)
    assert p.returncode == 0, p.stderr
    assert s.config.read_text() == s.original
    assert not s.wrapper.exists()
    # --toolkit-config none: the toolkit's file is not touched
    p = cli("install", *base, "--toolkit-config", "none")
    assert p.returncode == 0, p.stderr
    assert s.config.read_text() == s.original and "registering there too" not in p.stdout
