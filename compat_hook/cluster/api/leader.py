"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection`` does it.

One Lease (the chart makes it: the controller needs no right to create one) names the leader in
``spec.holderIdentity``. Every replica reads it every :attr:`Elector.retry` seconds:

* the leader renews it (``renewTime``) with an update conditional on the ``resourceVersion`` it read:
  a concurrent writer makes it fail (409), and the replica reads again;
* a standby takes it only when it is free (no holder) or when the record has not changed for
  ``leaseDurationSeconds`` *by the standby's own clock* (the time it first saw this record, never
  the leader's ``renewTime``: two nodes' clocks may differ by more than a Lease);
* a leader that could not renew for :attr:`Elector.renew_deadline` (two thirds of the Lease)
  counts itself a standby again before any standby may take over, so two replicas never write at
  once (the writes are conditional anyway);
* :meth:`Elector.release` (SIGTERM) empties ``holderIdentity`` at once, so a standby takes over at its
  next read instead of after a whole Lease.

:func:`decide` is the pure rule (tested without a server):

>>> rec = {"holderIdentity": "b", "leaseDurationSeconds": 15, "renewTime": "x"}
>>> decide(rec, me="a", observed_at=100.0, now=110.0)   # b renewed 10 s ago (by a's clock): stand by
'standby'
>>> decide(rec, me="a", observed_at=100.0, now=116.0)   # nothing for 16 s > 15: take it
'acquire'
>>> decide(rec, me="b", observed_at=100.0, now=116.0), decide({"holderIdentity": ""}, me="a", observed_at=0, now=0)
('renew', 'acquire')
"""

from __future__ import annotations

import datetime

from .kube import Conflict, KubeError, NotFound

__all__ = ["Elector", "decide", "DEFAULT_LEASE_SECONDS"]

#: client-go's defaults: a 15 s Lease, renewed every 2 s, given up after 10 s without a renewal.
DEFAULT_LEASE_SECONDS = 15


def _now_text(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decide(spec: dict, *, me: str, observed_at: float, now: float) -> str:
    """``renew`` (``me`` holds it), ``acquire`` (free or expired), or ``standby`` (someone else holds it)."""
    holder = spec.get("holderIdentity") or ""
    if holder == me:
        return "renew"
    if not holder:
        return "acquire"
    duration = spec.get("leaseDurationSeconds")
    duration = duration if isinstance(duration, int) and not isinstance(duration, bool) and duration > 0 \
        else DEFAULT_LEASE_SECONDS
    return "acquire" if now - observed_at > duration else "standby"


class Elector:
    """One replica's side of the election over the Lease ``namespace/name``; :meth:`step` once per
    :attr:`retry` seconds says whether this replica leads now."""

    def __init__(self, kube, namespace: str, name: str, identity: str, *, lease_seconds: int = DEFAULT_LEASE_SECONDS,
                 clock=None, wall=None, labels: dict | None = None, owner=None) -> None:
        import time

        self.kube, self.identity = kube, identity
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._create_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name, self.labels = name, dict(labels or {})
        #: ``owner()``: the ownerReference a Lease created anew carries, None: create none (an uninstall is
        #: under way); unset: create without an owner
        self.owner = owner
        self.lease_seconds = int(lease_seconds)
        self.retry = max(1.0, self.lease_seconds / 7.5)
        self.renew_deadline = self.lease_seconds * 2.0 / 3.0
        self._clock = clock or time.monotonic
        self._wall = wall or time.time
        self._seen: tuple | None = None  # (the record's resourceVersion, our clock when first seen)
        self._renewed: float | None = None  # our clock at the last successful acquire or renew
        self.leading = False
        self.holder: str | None = None
        self.transitions = 0

    def _read(self) -> dict | None:
        try:
            return self.kube.get(self.path)
        except NotFound:
            return None

    def _write(self, lease: dict | None, spec: dict) -> dict:
        if lease is None:  # deleted, or outside the chart (which makes it): create it, if these credentials may
            meta: dict = {"name": self.name, "labels": self.labels}
            if self.owner is not None:
                ref = self.owner()
                if ref is None:
                    raise NotFound(f"Lease {self.name} is gone and nothing owns a new one (uninstalled?)", 404)
                meta["ownerReferences"] = [ref]
            return self.kube.create(self._create_path, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec})
        body = dict(lease)
        body["spec"] = spec
        return self.kube.update(self.path, body)

    def step(self) -> bool:
        """Read the Lease, renew or acquire it when due; True while this replica leads. An API error is
        raised (the caller backs off) after stepping down when the renew deadline passed."""
        now = self._clock()
        try:
            lease = self._read()
        except KubeError:
            self._expire(now)
            raise
        spec = dict((lease or {}).get("spec") or {})
        rv = str(((lease or {}).get("metadata") or {}).get("resourceVersion") or "")
        if self._seen is None or self._seen[0] != rv:
            self._seen = (rv, now)
        self.holder = spec.get("holderIdentity") or None
        what = decide(spec, me=self.identity, observed_at=self._seen[1], now=now)
        if what == "standby":
            self.leading = False
            return False
        wall = self._wall()
        new = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
               "renewTime": _now_text(wall)}
        if what == "acquire":
            new["acquireTime"] = _now_text(wall)
            new["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if spec.get("holderIdentity") else 0)
        else:
            new["acquireTime"] = spec.get("acquireTime") or _now_text(wall)
            new["leaseTransitions"] = int(spec.get("leaseTransitions") or 0)
        try:
            got = self._write(lease, new)
        except Conflict:  # someone else wrote first: read again at the next step
            self._expire(now)
            return self.leading
        except KubeError:
            self._expire(now)
            raise
        self._seen = (str((got.get("metadata") or {}).get("resourceVersion") or ""), now)
        if not self.leading:
            self.transitions += 1
        self.leading, self.holder, self._renewed = True, self.identity, now
        return True

    def _expire(self, now: float) -> None:
        """A leader that has not renewed for the renew deadline stops leading (before anyone can take over)."""
        if self.leading and (self._renewed is None or now - self._renewed >= self.renew_deadline):
            self.leading = False

    def still_leading(self) -> bool:
        """Whether this replica may still write now (its last renewal is within the renew deadline)."""
        if self.leading and self._renewed is not None and self._clock() - self._renewed >= self.renew_deadline:
            self.leading = False
        return self.leading

    def release(self) -> bool:
        """Give the Lease up (SIGTERM): holderIdentity emptied, so a standby takes it at its next read."""
        if not self.leading:
            return False
        self.leading = False
        try:
            lease = self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return False
            spec = dict(lease.get("spec") or {})
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now_text(self._wall()))
            self._write(lease, spec)
            return True
        except KubeError:
            return False
