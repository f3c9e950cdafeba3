"""The images ``plan`` is checked against: real OCI layouts built with umoci, and their docker-archives.

``images`` (a module-scoped fixture): a ``compat`` image (Debian's real libcuda 550 with NVIDIA's
note added) and a ``plain`` one, each in two layers (a whiteout and the ``/usr/local/cuda`` ->
``cuda-12.4`` link in the second), as ``oci:`` layouts and skopeo's ``docker-archive``s.
Used by tests/test_plan_images.py and tests/test_plan_unpacked.py::

    from tests.support.planimages import images  # noqa: F401  (the module-scoped fixture)
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from tests.support import debs, rootfs
from tests.support.images import skopeo, umoci
from tests.support.toolkit import noted_compat_lib
from tests.support.versions import COMPAT_550

__all__ = ["GEFORCE", "H100", "layout", "images"]

Path = pathlib.Path

#: GPU models for the fake hosts: a consumer card (compat refused) and a data-center one.
GEFORCE = "NVIDIA GeForce RTX 4090"
H100 = "NVIDIA H100 80GB HBM3"


def layout(work: Path, name: str, compat_lib, extra_files: dict | None = None) -> Path:
    """A runnable rootfs as a two-layer OCI image (the cuda symlink and a whiteout in layer 2);
    ``extra_files`` (rootfs path -> contents) go into the first layer."""
    src = rootfs.build_rootfs(work / f"{name}-src", compat_lib=compat_lib, cuda_symlink=False,
                              extra_files={"etc/removed-later": "x", **(extra_files or {})})
    lay = work / name
    umoci("init", "--layout", lay)
    umoci("new", "--image", f"{lay}:v1")
    b = work / f"{name}-bundle"
    umoci("unpack", "--image", f"{lay}:v1", b)
    shutil.rmtree(b / "rootfs")
    shutil.copytree(src, b / "rootfs", symlinks=True)
    # --refresh-bundle: the next repack diffs against this one (without it umoci 0.4 diffs against
    # the first unpack again and the image ends up with one layer, no whiteout, no cross-layer link)
    umoci("repack", "--refresh-bundle", "--image", f"{lay}:v1", b)
    (b / "rootfs" / "etc" / "removed-later").unlink()                    # a whiteout in layer 2
    if compat_lib is not None:
        (b / "rootfs" / "usr/local/cuda").symlink_to("cuda-12.4")        # set after the libs
    umoci("repack", "--image", f"{lay}:v1", b)
    umoci("config", "--image", f"{lay}:v1", "--config.env", "CUDA_VERSION=12.4.1",
          "--config.env", "NVIDIA_VISIBLE_DEVICES=all", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin")
    shutil.rmtree(b)
    index = json.loads((lay / "index.json").read_text())
    manifest = json.loads((lay / "blobs/sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text())
    assert len(manifest["layers"]) == 2, manifest["layers"]
    return lay


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("plan-images")
    libs = {v: debs.libcuda(v) for v in debs.VERSIONS}
    noted = noted_compat_lib(libs[COMPAT_550], work / "noted")
    out = {"libs": libs, "work": work}
    for name, lib in (("compat", noted), ("plain", None)):
        lay = layout(work, name, lib)
        arch = work / f"{name}.tar"
        skopeo("copy", f"oci:{lay}:v1", f"docker-archive:{arch}:localhost/{name}:v1")
        out[name] = {"oci": f"oci:{lay}:v1", "docker": f"docker-archive:{arch}", "layout": lay}
    return out
