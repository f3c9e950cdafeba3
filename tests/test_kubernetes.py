"""packaging/kubernetes and packaging/oci-image: schemas, the image, and the installer on a fake node.

* Every manifest validates against the Kubernetes JSON schemas (kubernetes-validate,
  strict: unknown fields are errors) for the oldest and newest bundled versions;
  the package is installed once into a venv under .cache/venv-k8s (it bundles the
  schemas, so validation itself needs no network).
* build-image.sh builds a valid OCI layout (umoci) from the .deb.
* The image runs under Podman with a fake node root at /host: the node's python3
  and containerd come from this machine's /usr, bind-mounted read-only into the
  fake root inside a private mount namespace, so `compat-hook install containerd`
  runs chrooted exactly as on a node, against the fake node's
  /etc/containerd/config.toml; then the restart gate, idempotency and uninstall.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import tomllib

import pytest
import yaml

from tests.support.cache import cache_dir, locked
from tests.support.steps import sections as _sections
from tests.support.engines import RUN_FLAGS, start_podman

REPO = pathlib.Path(__file__).resolve().parent.parent
K8S = REPO / "packaging" / "kubernetes"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
VERSION = __import__("compat_hook").__version__
K8S_VERSIONS = ("1.25.0", "1.37.0")
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml"))


def _run(argv, *, timeout=300, check=True, **kw):
    p = subprocess.run([str(a) for a in argv], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout, env=kw.pop("env", ENV), **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def _docs(path: pathlib.Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.fixture(scope="module")
def validator() -> pathlib.Path:
    """``kubernetes-validate`` in .cache/venv-k8s (created with pip on first use)."""
    venv = cache_dir() / "venv-k8s"
    exe = venv / "bin" / "kubernetes-validate"
    with locked("venv-k8s"):
        if not exe.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv])
            _run([venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", "kubernetes-validate"],
                 timeout=600)
    return exe


# --------------------------------------------------------------------------- manifests


@pytest.mark.slow
def test_every_manifest_validates_against_the_schemas(validator):
    assert {p.name for p in MANIFESTS} >= {"daemonset.yaml", "runtimeclass.yaml", "cuda-pod.yaml"}
    for version in K8S_VERSIONS:
        p = _run([validator, "--strict", "-k", version, *MANIFESTS], check=False)
        assert p.returncode == 0, p.stdout + p.stderr
        passed = [ln for ln in p.stdout.splitlines() if " passed for resource " in ln]
        assert len(passed) == sum(len(_docs(m)) for m in MANIFESTS), p.stdout


@pytest.mark.slow
def test_validator_rejects_a_bad_manifest(validator, tmp_path):
    """The check has teeth: an unknown field and a missing required one both fail."""
    ds = _docs(K8S / "daemonset.yaml")[1]
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(ds))
    assert _run([validator, "--strict", bad], check=False).returncode != 0
    del ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"]
    del ds["spec"]["selector"]
    bad.write_text(yaml.safe_dump(ds))
    assert _run([validator, "--strict", bad], check=False).returncode != 0


def test_daemonset_shape():
    ns, ds = _docs(K8S / "daemonset.yaml")
    assert ns["kind"] == "Namespace" and ds["kind"] == "DaemonSet"
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert pod["automountServiceAccountToken"] is False  # no API access, hence no RBAC
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RESTART_CONTAINERD"] == "false"  # restarting containerd is opt-in
    assert env["HOST_ROOT"] == "/host" and env["RUNTIME_NAME"] == "cuda-compat"
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1] == "uninstall"
    assert c["image"].endswith(f":{VERSION}")
    (vol,) = pod["volumes"]
    assert vol["hostPath"]["path"] == "/" and c["volumeMounts"][0]["mountPath"] == env["HOST_ROOT"]
    # Only the chart's agent (compat-hook.yaml) talks to the API server, with the minimal ClusterRole.
    kinds = {d["kind"] for m in MANIFESTS if m.name != "compat-hook.yaml" for d in _docs(m)}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount"}
    [role] = [d for d in _docs(K8S / "compat-hook.yaml") if d["kind"] == "ClusterRole"]
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]] == [
        ([""], ["nodes"], ["get", "patch"]), ([""], ["pods"], ["list"]), ([""], ["events"], ["create"]),
        (["nvidia.com"], ["clusterpolicies", "nvidiadrivers"], ["get", "list", "watch"])]


def test_runtime_names_agree():
    (rc,) = _docs(K8S / "runtimeclass.yaml")
    (example,) = _docs(K8S / "examples" / "cuda-pod.yaml")
    ds = _docs(K8S / "daemonset.yaml")[1]
    env = {e["name"]: e["value"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert rc["handler"] == env["RUNTIME_NAME"] == example["spec"]["runtimeClassName"] == rc["metadata"]["name"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in example["spec"]["containers"][0]["env"]


# --------------------------------------------------------------------------- the image


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("k8s-image")
    _run(["make", "-C", REPO, "deb", f"DEB_OUT={out}", "PY=/usr/bin/python3"])
    deb = out / f"compat-hook_{VERSION}_all.deb"
    layout, tar = out / "layout", out / "image.tar"
    p = _run([REPO / "packaging/oci-image/build-image.sh", "--deb", deb, "--layout", layout, "--tar", tar])
    assert p.stdout.split() == [f"{layout}:{VERSION}", str(tar)], p.stdout
    return {"deb": deb, "layout": layout, "tar": tar, "dir": out}


@pytest.mark.slow
def test_build_image_makes_a_valid_oci_layout(image, tmp_path):
    layout = image["layout"]
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    (desc,) = index["manifests"]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == VERSION
    for blob in (layout / "blobs" / "sha256").iterdir():  # every blob is what its name says
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    manifest = json.loads((layout / "blobs/sha256" / desc["digest"].split(":")[1]).read_text())
    config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"].split(":")[1]).read_text())
    assert config["config"]["Cmd"] == ["/usr/local/bin/compat-hook-k8s", "run"]
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION
    stat = _run(["umoci", "stat", "--image", f"{layout}:{VERSION}"]).stdout
    assert "umoci repack" in stat
    assert VERSION in _run(["umoci", "ls", "--layout", layout]).stdout.split()

    _run(["umoci", "unpack", "--image", f"{layout}:{VERSION}", tmp_path / "b"])
    root = tmp_path / "b" / "rootfs"
    payload = root / "opt/compat-hook"
    stamp = (payload / "STAMP").read_text().strip()
    assert stamp.startswith(f"{VERSION}-") and len(stamp) == len(VERSION) + 13
    for rel in ("lib/compat_hook/commands/hook.py", "lib/compat_hook/install/containerd.py", "lib/yaml/__init__.py",
                "lib/elftools/__init__.py", "lib/tomlkit/__init__.py", "share/config.yaml", "bin/compat-hook"):
        assert (payload / rel).is_file(), rel
    assert not list(payload.rglob("*.so")) and not list(payload.rglob("__pycache__"))
    assert os.access(root / "usr/local/bin/compat-hook-k8s", os.X_OK)
    assert os.readlink(root / "bin/sh") == "busybox" and (root / "bin/busybox").is_file()
    assert not (root / "usr/bin/python3").exists()  # Python runs on the node, not in the image


def _fake_node(base: pathlib.Path) -> pathlib.Path:
    node = base / "node"
    for d in ("usr", "dev", "tmp", "etc/containerd", "proc", "run", "var/log"):
        (node / d).mkdir(parents=True, exist_ok=True)
    (node / "tmp").chmod(0o1777)
    for name in ("bin", "lib", "lib64", "sbin"):
        os.symlink(f"usr/{name}", node / name)
    (node / "etc/containerd/config.toml").write_text(
        '# the node\'s own containerd config\nversion = 2\n\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n')
    return node


INSIDE = r"""
set -eu
N={node}
mount --bind /usr "$N/usr"
mount -o remount,bind,ro "$N/usr"
mount --rbind /dev "$N/dev"
step() {{ echo "=== $1"; }}
PM="{podman_run} -v $N:/host"
step install
$PM {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
step node-tools
chroot "$N" /opt/compat-hook/bin/compat-hook --version
chroot "$N" /opt/compat-hook/bin/compat-hook-runtime --compat-hook-resolve
chroot "$N" /opt/compat-hook/bin/compat-hook config --check /etc/compat-hook/config.yaml >/dev/null && echo config-ok
step again
$PM {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
step watch
cp "$N/etc/containerd/config.toml" "$N/../config.registered"
# A tool rewrites config.toml without compat-hook's runtime while the pod runs (`run`, checking every second).
( sleep 6; printf '%s' "$ORIGINAL" > "$N/etc/containerd/config.toml.new"
  mv "$N/etc/containerd/config.toml.new" "$N/etc/containerd/config.toml"; echo rewritten ) &
$PM -e TOOLKIT_RECHECK=1 {image} /bin/busybox timeout 14 compat-hook-k8s run 2>&1 || true
wait
grep -c 'runtimes.cuda-compat' "$N/etc/containerd/config.toml" || true
step restart
$PM -e RESTART_CONTAINERD=true -e 'RESTART_COMMAND=echo restarted > /host/restarted' \
    -e INSTALL_ARGS=--set-as-default {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
step no-python
$PM -e HOST_PYTHON=/usr/bin/python9 {image} compat-hook-k8s install 2>&1 && echo "exit=0" || echo "exit=$?"
step plan
$PM -e TARGET_DRIVER=580.65.06 -e 'PLAN_ARGS=--from-driver 535.183.01' {image} compat-hook-k8s plan-once 2>&1 || echo "exit=$?"
step uninstall
$PM -e RESTART_CONTAINERD=true -e 'RESTART_COMMAND=echo restarted > /host/restarted-2' \
    {image} compat-hook-k8s uninstall 2>&1 || echo "exit=$?"
step end
"""


@pytest.mark.containers
def test_daemonset_image_installs_on_a_fake_node(image, tmp_path):
    node = _fake_node(tmp_path)
    main_cfg = (node / "etc/containerd/config.toml").read_text()
    pm = start_podman(tmp_path / "pm", image["tar"])
    try:
        tag = "localhost/compat-hook:test"
        pm("tag", "localhost/compat-hook-test:latest", tag)
        podman_run = " ".join(shlex.quote(str(a)) for a in pm.argv("run", "--rm", *RUN_FLAGS))
        script = tmp_path / "inside.sh"
        script.write_text(INSIDE.format(node=shlex.quote(str(node)), podman_run=podman_run, image=tag))
        p = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script], check=False, timeout=300,
                 env=dict(ENV, ORIGINAL=main_cfg))
    finally:
        pm.reset()
    out = _sections(p.stdout)
    assert p.returncode == 0 and "end" in out, p.stdout + p.stderr

    assert "exit=" not in out["install"], out["install"]
    # `run` re-registers when containerd's files change: the runtime is back in the rewritten config.toml.
    assert "rewritten" in out["watch"], out["watch"]
    assert "containerd's configuration changed: compat-hook's runtime registered again" in out["watch"], out["watch"]
    assert out["watch"].strip().splitlines()[-1] == "2", out["watch"]  # the table and its .options
    assert "containerd not restarted (RESTART_CONTAINERD=false)" in out["install"], out["install"]
    assert "ready: runtime 'cuda-compat'" in out["install"]
    tools = out["node-tools"].splitlines()
    assert tools == [f"compat-hook {VERSION}", "runtime=runc", "config-ok"], out["node-tools"]

    assert "exit=" not in out["again"] and "configuration is unchanged" in out["again"], out["again"]
    assert "payload already on the node" in out["again"]

    assert "exit=" not in out["restart"], out["restart"]
    assert "restarting containerd" in out["restart"]
    assert "exit=1" in out["no-python"] and "python3 >= 3.9" in out["no-python"], out["no-python"]

    # the preflight's pod (upgrade/plan-daemonset.yaml) on the node: one JSON object; this fake node
    # has no containerd socket, so its one row says why, and plan exits 4 (nothing read)
    assert "exit=" not in out["plan"], out["plan"]
    assert "plan exited 4" in out["plan"], out["plan"]
    body = out["plan"][out["plan"].index("{"):out["plan"].rindex("}") + 1]
    plan = json.loads(body)
    assert plan["driver"] == {"now": "535.183.01", "after": "580.65.06", "target_from": "--driver"}
    assert plan["images"][0]["image"] == "containerd:" and "no socket at /run/containerd" in plan["images"][0]["error"]
    assert "exit=" not in out["uninstall"], out["uninstall"]
    assert (node / "restarted").read_text() == "restarted\n"
    assert (node / "restarted-2").read_text() == "restarted\n"
    # After the uninstall (with a restart): containerd's config is what it was, the copies are gone.
    assert (node / "etc/containerd/config.toml").read_text() == main_cfg or \
        tomllib.loads((node / "etc/containerd/config.toml").read_text()) == tomllib.loads(main_cfg)
    assert not (node / "etc/containerd/config.toml.compat-hook-install").exists()
    assert not (node / "opt/compat-hook").exists(), list((node / "opt/compat-hook").rglob("*"))
    assert (node / "etc/compat-hook/config.yaml").is_file()  # the node's config stays


@pytest.mark.containers
def test_installer_writes_node_paths(image, tmp_path):
    """One install, then the files: node paths only, the wrapper at the fixed path, and the NVIDIA
    toolkit's config.toml on the node registered too (its runtimes start with the wrapper)."""
    node = _fake_node(tmp_path)
    tk = node / "etc/nvidia-container-runtime/config.toml"
    tk.parent.mkdir(parents=True)
    tk.write_text('# the toolkit\'s config\n[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["runc", "crun"]\n')
    pm = start_podman(tmp_path / "pm", image["tar"])
    try:
        podman_run = " ".join(shlex.quote(str(a)) for a in pm.argv("run", "--rm", *RUN_FLAGS))
        script = tmp_path / "inside.sh"
        script.write_text(INSIDE.split("step again")[0].format(
            node=shlex.quote(str(node)), podman_run=podman_run, image="localhost/compat-hook-test:latest"))
        p = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script], check=False, timeout=300)
    finally:
        pm.reset()
    assert p.returncode == 0, p.stdout + p.stderr
    # containerd 1.x: the runtime is written into the node's config.toml (no drop-in to hide later edits).
    main = tomllib.loads((node / "etc/containerd/config.toml").read_text())
    rt = main["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["cuda-compat"]
    assert rt["options"]["BinaryName"] == "/opt/compat-hook/bin/compat-hook-runtime"
    assert not (node / "etc/containerd/conf.d").exists()
    assert (node / "etc/containerd/config.toml.compat-hook-install").is_file()
    (copy,) = [d for d in (node / "opt/compat-hook").iterdir() if (d / "STAMP").is_file()]
    wrapper = (node / "opt/compat-hook/bin/compat-hook-runtime").read_text()
    assert f"/opt/compat-hook/{copy.name}/lib" in wrapper and str(tmp_path) not in wrapper
    assert "ch_python=/usr/bin/python3" in wrapper
    assert (node / "etc/compat-hook/config.yaml").read_text() == (copy / "share/config.yaml").read_text()
    toolkit = tomllib.loads(tk.read_text())["nvidia-container-runtime"]
    assert toolkit["runtimes"] == ["/opt/compat-hook/bin/compat-hook-runtime", "runc", "crun"], p.stdout
    assert "registered under the NVIDIA toolkit's /etc/nvidia-container-runtime/config.toml" in p.stdout
    assert tk.read_text().startswith("# the toolkit's config\n")  # its formatting kept
    launcher = (node / "opt/compat-hook/bin/compat-hook").read_text()
    assert f"/opt/compat-hook/{copy.name}/bin/compat-hook" in launcher
