#!/usr/bin/env python3
"""The soak: many pod starts through a live containerd 2.x while the node misbehaves, in figures.

    sudo python3 benchmarks/soak.py [--starts 500] [--seed 1] [--json soak.json] [--work DIR]

Run as root on a fresh clone: what it needs (containerd 2.x, crictl, Debian's
libcuda 535/550/555) is fetched into ``.cache/`` as ``make test`` does
(``$COMPAT_HOOK_TEST_CACHE`` overrides the place). The machine is not changed:
the soak re-runs itself in a private mount namespace where ``/etc``, ``/usr``
and ``/var/lib`` are overlays (what is written there lands in the work dir)
and ``/var/log`` is an 8 MiB tmpfs (the full-disk fault); the parent lists
``/etc``, ``/usr`` and ``/var/lib`` before and after and reports any change.

**The node.** containerd 2.x (tests/support/engines.py: own root, state,
socket; its own mount namespace whose ``/proc/driver/nvidia/version`` and
``/proc/driver/nvidia/gpus/0000:65:00.0/information`` are the only fakes: the
kernel driver and the GPU's model line). compat-hook is installed as
docs/engines.md says, with every default: ``compat-hook config >
/etc/compat-hook/config.yaml``, then ``compat-hook install containerd
--engine-config <the daemon's config.toml>`` (default wrapper path, state
dir, log ``/var/log/compat-hook.log``). Pods run through the CRI with crictl
and the RuntimeClass handler ``cuda-compat``, one at a time, each with the
host's ``libcuda.so.<driver>`` bind-mounted as the NVIDIA runtime would. The
NVIDIA toolkit's ``config.toml`` (at its GPU Operator path, under the work
dir) is kept registered by the DaemonSet's own re-registration loop,
``packaging/kubernetes/compat-hook-k8s.sh watch``, run with busybox sh; the same loop
rotates the log past 32 KiB here (its own default is 50 MB), as it does on a node.

**Each start** picks an image and a GPU: ``nogpu`` (no GPU request),
``base`` (GPU request, no compat library), ``compat`` (compat libcuda 550 in
``/usr/local/cuda-12.4/compat``, no ELF note), ``ldpath`` (the same with
``LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/lib``), ``baked`` (the
same with a baked ``/etc/ld.so.conf.d/00-cuda-compat.conf`` naming the compat
dir, and the host library mounted as ``libcuda.so.1`` only), and ``geforce``
(``compat`` on a node whose GPU's model line says GeForce RTX 4090). The
probe (tests/support/probe.c) prints the libcuda the process loaded.

**Expected library**, from the scenario's facts alone (not compat-hook's
code): no GPU request or no compat library -> the host's; a GeForce GPU and a
compat library without a note -> the host's (NVIDIA supports forward
compatibility on data-center and professional GPUs only); else the compat
library when its branch (550) is newer than the host driver's, the host's
when not. The host driver flips between 535.261.03 (older than the compat
library: upgrade to it) and 555.58.02 (newer: the compat library must go)
every ``--every`` starts.

**Faults**, on a seeded schedule (``--seed``), each recorded on the start it
hits: ``flip`` (the driver changes), ``operator`` (the toolkit's config.toml
deleted with its dir and written anew without compat-hook, as
nvidia-ctk-installer does; the window until the loop has registered again is
measured by polling the file every 2 ms), ``rotate-rename`` and
``rotate-copytruncate`` (the log rotated *while* the start runs),
``log-full`` (the log's filesystem full during the start), ``cache-garbage``
and ``cache-truncate`` (every state-cache entry, config and ELF, damaged
before the start), ``config-invalid`` (config.yaml replaced with invalid YAML
for two starts, then put back), ``kill-hook`` and ``kill-wrapper`` (SIGKILL
to that start's hook or runtime wrapper, at a random 0-60 ms after it
appears), ``kill-before-ldconfig`` and ``kill-before-exec`` (issue item 4: for
one start the config's ``ldconfig:`` names a static program that notes whether
our drop-in is in the rootfs and SIGKILLs its parent, the hook; or its
``runtime:`` names a script that SIGKILLs itself, i.e. the wrapper's process
after it edited config.json, where it would exec runc; the snapshots and
bundles added are counted, and the next start is the same image),
``install-race`` (``compat-hook install containerd`` again, during
the start), ``two-installs`` (two installs at once, during the start) and
``uninstall-race`` (uninstall then install, during the start; a failed
racing install, which refuses an invalid config.yaml, is run again once the
config is fixed, as an admin would).

**Figures** (printed, and written with every start's record to ``--json``):
starts attempted / succeeded / failed (with why, and whether the fault
allowed it: only a kill of that start's own hook or wrapper does), wrong
libcuda (starts while config.yaml is invalid are judged like the rest: the
built-in defaults decide them, and their line must carry ``config_error``;
starts that raced an uninstall and have no line of compat-hook ran through the
pass-through the uninstall left, as on an uninstalled node: they are counted
apart and must load the image's own library), corrupted files (the engine config failing to parse, a compat-hook
drop-in in a container that is not one absolute path per line, a cache entry
neither valid nor absent at the end), leftovers (temp files, locks and
backups beside the engine config, in the state dir, beside the log; a
compat-hook drop-in seen by a container that should have none), lost
decision lines (a start whose container has no decision line in the log or
its rotated copies, while the log was writable and the config valid), NUL
bytes in the log (what a copytruncate does to a writer without O_APPEND), torn or
non-JSON lines,
the starts right after a fault that failed, and the re-registration window
in ms (each measurement and the maximum).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support import debs, engines  # noqa: E402
from tests.support import rootfs as rfs  # noqa: E402
from tests.test_containerd import build_image  # noqa: E402

PY = "/usr/bin/python3"
OLD, COMPAT, NEW = "535.261.03", "550.163.01", "555.58.02"
CUDA = {OLD: "12020", COMPAT: "12040", NEW: "12050"}
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
COMPAT_LIB = f"/usr/local/cuda-12.4/compat/libcuda.so.{COMPAT}"
IMAGE = "docker.io/library/bb"
RUNTIME = "cuda-compat"
OUR_DROPIN = "00-00-compat-hook.conf"
BDF = "0000:65:00.0"
MODELS = {"datacenter": "NVIDIA H100 80GB HBM3", "geforce": "NVIDIA GeForce RTX 4090"}
TOOLKIT_CONFIG = "usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
#: What nvidia-ctk-installer writes (abridged): its own runtimes, no compat-hook.
OPERATOR_TOML = """\
accept-nvidia-visible-devices-as-volume-mounts = false
accept-nvidia-visible-devices-envvar-when-unprivileged = true

[nvidia-container-cli]
  environment = []
  ldconfig = "@/run/nvidia/driver/sbin/ldconfig.real"
  load-kmods = true
  root = "/run/nvidia/driver"

[nvidia-container-runtime]
  log-level = "info"
  mode = "auto"
  runtimes = ["docker-runc", "runc", "crun"]

  [nvidia-container-runtime.modes.cdi]
    default-kind = "management.nvidia.com/gpu"
"""
# Prints the probe's two lines, the drop-ins the container sees and our drop-in's text.
COMMAND = ["/bin/sh", "-c", "/usr/local/bin/probe; echo dropins=$(ls /etc/ld.so.conf.d | tr '\\n' ' ');"
           f" [ -f /etc/ld.so.conf.d/{OUR_DROPIN} ] && sed 's/^/ours=/' /etc/ld.so.conf.d/{OUR_DROPIN}; true"]
KINDS = ("nogpu", "base", "compat", "ldpath", "baked", "geforce")
TAG = {"nogpu": "root", "base": "base", "compat": "compat", "ldpath": "stale", "baked": "baked", "geforce": "compat"}
#: Faults a start may carry (besides the driver flips every --every starts).
FAULTS = ("operator", "rotate-rename", "rotate-copytruncate", "log-full", "cache-garbage", "cache-truncate",
          "config-invalid", "kill-hook", "kill-wrapper", "kill-before-ldconfig", "kill-before-exec", "install-race",
          "two-installs", "uninstall-race")
#: Faults after which a failed start is allowed (that start's own hook or wrapper killed).
KILLS = ("kill-hook", "kill-wrapper", "kill-before-ldconfig", "kill-before-exec")
#: Kills at a fixed point (issue item 4), through the config's ``ldconfig:`` / ``runtime:`` for one start:
#: a static program that SIGKILLs its parent, the hook, once the drop-in is written (ldconfig is the
#: next step), and a script that SIGKILLs itself, the wrapper's process, once config.json is edited.
POINT_KILLS = {"kill-before-ldconfig": "ldconfig", "kill-before-exec": "runtime"}
#: It first notes whether our drop-in is already in the rootfs it was given (``-r ROOT``), in RECORD.
KILL_PARENT_C = r"""#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    char path[4096] = "";
    struct stat st;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "-r") == 0)
            snprintf(path, sizeof path, "%s/etc/ld.so.conf.d/@DROPIN@", argv[i + 1]);
    int fd = open(RECORD, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd >= 0) {
        const char *line = path[0] && stat(path, &st) == 0 ? "dropin-written\n" : "no-dropin\n";
        write(fd, line, strlen(line));
        close(fd);
    }
    kill(getppid(), SIGKILL);
    return 1;
}
""".replace("@DROPIN@", OUR_DROPIN)
LISTED = ("/etc", "/usr", "/var/lib")
ENGINE_DIRS = ("/var/lib/containerd", "/var/lib/docker", "/var/lib/containers", "/var/lib/cni")
LOG_FS_SIZE = "8m"
#: The DaemonSet loop rotates the log past this (its own default is 50 MB): several times a full run;
#: it keeps 1000 copies here (8 by default) so that every line can still be counted at the end.
LOG_ROTATE_BYTES = 32768


def sh(*argv, check=True, timeout=180, env=None, **kw) -> subprocess.CompletedProcess:
    return engines.sh(*argv, check=check, timeout=timeout, env=env, **kw)


def compat_hook(*argv, check=True) -> subprocess.CompletedProcess:
    """``compat-hook ARGV`` as an admin runs it (this tree, the OS interpreter)."""
    return sh(PY, "-m", "compat_hook", *argv, cwd=REPO, check=check)


# --------------------------------------------------------------------------- expectation


def branch(version: str) -> int:
    return int(version.split(".")[0])


def expected(kind: str, driver: str) -> str:
    """``"compat"`` or ``"host"``: the library a start of ``kind`` must load on host driver ``driver``."""
    if kind in ("nogpu", "base"):
        return "host"  # no GPU request / no compat library: the host's, as mounted
    if kind == "geforce":
        return "host"  # no note on the compat library and a consumer GPU: not supported
    return "compat" if branch(COMPAT) > branch(driver) else "host"


def bare(kind: str) -> str:
    """The library a start of ``kind`` loads with no compat-hook at all: the image's own choice.

    What a pod started through the pass-through an uninstall left gets: the loader's search
    order alone (``LD_LIBRARY_PATH`` first, then the image's ld cache with its baked drop-in).
    """
    return "compat" if kind in ("ldpath", "baked") else "host"


def loaded(out: dict, driver: str) -> str | None:
    """``"compat"``, ``"host"`` or None (neither: a wrong or missing library)."""
    if out.get("libcuda") == COMPAT_LIB and out.get("cuda") == CUDA[COMPAT]:
        return "compat"
    if (out.get("libcuda") or "").startswith(f"{LIB_DIR}/libcuda.so.") and out.get("cuda") == CUDA[driver]:
        return "host"
    return None


def parse_output(text: str) -> dict:
    kv: dict = {"ours": []}
    for ln in text.splitlines():
        k, sep, v = ln.partition("=")
        if not sep:
            continue
        if k == "ours":
            kv["ours"].append(v)
        else:
            kv[k] = v
    return {"cuda": kv.get("cuDriverGetVersion"), "libcuda": kv.get("libcuda", kv.get("dlopen-error")),
            "dropins": kv.get("dropins", "").split(), "ours": kv["ours"]}


# --------------------------------------------------------------------------- the node


def build_images(work: pathlib.Path, libs: dict) -> pathlib.Path:
    """tests/test_containerd.py's layout plus tag ``baked``: ``compat`` with a baked compat drop-in and ld cache."""
    tar = build_image(work, libs)
    lay = work / "img"
    sh("umoci", "unpack", "--image", f"{lay}:compat", work / "u3")
    r = work / "u3" / "rootfs"
    (r / "etc/ld.so.conf.d/00-cuda-compat.conf").write_text("/usr/local/cuda/compat\n")
    rfs.run_ldconfig(r)
    sh("umoci", "repack", "--image", f"{lay}:baked", work / "u3")
    shutil.rmtree(work / "u3")
    tar.unlink()
    sh("tar", "-C", lay, "-cf", tar, ".")
    return tar


class Node:
    """containerd 2.x with compat-hook installed with every default, and the toolkit re-registration loop."""

    def __init__(self, work: pathlib.Path, crictl_bin: pathlib.Path, libs: dict) -> None:
        self.work = work
        self.libs = libs
        self.log = pathlib.Path("/var/log/compat-hook.log")
        self.config = pathlib.Path("/etc/compat-hook/config.yaml")
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.good_config = compat_hook("config").stdout
        self.config.write_text(self.good_config)
        self.daemon = engines.Containerd(work / "ctrd", bin_dir=str(engines.containerd2()),
                                         pause_image=f"{IMAGE}:pause")
        self.install_args = ("install", "containerd", "--engine-config", str(self.daemon.main))
        compat_hook(*self.install_args)
        self.wrapper = self.binary_name()
        self.daemon.start(OLD)
        self.driver = OLD
        self.brand = None
        self.set_gpu("datacenter")
        self.crictl = engines.Crictl(crictl_bin, self.daemon.sock, work)
        self.toolkit_config = work / "node" / TOOLKIT_CONFIG
        self.k8s = None
        self.tasks = self.daemon.work / "state/io.containerd.runtime.v2.task/k8s.io"
        self.point_killer = self._point_killers()

    def _point_killers(self) -> dict:
        """The ``ldconfig:`` stand-in (static: it runs in the container's mount namespace) and ``runtime:``'s."""
        d = self.work / "bin"
        d.mkdir(exist_ok=True)
        (d / "kill-parent.c").write_text(KILL_PARENT_C)
        self.kill_record = d / "kill-parent.record"
        sh("gcc", "-static", "-O2", f'-DRECORD="{self.kill_record}"', "-o", d / "kill-parent", d / "kill-parent.c")
        (d / "kill-self").write_text("#!/bin/sh\n# stands in for runc: the wrapper's process dies where it would exec\n"
                                     "kill -KILL $$\n")
        (d / "kill-self").chmod(0o755)
        return {"ldconfig": str(d / "kill-parent"), "runtime": str(d / "kill-self")}

    def snapshots(self) -> set:
        out = self.daemon.ctr("-n", "k8s.io", "snapshots", "ls").stdout.splitlines()[1:]
        return {ln.split()[0] for ln in out if ln.strip()}

    def binary_name(self) -> str | None:
        """The wrapper the install registered: runtime ``cuda-compat``'s BinaryName in the daemon's files."""
        def find(node):
            if isinstance(node, dict):
                rt = node.get("runtimes", {}).get(RUNTIME) if isinstance(node.get("runtimes"), dict) else None
                if isinstance(rt, dict) and rt.get("options", {}).get("BinaryName"):
                    return rt["options"]["BinaryName"]
                for v in node.values():
                    got = find(v)
                    if got:
                        return got
            return None
        for f in [self.daemon.main, *sorted(self.daemon.main.parent.rglob("*.toml"))]:
            got = find(tomllib.loads(f.read_text()))
            if got:
                return got
        return None

    def import_images(self, tar: pathlib.Path) -> None:
        self.daemon.ctr("-n", "k8s.io", "images", "import", "--base-name", IMAGE, tar)

    def set_driver(self, version: str) -> None:
        self.daemon.set_driver(version)
        self.driver = version

    def set_gpu(self, brand: str) -> None:
        if brand == self.brand:
            return
        d = pathlib.Path(f"/proc/{self.daemon.pid}/root/proc/driver/nvidia/gpus/{BDF}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "information").write_text(f"Model: \t\t {MODELS[brand]}\nIRQ: \t\t 95\nGPU UUID: \t GPU-5a1c\n"
                                       f"Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDevice Minor: \t 0\n")
        self.brand = brand

    # -- the DaemonSet's re-registration loop, as shipped ------------------------------------------
    def start_k8s_loop(self) -> None:
        """``compat-hook-k8s.sh watch`` with busybox sh, its node root ``/``, its payload this tree."""
        payload = self.work / "payload"
        payload.mkdir()
        os.symlink(REPO, payload / "lib")
        ready = self.work / "k8s-ready"
        ready.write_text(f"{payload}\n")
        self.toolkit_config.parent.mkdir(parents=True)
        self.toolkit_config.write_text(OPERATOR_TOML)
        env = dict(engines.ENV, HOST_ROOT="/", HOST_PREFIX=str(self.work / "k8s-prefix"), READY_FILE=str(ready),
                   TOOLKIT_CONFIGS=str(self.toolkit_config), TOOLKIT_STATE=str(self.work / "k8s-state"),
                   TOOLKIT_RECHECK="30", LOG_MAX_BYTES=str(LOG_ROTATE_BYTES), LOG_KEEP="1000")
        self.k8s_log = open(self.work / "k8s.log", "ab")
        self.k8s = subprocess.Popen(["busybox", "sh", str(REPO / "packaging/kubernetes/compat-hook-k8s.sh"), "watch"],
                                    env=env, stdout=self.k8s_log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self.registered():
            if time.monotonic() > deadline or self.k8s.poll() is not None:
                raise RuntimeError(f"the toolkit loop did not register: {(self.work / 'k8s.log').read_text()}")
            time.sleep(0.05)

    def registered(self) -> bool:
        try:
            data = tomllib.loads(self.toolkit_config.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return False
        runtimes = data.get("nvidia-container-runtime", {}).get("runtimes", [])
        return bool(runtimes) and runtimes[0].endswith("/compat-hook-runtime")

    def operator_rewrite(self) -> float:
        """nvidia-ctk-installer's start: the toolkit dir deleted, config.toml written anew; ms until registered."""
        top = self.work / "node/usr/local/nvidia/toolkit"
        shutil.rmtree(top)
        self.toolkit_config.parent.mkdir(parents=True)
        tmp = self.toolkit_config.with_name(".config.toml.new")
        tmp.write_text(OPERATOR_TOML)
        os.rename(tmp, self.toolkit_config)
        t0 = time.monotonic()
        while not self.registered():
            if time.monotonic() - t0 > 120:
                return float("inf")
            time.sleep(0.002)
        return (time.monotonic() - t0) * 1000

    def stop(self) -> dict:
        if self.k8s is not None:
            try:
                os.killpg(self.k8s.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.k8s.wait()
            self.k8s_log.close()
        return self.daemon.stop()


# --------------------------------------------------------------------------- faults


class Killer(threading.Thread):
    """SIGKILL the first process of ``what`` (the hook, or the wrapper at ``create``) after ``delay`` s.

    Only descendants of the soak's own containerd shims (whose argv names the work dir) are
    candidates: the machine's other processes are never touched.
    """

    def __init__(self, what: str, delay: float, wrapper: str, work: str) -> None:
        super().__init__(daemon=True)
        self.what, self.delay, self.wrapper, self.work = what, delay, wrapper, work.encode()
        self.stop_flag = threading.Event()
        self.killed: str | None = None

    def ours(self, pid: str) -> bool:
        """Whether an ancestor of ``pid`` (a shim) names the soak's work dir."""
        for _ in range(16):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    pid = f.read().rsplit(b")", 1)[1].split()[1].decode()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if self.work in f.read():
                        return True
            except (OSError, IndexError):
                return False
            if pid in ("0", "1"):
                return False
        return False

    def match(self, argv: list) -> bool:
        text = " ".join(argv)
        if self.what == "kill-hook":
            return "compat_hook" in text and " hook" in text and "runtime" not in text
        return (self.wrapper in text or "compat_hook" in text and "runtime" in text) and "create" in argv

    def run(self) -> None:
        seen: dict = {}
        while not self.stop_flag.is_set() and self.killed is None:
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                except OSError:
                    continue
                if not argv or not self.match(argv) or not self.ours(d):
                    continue
                first = seen.setdefault(d, time.monotonic())
                if time.monotonic() - first >= self.delay:
                    try:
                        os.kill(int(d), signal.SIGKILL)
                        self.killed = f"pid {d} after {int((time.monotonic() - first) * 1000)} ms: {' '.join(argv)[:160]}"
                    except ProcessLookupError:
                        continue
                    break
            time.sleep(0.001)


def fill(path: pathlib.Path) -> None:
    """Write ``path`` until its filesystem has not one byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (65536, 4096, 1):
            try:
                while os.write(fd, b"\0" * chunk):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def damage_cache(state_dirs: list, how: str, damaged: dict) -> int:
    """Every file under the state dirs' ``cache`` made garbage or truncated to half; how many.

    ``damaged`` gets each file's damaged bytes: an entry still holding exactly those at the end
    was never read again (a miss when it is), not something compat-hook wrote.
    """
    n = 0
    for sd in state_dirs:
        for dirpath, _, files in os.walk(os.path.join(sd, "cache")):
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    if how == "cache-garbage":
                        with open(p, "wb") as fh:
                            fh.write(os.urandom(97))
                    else:
                        size = os.path.getsize(p)
                        os.truncate(p, size // 2)
                    damaged[p] = pathlib.Path(p).read_bytes()
                    n += 1
                except OSError:
                    pass
    return n


def state_dirs() -> list:
    base = "/var/lib/compat-hook"
    out = [base] if os.path.isdir(base) else []
    for d in ("/run/compat-hook", "/var/cache/compat-hook"):
        if os.path.isdir(d):
            out.append(d)
    return out


# --------------------------------------------------------------------------- checks


def log_records(log: pathlib.Path) -> tuple:
    """``(records, nul_bytes, bad_lines)`` over the log and its rotated copies (a bad line: its file and head)."""
    recs, nul, bad = [], 0, []
    for p in sorted(log.parent.glob(log.name + "*")):
        data = p.read_bytes()
        if p.suffix == ".gz":
            data = gzip.decompress(data)
        nul += data.count(b"\0")
        for ln in data.replace(b"\0", b"").splitlines():
            if not ln.strip():
                continue
            try:
                recs.append(json.loads(ln))
            except ValueError:
                bad.append(f"{p.name}: {ln[:160].decode(errors='replace')}")
    return recs, nul, bad


def leftovers(paths: list) -> list:
    """Temp files, stray locks and backups of ours in ``paths`` (dirs, walked).

    ``<state>/locks/rootfs-NNNN.lock`` is not one: a fixed table of at most 1024 flock files
    (ldcache.py), kept on purpose; they are counted apart.
    """
    out = []
    for top in paths:
        for dirpath, _, files in os.walk(top):
            for f in files:
                if os.path.basename(dirpath) == "locks" and f.startswith("rootfs-") and f.endswith(".lock"):
                    continue
                if ".tmp" in f or f.endswith((".lock", ".new", ".partial")) or f.startswith(".compat-hook"):
                    out.append(os.path.join(dirpath, f))
    return out


def cache_corrupt(dirs: list, damaged: dict) -> tuple:
    """``(corrupt, untouched)``: entries at the end that are not whole JSON, and of those the ones
    still holding exactly the bytes the soak damaged them with (never read again since)."""
    bad, untouched = [], []
    for sd in dirs:
        for dirpath, _, files in os.walk(os.path.join(sd, "cache")):
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    data = pathlib.Path(p).read_bytes()
                    json.loads(data)
                except (OSError, ValueError):
                    (untouched if damaged.get(p) == data else bad).append(p)
    return bad, untouched


def listing(roots=LISTED, skip=ENGINE_DIRS) -> dict:
    """``{path: (mode, size, mtime_ns, link target)}`` under ``roots``, without ``skip``."""
    out = {}
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if os.path.join(dirpath, d) not in skip]
            for name in dirs + files:
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                link = os.readlink(p) if os.path.islink(p) else None
                out[p] = (st.st_mode, 0 if name in dirs else st.st_size, st.st_mtime_ns, link)
    return out


def diff_listing(a: dict, b: dict) -> list:
    return sorted([f"+ {p}" for p in b.keys() - a.keys()] + [f"- {p}" for p in a.keys() - b.keys()]
                  + [f"~ {p}" for p in a.keys() & b.keys() if a[p] != b[p]])


# --------------------------------------------------------------------------- the run


def schedule(n: int, every: int, seed: int, kinds=FAULTS) -> list:
    """``[{"kind", "driver", "faults"}]`` for ``n`` starts: each kind in turn, faults at random starts."""
    rng = random.Random(seed)
    plan = []
    driver = OLD
    faults = list(kinds) * max(1, n // (3 * len(kinds)))
    # never on the last start: the start after each fault is checked too
    slots = rng.sample(range(2, n - 1), min(len(faults), max(0, n - 3))) if n > 3 else []
    at = dict(zip(slots, faults))
    for i in range(n):
        f = []
        if i and i % every == 0:
            driver = NEW if driver == OLD else OLD
            f.append("flip")
        if i in at:
            f.append(at[i])
        kind = KINDS[(i + rng.randrange(len(KINDS))) % len(KINDS)]
        if set(f) & set(POINT_KILLS):
            kind = "compat"  # a drop-in to write, a hook for the wrapper to add
        elif plan and set(plan[-1]["faults"]) & set(KILLS):
            kind = plan[-1]["kind"]  # the next start of the same image after a kill
        plan.append({"i": i, "kind": kind, "driver": driver, "faults": f})
    return plan


def run_race(node: Node, fault: str) -> list:
    """Start the installs of ``fault``; returns their Popen objects."""
    argv = [PY, "-m", "compat_hook", *node.install_args]
    kw = dict(cwd=REPO, env=engines.ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
              text=True)
    if fault == "install-race":
        return [subprocess.Popen(argv, **kw)]
    if fault == "two-installs":
        return [subprocess.Popen(argv, **kw), subprocess.Popen(argv, **kw)]
    un = [PY, "-m", "compat_hook", "uninstall", "containerd", "--engine-config", str(node.daemon.main)]
    return [subprocess.Popen(["/bin/sh", "-c", f"{' '.join(un)}; {' '.join(argv)}"], **kw)]


def one_start(node: Node, plan: dict, rng: random.Random, st: dict) -> dict:
    i, kind, faults = plan["i"], plan["kind"], plan["faults"]
    rec = {"i": i, "kind": kind, "driver": plan["driver"], "faults": list(faults)}
    if st["reinstall"] and st["config_bad_left"] == 0:
        # a racing install failed (it refuses an invalid config.yaml): the admin installs again once it is fixed
        compat_hook(*node.install_args)
        st["reinstall"] = st["uninstalled"] = False
        rec["reinstalled_before"] = True
    node.set_driver(plan["driver"])
    node.set_gpu("geforce" if kind == "geforce" else "datacenter")
    rec["expected"] = expected(kind, plan["driver"])
    threads, procs, killer, filler = [], [], None, None
    log = node.log
    for f in faults:
        if f == "operator":
            box: dict = {}
            t = threading.Thread(target=lambda: box.setdefault("ms", node.operator_rewrite()), daemon=True)
            t.start()
            threads.append((t, box))
        elif f in ("rotate-rename", "rotate-copytruncate"):
            st["rot"] += 1
            dst = log.with_name(f"{log.name}.soak-{st['rot']}")  # never a name the DaemonSet loop rotates to

            def rotate(f=f, dst=dst):
                time.sleep(rng.uniform(0, 0.4))
                if not log.exists():
                    return
                if f == "rotate-rename":
                    os.rename(log, dst)
                else:
                    shutil.copyfile(log, dst)
                    os.truncate(log, 0)
            t = threading.Thread(target=rotate, daemon=True)
            t.start()
            threads.append((t, None))
        elif f == "log-full":
            filler = log.parent / "filler"
            fill(filler)
        elif f in ("cache-garbage", "cache-truncate"):
            rec["cache_files_damaged"] = damage_cache(state_dirs(), f, st["damaged"])
        elif f == "config-invalid":
            bad = node.config.with_name(".config.yaml.bad")
            bad.write_text("log_file: [unclosed\nmode: {ldconfig\n")
            os.rename(bad, node.config)
            st["config_bad_left"] = 2
        elif f in POINT_KILLS:
            key = POINT_KILLS[f]
            lines = [ln for ln in node.good_config.splitlines() if not ln.startswith(f"{key}: ")]
            lines.append(f"{key}: {node.point_killer[key]}")
            tmp = node.config.with_name(".config.yaml.kill")
            tmp.write_text("\n".join(lines) + "\n")
            os.rename(tmp, node.config)
            st["config_bad_left"] = 0  # a valid config now (then the good one again): an invalid one ends here
            rec["snapshots_before"] = node.snapshots()
            rec["bundles_before"] = {p.name for p in node.tasks.glob("*")}
        elif f in KILLS:
            killer = Killer(f, rng.uniform(0, 0.06), str(node.wrapper), str(node.work))
            killer.start()
        elif f in ("install-race", "two-installs", "uninstall-race"):
            procs = run_race(node, f)
    rec["config_valid"] = st["config_bad_left"] == 0
    rec["uninstalled"] = st["uninstalled"]  # an earlier uninstall-race left compat-hook uninstalled
    mounts = [(node.libs[plan["driver"]], f"{LIB_DIR}/libcuda.so.1")]
    if kind != "baked":
        mounts.append((node.libs[plan["driver"]], f"{LIB_DIR}/libcuda.so.{plan['driver']}"))
    name = f"s{i}"
    t0 = time.monotonic()
    try:
        code, logs, cid = node.crictl.run(name, RUNTIME, f"{IMAGE}:{TAG[kind]}", command=COMMAND, mounts=mounts)
        rec.update(exit=code, cid=cid, out=parse_output(logs))
        rec["ok"] = code == 0 and rec["out"]["libcuda"] is not None
        if not rec["ok"]:
            rec["why"] = f"container exit {code}: {logs.strip()[-200:]}"
    except AssertionError as e:
        rec.update(ok=False, why=str(e).strip().splitlines()[-1][-300:] if str(e).strip() else "crictl failed")
    rec["ms"] = int((time.monotonic() - t0) * 1000)
    if killer is not None:
        killer.stop_flag.set()
        killer.join()
        rec["killed"] = killer.killed
    for p in procs:
        out, err = p.communicate(timeout=180)
        rec.setdefault("races", []).append({"exit": p.returncode, "err": err.strip()[-300:]})
        st["reinstall"] |= p.returncode != 0
        # "uninstall; install" whose install failed (it refuses an invalid config.yaml): compat-hook is
        # not installed until the admin's install once the config is fixed
        st["uninstalled"] |= "uninstall-race" in faults and p.returncode != 0
    for t, box in threads:
        t.join(timeout=180)
        if box is not None:
            rec["reregistration_ms"] = round(box.get("ms", float("inf")), 1)
    if filler is not None:
        filler.unlink()
    if set(faults) & set(POINT_KILLS):
        tmp = node.config.with_name(".config.yaml.good")
        tmp.write_text(node.good_config)
        os.rename(tmp, node.config)
        # what the killed start left: its bundle and snapshot go with the container (CRI removes both)
        rec["killed"] = f"{faults[-1]}: at the fixed point (config {POINT_KILLS[faults[-1]]}: for this start)"
        rec["left_after_kill"] = {"snapshots_added": sorted(node.snapshots() - rec.pop("snapshots_before")),
                                  "bundles_added": sorted({p.name for p in node.tasks.glob("*")}
                                                          - rec.pop("bundles_before"))}
        if "kill-before-ldconfig" in faults and node.kill_record.exists():
            rec["left_after_kill"]["at_kill"] = node.kill_record.read_text().split()[-1]
            node.kill_record.unlink()
    if "config-invalid" not in faults and st["config_bad_left"]:
        st["config_bad_left"] -= 1
        if st["config_bad_left"] == 0:
            tmp = node.config.with_name(".config.yaml.good")
            tmp.write_text(node.good_config)
            os.rename(tmp, node.config)
            rec["config_fixed_after"] = True
    if rec["ok"]:
        rec["loaded"] = loaded(rec["out"], plan["driver"])
    return rec


def judge(recs: list, log: pathlib.Path, ctrd_config: pathlib.Path, wrapper, damaged: dict) -> dict:
    records, nul, bad_lines = log_records(log)
    by_cid: dict = {}
    for r in records:
        if r.get("container_id"):
            by_cid.setdefault(r["container_id"], []).append(r)
    fig = {"attempted": len(recs), "succeeded": 0, "failed": 0, "failed_allowed": 0, "failures": [],
           "wrong_libcuda": [], "lost_lines": [], "stray_dropins": [], "bad_dropins": [],
           "next_start_after_fault_failed": [], "log_nul_bytes": nul, "log_bad_lines": bad_lines,
           "config_invalid_starts": 0, "config_invalid_logged": 0, "config_invalid_unsaid": [],
           "uninstalled_starts": []}
    prev_fault = False
    for r in recs:
        faults = [f for f in r["faults"] if f != "flip"]
        if r["ok"]:
            fig["succeeded"] += 1
        else:
            fig["failed"] += 1
            allowed = bool(set(faults) & set(KILLS)) and bool(r.get("killed"))
            fig["failed_allowed"] += allowed
            fig["failures"].append({"i": r["i"], "faults": r["faults"], "why": r.get("why"),
                                    "killed": r.get("killed"), "allowed": allowed})
            if prev_fault and not allowed:
                fig["next_start_after_fault_failed"].append(r["i"])
        prev_fault = bool(faults) or not r["config_valid"]
        if not r["ok"]:
            continue
        brief = {k: r.get(k) for k in ("i", "kind", "driver", "expected", "loaded")}
        # A start that raced an uninstall and has no line of compat-hook, or that came after an uninstall
        # whose racing install failed (before the admin's install), ran while compat-hook was not installed
        # (through the pass-through the uninstall left): compat-hook's rules do not apply, the image's own
        # choice must (nothing of compat-hook may have acted halfway).
        if ("uninstall-race" in faults or r.get("uninstalled")) and not by_cid.get(r.get("cid")):
            brief["expected"] = bare(r["kind"])
            fig["uninstalled_starts"].append(brief)
            if r["loaded"] != brief["expected"]:
                fig["wrong_libcuda"].append({**brief, "faults": r["faults"], "out": r["out"],
                                             "why": "ran without compat-hook, yet not the image's own library"})
            continue
        # With an invalid config.yaml the built-in defaults decide (the soak's config is the default
        # one): judged like every other start, and the start's line must say why (config_error).
        if not r["config_valid"]:
            fig["config_invalid_starts"] += 1
            said = any("config_error" in x for x in by_cid.get(r.get("cid"), []))
            fig["config_invalid_logged"] += said
            if not said:
                fig["config_invalid_unsaid"].append({**brief, "faults": r["faults"], "lines": [
                    {k: x.get(k) for k in ("event", "verb", "stage", "reason", "error")}
                    for x in by_cid.get(r.get("cid"), [])]})
        if r["loaded"] != r["expected"]:
            fig["wrong_libcuda"].append({k: r.get(k) for k in ("i", "kind", "driver", "faults", "expected", "loaded",
                                                                "out")})
        ours = r["out"]["ours"]
        paths = [p for p in ours if not p.startswith("#")]
        if ours and (len(paths) != 1 or not paths[0].startswith("/")):
            fig["bad_dropins"].append(r["i"])
        if OUR_DROPIN in r["out"]["dropins"] and r["kind"] in ("nogpu", "base"):
            fig["stray_dropins"].append(r["i"])
        writable = "log-full" not in faults
        if writable and not by_cid.get(r.get("cid")):
            fig["lost_lines"].append(r["i"])
    corrupted = []
    try:
        tomllib.loads(ctrd_config.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        corrupted.append(f"{ctrd_config}: {e}")
    for d in sorted(ctrd_config.parent.rglob("*.toml")):
        try:
            tomllib.loads(d.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            corrupted.append(f"{d}: {e}")
    bad_cache, fig["cache_damaged_never_reread"] = cache_corrupt(state_dirs(), damaged)
    corrupted += [f"cache entry {p}" for p in bad_cache]
    corrupted += [f"drop-in in start {i}" for i in fig["bad_dropins"]]
    fig["corrupted"] = corrupted
    left = leftovers([str(ctrd_config.parent), *state_dirs(), str(log.parent)])
    if wrapper is not None:
        left += leftovers([str(pathlib.Path(wrapper).parent)])
    fig["leftovers"] = left + [f"our drop-in in start {i}" for i in fig["stray_dropins"]]
    fig["log_files"] = sorted(p.name for p in log.parent.glob(log.name + "*"))
    fig["lock_table_files"] = sum(len(list(pathlib.Path(d, "locks").glob("rootfs-*.lock"))) for d in state_dirs())
    windows = [r["reregistration_ms"] for r in recs if "reregistration_ms" in r]
    fig["reregistration_ms"] = windows
    fig["reregistration_ms_max"] = max(windows) if windows else None
    fig["kills"] = sum(1 for r in recs if r.get("killed"))
    fig["faults"] = {f: sum(f in r["faults"] for r in recs) for f in ("flip", *FAULTS)}
    fig["kinds"] = {k: sum(r["kind"] == k for r in recs) for k in KINDS}
    fig["expected"] = {w: sum(r["expected"] == w for r in recs) for w in ("compat", "host")}
    return fig


def soak(args) -> dict:
    """The run itself, inside the private namespace (see :func:`namespace_main`)."""
    work = pathlib.Path(args.work)
    t_setup = time.monotonic()
    crictl_job = engines.Background(engines.crictl)
    libs = {v: debs.libcuda(v) for v in (OLD, COMPAT, NEW)}
    tar = build_images(work / "image", libs)
    node = Node(work, crictl_job.result(), libs)
    fig: dict = {}
    recs: list = []
    try:
        node.import_images(tar)
        node.start_k8s_loop()
        setup_s = time.monotonic() - t_setup
        rng = random.Random(args.seed)
        st = {"rot": 0, "config_bad_left": 0, "damaged": {}, "reinstall": False, "uninstalled": False}
        t_run = time.monotonic()
        for plan in schedule(args.starts, args.every, args.seed, args.faults):
            rec = one_start(node, plan, rng, st)
            recs.append(rec)
            mark = "ok " if rec["ok"] else "FAIL"
            if args.verbose or not rec["ok"] or (rec["ok"] and rec["loaded"] != rec["expected"]):
                print(f"[{rec['i']:4}] {mark} {rec['kind']:7} {rec['driver']} {','.join(rec['faults']) or '-':24} "
                      f"want {rec['expected']:6} got {rec.get('loaded')}{'' if rec['config_valid'] else ' (config invalid)'} "
                      f"{rec.get('why', '')[:120]}", flush=True)
        run_s = time.monotonic() - t_run
        fig = judge(recs, node.log, node.daemon.main, node.wrapper, st["damaged"])
        fig.update(setup_s=round(setup_s, 1), run_s=round(run_s, 1),
                   starts_per_s=round(len(recs) / run_s, 2) if run_s else None)
    finally:
        left = node.stop()
        fig["engine_left"] = left
    # What the soak's processes wrote under /etc, /usr, /var/lib (the overlays' upper dirs).
    written = []
    for name, up in overlay_uppers(work).items():
        for dirpath, dirs, files in os.walk(up):
            for f in dirs + files:
                p = "/" + name + "/" + os.path.relpath(os.path.join(dirpath, f), up)
                written.append(p)
    allowed = ("/etc/compat-hook", "/var/lib/compat-hook", "/usr/local/libexec/compat-hook")
    fig["written_in_namespace"] = sorted(written)
    fig["written_outside_own_dirs"] = sorted(p for p in written
                                              if not any(p == a or p.startswith(a + "/") or a.startswith(p + "/")
                                                         for a in allowed)
                                              and not any(p.startswith(e) for e in ENGINE_DIRS))
    fig["starts"] = recs
    return fig


def overlay_uppers(work: pathlib.Path) -> dict:
    return {d.strip("/"): work / "ovl" / d.strip("/").replace("/", "_") / "up" for d in LISTED}


NS_SETUP = r"""set -e
w=$1; shift
for d in /etc /usr /var/lib; do
    n=$(echo "${d#/}" | tr / _)
    mkdir -p "$w/ovl/$n/up" "$w/ovl/$n/wk"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$w/ovl/$n/up,workdir=$w/ovl/$n/wk" "$d"
done
mount -t tmpfs -o size=@SIZE@,mode=0755 compat-hook-soak-log /var/log
exec "$@"
""".replace("@SIZE@", LOG_FS_SIZE)


def summary(fig: dict) -> str:
    w = fig.get("reregistration_ms") or []
    lines = [
        f"starts attempted {fig['attempted']}, succeeded {fig['succeeded']}, failed {fig['failed']} "
        f"(allowed: {fig['failed_allowed']}, a kill of that start's own hook or wrapper)",
        f"wrong libcuda {len(fig['wrong_libcuda'])}, corrupted files {len(fig['corrupted'])}, "
        f"leftovers {len(fig['leftovers'])}, lost decision lines {len(fig['lost_lines'])}, "
        f"NUL bytes in the log {fig['log_nul_bytes']}, torn or bad lines {len(fig['log_bad_lines'])}",
        f"next start after a fault failed: {len(fig['next_start_after_fault_failed'])}",
        f"starts while config.yaml was invalid (the built-in defaults decide; judged with the rest): "
        f"{fig['config_invalid_starts']}, of which {fig['config_invalid_logged']} logged config_error",
        f"starts that raced an uninstall and ran without compat-hook (its pass-through): "
        f"{len(fig['uninstalled_starts'])}, of which "
        f"{sum(u['loaded'] != u['expected'] for u in fig['uninstalled_starts'])} loaded another library "
        f"than the image's own",
        f"point kills (item 4): {point_kills(fig)}",
        f"re-registration window: {len(w)} rewrites, max {fig['reregistration_ms_max']} ms "
        f"(each: {', '.join(str(x) for x in w)})",
        f"kills delivered {fig['kills']}; faults {fig['faults']}",
        f"kinds {fig['kinds']}; expected {fig['expected']}",
        f"files written under /etc /usr /var/lib outside compat-hook's and the engine's own: "
        f"{len(fig['written_outside_own_dirs'])}; host listing changes: {len(fig.get('host_changes', []))}",
        f"setup {fig.get('setup_s')} s, {fig['attempted']} starts in {fig.get('run_s')} s "
        f"({fig.get('starts_per_s')}/s)",
    ]
    return "\n".join(lines)


def point_kills(fig: dict) -> str:
    """What each fixed-point kill left, and whether the next start of the same image was right."""
    out = []
    starts = fig.get("starts", [])
    for n, r in enumerate(starts):
        left = r.get("left_after_kill")
        if left is None:
            continue
        # the next start with no fault of its own (a driver flip aside)
        nxt = next((x for x in starts[n + 1:] if not set(x["faults"]) - {"flip"}), None)
        right = bool(nxt and nxt["ok"] and nxt.get("loaded") == nxt["expected"])
        other = bool(nxt and nxt["kind"] != r["kind"])
        out.append(f"#{r['i']} {r['faults'][-1]}: {left.get('at_kill', 'config.json edited')}, "
                   f"next start #{nxt['i'] if nxt else '-'}: "
                   f"{len(left['snapshots_added'])} snapshot(s) and {len(left['bundles_added'])} bundle(s) left, "
                   f"next start {'right' if right else 'NOT right'}{' (another image)' if other else ''}")
    return "; ".join(out) or "none"


def targets_met(fig: dict) -> bool:
    return (not fig["wrong_libcuda"] and not fig["corrupted"] and not fig["leftovers"] and not fig["lost_lines"]
            and not fig["log_bad_lines"] and not fig["log_nul_bytes"]
            and fig["config_invalid_logged"] == fig["config_invalid_starts"]
            and fig["failed"] == fig["failed_allowed"] and not fig["next_start_after_fault_failed"]
            and not fig["written_outside_own_dirs"] and not fig.get("host_changes")
            and (fig["reregistration_ms_max"] <= 1000 if fig["reregistration_ms_max"] is not None
                 else not fig["faults"].get("operator")))


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=500)
    ap.add_argument("--every", type=int, default=10, help="flip the host driver every N starts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="soak.json")
    ap.add_argument("--work", default=None, help="work dir (default: a new temp dir, removed at the end)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--faults", default=",".join(FAULTS), help="the faults to inject (comma-separated; default all)")
    ap.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.faults = [f for f in args.faults.split(",") if f]
    if not set(args.faults) <= set(FAULTS):
        print(f"soak: unknown fault(s) {sorted(set(args.faults) - set(FAULTS))}; known: {', '.join(FAULTS)}",
              file=sys.stderr)
        return 2
    if args.in_namespace:
        fig = soak(args)
        pathlib.Path(args.json).write_text(json.dumps(fig, indent=1, default=str))
        return 0
    if os.geteuid() != 0:
        print("soak: run as root (it starts containerd and mounts in a private namespace)", file=sys.stderr)
        return 2
    if args.starts < 1 or args.every < 1:
        print("soak: --starts and --every must be >= 1", file=sys.stderr)
        return 2
    own = args.work is None
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="compat-hook-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    out = pathlib.Path(args.json).resolve()
    before = listing()
    argv2 = [engines.UNSHARE, "-m", "--propagation", "private", "/bin/sh", "-c", NS_SETUP, "sh", str(work),
             PY, str(pathlib.Path(__file__).resolve()), "--in-namespace", "--starts", str(args.starts), "--every",
             str(args.every), "--seed", str(args.seed), "--json", str(out), "--work", str(work),
             "--faults", ",".join(args.faults)]
    if args.verbose:
        argv2.append("--verbose")
    env = dict(os.environ)
    p = subprocess.run(argv2, env=env, stdin=subprocess.DEVNULL)
    after = listing()
    if p.returncode != 0 or not out.exists():
        print(f"soak: the run failed (exit {p.returncode})", file=sys.stderr)
        return 1
    fig = json.loads(out.read_text())
    fig["host_changes"] = diff_listing(before, after)
    fig["command"] = " ".join(["python3", "benchmarks/soak.py", *(argv if argv is not None else sys.argv[1:])])
    out.write_text(json.dumps(fig, indent=1, default=str))
    if own:
        shutil.rmtree(work, ignore_errors=True)
    print(summary(fig))
    print(f"targets met: {'yes' if targets_met(fig) else 'NO'}; every start in {out}")
    return 0 if targets_met(fig) else 1


if __name__ == "__main__":
    sys.exit(main())
