"""A read-only OCI distribution registry over plain HTTP, serving OCI image layouts.

What a node's containerd needs to pull (the distribution spec's pull side, nothing more):

* ``GET``/``HEAD /v2/``: the API check (200, ``Docker-Distribution-API-Version: registry/2.0``);
* ``GET``/``HEAD /v2/<name>/manifests/<tag|digest>``: the manifest's bytes as the layout stores
  them, with its ``Content-Type`` (the descriptor's media type) and ``Docker-Content-Digest``;
* ``GET``/``HEAD /v2/<name>/blobs/<digest>``: a blob of that repository's layout.

Each repository is one tag table, ``{tag: (layout dir, the layout's ref name)}`` (umoci's layouts,
tests/support/engines.py ``build_image``): :meth:`Registry.push` points a tag at another image of a
layout, which is what ``docker push`` of a rebuilt image under the same tag does to a registry. A
digest is served only when the layout of one of the repository's tags holds it, so what a client
gets by digest is what it could have resolved. Anything else is the spec's JSON error with 404
(or 405 for a write). Every request is logged as ``(method, path, status)`` (:attr:`Registry.log`),
so a test can tell that a pull really came here.

It listens on 127.0.0.1 in a thread of the test process. The test node (tests/support/node.py)
shares this machine's network namespace (only its mount namespace is its own), so the node's
containerd reaches it there.

>>> Registry.parse("/v2/apps/app/manifests/1")
('manifests', 'apps/app', '1')
>>> Registry.parse("/v2/apps/app/blobs/sha256:" + "a" * 64)[:2]
('blobs', 'apps/app')
>>> Registry.parse("/v2/../etc/manifests/1") is None
True
"""

from __future__ import annotations

import hashlib
import http.server
import json
import pathlib
import re
import threading

Path = pathlib.Path

_NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
REF_NAME = "org.opencontainers.image.ref.name"


class LayoutError(Exception):
    """A layout without the named image."""


def manifest_of(layout: Path, ref: str) -> dict:
    """The descriptor (``mediaType``, ``digest``, ``size``) of ``ref`` in ``layout``'s index.json."""
    index = json.loads((Path(layout) / "index.json").read_text())
    for d in index.get("manifests", []):
        if (d.get("annotations") or {}).get(REF_NAME) == ref:
            return {k: d[k] for k in ("mediaType", "digest", "size")}
    raise LayoutError(f"{layout}: no image {ref!r}")


def config_of(layout: Path, ref: str) -> str:
    """The digest of ``ref``'s image config in ``layout`` (what a client fetches after the manifest)."""
    d = manifest_of(layout, ref)
    manifest = json.loads((Path(layout) / "blobs" / "sha256" / d["digest"].split(":", 1)[1]).read_text())
    return manifest["config"]["digest"]


class Registry:
    """The registry (module docstring). ``start()`` serves it; ``host`` is ``127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self.repos: dict = {}  # name -> {tag: (layout, ref)}
        self.log: list = []
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        assert self._server is not None, "not started"
        return f"127.0.0.1:{self._server.server_address[1]}"

    def push(self, name: str, tag: str, layout: Path, ref: str) -> str:
        """Point ``name:tag`` at image ``ref`` of ``layout``. Returns its manifest digest."""
        assert _NAME.fullmatch(name) and _TAG.fullmatch(tag), (name, tag)
        d = manifest_of(layout, ref)
        with self._lock:
            self.repos.setdefault(name, {})[tag] = (Path(layout), ref)
        return d["digest"]

    # ------------------------------------------------------------------ serving

    @staticmethod
    def parse(path: str) -> tuple | None:
        """``(kind, name, reference)`` of a ``/v2/...`` path, or None when it is not one."""
        m = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", path)
        if not m or not _NAME.fullmatch(m.group(1)):
            return None
        ref = m.group(3)
        if not (_DIGEST.fullmatch(ref) or (m.group(2) == "manifests" and _TAG.fullmatch(ref))):
            return None
        return m.group(2), m.group(1), ref

    def resolve(self, kind: str, name: str, ref: str) -> tuple | None:
        """``(file, media type, digest)`` that answers the request, or None."""
        with self._lock:
            tags = dict(self.repos.get(name) or {})
        if not tags:
            return None
        if kind == "manifests" and not ref.startswith("sha256:"):
            if ref not in tags:
                return None
            layout, image = tags[ref]
            d = manifest_of(layout, image)
            return layout / "blobs" / "sha256" / d["digest"].split(":", 1)[1], d["mediaType"], d["digest"]
        for layout in {lay for lay, _ in tags.values()}:
            f = layout / "blobs" / "sha256" / ref.split(":", 1)[1]
            if f.is_file():
                if kind == "manifests":
                    mt = json.loads(f.read_bytes()).get("mediaType") or "application/vnd.oci.image.manifest.v1+json"
                    return f, mt, ref
                return f, "application/octet-stream", ref
        return None

    def start(self) -> "Registry":
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # the test's own log (Registry.log), not stderr
                pass

            def _send(self, status: int, body: bytes, ctype: str, extra: dict | None = None,
                      head: bool = False) -> None:
                registry.log.append((self.command, self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, status: int, code: str, head: bool) -> None:
                body = json.dumps({"errors": [{"code": code, "message": code.lower().replace("_", " ")}]})
                self._send(status, body.encode(), "application/json", head=head)

            def _get(self, head: bool) -> None:
                path = self.path.split("?", 1)[0]
                if path in ("/v2", "/v2/"):
                    return self._send(200, b"{}", "application/json", head=head)
                parsed = registry.parse(path)
                if parsed is None:
                    return self._error(404, "NAME_UNKNOWN", head)
                got = registry.resolve(*parsed)
                if got is None:
                    return self._error(404, "MANIFEST_UNKNOWN" if parsed[0] == "manifests" else "BLOB_UNKNOWN",
                                       head)
                f, ctype, digest = got
                body = f.read_bytes()
                # the layout is the store of record: a blob that does not hash to its name is not served
                assert "sha256:" + hashlib.sha256(body).hexdigest() == digest, f
                self._send(200, body, ctype, {"Docker-Content-Digest": digest}, head=head)

            def do_GET(self) -> None:
                self._get(head=False)

            def do_HEAD(self) -> None:
                self._get(head=True)

            def _refuse(self) -> None:
                self._error(405, "UNSUPPORTED", head=False)

            do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="registry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(10)
            self._server = None

    def served(self, name: str, digest: str) -> bool:
        """Whether blob ``digest`` of ``name`` was sent (a GET answered 200)."""
        return ("GET", f"/v2/{name}/blobs/{digest}", 200) in self.log


def hosts_toml(host: str) -> str:
    """containerd's registry host config (``config_path``'s ``<host>/hosts.toml``) for a plain-HTTP
    registry at ``host``: ``server`` names the scheme, so containerd never tries HTTPS there.

    >>> print(hosts_toml("127.0.0.1:5000"), end="")
    server = "http://127.0.0.1:5000"
    <BLANKLINE>
    [host."http://127.0.0.1:5000"]
      capabilities = ["pull", "resolve"]
    """
    return f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n'
