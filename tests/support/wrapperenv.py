"""The runtime wrapper's test kit: configs, fake hosts with a host libcuda, the stand-in second runtime.

* :func:`write_config`: a compat-hook config of ``key: <JSON value>`` lines;
* :func:`fake_host`: a host root (:func:`tests.support.trees.write_fake_host`)
  whose ``libcuda.so.1`` links to a real Debian build;
* :func:`standin_runtime`: a stand-in for ``nvidia-container-runtime`` (a
  second runtime in compat-hook's ``runtime:`` chain) that records its argv,
  adds the host libcuda bind mount the NVIDIA toolkit would add, then execs runc;
  :func:`standin_calls` reads what it recorded;
* :func:`log_records`: compat-hook's log lines of one event; :func:`probe_of`:
  the probe's ``key=value`` output as a dict.

Used by tests/test_runtime_wrapper.py (runc) and tests/test_containerd.py (containerd).
"""

from __future__ import annotations

import json
import os
import pathlib

from tests.support import runtimes as rt
from tests.support.trees import HOST_LIB_DIR, write_fake_host

__all__ = ["SYS_LIB", "write_config", "fake_host", "standin_runtime", "standin_calls", "log_records", "probe_of"]

RUNC = rt.RUNC
#: Where the host's driver library is, in the fake host and in the container.
SYS_LIB = HOST_LIB_DIR


def write_config(path: pathlib.Path, **values) -> pathlib.Path:
    """A config file of ``key: <JSON value>`` lines (JSON is YAML)."""
    values.setdefault("nvml", "off")
    path = pathlib.Path(path)
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    return path


def fake_host(base: pathlib.Path, version: str, lib: pathlib.Path | None = None) -> pathlib.Path:
    """A host root whose kernel driver is ``version``; with ``lib``, its libcuda.so.1 links to it."""
    h = write_fake_host(base, version_line=f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  "
                                           "Release Build  (dvs-builder@U16)  Mon Sep 1 2025")
    if lib is not None:
        d = h / SYS_LIB.lstrip("/")
        os.symlink(str(lib), d / f"libcuda.so.{version}")
        os.symlink(f"libcuda.so.{version}", d / "libcuda.so.1")
    return h


_STANDIN = r"""#!/bin/sh
# Stand-in for nvidia-container-runtime (a second runtime in compat-hook's
# `runtime:` chain): records its argv, on `create` adds the host libcuda bind
# mount the NVIDIA toolkit would add, then execs runc with the same argv.
printf '%s\037' "$@" >> @LOG@
printf '\n' >> @LOG@
bundle=; prev=; verb=
for a do
    case $prev in --bundle|-b) bundle=$a ;; esac
    case $a in --bundle=*) bundle=${a#--bundle=} ;; create|run) [ -n "$verb" ] || verb=$a ;; esac
    prev=$a
done
if [ -n "$verb" ]; then
    /usr/bin/python3 -I -S -c '
import json, os, sys
p = sys.argv[1] + "/config.json"
spec = json.load(open(p))
if os.path.exists(sys.argv[2]):
    spec.setdefault("mounts", []).append({"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "type": "bind", "source": sys.argv[2], "options": ["rbind", "ro", "nosuid", "nodev"]})
if sys.argv[3] == "1":  # CI machines lack CAP_SYS_RESOURCE (docs/background.md "Test machines")
    spec["process"].pop("oomScoreAdj", None)
json.dump(spec, open(p, "w"))
' "${bundle:-.}" @HOSTLIB@ @DROPOOM@ || exit 1
fi
exec @RUNC@ "$@"
"""


def standin_runtime(path: pathlib.Path, log: pathlib.Path, host_lib, *, drop_oom: bool = False) -> pathlib.Path:
    """The stand-in second runtime; ``host_lib``: the host path it mounts (resolved at run time);
    ``drop_oom``: also drop process.oomScoreAdj (for runs without compat-hook's wrapper)."""
    text = (_STANDIN.replace("@LOG@", str(log)).replace("@HOSTLIB@", str(host_lib))
            .replace("@RUNC@", RUNC).replace("@DROPOOM@", "1" if drop_oom else "0"))
    path = pathlib.Path(path)
    path.write_text(text)
    path.chmod(0o755)
    return path


def standin_calls(log: pathlib.Path) -> list:
    if not log.exists():
        return []
    return [line.split("\x1f")[:-1] for line in log.read_text().splitlines() if line]


def log_records(log: pathlib.Path, event: str = "runtime") -> list:
    if not log.exists():
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == event]


def probe_of(stdout: str) -> dict:
    return {k: v for k, _, v in (ln.partition("=") for ln in stdout.splitlines()) if k}
