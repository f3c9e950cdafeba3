"""The agent's heartbeat: a Lease in its namespace named after the node, renewed after every pass
(``leaseDurationSeconds`` = 2 x interval); ``cluster status`` reads a verdict whose Lease expired as stale.
"""

from __future__ import annotations

from .detailscm import COMPONENT_LABELS

__all__ = ["microtime", "lease"]

def microtime(t: float) -> str:
    """A Kubernetes MicroTime (``2026-12-03T22:32:00.123456Z``).

    >>> microtime(0.5)
    '1970-01-01T00:00:00.500000Z'
    """
    import time as _t

    return _t.strftime("%Y-%m-%dT%H:%M:%S", _t.gmtime(t)) + f".{int(round((t % 1) * 1e6)) % 1000000:06d}Z"


def lease(*, name: str, namespace: str, interval: float, now: float, acquired: str | None = None,
          resource_version: str | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, "labels": dict(COMPONENT_LABELS)}
    if resource_version:
        meta["resourceVersion"] = resource_version
    t = microtime(now)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": max(2, int(round(2 * interval))),
                     "renewTime": t, "acquireTime": acquired or t}}
