#!/usr/bin/python3
"""The fleet controller's reconcile at 1,000 to 10,000 GPU nodes, on synthetic snapshots (no server).

    /usr/bin/python3 benchmarks/fleet_reconcile.py [--nodes 1000,5000,10000] [--repeat 5]

Each node carries a published verdict (the agents' Node annotation, as :func:`nodedoc.node_doc` writes it)
and a Lease; the objects are a ClusterPolicy handing drivers to two NVIDIADrivers (two pools) with an
announced next driver on one, so every kind of key is computed (per object and version, ``driver_<v>``,
the what-if keys of a delete and a mode switch). Figures, each the median of ``--repeat`` runs, in ms:

* ``scratch``: a reconcile with an empty :class:`~compat_hook.cluster.overview.fleet.Memo` (a new leader);
* ``one_verdict``: the next reconcile after one node published a new verdict (what the 2 s target of a new
  verdict reaching the ConfigMap is about);
* ``one_renewal``: what a Lease renewal that changes no freshness costs the loop (:class:`LeaseClock.note`
  and the resync's :meth:`Fleet.flipped` test over every Lease), per renewal and per resync.

With ``--apiserver`` it also runs the fleet controller itself (``compat-hook cluster fleet``, the chart's
objects and account) on a real kube-apiserver and etcd (the tests' control plane) holding ``--live`` GPU Nodes
with published verdicts and their agents' Leases, renewed as the agents renew them (one renewal per node per
``--interval`` seconds, spread), and reports:

* ``steady_cpu_pct``: the controller's CPU (utime + stime) over ``--steady`` seconds, in % of one core
  (target: <= 2 % at 1,000 nodes);
* ``verdict_to_configmap_s``: one node's verdict changed to a regression nothing holds, until the
  ConfigMap says so (target: < 2 s at 10,000 nodes);
* its writes and reconciles meanwhile.

The agents themselves are not run here (benchmarks/fleet.py runs them); what the fleet sees of them is
their Leases and their Nodes' annotations, which is what is made.

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
    from compat_hook.cluster.node import nodedoc

    doc = nodedoc.node_doc(verdict_=verdict, target=target, target_from="NVIDIADriver pool", now=R535, gate="clear",
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
    from compat_hook.cluster.overview.fleet import LeaseClock, Memo, Snapshot, reconcile

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


def live(n: int, interval: float, steady: float) -> dict:
    """The fleet controller as a process on a real API server with ``n`` GPU nodes (module docstring)."""
    import os
    import random
    import shutil
    import subprocess
    import tempfile
    import threading

    os.environ.setdefault("COMPAT_HOOK_TEST_CACHE", str(REPO / ".cache"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fleet import _cpu_s  # benchmarks/fleet.py's: one reading of a process's CPU
    from tests.support import chart
    from tests.support.gpucluster import gpu_operator
    from tests.support.kube import ControlPlane

    work = Path(tempfile.mkdtemp(prefix="fleet-live-"))
    cp = ControlPlane(work / "cp")
    stop = threading.Event()
    fleet = None
    try:
        cp.start()
        a = cp.admin
        gpu_operator(a, R535)
        chart.apply(a, [d for d in chart.render("fleet.enabled=true") if "fleet" in d["metadata"]["name"]])
        now = time.time()
        names = [f"gpu-{i:05d}" for i in range(n)]
        lease_path = "/apis/coordination.k8s.io/v1/namespaces/compat-hook/leases"
        labels = {"app.kubernetes.io/name": "compat-hook", "app.kubernetes.io/component": "preflight"}

        def make(chunk):
            for i in chunk:
                node = _node(i, R535)
                node["metadata"].pop("resourceVersion")
                a.create("/api/v1/nodes", node)
                lease = _lease(i, time.time() + 10)
                a.create(lease_path, {"metadata": {"name": names[i], "labels": labels},
                                      "spec": dict(lease["spec"], holderIdentity=names[i])})

        threads = [threading.Thread(target=make, args=(range(k, n, 8),)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ftoken = a.create("/api/v1/namespaces/compat-hook/serviceaccounts/compat-hook-fleet/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200}})["status"]["token"]
        log = work / "fleet.log"
        fleet = subprocess.Popen(["/usr/bin/python3", "-m", "compat_hook", "cluster", "fleet", "--namespace",
                                  "compat-hook", "--identity", "bench", "--kubeconfig", str(cp.kubeconfig(ftoken, "fleet"))],
                                 cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        param = "/api/v1/namespaces/compat-hook/configmaps/compat-hook-fleet"
        key = f"clusterpolicy_cluster-policy_{R535}"
        a.wait("the fleet's first write", lambda: (a.get(param).get("data") or {}).get(key) == "ok", timeout=600,
               interval=0.5)

        def renew():  # each node's agent renews its Lease once an interval, spread
            rng = random.Random(1)
            order = list(names)
            while not stop.is_set():
                rng.shuffle(order)
                for name in order:
                    if stop.wait(interval / n):
                        return
                    t = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
                    try:
                        a.merge(f"{lease_path}/{name}", {"spec": {"renewTime": t}})
                    except Exception:
                        pass

        r = threading.Thread(target=renew, daemon=True)
        r.start()
        time.sleep(min(30.0, steady / 4))
        c0, t0 = _cpu_s(fleet.pid), time.monotonic()
        time.sleep(steady)
        c1, t1 = _cpu_s(fleet.pid), time.monotonic()
        node = names[n // 2]
        cur = a.get(f"/api/v1/nodes/{node}")
        doc = json.loads(cur["metadata"]["annotations"][f"{PREFIX}/preflight"])
        doc.update(verdict="fail", regressions=1)
        tv = time.monotonic()
        a.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {f"{PREFIX}/preflight": "fail"},
                                                       "annotations": {f"{PREFIX}/preflight": json.dumps(doc)}}})
        a.wait("the verdict in the ConfigMap", lambda: node in ((a.get(param).get("data") or {}).get(key) or ""),
               timeout=120, interval=0.02)
        latency = time.monotonic() - tv
        stop.set()
        events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        return {"nodes": n, "renewals_per_s": round(n / interval, 2), "steady_s": round(t1 - t0),
                "steady_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
                "verdict_to_configmap_s": round(latency, 2),
                "writes": sum(1 for e in events if e.get("event") == "fleet_applied"),
                "errors": sum(1 for e in events if e.get("event") == "fleet_error")}
    finally:
        stop.set()
        if fleet is not None:
            fleet.terminate()
            fleet.wait(10)
        cp.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,5000,10000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--apiserver", action="store_true", help="also run the controller on a real API server")
    ap.add_argument("--live", default="1000", help="GPU nodes on the API server (comma-separated: one run each)")
    ap.add_argument("--interval", type=float, default=300.0, help="each agent's Lease renewal period")
    ap.add_argument("--steady", type=float, default=120.0)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = [measure(int(n), args.repeat) for n in args.nodes.split(",") if n]
    result = {"python": sys.version.split()[0], "rows": rows}
    if args.apiserver:
        result["live"] = [live(int(n), args.interval, args.steady) for n in args.live.split(",")]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
