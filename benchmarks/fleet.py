#!/usr/bin/python3
"""The cluster agent at fleet scale (issue 26): 1,000 GPU Nodes on a real kube-apiserver and etcd.

    /usr/bin/python3 benchmarks/fleet.py [--nodes 1000] [--workers 8] [--interval 300] [--steady 600]

The control plane is the tests' (tests/support/kube.py: etcd, kube-apiserver v1.34). It holds
``--nodes`` real Node objects (labelled as GPU Feature Discovery labels GPU nodes), one GPU pod
bound to each, the ClusterPolicy, and the agent's permissions. The agents are the real agent code
(``compat_hook.cluster.node.agent.Agent``), one per node, each with its own node identity, its own
connection and its own watches, run as threads of ``--workers`` processes; every node's host root is
the same fake driver (R535, an A100) and its store the same OCI layout.

Phases, each counted by the API server itself (``apiserver_request_total`` from ``/metrics``, by
verb and resource; a watch is counted when it ends):

1. start: every agent lists and watches, then publishes (first Node write, ConfigMap, Lease, Event);
2. steady state for ``--steady`` seconds: requests per pass and per node per hour, Node writes;
3. a ``next-driver`` announced on the ClusterPolicy: requests in the next 60 s, per node, and how
   they spread over time;
4. ``compat-hook cluster status`` over all nodes: wall time and requests;
5. one agent as its own process (``cluster agent``, as the DaemonSet runs it) for 60 s: its peak RSS.

Beside the agents, from phase 1 on, the fleet controller (``cluster fleet``, the chart's account and
objects) runs as its own process: its CPU over the steady state (``fleet.steady_cpu_pct``, of one core;
target <= 2 % at 1,000 nodes), its reconciles and writes, and how long a new verdict takes to reach its
ConfigMap (``fleet.verdict_to_configmap_s``: one node's preflight changed to a regression nothing holds, until
the key says so; target < 2 s at 10,000 nodes). ``benchmarks/fleet_reconcile.py`` times the reconcile alone
at 1,000 to 10,000 nodes.

The figures go to stdout as JSON (``--out FILE`` too); benchmarks/README.md quotes a run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _worker(args) -> int:
    """One process of simulated agents: ``args.names`` (comma-separated), each the real Agent in a thread."""
    from compat_hook.cluster.node import agent as agentmod
    from compat_hook.cluster.api import kube
    from compat_hook.core import config as configmod

    names = args.names.split(",")
    load = lambda: configmod.load(args.config)  # noqa: E731 - the file again at every pass, as the agent does
    cfg0 = load()
    cfg0 = cfg0.replace(host_root=args.host_root)

    def run(name: str) -> None:
        time.sleep(random.uniform(0, args.stagger))
        opts = agentmod.AgentOptions(name, stores=[f"oci:{args.store}"], state_dir=os.path.join(args.state, name),
                                     interval=args.interval, publish_namespace="compat-hook")
        a = agentmod.Agent(lambda: kube.connect(args.kubeconfig), lambda: load().replace(host_root=args.host_root),
                           opts)
        a.run()

    for n in names:
        threading.Thread(target=run, args=(n,), daemon=True).start()
    while True:
        time.sleep(3600)


def _metrics(cp) -> dict:
    """``apiserver_request_total``, asked again while an API server busy with the fleet times out."""
    for _ in range(20):
        try:
            return cp.metrics()
        except OSError:
            time.sleep(1)
    return cp.metrics()


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _save(args, out: dict) -> None:
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


def _delta(a: dict, b: dict) -> dict:
    return {f"{v} {r}": b[k] - a.get(k, 0) for k in sorted(b) for v, r in [k] if b[k] - a.get(k, 0)}


def _agent_requests(d: dict) -> dict:
    """The requests of the agents (their resources), not the benchmark's own ``/metrics`` reads."""
    mine = ("nodes", "pods", "leases", "configmaps", "events", "clusterpolicies", "nvidiadrivers")
    return {k: n for k, n in d.items() if k.split(" ", 1)[1] in mine}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--interval", type=float, default=300.0)
    ap.add_argument("--steady", type=float, default=600.0)
    ap.add_argument("--stagger", type=float, default=300.0,
                    help="agents start spread over this many seconds (a DaemonSet rolls out over minutes)")
    ap.add_argument("--out")
    ap.add_argument("--keep", action="store_true")
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    for a in ("names", "kubeconfig", "config", "host_root", "store", "state"):
        w.add_argument(f"--{a.replace('_', '-')}", dest=a, required=True)
    w.add_argument("--interval", type=float, dest="interval", default=300.0)
    w.add_argument("--stagger", type=float, dest="stagger", default=60.0)
    args = ap.parse_args()
    if args.cmd == "worker":
        return _worker(args)

    os.environ.setdefault("COMPAT_HOOK_TEST_CACHE", str(REPO / ".cache"))
    from tests.support import hookenv
    from tests.support.gpucluster import A100, R535, R570, CP, agent_rbac, build_store, gpu_node, gpu_operator, gpu_pod, ref, runtime_classes
    from tests.support.kube import ADMIN_TOKEN, AGENT_TOKEN, ControlPlane, client_version, clients

    work = Path(tempfile.mkdtemp(prefix="fleet-"))
    cp = ControlPlane(work / "cp")
    procs: list = []
    out: dict = {"nodes": args.nodes, "workers": args.workers, "interval_s": args.interval}
    try:
        t0 = time.monotonic()
        cp.start()
        agent_rbac(cp)
        a = cp.admin
        runtime_classes(a)
        gpu_operator(a, R535)
        names = [f"gpu-{i:04d}" for i in range(args.nodes)]

        def make(chunk):
            for n in chunk:
                a.create("/api/v1/nodes", gpu_node(n))
                a.create("/api/v1/namespaces/apps/pods", gpu_pod(f"app-{n}", n, ref("legacy")))

        threads = [threading.Thread(target=make, args=(names[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["setup_s"] = round(time.monotonic() - t0, 1)
        store = build_store(work / "store", ["legacy"])
        host = work / "host"
        hookenv.set_host_version(host, R535)
        info = host / "proc/driver/nvidia/gpus/0000:17:00.0/information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Model: \t\t {A100}\nBus Location: \t 0000:17:00.0\n")
        config = hookenv.write_config(work / "agent.yaml", host_root=host, log_file=work / "decisions.log", nvml="off",
                                      cluster={"gate_upgrade": True})
        kc = cp.kubeconfig(AGENT_TOKEN, "agent")
        py = clients()["latest"]
        out["kubernetes_client"] = client_version(py)
        # the fleet controller, with the chart's objects and its own account's token
        from tests.support import chart

        chart.apply(a, [d for d in chart.render("fleet.enabled=true") if "fleet" in d["metadata"]["name"]
                        and d["kind"] != "Deployment"])
        ftoken = a.create("/api/v1/namespaces/compat-hook/serviceaccounts/compat-hook-fleet/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200}})["status"]["token"]
        flog = (work / "fleet.log").open("wb")
        fleet = subprocess.Popen([py, "-m", "compat_hook", "cluster", "fleet", "--namespace", "compat-hook",
                                  "--identity", "bench", "--kubeconfig", str(cp.kubeconfig(ftoken, "fleet"))],
                                 cwd=REPO, stdout=flog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(fleet)

        # 1. start
        m0 = _metrics(cp)
        t_start = time.monotonic()
        for i in range(args.workers):
            chunk = names[i::args.workers]
            log = (work / f"worker-{i}.log").open("wb")
            procs.append(subprocess.Popen(
                [py, __file__, "worker", "--names", ",".join(chunk), "--kubeconfig", str(kc), "--config", str(config),
                 "--host-root", str(host), "--store", str(store), "--state", str(work / "state"),
                 "--interval", str(args.interval), "--stagger", str(args.stagger)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

        def leases() -> int:
            try:  # an API server busy with a thousand agents starting may time a request out
                return len(a.get("/apis/coordination.k8s.io/v1/namespaces/compat-hook/leases")["items"])
            except OSError:
                return 0

        a.wait("every agent's first pass", lambda: leases() >= args.nodes, timeout=args.stagger + 900, interval=5)
        m1 = _metrics(cp)
        out["start"] = {"seconds": round(time.monotonic() - t_start, 1),
                        "requests": _agent_requests(_delta(m0, m1))}

        _save(args, out)

        # 2. steady state
        time.sleep(min(30.0, args.interval / 4))
        m1 = _metrics(cp)
        t1 = time.monotonic()
        c1 = _cpu_s(fleet.pid)
        time.sleep(args.steady)
        c2 = _cpu_s(fleet.pid)
        m2 = _metrics(cp)
        steady = _agent_requests(_delta(m1, m2))
        secs = time.monotonic() - t1
        passes = steady.get("UPDATE leases", 0) + steady.get("PUT leases", 0)
        total = sum(steady.values())
        node_writes = steady.get("PATCH nodes", 0) + steady.get("UPDATE nodes", 0)
        per_hour = total / args.nodes * 3600 / secs
        # A watch is counted when it ends: four per agent, each ended by the server after 30-60 min
        # (45 on average), so 4 x 60/45 an hour that a window shorter than that does not see.
        watches = 4 * 3600 / 2700
        out["steady"] = {"seconds": round(secs), "requests": steady, "passes": passes,
                         "requests_per_pass": round(total / passes, 3) if passes else None,
                         "requests_per_node_per_hour": round(per_hour, 2),
                         "with_watch_renewals_per_node_per_hour": round(per_hour + watches, 2),
                         "with_watch_renewals_per_pass": round((per_hour + watches) / (3600 / args.interval), 3),
                         "node_writes": node_writes}
        flines = [json.loads(x) for x in (work / "fleet.log").read_text(errors="replace").splitlines()
                  if x.startswith("{")]
        out["fleet"] = {"steady_cpu_pct": round(100 * (c2 - c1) / (time.monotonic() - t1), 2),
                        "writes": sum(1 for e in flines if e.get("event") == "fleet_applied"),
                        "errors": sum(1 for e in flines if e.get("event") == "fleet_error")}
        # a new verdict (one node's regression that nothing holds) until the fleet's ConfigMap says so
        param = "/api/v1/namespaces/compat-hook/configmaps/compat-hook-fleet"
        key = f"clusterpolicy_cluster-policy_{R535}"
        node = names[len(names) // 2]
        doc = json.loads(a.get(f"/api/v1/nodes/{node}")["metadata"]["annotations"]["compat-hook.io/preflight"])
        doc.update(verdict="fail", complete=True, regressions=1, gate="off")
        t_v = time.monotonic()
        a.merge(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"compat-hook.io/preflight": "fail"},
                                                       "annotations": {"compat-hook.io/preflight": json.dumps(doc)}}})
        a.wait("the verdict in the ConfigMap", lambda: node in ((a.get(param).get("data") or {}).get(key) or ""),
               timeout=120, interval=0.05)
        out["fleet"]["verdict_to_configmap_s"] = round(time.monotonic() - t_v, 2)

        _save(args, out)

        # 3. an announced next-driver
        m2 = _metrics(cp)
        samples = []
        for _ in range(10):
            try:
                a.merge(CP, {"metadata": {"annotations": {"compat-hook.io/next-driver": R570}}})
                break
            except OSError:
                time.sleep(1)
        t2 = time.monotonic()
        prev = m2
        while time.monotonic() - t2 < 60:
            time.sleep(5)
            m = _metrics(cp)
            samples.append((round(time.monotonic() - t2), sum(_agent_requests(_delta(prev, m)).values())))
            prev = m
        m3 = prev
        ann = _agent_requests(_delta(m2, m3))
        out["announce"] = {"requests": ann, "requests_per_node": round(sum(ann.values()) / args.nodes, 3),
                           "per_5s": samples}

        _save(args, out)

        # 4. cluster status over every node
        m3 = _metrics(cp)
        t3 = time.monotonic()
        p = subprocess.run([py, "-m", "compat_hook", "cluster", "status", "--kubeconfig",
                            str(cp.kubeconfig(ADMIN_TOKEN, "admin")), "--json"], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
        wall = time.monotonic() - t3
        m4 = _metrics(cp)
        doc = json.loads(p.stdout)
        out["status"] = {"wall_s": round(wall, 2), "exit": p.returncode, "rows": len(doc["nodes"]),
                         "requests": {k: n for k, n in _delta(m3, m4).items() if not k.endswith(" ")
                                      and k.split(" ", 1)[1] in ("nodes", "leases", "clusterpolicies", "nvidiadrivers")}}

        # 5. one agent as its own process: its peak RSS
        one = subprocess.Popen([py, "-m", "compat_hook", "cluster", "agent", "--node", "gpu-solo", "--kubeconfig", str(kc),
                                "--store", f"oci:{store}", "--host-root", str(host), "--config", str(config),
                                "--state-dir", str(work / "state" / "solo"), "--interval", "10"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        a.create("/api/v1/nodes", gpu_node("gpu-solo"))
        a.create("/api/v1/namespaces/apps/pods", gpu_pod("app-gpu-solo", "gpu-solo", ref("legacy")))
        time.sleep(60)
        out["agent_process_peak_rss_kib"] = _rss_kib(one.pid)
        one.terminate()
        one.wait(10)
        out["worker_peak_rss_kib"] = [_rss_kib(p.pid) for p in procs]
        errors = 0
        for i in range(args.workers):
            for line in (work / f"worker-{i}.log").read_text(errors="replace").splitlines():
                errors += '"event":"cluster_error"' in line or "Traceback" in line
        out["agent_errors"] = errors
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        cp.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
