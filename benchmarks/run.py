#!/usr/bin/python3
"""compat-hook benchmarks (issue 6): medians, A/B interleaved, ratios to a same-run baseline.

    /usr/bin/python3 benchmarks/run.py [--quick] [--out benchmarks/results/latest.json]
        [--bare-site] [--compare DIR]

Every timed row is run as a child process exactly as production runs it (the
hook: registration.hook_entry's argv and env, state JSON on stdin); each
iteration runs the baseline (``<same interpreter> -I -c pass``) and then the
subject, so drift and load hit both alike. ``--bare-site``: the whole run in
a private mount namespace where the interpreter's site dirs' ``.pth`` files
read as empty, so the baseline is an interpreter without third-party ``.pth``
files (what a node's may well be). ``--compare DIR``: the hook's and the
wrapper's start rows also for the compat_hook of another checkout (``before_*``),
interleaved in the same run. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fixtures  # noqa: E402
import timing  # noqa: E402
from timing import median, pct  # noqa: E402

RUNC = fixtures.rts.RUNC
LDCONFIG = "/sbin/ldconfig"
RSS_LIMIT_KB = 25 * 1024


class Row:
    def __init__(self, name, what, argv, env=None, stdin=None, prep=None, group="hook", baseline=None):
        self.name, self.what, self.argv, self.env, self.stdin = name, what, argv, env, stdin
        self.prep, self.group = prep, group
        self.baseline = baseline  # name of a paired row (A/B against it instead of python) or None
        self.times, self.rss, self.errors, self.base = [], [], 0, []

    def argv_now(self):
        return self.argv() if callable(self.argv) else self.argv


def toolkit_binaries() -> Path | None:
    """``nvidia-cdi-hook`` of the toolkit the tests install (v1.20.2, built on first use), or None."""
    sys.path.insert(0, str(HERE.parent))
    try:
        from tests.support import toolkit
    except ImportError:
        return None
    try:
        return Path(toolkit.ensure().cdi_hook)
    except Exception as e:  # no Go, no network: the row says so
        print(f"[bench] the NVIDIA toolkit is not available: {e}", file=sys.stderr)
        return None


def _last_log(log: Path) -> dict:
    try:
        return json.loads(log.read_text().splitlines()[-1])
    except (OSError, IndexError, ValueError):
        return {}


#: Our drop-in in a rootfs.
DROPIN = "etc/ld.so.conf.d/00-00-compat-hook.conf"
#: The start rows measured again for the checkout given with --compare.
COMPARED = ("hook_nogpu", "hook_nocompat", "hook_compat_warm", "hook_compat_dropin", "wrapper_create")


def build_rows(fx: fixtures.Fixtures, wrapper: Path | None, before: tuple | None = None):
    """The rows; ``before``: ``(hook argv, wrapper)`` of the --compare checkout, for its ``before_*`` rows."""
    args, env = fx.hook_argv()
    cold_dir = fx.work / "state-cold"
    rows = []

    def H(name, what, state, prep=None, argv=args):
        rows.append(Row(name, what, argv, env, fx.states[state], prep))

    def fresh():
        shutil.rmtree(cold_dir, ignore_errors=True)  # a fresh state dir each run: nothing seen before

    def cold():
        # first sight of the library: its cache entries go, the parsed config stays
        d = cold_dir / "cache"
        for n in os.listdir(d) if d.is_dir() else ():
            if n.startswith("elf-"):
                os.unlink(d / n)

    cold_args, _ = fx.hook_argv(cold_dir)
    H("hook_nogpu", "hook, non-GPU container", "nogpu")
    H("hook_nocompat", "hook, GPU container without compat libs", "nocompat")
    rows.append(Row("ldconfig", "/sbin/ldconfig -r <rootfs> alone", [LDCONFIG, "-r", str(fx.rootfs["stub"])],
                    group="child"))
    H("hook_compat_warm", "hook enabling compat, library seen before (warm cache)", "stub")

    def no_dropin(d=fx.rootfs["dropin"] / DROPIN):
        try:
            d.unlink()
        except FileNotFoundError:
            pass
    H("hook_compat_dropin", "hook enabling compat, library seen before, the drop-in written (a first start)",
      "dropin", prep=no_dropin)
    H("hook_compat_cold", "hook enabling compat, library first sight (600 B stub; config cached)", "stub",
      prep=cold, argv=cold_args)
    if "real" in fx.bundles:
        H("hook_compat_cold_real", "hook enabling compat, library first sight, 28 MB real libcuda", "real",
          prep=cold, argv=cold_args)
    H("hook_compat_fresh", "hook enabling compat, fresh state dir (library and config unseen)", "stub",
      prep=fresh, argv=cold_args)
    H("hook_nocompat_bigspec", f"hook, GPU no compat, {fx.size('nocompat_big') >> 10} KiB config.json", "nocompat_big")
    H("hook_compat_500files", "hook enabling compat, compat dir with 500 files (warm)", "many")
    rows.append(Row("ldconfig_500files", "/sbin/ldconfig -r <rootfs with the 500-file compat dir> alone",
                    [LDCONFIG, "-r", str(fx.rootfs["many"])], group="child"))
    tk = toolkit_binaries()
    if tk is not None:
        # The toolkit's own pair as a CDI spec runs it (docs/background.md "The NVIDIA toolkit"), on
        # the same stub image and host version; each run starts from the image's own drop-ins.
        troot = fx.rootfs["toolkit"]

        def clean_toolkit():
            d = troot / "etc/ld.so.conf.d"
            for n in os.listdir(d):
                if n.startswith(("00-compat-", "00-nvcr-", "zz-nvcr-")):
                    os.unlink(d / n)
        tkenv = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVIDIA_CTK_DEBUG": "false"}
        rows.append(Row("toolkit_enable_cuda_compat", "NVIDIA toolkit: nvidia-cdi-hook enable-cuda-compat (writes)",
                        [str(tk), "enable-cuda-compat", f"--host-driver-version={fixtures.HOST_DRIVER}"],
                        tkenv, fx.states["toolkit"], clean_toolkit, group="toolkit"))
        # update-ldcache pivot_roots into the rootfs, which must be a mount point (as a
        # container's is): it runs in a private mount namespace with the rootfs bound onto
        # itself, and is paired with the same wrapper around /bin/true, so the row's delta
        # is update-ldcache's own time.
        def in_ns(*argv):
            return ["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                    'mount --bind "$0" "$0" && exec "$@"', str(troot), *argv]
        rows.append(Row("toolkit_ns_true", "unshare -m + bind mount of the rootfs + /bin/true (for the pair below)",
                        in_ns("/bin/true"), tkenv, group="child"))
        rows.append(Row("toolkit_update_ldcache", "NVIDIA toolkit: nvidia-cdi-hook update-ldcache",
                        in_ns(str(tk), "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"),
                        tkenv, fx.states["toolkit"], clean_toolkit, group="toolkit", baseline="toolkit_ns_true"))
    dist = fixtures.registration.python_paths()[1:]  # where PyYAML and pyelftools live
    rows.append(Row("import_pyelftools", "python -I -S: import elftools.elf.elffile (pyelftools' ELF reader, for scale)",
                    [args[0], "-I", "-S", "-c", f"import sys;sys.path[:0]={dist!r};import elftools.elf.elffile"],
                    group="info"))
    rows.append(Row("import_yaml", "python -I -S: import yaml (what the config cache avoids)",
                    [args[0], "-I", "-S", "-c", f"import sys;sys.path[:0]={dist!r};import yaml"], group="info"))
    # wrapper
    rstate = fx.work / "runc-root"
    rstate.mkdir(exist_ok=True)
    renv = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "COMPAT_HOOK_CONFIG": str(fx.config)}
    for verb in ("features", "list"):
        extra = ["--root", str(rstate)] if verb == "list" else []
        rows.append(Row(f"runc_{verb}", f"runc {verb} directly", [RUNC, *extra, verb], renv, group="wrapper"))
        if wrapper:
            rows.append(Row(f"wrapper_{verb}", f"wrapper {verb} (pass-through)", [str(wrapper), *extra, verb],
                            renv, group="wrapper", baseline=f"runc_{verb}"))
    if wrapper:
        bundle = fx.bundles["stub"]
        spec = (bundle / "config.json").read_bytes()

        def restore():
            (bundle / "config.json").write_bytes(spec)
        tenv = dict(renv, COMPAT_HOOK_CONFIG=str(fx.config_true))
        rows.append(Row("true", "/bin/true (the stand-in runtime's own time)", ["/bin/true"], group="child"))
        rows.append(Row("wrapper_create", "wrapper create, spec rewrite, real runtime = /bin/true",
                        [str(wrapper), "--root", str(rstate), "create", "--bundle", str(bundle), "bench-create"],
                        tenv, prep=restore, group="wrapper"))
    if before is not None:
        bargs, bwrapper = before
        for r in list(rows):
            if r.name in COMPARED and (r.name != "wrapper_create" or bwrapper is not None):
                argv = bargs if r.group == "hook" else [str(bwrapper)] + r.argv[1:]
                rows.append(Row("before_" + r.name, r.what + " (--compare checkout)", argv, r.env, r.stdin,
                                r.prep, group="before"))
    # end to end
    counter = iter(range(10 ** 9))
    for name, what in (("nohook", "runc run, no hook"), ("hook_nogpu", "runc run + hook, non-GPU"),
                       ("hook_nocompat", "runc run + hook, GPU no compat libs"),
                       ("hook_compat", "runc run + hook enabling compat (warm)")):
        b = fx.e2e[name]
        rows.append(Row(f"e2e_{name}", what,
                        (lambda b=b: [RUNC, "--root", str(rstate), "run", "--bundle", str(b),
                                      f"bench-e2e-{os.getpid()}-{next(counter)}"]),
                        {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, group="e2e",
                        baseline=None if name == "nohook" else "e2e_nohook"))
    return rows


_BARE = "COMPAT_HOOK_BENCH_BARE_SITE"


def _reexec_bare_site() -> None:
    """Run this very command again in a private mount namespace with every site dir's .pth emptied.

    The baseline ``python -I -c pass`` runs ``site``, which executes each
    ``.pth`` file's import lines (setuptools' distutils hack, namespace
    packages, whatever the machine added): here they are bind mounts of
    /dev/null, for this process tree only.
    """
    import site

    pth = sorted(str(p) for d in site.getsitepackages() if os.path.isdir(d) for p in Path(d).glob("*.pth"))
    script = ('while [ "$1" != -- ]; do mount --bind /dev/null "$1" || exit 1; shift; done; shift; '
              'exec "$@"')
    os.environ[_BARE] = "1"
    print(f"[bench] --bare-site: {len(pth)} .pth file(s) read as empty: {' '.join(pth) or '-'}", file=sys.stderr)
    os.execvp("unshare", ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh",
                          *pth, "--", sys.executable, *sys.argv])


def measure(rows, base_argv, iters, warmup=2):
    by = {r.name: r for r in rows}
    for r in rows:
        for _ in range(warmup):
            if r.prep:
                r.prep()
            timing.run_once(r.argv_now(), r.env, r.stdin)
    for _ in range(iters):
        for r in rows:
            pair = by.get(r.baseline)
            if pair is not None:  # A/B against the paired row (e.g. wrapper vs runc)
                if pair.prep:
                    pair.prep()
                ms, rc, rss = timing.run_once(pair.argv_now(), pair.env, pair.stdin)
                r.base.append(ms)
            else:
                ms, _, _ = timing.run_once(base_argv)
                r.base.append(ms)
            if r.prep:
                r.prep()
            ms, rc, rss = timing.run_once(r.argv_now(), r.env, r.stdin)
            r.times.append(ms)
            r.errors += rc != 0
    for r in rows:  # peak RSS, 3 runs each through GNU time (see timing.peak_rss_kb)
        for _ in range(3):
            if r.prep:
                r.prep()
            kb = timing.peak_rss_kb(r.argv_now(), r.env, r.stdin)
            if kb is not None:
                r.rss.append(kb)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (~30 s)")
    ap.add_argument("--iters", type=int, help="iterations per row (default 30, --quick 8)")
    ap.add_argument("--out", default=str(HERE / "results" / "latest.json"))
    ap.add_argument("--keep", action="store_true", help="keep the fixture tree")
    ap.add_argument("--bare-site", action="store_true",
                    help="run in a private mount namespace where the site dirs' .pth files read as empty")
    ap.add_argument("--compare", metavar="DIR",
                    help="also measure the start rows of the compat_hook in checkout DIR (before_*)")
    o = ap.parse_args()
    if o.bare_site and not os.environ.get(_BARE):
        _reexec_bare_site()
    iters = o.iters or (8 if o.quick else 30)
    conc_rounds = 3 if o.quick else 10
    t_start = time.monotonic()
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="compat-hook-bench-"))
    try:
        fx = fixtures.Fixtures(work / "w")
        args, env = fx.hook_argv()
        py = args[0]
        base_argv = [py, "-I", "-c", "pass"]
        wrapper = None
        try:
            from compat_hook.install.wrapper import render_wrapper
            wrapper = work / "compat-hook-runtime"
            wrapper.write_text(render_wrapper(str(fx.config), python=py))
            wrapper.chmod(0o755)
        except Exception as e:  # the wrapper is not there (yet)
            print(f"[bench] wrapper not available: {e}", file=sys.stderr)
            wrapper = None
        before = None
        if o.compare:
            from compat_hook.install.wrapper import render_wrapper
            bpaths = [str(Path(o.compare).resolve())] + fixtures.registration.python_paths()[1:]
            if not (Path(bpaths[0]) / "compat_hook" / "cli.py").is_file():
                ap.error(f"--compare {o.compare}: no compat_hook there")
            bwrapper = work / "compat-hook-runtime-before"
            bwrapper.write_text(render_wrapper(str(fx.config), python=py, paths=bpaths))
            bwrapper.chmod(0o755)
            before = (fx.hook_argv(paths=bpaths)[0], bwrapper)
        rows = build_rows(fx, wrapper, before)
        # sanity: each hook row's decision, once
        checks = {}
        for r in rows:
            if r.group == "hook":
                if r.prep:
                    r.prep()
                timing.run_once(r.argv_now(), r.env, r.stdin)
                rec = fixtures_last = _last_log(fx.log)
                checks[r.name] = {"decision": rec.get("decision"), "reason": rec.get("reason"),
                                  "elf_source": rec.get("elf_source"), "actions": rec.get("actions")}
        measure(rows, base_argv, iters)
        # concurrency: 32 hooks enabling compat at once, each on its own rootfs (warm)
        states = [str(fx.states[f"conc{i}"]) for i in range(len(fx.conc_bundles))]
        log_before = len(fx.log.read_text().splitlines())
        for st in states:  # warm: each copy is a new inode, so its first run is a first sight
            timing.run_once(args, env, st)
        log_before = len(fx.log.read_text().splitlines())
        lat, cerr, crss = [], 0, 0
        for _ in range(conc_rounds):
            la, e, rs = timing.concurrent(32, args, env, states)
            lat += la
            cerr += e
            crss = max(crss, rs)
        new = fx.log.read_text().splitlines()[log_before:]
        log_errors = sum(1 for ln in new if json.loads(ln).get("decision") in ("error", None))
        self_ms = [json.loads(ln).get("duration_ms") or 0 for ln in new]
        all_log_errors = sum(1 for ln in fx.log.read_text().splitlines()
                             if json.loads(ln).get("decision") in ("error", None))
    finally:
        if not o.keep:
            shutil.rmtree(work, ignore_errors=True)

    by = {r.name: r for r in rows}
    base_all = [x for r in rows if r.baseline is None for x in r.base]
    B = median(base_all)
    res_rows = []
    for r in rows:
        m = median(r.times)
        bm = median(r.base)
        res_rows.append({"name": r.name, "what": r.what, "group": r.group, "n": len(r.times),
                         "median_ms": round(m, 2), "p90_ms": round(pct(r.times, 90), 2),
                         "min_ms": round(min(r.times), 2),
                         "pair": r.baseline or "python -I -c pass", "pair_median_ms": round(bm, 2),
                         "ratio": round(m / bm, 3), "delta_ms": round(m - bm, 2),
                         "max_rss_kb": max(r.rss) if r.rss else 0, "errors": r.errors})
    R = {x["name"]: x for x in res_rows}
    targets = []

    def T(name, ok, detail):
        targets.append({"target": name, "pass": bool(ok), "detail": detail})

    for n in ("hook_nogpu", "hook_nocompat"):
        x = R[n]
        T(f"{n} <= 1.2x python -I -c pass", x["ratio"] <= 1.2, f"{x['ratio']:.2f}x ({x['median_ms']} vs {x['pair_median_ms']} ms)")
    ld = R["ldconfig"]["median_ms"]
    w = R["hook_compat_warm"]
    lim = 1.5 * w["pair_median_ms"] + ld
    T("hook_compat_warm <= 1.5x baseline + ldconfig", w["median_ms"] <= lim,
      f"{w['median_ms']} ms vs limit {lim:.2f} ms (1.5 x {w['pair_median_ms']} + ldconfig {ld})")
    c = R["hook_compat_cold"]
    T("hook_compat_cold <= 6x baseline", c["ratio"] <= 6, f"{c['ratio']:.2f}x ({c['median_ms']} ms)")
    f = R["hook_compat_fresh"]
    T("hook_compat_fresh (empty state dir) <= 6x baseline", f["ratio"] <= 6, f"{f['ratio']:.2f}x ({f['median_ms']} ms)")
    if "hook_compat_cold_real" in R:
        rr = R["hook_compat_cold_real"]
        q = rr["median_ms"] / c["median_ms"]
        T("28 MB libcuda within 10% of the stub (first sight)", q <= 1.10, f"{q:.3f}x ({rr['median_ms']} vs {c['median_ms']} ms)")
        T("hook_compat_cold (28 MB) <= 6x baseline", rr["ratio"] <= 6, f"{rr['ratio']:.2f}x")
    else:
        T("28 MB libcuda within 10% of the stub", False, "not available (no real libcuda)")
    m5, ld5 = R["hook_compat_500files"], R["ldconfig_500files"]["median_ms"]
    lim = 1.5 * m5["pair_median_ms"] + ld5
    T("hook_compat_500files <= 1.5x baseline + its ldconfig (same rule as warm)", m5["median_ms"] <= lim,
      f"{m5['median_ms']} ms vs limit {lim:.2f} ms (ldconfig alone {ld5} ms)")
    comparisons = {}
    if "toolkit_enable_cuda_compat" in R:
        # The incumbent's Go pair (two processes, its ldconfig in fresh namespaces, a new
        # drop-in each run) against compat-hook's one Python hook, same image, same run.
        pair = R["toolkit_enable_cuda_compat"]["median_ms"] + R["toolkit_update_ldcache"]["delta_ms"]
        for n in ("hook_compat_dropin", "hook_compat_warm"):
            comparisons[f"{n}_vs_toolkit_pair"] = {
                "toolkit_pair_ms": round(pair, 2), "hook_ms": R[n]["median_ms"],
                "ratio": round(R[n]["median_ms"] / pair, 3)}
        # The same, pair by pair: each iteration's hook run against that iteration's toolkit
        # runs (A/B in time), the median of those ratios; less moved by load that drifts.
        e, u = by["toolkit_enable_cuda_compat"], by["toolkit_update_ldcache"]
        pairs = [a + (b - c) for a, b, c in zip(e.times, u.times, u.base)]
        for n in ("hook_compat_dropin", "hook_compat_warm"):
            comparisons[f"{n}_vs_toolkit_pair"]["paired_ratio"] = round(
                median([h / p for h, p in zip(by[n].times, pairs)]), 3)
        x = comparisons["hook_compat_dropin_vs_toolkit_pair"]
        T("hook_compat_dropin <= 0.8x the NVIDIA toolkit's pair (enable-cuda-compat + update-ldcache)",
          x["ratio"] <= 0.8, f"{x['ratio']:.2f}x ({x['hook_ms']} vs {x['toolkit_pair_ms']} ms)")
    else:
        T("hook_compat_dropin <= 0.8x the NVIDIA toolkit's pair", False, "not available (no toolkit binaries)")
    for n in COMPARED:
        if "before_" + n in R:
            b, x = R["before_" + n], R[n]
            comparisons[f"{n}_vs_compared"] = {"before_ms": b["median_ms"], "now_ms": x["median_ms"],
                                                "before_ratio": b["ratio"], "now_ratio": x["ratio"],
                                                "ratio": round(x["median_ms"] / b["median_ms"], 3)}
    if "wrapper_create_vs_compared" in comparisons:
        x = comparisons["wrapper_create_vs_compared"]
        T("wrapper create no slower than the --compare checkout's", x["ratio"] <= 1.0,
          f"{x['ratio']:.2f}x ({x['now_ms']} vs {x['before_ms']} ms)")
    big, small = R["hook_nocompat_bigspec"], R["hook_nocompat"]
    d = big["median_ms"] - small["median_ms"]
    T("1 MB config.json adds <= 5 ms", d <= 5, f"+{d:.2f} ms ({big['median_ms']} vs {small['median_ms']} ms)")
    for verb in ("features", "list"):
        if f"wrapper_{verb}" in R:
            x = R[f"wrapper_{verb}"]
            T(f"wrapper {verb} <= runc + 2 ms", x["delta_ms"] <= 2, f"+{x['delta_ms']} ms ({x['median_ms']} vs {x['pair_median_ms']} ms)")
        else:
            T(f"wrapper {verb} <= runc + 2 ms", False, "not available")
    if "wrapper_create" in R:
        x = R["wrapper_create"]
        lim = 1.5 * x["pair_median_ms"] + R["true"]["median_ms"]
        T("wrapper create <= 1.5x baseline + runtime", x["median_ms"] <= lim and x["errors"] == 0,
          f"{x['median_ms']} ms vs limit {lim:.2f} ms, errors {x['errors']}")
    else:
        T("wrapper create <= 1.5x baseline + runtime", False, "not available")
    p50, p99 = pct(lat, 50), pct(lat, 99)
    conc = {"n": 32, "rounds": conc_rounds, "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
            "max_ms": round(max(lat), 2), "self_p50_ms": round(pct(self_ms, 50), 2),
            "self_p99_ms": round(pct(self_ms, 99), 2), "exit_errors": cerr, "log_errors": log_errors}
    T("32 concurrent hooks: p99 <= 3x p50, no errors", p99 <= 3 * p50 and cerr == 0 and log_errors == 0,
      f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({p99 / p50:.2f}x), errors {cerr}+{log_errors}")
    hook_rss = max(x["max_rss_kb"] for x in res_rows if x["group"] == "hook")
    T("hook peak RSS <= 25 MB", hook_rss <= RSS_LIMIT_KB, f"{hook_rss / 1024:.1f} MiB")
    wr = [x["max_rss_kb"] for x in res_rows if x["name"].startswith("wrapper_")]
    if wr:
        T("wrapper peak RSS <= 25 MB", max(wr) <= RSS_LIMIT_KB, f"{max(wr) / 1024:.1f} MiB")
    else:
        T("wrapper peak RSS <= 25 MB", False, "not available")
    errs = sum(x["errors"] for x in res_rows if x["group"] in ("hook", "e2e", "child", "before"))
    T("no failed runs, no error records in the hook log", errs == 0 and all_log_errors == 0,
      f"exit errors {errs}, log errors {all_log_errors}")

    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": o.quick, "iters": iters,
           "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": py,
                       "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
           "bare_site": bool(o.bare_site), "compare": o.compare,
           "baseline": {"argv": base_argv, "median_ms": round(B, 2)},
           "hook_argv": args[:4] + ["<boot code>"] + args[5:], "decisions": checks,
           "rows": res_rows, "concurrency": conc, "targets": targets, "comparisons": comparisons,
           "wrapper": "available" if wrapper else "not available",
           "seconds": round(time.monotonic() - t_start, 1)}
    print(f"baseline {' '.join(base_argv)}: median {B:.2f} ms  ({iters} iterations, A/B interleaved)")
    la = max(load_start[0], os.getloadavg()[0])
    print(f"load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
          + ("  WARNING: a busy machine; ratios are unreliable, rerun when idle" if la > (os.cpu_count() or 1) else "")
          + "\n")
    print(f"{'row':26} {'median':>8} {'p90':>8} {'pair':>8} {'ratio':>6} {'delta':>7} {'RSS MiB':>7}  what")
    for x in res_rows:
        print(f"{x['name']:26} {x['median_ms']:8.2f} {x['p90_ms']:8.2f} {x['pair_median_ms']:8.2f} "
              f"{x['ratio']:6.2f} {x['delta_ms']:+7.2f} {x['max_rss_kb'] / 1024:7.1f}  {x['what']}"
              + (f" [pair: {x['pair']}]" if x["pair"] != "python -I -c pass" else "")
              + (f" ERRORS {x['errors']}" if x["errors"] else ""))
    if not wrapper:
        print(f"{'wrapper_*':26} {'not available':>8}")
    print(f"\nconcurrency: 32 hooks x {conc_rounds}: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
          f"errors {cerr} exit / {log_errors} log; the hooks' own duration_ms p50 {conc['self_p50_ms']}, "
          f"p99 {conc['self_p99_ms']}")
    print("\ndecisions:", ", ".join(f"{k}={v['decision']}/{v['reason']}/{v['elf_source']}" for k, v in checks.items()))
    print()
    for k, v in comparisons.items():
        if "toolkit_pair_ms" in v:
            print(f"compared: {k.split('_vs_')[0]} {v['hook_ms']} ms vs the NVIDIA toolkit's "
                  f"enable-cuda-compat + update-ldcache {v['toolkit_pair_ms']} ms: {v['ratio']:.2f}x "
                  f"(median of the iterations' own ratios: {v['paired_ratio']:.2f}x)")
        else:
            print(f"compared: {k.split('_vs_')[0]} {v['now_ms']} ms ({v['now_ratio']:.2f}x the baseline) vs "
                  f"{v['before_ms']} ms ({v['before_ratio']:.2f}x) in {o.compare}: {v['ratio']:.2f}x")
    print("\ntargets:")
    for t in targets:
        print(f"  {'PASS' if t['pass'] else 'FAIL'}  {t['target']}: {t['detail']}")
    Path(o.out).parent.mkdir(parents=True, exist_ok=True)
    Path(o.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nsaved {o.out} ({out['seconds']} s)")
    return 0 if all(t["pass"] for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
