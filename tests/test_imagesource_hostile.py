"""Hostile images: every one gives a clear per-image error or a sound result, in bounded time,
writes nothing outside the reader's private temp dir, and leaves the other images' results alone.

The canary (:func:`reader`): the reader's temp dir is made under this test's
own dir, a host tree the images aim at (``canary/``: hostile names, symlinks
and hard links point there) is snapshotted before, and afterwards the whole
test dir is unchanged except for the layouts the test wrote - the temp dir
included, which :meth:`Reader.close` removes.

Where umoci (a real unpacker) can unpack a hostile image, its rootfs is the
ground truth (``..`` and absolute names and symlinked parents clamped at the
root); where it refuses one (a hard link to nothing), so does every runtime,
and the reader's answer must at least claim nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
import zlib

import pytest

from compat_hook.facts import imagefacts
from compat_hook.images import reader as images
from compat_hook.core.errors import UnsafePath
from compat_hook.facts.rootfs import Root
from tests import elfgen
from tests.conftest import config_for, elf
from tests.support import images as I
from tests.support.hostile import host_tree_snapshot, sparse_elf_table_at_end

CFG = config_for()
GOOD_ENV = ["CUDA_VERSION=12.4.1"]


def good_layer() -> bytes:
    return I.gz(I.tar_layer([
        ("dir", "usr/local/cuda-12.4/compat"),
        ("file", "usr/local/cuda-12.4/compat/libcuda.so.550.54.15", elf(elfgen.NOTE_575)),
        ("symlink", "usr/local/cuda", "cuda-12.4"),
        ("file", "etc/ld.so.conf.d/cuda.conf", b"/usr/local/cuda/compat\n"),
    ]))


@pytest.fixture
def env(tmp_path):
    """A layout with a good image, the canary tree, and a reader whose temp dir is under tmp_path."""
    canary = tmp_path / "canary"
    (canary / "etc").mkdir(parents=True)
    (canary / "etc" / "secret").write_bytes(b"host secret")
    (canary / "compat").mkdir()
    lay = I.Layout(tmp_path / "layout")
    lay.tag(lay.image([good_layer()], env=GOOD_ENV), "good")
    (tmp_path / "tmp").mkdir()
    reader = images.Reader(images.Limits(max_layer_bytes=64 << 20, deadline_s=60), tmp_dir=str(tmp_path / "tmp"))

    class Env:
        pass

    e = Env()
    e.path, e.canary, e.lay, e.reader = tmp_path, canary, lay, reader
    e.before = None
    yield e
    reader.close()
    # Nothing left behind or changed outside what the test itself wrote.
    after = host_tree_snapshot(tmp_path, exclude=[str(tmp_path / "layout"), str(tmp_path / "other")])
    if e.before is not None:
        assert after == e.before
    assert os.listdir(tmp_path / "tmp") == []


def arm(e) -> None:
    """Snapshot the test dir once every source is written (before reading)."""
    e.before = host_tree_snapshot(e.path, exclude=[str(e.path / "layout"), str(e.path / "other")])


def good_result(e) -> dict:
    with e.reader.open(f"oci:{e.lay.path}:good") as img:
        assert img.env == GOOD_ENV
        return imagefacts.gather(img.root, CFG).to_dict()


def timed_open(e, source, **kw):
    t0 = time.monotonic()
    try:
        return e.reader.open(source, **kw)
    finally:
        assert time.monotonic() - t0 < 30, f"{source}: not bounded in time"


# --------------------------------------------------------------------------- entries


def test_escaping_names_and_links_stay_inside_the_image(env):
    e = env
    c = str(e.canary)
    l1 = I.gz(I.tar_layer([
        ("dir", "usr/local"),
        ("symlink", "usr/local/cuda", "/../../../.." + c),               # an absolute climb to the canary
        ("file", "../../../etc/ld.so.conf.d/evil.conf", b"/evil\n"),    # .. names
        ("file", "/abs/compat/libcuda.so.1.2", b"abs"),                 # an absolute name
        ("symlink", "etc/ld.so.conf.d/up.conf", "../../../../../" + c + "/etc/secret"),
        ("file", c.lstrip("/") + "/etc/secret", b"image's own"),        # the same path inside the image
    ]))
    l2 = I.gz(I.tar_layer([
        # Through the symlinked parent: lands under the image's <canary>/compat.
        ("file", "usr/local/cuda/compat/libcuda.so.550.54.15", elf(elfgen.NOTE_575)),
        ("symlink", "usr/local/cuda/compat/libcuda.so.1", "/../../etc/secret"),
    ]))
    e.lay.tag(e.lay.image([l1, l2]), "escape")
    I.umoci("unpack", "--image", f"{e.lay.path}:escape", e.path / "other")
    arm(e)
    good = good_result(e)
    with timed_open(e, f"oci:{e.lay.path}:escape") as img, Root(str(e.path / "other" / "rootfs")) as real:
        v = img.root
        assert imagefacts.gather(v, CFG).to_dict() == imagefacts.gather(real, CFG).to_dict()
        assert imagefacts.compat_dropins(v) == imagefacts.compat_dropins(real)
        assert v.realpath("/usr/local/cuda/compat") == c + "/compat" == real.realpath("/usr/local/cuda/compat")
        assert v.read_file("/etc/ld.so.conf.d/up.conf") == b"image's own" == real.read_file("/etc/ld.so.conf.d/up.conf")
        assert v.read_file("/etc/ld.so.conf.d/evil.conf") == b"/evil\n"
        assert v.listdir("/abs/compat") == [("libcuda.so.1.2", "file")]
    assert good_result(e) == good
    assert sorted(os.listdir(e.canary / "compat")) == []


def test_hard_links_and_special_files(env):
    e = env
    lay = I.gz(I.tar_layer([
        ("dir", "usr/local/cuda/compat"),
        # A hard link to a host file: no runtime can make it; nothing is read from the host.
        ("hardlink", "usr/local/cuda/compat/libcuda.so.550.54.15", "../../../../" + str(env.canary) + "/etc/secret"),
        ("fifo", "usr/local/cuda/compat/libcuda.so.555.42.06"),
        ("chr", "usr/local/cuda/compat/libcuda.so.560.35.03"),
        ("symlink", "usr/local/cuda/compat/libcuda.so.570.86.15", "/etc/shadow"),
    ]))
    e.lay.tag(e.lay.image([lay]), "special")
    arm(e)
    with timed_open(e, f"oci:{e.lay.path}:special") as img:
        v = img.root
        f = imagefacts.gather(v, CFG)
        # Only the hard link is a regular file: it is the candidate, and unreadable.
        assert (f.status, f.candidates, f.elf) == ("found", ["libcuda.so.550.54.15"], None)
        assert any("cannot open" in n for n in f.notes)
        with pytest.raises(OSError):
            v.read_file("/usr/local/cuda/compat/libcuda.so.550.54.15")
        for name, kind in (("555.42.06", "FIFO"), ("560.35.03", "character device"), ("570.86.15", "symlink")):
            with pytest.raises(UnsafePath, match=kind):
                v.open_regular(f"/usr/local/cuda/compat/libcuda.so.{name}", follow=False)
    assert (e.canary / "etc" / "secret").read_bytes() == b"host secret"


def test_hard_link_to_a_file_of_a_lower_layer_is_fetched(env):
    e = env
    l1 = I.gz(I.tar_layer([("file", "opt/blob.bin", elf(elfgen.NOTE_575))]))   # not kept on the first pass
    l2 = I.gz(I.tar_layer([("dir", "usr/local/cuda/compat"),
                           ("hardlink", "usr/local/cuda/compat/libcuda.so.550.54.15", "opt/blob.bin")]))
    e.lay.tag(e.lay.image([l1, l2]), "lower-link")
    arm(e)
    with timed_open(e, f"oci:{e.lay.path}:lower-link") as img:
        f = imagefacts.gather(img.root, CFG)
        assert f.status == "found" and f.elf is not None and f.elf.note is not None


def test_sparse_4gb_libcuda_costs_its_data_only(env):
    e = env
    src = e.path / "other" / "src"
    (src / "usr/local/cuda/compat").mkdir(parents=True)
    lib = src / "usr/local/cuda/compat/libcuda.so.550.54.15"
    sparse_elf_table_at_end(4 << 30)(lib)
    tar = e.path / "other" / "sparse.tar"
    I.sh("tar", "--sparse", "--format=gnu", "-C", src, "-cf", tar, "usr")
    assert tar.stat().st_size < 1 << 20
    e.lay.tag(e.lay.image([I.gz(tar.read_bytes())]), "sparse")
    arm(e)
    with timed_open(e, f"oci:{e.lay.path}:sparse") as img, Root(str(src)) as real:
        assert imagefacts.gather(img.root, CFG).to_dict() == imagefacts.gather(real, CFG).to_dict()
        with img.root.open_regular("/usr/local/cuda/compat/libcuda.so.550.54.15") as f:
            st = os.fstat(f.fileno())
            assert st.st_size == 4 << 30 and st.st_blocks * 512 < 1 << 20   # holes stay holes
    # Beyond the bound on a file's size: unreadable, never written.
    with images.Reader(images.Limits(max_file_size=1 << 30), tmp_dir=str(e.path / "tmp")) as r2:
        f = imagefacts.gather(r2.open(f"oci:{e.lay.path}:sparse").root, CFG)
        assert f.status == "found" and f.elf is None and any("too large" in n for n in f.notes)


def _bomb(total: int) -> bytes:
    """A gzip'd tar whose one member claims 64 GiB and is ``total`` bytes of zeros (~1000:1)."""
    ti = tarfile.TarInfo("opt/zeros")
    ti.size = 64 << 30
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(ti.tobuf(tarfile.PAX_FORMAT))]
    block = bytes(1 << 20)
    for _ in range(total >> 20):
        out.append(c.compress(block))
    out.append(c.flush())
    return b"".join(out)


def _endless_bomb(total: int) -> bytes:
    """A gzip'd tar whose one member claims 64 GiB, ``total`` bytes of zeros in ~1000:1 units.

    Each 1 MiB of zeros ends with a full flush, which resets the compressor, so every unit
    compresses to the same bytes: the stream is built by repetition, not by compressing ``total``
    bytes. It has no gzip trailer: nothing reads that far."""
    ti = tarfile.TarInfo("opt/zeros")
    ti.size = 64 << 30
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = c.compress(ti.tobuf(tarfile.PAX_FORMAT)) + c.flush(zlib.Z_FULL_FLUSH)
    unit = c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH) == unit
    return head + unit * (total >> 20)


@pytest.mark.slow
def test_gzip_bomb_and_deadline(env):
    e = env
    bomb = _bomb(256 << 20)
    assert len(bomb) < 1 << 20
    e.lay.tag(e.lay.image([bomb], diff_ids=["sha256:" + "0" * 64]), "bomb")
    arm(e)
    good = good_result(e)
    with pytest.raises(images.ImageError, match="more than 67108864 bytes decompressed"):
        timed_open(e, f"oci:{e.lay.path}:bomb")
    # The deadline: a stream of 16 GiB (under the default 64 GiB layer bound) cannot end, nor cross a
    # byte bound, within 0.2 s on any machine, so the deadline is the one outcome whatever the load.
    endless = _endless_bomb(16 << 30)
    e.lay.tag(e.lay.image([endless], diff_ids=["sha256:" + "1" * 64]), "endless")
    with images.Reader(images.Limits(deadline_s=0.2), tmp_dir=str(e.path / "tmp")) as r2:
        assert r2.limits.max_layer_bytes > 16 << 30
        with pytest.raises(images.ImageError, match="not read within the time allowed"):
            r2.open(f"oci:{e.lay.path}:endless")
    assert good_result(e) == good


@pytest.mark.parametrize("case", ["truncated-gzip", "truncated-zstd", "zstd-garbage", "truncated-tar", "not-tar",
                                  "not-gzip-garbage", "bad-header",
                                  "trailing-garbage", "too-many-entries", "too-many-members", "loop", "file-parent"])
def test_damaged_layers_are_per_image_errors(env, case):
    e = env
    full = I.tar_layer([("file", f"etc/ld.so.conf.d/f{i}.conf", b"x" * 3000) for i in range(20)])
    blob = {
        "truncated-gzip": I.gz(full)[:-200],
        "truncated-zstd": I.zst(full)[:-20],
        "zstd-garbage": b"\x28\xb5\x2f\xfd" + os.urandom(3000),
        "truncated-tar": I.gz(full[:8000]),
        "not-tar": I.gz(os.urandom(5000)),
        "not-gzip-garbage": b"\x1f\x8b" + os.urandom(3000),
        "bad-header": I.gz(full[:3584] + b"garbage!" * 64 + full[4096:]),
        "trailing-garbage": I.gz(full) + b"GARBAGE",
        "too-many-entries": I.gz(I.tar_layer([("symlink", f"l{i}", "x") for i in range(3000)])),
        "too-many-members": I.gz(I.tar_layer([("file", f"f{i}", b"") for i in range(3000)])),
        "loop": I.gz(I.tar_layer([("symlink", "a", "b"), ("symlink", "b", "a"), ("file", "a/x.conf", b"")])),
        "file-parent": I.gz(I.tar_layer([("file", "etc/ld.so.conf", b""), ("file", "etc/ld.so.conf/x.conf", b"")])),
    }[case]
    expect = {
        "truncated-gzip": "truncated gzip stream", "truncated-zstd": "not a valid zstd stream",
        "zstd-garbage": "not a valid zstd stream", "truncated-tar": "truncated tar stream|damaged tar stream",
        "not-tar": "not a tar stream", "not-gzip-garbage": "not a valid gzip stream",
        "bad-header": "bad tar header", "trailing-garbage": "not gzip",
        "too-many-entries": "more than 1000 entries", "too-many-members": "more than 2000 tar members",
        "loop": "cannot be applied.*(loop|symbolic links)", "file-parent": "cannot be applied.*Not a directory",
    }[case]
    e.lay.tag(e.lay.image([good_layer(), blob], diff_ids=["sha256:" + "0" * 64] * 2), case)
    arm(e)
    good = good_result(e)
    with images.Reader(images.Limits(max_entries=1000, max_members=2000), tmp_dir=str(e.path / "tmp")) as r2:
        with pytest.raises(images.ImageError, match=expect) as ei:
            r2.open(f"oci:{e.lay.path}:{case}")
        msg = str(ei.value)
        assert "\n" not in msg and f"{case}: layer 2/2" in msg
    assert good_result(e) == good


def test_empty_layer_is_an_empty_layer(env):
    e = env
    e.lay.tag(e.lay.image([good_layer(), b""], diff_ids=["sha256:" + "0" * 64] * 2), "empty")
    arm(e)
    with timed_open(e, f"oci:{e.lay.path}:empty") as img:
        assert imagefacts.gather(img.root, CFG).to_dict() == good_result(e)


# --------------------------------------------------------------------------- manifests and blobs that lie


def _rewrite(path, data: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(data)


def test_lying_manifests_and_blobs(env):
    e = env
    lay = e.lay
    good = good_layer()
    cases = {}

    # A layer whose bytes are not the ones its digest names (a layer of its own:
    # the reader caches layers by digest, and the good image's is read already).
    mine = I.gz(I.tar_layer([("file", "etc/ld.so.conf.d/d.conf", b"/d\n")]))
    m = lay.image([mine])
    manifest = json.loads(lay.blob_path(m).read_bytes())
    # (the gzip header's MTIME: the stream still inflates, only the digest tells)
    _rewrite(lay.blob_path(manifest["layers"][0]), mine[:4] + b"\x01" + mine[5:])
    cases["digest"] = (lay.tag(m, "digest"), "does not match its digest")
    # Sizes that lie either way.
    d = lay.blob(good, I.LAYER_TYPES["gzip"])
    cases["short"] = (lay.tag(lay.image([good], layer_descs=[dict(d, size=d["size"] - 10)]), "short"),
                      "longer than the")
    cases["long"] = (lay.tag(lay.image([good], layer_descs=[dict(d, size=d["size"] + 10)]), "long"),
                     "its descriptor says")
    # A missing blob, a blob that is a symlink to /dev/zero, one that is a FIFO.
    ghost = {"mediaType": I.LAYER_TYPES["gzip"], "digest": "sha256:" + "1" * 64, "size": 10}
    cases["missing"] = (lay.tag(lay.image([good], layer_descs=[ghost]), "missing"), "missing")
    zero = {"mediaType": I.LAYER_TYPES["gzip"], "digest": "sha256:" + "2" * 64, "size": 1 << 40}
    os.symlink("/dev/zero", lay.path / "blobs/sha256" / ("2" * 64))
    cases["devzero"] = (lay.tag(lay.image([good], layer_descs=[zero]), "devzero"), "cannot open")
    fifo = {"mediaType": I.LAYER_TYPES["gzip"], "digest": "sha256:" + "3" * 64, "size": 10}
    os.mkfifo(lay.path / "blobs/sha256" / ("3" * 64))
    cases["fifo"] = (lay.tag(lay.image([good], layer_descs=[fifo]), "fifo"), "not a regular file")
    # A digest that is no digest (a path in disguise).
    bad = {"mediaType": I.LAYER_TYPES["gzip"], "digest": "sha256:../../../etc/passwd", "size": 10}
    cases["notdigest"] = (lay.tag(lay.image([good], layer_descs=[bad]), "notdigest"), "not a valid digest")
    # An index that names itself (a cycle can only be built by lying about a digest).
    self_ref = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json",
                                                  "digest": "sha256:" + "4" * 64, "size": 200}]}
    (lay.path / "blobs/sha256" / ("4" * 64)).write_text(json.dumps(self_ref))
    cases["cycle"] = (lay.tag({"mediaType": "application/vnd.oci.image.index.v1+json",
                               "digest": "sha256:" + "4" * 64,
                               "size": len(json.dumps(self_ref))}, "cycle"), "does not match its digest")
    # Indexes nested too deep.
    top = lay.image([good])
    for _ in range(10):
        top = lay.index([top])
    cases["deep"] = (lay.tag(top, "deep"), "nested more than 8 deep")
    # A manifest claiming to be huge; a config that is not JSON; not an image; schema 1.
    cases["huge"] = (lay.tag(dict(lay.image([good]), size=1 << 30), "huge"), "more than a manifest can be")
    cfg = lay.blob(b"{not json", "application/vnd.oci.image.config.v1+json")
    man = lay.blob(json.dumps({"schemaVersion": 2, "config": cfg, "layers": []}).encode())
    cases["config"] = (lay.tag(man, "config"), "not valid JSON")
    art = lay.blob(json.dumps({"schemaVersion": 2, "layers": [], "config": dict(
        lay.blob(b"{}"), mediaType="application/vnd.cncf.helm.config.v1+json")}).encode())
    cases["artifact"] = (lay.tag(art, "artifact"), "not a container image")
    s1 = lay.blob(json.dumps({"schemaVersion": 1, "fsLayers": []}).encode())
    cases["schema1"] = (lay.tag(s1, "schema1"), "schema 1")
    arm(e)
    good_before = good_result(e)
    for tag, (_, expect) in cases.items():
        with pytest.raises(images.ImageError, match=expect) as ei:
            timed_open(e, f"oci:{lay.path}:{tag}")
            pytest.fail(f"{tag}: read without an error")
        assert "\n" not in str(ei.value), tag
    with pytest.raises(images.ImageError, match="no image tagged 'nope'"):
        e.reader.open(f"oci:{lay.path}:nope")
    assert good_result(e) == good_before


def test_hostile_archives(env):
    e = env
    good = I.tar_layer([("file", "etc/ld.so.conf.d/a.conf", b"/a\n")])
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
                      "rootfs": {"type": "layers", "diff_ids": [I.digest(good)]}}).encode()

    other = I.tar_layer([("file", "etc/ld.so.conf.d/b.conf", b"/b\n")])
    cfg2 = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
                       "rootfs": {"type": "layers", "diff_ids": [I.digest(other)]}}).encode()

    def archive(name: str, members: list, manifest) -> str:
        entries = [("file", "manifest.json", json.dumps(manifest).encode())] + members
        p = e.path / "other" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(I.tar_layer(entries))
        return f"docker-archive:{p}"

    ok = archive("ok.tar", [("file", "c.json", cfg), ("file", "l.tar", good)],
                 [{"Config": "c.json", "RepoTags": ["a:1"], "Layers": ["l.tar"]}])
    cases = {
        archive("escape.tar", [("file", "c.json", cfg)],
                [{"Config": "c.json", "Layers": ["../../../../etc/passwd"]}]): "not in",
        archive("abs-link.tar", [("file", "c.json", cfg), ("symlink", "l.tar", "/etc/passwd")],
                [{"Config": "c.json", "Layers": ["l.tar"]}]): "not in",
        archive("loop.tar", [("file", "c.json", cfg), ("symlink", "l.tar", "m.tar"), ("symlink", "m.tar", "l.tar")],
                [{"Config": "c.json", "Layers": ["l.tar"]}]): "too many links",
        # (a layer of its own: a diff_id read and checked once is not read again)
        archive("diffid.tar", [("file", "c.json", cfg2), ("file", "l.tar", other + bytes(512))],
                [{"Config": "c.json", "Layers": ["l.tar"]}]): "does not match its diff_id",
        archive("count.tar", [("file", "c.json", cfg), ("file", "l.tar", good)],
                [{"Config": "c.json", "Layers": ["l.tar", "l.tar"]}]): "diff_ids do not match",
        archive("cfgname.tar", [("file", "a" * 64 + ".json", cfg), ("file", "l.tar", good)],
                [{"Config": "a" * 64 + ".json", "Layers": ["l.tar"]}]): "does not match its digest",
        archive("two.tar", [("file", "c.json", cfg), ("file", "l.tar", good)],
                [{"Config": "c.json", "Layers": ["l.tar"]}] * 2): "2 images in the archive",
        archive("nomanifest.tar", [], {"x": 1}): "lists no image",
    }
    notar = e.path / "other" / "notar.tar"
    notar.write_bytes(os.urandom(4096))
    cases[f"docker-archive:{notar}"] = "not a readable tar archive|no manifest.json"
    gzd = e.path / "other" / "gz.tar"
    gzd.write_bytes(I.gz((e.path / "other" / "ok.tar").read_bytes()))
    cases[f"docker-archive:{gzd}"] = "compressed archive"
    cases[f"oci-archive:{e.path / 'other' / 'ok.tar'}"] = "not an OCI archive"
    arm(e)
    with timed_open(e, ok) as img:
        assert img.env == ["A=1"] and img.root.read_file("/etc/ld.so.conf.d/a.conf") == b"/a\n"
    for src, expect in cases.items():
        with pytest.raises(images.ImageError, match=expect):
            timed_open(e, src)
            pytest.fail(f"{src}: read without an error")


@pytest.mark.slow
def test_many_hostile_images_in_one_run_stay_small(tmp_path):
    """One process reads bombs, wide images (near the bound on kept entries, evicting each other from
    the layer cache) and good images: peak RSS stays under 64 MiB."""
    lay = I.Layout(tmp_path / "layout")
    lay.tag(lay.image([good_layer()], env=GOOD_ENV), "good")
    lay.tag(lay.image([_bomb(128 << 20)], diff_ids=["sha256:" + "0" * 64]), "bomb")
    big = I.gz(I.tar_layer([("file", f"usr/local/cuda/compat/libnvidia-x{i}.so", b"y" * 5000)
                            for i in range(2000)]))
    lay.tag(lay.image([big]), "big")
    for w in ("wide1", "wide2"):
        lay.tag(lay.image([I.gz(I.tar_layer([("symlink", f"usr/lib/{w}/d{i // 90}/l{i}.so", f"../x{i % 90}.so")
                                             for i in range(95_000)]))]), w)
    code = f"""
import sys
from compat_hook.images import reader as images; from compat_hook.facts import imagefacts
from compat_hook.core.config import from_mapping
cfg = from_mapping({{"log_file": None, "nvml": "off"}})
r = images.Reader(images.Limits(max_layer_bytes=96 << 20))
out = []
for tag in ["good", "bomb", "big", "wide1", "good", "wide2", "bomb", "good"]:
    try:
        img = r.open("oci:{lay.path}:" + tag)
        out.append(imagefacts.gather(img.root, cfg).status)
    except images.ImageError as e:
        out.append("error")
r.close()
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(",".join(out), hwm)
"""
    p = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert p.returncode == 0, p.stderr
    statuses, hwm_kb = p.stdout.split()
    assert statuses == "found,error,none,none,found,none,error,found"
    assert int(hwm_kb) < 64 * 1024, f"peak RSS {hwm_kb} KiB"
