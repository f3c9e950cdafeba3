"""The Helm chart (packaging/helm/compat-hook) as the tests render and apply it.

* :func:`helm` runs the cached helm (:func:`tests.support.kubebuild.helm`) with a private HOME and
  no repositories: ``helm template`` needs no cluster.
* :func:`render` is ``helm template`` of the chart with ``--set`` values, as a list of documents.
* :func:`object_path` is an object's REST path, for a server-side apply (:func:`apply`) or its
  dry run, the same request ``helm install`` (Helm 4: server-side apply) makes.
"""

from __future__ import annotations

import pathlib
import subprocess

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "packaging" / "helm" / "compat-hook"
RENDERED = REPO / "packaging" / "kubernetes" / "compat-hook.yaml"
RENDER_ARGS = ["template", "compat-hook", str(CHART), "--namespace", "compat-hook", "--no-hooks"]
RENDER_HEADER = ("# Rendered from packaging/helm/compat-hook; do not edit. Regenerate with:\n"
                 "#   helm template compat-hook packaging/helm/compat-hook --namespace compat-hook --no-hooks\n"
                 "# (the chart's pre-delete Job is a Helm hook, so it is not here: before\n"
                 "# `kubectl delete -f` of this file, run `compat-hook cluster release --all`)\n")

#: kind -> (API prefix, plural, namespaced)
KINDS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "RuntimeClass": ("/apis/node.k8s.io/v1", "runtimeclasses", False),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "ValidatingAdmissionPolicy": ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("/apis/admissionregistration.k8s.io/v1",
                                         "validatingadmissionpolicybindings", False),
}


def helm(*args, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    import tempfile

    from tests.support import kubebuild

    # a HOME of its own: with a cluster, the Kubernetes client caches discovery under $HOME/.kube
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        base = {"PATH": "/usr/bin:/bin", "HOME": home, "HELM_CACHE_HOME": f"{home}/cache",
                "HELM_CONFIG_HOME": f"{home}/config", "HELM_DATA_HOME": f"{home}/data"}
        p = subprocess.run([str(kubebuild.helm()), *map(str, args)], capture_output=True, text=True, timeout=180,
                           env=dict(base, **(env or {})), stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"helm {' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def render(*values: str, namespace: str = "compat-hook") -> list:
    """``helm template`` of the chart; ``values`` are ``key=value`` strings for ``--set``."""
    args = ["template", "compat-hook", CHART, "--namespace", namespace]
    for v in values:
        args += ["--set", v]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_key(docs: list) -> dict:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def object_path(d: dict) -> str:
    prefix, plural, namespaced = KINDS[d["kind"]]
    name = d["metadata"]["name"]
    if namespaced:
        return f"{prefix}/namespaces/{d['metadata']['namespace']}/{plural}/{name}"
    return f"{prefix}/{plural}/{name}"


def apply(api, docs: list, *, dry_run: bool = False) -> None:
    """Server-side apply of every document (strict field validation: an unknown field fails)."""
    for d in docs:
        query = {"fieldManager": "chart-test", "fieldValidation": "Strict", "force": "true"}
        if dry_run:
            query["dryRun"] = "All"
        api.request("PATCH", object_path(d), d, content_type="application/apply-patch+yaml", query=query)


def daemonset(docs: list, name: str = "compat-hook") -> dict:
    """The DaemonSet ``name``: the installer's and the agent's by default (the validator has its own)."""
    [ds] = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == name]
    return ds


def containers(docs: list, name: str = "compat-hook") -> dict:
    """The containers of DaemonSet ``name`` (:func:`daemonset`), by name."""
    return {c["name"]: c for c in daemonset(docs, name)["spec"]["template"]["spec"]["containers"]}
