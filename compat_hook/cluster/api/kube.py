"""The Kubernetes API as plain dicts: the client's configuration, our own HTTP.

Only ``compat-hook cluster ...`` imports this module (never the hook or the
wrapper). The official ``kubernetes`` client is used for what is public and
stable across its releases (22.6 to 37.x were checked): ``Configuration``,
filled in by ``kubernetes.config.load_kube_config`` or
``load_incluster_config`` (kubeconfig contexts, exec and auth plugins, the
service account's token and CA). The requests themselves go through urllib3
(the client's own declared dependency, public API), honouring what the
configuration says: the host, the CA (file or data), the client certificate
and key, ``verify_ssl``, ``tls_server_name``, a proxy, and the bearer token,
asked for again before every request so that the client's refresh hooks
(in-cluster token rotation, exec plugins with an expiry) keep it current.
``ApiClient.call_api`` changed its signature in 37.0 and is not used.

Answers stay JSON dicts (no generated model objects); every request is
counted (:attr:`Kube.calls`) so a pass can report its cost.

Errors are named: :class:`Unreachable` (no connection, a timeout, a 5xx, a
429: all worth a retry after a backoff, ``retry_after`` when the server said),
:class:`Denied` (401/403), :class:`Conflict` (409), :class:`NotFound` (404),
:class:`Gone` (410: a watch's resourceVersion is too old), :class:`KubeError`
for the rest; each message is one line.

>>> _api_message(b'{"kind": "Status", "message": "nodes \\\\"x\\\\" is forbidden"}')
'nodes "x" is forbidden'
>>> _api_message("plain text, not JSON"), _api_message(b"[1, 2]"), _api_message(None)
('plain text, not JSON', '[1, 2]', '')
>>> _retry_after("7"), _retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), _retry_after(None)
(7.0, None, None)
"""

from __future__ import annotations

import json
import threading

from ...core.errors import CompatHookError

__all__ = ["Kube", "KubeError", "Unreachable", "Denied", "Conflict", "NotFound", "Gone", "connect",
           "FIELD_MANAGER", "APPLY_CONTENT_TYPE"]

#: The field manager of compat-hook's patches, creates and updates (``release``, the details, the Lease);
#: the agent's server-side apply of its Node's keys has its own (:data:`.nodeapply.MANAGER`).
FIELD_MANAGER = "compat-hook"
#: Server-side apply's content type (a JSON body is YAML too).
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
#: (connect, read) seconds for one request: a pass must never hang on a dead API server.
TIMEOUT = (3.0, 15.0)
#: The largest answer read from the API server (a list of every pod on a big node stays far below).
MAX_BODY = 64 << 20
#: One line of a watch stream (one object) at most.
MAX_EVENT = 16 << 20


class KubeError(CompatHookError):
    """An API request that failed; ``status`` is the HTTP status (0: no answer)."""

    code = "cluster_api"

    def __init__(self, msg: str, status: int = 0, retry_after: float | None = None) -> None:
        super().__init__(msg)
        self.status = status
        self.retry_after = retry_after


class Unreachable(KubeError):
    """No answer, or the server could not answer now (5xx, 429)."""


class Denied(KubeError):
    """401 or 403: the credentials or their RBAC do not allow the request."""


class Conflict(KubeError):
    """409: the object changed since it was read (or exists already)."""


class NotFound(KubeError):
    """404."""


class Gone(KubeError):
    """410: the resourceVersion a watch asked for is no longer kept."""


def _one_line(text, limit: int = 300) -> str:
    t = " ".join(str(text).split())
    return t if len(t) <= limit else t[:limit] + "..."


def _api_message(body) -> str:
    """The ``message`` of a Status answer; else the body's start as text (never raises)."""
    if body is None:
        return ""
    if isinstance(body, str):
        body = body.encode("utf-8", "replace")
    if not isinstance(body, (bytes, bytearray)):
        return ""
    try:
        doc = json.loads(bytes(body[:MAX_EVENT]))
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        return str(doc.get("message") or doc.get("reason") or "")
    return bytes(body[:200]).decode("utf-8", "replace")


def _retry_after(value) -> float | None:
    """``Retry-After`` in seconds (the delta form; a date is ignored)."""
    try:
        v = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return v if 0 <= v < 86400 else None


def _error(status: int, what: str, body, retry_after=None) -> KubeError:
    msg = f"{what}: {status} {_one_line(_api_message(body))}".rstrip()
    if status in (401, 403):
        return Denied(msg, status)
    if status == 409:
        return Conflict(msg, status)
    if status == 404:
        return NotFound(msg, status)
    if status == 410:
        return Gone(msg, status)
    if status >= 500 or status == 429:
        return Unreachable(msg, status, retry_after)
    return KubeError(msg, status)


def _no_proxy(host: str, no_proxy) -> bool:
    """Whether ``host`` (a URL) is exempt from the proxy by ``no_proxy`` (comma list, ``*``, suffixes).

    >>> _no_proxy("https://10.0.0.1:6443", "localhost,10.0.0.1"), _no_proxy("https://a.b.c", ".b.c")
    (True, True)
    >>> _no_proxy("https://a.b.c", None)
    False
    """
    if not no_proxy:
        return False
    from urllib.parse import urlsplit

    name = (urlsplit(host).hostname or "").lower()
    for entry in str(no_proxy).split(","):
        e = entry.strip().lower()
        if e == "*" or (e and (name == e.lstrip(".") or name.endswith("." + e.lstrip(".")))):
            return True
    return False


def _pool(cfg):
    """A urllib3 pool manager configured as the client's ``Configuration`` says."""
    import urllib3

    kw: dict = {"num_pools": 4, "maxsize": 8, "block": False, "retries": False}
    if str(cfg.host).startswith("https"):
        verify = bool(getattr(cfg, "verify_ssl", True))
        kw["cert_reqs"] = "CERT_REQUIRED" if verify else "CERT_NONE"
        ca_file, ca_data = getattr(cfg, "ssl_ca_cert", None), getattr(cfg, "ca_cert_data", None)
        if verify and ca_data and not ca_file:
            import ssl  # CA data in memory (newer clients): a context of our own carries it

            ctx = ssl.create_default_context(cadata=ca_data if isinstance(ca_data, str) else ca_data.decode())
            kw["ssl_context"] = ctx
        elif verify and ca_file:
            kw["ca_certs"] = ca_file
        if getattr(cfg, "cert_file", None):
            kw["cert_file"] = cfg.cert_file
            if getattr(cfg, "key_file", None):
                kw["key_file"] = cfg.key_file
        if getattr(cfg, "tls_server_name", None):
            kw["server_hostname"] = cfg.tls_server_name
        if getattr(cfg, "assert_hostname", None) is not None:
            kw["assert_hostname"] = cfg.assert_hostname
        if not verify:
            kw["assert_hostname"] = False
    proxy = getattr(cfg, "proxy", None)
    if proxy and not _no_proxy(cfg.host, getattr(cfg, "no_proxy", None)):
        return urllib3.ProxyManager(proxy, proxy_headers=getattr(cfg, "proxy_headers", None), **kw)
    return urllib3.PoolManager(**kw)


def _auth_headers(cfg) -> dict:
    """The credentials' headers, asked for now: the client's refresh hooks renew an expiring token."""
    out = {}
    try:
        settings = cfg.auth_settings() or {}
    except Exception as e:  # an exec plugin or token file failing now: one line, never a traceback
        raise Denied(f"the credentials could not be refreshed: {_one_line(e, 200)}") from None
    for s in settings.values():
        if isinstance(s, dict) and s.get("in") == "header" and s.get("key") and s.get("value"):
            out[str(s["key"])] = str(s["value"])
    return out


class Kube:
    """A connection: ``request(method, path, ...)`` returns the decoded JSON answer."""

    def __init__(self, cfg, where: str) -> None:
        self._cfg = cfg
        self._http = _pool(cfg)
        self.host = str(cfg.host).rstrip("/")
        self.where = where
        #: how the credentials were found: ``in-cluster`` or ``context NAME, FILES``
        self.source = "in-cluster"
        self.calls = 0
        #: ``{"VERB resource": n}``: what was asked, for the cost a pass or a benchmark reports
        self.by_kind: dict = {}
        self._lock = threading.Lock()

    def _count(self, method: str, path: str) -> None:
        parts = [p for p in path.split("?")[0].split("/") if p]
        # /api/v1/namespaces/NS/KIND/NAME, /apis/G/V/KIND[/NAME]: the resource is the element after the version
        # and an optional namespaces/NS.
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        key = f"{method} {rest[0] if rest else '-'}"
        with self._lock:
            self.calls += 1
            self.by_kind[key] = self.by_kind.get(key, 0) + 1

    def _url(self, path: str, query) -> str:
        from urllib.parse import urlencode

        items = sorted((k, str(v)) for k, v in (query or {}).items() if v is not None)
        return self.host + path + ("?" + urlencode(items) if items else "")

    def _send(self, method: str, path: str, query, body, content_type, timeout, preload: bool):
        import urllib3
        from urllib3.exceptions import HTTPError

        headers = {"Accept": "application/json", "User-Agent": "compat-hook"}
        headers.update(_auth_headers(self._cfg))
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        try:
            return self._http.request(method, self._url(path, query), body=data, headers=headers,
                                      timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
                                      preload_content=preload, retries=False, redirect=False)
        except (HTTPError, OSError, ValueError) as e:
            raise Unreachable(f"{method} {path}: {self.where} unreachable: {_one_line(e, 200)}") from None

    def request(self, method: str, path: str, *, query: dict | None = None, body=None,
                content_type: str = "application/json", timeout=TIMEOUT, count: bool = True) -> dict:
        from urllib3.exceptions import HTTPError

        if count:
            self._count(method, path)
        what = f"{method} {path}"
        resp = self._send(method, path, query, body, content_type, timeout, False)
        try:
            raw = resp.read(MAX_BODY + 1)
        except (HTTPError, OSError) as e:
            raise Unreachable(f"{what}: {self.where} unreachable: {_one_line(e, 200)}") from None
        finally:
            resp.release_conn()
        if resp.status >= 400:
            raise _error(resp.status, what, raw, _retry_after(resp.headers.get("Retry-After")))
        if len(raw) > MAX_BODY:
            raise KubeError(f"{what}: answer larger than {MAX_BODY} bytes")
        try:
            doc = json.loads(raw) if raw else {}
        except (ValueError, UnicodeDecodeError):
            raise KubeError(f"{what}: the answer is not JSON") from None
        if not isinstance(doc, dict):
            raise KubeError(f"{what}: the answer is not a JSON object")
        return doc

    def watch(self, path: str, resource_version: str, timeout_s: int, query: dict | None = None,
              idle_s: float | None = None):
        """Yield the events (``{"type", "object"}``) of a watch on ``path`` from ``resource_version``,
        until the server ends it after ``timeout_s``; counted once, like the API server counts it. The
        first event is ``{"type": "OPEN"}``: the server accepted the watch. ``idle_s``: the longest
        silence (no event, no bookmark) before the stream counts as broken (:class:`Unreachable`), so
        that a half-open connection does not keep a cache "current"."""
        from urllib3.exceptions import HTTPError

        q = dict(query or {}, watch="true", allowWatchBookmarks="true", timeoutSeconds=str(int(timeout_s)))
        if resource_version:
            q["resourceVersion"] = resource_version
        self._count("WATCH", path)
        what = f"watch {path}"
        resp = self._send("GET", path, q, None, None, (TIMEOUT[0], idle_s or timeout_s + 30), False)
        try:
            if resp.status >= 400:
                raise _error(resp.status, what, resp.read(1 << 16), _retry_after(resp.headers.get("Retry-After")))
            yield {"type": "OPEN", "object": {}}  # the server took it: the caller's cache is current from here
            buf = b""
            for chunk in _chunks(resp):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    ev = _event(line)
                    if ev is not None:
                        yield ev
                if len(buf) > MAX_EVENT:
                    raise KubeError(f"{what}: an event larger than {MAX_EVENT} bytes")
            ev = _event(buf)
            if ev is not None:
                yield ev
        except (HTTPError, OSError) as e:
            raise Unreachable(f"{what}: {self.where}: the stream broke: {_one_line(e, 200)}") from None
        finally:
            resp.release_conn()

    # -- the verbs ----------------------------------------------------------
    def get(self, path: str, **query) -> dict:
        return self.request("GET", path, query={k: v for k, v in query.items() if v is not None})

    def patch(self, path: str, patch: dict, *, merge: str = "strategic") -> dict:
        """A strategic-merge (or ``merge="json"``: JSON merge) patch with field manager ``compat-hook``
        (a ``metadata.resourceVersion`` in ``patch`` makes it conditional: :class:`Conflict`)."""
        ctype = "application/strategic-merge-patch+json" if merge == "strategic" else "application/merge-patch+json"
        return self.request("PATCH", path, query={"fieldManager": FIELD_MANAGER}, body=patch, content_type=ctype)

    def apply(self, path: str, obj: dict, *, manager: str, force: bool = False) -> dict:
        """Server-side apply of ``obj`` (the whole intent of ``manager``: a field it applied before and
        leaves out now is removed where no other manager owns it) at ``path``. A
        ``metadata.resourceVersion`` in ``obj`` makes it conditional (:class:`Conflict`), like a change
        to a field another manager owns without ``force``."""
        query = {"fieldManager": manager}
        if force:
            query["force"] = "true"
        return self.request("PATCH", path, query=query, body=obj, content_type=APPLY_CONTENT_TYPE)

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, query={"fieldManager": FIELD_MANAGER}, body=obj)

    def update(self, path: str, obj: dict) -> dict:
        return self.request("PUT", path, query={"fieldManager": FIELD_MANAGER}, body=obj)

    def close(self) -> None:
        self._http.clear()


def _chunks(resp):
    """The body as it arrives: one chunk of a chunked answer at a time (a watch's events), else lines."""
    if getattr(resp, "chunked", False) and resp.supports_chunked_reads():
        yield from resp.read_chunked(None, decode_content=True)
        return
    while True:  # not chunked (an old proxy): no framing to wait on but the line's end
        line = resp.readline(MAX_EVENT + 1)
        if not line:
            return
        yield line


def _event(line: bytes):
    line = line.strip()
    if not line:
        return None
    try:
        ev = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return ev if isinstance(ev, dict) else None


def _is_server_url(host: str) -> bool:
    """Whether ``host`` is an address the transport can request: parsed as urllib3 parses it (an
    unclosed bracket or a port out of range would otherwise read as an unreachable server, retried
    for ever by the agent and the fleet), http or https, a host name without spaces or control
    characters.

    >>> [_is_server_url(h) for h in ("https://10.0.0.1:6443", "https://[::1]:6443", "https://[::1",
    ...                               "https://h:99999", "https://:1", "https://a b", "ftp://h")]
    [True, True, False, False, False, False, False]
    """
    from urllib3.exceptions import LocationParseError
    from urllib3.util import parse_url

    try:
        u = parse_url(host)
    except (LocationParseError, ValueError):
        return False
    return u.scheme in ("http", "https") and bool(u.host) and not any(c.isspace() or ord(c) < 32 for c in u.host)


def _rooted(doc: dict):
    """The merged kubeconfig as the client's own ``ConfigNode``, rooted in the working directory: the client
    runs an exec plugin in the directory of the file it read (22.x: with a plain dict, in ``""``, which fails
    every exec plugin); kubectl runs it where it was started, and :mod:`.kubeconfig` has made every path of
    the entries absolute already."""
    import os

    try:
        from kubernetes.config.kube_config import ConfigNode
    except ImportError:  # a client without it takes the plain dict
        return doc
    return ConfigNode("kube-config", doc, os.path.join(os.getcwd(), "kubeconfig"))


def connect(kubeconfig: str | None = None, context: str | None = None) -> Kube:
    """In-cluster service-account config (in a pod, with neither ``kubeconfig`` nor ``context``, no
    ``$KUBECONFIG`` and no ``~/.kube/config``), else the kubeconfig files merged as kubectl merges them
    (:mod:`.kubeconfig`), ``context`` or their current one."""
    import os

    from .kubeconfig import KubeconfigError, load

    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise KubeError("the cluster commands need the Kubernetes client: install compat-hook[cluster] "
                        "(pip) or python3-kubernetes (Debian, Ubuntu)") from None
    cfg = client.Configuration()
    src = "in-cluster"
    try:
        # in a pod, as kubectl: the service account unless a kubeconfig is named or found
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST") \
                and not os.environ.get("KUBECONFIG") and not os.path.exists(os.path.expanduser("~/.kube/config")):
            config.load_incluster_config(client_configuration=cfg)
            where = "the API server (in-cluster)"
        else:
            doc, name, files = load(kubeconfig, context)
            src = f"context {name}, {files}"
            config.load_kube_config_from_dict(_rooted(doc), context=name, client_configuration=cfg,
                                              persist_config=False)
            where = f"the API server {cfg.host}"
    except KubeconfigError as e:
        shown = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise KubeError(f"no cluster credentials ({_one_line(shown, 200)}): {e}") from None
    except (ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise KubeError(f"no cluster credentials ({src}): {_one_line(e, 200)}") from None
    if not _is_server_url(str(cfg.host or "")):
        raise KubeError(f"no cluster credentials ({src}): the API server address {str(cfg.host)[:100]!r} "
                        "is not a URL")
    if not cfg.verify_ssl:  # the kubeconfig asks for it (insecure-skip-tls-verify): said once there, not per request
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    k = Kube(cfg, where)
    k.source = src
    return k
