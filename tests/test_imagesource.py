"""The image reader against the real thing: images built with umoci, converted with skopeo,
imported into a live containerd, and the same images unpacked by ``umoci unpack``.

The differential check (:func:`check_same`): what the compat checks read
through the reader's view (``imagefacts.gather``, ``compat_dropins``, our
drop-in, ``host_lib_dir``, realpaths through the image's symlinks) equals
what they read through :class:`~compat_hook.facts.rootfs.Root` on the unpacked
rootfs; every directory and symlink of the rootfs is in the view with the
same type and target, every file the reader keeps has the same size and
bytes, and the view holds nothing the rootfs does not.

The image (umoci layers, then hand-made ones umoci cannot make):

* ``base``: ld.so.conf(.d), a compat dir ``/usr/local/cuda-12.4/compat``
  (libcuda 550.54.15 with a note, libcuda.so.1, libnvidia-ptxjitcompiler, a
  FIFO), a hard link of the libcuda outside it, ``/opt/old`` (a tree),
  ``/bin -> usr/bin``, a symlink climbing out of the root;
* ``two`` (+ umoci layer): ``/usr/local/cuda -> cuda-12.4`` (after the libs),
  ``/opt/old`` and the ptxjitcompiler deleted (whiteouts), an image drop-in
  ``00-cuda-compat.conf``;
* ``three`` (+ a layer by hand): ``.wh..wh..opq`` on the compat dir and a new
  libcuda 555.42.06 there; ``three-zstd`` the same layer zstd-compressed.
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from compat_hook.facts import imagefacts
from compat_hook.images import reader as images, stores as imagestores
from compat_hook.effects import ldcache
from compat_hook.images.layers import keep
from compat_hook.facts.rootfs import Root
from tests import elfgen
from tests.conftest import Dir, Fifo, Symlink, build_tree, config_for, elf
from tests.support import images as I

CFG = config_for()
C550 = "550.54.15"
C555 = "555.42.06"


def _base_tree(root) -> None:
    build_tree(root, {
        "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
        "etc/ld.so.conf.d/x86_64-linux-gnu.conf": "/usr/local/lib\n/usr/lib/x86_64-linux-gnu\n",
        "usr/bin/sh": b"#!shell\n",
        "bin": Symlink("usr/bin"),
        f"usr/local/cuda-12.4/compat/libcuda.so.{C550}": elf(elfgen.NOTE_575),
        "usr/local/cuda-12.4/compat/libcuda.so.1": Symlink(f"libcuda.so.{C550}"),
        f"usr/local/cuda-12.4/compat/libnvidia-ptxjitcompiler.so.{C550}": b"ptxjit" * 100,
        "usr/local/cuda-12.4/compat/pipe": Fifo(),
        "usr/local/cuda-12.4/targets/x86_64-linux/lib/libcudart.so.12.4.127": b"cudart" * 1000,
        "usr/local/cuda-12.4/lib64": Symlink("targets/x86_64-linux/lib"),
        "usr/local/escape": Symlink("../../../../../../etc"),
        "usr/lib/x86_64-linux-gnu/libc.so.6": b"libc" * 1000,
        "opt/old/a.txt": b"a", "opt/old/sub/b.txt": b"b", "opt/hl": Dir(),
        "tmp": Dir(0o1777),
    })
    os.link(root / f"usr/local/cuda-12.4/compat/libcuda.so.{C550}", root / f"opt/hl/libcuda.so.{C550}")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The layout (tags base, two, three, three-zstd) and each tag unpacked by umoci."""
    w = tmp_path_factory.mktemp("imgsrc")
    lay = w / "layout"
    I.umoci("init", "--layout", lay)
    I.umoci("new", "--image", f"{lay}:base")
    I.umoci("unpack", "--image", f"{lay}:base", w / "b1")
    _base_tree(w / "b1" / "rootfs")
    I.umoci("repack", "--image", f"{lay}:base", w / "b1")
    I.umoci("config", "--image", f"{lay}:base", "--config.env", "CUDA_VERSION=12.4.1",
            "--config.env", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471",
            "--config.env", "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib64")
    I.umoci("unpack", "--image", f"{lay}:base", w / "b2")
    r = w / "b2" / "rootfs"
    os.symlink("cuda-12.4", r / "usr/local/cuda")
    I.sh("rm", "-rf", r / "opt/old", r / f"usr/local/cuda-12.4/compat/libnvidia-ptxjitcompiler.so.{C550}")
    (r / "etc/ld.so.conf.d/00-cuda-compat.conf").write_text("/usr/local/cuda/compat\n")
    I.umoci("repack", "--image", f"{lay}:two", w / "b2")
    layer3 = I.tar_layer([
        ("opaque", "usr/local/cuda-12.4/compat"),
        ("file", f"usr/local/cuda-12.4/compat/libcuda.so.{C555}", (elf(elfgen.NOTE_575), 0o755)),
        ("symlink", "usr/local/cuda-12.4/compat/libcuda.so.1", f"libcuda.so.{C555}"),
    ])
    I.extend(lay, "two", "three", I.gz(layer3))
    I.extend(lay, "two", "three-zstd", I.zst(layer3))
    unpacked = {}
    for tag in ("base", "two", "three"):
        I.umoci("unpack", "--image", f"{lay}:{tag}", w / f"u-{tag}")
        unpacked[tag] = w / f"u-{tag}" / "rootfs"
    return {"work": w, "layout": lay, "unpacked": unpacked}


def _outcome(fn):
    try:
        return ("ok", fn())
    except OSError as e:
        return ("error", type(e).__name__)


PROBES = ("/usr/local/cuda/compat", "/usr/local/cuda/compat/libcuda.so.1", "/usr/local/cuda/lib64",
          "/usr/local/cuda/../cuda/compat", "/bin", "/bin/../usr/local/cuda", "/usr/local/escape",
          "/usr/local/escape/ld.so.conf",
          "/opt/old/sub", f"/opt/hl/libcuda.so.{C550}", "/usr/local/cuda/compat/pipe", "/nonexistent/x", "/")


def check_same(view, rootfs) -> None:
    """The differential check of the module docstring."""
    with Root(str(rootfs)) as real:
        assert imagefacts.gather(view, CFG).to_dict() == imagefacts.gather(real, CFG).to_dict()
        assert imagefacts.compat_dropins(view) == imagefacts.compat_dropins(real)
        assert ldcache.current_dropin(view) == ldcache.current_dropin(real)
        for drv in (C550, "535.104.05"):
            assert imagefacts.host_lib_dir(view, drv) == imagefacts.host_lib_dir(real, drv)
        for p in PROBES:
            assert _outcome(lambda: view.realpath(p)) == _outcome(lambda: real.realpath(p)), p
            assert _outcome(lambda: stat.S_IFMT(view.lstat(p).st_mode)) == \
                _outcome(lambda: stat.S_IFMT(real.lstat(p).st_mode)), p
        if not hasattr(view, "walk_entries"):
            _same_tree(view, real, rootfs)
            return
        seen = set()
        for path, node in view.walk_entries():
            seen.add(path)
            st = os.lstat(f"{rootfs}{path}")
            assert stat.S_IFMT(st.st_mode) == stat.S_IFMT(node.mode), path
            if stat.S_ISLNK(st.st_mode):
                assert node.target == os.readlink(f"{rootfs}{path}"), path
            elif stat.S_ISREG(st.st_mode):
                assert node.size == st.st_size, path
                # Content kept, spooled or fetched again from its layer: the same bytes.
                assert view.read_file(path, 1 << 24) == real.read_file(path, 1 << 24), path
        for dirpath, dirnames, filenames in os.walk(rootfs):
            for n in dirnames + filenames:
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, rootfs)
                st = os.lstat(full)
                kind = "dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else \
                    "file" if stat.S_ISREG(st.st_mode) else "other"
                if keep(rel, kind) is not None:
                    assert "/" + rel in seen, f"{rel} ({kind}) is missing from the view"


def _same_tree(view, real, rootfs) -> None:
    """Layer dirs read merged (compat_hook.images.unpacked) against the rootfs umoci unpacked: every entry,
    its type, every file's bytes, every directory's listing (whiteouts and opaque dirs applied)."""
    for dirpath, dirnames, filenames in os.walk(rootfs):
        rel = "/" + os.path.relpath(dirpath, rootfs).lstrip(".")
        assert sorted(view.listdir(rel)) == sorted(real.listdir(rel)), rel
        for n in dirnames + filenames:
            p = f"{rel.rstrip('/')}/{n}"
            assert stat.S_IFMT(view.lstat(p).st_mode) == stat.S_IFMT(real.lstat(p).st_mode), p
            if stat.S_ISREG(real.lstat(p).st_mode):
                assert view.read_file(p, 1 << 24) == real.read_file(p, 1 << 24), p


@pytest.mark.parametrize("tag", ["base", "two", "three"])
def test_oci_layout_reads_like_the_unpacked_image(built, tag):
    with images.Reader() as reader, reader.open(f"oci:{built['layout']}:{tag}") as img:
        check_same(img.root, built["unpacked"][tag])
        # The config as skopeo reads it.
        cfg = json.loads(I.skopeo("inspect", "--config", f"oci:{built['layout']}:{tag}").stdout)
        assert img.env == cfg["config"]["Env"]
        assert img.platform == f"{cfg['os']}/{cfg['architecture']}"


def test_what_each_layer_changes(built):
    with images.Reader() as reader:
        base = reader.open(f"oci:{built['layout']}:base")
        two = reader.open(f"oci:{built['layout']}:two")
        three = reader.open(f"oci:{built['layout']}:three")
        assert not base.root.exists("/usr/local/cuda/compat")
        # The symlink of a later layer than the libs reaches them.
        f2 = imagefacts.gather(two.root, CFG)
        assert (f2.status, f2.compat_dir, f2.candidate) == ("found", "/usr/local/cuda-12.4/compat",
                                                           f"libcuda.so.{C550}")
        assert f2.elf is not None and f2.elf.note is not None and f2.elf.error is None
        assert not two.root.exists("/opt/old") and not two.root.exists(f"/usr/local/cuda/compat/"
                                                                         f"libnvidia-ptxjitcompiler.so.{C550}")
        assert [d["file"] for d in imagefacts.compat_dropins(two.root)[0]] == ["00-cuda-compat.conf"]
        # The opaque dir hides the lower libcuda; the hard link elsewhere keeps its bytes.
        f3 = imagefacts.gather(three.root, CFG)
        assert (f3.status, f3.candidates) == ("found", [f"libcuda.so.{C555}"])
        assert three.root.read_file(f"/opt/hl/libcuda.so.{C550}", 4) == b"\x7fELF"
        assert three.root.lstat(f"/usr/local/cuda/compat/libcuda.so.{C555}").st_mode & 0o777 == 0o755
        # Shared layers were read once.
        assert (base.stats["layers_read"], two.stats["layers_read"], three.stats["layers_read"]) == (1, 1, 1)
        assert (two.stats["layers_cached"], three.stats["layers_cached"]) == (1, 2)
        assert three.layers[:2] == two.layers


def test_zstd_layer_same_as_gzip_binary_and_module(built):
    lay = built["layout"]
    results = []
    for how in ("binary", "module"):
        with images.Reader(images.Limits(zstd=how)) as reader, reader.open(f"oci:{lay}:three-zstd") as img:
            assert img.stats["layers_read"] == 3
            results.append(imagefacts.gather(img.root, CFG).to_dict())
            check_same(img.root, built["unpacked"]["three"])
    assert results[0] == results[1]
    # skopeo recompressing every layer as zstd: the same image again.
    z = built["work"] / "zstd-layout"
    I.skopeo("copy", "--quiet", "--dest-compress", "--dest-compress-format", "zstd", f"oci:{lay}:three",
             f"oci:{z}:three")
    manifest = json.loads(I.skopeo("inspect", "--raw", f"oci:{z}:three").stdout)
    assert {x["mediaType"] for x in manifest["layers"]} == {I.LAYER_TYPES["zstd"]}
    with images.Reader() as reader, reader.open(f"oci:{z}:three") as img:
        check_same(img.root, built["unpacked"]["three"])


def test_skopeo_archives_give_the_same_image(built):
    lay, w = built["layout"], built["work"]
    dock, arch = w / "three-docker.tar", w / "three-oci.tar"
    I.skopeo("copy", "--quiet", f"oci:{lay}:three", f"docker-archive:{dock}:example.com/cuda/app:three")
    I.skopeo("copy", "--quiet", f"oci:{lay}:three", f"oci-archive:{arch}:three")
    cfg = json.loads(I.skopeo("inspect", "--config", f"oci:{lay}:three").stdout)
    with images.Reader() as reader:
        for src in (f"docker-archive:{dock}", f"docker-archive:{dock}:example.com/cuda/app:three",
                    f"oci-archive:{arch}", f"oci-archive:{arch}:three"):
            with reader.open(src) as img:
                check_same(img.root, built["unpacked"]["three"])
                assert img.env == cfg["config"]["Env"]
        d = reader.open(f"docker-archive:{dock}")
        assert d.name == "example.com/cuda/app:three" and d.digest is None
        assert d.layers == cfg["rootfs"]["diff_ids"]  # checked against the diff_ids as it streamed
        with pytest.raises(images.ImageError, match="no image tagged"):
            reader.open(f"docker-archive:{dock}:other:tag")


def test_newer_docker_save_layout(built, tmp_path):
    """docker save (moby >= 25): OCI blobs, manifest.json naming them, legacy names as symlinks."""
    lay = built["layout"]
    manifest = json.loads(I.skopeo("inspect", "--raw", f"oci:{lay}:three").stdout)
    cfg_bytes = (lay / "blobs/sha256" / manifest["config"]["digest"].split(":")[1]).read_bytes()
    cfg = json.loads(cfg_bytes)
    root = tmp_path / "save"
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layers = []
    for i, d in enumerate(manifest["layers"]):
        data = I.decompressed((lay / "blobs/sha256" / d["digest"].split(":")[1]).read_bytes())
        hexd = I.digest(data).split(":")[1]
        (blobs / hexd).write_bytes(data)
        (root / f"legacy{i}").mkdir()
        os.symlink(f"../blobs/sha256/{hexd}", root / f"legacy{i}" / "layer.tar")
        layers.append(f"legacy{i}/layer.tar")
    cfg_hex = I.digest(cfg_bytes).split(":")[1]
    (blobs / cfg_hex).write_bytes(cfg_bytes)
    (root / "manifest.json").write_text(json.dumps([{"Config": f"blobs/sha256/{cfg_hex}",
                                                     "RepoTags": ["app:three"], "Layers": layers}]))
    tar = tmp_path / "save.tar"
    I.sh("tar", "-C", root, "-cf", tar, ".")
    with images.Reader() as reader, reader.open(f"docker-archive:{tar}:app:three") as img:
        check_same(img.root, built["unpacked"]["three"])
        assert img.layers == cfg["rootfs"]["diff_ids"]


def _arch_pair():
    mine = imagestores.host_platform()[1]
    return mine, ("arm64" if mine != "arm64" else "amd64")


def test_multi_platform_index_picks_this_machine(tmp_path):
    mine, other = _arch_pair()
    lay = I.Layout(tmp_path / "multi")
    libs = {}
    descs = []
    for arch, ver in ((other, "570.86.15"), (mine, C550)):
        layer = I.gz(I.tar_layer([("dir", "usr/local/cuda-12.8/compat"),
                                  ("file", f"usr/local/cuda-12.8/compat/libcuda.so.{ver}", elf()),
                                  ("symlink", "usr/local/cuda", "cuda-12.8")]))
        libs[arch] = ver
        descs.append(I.platform(lay.image([layer], env=[f"ARCH={arch}"], arch=arch), arch))
    attestation = I.platform(lay.blob(json.dumps({"schemaVersion": 2, "config": {}, "layers": []}).encode(),
                                      "application/vnd.oci.image.manifest.v1+json"), "unknown", "unknown")
    top = lay.index(descs + [attestation])
    lay.tag(top, "multi")
    lay.tag(lay.index([top]), "nested")          # an index of the index
    lay.tag(lay.index([descs[0]]), "foreign")     # only the other machine's image
    cfg = json.loads(I.skopeo("inspect", "--config", f"oci:{lay.path}:multi").stdout)
    with images.Reader() as reader:
        for tag in ("multi", "nested"):
            img = reader.open(f"oci:{lay.path}:{tag}")
            assert img.env == [f"ARCH={mine}"] == cfg["config"]["Env"]
            assert img.platform == f"linux/{mine}"
            assert imagefacts.gather(img.root, CFG).candidate == f"libcuda.so.{libs[mine]}"
        with pytest.raises(images.ImageError, match=f"no linux/{mine} image in the index"):
            reader.open(f"oci:{lay.path}:foreign")
        assert reader.expand(f"oci:{lay.path}") == [f"oci:{lay.path}:{t}" for t in ("multi", "nested", "foreign")]
        with pytest.raises(images.ImageError, match="3 images in the layout"):
            reader.open(f"oci:{lay.path}")


def test_open_image_and_expand_sources_api(built):
    lay = built["layout"]
    srcs = images.expand_sources([f"oci:{lay}", f"oci:{lay}:two", "/some/rootfs"])
    assert srcs == [f"oci:{lay}:{t}" for t in ("base", "two", "three", "three-zstd")] + \
        [f"oci:{lay}:two", "/some/rootfs"]
    with images.open_image(f"oci:{lay}:two") as img:
        assert isinstance(img, images.Image) and img.name == "two"
        assert img.digest.startswith("sha256:") and len(img.layers) == 2
    assert images.is_image_source("containerd:") and not images.is_image_source(str(lay))
    with pytest.raises(images.ImageError, match="not an image source"):
        images.open_image(str(lay))
    with pytest.raises(images.ImageError, match="not an OCI image layout"):
        images.open_image(f"oci:{built['work']}")


def test_layer_cache_is_bounded(built):
    lay = built["layout"]
    for budget, read in ((1, 1), (10_000, 0)):
        with images.Reader(images.Limits(cache_entries=budget)) as reader:
            reader.open(f"oci:{lay}:two")
            # With a budget of one entry only the last layer read stays cached.
            base = reader.open(f"oci:{lay}:base")
            assert (base.stats["layers_read"], base.stats["layers_cached"]) == (read, 1 - read)
            check_same(base.root, built["unpacked"]["base"])


def test_doctests_of_the_reader_modules():
    import doctest

    from compat_hook.images import layers as imagelayers, view as imageview
    from compat_hook.commands import report

    for m in (images, imagestores, imagelayers, imageview, report):
        res = doctest.testmod(m)
        assert res.failed == 0 and res.attempted > 0, m.__name__


# --------------------------------------------------------------------------- containerd


@pytest.fixture(scope="module")
def ctrd(tmp_path_factory):
    """A private containerd (tests/support/engines.py's DirectContainerd: own socket, root and state)."""
    from tests.support.engines import DirectContainerd

    w = tmp_path_factory.mktemp("ctrd-img")
    c = DirectContainerd(w)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.mark.containers
def test_containerd_content_store(built, ctrd, tmp_path):
    tar = tmp_path / "layout.tar"
    I.sh("tar", "-C", built["layout"], "-cf", tar, ".")
    ctrd.ctr("-n", "k8s.io", "images", "import", "--base-name", "docker.io/library/imgtest", tar)
    mine, other = _arch_pair()
    multi = I.Layout(tmp_path / "multi")
    descs = [I.platform(multi.image([I.gz(I.tar_layer([("file", "etc/ld.so.conf.d/arch.conf", arch.encode())]))],
                                    env=[f"ARCH={arch}"], arch=arch), arch) for arch in (other, mine)]
    multi.tag(multi.index(descs), "multi")
    # Only this machine's blobs are imported: the other platform's are not in the store.
    ctrd.ctr("-n", "k8s.io", "images", "import", "--base-name", "docker.io/library/multi",
             multi.tar(tmp_path / "multi.tar"))
    addr = str(ctrd.sock)
    # the blobs, then the layer dirs the snapshotter unpacked (the default)
    for unpacked, via in ((False, "blobs"), (True, "snapshot")):
        with images.Reader(images.Limits(unpacked=unpacked)) as reader:
            for tag in ("two", "three"):
                t0 = time.monotonic()
                with reader.open(f"containerd:imgtest:{tag}", address=addr, namespace="k8s.io") as img:
                    assert img.name == f"docker.io/library/imgtest:{tag}"
                    assert img.read_via == via
                    check_same(img.root, built["unpacked"][tag])
                assert time.monotonic() - t0 < 30
    with images.Reader() as reader:
        img = reader.open("containerd:docker.io/library/multi:multi", address=addr)
        assert img.env == [f"ARCH={mine}"] and img.root.read_file("/etc/ld.so.conf.d/arch.conf") == mine.encode()
        assert img.read_via == "snapshot"  # through the index's label and the host platform
        listed = reader.expand("containerd:", address=addr, namespace="k8s.io")
        assert {f"containerd:docker.io/library/imgtest:{t}" for t in ("base", "two", "three", "three-zstd")} \
            <= set(listed)
        assert "containerd:docker.io/library/multi:multi" in listed
        with pytest.raises(images.ImageError, match="no such image"):
            reader.open("containerd:nothere:1", address=addr)
        with pytest.raises(images.ImageError, match="no socket at"):
            reader.open("containerd:imgtest:two", address=str(tmp_path / "no.sock"))
        (tmp_path / "not-a-socket").write_bytes(b"")
        with pytest.raises(images.ImageError, match="ctr images ls failed: .*connection refused"):
            reader.open("containerd:imgtest:two", address=str(tmp_path / "not-a-socket"))
    # The default namespace has none of them.
    with images.Reader() as reader:
        assert reader.expand("containerd:", address=addr, namespace="default") == []
