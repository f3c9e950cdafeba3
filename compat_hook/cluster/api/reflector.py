"""A list-then-watch cache of one kind of object, as client-go's reflector keeps one.

A pass reads the node's pods, the ClusterPolicies, the NVIDIADrivers and its own
Node from these caches, not from the API server: each is listed once
(``resourceVersion=0``: served from the API server's watch cache, never a scan
of etcd) and then kept current by a watch from that version. A watch that ends
(the server's timeout) is resumed from the last version seen; one the server
no longer can resume (410 Gone) is listed again. Every retry after a failure
waits a jittered, exponential, capped backoff (:mod:`.backoff`), honouring the
server's ``Retry-After``.

``healthy`` says whether the cache can be trusted now (its watch is running);
a pass made while one is not is incomplete. Watches last 5 to 10 minutes
(:data:`WATCH_SECONDS`) and ask for bookmarks; one silent for
:data:`IDLE_SECONDS` (no event, no bookmark: a half-open connection) breaks, and
its cache is unhealthy until a new watch is open. A resource the API server does not
serve (404: no GPU Operator CRDs) is an empty cache when ``optional``.

Every change calls ``on_change(reflector)`` from the reflector's thread; the
agent decides there whether it matters.

>>> _key({"metadata": {"namespace": "apps", "name": "p"}}), _key({"metadata": {"name": "gpu-a"}})
('apps/p', '/gpu-a')
>>> _slim({"metadata": {"name": "n", "managedFields": [{"manager": "kubelet"}]}})
{'metadata': {'name': 'n'}}
"""

from __future__ import annotations

import random
import threading

from .backoff import Backoff
from .kube import Gone, KubeError, NotFound

__all__ = ["Reflector", "WATCH_SECONDS", "IDLE_SECONDS"]

#: A watch asks the server to end it after a random time in this range (seconds): the reconnects of a
#: fleet's agents spread out (client-go's reflector: 5 to 10 minutes), one request each.
WATCH_SECONDS = (300, 600)
#: The longest a watch may be silent. The API server's watch cache sends every watcher that asked
#: for bookmarks (``allowWatchBookmarks``) one about every minute, whether anything changed or not; a
#: stream silent for longer is a half-open connection, and the cache behind it is not current.
IDLE_SECONDS = 150.0


def _key(obj: dict) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _slim(obj: dict) -> dict:
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class Reflector:
    """See the module docstring; ``objects()`` is a snapshot of the cache."""

    def __init__(self, kube, path: str, *, query: dict | None = None, optional: bool = False, on_change=None,
                 name: str = "", rng=None, watch_seconds=WATCH_SECONDS, idle_s: float = IDLE_SECONDS,
                 managed_fields: bool = False, on_event=None, slim=None) -> None:
        self.kube, self.path, self.query = kube, path, dict(query or {})
        #: keep ``metadata.managedFields`` (the agent's own Node: who owns which key decides how it is
        #: applied, :mod:`.nodeapply`); dropped from everything else (a pod's are most of its size);
        #: ``slim``: what of each object is kept instead (its ``metadata`` name, namespace and
        #: resourceVersion at least), for a cache of many objects of which little is read
        self._slim = slim or ((lambda o: o) if managed_fields else _slim)
        self.optional, self.on_change, self.name = optional, on_change, name or path
        #: ``on_event(type, object)`` for each object listed (``LISTED``) and each watch event (``ADDED``,
        #: ``MODIFIED``, ``DELETED``), from the reflector's thread, before ``on_change``: for a reader that
        #: judges by when it saw a change (the fleet's Lease clock)
        self.on_event = on_event
        self._rng = rng or random.Random()
        self._watch_seconds = watch_seconds
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._objects: dict = {}
        self.synced = threading.Event()
        #: set once the first list has been tried (whether it worked or not)
        self.attempted = threading.Event()
        self.healthy = False
        self.absent = False
        self.error: str | None = None
        self.stop = threading.Event()
        self._thread = None

    def start(self) -> "Reflector":
        self._thread = threading.Thread(target=self._run, name=f"watch {self.name}", daemon=True)
        self._thread.start()
        return self

    def objects(self) -> list:
        with self._lock:
            return list(self._objects.values())

    def replace(self, obj: dict) -> None:
        """Put an object the agent just wrote (the answer to its PATCH) into the cache at once."""
        with self._lock:
            old = self._objects.get(_key(obj))
            if old is None or _rv(old) <= _rv(obj):
                self._objects[_key(obj)] = self._slim(obj)

    def _list(self) -> str:
        doc = self.kube.request("GET", self.path, query=dict(self.query, resourceVersion="0"))
        items = doc.get("items") if isinstance(doc.get("items"), list) else []
        with self._lock:
            self._objects = {_key(o): self._slim(o) for o in items if isinstance(o, dict)}
        if self.on_event is not None:
            for o in items:
                if isinstance(o, dict):
                    self.on_event("LISTED", o)
        self.absent = False
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    #: A resource the server does not serve (an optional CRD not installed) is asked for again after this
    #: backoff, not the error one: a cluster without the NVIDIADriver CRD sees one list of it every few
    #: minutes from each agent, not one a second at the start.
    ABSENT_RETRY = (10.0, 300.0)

    def _run(self) -> None:
        backoff = Backoff(base=1.0, cap=300.0, rng=self._rng)
        absent = Backoff(*self.ABSENT_RETRY, rng=self._rng)
        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    try:
                        rv = self._list()
                    finally:
                        self.attempted.set()
                    absent.reset()
                    self.synced.set()
                    self.healthy, self.error = True, None
                    self._notify()
                rv = self._watch(rv)
                backoff.reset()
            except Gone:
                rv = None  # too old to resume: list again, now
            except NotFound as e:
                rv = None
                if self.optional:
                    with self._lock:
                        had = bool(self._objects)
                        self._objects = {}
                    self.absent, self.healthy, self.error = True, True, None
                    self.synced.set()
                    if had:
                        self._notify()
                    self.stop.wait(absent.next())
                    continue
                self.healthy, self.error = False, str(e)
                self.stop.wait(backoff.next())
            except KubeError as e:
                self.healthy, self.error = False, str(e)
                self.stop.wait(backoff.next(getattr(e, "retry_after", None)))
            except Exception as e:  # never let the thread die silently: the cache is then unhealthy
                self.healthy, self.error = False, f"{type(e).__name__}: {e}"
                self.stop.wait(backoff.next())

    def _watch(self, rv: str) -> str:
        seconds = self._rng.randint(*self._watch_seconds)
        for ev in self.kube.watch(self.path, rv, seconds, query=self.query, idle_s=self._idle_s):
            kind = ev.get("type")
            obj = ev.get("object") if isinstance(ev.get("object"), dict) else {}
            if kind == "OPEN":
                self.healthy, self.error = True, None
                continue
            if kind == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise Gone(f"watch {self.path}: {obj.get('message')}", 410)
                raise KubeError(f"watch {self.path}: {code} {str(obj.get('message'))[:200]}", int(code or 0))
            new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if kind == "BOOKMARK":
                rv = new_rv or rv
                continue
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            with self._lock:
                if kind == "DELETED":
                    self._objects.pop(_key(obj), None)
                else:
                    self._objects[_key(obj)] = self._slim(obj)
            rv = new_rv or rv
            if self.on_event is not None:
                self.on_event(kind, obj)
            self._notify()
        return rv


def _rv(obj: dict) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0
