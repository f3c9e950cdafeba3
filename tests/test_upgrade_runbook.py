"""docs/upgrade.md: every ``compat-hook`` command of the runbook, run exactly as written.

The commands are taken from the runbook's ``sh`` blocks (so the doc cannot drift from what is
tested) and run in a private mount namespace that looks like a GPU node to them:

* a containerd of the test's own listens on the default socket ``/run/containerd/containerd.sock``
  (a tmpfs over ``/run/containerd``), with the images a node would have in namespace ``k8s.io``;
* the kernel driver is a file: ``/proc/driver/nvidia/version`` on a tmpfs over ``/proc/driver``,
  535 before the upgrade and 580 after it;
* the decision log is the default ``/var/log/compat-hook.log`` (a tmpfs over ``/var/log``),
  written by real hook runs before and after the "upgrade";
* ``clusterpolicy.yaml``, ``app.tar`` (oci-archive) and ``trainer.tar`` (docker-archive) are in
  the working directory, and ``compat-hook`` on PATH runs this checkout.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess

import pytest

from tests.conftest import Symlink, build_tree, elf
from tests.elfgen import NOTE_575
from tests.support.images import skopeo, umoci

pytestmark = pytest.mark.containers

REPO = pathlib.Path(__file__).resolve().parent.parent
RUNBOOK = REPO / "docs" / "upgrade.md"
TARGET = "580.65.06"
NOW = "535.183.01"


def runbook_commands() -> list:
    """The ``compat-hook ...`` lines of the runbook's sh blocks, in order."""
    text = RUNBOOK.read_text()
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        out += [ln.strip() for ln in block.splitlines() if ln.strip().startswith("compat-hook ")]
    return out


#: What each runbook command exits with: 0, except the rollback plan's gate (an image that needs 13.0).
EXITS = ["0"] * 9 + ["3"]


def test_the_runbook_has_the_commands_this_test_runs():
    cmds = runbook_commands()
    assert [c.split()[1] for c in cmds] == ["plan"] * 7 + ["report", "report", "plan"], cmds
    assert f"--manifest clusterpolicy.yaml" in cmds[0] and "--fail-on broken" in cmds[1]
    assert cmds[3].startswith("compat-hook plan docker-archive:node-images.tar")      # a Docker node
    assert cmds[4].startswith("compat-hook plan oci-archive:app-oci.tar")             # a Podman node
    assert cmds[5].startswith("compat-hook plan oci:images:pytorch")                  # a registry image
    assert "--driver 535.183.01 --from-driver 580.65.06" in cmds[9]                   # the rollback


def documented_outputs() -> dict:
    """``{command: output}`` for each sh block of one command followed by a ``text`` block."""
    text = RUNBOOK.read_text()
    return {cmd.strip(): out for cmd, out in
            re.findall(r"```sh\n(compat-hook [^\n]*)\n```\n\n```text\n(.*?)```", text, re.S)}


def _image(work: pathlib.Path, name: str, files: dict, env: list, cuda: str = "cuda-12.9") -> pathlib.Path:
    """An OCI layout ``work/name:v1`` built with umoci, two layers (the cross-layer cuda symlink)."""
    lay = work / name
    umoci("init", "--layout", lay)
    umoci("new", "--image", f"{lay}:v1")
    b = work / f"{name}-bundle"
    umoci("unpack", "--rootless", "--image", f"{lay}:v1", b)
    build_tree(b / "rootfs", files)
    umoci("repack", "--image", f"{lay}:v1", b)
    build_tree(b / "rootfs", {"usr/local/cuda": Symlink(cuda), "etc/os-release": "ID=test\n"})
    umoci("repack", "--image", f"{lay}:v1", b)
    umoci("config", "--image", f"{lay}:v1", *[a for e in env for a in ("--config.env", e)])
    return lay


SCRIPT = r"""
set -u
W={work}
mount -t tmpfs none /run/containerd 2>/dev/null || {{ mkdir -p /run/containerd && mount -t tmpfs none /run/containerd; }}
mount -t tmpfs none /proc/driver
mkdir -p /proc/driver/nvidia
driver() {{ printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Mon Jan  6 2025\n' "$1" > /proc/driver/nvidia/version; }}
driver {now}
mount -t tmpfs none /var/log
export PATH="$W/bin:/usr/sbin:/usr/bin:/sbin:/bin"
containerd --config "$W/containerd.toml" > "$W/containerd.log" 2>&1 &
CTRD=$!
for i in $(seq 100); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.1; done
ctr -n k8s.io images import --no-unpack --base-name localhost/app "$W/app.tar" >/dev/null
ctr -n k8s.io images import --no-unpack --base-name localhost/trainer "$W/trainer-oci.tar" >/dev/null
# decisions before the upgrade, by the hook with the node's default configuration
hook() {{ printf '{{"ociVersion":"1.0.2","id":"%s","status":"creating","pid":1,"bundle":"%s"}}' "$1" "$W/bundle" |
         compat-hook hook --stage createContainer --state-dir "$W/state"; }}
hook before-1; hook before-2
cd "$W"
n=0
upgraded=
while IFS= read -r cmd; do
  n=$((n+1))
  case "$cmd" in
    "compat-hook report"*) if [ -z "$upgraded" ]; then  # the roll happened: the node has the new driver
        driver {target}; hook after-1; upgraded=1; fi ;;
  esac
  echo "=== $n $cmd"
  sh -c "$cmd" > "$W/out-$n" 2> "$W/err-$n"
  echo "exit=$?"
done < "$W/commands"
kill $CTRD; wait $CTRD 2>/dev/null
echo "=== end"
"""


def test_every_runbook_command_runs_as_written(tmp_path):
    w = tmp_path
    (w / "bin").mkdir()
    (w / "bin" / "compat-hook").write_text(
        f"#!/usr/bin/python3\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from compat_hook.commands.cli import main\nsys.exit(main())\n")
    (w / "bin" / "compat-hook").chmod(0o755)
    compat = {"usr/local/cuda-12.9/compat/libcuda.so.575.57.08": elf(NOTE_575),
              "usr/local/cuda-12.9/compat/libcuda.so.1": Symlink("libcuda.so.575.57.08")}
    app = _image(w, "app", compat, ["CUDA_VERSION=12.9.0", "NVIDIA_VISIBLE_DEVICES=all"])
    # FROM python + PyTorch from pip: the CUDA runtime wheel, no CUDA_VERSION
    site = "usr/local/lib/python3.12/site-packages"
    trainer = _image(w, "trainer", {
        f"{site}/nvidia/cuda_runtime/lib/libcudart.so.12": elf(soname="libcudart.so.12"),
        f"{site}/nvidia_cuda_runtime_cu12-12.8.90.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: nvidia-cuda-runtime-cu12\nVersion: 12.8.90\n\n",
        f"{site}/torch/version.py": "__version__ = '2.7.1+cu128'\ncuda: Optional[str] = '12.8'\n"},
        ["PATH=/usr/local/bin:/usr/bin:/bin"])
    # a CUDA 13.0 toolkit's runtime, nothing declared
    cuda13 = _image(w, "cuda13", {"usr/local/cuda-13.0/lib64/libcudart.so.13.0.48": elf(soname="libcudart.so.13"),
                                  "usr/local/cuda-13.0/lib64/libcudart.so.13": Symlink("libcudart.so.13.0.48")},
                    ["PATH=/usr/bin:/bin"], cuda="cuda-13.0")
    skopeo("copy", f"oci:{app}:v1", f"oci-archive:{w / 'app.tar'}:v1")
    skopeo("copy", f"oci:{trainer}:v1", f"docker-archive:{w / 'trainer.tar'}:localhost/trainer:v1")
    skopeo("copy", f"oci:{trainer}:v1", f"oci-archive:{w / 'trainer-oci.tar'}:v1")
    # what docker save, podman save --format oci-archive and skopeo copy docker://... oci: would give
    skopeo("copy", f"oci:{trainer}:v1", f"docker-archive:{w / 'node-images.tar'}:localhost/trainer:v1")
    skopeo("copy", f"oci:{app}:v1", f"oci-archive:{w / 'app-oci.tar'}:localhost/app:v1")
    skopeo("copy", f"oci:{trainer}:v1", f"oci:{w / 'images'}:pytorch")
    skopeo("copy", f"oci:{cuda13}:v1", f"oci:{w / 'images'}:cuda13")
    (w / "clusterpolicy.yaml").write_text(
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata:\n  name: cluster-policy\n"
        f"spec:\n  driver:\n    version: \"{TARGET}\"\n")
    (w / "containerd.toml").write_text(
        f'version = 2\nroot = "{w}/ctrd-root"\nstate = "/run/containerd/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        '[grpc]\n  address = "/run/containerd/containerd.sock"\n')
    # a container of the app image, for the hook's log lines (the default config: host_root /)
    build_tree(w / "bundle" / "rootfs", dict(compat, **{"usr/local/cuda": Symlink("cuda-12.9")}))
    (w / "bundle" / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
        "annotations": {"io.kubernetes.cri.sandbox-name": "trainer-0",
                        "io.kubernetes.cri.sandbox-namespace": "ml",
                        "io.kubernetes.cri.image-name": "localhost/app:v1"}}))
    cmds = runbook_commands()
    (w / "commands").write_text("\n".join(cmds) + "\n")
    script = w / "node.sh"
    script.write_text(SCRIPT.format(work=shlex.quote(str(w)), now=NOW, target=TARGET))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/bash", str(script)],
                       capture_output=True, text=True, timeout=600,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C"})
    assert "=== end" in p.stdout, p.stdout + p.stderr + (w / "containerd.log").read_text()[-3000:]
    exits = re.findall(r"^exit=(\d+)$", p.stdout, re.M)
    assert exits == EXITS, (p.stdout, [(w / f"err-{i + 1}").read_text() for i in range(len(cmds))])
    out = [(w / f"out-{i + 1}").read_text() for i in range(len(cmds))]
    # the outputs the runbook shows are what the commands print
    shown = documented_outputs()
    assert len(shown) == 2, list(shown)
    for cmd, want in shown.items():
        assert out[cmds.index(cmd)] == want, (cmd, out[cmds.index(cmd)])

    # 1. the table for every image in the node's containerd, on the manifest's driver
    lines = out[0].splitlines()
    assert lines[0].split()[:6] == ["IMAGE", "NEEDS", "NOW", NOW, "AFTER", TARGET], out[0]
    rows = {ln.split()[0]: ln for ln in lines[1:3]}
    assert set(rows) == {"containerd:localhost/app:v1", "containerd:localhost/trainer:v1"}, out[0]
    assert rows["containerd:localhost/app:v1"].split()[1:4] == ["12.9", "compat", "12.9"]
    assert rows["containerd:localhost/app:v1"].split()[-1] == "env"
    assert rows["containerd:localhost/trainer:v1"].split()[1:4] == ["12.8", "host-minor", "12.2"]
    assert rows["containerd:localhost/trainer:v1"].split()[-1] == "wheel"
    assert lines[3] == "containerd: socket /run/containerd/containerd.sock (containerd default), namespace k8s.io"
    assert lines[-1].startswith("2 image(s): 0 broken after the upgrade")
    # 2. the gate: JSON, no image broken after the upgrade (exit 0 above)
    gate = json.loads((w / "plan.json").read_text())
    assert gate["driver"] == {"now": NOW, "after": TARGET, "target_from": "ClusterPolicy cluster-policy spec.driver.version"}
    by = {i["image"]: i for i in gate["images"]}
    assert by["containerd:localhost/app:v1"]["now"]["outcome"] == "compat"
    assert by["containerd:localhost/app:v1"]["after"]["outcome"] == "host"
    # the trainer image carries no compat driver: 12.2 for a 12.9 image is minor-version compat now
    assert by["containerd:localhost/trainer:v1"]["now"] == {"outcome": "host-minor", "reason": "no_candidate",
                                                           "cuda": "12.2", "error": 222}
    # 3. images not on the node yet, from their archives, for a node given on the command line
    arch = out[2].splitlines()
    assert arch[1].split()[:3] == ["oci-archive:app.tar", "12.9", "compat"], out[2]
    assert arch[2].split()[0] == "docker-archive:trainer.tar", out[2]
    # a Docker node's, a Podman node's and a registry's images, read the same way
    assert out[3].splitlines()[1].split()[:3] == ["docker-archive:node-images.tar", "12.8", "host-minor"], out[3]
    assert out[3].splitlines()[1].split()[-1] == "wheel"
    assert out[4].splitlines()[1].split()[:3] == ["oci-archive:app-oci.tar", "12.9", "compat"], out[4]
    assert out[5].splitlines()[1].split()[:3] == ["oci:images:pytorch", "12.8", "host-minor"], out[5]
    # 4. after: two periods (535 then 580), the starts by decision, the pod and image named
    assert "535.183.01" in out[7] and "580.65.06" in out[7], out[7]
    rep = json.loads((w / "report.json").read_text())
    periods = rep["periods"]
    assert [p["driver"] for p in periods] == [NOW, TARGET], rep
    assert periods[0]["decisions"][0]["count"] == 2 and periods[0]["decisions"][0]["decision"] == "enable"
    assert periods[1]["decisions"][0]["decision"] == "skip"
    assert "trainer-0" in json.dumps(periods[0]) and "localhost/app:v1" in json.dumps(periods[0])
