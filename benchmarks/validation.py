#!/usr/bin/python3
"""What the validator costs a node after a driver change (issue 29): probe pods, seconds per image.

    /usr/bin/python3 benchmarks/validation.py [--sizes 1,4,16] [--keep]

On the tests' real single-node cluster (tests/support/node.py: kubelet v1.34.2, Debian's
containerd, the fake kernel driver in the node's /proc/driver, Debian's real libcuda builds), with
the chart installed by helm and containerd restarted as the docs say. For each size N it runs GPU
pods until the agent has recorded N distinct workloads (the CUDA 12.4 image with compat 550, each
pod with its own ``CUDA_CACHE_MAXSIZE``, so each is a workload of its own), then moves the driver
between 535.261.03 and 555.58.02 and measures, from the moment ``/proc/driver/nvidia/version``
changes:

* ``to_validated``: until the Node says ``compat-hook.io/validated=<the new driver>`` (the
  validator notices within its 5 s interval, probes, publishes);
* ``probe``: each probe pod's own seconds (created, the init container's copy, the probe, gone),
  median and max, from the validator's state file;
* ``rss``: the validator process's peak RSS (its log line's ``max_rss_kib``).

N=16 runs twice: with ``validator.parallel`` 4 (the default) and 1, the paired ratio.
Targets: 16 images validated within 120 s with the default (the upgrade controller waits 600 s,
the validator's own deadline is 420 s); probe median <= 10 s; peak RSS <= 128 MiB. Exit status 0
when every target holds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO)]

from tests.support import node as nodemod  # noqa: E402
from tests.support.versions import HOST_535, HOST_555  # noqa: E402

NS = nodemod.RELEASE_NAMESPACE
BB = "docker.io/library/bb"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="chval-"))
    cluster = nodemod.Cluster(work / "cp")
    node = nodemod.Node(work / "node", cluster, pause_image=f"{BB}:pause")
    admin = cluster.admin
    rows = []
    try:
        image = nodemod.project_image()
        images = nodemod.workload_images(work / "images")
        cluster.start()
        node.start(HOST_535)
        node.import_image(images, BB)
        node.import_image(image, "localhost/compat-hook")
        cluster.host_network_shim()
        node.helm("install", "compat-hook", nodemod.CHART, "-n", NS, "--create-namespace", "--set", "agent.interval=5")
        admin.wait("the DaemonSet Ready", lambda: admin.get(
            f"/apis/apps/v1/namespaces/{NS}/daemonsets/compat-hook")["status"].get("numberReady") == 1, timeout=180)
        node.restart_containerd()
        driver = HOST_535
        admin.wait("validated", lambda: _label(admin, node) == driver, timeout=120)
        pods = 0
        plan = [(n, 4) for n in sizes] + ([(max(sizes), 1)] if max(sizes) > 1 else [])
        for n, parallel in plan:
            if parallel != _parallel(node):
                node.helm("upgrade", "compat-hook", nodemod.CHART, "-n", NS, "--reuse-values",
                          "--set", f"validator.parallel={parallel}")
                admin.wait("the validator rolled", lambda: _validator_args(admin).count(f"--parallel={parallel}"),
                           timeout=120)
                admin.wait("validated", lambda: _validator_ready(admin), timeout=120)
            while pods < n:
                pod = nodemod.gpu_pod(f"bench-{pods}", node.name, f"{BB}:compat")
                pod["spec"]["containers"][0]["env"].append({"name": "CUDA_CACHE_MAXSIZE", "value": str(1 << (20 + pods))})
                admin.create("/api/v1/namespaces/apps/pods", pod)
                pods += 1
            admin.wait(f"{n} workloads recorded", lambda: len(_record(node)["workloads"]) >= n, timeout=120)
            driver = HOST_555 if driver == HOST_535 else HOST_535
            t0 = time.monotonic()
            node.set_driver(driver)
            admin.wait(f"validated={driver}", lambda: _label(admin, node) == driver, timeout=600, interval=0.2)
            took = time.monotonic() - t0
            st = json.loads(node.path("/var/lib/compat-hook-validator/validation.json").read_text())
            secs = [r["seconds"] for r in st["images"] if "seconds" in r]
            rss = _rss(node, admin)
            rows.append({"images": len(st["images"]), "parallel": parallel, "to_validated": round(took, 1),
                         "probe_median": round(statistics.median(secs), 2), "probe_max": round(max(secs), 2),
                         "rss_mib": round(rss / 1024, 1) if rss else None, "all_ok": all(r["ok"] for r in st["images"])})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        try:
            node.stop()
        finally:
            cluster.stop()
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    return _report(rows)


def _label(admin, node):
    return admin.get(f"/api/v1/nodes/{node.name}")["metadata"].get("labels", {}).get("compat-hook.io/validated")


def _record(node) -> dict:
    f = node.path("/var/lib/compat-hook-agent/workloads.json")
    return json.loads(f.read_text()) if f.exists() else {"workloads": []}


def _validator_pods(admin) -> list:
    return [p for p in admin.get(f"/api/v1/namespaces/{NS}/pods",
                                 labelSelector="app.kubernetes.io/name=compat-hook-validator")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def _validator_args(admin) -> list:
    pods = _validator_pods(admin)
    return pods[0]["spec"]["containers"][0]["command"] if len(pods) == 1 else []


def _validator_ready(admin) -> bool:
    pods = _validator_pods(admin)
    return len(pods) == 1 and nodemod.ready(pods[0])


def _parallel(node) -> int:
    return int(next(a.split("=")[1] for a in _validator_args(node.cluster.admin) if a.startswith("--parallel=")))


def _rss(node, admin) -> int | None:
    pods = _validator_pods(admin)
    for line in reversed(node.pod_log(NS, pods[0]["metadata"]["name"]).splitlines()):
        if '"event":"validation"' in line:
            return json.loads(line).get("max_rss_kib")
    return None


def _report(rows: list) -> int:
    print("\n| images | parallel | driver change -> validated (s) | probe pod median / max (s) | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['images']} | {r['parallel']} | {r['to_validated']} | {r['probe_median']} / {r['probe_max']} "
              f"| {r['rss_mib']} |")
    ok = all(r["all_ok"] for r in rows)
    big = [r for r in rows if r["parallel"] == 4 and r["images"] >= 16]
    if big:
        ok &= big[-1]["to_validated"] <= 120
        serial = [r for r in rows if r["parallel"] == 1 and r["images"] == big[-1]["images"]]
        if serial:
            print(f"\nparallel 4 / parallel 1 at {big[-1]['images']} images: "
                  f"{big[-1]['to_validated'] / serial[-1]['to_validated']:.2f}x")
    ok &= all(r["probe_median"] <= 10 for r in rows)
    ok &= all(r["rss_mib"] is None or r["rss_mib"] <= 128 for r in rows)
    print("targets:", "pass" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
