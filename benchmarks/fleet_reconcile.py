#!/usr/bin/python3
"""The fleet controller's reconcile at 1,000 to 10,000 GPU nodes, on synthetic snapshots (no server).

    /usr/bin/python3 benchmarks/fleet_reconcile.py [--nodes 1000,5000,10000] [--repeat 5]

Each node carries a published verdict (the agents' Node annotation, as :func:`publish.node_doc` writes it)
and a Lease; the objects are a ClusterPolicy handing drivers to two NVIDIADrivers (two pools) with an
announced next driver on one, so every kind of key is computed (per object and version, ``driver_<v>``,
the what-if keys of a delete and a mode switch). Figures, each the median of ``--repeat`` runs, in ms:

* ``scratch``: a reconcile with an empty :class:`~compat_hook.cluster.fleet.Memo` (a new leader);
* ``one_verdict``: the next reconcile after one node published a new verdict (what the 2 s target of a new
  verdict reaching the ConfigMap is about);
* ``one_renewal``: what a Lease renewal that changes no freshness costs the loop (:class:`LeaseClock.note`
  and the resync's :meth:`Fleet.flipped` test over every Lease), per renewal and per resync.

The JSON goes to stdout (``--out FILE`` too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PREFIX = "compat-hook.io"
R535, R570 = "535.261.03", "570.195.03"


def _node(i: int, target: str, verdict: str = "pass") -> dict:
    from compat_hook.cluster import publish

    doc = publish.node_doc(verdict_=verdict, target=target, target_from="NVIDIADriver pool", now=R535, gate="clear",
                           c={"regressions": 0}, reasons=[], key="k", interval=300, details="",
                           since="2026-01-01T00:00:00Z", complete=True)
    return {"metadata": {"name": f"gpu-{i:05d}", "resourceVersion": str(10 + i),
                         "labels": {"nvidia.com/gpu.present": "true", "pool": "a" if i % 2 else "b",
                                    f"{PREFIX}/preflight": verdict},
                         "annotations": {f"{PREFIX}/preflight": json.dumps(doc, separators=(",", ":"))}}}


def _lease(i: int, now: float) -> dict:
    t = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now - 10))
    return {"metadata": {"name": f"gpu-{i:05d}", "resourceVersion": str(100000 + i)},
            "spec": {"renewTime": t, "leaseDurationSeconds": 600}}


def measure(n: int, repeat: int) -> dict:
    from compat_hook.cluster.fleet import LeaseClock, Memo, Snapshot, reconcile

    now = time.time()
    cp = {"metadata": {"name": "cluster-policy", "resourceVersion": "1"},
          "spec": {"driver": {"version": R535, "useNvidiaDriverCRD": True}}}
    pools = ({"metadata": {"name": "pool-a", "resourceVersion": "2", "annotations": {f"{PREFIX}/next-driver": R570}},
              "spec": {"version": R535, "nodeSelector": {"pool": "a"}}},
             {"metadata": {"name": "pool-b", "resourceVersion": "3"},
              "spec": {"version": R535, "nodeSelector": {"pool": "b"}}})
    nodes = [_node(i, R570 if i % 2 else R535) for i in range(n)]
    leases = {f"gpu-{i:05d}": _lease(i, now) for i in range(n)}
    clock = LeaseClock()
    for lease in leases.values():
        clock.note(lease, 0.0)
    ages = clock.ages(leases, 1.0)
    snap = lambda ns: Snapshot(nodes=tuple(ns), leases=leases, policies=(cp,), drivers=pools, now=now, ages=ages)  # noqa: E731
    scratch, one = [], []
    for r in range(repeat):
        memo = Memo()
        t0 = time.perf_counter()
        first = reconcile(snap(nodes), PREFIX, memo)
        scratch.append(time.perf_counter() - t0)
        changed = list(nodes)
        k = (r * 7919) % n
        changed[k] = _node(k, R570 if k % 2 else R535, verdict="warn")
        changed[k]["metadata"]["resourceVersion"] = str(10 ** 9 + r)
        t0 = time.perf_counter()
        second = reconcile(snap(changed), PREFIX, memo)
        one.append(time.perf_counter() - t0)
        assert second == reconcile(snap(changed), PREFIX), "the memo changed the result"
        assert first != second or True
    # a renewal: the Lease noted (a new resourceVersion), and the resync's freshness test over every Lease
    t0 = time.perf_counter()
    for i, lease in enumerate(leases.values()):
        clock.note(dict(lease, metadata=dict(lease["metadata"], resourceVersion=str(10 ** 8 + i))), 2.0)
    per_renewal = (time.perf_counter() - t0) / n
    fresh = {name: clock.fresh(name, 2.0) for name in clock.seen}
    t0 = time.perf_counter()
    for _ in range(repeat):
        any(clock.fresh(name, 3.0) != f for name, f in fresh.items())
    per_resync = (time.perf_counter() - t0) / repeat
    ms = lambda xs: round(statistics.median(xs) * 1000, 2)  # noqa: E731
    return {"nodes": n, "keys": len(first), "scratch_ms": ms(scratch), "one_verdict_ms": ms(one),
            "renewal_us": round(per_renewal * 1e6, 2), "resync_check_ms": round(per_resync * 1000, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,5000,10000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = [measure(int(n), args.repeat) for n in args.nodes.split(",")]
    text = json.dumps({"python": sys.version.split()[0], "rows": rows}, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
