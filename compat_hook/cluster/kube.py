"""The Kubernetes API as plain dicts, through the official ``kubernetes`` Python client.

Only ``compat-hook cluster ...`` imports this module (never the hook or the
wrapper). It uses the client for what it does well - kubeconfig and in-cluster
service-account loading, TLS, bearer tokens - and calls the REST paths
directly with ``ApiClient.call_api`` and ``_preload_content=False``: the
answers stay JSON dicts (no generated model objects, less memory and time),
and every call is counted (:attr:`Kube.calls`) so a pass can report its cost.

Errors are named: :class:`Unreachable` (no connection, a timeout, a 5xx),
:class:`Denied` (401/403), :class:`Conflict` (409, a stale resourceVersion),
:class:`NotFound` (404), :class:`KubeError` for the rest; each message is one line.
"""

from __future__ import annotations

import json

from ..core.errors import CompatHookError

__all__ = ["Kube", "KubeError", "Unreachable", "Denied", "Conflict", "NotFound", "connect", "FIELD_MANAGER"]

FIELD_MANAGER = "compat-hook"
#: (connect, read) seconds for one request: a pass must never hang on a dead API server.
TIMEOUT = (3.0, 15.0)
#: The largest answer read from the API server (a list of every pod on a big node stays far below).
MAX_BODY = 64 << 20


class KubeError(CompatHookError):
    """An API request that failed; ``status`` is the HTTP status (0: no answer)."""

    code = "cluster_api"

    def __init__(self, msg: str, status: int = 0) -> None:
        super().__init__(msg)
        self.status = status


class Unreachable(KubeError):
    """No answer, or the server could not answer (5xx)."""


class Denied(KubeError):
    """401 or 403: the credentials or their RBAC do not allow the request."""


class Conflict(KubeError):
    """409: the object changed since it was read."""


class NotFound(KubeError):
    """404."""


def _one_line(text: str, limit: int = 300) -> str:
    t = " ".join(str(text).split())
    return t if len(t) <= limit else t[:limit] + "..."


def _api_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return str(doc.get("message") or doc.get("reason") or "")
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


class Kube:
    """A connection: ``request(method, path, ...)`` returns the decoded JSON answer."""

    def __init__(self, api_client, where: str) -> None:
        self._api = api_client
        self.where = where
        self.calls = 0

    def request(self, method: str, path: str, *, query: dict | None = None, body=None,
                content_type: str = "application/json", timeout=TIMEOUT, count: bool = True) -> dict:
        from urllib3.exceptions import HTTPError

        from kubernetes.client.exceptions import ApiException

        self.calls += count
        what = f"{method} {path}"
        try:
            resp = self._api.call_api(
                path, method, query_params=sorted((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body, auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)
            raw = resp[0].read(MAX_BODY + 1) if isinstance(resp, tuple) else resp.read(MAX_BODY + 1)
        except ApiException as e:
            status = int(e.status or 0)
            msg = f"{what}: {status} {_one_line(_api_message(e.body or b'') or e.reason or '')}"
            cls = (Denied if status in (401, 403) else Conflict if status == 409 else NotFound if status == 404
                   else Unreachable if status >= 500 or status == 0 else KubeError)
            raise cls(msg, status) from None
        except (HTTPError, OSError) as e:
            raise Unreachable(f"{what}: {self.where} unreachable: {_one_line(e, 200)}") from None
        if len(raw) > MAX_BODY:
            raise KubeError(f"{what}: answer larger than {MAX_BODY} bytes")
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise KubeError(f"{what}: the answer is not JSON") from None

    def watch(self, path: str, resource_version: str, timeout_s: int):
        """Yield the events (``{"type", "object"}``) of a watch on ``path`` from ``resource_version``,
        until the server ends it after ``timeout_s``. Not counted in :attr:`calls` (it is not a pass's)."""
        from urllib3.exceptions import HTTPError

        from kubernetes.client.exceptions import ApiException

        query = [("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout_s)), ("watch", "true")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        try:
            resp = self._api.call_api(path, "GET", query_params=query, header_params={"Accept": "application/json"},
                                      auth_settings=["BearerToken"], _preload_content=False,
                                      _request_timeout=(TIMEOUT[0], timeout_s + 10))
            resp = resp[0] if isinstance(resp, tuple) else resp
            try:
                while True:
                    line = resp.readline(1 << 20)
                    if not line:
                        return
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(ev, dict):
                        yield ev
            finally:
                resp.release_conn()
        except ApiException as e:
            status = int(e.status or 0)
            cls = Denied if status in (401, 403) else NotFound if status == 404 else Unreachable
            raise cls(f"watch {path}: {status} {_one_line(e.reason or '')}", status) from None
        except (HTTPError, OSError) as e:
            raise Unreachable(f"watch {path}: {self.where} unreachable: {_one_line(e, 200)}") from None

    def get(self, path: str, **query) -> dict:
        return self.request("GET", path, query={k: v for k, v in query.items() if v is not None})

    def patch(self, path: str, patch: dict) -> dict:
        """A strategic-merge patch with field manager ``compat-hook`` (a ``metadata.resourceVersion``
        in ``patch`` makes it conditional: :class:`Conflict` when the object changed)."""
        return self.request("PATCH", path, query={"fieldManager": FIELD_MANAGER}, body=patch,
                            content_type="application/strategic-merge-patch+json")

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, query={"fieldManager": FIELD_MANAGER}, body=obj)

    def close(self) -> None:
        self._api.close()


def connect(kubeconfig: str | None = None, context: str | None = None) -> Kube:
    """In-cluster service-account config, or ``kubeconfig`` (also when not in a pod: ``$KUBECONFIG``)."""
    import os

    try:
        from kubernetes import client, config
    except ImportError:
        raise KubeError("the cluster commands need the Kubernetes client: install compat-hook[cluster] "
                        "(pip) or python3-kubernetes (Debian, Ubuntu)") from None
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            where = "the API server (in-cluster)"
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg,
                                    persist_config=False)
            where = f"the API server {cfg.host}"
    except (ConfigException, OSError, ValueError, TypeError) as e:
        src = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise KubeError(f"no cluster credentials ({src}): {_one_line(e, 200)}") from None
    if not cfg.verify_ssl:  # the kubeconfig asks for it (insecure-skip-tls-verify): said once there, not per request
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    cfg.retries = 0  # the agent retries with its own backoff; never stall a pass inside urllib3
    return Kube(client.ApiClient(cfg), where)
