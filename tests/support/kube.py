"""A real Kubernetes control plane for the cluster tests: etcd + kube-apiserver + kwok.

* etcd is Debian's ``etcd-server``; kube-apiserver is built from the ``k8s.io/kubernetes``
  module (:mod:`tests.support.kubebuild`). Both listen on loopback ports, the API server with a
  static token file and ``--authorization-mode=RBAC``; they are stopped by pid.
* :class:`Api` is the tests' own small REST client (urllib, bearer token, no TLS verification
  of the self-signed serving certificate): it plays the operator, the scheduler and kubectl,
  never the code under test.
* ClusterPolicy and NVIDIADriver CRDs are created from minimal schemas written here.
* kwok plays the kubelets: nodes annotated ``kwok.x-k8s.io/node: fake`` stay Ready and pods bound
  to them go Running (and deleted pods go away).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

from tests.support import kubebuild

Path = pathlib.Path
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}
ADMIN_TOKEN = "admin-token-compat-hook-tests"
AGENT_TOKEN = "agent-token-compat-hook-tests"
NOBODY_TOKEN = "nobody-token-compat-hook-tests"
AGENT_USER = "system:serviceaccount:compat-hook:compat-hook"
NAMESPACE = "gpu-operator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class Api:
    """method(path, body) -> dict, as user ``token``."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self._ctx = ssl.create_default_context()
        self._ctx.check_hostname = False
        self._ctx.verify_mode = ssl.CERT_NONE

    def request(self, method: str, path: str, body=None, *, content_type="application/json", query=None,
                timeout=30) -> dict:
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {"text": raw.decode(errors="replace")}

    def get(self, path: str, **query) -> dict:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, obj)

    def merge(self, path: str, patch: dict) -> dict:
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def delete(self, path: str, **query) -> dict:
        return self.request("DELETE", path, query=query or None)

    def apply(self, path: str, obj: dict, *, dry_run: bool = False, manager: str = "tests") -> dict:
        """Server-side apply of ``obj`` at its object path ``path``."""
        q = {"fieldManager": manager, "force": "true"}
        if dry_run:
            q["dryRun"] = "All"
        return self.request("PATCH", path, obj, content_type="application/apply-patch+yaml", query=q)

    def wait(self, what: str, fn, timeout: float = 60, interval: float = 0.25):
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            try:
                last = fn()
                if last:
                    return last
            except ApiError as e:
                last = e
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what}: last {last!r}")


def _spawn(argv: list, log: Path, env=None) -> subprocess.Popen:
    return subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, env=env or ENV, start_new_session=True)


def _stop(p: subprocess.Popen | None, timeout: float = 20) -> None:
    if p is None or p.poll() is not None:
        return
    os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


CRDS = [
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": "clusterpolicies.nvidia.com"},
     "spec": {"group": "nvidia.com", "scope": "Cluster",
              "names": {"plural": "clusterpolicies", "singular": "clusterpolicy", "kind": "ClusterPolicy",
                        "listKind": "ClusterPolicyList"},
              "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                            "schema": {"openAPIV3Schema": {"type": "object",
                                                           "x-kubernetes-preserve-unknown-fields": True}}}]}},
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": "nvidiadrivers.nvidia.com"},
     "spec": {"group": "nvidia.com", "scope": "Cluster",
              "names": {"plural": "nvidiadrivers", "singular": "nvidiadriver", "kind": "NVIDIADriver",
                        "listKind": "NVIDIADriverList"},
              "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                            "schema": {"openAPIV3Schema": {"type": "object",
                                                           "x-kubernetes-preserve-unknown-fields": True}}}]}},
]


class ControlPlane:
    """etcd + kube-apiserver under ``work``; :meth:`api` for a user, :meth:`kubeconfig` files."""

    def __init__(self, work: Path) -> None:
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.etcd = self.apiserver = self.kwok_proc = self.harness_proc = None
        self.etcd_port, self.peer_port, self.port = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.admin = Api(self.url, ADMIN_TOKEN)

    # ------------------------------------------------------------------ processes

    def start(self) -> "ControlPlane":
        apiserver = kubebuild.kube_apiserver()
        w = self.work
        subprocess.run(["openssl", "genrsa", "-out", w / "sa.key", "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", w / "sa.key", "-pubout", "-out", w / "sa.pub"], check=True,
                       capture_output=True)
        (w / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},admin,admin,"system:masters"\n'
            f'{AGENT_TOKEN},{AGENT_USER},agent-uid,"system:serviceaccounts"\n'
            f"{NOBODY_TOKEN},nobody,nobody-uid\n")
        self.etcd = _spawn(["etcd", "--data-dir", w / "etcd", "--listen-client-urls",
                            f"http://127.0.0.1:{self.etcd_port}", "--advertise-client-urls",
                            f"http://127.0.0.1:{self.etcd_port}", "--listen-peer-urls",
                            f"http://127.0.0.1:{self.peer_port}", "--initial-advertise-peer-urls",
                            f"http://127.0.0.1:{self.peer_port}", "--initial-cluster",
                            f"default=http://127.0.0.1:{self.peer_port}"], w / "etcd.log")
        self._apiserver_argv = [
            apiserver, f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={w / 'sa.pub'}",
            f"--service-account-signing-key-file={w / 'sa.key'}", f"--token-auth-file={w / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={w / 'certs'}", "--service-cluster-ip-range=10.96.0.0/16", "--enable-priority-and-fairness=false"]
        self.start_apiserver()
        for crd in CRDS:
            self.admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for plural, version in (("clusterpolicies", "v1"), ("nvidiadrivers", "v1alpha1")):
            self.admin.wait(f"CRD {plural}", lambda p=plural, v=version: self.admin.get(f"/apis/nvidia.com/{v}/{p}"))
        for ns in ("default", NAMESPACE, "compat-hook", "apps"):
            try:
                self.admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})
            except ApiError as e:
                if e.status != 409:
                    raise
            # no controller-manager: a pod is refused until its namespace's default ServiceAccount exists
            self.admin.wait(f"namespace {ns}", lambda n=ns: self._default_sa(n))
        return self

    def _default_sa(self, ns: str) -> bool:
        try:
            self.admin.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})
        except ApiError as e:
            if e.status != 409:
                raise
        return True

    def start_apiserver(self) -> None:
        self.apiserver = _spawn(self._apiserver_argv, self.work / "apiserver.log")

        def ready():
            if self.apiserver.poll() is not None:
                raise AssertionError("kube-apiserver exited:\n" + (self.work / "apiserver.log").read_text()[-3000:])
            try:
                return self.admin.request("GET", "/readyz", timeout=5).get("text") == "ok"
            except (ApiError, OSError):
                return False

        self.admin.wait("kube-apiserver /readyz", ready, timeout=120, interval=0.5)

    def stop_apiserver(self) -> None:
        _stop(self.apiserver)

    def stop(self) -> None:
        for p in (self.harness_proc, self.kwok_proc, self.apiserver, self.etcd):
            _stop(p)

    def kubeconfig(self, token: str, name: str) -> Path:
        path = self.work / f"{name}.kubeconfig"
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
               "users": [{"name": name, "user": {"token": token}}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}]}
        path.write_text(json.dumps(doc))
        return path

    def start_kwok(self) -> None:
        kwok, stages = kubebuild.kwok()
        argv = [kwok, "--kubeconfig", self.kubeconfig(ADMIN_TOKEN, "admin"), "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--cidr=10.0.0.1/24",
                "--node-ip=10.0.0.1"]
        for s in stages:
            argv += ["--config", s]
        self.kwok_proc = _spawn(argv, self.work / "kwok.log")

    def start_harness(self, interval: str = "500ms") -> None:
        """NVIDIA's upgrade state machine, reconciling every ``interval`` (tests/upgrade_harness)."""
        self.harness_proc = _spawn([kubebuild.upgrade_harness(), "--kubeconfig",
                                    self.kubeconfig(ADMIN_TOKEN, "admin"), "--namespace", NAMESPACE,
                                    "--interval", interval], self.work / "harness.log")

    def stop_harness(self) -> None:
        _stop(self.harness_proc)
        self.harness_proc = None

    def api(self, token: str) -> Api:
        return Api(self.url, token)
