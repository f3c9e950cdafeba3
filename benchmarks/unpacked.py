#!/usr/bin/python3
"""``plan containerd:`` on what the node unpacked (issue 19 §4): cost flat in image size, near the API floor.

    /usr/bin/python3 benchmarks/unpacked.py [--images 100] [--keep]

Builds, in a private temp dir (removed at the end), an OCI layout whose
images share a base layer (a small rootfs with a compat libcuda): ``s50``,
``s500`` and ``s2000`` add 50 MB, 500 MB and 2 GB of data in a few big
files (4 MiB of ``os.urandom`` repeated with a varying header: as
incompressible as real libraries, generated at disk speed), and ``n000`` ..
``n099`` each add one small layer. A private containerd 1.6 imports (and so
unpacks into overlayfs) all of them. Then, in one child ``/usr/bin/python3``
(its VmHWM is the peak RSS), medians of the runs:

* ``plan_s50`` / ``plan_s500`` / ``plan_s2000``: :func:`compat_hook.commands.plan.plan`
  of the one image, snapshot path; target: s2000 <= 1.2x s50;
* ``plan_100``: ``plan containerd:`` over the 100-image namespace;
  ``floor_100``: the bare API cost of that: ``ctr images ls``, then per image
  ``ctr snapshots view``, ``ctr snapshots mounts`` and ``ctr snapshots rm`` (a
  view must go again), nothing read; target: plan_100 <= 1.5x floor_100;
* ``blobs_s2000`` / ``blobs_100``: the same on the blob path (``Limits.unpacked =
  False``), for scale, no target;
* peak RSS <= 64 MiB.

Exit status 0 when every target holds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO)]

from compat_hook.facts.elfgen import NOTE_575, make_elf  # noqa: E402
from tests.support import engines  # noqa: E402
from tests.support import images as I  # noqa: E402

PY = "/usr/bin/python3"
CHUNK = 4 << 20


def _big_layer(path: Path, mb: int, tag: str) -> None:
    """A tar layer of ``mb`` MB in files of <= 256 MB: one urandom chunk, each copy with its own header."""
    chunk = os.urandom(CHUNK)
    left, n = mb << 20, 0
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        while left > 0:
            size = min(left, 256 << 20)
            ti = tarfile.TarInfo(f"opt/{tag}/data{n}.bin")
            ti.size, ti.mtime = size, 1700000000

            class Src(io.RawIOBase):
                def __init__(self) -> None:
                    self.pos = 0

                def readable(self) -> bool:
                    return True

                def readinto(self, b) -> int:
                    k = min(len(b), size - self.pos, CHUNK)
                    if k <= 0:
                        return 0
                    head = (self.pos // CHUNK).to_bytes(8, "little")
                    b[:k] = (head + chunk[8:])[:k]
                    self.pos += k
                    return k

            tf.addfile(ti, io.BufferedReader(Src(), CHUNK))
            left -= size
            n += 1


def _small(entries: list) -> bytes:
    return I.tar_layer(entries)


def build(work: Path, n: int) -> Path:
    lay = I.Layout(work / "layout")
    lib = make_elf(soname="libcuda.so.1", note_json=NOTE_575)
    base = lay.blob(_small([("dir", "usr/local/cuda-12.9/compat"),
                            ("file", "usr/local/cuda-12.9/compat/libcuda.so.575.57.08", lib),
                            ("symlink", "usr/local/cuda", "cuda-12.9"),
                            ("file", "etc/os-release", b"ID=debian\n")]), I.LAYER_TYPES["tar"])
    base_bytes = I.decompressed(lay.blob_path(base).read_bytes())
    env = ["CUDA_VERSION=12.9.1", "PATH=/usr/bin:/bin"]
    for mb in (50, 500, 2000):
        p = work / f"l{mb}.tar"
        _big_layer(p, mb, f"s{mb}")
        d = I.digest(p.read_bytes()) if mb < 1000 else None
        if d is None:
            import hashlib

            h = hashlib.sha256()
            with open(p, "rb") as f:
                for b in iter(lambda: f.read(1 << 22), b""):
                    h.update(b)
            d = "sha256:" + h.hexdigest()
        dest = lay.path / "blobs/sha256" / d.split(":")[1]
        os.replace(p, dest)
        desc = {"mediaType": I.LAYER_TYPES["tar"], "digest": d, "size": dest.stat().st_size}
        m = lay.image([], env=env, layer_descs=[base, desc], diff_ids=[I.digest(base_bytes), d])
        lay.tag(m, f"s{mb}")
    for i in range(n):
        top = _small([("file", f"srv/app{i}/main.py", f"print({i})\n".encode())])
        m = lay.image([base_bytes, top], env=env)
        lay.tag(m, f"n{i:03d}")
    return lay.tar(work / "layout.tar")


CHILD = r"""
import json, os, statistics, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from compat_hook.core import config as C, images, plan as P
sock, ctr, conf, iters = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
cfg = C.load(conf)
def run(sources, ns):
    t = time.monotonic()
    r = P.plan(cfg, sources, driver="580.65.06", address=sock, namespace=ns)
    assert all(i.get("error") is None for i in r["images"]), r["images"][:2]
    return time.monotonic() - t, {i["read_via"] for i in r["images"]}
def ctrc(*a):
    return subprocess.run([ctr, "-a", sock, "-n", "big", *a], capture_output=True, text=True, check=True).stdout
def floor():
    t = time.monotonic()
    out = subprocess.run([ctr, "-a", sock, "-n", "many", "images", "ls"], capture_output=True, text=True).stdout
    snaps = {}
    for line in out.splitlines()[1:]:
        ref = line.split()[0]
        snaps[ref] = None
    labels = {}
    # the top snapshot of each image, known without reading: the floor needs only the calls
    for i, ref in enumerate(snaps):
        key = f"floor-{i}"
        subprocess.run([ctr, "-a", sock, "-n", "many", "snapshots", "view", key, TOPS[ref]], capture_output=True)
        subprocess.run([ctr, "-a", sock, "-n", "many", "snapshots", "mounts", "/x", key], capture_output=True)
        subprocess.run([ctr, "-a", sock, "-n", "many", "snapshots", "rm", key], capture_output=True)
    return time.monotonic() - t
TOPS = json.loads(sys.argv[6])
res = {}
for name in ("s50", "s500", "s2000"):
    res[f"plan_{name}"] = statistics.median(run([f"containerd:localhost/b:{name}"], "big")[0] for _ in range(iters))
res["plan_100"] = statistics.median(run(["containerd:"], "many")[0] for _ in range(iters))
res["floor_100"] = statistics.median(floor() for _ in range(iters))
via = run(["containerd:"], "many")[1]
images.Limits.unpacked = False
res["blobs_s2000"] = run(["containerd:localhost/b:s2000"], "big")[0]
res["blobs_100"], via_blobs = run(["containerd:"], "many")
res["via"] = sorted(via) + sorted(via_blobs)
res["rss_kb"] = int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
print(json.dumps(res))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chub", dir="/tmp"))
    d = None
    try:
        t = time.monotonic()
        tar = build(work, a.images)
        print(f"built in {time.monotonic() - t:.0f} s", file=sys.stderr)
        d = engines.Containerd(work / "d", pause_image="localhost/none:pause")
        d.start("575.57.08")
        t = time.monotonic()
        for ns, base in (("big", "localhost/b"), ("many", "localhost/m")):
            d.ctr("-n", ns, "images", "import", "--base-name", base, tar, timeout=1200)
        for ref in d.ctr("-n", "big", "images", "ls", "-q").stdout.split():
            if ref.startswith("localhost/b:n"):
                d.ctr("-n", "big", "images", "rm", ref)
        for ref in d.ctr("-n", "many", "images", "ls", "-q").stdout.split():
            if ref.startswith("localhost/m:s"):
                d.ctr("-n", "many", "images", "rm", ref)
        print(f"imported in {time.monotonic() - t:.0f} s", file=sys.stderr)
        host = work / "host/proc/driver/nvidia"
        host.mkdir(parents=True)
        (host / "version").write_text(engines.driver_version_text("575.57.08"))
        conf = work / "plan.yaml"
        conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {work / 'host'}\n")
        tops = _tops(d)
        env = dict(engines.ENV, PATH=f"{d.bin_dir}:{engines.ENV['PATH']}")
        p = subprocess.run([PY, "-c", CHILD, str(REPO), str(d.sock), d.ctr_binary, str(conf), str(a.iters),
                            json.dumps(tops)], capture_output=True, text=True, env=env, timeout=3600)
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            return 1
        r = json.loads(p.stdout)
    finally:
        if d is not None:
            d.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    checks = {
        "plan s2000 <= 1.2x plan s50": (r["plan_s2000"] / r["plan_s50"], r["plan_s2000"] <= 1.2 * r["plan_s50"]),
        "plan 100 images <= 1.5x the API floor": (r["plan_100"] / r["floor_100"], r["plan_100"] <= 1.5 * r["floor_100"]),
        "peak RSS <= 64 MiB": (r["rss_kb"] / 1024, r["rss_kb"] <= 64 * 1024),
    }
    for k in ("plan_s50", "plan_s500", "plan_s2000", "plan_100", "floor_100", "blobs_s2000", "blobs_100"):
        print(f"{k:12s} {r[k] * 1000:9.0f} ms")
    print(f"read via: {r['via']}")
    for name, (v, ok) in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {v:.2f}")
    return 0 if all(ok for _, ok in checks.values()) else 1


def _tops(d) -> dict:
    """Each image's top snapshot (its config's snapshot label), for the floor's views."""
    out = {}
    labels = {}
    for line in d.ctr("-n", "many", "content", "ls").stdout.splitlines()[1:]:
        f = line.split("\t")
        labels[f[0].strip()] = dict(kv.partition("=")[::2] for kv in f[-1].split(",") if "=" in kv)
    for line in d.ctr("-n", "many", "images", "ls").stdout.splitlines()[1:]:
        ref, _, digest = line.split()[:3]
        cfg = labels[digest]["containerd.io/gc.ref.content.config"]
        out[ref] = labels[cfg]["containerd.io/gc.ref.snapshot.overlayfs"]
    return out


if __name__ == "__main__":
    sys.exit(main())
