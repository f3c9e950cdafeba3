"""``plan`` on images read without unpacking them: the CUDA runtime they carry, and containerd's
socket where k3s, RKE2 and microk8s put it.

The image is a real OCI layout made with umoci from a rootfs in two layers: a CUDA 13.0 toolkit's
``libcudart.so.13.0.48`` (and no ``CUDA_VERSION``) in the first, a pip-installed PyTorch (the
``nvidia-cuda-runtime-cu12`` wheel, ``torch/version.py``) and a conda ``cuda-cudart`` record in the
second. The same layout is read as ``oci:``, as a ``docker-archive:`` made by skopeo, and from a
real containerd's content store listening on ``<host>/run/k3s/containerd/containerd.sock``, found
there without ``--address``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess

import pytest

from tests.conftest import Symlink, build_tree, elf
from tests.support.images import skopeo, umoci

pytestmark = pytest.mark.containers

REPO = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"
SITE = "usr/local/lib/python3.11/site-packages"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}  # no CONTAINERD_ADDRESS

LAYER1 = {"usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.13.0.48": elf(soname="libcudart.so.13"),
          "usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.13": Symlink("libcudart.so.13.0.48"),
          "usr/local/cuda-13.0/lib64": Symlink("targets/x86_64-linux/lib"),
          "usr/local/cuda": Symlink("cuda-13.0"),
          "etc/os-release": "ID=debian\n"}
LAYER2 = {f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12": elf(soname="libcudart.so.12"),
          f"{SITE}/nvidia_cuda_runtime_cu12-12.4.127.dist-info/METADATA":
              "Metadata-Version: 2.1\nName: nvidia-cuda-runtime-cu12\nVersion: 12.4.127\n\nCUDA Runtime\n",
          f"{SITE}/torch/version.py": "__version__ = '2.5.1+cu124'\ncuda: Optional[str] = '12.4'\n",
          "opt/conda/conda-meta/cuda-cudart-12.6.77-h5888daf_0.json": '{"name": "cuda-cudart"}'}
WANT_SOURCES = [
    {"source": "libcudart", "path": "/usr/local/cuda/lib64/libcudart.so.13.0.48", "version": "13.0.48"},
    {"source": "libcudart", "path": f"/{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12", "version": "12"},
    {"source": "wheel", "path": f"/{SITE}/nvidia_cuda_runtime_cu12-12.4.127.dist-info/METADATA",
     "version": "12.4.127"},
    {"source": "torch", "path": f"/{SITE}/torch/version.py", "version": "12.4"},
    {"source": "conda", "path": "/opt/conda/conda-meta/cuda-cudart-12.6.77-h5888daf_0.json", "version": "12.6.77"},
]


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("rt-image")
    lay = work / "layout"
    umoci("init", "--layout", lay)
    umoci("new", "--image", f"{lay}:v1")
    b = work / "bundle"
    umoci("unpack", "--image", f"{lay}:v1", b)
    build_tree(b / "rootfs", LAYER1)
    umoci("repack", "--image", f"{lay}:v1", b)
    build_tree(b / "rootfs", LAYER2)
    umoci("repack", "--image", f"{lay}:v1", b)
    umoci("config", "--image", f"{lay}:v1", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin")
    rootfs = work / "rootfs"
    shutil.copytree(b / "rootfs", rootfs, symlinks=True)
    shutil.rmtree(b)
    arch = work / "rt.tar"
    skopeo("copy", f"oci:{lay}:v1", f"docker-archive:{arch}:localhost/rt:v1")
    tar = work / "layout.tar"
    subprocess.run(["tar", "-C", lay, "-cf", tar, "."], check=True)
    return {"work": work, "oci": f"oci:{lay}:v1", "docker": f"docker-archive:{arch}", "rootfs": rootfs,
            "tar": tar}


def _conf(tmp: pathlib.Path) -> tuple:
    host = tmp / "host"
    build_tree(host, {"proc/driver/nvidia/version":
                      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Mon 2025\n"})
    conf = tmp / "plan.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {host}\n")
    return host, str(conf)


def plan(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "compat_hook", "plan", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=ENV)


def _check_row(row: dict) -> None:
    assert row.get("error") is None, row
    assert (row["needs_cuda"], row["needs_source"]) == ("13.0", "libcudart /usr/local/cuda/lib64/libcudart.so.13.0.48")
    assert row["needs_sources"] == WANT_SOURCES
    # 580 gives 13.0: it runs; 535 gives 12.2: error 35, and the toolkit alone does no better
    assert row["now"] == {"outcome": "host", "reason": "no_candidate", "cuda": "13.0", "error": None}
    assert row["after"] == {"outcome": "broken", "reason": "no_candidate", "cuda": "12.2", "error": 35}
    assert row["warnings"] == ["the image names several CUDA versions: 13.0 (libcudart /usr/local/cuda/lib64/"
                               "libcudart.so.13.0.48), 12.4 (wheel /" + SITE + "/nvidia_cuda_runtime_cu12-12.4.127"
                               ".dist-info/METADATA), 12.6 (conda /opt/conda/conda-meta/cuda-cudart-12.6.77-"
                               "h5888daf_0.json); planned for the highest, 13.0"]


def test_image_without_cuda_version_is_predicted_broken_on_535(image, tmp_path):
    """An image carrying libcudart.so.13.0.48 and no CUDA_VERSION: ``broken 12.2 (35)`` after a rollback to 535,
    read the same from the unpacked rootfs, the OCI layout and the docker-archive."""
    _, conf = _conf(tmp_path)
    out = plan(str(image["rootfs"]), image["oci"], image["docker"], "--driver", "535.261.03", "--config", conf,
               "--json", "--fail-on", "broken")
    assert out.returncode == 3, out.stderr
    rows = json.loads(out.stdout)["images"]
    for row in rows:
        _check_row(row)
    assert [r["read_via"] for r in rows] == ["dir", "blobs", "blobs"]
    assert len({json.dumps({k: v for k, v in r.items() if k not in ("image", "read_via")}, sort_keys=True)
                for r in rows}) == 1


@pytest.fixture
def k3s_containerd(image, tmp_path_factory):
    """A real containerd whose socket is where k3s and RKE2 put theirs, under a test host root."""
    from tests.support.engines import DirectContainerd

    w = tmp_path_factory.mktemp("k3s")
    c = DirectContainerd(w, sock=w / "host/run/k3s/containerd/containerd.sock")
    try:
        c.start()
        c.ctr("-n", "k8s.io", "images", "import", "--base-name", "docker.io/library/rt", image["tar"])
        yield c
    finally:
        c.stop()


def test_containerd_socket_found_where_k3s_puts_it(k3s_containerd, tmp_path):
    host = k3s_containerd.work / "host"
    build_tree(host, {"proc/driver/nvidia/version":
                      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Mon 2025\n"})
    conf = tmp_path / "plan.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {host}\n")
    assert not os.path.exists(host / "run/containerd/containerd.sock")
    out = plan("containerd:", "--driver", "535.261.03", "--config", str(conf), "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["containerd"] == {"address": str(k3s_containerd.sock), "found_by": "k3s/RKE2", "namespace": "k8s.io"}
    [row] = r["images"]
    assert row["image"] == "containerd:docker.io/library/rt:v1"
    _check_row(row)
    text = plan("containerd:", "--driver", "535.261.03", "--config", str(conf)).stdout
    assert f"containerd: socket {k3s_containerd.sock} (k3s/RKE2), namespace k8s.io" in text.splitlines()
    # --address still wins over the search, and says so
    other = plan("containerd:", "--address", str(tmp_path / "none.sock"), "--driver", "535.261.03",
                 "--config", str(conf), "--json")
    assert other.returncode == 4
    assert json.loads(other.stdout)["containerd"]["found_by"] == "--address"


def test_microk8s_socket_that_is_not_containerd_is_unreadable_exit_4():
    """A socket at microk8s's path is used (and named); one that does not answer like containerd is exit 4."""
    import tempfile

    short = pathlib.Path(tempfile.mkdtemp(prefix="mk", dir="/tmp"))  # a unix socket path has 107 bytes
    try:
        _microk8s(short)
    finally:
        shutil.rmtree(short)


def _microk8s(tmp: pathlib.Path) -> None:
    host, conf = _conf(tmp)
    sock = host / "var/snap/microk8s/common/run/containerd.sock"
    sock.parent.mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(sock))
        s.listen(1)
        out = plan("containerd:", "--driver", "535.261.03", "--config", conf, "--json", "--fail-on", "change")
    finally:
        s.close()
    assert out.returncode == 4, out.stderr
    r = json.loads(out.stdout)
    assert r["containerd"] == {"address": str(sock), "found_by": "microk8s", "namespace": "k8s.io"}
    assert r["images"][0]["error"].startswith("containerd:k8s.io: ctr images ls failed"), r["images"][0]
    assert "nothing read" in out.stderr
