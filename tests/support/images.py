"""Build real container images for the image-reader tests.

* :func:`umoci` / :func:`skopeo` run the real tools (images built from
  rootfs dirs with ``umoci unpack`` / ``repack``, converted with ``skopeo
  copy``).
* :class:`Layout` writes an OCI image layout by hand, blob by blob, for what
  the tools will not make: opaque-dir markers, zstd layers, multi-platform
  and nested indexes, and every kind of lie a hostile image can tell (a
  wrong digest, a wrong size, a missing blob, a layer that is not a tar).
* :func:`tar_layer` makes a layer tar from a list of entries; :func:`gz` and
  :func:`zst` compress it (``zst`` with the real ``zstd`` binary).
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import subprocess
import tarfile
import zlib

Path = pathlib.Path

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": "/root"}


def sh(*argv, timeout: int = 300, input: bytes | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], capture_output=True, env=ENV, timeout=timeout, input=input,
                       stdin=None if input is not None else subprocess.DEVNULL)
    if p.returncode != 0:
        raise AssertionError(f"{argv}: exit {p.returncode}\n{p.stdout.decode(errors='replace')}\n"
                             f"{p.stderr.decode(errors='replace')}")
    return p


def umoci(*args) -> subprocess.CompletedProcess:
    return sh("umoci", *args)


def skopeo(*args) -> subprocess.CompletedProcess:
    return sh("skopeo", "--insecure-policy", *args)


# --------------------------------------------------------------------------- layers


def tar_layer(entries: list, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar stream of ``entries``: ``(kind, name, arg)`` tuples.

    kinds: ``file`` (arg: bytes, or ``(bytes, mode)``), ``dir``, ``symlink``
    (arg: target), ``hardlink`` (arg: target name), ``fifo``, ``chr``,
    ``whiteout`` (name of the entry to delete: ``.wh.`` is added),
    ``opaque`` (a directory: its ``.wh..wh..opq`` marker), ``info`` (arg: a
    ready TarInfo, data None) and ``raw`` (arg: bytes appended as they are).
    """
    buf = io.BytesIO()
    tf = tarfile.open(fileobj=buf, mode="w", format=fmt)
    for kind, name, *rest in entries:
        arg = rest[0] if rest else None
        if kind == "raw":
            tf.fileobj.write(arg)
            continue
        ti = tarfile.TarInfo(name)
        ti.mtime = 1700000000
        data = None
        if kind == "file":
            data, mode = (arg if isinstance(arg, tuple) else (arg, 0o644))
            ti.size, ti.mode = len(data), mode
        elif kind == "dir":
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        elif kind == "symlink":
            ti.type, ti.linkname = tarfile.SYMTYPE, arg
        elif kind == "hardlink":
            ti.type, ti.linkname = tarfile.LNKTYPE, arg
        elif kind == "fifo":
            ti.type = tarfile.FIFOTYPE
        elif kind == "chr":
            ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
        elif kind == "whiteout":
            d, _, base = name.rpartition("/")
            ti.name = f"{d}/.wh.{base}" if d else f".wh.{base}"
            data, ti.size = b"", 0
        elif kind == "opaque":
            ti.name = name.rstrip("/") + "/.wh..wh..opq"
            data, ti.size = b"", 0
        elif kind == "info":
            ti = arg
        else:
            raise ValueError(kind)
        tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    tf.close()
    return buf.getvalue()


def gz(data: bytes, level: int = 6) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def zst(data: bytes) -> bytes:
    """zstd-compressed by the real zstd binary."""
    return sh("zstd", "-q", "-c", "-3", input=data).stdout


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def decompressed(blob: bytes) -> bytes:
    if blob[:2] == b"\x1f\x8b":
        return zlib.decompress(blob, 47)
    if blob[:4] == b"\x28\xb5\x2f\xfd":
        return sh("zstd", "-q", "-d", "-c", input=blob).stdout
    return blob


LAYER_TYPES = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
               "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
               "tar": "application/vnd.oci.image.layer.v1.tar"}


def layer_type(blob: bytes) -> str:
    if blob[:2] == b"\x1f\x8b":
        return LAYER_TYPES["gzip"]
    if blob[:4] == b"\x28\xb5\x2f\xfd":
        return LAYER_TYPES["zstd"]
    return LAYER_TYPES["tar"]


# --------------------------------------------------------------------------- a layout by hand


class Layout:
    """An OCI image layout written blob by blob (``oci-layout``, ``index.json``, ``blobs/sha256``)."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        (self.path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        self.manifests: list = []
        self.save()

    def save(self) -> None:
        (self.path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": self.manifests}))

    def blob(self, data: bytes, media_type: str | None = None) -> dict:
        d = digest(data)
        (self.path / "blobs" / "sha256" / d.split(":")[1]).write_bytes(data)
        out = {"digest": d, "size": len(data)}
        if media_type:
            out["mediaType"] = media_type
        return out

    def blob_path(self, desc: dict) -> Path:
        return self.path / "blobs" / "sha256" / desc["digest"].split(":")[1]

    def image(self, layers: list, *, env=None, arch: str = "amd64", os_: str = "linux",
              diff_ids: list | None = None, layer_descs: list | None = None) -> dict:
        """Write the layers (compressed blobs), a config and a manifest; returns the manifest's descriptor."""
        descs = layer_descs if layer_descs is not None else [self.blob(b, layer_type(b)) for b in layers]
        if diff_ids is None:
            diff_ids = [digest(decompressed(b)) for b in layers]
        config = {"architecture": arch, "os": os_, "config": {"Env": list(env or [])},
                  "rootfs": {"type": "layers", "diff_ids": diff_ids}}
        cdesc = self.blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": cdesc, "layers": descs}
        return self.blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")

    def index(self, manifests: list) -> dict:
        """An image index blob of ``manifests`` (descriptors, with ``platform`` where given)."""
        doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
        return self.blob(json.dumps(doc).encode(), "application/vnd.oci.image.index.v1+json")

    def tag(self, desc: dict, name: str) -> dict:
        self.manifests.append(dict(desc, annotations={"org.opencontainers.image.ref.name": name}))
        self.save()
        return desc

    def tar(self, dest) -> Path:
        """The layout as a tar file (what ``ctr images import`` takes)."""
        sh("tar", "-C", self.path, "-cf", dest, ".")
        return Path(dest)


def platform(desc: dict, arch: str, os_: str = "linux", variant: str | None = None) -> dict:
    p = {"os": os_, "architecture": arch}
    if variant:
        p["variant"] = variant
    return dict(desc, platform=p)


def extend(layout, from_tag: str, new_tag: str, layer: bytes, *, env_add=()) -> dict:
    """Tag ``new_tag``: the image ``from_tag`` of a layout (umoci-made or not) plus one more layer blob."""
    path = Path(layout)
    index = json.loads((path / "index.json").read_text())
    [top] = [m for m in index["manifests"]
             if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == from_tag]

    def read(d):
        return json.loads((path / "blobs" / "sha256" / d["digest"].split(":")[1]).read_bytes())

    def write(data: bytes, media_type: str) -> dict:
        d = digest(data)
        (path / "blobs" / "sha256" / d.split(":")[1]).write_bytes(data)
        return {"mediaType": media_type, "digest": d, "size": len(data)}

    manifest = read(top)
    config = read(manifest["config"])
    config["rootfs"]["diff_ids"].append(digest(decompressed(layer)))
    config.setdefault("config", {}).setdefault("Env", []).extend(env_add)
    manifest["config"] = write(json.dumps(config).encode(), manifest["config"]["mediaType"])
    manifest["layers"] = manifest["layers"] + [write(layer, layer_type(layer))]
    desc = write(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    index["manifests"].append(dict(desc, annotations={"org.opencontainers.image.ref.name": new_tag}))
    (path / "index.json").write_text(json.dumps(index))
    return desc
