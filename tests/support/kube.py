"""A real Kubernetes control plane for the cluster tests: etcd + kube-apiserver + kwok.

* etcd is Debian's ``etcd-server``; kube-apiserver is built from the ``k8s.io/kubernetes``
  module (:mod:`tests.support.kubebuild`). Both listen on loopback ports, the API server with a
  static token file and ``--authorization-mode=RBAC``; they are stopped by pid.
* :class:`Api` is the tests' own small REST client (urllib, bearer token, no TLS verification
  of the self-signed serving certificate): it plays the operator, the scheduler and kubectl,
  never the code under test.
* ClusterPolicy and NVIDIADriver CRDs are created from minimal schemas written here.
* kwok plays the kubelets: nodes annotated ``kwok.x-k8s.io/node: fake`` stay Ready and pods bound
  to them go Running (and deleted pods go away). A test that needs another pod lifecycle (pods that
  run for a while, fail, stop when deleted) gives :meth:`ControlPlane.start_kwok` its own pod stages.
* No kube-controller-manager runs unless a test asks for one (:meth:`ControlPlane.start_controller_manager`,
  with only the controllers it names): a StatefulSet or a Job then gets its pods from the real
  controllers. Without it, nothing acts on them (the upgrade harness plays the DaemonSet controller).
* :class:`FaultProxy` stands between a client and the API server and answers chosen requests with an
  error (a 500, a 404) while it passes the rest through, watches included: an API server that fails
  some requests and not others.
* :func:`clients`: the Python interpreters the cluster commands are run with - Debian's, with its
  python3-kubernetes, and a venv under the test cache with the newest ``kubernetes`` from PyPI.
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
RELEASE_TOKEN = "release-token-compat-hook-tests"
AGENT_USER = "system:serviceaccount:compat-hook:compat-hook"
RELEASE_USER = "system:serviceaccount:compat-hook:compat-hook-release"
NAMESPACE = "gpu-operator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status
        self.body = body  # whole (a long admission message)


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

    #: Made at start (with their default ServiceAccount): the GPU Operator's, compat-hook's, the workloads'.
    NAMESPACES = ("default", NAMESPACE, "compat-hook", "apps")

    def __init__(self, work: Path) -> None:
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.etcd = self.apiserver = self.kwok_proc = self.harness_proc = self.cm = None
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
            f'{RELEASE_TOKEN},{RELEASE_USER},release-uid,"system:serviceaccounts"\n'
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
            f"--cert-dir={w / 'certs'}", "--service-cluster-ip-range=10.96.0.0/16", "--enable-priority-and-fairness=false",
            # v1.34 turns a watch from resourceVersion 0 (kwok's) into a watch-list stream, which needs
            # etcd's progress notifications (Debian's etcd 3.4 has none): each such watch ends in an
            # error at once, and kwok would see a change only at its next relist, up to 30 s later
            "--feature-gates=WatchList=false"]
        self.start_apiserver()
        for crd in CRDS:
            self.admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for plural, version in (("clusterpolicies", "v1"), ("nvidiadrivers", "v1alpha1")):
            self.admin.wait(f"CRD {plural}", lambda p=plural, v=version: self.admin.get(f"/apis/nvidia.com/{v}/{p}"))
        for ns in self.NAMESPACES:
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
        for p in (self.harness_proc, self.cm, self.kwok_proc, self.apiserver, self.etcd):
            _stop(p)

    def kubeconfig(self, token: str, name: str) -> Path:
        path = self.work / f"{name}.kubeconfig"
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
               "users": [{"name": name, "user": {"token": token}}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}]}
        path.write_text(json.dumps(doc))
        return path

    def start_kwok(self, pod_stages: list | None = None, node_lease_s: int | None = None) -> None:
        """kwok for the nodes annotated ``kwok.x-k8s.io/node: fake``, with its fast stages; ``pod_stages``
        (kwok ``Stage`` documents) replace the fast pod stages: a pod lifecycle of the test's own.
        ``node_lease_s``: it renews their Leases too, as a kubelet does: beside a kube-controller-manager,
        whose node lifecycle controller marks a node whose heartbeat is older than 50 s (kwok's status
        heartbeat comes every 20-45 s) NotReady and its pods not Ready, after which kwok's heartbeat stage
        no longer picks the node up."""
        kwok, stages = kubebuild.kwok()
        if pod_stages is not None:
            d = self.work / "kwok-stages"
            d.mkdir(exist_ok=True)
            stages = [s for s in stages if not s.name.startswith("pod-")]
            for doc in pod_stages:
                f = d / f"{doc['metadata']['name']}.json"
                f.write_text(json.dumps(doc))  # YAML's superset: kwok reads it as its YAML config
                stages.append(f)
        argv = [kwok, "--kubeconfig", self.kubeconfig(ADMIN_TOKEN, "admin"), "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--cidr=10.0.0.1/24",
                "--node-ip=10.0.0.1"]
        if node_lease_s:
            argv.append(f"--node-lease-duration-seconds={node_lease_s}")
        for s in stages:
            argv += ["--config", s]
        self.kwok_proc = _spawn(argv, self.work / "kwok.log")

    def start_controller_manager(self, controllers=("*",), extra=()) -> None:
        """kube-controller-manager v1.34 (the cached build) as admin, without leader election, running
        only ``controllers`` (its ``--controllers`` names: ``job-controller``, ``statefulset-controller``;
        ``*``: its defaults). ``extra``: more flags (the keys a token or root-CA controller needs).
        Returns once its /healthz answers ok."""
        port = free_port()
        self.cm = _spawn([kubebuild.kube_controller_manager(), f"--kubeconfig={self.kubeconfig(ADMIN_TOKEN, 'admin')}",
                          f"--controllers={','.join(controllers)}", "--leader-elect=false",
                          "--use-service-account-credentials=false", f"--secure-port={port}",
                          "--bind-address=127.0.0.1", *extra], self.work / "controller-manager.log")
        probe = Api(f"https://127.0.0.1:{port}", ADMIN_TOKEN)

        def healthy():
            if self.cm.poll() is not None:
                raise AssertionError("kube-controller-manager exited:\n"
                                     + (self.work / "controller-manager.log").read_text()[-3000:])
            try:
                return probe.request("GET", "/healthz", timeout=5).get("text") == "ok"
            except (ApiError, OSError):
                return False

        self.admin.wait("kube-controller-manager /healthz", healthy, timeout=120, interval=0.5)

    def start_harness(self, interval: str = "500ms", *, validation: str | None = None,
                      daemonset_controller: bool = True) -> None:
        """NVIDIA's upgrade state machine, reconciling every ``interval`` (tests/upgrade_harness).

        ``validation``: the pod selector of its validation state (``WithValidationEnabled``; the GPU
        Operator passes ``app=nvidia-operator-validator``). ``daemonset_controller=False`` where a
        kube-controller-manager runs the driver DaemonSet (the harness then plays only the operator)."""
        argv = [kubebuild.upgrade_harness(), "--kubeconfig", self.kubeconfig(ADMIN_TOKEN, "admin"),
                "--namespace", NAMESPACE, "--interval", interval,
                f"--daemonset-controller={str(daemonset_controller).lower()}"]
        if validation:
            argv += ["--validation", validation]
        self.harness_proc = _spawn(argv, self.work / "harness.log")

    def stop_harness(self) -> None:
        _stop(self.harness_proc)
        self.harness_proc = None

    def api(self, token: str) -> Api:
        return Api(self.url, token)

    def metrics(self) -> dict:
        """``{(verb, resource): n}`` of ``apiserver_request_total`` (the API server's own count)."""
        text = self.admin.request("GET", "/metrics", timeout=30).get("text", "")
        out: dict = {}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            head, _, value = line.rpartition(" ")
            labels = dict(part.split("=", 1) for part in head[head.index("{") + 1:-1].split(",") if "=" in part)
            key = (labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"'))
            out[key] = out.get(key, 0) + int(float(value))
        return out


# ----------------------------------------------------------------------------- the Python clients

#: The newest ``kubernetes`` client from PyPI, in a venv of the test cache (made once, under a lock).
LATEST_VENV = "venv-k8s-latest"


def clients() -> dict:
    """``{"debian": interpreter, "latest": interpreter}``: Debian's python3 with its python3-kubernetes,
    and a venv with ``pip install kubernetes pyyaml pyelftools`` (the newest release)."""
    from tests.support.cache import cache_dir, locked

    venv = cache_dir() / LATEST_VENV
    py = venv / "bin" / "python"
    if not py.exists():
        with locked(LATEST_VENV):
            if not py.exists():
                subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, capture_output=True)
                p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "kubernetes", "pyyaml", "pyelftools"],
                                   capture_output=True, text=True, timeout=900)
                if p.returncode != 0:
                    import shutil

                    shutil.rmtree(venv, ignore_errors=True)
                    raise RuntimeError(f"pip install kubernetes: {p.stderr[-2000:]}")
    return {"debian": "/usr/bin/python3", "latest": str(py)}


def client_version(python: str) -> str:
    p = subprocess.run([python, "-c", "import kubernetes; print(kubernetes.__version__)"], capture_output=True,
                       text=True, timeout=60)
    return p.stdout.strip()


# ----------------------------------------------------------------------------- an API server that fails


class FaultProxy:
    """A plain-HTTP proxy on loopback in front of the API server (``url``): requests pass through (their
    bearer token included, answers streamed, watches too) unless a rule set with :meth:`fail` matches
    their method and path, which then get that HTTP status and a Status body."""

    def __init__(self, url: str) -> None:
        import http.server
        import re
        import threading

        self.upstream = urllib.parse.urlsplit(url)
        self.rules: list = []
        self.seen: list = []
        self.open: set = set()
        self._lock = threading.Lock()
        #: set: nothing more reaches the clients (answers held back, streams silent), as behind a
        #: half-open connection; cleared: it flows again
        self.frozen = threading.Event()
        proxy = self

        def hold() -> None:
            while proxy.frozen.is_set():
                time.sleep(0.05)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                path = self.path
                with proxy._lock:
                    proxy.seen.append((self.command, path))
                    rule = next((r for r in proxy.rules if r[0] in (self.command, "*") and re.search(r[1], path)), None)
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if rule is not None:
                    msg = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": rule[2],
                                      "message": f"injected by the test: {rule[2]}"}).encode()
                    self.send_response(rule[2])
                    if rule[3] is not None:
                        self.send_header("Retry-After", str(rule[3]))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                import http.client

                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                up = http.client.HTTPSConnection(proxy.upstream.hostname, proxy.upstream.port, context=ctx, timeout=3700)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                with proxy._lock:
                    proxy.open.add(self.connection)
                try:
                    up.request(self.command, path, body=body, headers=headers)
                    resp = up.getresponse()
                    hold()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while True:
                        data = resp.read1(65536)
                        if not data:
                            break
                        hold()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (OSError, http.client.HTTPException):  # either side gone (a cut, a closed stream)
                    self.close_connection = True
                finally:
                    up.close()
                    with proxy._lock:
                        proxy.open.discard(self.connection)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail(self, method: str, path_regex: str, status: int, retry_after: int | None = None) -> None:
        with self._lock:
            self.rules.append((method, path_regex, status, retry_after))

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def cut(self) -> None:
        """Break every request in flight (the watches): their clients see the connection drop."""
        import socket

        with self._lock:
            conns = list(self.open)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def kubeconfig(self, path: Path, token: str) -> Path:
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "proxy",
               "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
               "users": [{"name": "u", "user": {"token": token}}],
               "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "u"}}]}
        path.write_text(json.dumps(doc))
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
