"""``compat-hook install|uninstall containerd`` on config files (no daemon needed).

Every result is checked with the real ``containerd --config MAIN config dump``
(Debian's containerd 1.6): the merged config after install is the merged
config before plus the runtime, and after uninstall it is exactly the one
before. Version 3 files (containerd 2.x) are checked as TOML.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess

import pytest
import tomlkit

from compat_hook.install import containerd as ic
from compat_hook.core.registration import hook_entry
from compat_hook.install.wrapper import render_wrapper
from tests.conftest import snapshot_tree
from tests.support import engines
from tests.support.toolkit import toolkit  # noqa: F401  (the NVIDIA toolkit's binaries, session fixture)

PY = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parents[1]
CRI = "io.containerd.grpc.v1.cri"
CRI3 = "io.containerd.cri.v1.runtime"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}

MAIN_V2 = """\
# The node's containerd config (kept by hand: these comments must survive).
version = 2
root = "@D@/root"
state = "@D@/state"
oom_score = -999   # keep me

[grpc]
  address = "@D@/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/bb:pause"
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = "@D@/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      privileged_without_host_devices = false
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "@D@/runc"
        SystemdCgroup = false
        NoNewKeyring = true
"""


def main_v2(d: pathlib.Path, text: str = MAIN_V2) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "config.toml"
    p.write_text(text.replace("@D@", str(d)))
    return p


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "compat_hook", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          env=ENV)


def install(main, *extra, verb="install"):
    d = pathlib.Path(main).parent
    return cli(verb, "containerd", "--engine-config", main, "--wrapper-path", d / "libexec" / "compat-hook-runtime",
               "--hook-config", d / "compat-hook.yaml", *extra)


def dump(main) -> dict:
    p = subprocess.run(["containerd", "--config", str(main), "config", "dump"], capture_output=True, text=True,
                       env=ENV)
    assert p.returncode == 0, p.stderr
    tree = tomlkit.parse(p.stdout).unwrap()
    tree["imports"] = sorted(tree["imports"])  # containerd 1.6 lists them in no fixed order
    return tree


def without(tree: dict, *paths) -> dict:
    t = copy.deepcopy(tree)
    for path in paths:
        node = t
        for k in path[:-1]:
            node = node[k]
        node.pop(path[-1], None)
    return t


def runtimes(tree: dict, plugin: str = CRI) -> dict:
    return tree["plugins"][plugin]["containerd"]["runtimes"]


def ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    return p.stdout


def fails(p: subprocess.CompletedProcess, *needles) -> None:
    assert p.returncode in (1, 2), (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compat-hook: ") and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in lines[0], p.stderr


@pytest.mark.slow  # several `containerd config dump` runs
def test_install_v2_from_config_dump(tmp_path):
    main = main_v2(tmp_path)
    original_text = main.read_text()
    before = dump(main)
    out = ok(install(main))
    record = tmp_path / ("config.toml" + ic.RECORD_SUFFIX)
    wrapper = tmp_path / "libexec" / "compat-hook-runtime"
    assert f"wrote {main} (backup: " in out and f"wrote {record}\n" in out and f"wrote {wrapper}\n" in out
    assert "restart containerd" in out and "conf.d" not in out  # containerd 1.x: no drop-in, config.toml itself

    # The main file: everything it had (comments included) byte for byte, then the runtime's tables.
    new_main = main.read_text()
    assert new_main.startswith(original_text) and "[plugins" in new_main[len(original_text):]
    [bak] = [p for p in tmp_path.iterdir() if p.name.startswith("config.toml.compat-hook-2")]
    assert bak.read_text() == original_text and bak.name.endswith(".bak")
    assert not (tmp_path / "conf.d").exists()

    # The wrapper, rendered for this config path.
    assert wrapper.read_text() == render_wrapper(str(tmp_path / "compat-hook.yaml"))
    assert oct(wrapper.stat().st_mode & 0o7777) == "0o755"

    # The runtime: a copy of runc's (its options too) whose BinaryName is the wrapper.
    doc = tomlkit.parse(new_main).unwrap()
    rt = runtimes(doc)["cuda-compat"]
    runc = runtimes(before)["runc"]
    assert rt == dict(runc, options=dict(runc["options"], BinaryName=str(wrapper)))

    # containerd's merged view: what it was, plus the runtime.
    after = dump(main)
    assert runtimes(after)["cuda-compat"] == rt
    assert without(after, ("plugins", CRI, "containerd", "runtimes", "cuda-compat")) == before

    # A second run changes nothing, byte for byte.
    snap = snapshot_tree(tmp_path)
    assert ok(install(main)).strip() == "no changes"
    assert snapshot_tree(tmp_path) == snap

    # Uninstall: the main file as it was, the drop-in and the wrapper gone.
    out = ok(install(main, verb="uninstall"))
    assert f"removed {record}" in out and f"removed {wrapper}" in out
    assert main.read_text() == original_text
    assert not record.exists() and not wrapper.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # no backup, no dir left
    assert dump(main) == before
    assert ok(install(main, verb="uninstall")).strip().startswith("no changes")


@pytest.mark.slow  # several `containerd config dump` runs
def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path):
    main = main_v2(tmp_path)
    snap = snapshot_tree(tmp_path)
    out = ok(install(main, "--dry-run"))
    assert snapshot_tree(tmp_path) == snap
    assert f"--- a{main}\n+++ b{main}\n" in out
    assert f"--- /dev/null\n+++ b{tmp_path}/config.toml{ic.RECORD_SUFFIX}\n" in out
    assert '+[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cuda-compat.options]' in out
    assert "nothing written" in out
    # After a real install, a dry run of the same is "no changes"; of another setting, a diff.
    ok(install(main))
    assert ok(install(main, "--dry-run")).strip() == "no changes"
    out = ok(install(main, "--dry-run", "--set-as-default"))
    assert '-    default_runtime_name = "runc"\n+    default_runtime_name = "cuda-compat"' in out


@pytest.mark.slow  # several `containerd config dump` runs
def test_set_as_default_and_runtime_name(tmp_path):
    main = main_v2(tmp_path)
    before = dump(main)
    ok(install(main, "--set-as-default", "--runtime-name", "gpu_compat-2"))
    after = dump(main)
    assert after["plugins"][CRI]["containerd"]["default_runtime_name"] == "gpu_compat-2"
    assert "gpu_compat-2" in runtimes(after) and "runc" in runtimes(after)
    # Changing the setting backs up the main file.
    ok(install(main, "--runtime-name", "gpu_compat-2"))
    assert dump(main)["plugins"][CRI]["containerd"]["default_runtime_name"] == "runc"
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("config.toml.compat-hook-2")]) == 2
    ok(install(main, verb="uninstall"))
    assert dump(main) == before
    for bad in ("a b", "x.y", ""):
        fails(install(main, "--runtime-name", bad), "--runtime-name")


@pytest.mark.slow  # several `containerd config dump` runs
def test_file_source_and_existing_nvidia_dropin(tmp_path):
    """NCT's layout: imports already cover conf.d, and 99-nvidia.toml carries the full CRI section."""
    text = MAIN_V2.replace('oom_score = -999   # keep me\n',
                           'oom_score = -999   # keep me\nimports = ["@D@/conf.d/*.toml"]\n')
    main = main_v2(tmp_path, text)
    (tmp_path / "conf.d").mkdir()
    nv = tomlkit.parse(main.read_text()).unwrap()
    nvrt = copy.deepcopy(nv["plugins"][CRI]["containerd"]["runtimes"]["runc"])
    nvrt["options"]["BinaryName"] = "/usr/bin/nvidia-container-runtime"
    nv["plugins"][CRI]["containerd"]["runtimes"]["nvidia"] = nvrt
    (tmp_path / "conf.d" / "99-nvidia.toml").write_text(tomlkit.dumps({"version": 2, "plugins": nv["plugins"]}))
    original_text = main.read_text()
    before = dump(main)
    assert "nvidia" in runtimes(before)
    for source in ("file", "command"):
        out = ok(install(main, "--config-source", source))
        assert f"wrote {main}" not in out  # the existing glob covers the drop-in
        assert main.read_text() == original_text
        after = dump(main)
        assert set(runtimes(after)) == {"runc", "nvidia", "cuda-compat"}
        assert without(after, ("imports",), ("plugins", CRI, "containerd", "runtimes", "cuda-compat")) == \
            without(before, ("imports",))
        ok(install(main, verb="uninstall"))
        assert dump(main) == before and main.read_text() == original_text


def test_file_source_keeps_the_main_cri_section(tmp_path):
    main = main_v2(tmp_path)
    before = dump(main)
    mine = tomlkit.parse(main.read_text()).unwrap()["plugins"][CRI]
    ok(install(main, "--config-source", "file"))
    doc = tomlkit.parse(main.read_text()).unwrap()
    want = copy.deepcopy(mine)
    rt = copy.deepcopy(mine["containerd"]["runtimes"]["runc"])
    rt["options"]["BinaryName"] = str(tmp_path / "libexec" / "compat-hook-runtime")
    want["containerd"]["runtimes"]["cuda-compat"] = rt
    assert doc["plugins"][CRI] == want
    after = dump(main)
    assert without(after, ("imports",), ("plugins", CRI, "containerd", "runtimes", "cuda-compat")) == \
        without(before, ("imports",))


@pytest.mark.slow  # several `containerd config dump` runs
def test_a_main_file_without_cri_section_and_a_missing_main(tmp_path):
    # No CRI section at all: the drop-in must keep the default runc runtime working.
    main = main_v2(tmp_path / "a", 'version = 2\nroot = "/var/lib/x"\n')
    before = dump(main)
    ok(install(main))
    after = dump(main)
    assert set(runtimes(after)) == {"runc", "cuda-compat"}
    assert without(after, ("imports",), ("plugins", CRI, "containerd", "runtimes", "cuda-compat")) == \
        without(before, ("imports",))
    ok(install(main, verb="uninstall"))
    assert dump(main) == before
    # From the files alone (no containerd to ask), runc is written out as containerd's default.
    ok(install(main, "--config-source", "file"))
    rts = runtimes(dump(main))
    assert set(rts) == {"runc", "cuda-compat"} and rts["runc"]["runtime_type"] == "io.containerd.runc.v2"
    ok(install(main, verb="uninstall"))
    assert dump(main) == before

    # A missing main file is created (version 2 for containerd 1.x) and removed again.
    main = tmp_path / "b" / "config.toml"
    (tmp_path / "b").mkdir()
    ok(install(main))
    written = tomlkit.parse(main.read_text()).unwrap()
    assert written["version"] == 2 and "cuda-compat" in runtimes(written) and "runc" in runtimes(written)
    assert "cuda-compat" in runtimes(dump(main))
    ok(install(main, verb="uninstall"))
    assert not main.exists()

    # An empty main file gets version + imports, and is empty again after uninstall.
    main = tmp_path / "c" / "config.toml"
    (tmp_path / "c").mkdir()
    main.write_text("# only a comment\n")
    ok(install(main))
    ok(install(main, verb="uninstall"))
    assert main.read_text() == "# only a comment\n"


def test_symlinked_main_config_is_written_through(tmp_path):
    real = main_v2(tmp_path / "real")
    (tmp_path / "etc").mkdir()
    link = tmp_path / "etc" / "config.toml"
    os.symlink(real, link)
    ok(install(link))
    assert link.is_symlink() and "runtimes.cuda-compat" in real.read_text()
    assert not (tmp_path / "etc" / "conf.d").exists()
    ok(install(link, verb="uninstall"))
    assert link.is_symlink() and real.read_text() == MAIN_V2.replace("@D@", str(tmp_path / "real"))


def test_via_base_spec(tmp_path):
    main = main_v2(tmp_path)
    before = dump(main)
    ok(install(main, "--via", "base-spec"))
    spec_path = tmp_path / ic.BASE_SPEC_NAME
    spec = json.loads(spec_path.read_text())
    base = json.loads(subprocess.run(["ctr", "oci", "spec"], capture_output=True, text=True, check=True).stdout)
    assert spec == dict(base, hooks={"createContainer": [
        hook_entry(stage="createContainer", config=str(tmp_path / "compat-hook.yaml"),
                   log_file="/var/log/compat-hook.log")]})
    rt = runtimes(dump(main))["cuda-compat"]
    assert rt["base_runtime_spec"] == str(spec_path)
    assert rt["options"] == runtimes(before)["runc"]["options"]  # runc itself, no wrapper
    assert not (tmp_path / "libexec").exists()
    ok(install(main, verb="uninstall"))
    assert not spec_path.exists() and dump(main) == before


def test_a_later_dropin_that_hides_ours_rolls_back(tmp_path):
    # An imported drop-in carrying the whole CRI section hides config.toml's (1.x), so the runtime goes to
    # compat-hook's own drop-in, 99-zz-compat-hook.toml; a drop-in sorting after that one hides it again.
    main = main_v2(tmp_path, MAIN_V2.replace("oom_score = -999   # keep me\n",
                                             'oom_score = -999   # keep me\nimports = ["@D@/conf.d/*.toml"]\n'))
    (tmp_path / "conf.d").mkdir()
    later = tmp_path / "conf.d" / "zzz-mine.toml"
    later.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "x:y"\n')
    original_text = main.read_text()
    p = install(main)
    fails(p, "shows no runtime 'cuda-compat'", "zzz-mine.toml", "previous files are back")
    assert main.read_text() == original_text
    assert sorted(x.name for x in (tmp_path / "conf.d").iterdir()) == ["zzz-mine.toml"]
    assert not (tmp_path / "libexec" / "compat-hook-runtime").exists()


def test_refused_configs(tmp_path):
    main = main_v2(tmp_path / "v1", '[plugins.cri]\n  sandbox_image = "x"\n')
    fails(install(main), "version 1", "containerd config migrate")
    main = main_v2(tmp_path / "bad", "version = 2\n[grpc\n")
    fails(install(main), "not valid TOML")
    main = main_v2(tmp_path / "v5", "version = 5\n")  # 4 is containerd 2.4's (tests/test_nri_required.py)
    fails(install(main), "version 5 is not supported (2, 3 or 4)")
    main = main_v2(tmp_path / "imp", 'version = 2\nimports = "x"\n')
    fails(install(main), "'imports' is not a list")
    main = main_v2(tmp_path / "v3", "version = 3\n")
    fails(install(main, "--config-source", "command"), "does not use config version 3")


V3 = """\
version = 3
# containerd 2.x
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
"""


def test_install_v3(tmp_path):
    main = main_v2(tmp_path, V3)
    original_text = main.read_text()
    ok(install(main, "--set-as-default"))
    doc = tomlkit.parse((tmp_path / "conf.d" / ic.DROPIN_NAME).read_text()).unwrap()
    wrapper = str(tmp_path / "libexec" / "compat-hook-runtime")
    # 2.x merges drop-ins deeply: the drop-in holds the runtime (and the default) only.
    assert doc == {"version": 3, "plugins": {CRI3: {"containerd": {
        "default_runtime_name": "cuda-compat",
        "runtimes": {"cuda-compat": {"runtime_type": "io.containerd.runc.v2",
                                     "options": {"SystemdCgroup": True, "BinaryName": wrapper}}}}}}}
    assert tomlkit.parse(main.read_text()).unwrap()["imports"] == [f"{tmp_path}/conf.d/*.toml"]
    assert "[plugins.'io.containerd.cri.v1.images']" in main.read_text()
    snap = snapshot_tree(tmp_path)
    assert ok(install(main, "--set-as-default")).strip() == "no changes"
    assert snapshot_tree(tmp_path) == snap
    ok(install(main, verb="uninstall"))
    assert main.read_text() == original_text


# --------------------------------------------------------------------------- edits made after the install


def _ctk_configure(tk, main: pathlib.Path, *extra) -> None:
    """``nvidia-ctk runtime configure --runtime=containerd``, as the toolkit's installer runs it on a node."""
    p = subprocess.run([str(tk.ctk), "runtime", "configure", "--runtime=containerd", "--config", str(main), *extra],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.mark.slow  # several `containerd config dump` runs
@pytest.mark.parametrize("ctk_mode", ["drop-in", "config.toml"])
def test_toolkit_edits_after_install_stay_visible_on_1x(tmp_path, toolkit, ctk_mode):  # noqa: F811
    """containerd 1.6: what nvidia-ctk (and an admin) write into config.toml after the install is what
    ``containerd config dump`` shows, next to compat-hook's runtime; uninstall takes out only ours."""
    main = main_v2(tmp_path, MAIN_V2.replace("oom_score = -999   # keep me\n",
                                             'oom_score = -999   # keep me\nimports = ["@D@/conf.d/*.toml"]\n'))
    wrapper = str(tmp_path / "libexec" / "compat-hook-runtime")
    ok(install(main))
    # An admin edit of the CRI section after the install.
    main.write_text(main.read_text().replace("  enable_cdi = false\n", "  enable_cdi = false\n"
                                             "  restrict_oom_score_adj = true\n"))
    if ctk_mode == "drop-in":  # the toolkit's own configure (v1.18+: a drop-in copied from config.toml)
        _ctk_configure(toolkit, main, "--drop-in-config", str(tmp_path / "conf.d" / "99-nvidia.toml"))
    else:  # what a toolkit before 1.18 writes: runtimes.nvidia in config.toml itself
        doc = tomlkit.parse(main.read_text())
        nv = copy.deepcopy(doc["plugins"][CRI]["containerd"]["runtimes"]["runc"].unwrap())
        nv["options"]["BinaryName"] = "/usr/bin/nvidia-container-runtime"
        doc["plugins"][CRI]["containerd"]["runtimes"]["nvidia"] = nv
        main.write_text(tomlkit.dumps(doc))
    after = dump(main)
    rts = runtimes(after)
    assert {"runc", "nvidia", "cuda-compat"} <= set(rts), sorted(rts)
    assert rts["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert rts["cuda-compat"]["options"]["BinaryName"] == wrapper
    assert after["plugins"][CRI]["restrict_oom_score_adj"] is True
    # A re-install (the DaemonSet runs one when containerd's files change) keeps all of it.
    ok(install(main))
    again = dump(main)
    assert {"runc", "nvidia", "cuda-compat"} <= set(runtimes(again))
    assert again["plugins"][CRI]["restrict_oom_score_adj"] is True
    ok(install(main, verb="uninstall"))
    gone = dump(main)
    assert set(runtimes(gone)) == {"runc", "nvidia"}, sorted(runtimes(gone))
    assert gone["plugins"][CRI]["restrict_oom_score_adj"] is True


@pytest.mark.slow
def test_set_as_default_over_the_nvidia_runtime_chains_to_it(tmp_path, toolkit):  # noqa: F811
    """``default_runtime_name = "nvidia"``: --set-as-default makes the wrapper exec the NVIDIA runtime's binary
    (``runtime:`` in compat-hook's config), and uninstall gives ``nvidia`` back and takes the line out."""
    text = MAIN_V2.replace('default_runtime_name = "runc"', 'default_runtime_name = "nvidia"') + (
        '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '      runtime_type = "io.containerd.runc.v2"\n'
        '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        f'        BinaryName = "{toolkit.runtime}"\n')
    main = main_v2(tmp_path, text)
    original = main.read_text()
    out = ok(install(main, "--set-as-default", "--toolkit-config", "none"))
    assert "chains to the NVIDIA runtime" in out, out
    assert dump(main)["plugins"][CRI]["containerd"]["default_runtime_name"] == "cuda-compat"
    cfg = tmp_path / "compat-hook.yaml"
    assert f"runtime: {toolkit.runtime}" in cfg.read_text()
    p = subprocess.run([str(tmp_path / "libexec" / "compat-hook-runtime"), "--compat-hook-resolve"],
                       capture_output=True, text=True, env=ENV)
    assert p.stdout.strip() == f"runtime={toolkit.runtime}", p
    ok(install(main, verb="uninstall"))
    assert main.read_text() == original and not cfg.exists()
    # Its binary missing: said plainly, the wrapper runs runc.
    main.write_text(original.replace(str(toolkit.runtime), "/nonexistent/nvidia-container-runtime"))
    out = ok(install(main, "--set-as-default", "--toolkit-config", "none"))
    assert "is not on this node" in out and "plain runc" in out and not cfg.exists(), out
    ok(install(main, verb="uninstall"))


@pytest.mark.slow
def test_toolkit_edits_after_install_stay_visible_on_2x(tmp_path, toolkit):  # noqa: F811
    """containerd 2.x (config version 3) merges drop-ins deeply: its drop-in holds only the runtime."""
    bin_dir = engines.containerd2()
    main = main_v2(tmp_path, V3)
    ok(install(main))
    images = "[plugins.'io.containerd.cri.v1.images']\n"
    main.write_text(main.read_text().replace(images, images + "  max_concurrent_downloads = 7\n"))
    _ctk_configure(toolkit, main, "--drop-in-config", str(tmp_path / "conf.d" / "99-nvidia.toml"))
    p = subprocess.run([str(bin_dir / "containerd"), "--config", str(main), "config", "dump"], capture_output=True,
                       text=True, env=ENV, timeout=60)
    assert p.returncode == 0, p.stderr
    tree = tomlkit.parse(p.stdout).unwrap()
    assert {"runc", "nvidia", "cuda-compat"} <= set(runtimes(tree, CRI3)), sorted(runtimes(tree, CRI3))
    assert tree["plugins"]["io.containerd.cri.v1.images"]["max_concurrent_downloads"] == 7
    ok(install(main, verb="uninstall"))


def test_runtimeclass_manifest():
    import yaml

    [doc] = [d for d in yaml.safe_load_all((REPO / "packaging" / "kubernetes" / "compat-hook.yaml").read_text())
             if d and d["kind"] == "RuntimeClass"]
    assert doc["apiVersion"] == "node.k8s.io/v1" and doc["kind"] == "RuntimeClass"
    assert doc["handler"] == "cuda-compat" == doc["metadata"]["name"]


def test_files_helpers(tmp_path):
    from compat_hook.install import files

    p = tmp_path / "d" / "f.conf"
    assert files.write_atomic(str(p), "a\n") is None and p.read_text() == "a\n"
    assert oct(p.stat().st_mode & 0o777) == "0o644"
    p.chmod(0o600)
    assert files.write_atomic(str(p), "a\n") is None  # same bytes: nothing written, no backup
    bak = files.write_atomic(str(p), "b\n")
    assert pathlib.Path(bak).read_text() == "a\n" and bak.endswith(".bak") and p.read_text() == "b\n"
    assert oct(p.stat().st_mode & 0o777) == "0o600"  # mode kept
    assert files.diff("a\n", "b", "/x") == "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n\\ No newline at end of file\n"
    assert files.diff(None, "n\n", "/x").startswith("--- /dev/null\n+++ b/x\n")
    assert files.diff("same", "same", "/x") == ""
    c = files.Change(str(p), None)
    assert c.changed and c.old == "b\n"
    import io

    buf = io.StringIO()
    assert files.apply([c], dry_run=True, out=buf) and p.exists() and "-b" in buf.getvalue()
    assert files.apply([c], out=buf) and not p.exists()
    buf = io.StringIO()
    assert not files.apply([files.Change(str(p), None)], out=buf) and buf.getvalue() == "no changes\n"
    assert sorted(x.name for x in p.parent.iterdir() if not x.name.endswith(".bak")) == []
