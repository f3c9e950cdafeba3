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
RENDERED = K8S / "compat-hook.yaml"  # the chart's defaults, rendered (tests/test_cluster.py: == helm template)
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
    assert {p.name for p in MANIFESTS} >= {"compat-hook.yaml", "cuda-pod.yaml", "plan-daemonset.yaml"}
    for version in K8S_VERSIONS:
        p = _run([validator, "--strict", "-k", version, *MANIFESTS], check=False)
        assert p.returncode == 0, p.stdout + p.stderr
        passed = [ln for ln in p.stdout.splitlines() if " passed for resource " in ln]
        assert len(passed) == sum(len(_docs(m)) for m in MANIFESTS), p.stdout


@pytest.mark.slow
def test_validator_rejects_a_bad_manifest(validator, tmp_path):
    """The check has teeth: an unknown field and a missing required one both fail."""
    [ds] = [d for d in _docs(RENDERED) if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "compat-hook"]
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(ds))
    assert _run([validator, "--strict", bad], check=False).returncode != 0
    del ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"]
    del ds["spec"]["selector"]
    bad.write_text(yaml.safe_dump(ds))
    assert _run([validator, "--strict", bad], check=False).returncode != 0


def _rendered() -> dict:
    return {(d["kind"], d["metadata"]["name"]): d for d in _docs(RENDERED)}


def test_daemonset_shape():
    """The one plain manifest: Namespace, DaemonSet (installer + agent of one image), RuntimeClass,
    and the agent's ServiceAccount, minimal ClusterRole, binding and config; the validator's objects
    (tests/test_validator.py)."""
    docs = _rendered()
    assert {k for k in docs if "validator" not in k[1]} == {
        ("Namespace", "compat-hook"), ("ServiceAccount", "compat-hook"),
        ("ConfigMap", "compat-hook-agent"), ("ClusterRole", "compat-hook-agent"),
        ("ClusterRoleBinding", "compat-hook-agent"), ("DaemonSet", "compat-hook"),
        ("RuntimeClass", "cuda-compat")}
    ns, ds = docs[("Namespace", "compat-hook")], docs[("DaemonSet", "compat-hook")]
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert pod["hostPID"] is False and pod["serviceAccountName"] == "compat-hook"
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"installer", "agent"}
    c, agent = containers["installer"], containers["agent"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RESTART_CONTAINERD"] == "false"  # restarting containerd is opt-in
    assert env["HOST_ROOT"] == "/host" and env["RUNTIME_NAME"] == "cuda-compat"
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1] == "uninstall"
    assert c["securityContext"]["privileged"] is False
    assert c["image"].endswith(f":{VERSION}") and agent["image"] == c["image"]  # one image, both containers
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["host-root"]["hostPath"]["path"] == "/"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["host-root"]["mountPath"] == env["HOST_ROOT"]
    # the agent: the image's compat-hook, the node's root read-only at /host, the gate off
    assert agent["command"][:3] == ["compat-hook", "cluster", "agent"]
    assert "--address=/host/run/containerd/containerd.sock" in agent["command"]
    amounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert amounts["/host"]["readOnly"] is True and amounts["/host"]["name"] == "host-root"
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert "emptyDir" in vols[amounts["/tmp"]["name"]]  # blobs decompress there, the rootfs is read-only
    conf = yaml.safe_load(docs[("ConfigMap", "compat-hook-agent")]["data"]["config.yaml"])
    assert conf["host_root"] == "/host" and conf["cluster"]["gate_upgrade"] is False
    role = docs[("ClusterRole", "compat-hook-agent")]
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]] == [
        ([""], ["nodes"], ["get", "patch"]), ([""], ["pods"], ["list"]), ([""], ["events"], ["create"]),
        (["nvidia.com"], ["clusterpolicies", "nvidiadrivers"], ["get", "list", "watch"])]
    # nothing else in packaging/kubernetes talks to the API server
    kinds = {d["kind"] for m in MANIFESTS if m != RENDERED for d in _docs(m)}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount"}


def test_runtime_names_agree():
    docs = _rendered()
    rc = docs[("RuntimeClass", "cuda-compat")]
    (example,) = _docs(K8S / "examples" / "cuda-pod.yaml")
    [installer] = [c for c in docs[("DaemonSet", "compat-hook")]["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "installer"]
    env = {e["name"]: e["value"] for e in installer["env"]}
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
    assert "PATH=/usr/local/bin:/usr/bin:/bin" in config["config"]["Env"]
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
    # the agent's side: Debian's python3 with the Kubernetes client, ctr, and compat-hook on PATH
    for rel in ("usr/bin/python3", "usr/bin/ctr", "usr/local/bin/compat-hook"):
        assert os.access(root / rel, os.X_OK), rel
    assert (root / "usr/lib/python3/dist-packages/kubernetes/client/__init__.py").is_file()
    assert not (root / "usr/share/doc").exists() and not (root / "usr/bin/dpkg").exists()
    p = _run(["chroot", root, "/bin/env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "/bin/sh", "-c",
              "compat-hook --version && ctr --version && python3 -I -c 'import kubernetes.client, yaml, elftools, "
              "tomlkit, ssl; print(kubernetes.__version__)'"])
    lines = p.stdout.splitlines()
    assert lines[0] == f"compat-hook {VERSION}" and lines[1].startswith("ctr "), p.stdout
    assert lines[2].split(".")[0].isdigit(), p.stdout


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


# --------------------------------------------------------------------------- the agent, from the image

AGENT_INSIDE = r"""
set -eu
R={rootfs} N={node} W={ctrd_work} S={sock}
# the node: containerd's own dirs where they are on the node, its socket where the chart points
mkdir -p "$N$W" "$N/run/containerd" && : > "$N/run/containerd/containerd.sock"
mount --bind "$W" "$N$W"
mount --bind "$S" "$N/run/containerd/containerd.sock"
# the pod: the image's rootfs read-only, the node's root read-only at /host, the chart's config,
# a state dir and /tmp (emptyDir), /proc and /dev as the runtime gives them
mount --bind "$R" "$R"
mount --rbind "$N" "$R/host" && mount -o remount,bind,ro "$R/host"
mount --bind {config_dir} "$R/etc/compat-hook-agent"
mount --bind {state_dir} "$R/var/lib/compat-hook-agent"
mount -t tmpfs tmpfs "$R/tmp"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -o remount,bind,ro "$R"
exec chroot "$R" /bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ "$@"
"""


@pytest.mark.containers
@pytest.mark.slow
def test_agent_runs_from_the_image(image, tmp_path):
    """The shipped image runs the agent as the chart does: its python3 and ctr, the chart's config
    (host_root /host) and command, the node's root read-only at /host. Against a real API server
    it reads the pod's image from the node's containerd - from the snapshot, under /host (the layer
    blob is removed from the content store, so nothing else could read it) - and publishes."""
    import tempfile

    from tests.support import engines, hookenv
    from tests.support.images import Layout, gz, tar_layer
    from tests.support.kube import AGENT_TOKEN, ControlPlane

    host_535, target = "535.261.03", "555.58.02"
    _run(["umoci", "unpack", "--image", f"{image['layout']}:{VERSION}", tmp_path / "b"])
    rootfs = tmp_path / "b" / "rootfs"
    for d in ("etc/compat-hook-agent", "var/lib/compat-hook-agent"):
        (rootfs / d).mkdir(parents=True)
    docs = _rendered()
    [agent] = [c for c in docs[("DaemonSet", "compat-hook")]["spec"]["template"]["spec"]["containers"]
               if c["name"] == "agent"]
    config_dir, state_dir = tmp_path / "config", tmp_path / "state"
    config_dir.mkdir(), state_dir.mkdir()
    (config_dir / "config.yaml").write_text(docs[("ConfigMap", "compat-hook-agent")]["data"]["config.yaml"])

    # the node: a host driver (535, an H100) and its containerd with one CUDA 12.4 image, unpacked
    node = hookenv.fake_host(tmp_path / "node", host_535)
    info = node / "proc/driver/nvidia/gpus/0000:17:00.0/information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t 0000:17:00.0\n")
    lay = Layout(tmp_path / "app")
    layer = gz(tar_layer([("dir", "etc"), ("file", "etc/os-release", b"ID=debian\n")]))
    lay.tag(lay.image([layer], env=["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=all"]), "agent")
    short = pathlib.Path(tempfile.mkdtemp(prefix="chag", dir="/tmp"))  # socket paths stay < 108 bytes
    d = engines.Containerd(short / "d", pause_image="localhost/none:pause")
    cp = ControlPlane(tmp_path / "cp")
    try:
        d.start(host_535)
        d.ctr("-n", "k8s.io", "images", "import", "--base-name", "localhost/app", lay.tar(tmp_path / "app.tar"))
        blob = "sha256:" + hashlib.sha256(layer).hexdigest()
        d.ctr("-n", "k8s.io", "content", "rm", blob)
        assert blob not in d.ctr("-n", "k8s.io", "content", "ls", "-q").stdout.split()

        cp.start()
        for doc in docs.values():  # the agent's RBAC as shipped
            kind, meta = doc["kind"], doc["metadata"]
            if kind == "ServiceAccount":
                cp.admin.create(f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts", doc)
            elif kind in ("ClusterRole", "ClusterRoleBinding"):
                cp.admin.create(f"/apis/rbac.authorization.k8s.io/v1/{kind.lower()}s", doc)
        cp.admin.create("/api/v1/nodes", {"metadata": {"name": "gpu-img", "labels": {
            "nvidia.com/gpu.present": "true", "nvidia.com/cuda.driver-version.full": host_535}}})
        cp.admin.create("/api/v1/namespaces/apps/pods", {"metadata": {"name": "app"}, "spec": {
            "nodeName": "gpu-img", "containers": [{"name": "main", "image": "localhost/app:agent",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        cp.admin.create("/apis/nvidia.com/v1/clusterpolicies", {
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {"driver": {"version": target}}})
        (config_dir / "kubeconfig").write_text(cp.kubeconfig(AGENT_TOKEN, "agent").read_text())

        argv = [a.replace("$(NODE_NAME)", "gpu-img") for a in agent["command"]]
        argv += ["--once", "--kubeconfig=/etc/compat-hook-agent/kubeconfig"]
        script = tmp_path / "agent.sh"
        script.write_text(AGENT_INSIDE.format(rootfs=shlex.quote(str(rootfs)), node=shlex.quote(str(node)),
                                              ctrd_work=shlex.quote(str(d.work)), sock=shlex.quote(str(d.sock)),
                                              config_dir=config_dir, state_dir=state_dir))
        p = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script, *argv], check=False, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        result = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
        meta = cp.admin.get("/api/v1/nodes/gpu-img")["metadata"]
    finally:
        cp.stop()
        left = d.stop()
        import shutil

        shutil.rmtree(short, ignore_errors=True)
    assert left == {"processes": [], "mounts": []}, left
    assert result["target"] == target and result["problem"] is None, result
    summary = json.loads(meta["annotations"]["compat-hook.io/preflight"])
    assert (summary["images"], summary["unreadable"], summary["not_in_store"]) == (1, 0, 0), (summary, p.stdout, p.stderr)
    # host-minor on 535 (CUDA 12.2 for a 12.4 image), the host's own driver on 555: the outcome changes
    assert meta["labels"]["compat-hook.io/preflight"] == "warn" and summary["changed"] == 1, (meta, summary)
    assert meta["labels"]["compat-hook.io/preflight.target-driver"] == target
    assert meta["labels"]["compat-hook.io/preflight.broken"] == "0"
    assert any(state_dir.iterdir()), "the agent keeps its last result in its state dir"
