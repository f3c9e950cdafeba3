#!/usr/bin/python3
"""What compat-hook's NRI plugin adds to CreateContainer (issue 33): p50/p99 with vs without it, and its RSS.

    /usr/bin/python3 benchmarks/nri.py [--containerd all|debian|v2.2.9|v2.4.2] [--iters 40] [--rounds 3] [--out FILE]

Each containerd the tests run (``all``, the default): Debian sid's 2.1, and upstream's v2.2.9 and
v2.4.2 built from the Go module proxy (tests/support/kubebuild.py ``containerd_release``: NRI's
default validator came in 2.2, and 2.3 changed what CreateContainer hands a plugin), one after the
other, each a real containerd with NRI and CDI on, set up by
tests/test_nri.py's ``NriNode`` (compat-hook registered with ``install containerd --via nri``,
the plugin built from packaging/nri, the default runtime plain runc). Each sample is one CRI
``CreateContainer`` (then ``RemoveContainer``, untimed) in one pod sandbox: a non-GPU container
(the ``root`` image, nothing that asks for a GPU) and a GPU container (``CDI_devices``
``nvidia.com/gpu=0``). The plugin is present or absent in alternating blocks of ``--iters``
samples per kind within one run (absent: killed; present again: containerd restarted, which
starts the pre-registered plugin), ``--rounds`` times, the order flipped every round, so load,
drift and what a kill or a restart leaves behind hit both alike.
Reported: p50/p99 per kind with and without the plugin, the added p50/p99 (ms) and the ratio of
the medians, and the plugin's peak RSS (VmHWM). Targets: a non-GPU container's added p50 within
5 ms (a CreateContainer is ~25 ms on the CI machine kind, whose run-to-run noise is a few ms),
its p99 far below NRI's 2 s request budget, the plugin's RSS under 32 MiB. Nothing is timed in
the test suite.

The measuring takes about 30 s on 2 cores; the first run also builds what it needs into the test
cache (containerd 2.x, the plugin, the test image: several minutes). Progress goes to stderr, a
line per step with the seconds since the start; the JSON result to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from timing import median, pct  # noqa: E402

from tests.support import debs, engines, kubebuild  # noqa: E402
from tests.test_nri import COMPAT, GPU, IMAGE, OLD, NriNode  # noqa: E402


def _create_ms(node, name: str, tag: str, cdi=()) -> float:
    cfg = node.client.container_config(name, f"{IMAGE}:{tag}", ["/bin/true"], cdi_devices=cdi)
    t0 = time.perf_counter()
    cid = node.client.create_container(node.pod, node.sandbox, cfg)
    ms = (time.perf_counter() - t0) * 1000
    node.client.remove_container(cid)
    return ms


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _reported(bin_dir: Path) -> str:
    """What ``containerd --version`` says (``containerd github.com/... v2.1.9 ...``): its third word."""
    out = subprocess.run([str(bin_dir / "containerd"), "--version"], capture_output=True, text=True, timeout=30).stdout
    words = out.split()
    return words[2] if len(words) > 2 else out.strip()


_T0 = time.monotonic()


def say(line: str) -> None:
    print(f"nri.py: [{time.monotonic() - _T0:4.0f} s] {line}", file=sys.stderr, flush=True)


def measure(version: str, bin_dir: Path, libs: dict, args) -> dict:
    """One containerd's cells: p50/p99 per kind with and without the plugin, and the plugin's peak RSS."""
    work = Path(tempfile.mkdtemp(prefix=f"chnri-{version}-"))
    samples = {(k, on): [] for k in ("non_gpu", "gpu") for on in (True, False)}
    rss = []
    node = None
    n = 0
    try:
        node = NriNode(work, engines.build_image(work / "image", libs), libs, bin_dir)
        say(f"containerd {version} is up with compat-hook's NRI plugin registered")

        def plugin(on: bool) -> int | None:
            """Make the plugin present (containerd restarted: it starts it) or absent (killed)."""
            pids = node.wait_plugin(True, timeout=1)
            if on and not pids:
                node.daemon.restart()
                pids = node.wait_plugin(True)
                node.reconnect(f"gen-{n}")
            elif not on and pids:
                os.kill(pids[0], signal.SIGKILL)
                assert not node.wait_plugin(False)
            return pids[0] if on else None

        for r in range(args.rounds):
            # The order flips every round: whatever a kill or a restart does to the next block
            # (a fresh containerd, a cold cache) falls on both sides alike.
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                say(f"{version} round {r + 1}/{args.rounds}: {2 * args.iters} CreateContainer with the plugin "
                    f"{'present' if on else 'absent'} ...")
                pid = plugin(on)
                for _ in range(args.iters):  # the two kinds interleaved
                    n += 1
                    samples[("non_gpu", on)].append(_create_ms(node, f"plain-{n}", "root"))
                    samples[("gpu", on)].append(_create_ms(node, f"gpu-{n}", "compat", [GPU]))
                if on:
                    rss.append(_rss_kib(pid))
    finally:
        if node is not None:
            say(f"stopping containerd {version}")
            node.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result = {"rss_kib": max(rss), "load": os.getloadavg()}
    for kind in ("non_gpu", "gpu"):
        on, off = samples[(kind, True)], samples[(kind, False)]
        result[kind] = {
            "with": {"p50_ms": round(median(on), 3), "p99_ms": round(pct(on, 99), 3), "n": len(on)},
            "without": {"p50_ms": round(median(off), 3), "p99_ms": round(pct(off, 99), 3), "n": len(off)},
            "added_p50_ms": round(median(on) - median(off), 3),
            "added_p99_ms": round(pct(on, 99) - pct(off, 99), 3),
            "ratio_p50": round(median(on) / median(off), 3),
        }
    ng = result["non_gpu"]
    result["targets"] = {"non_gpu_added_p50_within_5ms": ng["added_p50_ms"] <= 5.0,
                         "non_gpu_p99_within_request_budget": ng["with"]["p99_ms"] < 2000,
                         "rss_under_32mib": result["rss_kib"] < 32 * 1024}
    return result


def main() -> int:
    versions = ("debian", *kubebuild.CONTAINERD_RELEASES)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--containerd", choices=("all", *versions), default="all",
                    help="which containerd: Debian sid's 2.1, an upstream release, or each in turn (default)")
    ap.add_argument("--iters", type=int, default=40, help="samples per kind per block")
    ap.add_argument("--rounds", type=int, default=3, help="with/without blocks")
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--keep", action="store_true", help="keep the work dirs")
    args = ap.parse_args()
    which = versions if args.containerd == "all" else (args.containerd,)
    say("preparing: the libcuda debs, " + ", ".join(f"containerd {v}" for v in which) + ", the plugin, the test "
        "image (built into the test cache the first time: minutes each) ...")
    libs = {v: debs.libcuda(v) for v in (OLD, COMPAT)}
    bins = {v: engines.containerd2() if v == "debian" else kubebuild.containerd_release(v) for v in which}
    result = {"iters": args.iters, "rounds": args.rounds, "containerd": {}}
    for v in which:
        cell = measure(v, bins[v], libs, args)
        # the version the binary reports (Debian's: 2.1.x), beside the name asked for
        cell["version"] = _reported(bins[v])
        result["containerd"][v] = cell
    text = json.dumps(result, indent=2)
    say("done")
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(all(c["targets"].values()) for c in result["containerd"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
