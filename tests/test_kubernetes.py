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
import tarfile
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
K8S_VERSIONS = ("1.30.0", "1.37.0")  # ValidatingAdmissionPolicy v1 is 1.30
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


def _pod(docs: dict) -> dict:
    return docs[("DaemonSet", "compat-hook")]["spec"]["template"]["spec"]


def test_daemonset_shape():
    """The one plain manifest: Namespace, DaemonSet (installer + agent of one image), RuntimeClass, the
    agent's ServiceAccount, its ClusterRole (cluster reads, Node patch) and Role (its namespace's
    writes), the admission policies and the agent's config; the validator's objects
    (tests/test_validator.py). The release Job's account is a pre-delete hook, as the Job is: not here."""
    docs = _rendered()
    assert {k for k in docs if "validator" not in k[1]} == {("Namespace", "compat-hook"), ("ServiceAccount", "compat-hook"),
                         ("ConfigMap", "compat-hook-agent"),
                         ("ClusterRole", "compat-hook-agent"), ("ClusterRoleBinding", "compat-hook-agent"),
                         ("Role", "compat-hook-agent"), ("RoleBinding", "compat-hook-agent"),
                         ("Role", "compat-hook-agent-events"), ("RoleBinding", "compat-hook-agent-events"),
                         ("ValidatingAdmissionPolicy", "compat-hook-agent-node"),
                         ("ValidatingAdmissionPolicyBinding", "compat-hook-agent-node"),
                         ("ValidatingAdmissionPolicy", "compat-hook-agent-objects"),
                         ("ValidatingAdmissionPolicyBinding", "compat-hook-agent-objects"),
                         ("ValidatingAdmissionPolicy", "compat-hook-node-verdicts"),
                         ("ValidatingAdmissionPolicyBinding", "compat-hook-node-verdicts"),
                         ("ValidatingAdmissionPolicy", "compat-hook-events"),
                         ("ValidatingAdmissionPolicyBinding", "compat-hook-events"),
                         ("ValidatingAdmissionPolicy", "compat-hook-release-node"),
                         ("ValidatingAdmissionPolicyBinding", "compat-hook-release-node"),
                         ("ValidatingAdmissionPolicy", "compat-hook-release-objects"),
                         ("ValidatingAdmissionPolicyBinding", "compat-hook-release-objects"),
                         ("DaemonSet", "compat-hook"), ("RuntimeClass", "cuda-compat")}
    ns, ds = docs[("Namespace", "compat-hook")], docs[("DaemonSet", "compat-hook")]
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    pod = _pod(docs)
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert pod["hostPID"] is False and pod["serviceAccountName"] == "compat-hook"
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"installer", "agent"}
    c, agent = containers["installer"], containers["agent"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RESTART_CONTAINERD"] == "false"  # restarting containerd is opt-in
    assert env["UNINSTALL_ON_STOP"] == "false"   # a restart of the pod leaves the registration
    assert env["HOST_ROOT"] == "/host" and env["RUNTIME_NAME"] == "cuda-compat"
    assert env["CONTAINERD_CONFIG"] == "/etc/containerd/config.toml"
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1] == "uninstall"
    assert c["securityContext"]["privileged"] is False
    assert c["image"].endswith(f":{VERSION}") and agent["image"] == c["image"]  # one image, both containers
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["host-root"]["hostPath"]["path"] == "/"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["host-root"]["mountPath"] == env["HOST_ROOT"]
    # the agent: the image's compat-hook, under /host only what it reads, the gate off
    assert agent["command"][4:7] == ["compat-hook", "cluster", "agent"]
    assert "--address=/host/run/containerd/containerd.sock" in agent["command"]
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    amounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert "emptyDir" in vols[amounts["/tmp"]["name"]]  # blobs decompress there, the rootfs is read-only
    conf = yaml.safe_load(docs[("ConfigMap", "compat-hook-agent")]["data"]["config.yaml"])
    assert conf["host_root"] == "/host" and conf["cluster"]["gate_upgrade"] is False
    # the chart's own RuntimeClass is the one the agent counts where a node is not on NRI
    assert conf["cluster"]["compat_runtime_classes"] == [docs[("RuntimeClass", "cuda-compat")]["metadata"]["name"]]
    role = docs[("ClusterRole", "compat-hook-agent")]
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]] == [
        ([""], ["nodes"], ["get", "list", "watch", "patch"]), ([""], ["pods"], ["list", "watch"]),
        (["nvidia.com"], ["clusterpolicies", "nvidiadrivers"], ["list", "watch"]),
        (["resource.k8s.io"], ["resourceclaims"], ["list", "watch"])]
    local = docs[("Role", "compat-hook-agent")]
    assert local["metadata"]["namespace"] == "compat-hook"
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in local["rules"]] == [
        (["coordination.k8s.io"], ["leases"], ["get", "create", "update"]),
        ([""], ["configmaps"], ["get", "create", "update"])]
    # Events about its Node: in default (the only namespace that takes one about a cluster-scoped object)
    events = docs[("Role", "compat-hook-agent-events")]
    assert events["metadata"]["namespace"] == "default"
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in events["rules"]] == [([""], ["events"], ["create"])]
    assert docs[("RoleBinding", "compat-hook-agent-events")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "compat-hook", "namespace": "compat-hook"}]
    for name in ("compat-hook-agent-node", "compat-hook-agent-objects", "compat-hook-events", "compat-hook-release-node",
                 "compat-hook-release-objects", "compat-hook-node-verdicts"):
        binding = docs[("ValidatingAdmissionPolicyBinding", name)]
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        assert docs[("ValidatingAdmissionPolicy", name)]["spec"]["failurePolicy"] == "Fail"
    # nothing else in packaging/kubernetes talks to the API server
    kinds = {d["kind"] for m in MANIFESTS if m != RENDERED for d in _docs(m)}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount"}


def test_runtime_names_agree():
    docs = _rendered()
    rc = docs[("RuntimeClass", "cuda-compat")]
    (example,) = _docs(K8S / "examples" / "cuda-pod.yaml")
    [installer] = [c for c in _pod(docs)["containers"] if c["name"] == "installer"]
    env = {e["name"]: e["value"] for e in installer["env"]}
    assert rc["handler"] == env["RUNTIME_NAME"] == example["spec"]["runtimeClassName"] == rc["metadata"]["name"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in example["spec"]["containers"][0]["env"]


# --------------------------------------------------------------------------- the chart, rendered


@pytest.mark.slow
def test_plain_manifest_is_the_chart_rendered():
    from tests.support import chart

    assert RENDERED.read_text() == chart.RENDER_HEADER + chart.helm(*chart.RENDER_ARGS).stdout


def _host_mounts(docs: list, container: str) -> dict:
    """mountPath -> (hostPath, the mount) of one DaemonSet container's host mounts."""
    from tests.support import chart

    vols = {v["name"]: v for v in chart.daemonset(docs)["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: (vols[m["name"]]["hostPath"]["path"], m)
            for m in chart.containers(docs)[container]["volumeMounts"] if "hostPath" in vols[m["name"]]}


@pytest.mark.slow
def test_helm_template_defaults_confine_both_containers():
    """`helm template` defaults: the agent holds no more of the node than it reads, read-only; neither
    container can gain privileges or runs without the runtime's seccomp profile; only the agent has a
    token; a pod restart leaves the registration; the admission policies and their bindings are there."""
    from tests.support import chart

    docs = chart.render()
    c = chart.containers(docs)
    agent, installer = c["agent"], c["installer"]
    host = _host_mounts(docs, "agent")
    assert "/" not in {path for path, _ in host.values()} and "/host" not in host
    assert {m: path for m, (path, _) in host.items()} == {
        "/host/proc/driver": "/proc/driver", "/host/run/containerd": "/run/containerd",
        "/host/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs":
            "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs",
        "/var/lib/compat-hook-agent": "/var/lib/compat-hook-agent"}
    for mount_path, (_, m) in host.items():
        if mount_path.startswith("/host/"):
            assert m["readOnly"] is True and m["recursiveReadOnly"] == "IfPossible", m
    for ctr in (agent, installer):
        sc = ctr["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["seccompProfile"] == {"type": "RuntimeDefault"}, sc
        assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in agent["securityContext"]["capabilities"]  # no DAC_READ_SEARCH: it reads as root's files
    pod = chart.daemonset(docs)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    vols = {v["name"]: v for v in pod["volumes"]}
    token_mounts = [(name, m["name"]) for name, ctr in c.items() for m in ctr["volumeMounts"]
                    if "projected" in vols[m["name"]]]
    assert token_mounts == [("agent", "agent-token")]
    sources = vols["agent-token"]["projected"]["sources"]
    assert [s for s in sources if "serviceAccountToken" in s][0]["serviceAccountToken"]["path"] == "token"
    assert {e["name"]: e["value"] for e in installer["env"]}["UNINSTALL_ON_STOP"] == "false"
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for name in ("compat-hook-agent-node", "compat-hook-agent-objects", "compat-hook-events", "compat-hook-release-node",
                 "compat-hook-release-objects"):
        assert ("ValidatingAdmissionPolicy", name) in kinds and ("ValidatingAdmissionPolicyBinding", name) in kinds
    # the pre-delete hook: `cluster release --all` as its own account, nothing else of the node
    [job] = [d for d in docs if d["kind"] == "Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    jpod = job["spec"]["template"]["spec"]
    assert jpod["serviceAccountName"] == "compat-hook-release" and jpod["securityContext"]["runAsNonRoot"] is True
    assert jpod["containers"][0]["command"][:4] == ["compat-hook", "cluster", "release", "--all"]
    assert "--prefix=compat-hook.io" in jpod["containers"][0]["command"]
    # and everything else compat-hook wrote (release.keepPublished=false, the default)
    assert jpod["containers"][0]["command"][-2:] == ["--purge", "--publish-namespace=compat-hook"]
    assert not any("hostPath" in v for v in jpod.get("volumes", []))
    # its account and grant exist only for it: pre-delete hooks made before it, deleted with it
    release = {d["kind"]: d for d in docs if d["metadata"]["name"] == "compat-hook-release" and d["kind"] != "Job"}
    assert set(release) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert [(r["resources"], r["verbs"]) for r in release["ClusterRole"]["rules"]] == [(["nodes"], ["list", "patch"])]
    assert release["Role"]["metadata"]["namespace"] == "compat-hook"
    assert [(r["resources"], r["verbs"]) for r in release["Role"]["rules"]] == [
        (["configmaps"], ["list", "delete"]), (["leases"], ["list", "delete"])]
    kept = chart.render("release.keepPublished=true")
    [kjob] = [d for d in kept if d["kind"] == "Job"]
    assert "--purge" not in kjob["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ("Role", "compat-hook-release") not in {(d["kind"], d["metadata"]["name"]) for d in kept}
    for d in release.values():
        a = d["metadata"]["annotations"]
        assert a["helm.sh/hook"] == "pre-delete", d
        assert int(a["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert set(a["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}


@pytest.mark.slow
def test_helm_template_value_switches():
    from tests.support import chart

    # restartContainerd: the installer is privileged (nsenter into PID 1), so no seccomp and no
    # allowPrivilegeEscalation (the API refuses false with privileged); the agent stays confined
    c = chart.containers(chart.render("registration.restartContainerd=true"))
    sc = c["installer"]["securityContext"]
    assert sc["privileged"] is True and "seccompProfile" not in sc and "allowPrivilegeEscalation" not in sc
    assert c["agent"]["securityContext"]["allowPrivilegeEscalation"] is False
    # the policies off (clusters before 1.30), and refused outright on one
    assert not [d for d in chart.render("admissionPolicy.enabled=false") if "AdmissionPolicy" in d["kind"]]
    p = chart.helm("template", "x", chart.CHART, "--kube-version", "1.29.4", check=False)
    assert p.returncode != 0 and "admissionPolicy.enabled=false" in p.stderr
    assert chart.daemonset(chart.render("admissionPolicy.enabled=false"))
    # recursiveReadOnly: "" leaves the field out (API servers before 1.30)
    for _, m in _host_mounts(chart.render("agent.recursiveReadOnly="), "agent").values():
        assert "recursiveReadOnly" not in m
    # a config change rolls the pods (the checksum on the template); an unrelated value does not
    def checksum(*values):
        return chart.daemonset(chart.render(*values))["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum() != checksum("agent.gate=true") != checksum("agent.labelPrefix=preflight.example.com")
    assert checksum() == checksum("agent.interval=60")
    # the installer's pod starts under NRI's `required_plugins` while compat-hook's plugin is missing
    # (install --nri-require all: tests/test_nri_required.py); the validator's probe pods do not tolerate
    docs = chart.render()
    assert chart.daemonset(docs)["spec"]["template"]["metadata"]["annotations"][
        "tolerate-missing-plugins.compat-hook.io/pod"] == "true"
    assert "tolerate-missing-plugins" not in yaml.safe_dump(chart.daemonset(docs, "compat-hook-validator"))
    # registration.nriRequire reaches the installer (install --via nri --nri-require); the schema takes no other
    for values, want in (((), "off"), (("registration.nriRequire=all",), "all")):
        env = {e["name"]: e.get("value") for e in chart.containers(chart.render(*values))["installer"]["env"]}
        assert env["NRI_REQUIRE"] == want, (values, env)
    p = chart.helm("template", "x", chart.CHART, "--set", "registration.nriRequire=always", check=False)
    assert p.returncode != 0 and "nriRequire" in p.stderr, p.stderr
    # the GPU Operator's toolkit.env route: the installer leaves the operator's file alone and only checks it
    env = {e["name"]: e["value"] for e in chart.containers(chart.render("gpuOperator.toolkitEnv=true",
                                                                        "registration.installArgs=--set-as-default"))
           ["installer"]["env"]}
    assert env["TOOLKIT_CONFIGS"] == "" and env["INSTALL_ARGS"] == "--set-as-default --toolkit-config none"
    assert env["TOOLKIT_EXPECT"] == "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
    # registration.path: auto by default; each value reaches the installer; the installer writes the path
    # taken where the agent reads it (one in-memory emptyDir, read-only for the agent)
    for values, want in (((), "auto"), (("registration.path=nri",), "nri"),
                         (("registration.path=runtimeclass",), "runtimeclass")):
        c = chart.containers(chart.render(*values))
        env = {e["name"]: e["value"] for e in c["installer"]["env"]}
        assert (env["REGISTRATION_PATH"], env["PATH_FILE"]) == (want, "/run/compat-hook/registration"), values
        assert {"name": "registration", "mountPath": "/run/compat-hook", "readOnly": True} in c["agent"]["volumeMounts"]
        assert {"name": "registration", "mountPath": "/run/compat-hook"} in c["installer"]["volumeMounts"]
    vols = {v["name"]: v for v in chart.daemonset(chart.render())["spec"]["template"]["spec"]["volumes"]}
    assert vols["registration"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    # agent.compatRuntimeClasses overrides the RuntimeClass the agent counts (cluster.compat_runtime_classes),
    # checked by the config's own schema; the chart's schema refuses what is not a class name
    from compat_hook.core.config import from_mapping

    for values, want in (((), ["cuda-compat"]), (("runtimeClass.name=gpu-compat",), ["gpu-compat"]),
                         (("agent.compatRuntimeClasses={nvidia,}",), ["nvidia", ""])):
        [cm] = [d for d in chart.render(*values)
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "compat-hook-agent"]
        conf = from_mapping(yaml.safe_load(cm["data"]["config.yaml"]))
        assert conf.cluster["compat_runtime_classes"] == want, values
    p = chart.helm("template", "x", chart.CHART, "--set", "agent.compatRuntimeClasses={Not A Class}", check=False)
    assert p.returncode != 0 and "compatRuntimeClasses" in p.stderr, p.stderr
    # the Namespace is the chart's by default (helm install --create-namespace labels it); off, none is rendered
    assert not [d for d in chart.render("namespace.create=false") if d["kind"] == "Namespace"]


@pytest.mark.slow
def test_the_fleet_controller_and_its_policy():
    """fleet.enabled (auto by default: with agent.gate): a Deployment of two leader-elected replicas of the image, confined like
    the other pods, whose account reads Nodes, Leases and the GPU Operator's objects and may write only its
    own Lease and ConfigMap (both the chart's, so no create right and nothing left after an uninstall);
    the driver-version policy fails closed; fleet.admission=false leaves the policy out."""
    from tests.support import chart

    assert not [d for d in chart.render() if "fleet" in d["metadata"]["name"]]
    # auto (the default) follows the gate: the documented install (--set agent.gate=true) enforces the order
    gated = chart.by_key(chart.render("agent.gate=true"))
    assert {("Deployment", "compat-hook-fleet"), ("ValidatingAdmissionPolicy", "compat-hook-fleet-driver-version")} \
        <= set(gated)
    assert not [k for k in chart.by_key(chart.render("agent.gate=true", "fleet.enabled=false")) if "fleet" in k[1]]
    old = chart.by_key(chart.render("agent.gate=true", "admissionPolicy.enabled=false"))  # Kubernetes < 1.30
    assert ("Deployment", "compat-hook-fleet") in old
    assert not [k for k in old if k[0].startswith("ValidatingAdmissionPolicy")]
    docs = chart.by_key(chart.render("fleet.enabled=true"))
    fleet = {k: d for k, d in docs.items() if "fleet" in k[1]}
    assert set(fleet) == {(k, "compat-hook-fleet") for k in (
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Lease", "ConfigMap",
        "Deployment")} | {(k, p) for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
                          for p in ("compat-hook-fleet-driver-version", "compat-hook-fleet-param",
                                    "compat-hook-fleet-objects")}
    dep = fleet[("Deployment", "compat-hook-fleet")]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "compat-hook-fleet" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["seccompProfile"] == {
        "type": "RuntimeDefault"}
    [c] = pod["containers"]
    assert c["command"][:3] == ["compat-hook", "cluster", "fleet"] and "--namespace=compat-hook" in c["command"]
    assert c["image"].endswith(f":{VERSION}")
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]} == {"POD_NAME": "metadata.name"}
    assert not any("hostPath" in v for v in pod["volumes"])
    rules = lambda kind: [(r["apiGroups"], r["resources"], r.get("resourceNames"), r["verbs"])  # noqa: E731
                          for r in fleet[(kind, "compat-hook-fleet")]["rules"]]
    assert rules("ClusterRole") == [([""], ["nodes"], None, ["list", "watch"]),
                                    (["nvidia.com"], ["clusterpolicies", "nvidiadrivers", "gpuclusters"], None,
                                     ["list", "watch"])]
    # create: a deleted Lease or ConfigMap is made anew; the policy compat-hook-fleet-objects names what
    assert rules("Role") == [(["coordination.k8s.io"], ["leases"], None, ["list", "watch"]),
                             (["coordination.k8s.io"], ["leases"], ["compat-hook-fleet"], ["get", "update"]),
                             ([""], ["configmaps"], ["compat-hook-fleet"], ["get", "list", "watch", "update"]),
                             (["apps"], ["deployments"], ["compat-hook-fleet"], ["get"]),
                             (["coordination.k8s.io", ""], ["leases", "configmaps"], None, ["create"])]
    objects = fleet[("ValidatingAdmissionPolicy", "compat-hook-fleet-objects")]["spec"]
    assert objects["failurePolicy"] == "Fail" and "system:serviceaccount:compat-hook:compat-hook-fleet" in \
        objects["matchConditions"][0]["expression"]
    # a cluster of GPU nodes only still runs it; elsewhere it prefers a node that is not a GPU node
    prefs = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert prefs[0]["preference"]["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["nodeAffinity"]
    old_rules = chart.by_key(chart.render("fleet.enabled=true", "fleet.admission=false", "admissionPolicy.enabled=false"))
    assert not [r for r in old_rules[("Role", "compat-hook-fleet")]["rules"] if "create" in r["verbs"]]
    assert "data" not in fleet[("ConfigMap", "compat-hook-fleet")]  # the controller's (server-side apply)
    vap = fleet[("ValidatingAdmissionPolicy", "compat-hook-fleet-driver-version")]["spec"]
    assert vap["failurePolicy"] == "Fail" and vap["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert vap["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["nvidia.com"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["clusterpolicies", "nvidiadrivers"]}]
    binding = fleet[("ValidatingAdmissionPolicyBinding", "compat-hook-fleet-driver-version")]["spec"]
    assert binding["paramRef"] == {"name": "compat-hook-fleet", "namespace": "compat-hook",
                                   "parameterNotFoundAction": "Deny"}
    assert binding["validationActions"] == ["Deny"]
    off = chart.by_key(chart.render("fleet.enabled=true", "fleet.admission=false"))
    assert ("Deployment", "compat-hook-fleet") in off
    assert [k for k in off if k[0].startswith("ValidatingAdmissionPolicy") and "fleet" in k[1]] == [
        ("ValidatingAdmissionPolicy", "compat-hook-fleet-objects"),
        ("ValidatingAdmissionPolicyBinding", "compat-hook-fleet-objects")]
    p = chart.helm("template", "x", chart.CHART, "--set", "fleet.enabled=true", "--set", "admissionPolicy.enabled=false",
                   check=False)
    assert p.returncode != 0 and "fleet.admission=false" in p.stderr
    p = chart.helm("template", "x", chart.CHART, "--set", "fleet.leaseSeconds=1", check=False)
    assert p.returncode != 0 and "leaseSeconds" in p.stderr


@pytest.mark.slow
def test_distributions_point_both_containers_at_their_containerd():
    """Each distribution's socket is one the image reader itself looks for (images/stores), and the agent
    mounts its directory and the distribution's snapshotter root; an explicit value wins."""
    from compat_hook.images.stores import CONTAINERD_SOCKETS
    from tests.support import chart

    known = {path for path, _ in CONTAINERD_SOCKETS}
    seen = {}
    for dist in ("containerd", "k3s", "rke2", "microk8s"):
        docs = chart.render(f"containerd.distribution={dist}")
        c = chart.containers(docs)
        [address] = [a[len("--address=/host"):] for a in c["agent"]["command"] if a.startswith("--address=")]
        assert address in known, (dist, address)
        host = {m: path for m, (path, _) in _host_mounts(docs, "agent").items()}
        assert host[f"/host{os.path.dirname(address)}"] == os.path.dirname(address)
        [snap] = [m for m in host if m.endswith("/io.containerd.snapshotter.v1.overlayfs")]
        config = {e["name"]: e["value"] for e in c["installer"]["env"]}["CONTAINERD_CONFIG"]
        seen[dist] = (address, snap, config)
    assert len({s for _, s, _ in seen.values()}) == 4 and len({c for _, _, c in seen.values()}) == 4
    assert seen["k3s"][0] == seen["rke2"][0] != seen["containerd"][0]  # k3s and RKE2 share /run/k3s
    docs = chart.render("containerd.socket=/run/other/containerd.sock", "containerd.root=/data/containerd/",
                        "containerd.snapshotters={overlayfs,native}")
    host = {m: path for m, (path, _) in _host_mounts(docs, "agent").items()}
    assert host["/host/run/other"] == "/run/other"
    assert host["/host/data/containerd/io.containerd.snapshotter.v1.native"] == "/data/containerd/io.containerd.snapshotter.v1.native"
    # the values of before stay valid
    c = chart.containers(chart.render("agent.containerdSocket=/run/old/c.sock", "agent.containerdNamespace=other"))
    assert "--address=/host/run/old/c.sock" in c["agent"]["command"] and "--namespace=other" in c["agent"]["command"]


@pytest.mark.slow
def test_values_schema_rejects_what_the_chart_does_not_know():
    from tests.support import chart

    for bad, says in (("agent.gatee=true", "gatee"), ("registration.uninstallOnstop=true", "uninstallOnstop"),
                      ("agent.labelPrefix=Bad_Prefix", "labelPrefix"), ("containerd.distribution=k8s", "distribution"),
                      ("agent.gate=yes", "gate"), ("agent.tmpSizeLimit=500Mi", "tmpSizeLimit"),
                      ("admissionpolicy.enabled=false", "admissionpolicy"),
                      ("registration.path=wrapper", "at '/registration/path': value must be one of 'auto', 'nri'")):
        p = chart.helm("template", "x", chart.CHART, "--set", bad, check=False)
        assert p.returncode != 0 and says in p.stderr, (bad, p.stderr)
    p = chart.helm("template", "x", chart.CHART, "--set", "agent.tmpSizeLimit=4Gi", check=False)
    assert p.returncode != 0 and "at least 5Gi" in p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("bad, says", [
    (["validator.parallel=0"], ["validator/parallel"]),
    (["validator.probeTimeout=5"], ["validator/probeTimeout"]),
    (["validator.paralel=2"], ["paralel"]),
    (["agent.store=bogus:x"], ["agent/store", "bogus:x"]),
    (["agent.interval=0.5"], ["agent/interval"]),
    # several at once: each named, not the first only
    (["validator.parallel=0", "agent.store=bogus:x", "validator.deadline=1"],
     ["validator/parallel", "agent/store", "validator/deadline"]),
])
def test_values_the_command_line_refuses_are_refused_by_name(bad, says):
    """What the agent and the validator would refuse at their start (`--parallel 0`, `--store bogus:x`) is
    refused by `helm template`, naming each bad value; and by the templates too for values that skip the
    schema."""
    from tests.support import chart

    sets = [a for b in bad for a in ("--set", b)]
    p = chart.helm("template", "x", chart.CHART, *sets, check=False)
    assert p.returncode != 0 and all(s in p.stderr for s in says), (bad, p.stderr)
    assert "'not' failed" not in p.stderr and "Traceback" not in p.stderr
    if "paralel" in bad[0]:
        return
    p = chart.helm("template", "x", chart.CHART, *sets, "--skip-schema-validation", check=False)
    names = [b.split("=")[0] for b in bad]
    assert p.returncode != 0 and all(f"{n}=" in p.stderr for n in names), (bad, p.stderr)


@pytest.mark.slow
def test_agent_tmp_holds_the_readers_whole_spool():
    """The emptyDir's sizeLimit is above the image reader's spool cap (its own Limits), so a full spool
    is an error for that image, never an eviction."""
    from compat_hook.images.reader import Limits
    from tests.support import chart

    [tmp] = [v for v in chart.daemonset(chart.render())["spec"]["template"]["spec"]["volumes"] if v["name"] == "agent-tmp"]
    limit = tmp["emptyDir"]["sizeLimit"]
    assert limit.endswith("Gi")
    assert int(limit[:-2]) << 30 >= Limits.max_spool_bytes + (512 << 20)


def test_a_full_spool_is_an_error_for_that_image(tmp_path):
    """The image reader's spool (the agent's /tmp) is bounded by the reader itself: an image whose compat
    driver does not fit in what is left is an error row, not a guess without its driver, and what
    is on disk never passes the bound; the next image that fits is read."""
    from compat_hook.core.config import defaults
    from compat_hook.images.reader import Limits, Reader
    from compat_hook.policy import preflight
    from tests.support import hookenv
    from tests.support.images import Layout, gz, tar_layer

    bound = 1 << 20
    lay = Layout(tmp_path / "lay")
    for tag, size in (("big", 3 << 20), ("small", 200 << 10)):
        lib = b"\x7fELF" + bytes(range(256)) * (size // 256)
        lay.tag(lay.image([gz(tar_layer([
            ("dir", "usr"), ("dir", "usr/local"), ("dir", "usr/local/cuda"), ("dir", "usr/local/cuda/compat"),
            ("file", "usr/local/cuda/compat/libcuda.so.550.54.15", lib),
            ("symlink", "usr/local/cuda/compat/libcuda.so.1", "libcuda.so.550.54.15")]))],
            env=["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=all"]), tag)
    spool = tmp_path / "tmp"
    spool.mkdir()
    reader = Reader(Limits(max_spool_bytes=bound), tmp_dir=str(spool))
    used = []

    def opener(src, _config):
        img = reader.open(src)
        used.append(sum(f.stat().st_blocks * 512 for f in spool.rglob("*") if f.is_file()))
        return img

    host = hookenv.fake_host(tmp_path / "host", "535.183.01")
    try:
        report = preflight.plan(defaults().replace(host_root=str(host)), [f"oci:{lay.path}:big", f"oci:{lay.path}:small"],
                                driver="580.65.06", opener=opener, expander=lambda s: [s])
        on_disk = sum(f.stat().st_blocks * 512 for f in spool.rglob("*") if f.is_file())
    finally:
        reader.close()
    big, small = report["images"]
    assert "spool" in big["error"] and "this image is not read" in big["error"], big
    assert big.get("now") is None and report["summary"]["unreadable"] == 1
    assert small.get("error") is None and small["now"]["reason"] != "candidate_unreadable", small
    assert max(used + [on_disk]) <= bound, (used, on_disk)


# --------------------------------------------------------------------------- the image


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("k8s-image")
    _run(["make", "-C", REPO, "deb", f"DEB_OUT={out}", "PY=/usr/bin/python3"])
    deb = out / f"compat-hook_{VERSION}_all.deb"
    layout, tar = out / "layout", out / "image.tar"
    from tests.support.kubebuild import nri_plugin

    p = _run([REPO / "packaging/oci-image/build-image.sh", "--deb", deb, "--layout", layout, "--tar", tar,
              "--nri-plugin", nri_plugin()])
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


NRI_INSIDE = r"""
set -eu
N={node}
mount --bind /usr "$N/usr"
mount -o remount,bind,ro "$N/usr"
mount --rbind /dev "$N/dev"
step() {{ echo "=== $1"; }}
# the installer's state on the node, so that one run's outlives its container
PM="{podman_run} -v $N:/host -e TOOLKIT_CONFIGS= -e TOOLKIT_STATE=/host/state/tk -e READY_FILE=/host/state/ready
    -e PATH_FILE=/host/state/registration"
mkdir -p "$N/state"
step one-six-nri
$PM -e REGISTRATION_PATH=nri {image} compat-hook-k8s install 2>&1 && echo "exit=0" || echo "exit=$?"
step one-six-auto
$PM -e REGISTRATION_PATH=auto {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
cat "$N/state/registration"
# containerd 2.1.9 as the node's containerd, with its own (version 3) config
mount --bind {containerd2} "$N/usr/bin/containerd"
printf '%s' "$V3" > "$N/etc/containerd/config.toml"
step two-auto
$PM -e REGISTRATION_PATH=auto -e RESTART_CONTAINERD=true -e 'RESTART_COMMAND=echo restarted >> /host/restarted' \
    {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
cat "$N/state/registration"
mkdir "$N/../snap" && cp -a "$N/opt/nri/plugins/90-compat-hook" "$N/etc/nri/conf.d/90-compat-hook.conf" \
    "$N/etc/containerd/config.toml" "$N/../snap/" && cp -a "$N"/opt/compat-hook/*/libexec/compat-hook-nri "$N/../snap/"
step two-again
$PM -e REGISTRATION_PATH=auto {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
step gone
rm "$N/opt/nri/plugins/90-compat-hook"
$PM -e REGISTRATION_PATH=auto -e TOOLKIT_RECHECK=1 {image} /bin/busybox timeout 5 compat-hook-k8s watch 2>&1 || true
cat "$N/state/registration"
step forced-runtimeclass
$PM -e REGISTRATION_PATH=runtimeclass {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
cat "$N/state/registration"
ls "$N/etc/nri/conf.d" 2>&1 || true
step two-nri
$PM -e REGISTRATION_PATH=nri {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
step uninstall
$PM -e UNINSTALL_ON_STOP=true -e RESTART_CONTAINERD=true -e 'RESTART_COMMAND=echo restarted >> /host/restarted' \
    {image} compat-hook-k8s uninstall 2>&1 || echo "exit=$?"
ls -A "$N/state"
step end
"""


@pytest.mark.containers
def test_installer_picks_nri_on_containerd_2_and_the_runtimeclass_on_1_6(image, tmp_path):
    """registration.path (REGISTRATION_PATH) on a fake node: Debian's containerd 1.6 has no NRI (nri is
    refused with one line, auto falls back and says why); the same node with containerd 2.1.9 gets the
    NRI plugin from the image's payload (auto) besides the runtime, and the installer reports it gone once
    it is; a forced runtimeclass removes it; uninstall removes it and what the agent reads."""
    from tests.support.engines import containerd2

    node = _fake_node(tmp_path)
    v3 = "version = 3\n"
    pm = start_podman(tmp_path / "pm", image["tar"])
    try:
        podman_run = " ".join(shlex.quote(str(a)) for a in pm.argv("run", "--rm", *RUN_FLAGS))
        script = tmp_path / "inside.sh"
        script.write_text(NRI_INSIDE.format(node=shlex.quote(str(node)), podman_run=podman_run,
                                            image="localhost/compat-hook-test:latest",
                                            containerd2=shlex.quote(str(containerd2() / "containerd"))))
        p = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script], check=False, timeout=300,
                 env=dict(ENV, V3=v3))
    finally:
        pm.reset()
    out = _sections(p.stdout)
    assert p.returncode == 0 and "end" in out, p.stdout + p.stderr
    assert "exit=1" in out["one-six-nri"] and "REGISTRATION_PATH=nri: containerd 1.6 has no NRI" in out["one-six-nri"]
    assert "registration: the RuntimeClass path (auto: containerd 1.6 has no NRI (1.7 and later))" \
        in out["one-six-auto"], out["one-six-auto"]
    assert out["one-six-auto"].strip().endswith("runtimeclass"), out["one-six-auto"]
    two = out["two-auto"]
    assert "exit=" not in two and two.strip().endswith("nri"), two
    assert "restarting containerd" in two, two  # the plugin is new: containerd starts it at its start
    snap = tmp_path / "snap"  # the node's files right after that install
    plugin = snap / "90-compat-hook"
    conf = json.loads((snap / "90-compat-hook.conf").read_text())
    assert os.access(plugin, os.X_OK) and plugin.read_bytes() == (snap / "compat-hook-nri").read_bytes()
    assert conf["hook"]["args"][-2:] == ["--via", "nri"] and "/opt/compat-hook/" in " ".join(conf["hook"]["args"])
    assert str(tmp_path) not in json.dumps(conf)
    # the runtime the RuntimeClass names is registered too, for pods that name it (containerd 2.x: a drop-in)
    assert "ready: NRI plugin 90-compat-hook and runtime 'cuda-compat'" in two, two
    plugin = node / "opt/nri/plugins/90-compat-hook"
    assert "nothing changed" in out["two-again"] and "restarting" not in out["two-again"], out["two-again"]
    assert out["gone"].strip().endswith("nri-not-connected"), out["gone"]
    assert "the NRI plugin /opt/nri/plugins/90-compat-hook is gone" in out["gone"], out["gone"]
    rc = out["forced-runtimeclass"]
    assert "exit=" not in rc and "removed /etc/nri/conf.d/90-compat-hook.conf" in rc, rc
    assert "ready: runtime 'cuda-compat'" in rc and "runtimeclass\n" in rc, rc
    assert "exit=" not in out["two-nri"] and "wrote /opt/nri/plugins/90-compat-hook" in out["two-nri"], out["two-nri"]
    un = out["uninstall"]
    assert "exit=" not in un and "removed /opt/nri/plugins/90-compat-hook" in un, un
    assert not plugin.exists() and not (node / "etc/nri").exists() and not (node / "opt/nri").exists()
    assert not (node / "state/registration").exists()  # what the agent reads went too


TOOLKIT_ENV_INSIDE = r"""
set -eu
N={node}
mount --bind /usr "$N/usr"
mount -o remount,bind,ro "$N/usr"
mount --rbind /dev "$N/dev"
# the operator's toolkit dir, under the node's /usr/local (this machine's /usr is the node's /usr)
mount -t tmpfs tmpfs "$N/usr/local"
mkdir -p "$(dirname "$N{operator}")"
printf '%s' "$WITHOUT" > "$N{operator}"
export INSTALL_ARGS="--toolkit-config none"
PM="{podman_run} -v $N:/host -e TOOLKIT_CONFIGS= -e TOOLKIT_EXPECT={operator} -e INSTALL_ARGS"
echo "=== without"
$PM {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
md5sum < "$N{operator}"
printf '%s' "$WITH" > "$N{operator}"
echo "=== with"
$PM {image} compat-hook-k8s install 2>&1 || echo "exit=$?"
md5sum < "$N{operator}"
echo "=== run"
$PM -e TOOLKIT_RECHECK=1 {image} /bin/busybox timeout 6 compat-hook-k8s run 2>&1 || true
echo "=== end"
"""


@pytest.mark.containers
def test_installer_leaves_the_operators_toolkit_config_to_the_clusterpolicy(image, tmp_path):
    """gpuOperator.toolkitEnv=true (the chart's env for it): the GPU Operator's toolkit config.toml is
    neither registered nor watched, only checked, and the install says whether it runs the wrapper."""
    from tests.support import chart

    env = {e["name"]: e["value"] for e in chart.containers(chart.render("gpuOperator.toolkitEnv=true"))
           ["installer"]["env"]}
    operator = env["TOOLKIT_EXPECT"]
    node = _fake_node(tmp_path)
    without = '[nvidia-container-runtime]\n  runtimes = ["docker-runc", "runc", "crun"]\n'
    with_ = '[nvidia-container-runtime]\n  runtimes = ["/opt/compat-hook/bin/compat-hook-runtime", "runc", "crun"]\n'
    pm = start_podman(tmp_path / "pm", image["tar"])
    try:
        podman_run = " ".join(shlex.quote(str(a)) for a in pm.argv("run", "--rm", *RUN_FLAGS))
        script = tmp_path / "inside.sh"
        script.write_text(TOOLKIT_ENV_INSIDE.format(node=shlex.quote(str(node)), podman_run=podman_run,
                                                    operator=operator, image="localhost/compat-hook-test:latest"))
        p = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script], check=False, timeout=300,
                 env=dict(ENV, WITHOUT=without, WITH=with_))
    finally:
        pm.reset()
    out = _sections(p.stdout)
    assert p.returncode == 0 and "end" in out, p.stdout + p.stderr
    md5 = lambda text: hashlib.md5(text.encode()).hexdigest()  # noqa: E731
    assert "exit=" not in out["without"] and "ready: runtime 'cuda-compat'" in out["without"], out["without"]
    assert f"warning: {operator} does not run /opt/compat-hook/bin/compat-hook-runtime first" in out["without"]
    assert out["without"].split()[-2] == md5(without)  # untouched
    assert f"{operator} runs /opt/compat-hook/bin/compat-hook-runtime first" in out["with"], out["with"]
    assert out["with"].split()[-2] == md5(with_)
    assert "registered under the NVIDIA toolkit" not in p.stdout
    # `run` without a watcher: it polls every TOOLKIT_RECHECK seconds and says nothing while nothing changes
    assert "ready: runtime 'cuda-compat'" in out["run"] and "watcher" not in out["run"], out["run"]
    assert out["run"].count("runs /opt/compat-hook/bin/compat-hook-runtime first") == 1, out["run"]


# --------------------------------------------------------------------------- the agent, from the image

AGENT_INSIDE = r"""
set -eu
R={rootfs} N={node}
# the node: containerd's socket where the chart looks for it, its snapshotter's dir at its own path
mkdir -p "$N/run/containerd" "$N{snapshots}" && : > "$N/run/containerd/containerd.sock"
mount --bind {sock} "$N/run/containerd/containerd.sock"
mount --bind "{snapshots}" "$N{snapshots}"
# the pod: the image's rootfs read-only; /host empty but for the chart's host mounts (read-only as
# the chart says); the chart's config, a tmpfs /tmp (emptyDir), /proc and /dev as the runtime gives them
mount --bind "$R" "$R"
mkdir -p "$R/host" && mount -t tmpfs -o mode=755 tmpfs "$R/host"
{host_mounts}
mount --bind {config_dir} "$R/etc/compat-hook-agent"
mount -t tmpfs tmpfs "$R/tmp"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -o remount,bind,ro "$R"
# no capability (the container drops ALL; chroot keeps its own to get in), no new privileges
exec setpriv --no-new-privs --bounding-set=-all,+sys_chroot --inh-caps=-all --ambient-caps=-all \
    chroot "$R" /bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ /bin/sh -c \
    'grep ^CapEff: /proc/self/status; echo "host: $(ls /host | tr "\n" " ")"; exec "$@"' sh "$@"
"""


def _mount_lines(docs: list, node: pathlib.Path) -> str:
    """The agent container's hostPath mounts as bind mounts of the fake node's paths into ``$R``."""
    lines = []
    for mount_path, (host_path, m) in _host_mounts(docs, "agent").items():
        src = shlex.quote(f"{node}{host_path}")
        lines += [f"mkdir -p {src} \"$R{mount_path}\"", f"mount --rbind {src} \"$R{mount_path}\""]
        if m.get("readOnly"):
            lines.append(f"mount -o remount,bind,ro \"$R{mount_path}\"")
    return "\n".join(lines)


@pytest.mark.containers
@pytest.mark.slow
def test_agent_runs_from_the_image_with_only_the_charts_mounts(image, tmp_path):
    """The shipped image runs the agent as the chart does: its python3 and ctr, the chart's config
    (host_root /host) and command, no capability, and under /host nothing of the node but the chart's
    host mounts (the driver's /proc entries, containerd's socket dir, the snapshotter's dir), rendered
    for this node's containerd root. From there `compat-hook plan` reads the node's images from the
    snapshots (the layer blob is removed from the content store, so nothing else could read it), and an
    image whose directory only its owner may read is an unreadable row, not a guess; then the agent,
    against a real API server, reads the pod's image and publishes."""
    import tempfile

    from tests.support import chart, engines, hookenv
    from tests.support.images import Layout, gz, tar_layer
    from tests.support.kube import ADMIN_TOKEN, ControlPlane

    host_535, target = "535.261.03", "555.58.02"
    _run(["umoci", "unpack", "--image", f"{image['layout']}:{VERSION}", tmp_path / "b"])
    rootfs = tmp_path / "b" / "rootfs"
    for d in ("etc/compat-hook-agent", "var/lib/compat-hook-agent"):
        (rootfs / d).mkdir(parents=True)
    short = pathlib.Path(tempfile.mkdtemp(prefix="chag", dir="/tmp"))  # socket paths stay < 108 bytes
    d = engines.Containerd(short / "d", pause_image="localhost/none:pause")
    snapshots = d.work / "root" / "io.containerd.snapshotter.v1.overlayfs"
    docs = chart.render(f"containerd.root={d.work / 'root'}")
    [agent] = [c for c in chart.containers(docs).values() if c["name"] == "agent"]
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    [cm] = [x for x in docs if x["kind"] == "ConfigMap"]
    (config_dir / "config.yaml").write_text(cm["data"]["config.yaml"])

    # the node: a host driver (535, an H100), its containerd with a CUDA 12.4 image, unpacked, and one
    # whose /usr/local/cuda only uid 1000 may enter; files the agent must never see
    node = hookenv.fake_host(tmp_path / "node", host_535)
    info = node / "proc/driver/nvidia/gpus/0000:17:00.0/information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t 0000:17:00.0\n")
    (node / "etc").mkdir(exist_ok=True)
    (node / "etc/canary").write_text("the node's own file\n")
    lay = Layout(tmp_path / "app")
    layer = gz(tar_layer([("dir", "etc"), ("file", "etc/os-release", b"ID=debian\n")]))
    lay.tag(lay.image([layer], env=["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=all"]), "agent")
    locked_img = Layout(tmp_path / "locked")
    owner_only = tarfile.TarInfo("usr/local/cuda")
    owner_only.type, owner_only.mode, owner_only.uid, owner_only.gid = tarfile.DIRTYPE, 0o700, 1000, 1000
    locked_img.tag(locked_img.image([gz(tar_layer([
        ("dir", "usr"), ("dir", "usr/local"), ("info", "usr/local/cuda", owner_only), ("dir", "usr/local/cuda/compat"),
        ("file", "usr/local/cuda/compat/libcuda.so.550.54.15", b"\x7fELF not really"),
        ("symlink", "usr/local/cuda/compat/libcuda.so.1", "libcuda.so.550.54.15")]))],
        env=["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=all"]), "agent")
    cp = ControlPlane(tmp_path / "cp")
    plan = meta = None
    try:
        d.start(host_535)
        d.ctr("-n", "k8s.io", "images", "import", "--base-name", "localhost/app", lay.tar(tmp_path / "app.tar"))
        d.ctr("-n", "k8s.io", "images", "import", "--base-name", "localhost/locked", locked_img.tar(tmp_path / "l.tar"))
        blob = "sha256:" + hashlib.sha256(layer).hexdigest()
        d.ctr("-n", "k8s.io", "content", "rm", blob)
        assert blob not in d.ctr("-n", "k8s.io", "content", "ls", "-q").stdout.split()

        script = tmp_path / "agent.sh"
        script.write_text(AGENT_INSIDE.format(
            rootfs=shlex.quote(str(rootfs)), node=shlex.quote(str(node)), snapshots=snapshots,
            sock=shlex.quote(str(d.sock)), config_dir=config_dir, host_mounts=_mount_lines(docs, node)))

        def inside(*argv):
            return _run(["unshare", "-m", "--propagation", "private", "/bin/sh", script, *argv], check=False,
                        timeout=300)

        address = [a for a in agent["command"] if a.startswith("--address=")]
        p = inside("compat-hook", "plan", "containerd:", "--driver", target, "--json", *address,
                   "--config=/etc/compat-hook-agent/config.yaml")
        lines = p.stdout.splitlines()
        caps, seen = int(lines[0].split()[1], 16), lines[1]
        plan = json.loads("\n".join(lines[2:]))

        cp.start()  # (the agent's RBAC and admission are tests/test_admission.py's: here it is the admin)
        cp.admin.create("/api/v1/nodes", {"metadata": {"name": "gpu-img", "labels": {
            "nvidia.com/gpu.present": "true", "nvidia.com/cuda.driver-version.full": host_535}}})
        cp.admin.create("/api/v1/namespaces/apps/pods", {"metadata": {"name": "app"}, "spec": {
            "nodeName": "gpu-img", "containers": [{"name": "main", "image": "localhost/app:agent",
                                                   "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        cp.admin.create("/apis/nvidia.com/v1/clusterpolicies", {
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {"driver": {"version": target}}})
        (config_dir / "kubeconfig").write_text(cp.kubeconfig(ADMIN_TOKEN, "admin").read_text())
        argv = [a.replace("$(NODE_NAME)", "gpu-img") for a in agent["command"]]
        argv += ["--once", "--kubeconfig=/etc/compat-hook-agent/kubeconfig"]
        a = inside(*argv)
        assert a.returncode == 0, a.stdout + a.stderr
        result = [json.loads(ln) for ln in a.stdout.splitlines() if ln.startswith("{")][-1]
        meta = cp.admin.get("/api/v1/nodes/gpu-img")["metadata"]
    finally:
        cp.stop()
        left = d.stop()
        shutil.rmtree(short, ignore_errors=True)
    assert left == {"processes": [], "mounts": []}, left
    # no DAC_OVERRIDE (1), no DAC_READ_SEARCH (2), nothing but chroot's own (18)
    assert caps & ~(1 << 18) == 0, hex(caps)
    tops = sorted({m.split("/")[2] for m in _host_mounts(docs, "agent") if m.startswith("/host/")})
    assert seen.split()[1:] == tops and "etc" not in tops, seen  # the node's root is not there
    rows = {r["image"].split(":")[1].rsplit("/", 1)[-1]: r for r in plan["images"]}
    assert plan["driver"]["now"] == host_535 and set(rows) == {"app", "locked"}, plan
    assert rows["app"]["read_via"] == "snapshot" and rows["app"].get("error") is None, rows["app"]
    assert "permission denied" in (rows["locked"].get("error") or ""), rows["locked"]
    assert plan["summary"]["unreadable"] == 1
    # the agent: the pod's image read from the snapshot through the same mounts, and published
    assert result["target"] == target and result["problem"] is None, result
    assert meta["labels"]["compat-hook.io/preflight.target-driver"] == target
    assert meta["labels"]["compat-hook.io/preflight"] in ("pass", "warn"), meta["labels"]  # read: not unknown
    assert any((node / "var/lib/compat-hook-agent").iterdir()), "the agent keeps its last result in its state dir"


@pytest.mark.slow
def test_notes_name_the_release_namespace():
    """NOTES' commands run against the release's own namespace (`cluster status` reads the agents' Leases
    there), and say what `helm uninstall` removes."""
    from tests.support import chart

    for ns, flag in (("gpu-ops", " --publish-namespace gpu-ops"), ("compat-hook", "")):
        p = chart.helm("install", "compat-hook", chart.CHART, "--namespace", ns, "--dry-run=client")
        notes = p.stdout[p.stdout.index("NOTES:"):]
        assert f"compat-hook cluster status{flag}   " in notes, notes
        assert f"kubectl -n {ns} rollout status ds/compat-hook" in notes, notes
        assert "every other compat-hook.io/ key and the agents' Leases and ConfigMaps" in notes, notes
