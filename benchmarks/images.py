#!/usr/bin/python3
"""Image reading benchmarks (issue 14 §3): time against ``gzip -dc``, peak RSS, shared layers.

    /usr/bin/python3 benchmarks/images.py [--quick] [--size-mb 1024] [--out FILE] [--keep]

Generates (in under a minute on 2 cores) an OCI layout whose ``big`` image
has three gzip layers of ~1 GB in all: many small files, mid-size libraries,
large blobs and a 40 MB libcuda in a compat dir; the data is "binary-like"
(slices of a random vocabulary with random bytes between, ~1.4:1 under
gzip) and text (~6:1), so inflating costs what real layers cost. Then, each
row a fresh ``/usr/bin/python3`` child (imports included), A/B interleaved,
medians of the runs:

* ``gzip_dc``: ``gzip -dc`` of each layer blob to /dev/null, summed;
* ``read_big``: ``images.open_image`` + ``imagefacts.gather`` of the image;
  target: <= 1.3x ``gzip_dc``, peak RSS (the child's VmHWM) < 64 MiB;
* ``zstd_dc`` / ``read_big_zstd``: the same image with zstd layers (for scale, no target);
* ``shared50``: 50 images sharing the two base layers (~65% of the bytes),
  each with its own small top layer, read by one reader; ``distinct50``: what
  is distinct in them - the base image once plus the 50 top layers alone;
  target: shared50 <= 1.25x distinct50.

Exit status 0 when every target holds. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import zlib
from multiprocessing import Pool
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import timing  # noqa: E402
from compat_hook.facts.elfgen import NOTE_575, make_elf  # noqa: E402
from tests.support import images as I  # noqa: E402

PY = "/usr/bin/python3"
RSS_LIMIT_KB = 64 * 1024
_VOCAB = 1 << 16
_BLOCK = 8 << 20


@functools.lru_cache(maxsize=None)
def _blocks(seed: int) -> tuple:
    """An 8 MiB binary-like block and a 2 MiB text block (deterministic)."""
    r = random.Random(seed)
    vocab = r.randbytes(_VOCAB)
    out = bytearray()
    while len(out) < _BLOCK:
        o = r.randrange(0, _VOCAB - 300)
        out += vocab[o:o + r.randrange(8, 300)]
        if r.random() < 0.3:
            out += r.randbytes(r.randrange(4, 64))
    words = [r.randbytes(r.randrange(2, 9)).hex().encode() for _ in range(4000)]
    text = bytearray()
    while len(text) < 2 << 20:
        text += b" ".join(r.choice(words) for _ in range(r.randrange(4, 16))) + b"\n"
    return bytes(out[:_BLOCK]), bytes(text[:2 << 20])


def _data(r: random.Random, blocks: tuple, size: int) -> bytes:
    binary, text = blocks
    parts, left = [], size
    while left > 0:
        src = binary if r.random() < 0.65 else text
        n = min(left, r.randrange(4096, 1 << 20), len(src))
        o = r.randrange(0, len(src) - n + 1)
        parts.append(src[o:o + n])
        left -= n
    return b"".join(parts)


class _GzipOut:
    def __init__(self, f) -> None:
        self.f, self.c = f, zlib.compressobj(1, zlib.DEFLATED, 31)

    def write(self, b) -> int:
        self.f.write(self.c.compress(b))
        return len(b)

    def close(self) -> None:
        self.f.write(self.c.flush())
        self.f.close()


def make_layer(args) -> str:
    """Write one gzip layer blob (``kind``: small / libs / app / top); returns its path."""
    out, kind, size_mb, seed = args
    r = random.Random(seed)
    blocks = _blocks(seed % 3)
    w = _GzipOut(open(out, "wb"))
    tf = tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT)
    budget = size_mb << 20
    n = 0

    def add(name: str, data: bytes | None = None, *, link: str | None = None, directory: bool = False) -> None:
        ti = tarfile.TarInfo(name)
        ti.mtime = 1700000000
        if directory:
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        elif link is not None:
            ti.type, ti.linkname = tarfile.SYMTYPE, link
        else:
            ti.size, ti.mode = len(data), 0o644
        tf.addfile(ti, None if data is None else _Bytes(data))

    sizes = {"small": (100, 16 << 10), "libs": (64 << 10, 4 << 20), "app": (1 << 20, 48 << 20),
             "top": (1 << 10, 256 << 10)}[kind]
    d = f"{kind}{seed}"
    if kind == "app":
        add("usr/local/cuda-12.4/compat", directory=True)
        lib = make_elf(note_json=NOTE_575)
        add("usr/local/cuda-12.4/compat/libcuda.so.550.54.15", bytes(lib) + _data(r, blocks, 40 << 20))
        add("usr/local/cuda-12.4/compat/libcuda.so.1", link="libcuda.so.550.54.15")
        add("usr/local/cuda", link="cuda-12.4")
        budget -= 40 << 20
    if kind == "top":
        add(f"etc/ld.so.conf.d/{d}.conf", f"/opt/{d}/lib\n".encode())
    while budget > 0:
        # A directory every 10 files and a symlink every 3rd, as in distro
        # and Python trees (what the reader keeps: ~8k entries per GB here).
        if n % 10 == 0:
            add(f"opt/{d}/dir{n // 10}", directory=True)
        if n % 3 == 0:
            add(f"opt/{d}/dir{n // 10}/link{n}", link=f"file{n - 1}")
        size = min(budget, r.randrange(*sizes))
        add(f"opt/{d}/dir{n // 10}/file{n}", _data(r, blocks, size))
        budget -= size
        n += 1
    tf.close()
    w.close()
    return out


class _Bytes:
    def __init__(self, b: bytes) -> None:
        self.b, self.o = b, 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = len(self.b) - self.o
        out = self.b[self.o:self.o + n]
        self.o += len(out)
        return out


def build(work: Path, size_mb: int) -> dict:
    """The layouts (gzip and zstd) and the list of layer blobs; generation time."""
    t0 = time.monotonic()
    blobs = work / "gen"
    blobs.mkdir(parents=True)
    specs = [(str(blobs / "small.gz"), "small", size_mb * 15 // 100, 11),
             (str(blobs / "libs.gz"), "libs", size_mb * 50 // 100, 12),
             (str(blobs / "app.gz"), "app", size_mb * 35 // 100, 13)]
    specs += [(str(blobs / f"top{i}.gz"), "top", 2, 100 + i) for i in range(50)]
    with Pool(2) as pool:
        paths = pool.map(make_layer, specs, chunksize=1)
    gen_s = time.monotonic() - t0
    for p in paths[:3]:
        z = Path(p).with_suffix(".zst")
        timing_sh(f"gzip -dc {p} | zstd -q -3 -T2 -o {z}")
    lay, zl = I.Layout(work / "layout"), I.Layout(work / "zstd")
    fake = ["sha256:" + "0" * 64] * 3  # diff_ids: not read for OCI layouts
    big = [_move_blob(lay, p, I.LAYER_TYPES["gzip"]) for p in paths[:3]]
    lay.tag(lay.image([], layer_descs=big, diff_ids=fake), "big")
    lay.tag(lay.image([], layer_descs=big[:2], diff_ids=fake[:2]), "base")
    for i, p in enumerate(paths[3:]):
        top = _move_blob(lay, p, I.LAYER_TYPES["gzip"])
        lay.tag(lay.image([], layer_descs=big[:2] + [top], diff_ids=fake), f"shared{i}")
        lay.tag(lay.image([], layer_descs=[top], diff_ids=fake[:1]), f"top{i}")
    zbig = [_move_blob(zl, Path(p).with_suffix(".zst"), I.LAYER_TYPES["zstd"]) for p in paths[:3]]
    zl.tag(zl.image([], layer_descs=zbig, diff_ids=fake), "big")
    return {"layout": lay.path, "zstd": zl.path, "layers": [lay.blob_path(d) for d in big],
            "zlayers": [zl.blob_path(d) for d in zbig], "gen_s": round(time.monotonic() - t0, 1),
            "pool_s": round(gen_s, 1), "compressed_mb": round(sum(d["size"] for d in big) / 2**20),
            "uncompressed_mb": size_mb}


def _move_blob(lay, path, media_type: str) -> dict:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    size = os.path.getsize(path)
    os.rename(path, lay.path / "blobs" / "sha256" / h.hexdigest())
    return {"mediaType": media_type, "digest": "sha256:" + h.hexdigest(), "size": size}


def timing_sh(cmd: str) -> None:
    import subprocess

    subprocess.run(["/bin/sh", "-c", cmd], check=True)


READER = """
import sys, time
sys.path.insert(0, {repo!r})
from compat_hook.images import reader as images; from compat_hook.facts import imagefacts
from compat_hook.core.config import from_mapping
cfg = from_mapping({{"log_file": None, "nvml": "off"}})
r = images.Reader()
status = []
entries = 0
for src in {sources!r}:
    img = r.open(src)
    status.append(imagefacts.gather(img.root, cfg).status)
    entries = max(entries, img.stats["entries"])
    img.close()
r.close()
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
open({out!r}, "w").write(hwm + " " + ",".join(status) + " " + str(entries))
"""


def reader_argv(sources: list, out: Path) -> list:
    return [PY, "-c", READER.format(repo=str(REPO), sources=sources, out=str(out))]


def run_rows(b: dict, iters: int, work: Path) -> dict:
    lay, z = b["layout"], b["zstd"]
    out = work / "reader.out"
    rows = {
        "gzip_dc": [[shutil.which("gzip"), "-dc", str(p)] for p in b["layers"]],
        "read_big": [reader_argv([f"oci:{lay}:big"], out)],
        "zstd_dc": [[shutil.which("zstd"), "-q", "-dc", str(p)] for p in b["zlayers"]],
        "read_big_zstd": [reader_argv([f"oci:{z}:big"], out)],
        "shared50": [reader_argv([f"oci:{lay}:shared{i}" for i in range(50)], out)],
        "distinct50": [reader_argv([f"oci:{lay}:base"] + [f"oci:{lay}:top{i}" for i in range(50)], out)],
    }
    res = {k: {"ms": [], "rss_kb": 0, "status": None} for k in rows}
    for _ in range(iters):
        for name, argvs in rows.items():   # A/B interleaved: every row each round
            total = 0.0
            for argv in argvs:
                ms, rc, _ = timing.run_once(argv)
                if rc != 0:
                    raise SystemExit(f"{name}: {argv[0]} exited {rc}")
                total += ms
            res[name]["ms"].append(total)
            if argv[0] == PY:
                hwm, status, entries = out.read_text().split()
                res[name]["rss_kb"] = max(res[name]["rss_kb"], int(hwm))
                res[name]["status"] = status
                res[name]["entries"] = int(entries)
    for r in res.values():
        r["median_ms"] = round(statistics.median(r["ms"]), 1)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds instead of 5")
    ap.add_argument("--size-mb", type=int, default=1024, help="uncompressed size of the big image (default 1024)")
    ap.add_argument("--out", default=str(HERE / "results" / "images.json"))
    ap.add_argument("--keep", action="store_true", help="keep the generated layouts")
    o = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compat-hook-bench-images-"))
    load = os.getloadavg()
    try:
        b = build(work, o.size_mb)
        print(f"[bench] generated {b['uncompressed_mb']} MB ({b['compressed_mb']} MB gzip) + 50 top layers "
              f"in {b['gen_s']} s", file=sys.stderr)
        res = run_rows(b, 3 if o.quick else 5, work)
    finally:
        if not o.keep:
            shutil.rmtree(work, ignore_errors=True)
    g, rd = res["gzip_dc"]["median_ms"], res["read_big"]["median_ms"]
    zd, rz = res["zstd_dc"]["median_ms"], res["read_big_zstd"]["median_ms"]
    s50, d50 = res["shared50"]["median_ms"], res["distinct50"]["median_ms"]
    rss = max(res[k]["rss_kb"] for k in ("read_big", "read_big_zstd", "shared50", "distinct50"))
    targets = {
        "read <= 1.3x gzip -dc": (rd / g, rd <= 1.3 * g),
        "peak RSS < 64 MiB": (rss / 1024, rss < RSS_LIMIT_KB),
        "50 shared <= 1.25x distinct": (s50 / d50, s50 <= 1.25 * d50),
        "compat found in big": (res["read_big"]["status"], res["read_big"]["status"] == "found"),
    }
    print(f"{'row':<16} {'median ms':>10} {'ratio':>8} {'RSS MiB':>8} {'kept':>7}")
    for name, base in (("gzip_dc", None), ("read_big", "gzip_dc"), ("zstd_dc", None), ("read_big_zstd", "zstd_dc"),
                       ("shared50", "distinct50"), ("distinct50", None)):
        r = res[name]
        ratio = f"{r['median_ms'] / res[base]['median_ms']:.2f}x" if base else ""
        mem = f"{r['rss_kb'] / 1024:.1f}" if r["rss_kb"] else ""
        print(f"{name:<16} {r['median_ms']:>10.1f} {ratio:>8} {mem:>8} {r.get('entries', ''):>7}")
    ok = True
    for t, (v, good) in targets.items():
        ok &= bool(good)
        print(f"{'PASS' if good else 'FAIL'}  {t}: {v if isinstance(v, str) else round(v, 2)}")
    if load[0] > os.cpu_count():
        print(f"[bench] warning: load average {load[0]:.1f} on {os.cpu_count()} CPUs", file=sys.stderr)
    Path(o.out).parent.mkdir(parents=True, exist_ok=True)
    Path(o.out).write_text(json.dumps({"rows": {k: {kk: vv for kk, vv in v.items()} for k, v in res.items()},
                                       "targets": {k: [v[0], bool(v[1])] for k, v in targets.items()},
                                       "generated": {k: v for k, v in b.items() if k.endswith(("_s", "_mb"))},
                                       "load": load, "cpus": os.cpu_count()}, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
