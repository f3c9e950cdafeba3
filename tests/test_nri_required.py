"""Fail-closed through containerd's NRI default validator (``install containerd --via nri --nri-require``).

containerd 2.2 and later can refuse a container while a plugin it requires is not connected
(``[plugins.'io.containerd.nri.v1.nri'.default_validator]``). Each release here is upstream's, built
from the Go module proxy into the test cache (tests/support/kubebuild.py ``containerd_release``):
v2.2.9, the first line with the validator, and v2.4.2, the newest 2.x. One containerd per release
serves the whole module (a module-scoped fixture), set up as tests/test_nri.py sets up Debian's 2.1:
CDI mode, the default runtime plain runc, driven through the CRI as the kubelet drives it, the probe
telling what the container really loads (the compat driver when compat-hook's hook ran).

The plugin is "missing" the way it goes missing on a node: its process is killed (SIGKILL), and
containerd does not start it again before its own restart. Each mode is installed and containerd
restarted, in the order a node would go through them: fail-open (no requirement), ``per-pod`` (only
pods annotated ``required-plugins.noderesource.dev/pod: "[compat-hook]"`` are refused), ``all``
(every pod but those annotated ``tolerate-missing-plugins.compat-hook.io/pod: "true"``).

The pods refused are created after the plugin died, as a pod scheduled while it is down is: the
kubelet's RunPodSandbox comes first, and at its end containerd drops the dead plugin from NRI's
list. The first CreateContainer after the death, with no NRI request in between, still counts the
dead plugin as present (containerd 2.2-2.4 add every plugin of the list to the validator's request
before asking it), so a container restarted in an existing pod at that moment gets through
(docs/engines.md says so).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess

import grpc
import pytest

from tests.support import engines, kubebuild
from tests.test_nri import GPU, IMAGE, REPO, NriNode, _cli, _enabled, _untouched, _v3_config

pytestmark = pytest.mark.containers

def as_node(bin_dir) -> list:
    """A command prefix that runs as on a node whose containerd is ``bin_dir``'s: compat-hook looks for
    containerd on a fixed PATH only, so that binary is bind-mounted at /usr/bin/containerd in a private
    mount namespace (as tests/test_nri.py's chart detection does)."""
    script = 'mount --bind "$1" /usr/bin/containerd && shift && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", f"{bin_dir}/containerd",
            "/usr/bin/env", f"PATH={bin_dir}:{engines.ENV['PATH']}"]


def cli(bin_dir, *argv) -> subprocess.CompletedProcess:
    """``compat-hook ARGV`` on a node whose containerd is ``bin_dir``'s (:func:`as_node`)."""
    return subprocess.run([*as_node(bin_dir), "/usr/bin/python3", "-m", "compat_hook", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)


REQUIRED = {"required-plugins.noderesource.dev/pod": "[compat-hook]"}
TOLERATE = {"tolerate-missing-plugins.compat-hook.io/pod": "true"}


@pytest.fixture(scope="module")
def libs() -> dict:
    from tests.support import debs
    from tests.test_nri import COMPAT, OLD

    return {v: debs.libcuda(v) for v in (OLD, COMPAT)}


@pytest.fixture(scope="module", params=kubebuild.CONTAINERD_RELEASES)
def node(request, tmp_path_factory, libs):
    bin_dir = kubebuild.containerd_release(request.param)
    work = tmp_path_factory.mktemp(f"nri-required-{request.param}")
    tar = engines.build_image(work / "image", libs)
    n = Node(work, tar, libs, bin_dir)
    n.release = request.param
    try:
        yield n
    finally:
        left = n.close()
        assert left == {"processes": [], "mounts": []} or not any(left.values()), left


class Node(NriNode):
    """tests/test_nri.py's node on an upstream containerd, with pods of their own annotations."""

    pod_count = 0

    def path_prefix(self) -> list:
        return as_node(self.bin_dir)

    def new_pod(self, annotations: dict) -> tuple:
        """``(sandbox id, config)`` of a new pod on plain runc carrying ``annotations``."""
        Node.pod_count += 1
        cfg = self.client.sandbox_config(f"pod{Node.pod_count}", str(self.pods))
        for k, v in annotations.items():
            cfg.annotations[k] = v
        pid = self.client.run_pod(cfg, "")
        self.extra_pods.append(pid)
        return pid, cfg

    @property
    def extra_pods(self) -> list:
        return self.__dict__.setdefault("_extra_pods", [])

    def refused(self, name: str, pod: tuple, tag: str, cdi=()) -> str:
        """CreateContainer's error for a container containerd must refuse (the test fails if it is created)."""
        pod_id, sandbox = pod
        cfg = self.client.container_config(name, f"{IMAGE}:{tag}", ["/bin/true"], cdi_devices=cdi)
        with pytest.raises(grpc.RpcError) as e:
            cid = self.client.create_container(pod_id, sandbox, cfg)
            self.client.remove_container(cid)
        return e.value.details()

    def kill_plugin(self) -> None:
        [pid] = self.wait_plugin(True)
        os.kill(pid, signal.SIGKILL)
        assert not self.wait_plugin(False), "the plugin is still there"

    def require(self, mode: str) -> str:
        """``install --nri-require MODE`` and containerd's restart (which starts the plugin again)."""
        out = self.install("--nri-require", mode)
        self.daemon.restart()
        assert self.wait_plugin(True), self.daemon.log.read_text()[-3000:]
        self.reconnect(f"gen-{mode}")
        return out

    @property
    def dropin(self):
        return self.daemon.main.parent / "conf.d" / "99-zz-compat-hook-nri.toml"

    def close(self) -> dict:
        for pid in self.extra_pods:
            self.client.remove_pod(pid)
        return super().close()


def _plain(out: dict, recs: list, what: str) -> None:
    """A container without a GPU started (the probe answered: no driver at all) and no hook ran."""
    assert out["cuda"] is None and recs == [], (what, out, recs)


def test_fail_open_without_a_requirement(node):
    """No requirement (the default): routed while the plugin runs; killed, the GPU container starts without
    compat-hook and loads the host's library, as on containerd 2.1."""
    out, recs = node.run("gpu", "compat", cdi=[GPU])
    _enabled(out, recs, f"{node.release}: plugin running")
    assert not node.dropin.exists()
    node.kill_plugin()
    out, recs = node.run("gpu-fail-open", "compat", cdi=[GPU])
    _untouched(out, recs, f"{node.release}: plugin killed, fail-open")


def test_per_pod_refuses_only_annotated_pods(node):
    out = node.require("per-pod")
    assert "required-plugins.noderesource.dev/pod" in out, out
    # The plugin running: the annotated GPU pod starts and loads what the decision says.
    out, recs = node.run("gpu-required", "compat", cdi=[GPU], pod=node.new_pod(REQUIRED))
    _enabled(out, recs, f"{node.release}: per-pod, plugin running")
    node.kill_plugin()
    # Pods that come while it is down (RunPodSandbox first, as the kubelet does: see the module's docstring).
    gpu_pod, plain_pod = node.new_pod(REQUIRED), node.new_pod({})
    err = node.refused("gpu-refused", gpu_pod, "compat", cdi=[GPU])
    assert 'required plugin "compat-hook" not present' in err, err
    # Every pod without the annotation is as before: a non-GPU container, and a GPU one (fail-open).
    out, recs = node.run("plain", "root", pod=plain_pod)
    _plain(out, recs, f"{node.release}: per-pod, non-GPU container")
    out, recs = node.run("gpu-unannotated", "compat", cdi=[GPU], pod=plain_pod)
    _untouched(out, recs, f"{node.release}: per-pod, GPU pod without the annotation")


def test_all_refuses_every_pod_but_the_tolerating_ones(node):
    out = node.require("all")
    assert "tolerate-missing-plugins.compat-hook.io/pod" in out, out
    text = node.dropin.read_text()
    assert 'required_plugins = ["compat-hook"]' in text and "--nri-require all" in text, text
    running = node.new_pod({})
    out, recs = node.run("gpu-all", "compat", cdi=[GPU], pod=running)
    _enabled(out, recs, f"{node.release}: all, plugin running")
    out, recs = node.run("plain-all", "root", pod=running)
    _plain(out, recs, f"{node.release}: all, non-GPU container, plugin running")
    node.kill_plugin()
    plain_pod, tolerating = node.new_pod({}), node.new_pod(TOLERATE)
    for name, tag, cdi in (("gpu-refused-all", "compat", [GPU]), ("plain-refused-all", "root", [])):
        err = node.refused(name, plain_pod, tag, cdi=cdi)
        assert 'required plugin "compat-hook" not present' in err, (name, err)
    # compat-hook's own pods (and static pods) carry the toleration: they start without the plugin.
    out, recs = node.run("agent", "root", pod=tolerating)
    _plain(out, recs, f"{node.release}: all, tolerating pod")


def test_uninstall_takes_the_requirement_out(node):
    main_before = node.daemon.main.read_text()
    p = cli(node.bin_dir, "uninstall", "containerd", "--via", "nri", "--engine-config", node.daemon.main)
    assert p.returncode == 0, p
    assert not node.dropin.exists() and not node.plugin_file.exists() and not node.conf_file.exists(), p.stdout
    # The test's main file already imports conf.d/*.toml: nothing was added to it, nothing taken out.
    assert node.daemon.main.read_text() == main_before
    validator = engines.config_dump(node.daemon.main, node.bin_dir)["plugins"]["io.containerd.nri.v1.nri"]["default_validator"]
    assert not validator.get("enable") and not validator.get("required_plugins"), validator
    node.daemon.restart()
    node.reconnect("gen-uninstalled")
    # Nothing routes, nothing refuses: the annotation alone requires nothing.
    out, recs = node.run("gpu-uninstalled", "compat", cdi=[GPU], pod=node.new_pod(REQUIRED))
    _untouched(out, recs, f"{node.release}: uninstalled")


def test_reject_oci_hook_adjustment_is_refused(tmp_path):
    """The validator's reject_oci_hook_adjustment would refuse the hook the plugin adds: one line, exit 1,
    nothing written, with and without --nri-require (and also when --nri-require would turn it on)."""
    bin_dir = kubebuild.containerd_release(kubebuild.CONTAINERD_RELEASES[0])
    plugins = tmp_path / "nri" / "plugins"
    for enable in ("true", "false"):
        main = _v3_config(tmp_path, f"    plugin_path = '{plugins}'\n"
                                    f"    [plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
                                    f"      enable = {enable}\n      reject_oci_hook_adjustment = true\n")
        for extra in (["--nri-require", "all"], ["--nri-require", "per-pod"], []):
            p = cli(bin_dir, "install", "containerd", "--via", "nri", "--engine-config", main, "--nri-plugin",
                    kubebuild.nri_plugin(), *extra)
            if enable == "false" and not extra:  # the validator stays off: the hook passes
                assert p.returncode == 0, p
                assert cli(bin_dir, "uninstall", "containerd", "--via", "nri", "--engine-config", main).returncode == 0
                continue
            assert p.returncode == 1 and p.stderr.count("\n") == 1, (enable, extra, p)
            assert "reject_oci_hook_adjustment = true" in p.stderr and "Traceback" not in p.stderr, p.stderr
            assert not plugins.exists() and not (tmp_path / "conf.d").exists(), (enable, extra)
        # The chart's detection (registration.path=auto) takes the RuntimeClass path where the hook is refused.
        code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.install.nri import detect_main; "
                "sys.exit(detect_main())")
        p = subprocess.run([*as_node(bin_dir), "/usr/bin/python3", "-I", "-c", code, str(REPO), str(main)],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        if enable == "true":
            assert p.returncode == 1 and "reject_oci_hook_adjustment" in p.stdout and p.stdout.count("\n") == 1, p
        else:
            assert (p.returncode, p.stdout) == (0, f"nri {plugins}/90-compat-hook\n"), p


def test_older_containerd_cannot_require(tmp_path):
    """Debian's containerd 2.1 has no default validator: --nri-require says so in one line, exit 1."""
    main = _v3_config(tmp_path, f"    plugin_path = '{tmp_path}/p'\n")
    p = cli(engines.containerd2(), "install", "containerd", "--via", "nri", "--engine-config", main,
            "--nri-plugin", kubebuild.nri_plugin(), "--nri-require", "per-pod")
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p
    assert "containerd 2.1 cannot require an NRI plugin" in p.stderr, p.stderr
    assert not (tmp_path / "p").exists() and not (tmp_path / "conf.d").exists()
    # Not --via nri: a usage error (exit 2).
    p = _cli("install", "containerd", "--engine-config", main, "--nri-require", "all", "--dry-run")
    assert p.returncode == 2 and "--nri-require is --via nri's" in p.stderr, p


def test_imports_added_and_taken_back(tmp_path):
    """A main file that imports nothing gets the conf.d glob with the requirement, and uninstall gives the
    file back byte for byte; `containerd config dump` (v2.2.9) reads the requirement in between."""
    bin_dir = kubebuild.containerd_release(kubebuild.CONTAINERD_RELEASES[0])
    plugins = tmp_path / "nri" / "plugins"
    main = _v3_config(tmp_path, f"    plugin_path = '{plugins}'\n    plugin_config_path = '{tmp_path}/nri/conf'\n")
    before = main.read_text()
    args = ["containerd", "--via", "nri", "--engine-config", main, "--nri-plugin", kubebuild.nri_plugin()]
    p = cli(bin_dir, "install", *args, "--nri-require", "all", "--dry-run")
    assert p.returncode == 0 and "required_plugins" in p.stdout and not plugins.exists(), p
    p = cli(bin_dir, "install", *args, "--nri-require", "all")
    assert p.returncode == 0, p
    assert f"{tmp_path}/conf.d/*.toml" in main.read_text()
    v = engines.config_dump(main, bin_dir)["plugins"]["io.containerd.nri.v1.nri"]["default_validator"]
    assert (v["enable"], v["required_plugins"], v["tolerate_missing_plugins_annotation"]) == \
        (True, ["compat-hook"], "tolerate-missing-plugins.compat-hook.io"), v
    assert "nothing changed" in cli(bin_dir, "install", *args, "--nri-require", "all").stdout
    # Back to fail-open: the drop-in and the imports entry go, the plugin stays.
    p = cli(bin_dir, "install", *args)
    assert p.returncode == 0 and main.read_text() == before and not (tmp_path / "conf.d").exists(), p
    assert (plugins / "90-compat-hook").exists()
    p = cli(bin_dir, "install", *args, "--nri-require", "per-pod")
    assert p.returncode == 0, p
    v = engines.config_dump(main, bin_dir)["plugins"]["io.containerd.nri.v1.nri"]["default_validator"]
    assert v["enable"] is True and not v.get("required_plugins"), v
    # A drop-in of someone else's that sorts later and turns the validator off: the install says so and
    # puts its drop-in back as it was (per-pod's).
    (tmp_path / "conf.d" / "zz-off.toml").write_text(
        "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n  enable = false\n")
    p = cli(bin_dir, "install", *args, "--nri-require", "all")
    assert p.returncode == 1 and "keeps the NRI default validator off" in p.stderr, p
    assert sorted(x.name for x in (tmp_path / "conf.d").iterdir()) == ["99-zz-compat-hook-nri.toml", "zz-off.toml"]
    assert "required_plugins" not in (tmp_path / "conf.d" / "99-zz-compat-hook-nri.toml").read_text()
    (tmp_path / "conf.d" / "zz-off.toml").unlink()
    p = cli(bin_dir, "uninstall", *args[:-2])
    assert p.returncode == 0 and main.read_text() == before, p
    assert sorted(x.name for x in tmp_path.iterdir()) == ["config.toml"], list(tmp_path.rglob("*"))


def test_containerd_2_4s_own_config_version(tmp_path):
    """containerd 2.4 writes config version 4 (`containerd config default`): read and required alike."""
    bin_dir = kubebuild.containerd_release(kubebuild.CONTAINERD_RELEASES[-1])
    main = tmp_path / "config.toml"
    main.write_text(f"version = 4\n\n[plugins.'io.containerd.nri.v1.nri']\n  plugin_path = '{tmp_path}/p'\n")
    p = cli(bin_dir, "install", "containerd", "--via", "nri", "--engine-config", main, "--nri-plugin",
            kubebuild.nri_plugin(), "--nri-require", "per-pod")
    assert p.returncode == 0 and (tmp_path / "p" / "90-compat-hook").is_file(), p
    dump = engines.config_dump(main, bin_dir)
    assert dump["version"] == 4 and dump["plugins"]["io.containerd.nri.v1.nri"]["default_validator"]["enable"], dump
    assert "version = 4" in (tmp_path / "conf.d" / "99-zz-compat-hook-nri.toml").read_text()
    p = cli(bin_dir, "uninstall", "containerd", "--via", "nri", "--engine-config", main)
    assert p.returncode == 0 and sorted(x.name for x in tmp_path.iterdir()) == ["config.toml"], (p, list(tmp_path.rglob("*")))


@pytest.mark.parametrize("via", ["wrapper", "base-spec"])
def test_containerd_2_4s_own_config_version_through_a_runtime_class(tmp_path, via):
    """The RuntimeClass paths read containerd 2.4's own default config (`containerd config default`: version 4)
    as NRI's path does: the runtime lands in the CRI runtime table containerd 2.4 reads (its `config dump`),
    and uninstall gives the main file back byte for byte."""
    bin_dir = kubebuild.containerd_release(kubebuild.CONTAINERD_RELEASES[-1])
    main = tmp_path / "config.toml"
    main.write_text(subprocess.run([bin_dir / "containerd", "config", "default"], capture_output=True, text=True,
                                   check=True, timeout=60).stdout)
    before = main.read_text()
    assert before.startswith("version = 4"), before[:80]
    args = ["containerd", "--via", via, "--engine-config", main, "--toolkit-config", "none", "--wrapper-path",
            tmp_path / "w", "--state-dir", tmp_path / "state"]
    p = cli(bin_dir, "install", *args)
    assert p.returncode == 0 and "not supported" not in p.stderr, p
    assert "version = 4" in (tmp_path / "conf.d" / "99-zz-compat-hook.toml").read_text()
    rt = engines.config_dump(main, bin_dir)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    ours = rt["cuda-compat"]
    if via == "wrapper":
        assert ours["options"]["BinaryName"] == str(tmp_path / "w"), ours
    else:  # the hook in a base spec the runtime names
        spec = json.loads(pathlib.Path(ours["base_runtime_spec"]).read_text())
        assert any("compat_hook" in json.dumps(h) for h in spec["hooks"]["createContainer"]), spec["hooks"]
    assert "runc" in rt  # the image's default runtime untouched
    p = cli(bin_dir, "uninstall", *args)
    assert p.returncode == 0 and main.read_text() == before, p
    assert not (tmp_path / "conf.d").exists() and not (tmp_path / "w").exists(), list(tmp_path.rglob("*"))
