"""``plan containerd:`` reads what the node already unpacked: containerd's snapshotter, 1.6 and 2.x.

The images are the umoci-built ones of tests/support/planimages.py (a compat image - Debian's real
libcuda 550 with NVIDIA's note - and a plain one, each with a whiteout and the ``/usr/local/cuda``
-> ``cuda-12.4`` link set in a later layer than the libs). One OCI archive holding both is imported
into a live containerd three times: unpacked into the overlayfs snapshotter (namespace
``k8s.io``), unpacked into the native snapshotter (``native``), and not unpacked at all
(``blobs``, ``--no-unpack``). ``plan`` on each must predict the same outcome for every case, the
first two reading the snapshot and the last the blobs, and leave no snapshot, lease or mount
behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess

import pytest

from tests.support import engines
from tests.support import runtimes as rt
from tests.support.images import skopeo
from tests.support.planimages import GEFORCE, H100, images  # noqa: F401  (the module-scoped images fixture)
from tests.support.trees import write_fake_host
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

pytestmark = pytest.mark.containers

REPO = pathlib.Path(__file__).resolve().parent.parent
NAMESPACES = {"k8s.io": ("overlayfs", "snapshot"), "native": ("native", "snapshot"), "blobs": (None, "blobs")}


def _archive(images, work: pathlib.Path) -> pathlib.Path:
    lay = work / "both"
    for name in ("compat", "plain"):
        skopeo("copy", images[name]["oci"], f"oci:{lay}:{name}")
    tar = work / "both.tar"
    subprocess.run(["tar", "-C", lay, "-cf", tar, "."], check=True)
    return tar


def _start(tmp_path_factory, images, bin_dir: str):
    work = tmp_path_factory.mktemp("ctrd-unpacked")
    tar = _archive(images, work)
    d = engines.Containerd(work / "d", bin_dir=bin_dir, pause_image="localhost/none:pause")
    d.start(HOST_535)
    for ns, (snapshotter, _) in NAMESPACES.items():
        extra = ["--no-unpack"] if snapshotter is None else ["--snapshotter", snapshotter]
        if snapshotter == "native" and d.version == 3:
            # 2.x's transfer service unpacks only into the snapshotters its unpack_config names
            # (overlayfs by default): the client-side import unpacks into any
            extra.append("--local")
        d.ctr("-n", ns, "images", "import", *extra, "--base-name", "localhost/img", tar)
    return d


@pytest.fixture(scope="module", params=["1.6", "2.x"])
def ctrd(request, tmp_path_factory, images):  # noqa: F811
    bin_dir = "/usr/bin" if request.param == "1.6" else str(engines.containerd2())
    d = _start(tmp_path_factory, images, bin_dir)
    try:
        yield d
    finally:
        left = d.stop()
        assert left == {"processes": [], "mounts": []}, left


def _state(d) -> dict:
    """Every snapshot (all snapshotters, all namespaces), lease and mount: nothing of plan's may stay."""
    out = {"mounts": rt.mounts_under(d.work) + rt.mounts_under(d.work.parent)}
    for ns in NAMESPACES:
        out[f"{ns} leases"] = d.ctr("-n", ns, "leases", "ls", "-q").stdout.split()
        for s in ("overlayfs", "native"):
            out[f"{ns} {s}"] = sorted(d.ctr("-n", ns, "snapshots", "--snapshotter", s, "ls").stdout.splitlines())
    return out


def _under_host(argv: list, host: pathlib.Path, binds) -> list:
    """``argv`` in a private mount namespace where each dir of ``binds`` is also seen at the same
    path under ``host``: the fake node's root then holds the engine's real store where the node
    would, as /host holds the node's in the agent's pod. The namespace goes with the process."""
    if not binds:
        return argv
    script = ""
    for b in binds:
        (host / str(b).lstrip("/")).mkdir(parents=True, exist_ok=True)
        script += f'mount --bind "{b}" "{host}/{str(b).lstrip("/")}" && '
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script + 'exec "$@"', "sh", *map(str, argv)]


def _plan(d, tmp: pathlib.Path, ns: str, version: str, *extra, bind: bool = True) -> subprocess.CompletedProcess:
    conf = tmp / "plan.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {tmp / 'host'}\n")
    env = dict(engines.ENV, PATH=f"{d.bin_dir}:{engines.ENV['PATH']}")
    argv = ["/usr/bin/python3", "-m", "compat_hook", "plan", "containerd:", "--address", str(d.sock),
            "--namespace", ns, "--driver", version, "--config", str(conf), *extra]
    return subprocess.run(_under_host(argv, tmp / "host", [d.work] if bind else []),
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("version, gpu, want", [
    (HOST_535, H100, {"compat": ("compat", "compat_newer_supported"), "plain": ("host-minor", "no_candidate")}),
    (HOST_555, H100, {"compat": ("host", "compat_not_newer"), "plain": ("host", "no_candidate")}),
    (HOST_535, GEFORCE, {"compat": ("host-minor", "device_unsupported"), "plain": ("host-minor", "no_candidate")}),
], ids=["enable+no-compat", "newer-host", "geforce"])
def test_snapshot_and_blobs_give_the_same_outcomes(ctrd, tmp_path, version, gpu, want):
    write_fake_host(tmp_path / "host", version=version, gpus={"0000:17:00.0": gpu})
    before = _state(ctrd)
    rows = {}
    for ns, (snapshotter, via) in NAMESPACES.items():
        p = _plan(ctrd, tmp_path, ns, version, "--json")
        assert p.returncode == 0, p.stderr
        for row in json.loads(p.stdout)["images"]:
            assert row.get("error") is None, row
            name = row["image"].rsplit(":", 1)[1]
            assert row["read_via"] == via, (ns, row)
            if via == "blobs":
                assert row["read_via_reason"].endswith("not unpacked in any snapshotter"), row
            else:
                assert "read_via_reason" not in row, row
            assert (row["after"]["outcome"], row["after"]["reason"]) == want[name], (ns, row)
            rows.setdefault(name, []).append({k: v for k, v in row.items() if k not in ("read_via", "read_via_reason")})
    for name, got in rows.items():
        assert len(got) == 3 and got[0] == got[1] == got[2], (name, got)
    if version == HOST_535 and gpu == H100:
        assert rows["compat"][0]["after"]["cuda"] == "12.4"  # the compat 550 driver, read from the snapshot
    assert _state(ctrd) == before


def test_snapshot_dirs_are_node_paths_read_under_host_root(ctrd, tmp_path):
    """The snapshotter's dirs are the node's paths: with ``host_root`` a dir where the node's store
    is bind-mounted at the same path (the agent's /host), the snapshot is read there, with the same
    outcomes; without that mount the paths are not read outside ``host_root`` (the blobs are read);
    and a link at that path to the real store is followed inside ``host_root`` only, never out."""
    host = tmp_path / "host"
    write_fake_host(host, version=HOST_535, gpus={"0000:17:00.0": H100})

    def rows(**kw):
        p = _plan(ctrd, tmp_path, "k8s.io", HOST_535, "--json", **kw)
        assert p.returncode == 0, p.stderr
        return {r["image"].rsplit(":", 1)[1]: r for r in json.loads(p.stdout)["images"]}

    bound = rows()
    assert {n: r["read_via"] for n, r in bound.items()} == {"compat": "snapshot", "plain": "snapshot"}, bound
    (host / str(ctrd.work).lstrip("/")).rmdir()  # the mount point the bound run made
    unbound = rows(bind=False)
    for name, row in unbound.items():
        assert row["read_via"] == "blobs", row
        assert f"under {host}" in row["read_via_reason"], row
    link = host / str(ctrd.work).lstrip("/")
    link.symlink_to(ctrd.work)  # absolute: inside host_root it names itself, never the real store
    linked = rows(bind=False)
    assert {n: r["read_via"] for n, r in linked.items()} == {"compat": "blobs", "plain": "blobs"}, linked
    strip = ("read_via", "read_via_reason")
    for name in bound:
        assert {k: v for k, v in bound[name].items() if k not in strip} == \
            {k: v for k, v in unbound[name].items() if k not in strip} == \
            {k: v for k, v in linked[name].items() if k not in strip}


def test_table_says_how_each_image_was_read(ctrd, tmp_path):
    write_fake_host(tmp_path / "host", version=HOST_535, gpus={"0000:17:00.0": H100})
    text = _plan(ctrd, tmp_path, "k8s.io", HOST_555).stdout
    assert "read via: snapshot 2" in text.splitlines(), text
    text = _plan(ctrd, tmp_path, "blobs", HOST_555).stdout
    assert "read via: blobs 2" in text.splitlines(), text


@pytest.fixture(autouse=True)
def _path_restored():
    """:func:`_open` puts containerd's bin dir first on this process's PATH (the reader runs ``ctr``): the
    next module finds the PATH as it was (tests/test_nri.py asks for Debian's containerd 1.6 by name)."""
    old = os.environ["PATH"]
    yield
    os.environ["PATH"] = old


def _open(d, ns: str, name: str):
    from compat_hook.images.reader import Reader

    os.environ["PATH"] = f"{d.bin_dir}:{os.environ['PATH']}"
    reader = Reader()
    return reader, reader.open(f"containerd:localhost/img:{name}", address=str(d.sock), namespace=ns)


def test_whiteout_and_cross_layer_link_in_the_snapshot(ctrd):
    """The overlay snapshot's top layer holds a real whiteout (char 0/0) for /etc/removed-later and the
    cuda link; the merged view hides the one and resolves the other into the lower layer's libs."""
    before = _state(ctrd)
    for ns in ("k8s.io", "native", "blobs"):
        reader, img = _open(ctrd, ns, "compat")
        with reader, img:
            root = img.root
            assert img.read_via == NAMESPACES[ns][1]
            assert not root.exists("/etc/removed-later")
            assert "removed-later" not in dict(root.listdir("/etc"))
            assert root.realpath("/usr/local/cuda/compat") == "/usr/local/cuda-12.4/compat"
            assert f"libcuda.so.{COMPAT_550}" in dict(root.listdir("/usr/local/cuda/compat"))
            assert root.read_file(f"/usr/local/cuda/compat/libcuda.so.{COMPAT_550}", 4) == b"\x7fELF"
            if ns == "k8s.io":
                top = pathlib.Path(root.paths[0])
                st = os.lstat(top / "etc/removed-later")
                assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0, "not an overlay whiteout"
                assert (top / "usr/local/cuda").is_symlink() and len(root.paths) == 2
            if ns == "native":
                assert len(root.paths) == 1 and img.stats["snapshotter"] == "native"
    assert _state(ctrd) == before


# --------------------------------------------------------------------------- Docker, Podman

CASES = [(HOST_535, H100, "compat", ("compat", "compat_newer_supported")),
         (HOST_535, GEFORCE, "compat", ("host-minor", "device_unsupported")),
         (HOST_555, H100, "compat", ("host", "compat_not_newer")),
         (HOST_535, H100, "plain", ("host-minor", "no_candidate"))]


def _engine_plan(tmp: pathlib.Path, sources: list, version: str, env: dict, binds=()) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    conf = tmp / "plan.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {tmp / 'host'}\n")
    argv = ["/usr/bin/python3", "-m", "compat_hook", "plan", *sources, "--driver", version, "--config", str(conf),
            "--json"]
    p = subprocess.run(_under_host(argv, tmp / "host", binds), cwd=REPO, capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _same_as_blobs(images, tmp, rows: list, via: str, cases=CASES) -> None:  # noqa: F811
    """Each engine row against the same image's docker-archive (the blob path), case by case."""
    for version, gpu, name, want in cases:
        tmp_case = tmp / f"{version}-{gpu.split()[1]}-{name}"
        write_fake_host(tmp_case / "host", version=version, gpus={"0000:17:00.0": gpu})
        r = rows(tmp_case, version)
        got = {row["image"]: row for row in r["images"]}
        blob = got.pop(images[name]["docker"])
        [row] = [v for k, v in got.items() if name in k]
        assert row.get("error") is None and row["read_via"] == via, row
        assert blob["read_via"] == "blobs"
        strip = ("image", "read_via", "read_via_reason")
        assert {k: v for k, v in row.items() if k not in strip} == {k: v for k, v in blob.items() if k not in strip}
        assert (row["after"]["outcome"], row["after"]["reason"]) == want, row


@pytest.mark.parametrize("driver, via", [("overlay2", "snapshot"), ("vfs", "stream")])
def test_docker_image_store(images, tmp_path, driver, via):  # noqa: F811
    import shutil
    import tempfile

    short = pathlib.Path(tempfile.mkdtemp(prefix="chdk", dir="/tmp"))  # its containerd's socket path: < 108 bytes
    d = engines.Dockerd(short / "d", storage_driver=driver)
    try:
        d.start(HOST_535)
        for name in ("compat", "plain"):
            d.docker("load", "-i", images[name]["docker"].split(":", 1)[1])
        env = dict(engines.ENV, DOCKER_HOST=f"unix://{d.sock}", DOCKER_CONFIG=str(d.work / "client"))
        mounts = rt.mounts_under(d.work)

        def rows(tmp, version):
            return _engine_plan(tmp, ["docker:", images["compat"]["docker"], images["plain"]["docker"]], version,
                                env, [d.work])

        _same_as_blobs(images, tmp_path, rows, via)
        one = _engine_plan(tmp_path / f"{HOST_535}-H100-compat", ["docker:localhost/compat:v1"], HOST_535, env,
                           [d.work])["images"][0]
        assert one["image"] == "docker:localhost/compat:v1" and one["read_via"] == via
        if via == "stream":
            assert one["read_via_reason"] == "the vfs graph driver names no layer dirs"
        assert rt.mounts_under(d.work) == mounts
    finally:
        left = d.stop()
        shutil.rmtree(short, ignore_errors=True)
    assert left == {"processes": [], "mounts": []}, left


def test_podman_containers_storage(images, tmp_path):  # noqa: F811
    from tests.support.engines import Podman

    pm = Podman(tmp_path / "pm", "overlay")
    try:
        for name in ("compat", "plain"):
            pm("load", "-i", images[name]["docker"].split(":", 1)[1])
        spec = f"[overlay@{pm.base / 'storage'}+{pm.runroot}]"
        env = dict(engines.ENV, CONTAINERS_CONF=str(pm.conf))
        mounts = rt.mounts_under(pm.base) + rt.mounts_under(pm.private)

        def rows(tmp, version):
            return _engine_plan(tmp, [f"containers-storage:{spec}", images["compat"]["docker"],
                                      images["plain"]["docker"]], version, env, [pm.base])

        _same_as_blobs(images, tmp_path, rows, "snapshot")
        assert rt.mounts_under(pm.base) + rt.mounts_under(pm.private) == mounts
        assert "mounted" not in pm("image", "ls", "--format", "{{.ID}}").stdout
    finally:
        pm.reset()


def test_a_killed_runs_view_is_removed_by_the_next_run(ctrd, tmp_path):
    """A view of ours made 11+ minutes ago (a run killed between view and rm) is removed by the next
    run; one just made (another run's, in flight) is left alone. Both carry containerd.io/gc.root so
    that containerd's own collector cannot be what removes them."""
    import time

    write_fake_host(tmp_path / "host", version=HOST_555, gpus={"0000:17:00.0": H100})
    committed = [ln.split()[0] for ln in ctrd.ctr("-n", "k8s.io", "snapshots", "ls").stdout.splitlines()[1:]
                 if ln.split()[-1] == "Committed"]
    stale, live = "compat-hook-plan-1000000000-1-dead", f"compat-hook-plan-{int(time.time())}-1-live"
    for key in (stale, live):
        ctrd.ctr("-n", "k8s.io", "snapshots", "view", key, committed[0])
        ctrd.ctr("-n", "k8s.io", "snapshots", "label", key, "containerd.io/gc.root=test")
    try:
        assert _plan(ctrd, tmp_path, "k8s.io", HOST_555).returncode == 0
        keys = [ln.split()[0] for ln in ctrd.ctr("-n", "k8s.io", "snapshots", "ls").stdout.splitlines()[1:]]
        assert [k for k in keys if k.startswith("compat-hook-plan-")] == [live], keys
    finally:
        for key in (stale, live):
            ctrd.ctr("-n", "k8s.io", "snapshots", "rm", key, check=False)


def test_hostile_snapshot_reads_nothing_outside(ctrd, images, tmp_path):  # noqa: F811
    """An image unpacked by containerd whose /usr/local/cuda links to a host dir that holds a real
    compat libcuda, whose ld.so.conf.d drop-in is a FIFO and whose lib dir is a link loop: plan
    finishes, finds no compat driver (the link resolves inside the image), as the blob path does."""
    import time

    from tests.support.images import Layout, gz, tar_layer

    outside = tmp_path / "outside"
    (outside / "compat").mkdir(parents=True)
    [noted] = list((images["work"] / "noted").glob("libcuda.so.*"))
    (outside / "compat" / f"libcuda.so.{COMPAT_550}").write_bytes(noted.read_bytes())
    lay = Layout(tmp_path / "hostile")
    layer = gz(tar_layer([("dir", "usr/local"), ("symlink", "usr/local/cuda", str(outside)),
                          ("dir", "etc/ld.so.conf.d"), ("fifo", "etc/ld.so.conf.d/cuda.conf"),
                          ("dir", "usr/lib"), ("symlink", "usr/lib/x86_64-linux-gnu", "x86_64-linux-gnu"),
                          ("symlink", "escape", "../../../../../../.."),
                          ("file", "etc/os-release", b"ID=debian\n")]))
    lay.tag(lay.image([layer], env=["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=all"]), "hostile")
    ctrd.ctr("-n", "hostile", "images", "import", "--base-name", "localhost/img", lay.tar(tmp_path / "h.tar"))
    write_fake_host(tmp_path / "host", version=HOST_535, gpus={"0000:17:00.0": H100})
    before = _state(ctrd)
    t0 = time.monotonic()
    p = _plan(ctrd, tmp_path, "hostile", HOST_535, "--json")
    assert time.monotonic() - t0 < 60
    assert p.returncode == 0, p.stderr
    [row] = json.loads(p.stdout)["images"]
    assert row["read_via"] == "snapshot" and row.get("error") is None, row
    assert (row["after"]["outcome"], row["after"]["reason"]) == ("host-minor", "no_candidate"), row
    conf = tmp_path / "plan.yaml"
    blob = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "plan", f"oci:{lay.path}:hostile", "--driver",
                           HOST_535, "--config", str(conf), "--json"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    [brow] = json.loads(blob.stdout)["images"]
    strip = ("image", "read_via", "read_via_reason")
    assert {k: v for k, v in row.items() if k not in strip} == {k: v for k, v in brow.items() if k not in strip}
    assert _state(ctrd) == before
