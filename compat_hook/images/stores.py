"""Where image blobs come from, and how an image's manifest, config and layers are found.

Four stores, named like skopeo's transports:

* :class:`OciDir` - an OCI image layout (``oci:DIR[:TAG]``);
* :class:`OciArchive` - the same as a tar file (``oci-archive:FILE[:TAG]``);
* :class:`DockerArchive` - what ``docker save`` writes (``docker-archive:FILE``:
  ``manifest.json``, the config and layer tars; newer dockers put them under
  ``blobs/`` with the legacy names as symlinks);
* :class:`Containerd` - a live containerd's content store, through ``ctr``
  (``containerd:REF``).

Archives are never unpacked: their tar headers are indexed once and a blob
is read in place with ``pread``. Every blob named by a digest is hashed while
it is read and checked against the digest and size of its descriptor when it
ends (:class:`Blob`); a docker-archive layer, named by path, is checked
against the config's ``diff_ids`` instead (its decompressed digest). An
index picks the ``linux/<this machine>`` manifest; nesting is bounded and a
cycle is an error. Everything wrong with an image is an
:class:`~compat_hook.core.errors.ImageError`.
"""

from __future__ import annotations

import os
import stat as _stat

__all__ = ["Blob", "OciDir", "OciArchive", "DockerArchive", "Containerd", "Resolved", "resolve",
           "host_platform", "check_digest", "read_json", "find_socket", "CONTAINERD_SOCKETS"]

_HEX = frozenset("0123456789abcdef")
_ALGS = {"sha256": 64, "sha384": 96, "sha512": 128}
_CHUNK = 1 << 20
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
_CONFIG_TYPES = ("application/vnd.oci.image.config.v1+json",
                 "application/vnd.docker.container.image.v1+json")
_REF_NAME = "org.opencontainers.image.ref.name"
_CTR_IMAGE_NAME = "io.containerd.image.name"


def _error(msg: str):
    from ..core.errors import ImageError

    return ImageError(msg)


def check_digest(digest, what: str = "digest") -> str:
    """``digest`` if it is ``sha256:<64 hex>`` (or sha384/sha512), else ImageError.

    >>> check_digest("sha256:" + "ab" * 32)[:10]
    'sha256:aba'
    """
    if isinstance(digest, str):
        alg, _, hexd = digest.partition(":")
        if _ALGS.get(alg) == len(hexd) and set(hexd) <= _HEX:
            return digest
    raise _error(f"{what}: not a valid digest: {str(digest)[:80]!r}")


def host_platform() -> tuple:
    """``(os, architecture, variant)`` of this machine in OCI's words.

    >>> host_platform()[0]
    'linux'
    """
    machine = os.uname().machine
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm",
            "armv6l": "arm", "i686": "386", "i386": "386", "ppc64le": "ppc64le", "s390x": "s390x",
            "riscv64": "riscv64"}.get(machine, machine)
    variant = {"aarch64": "v8", "arm64": "v8", "armv7l": "v7", "armv6l": "v6"}.get(machine)
    return "linux", arch, variant


# ---------------------------------------------------------------------------- reading blobs


class Blob:
    """A blob being read: ``read(n)`` counts and hashes, ``finish()`` drains and checks.

    ``source`` has ``read(n)`` and ``close()``. With no ``digest`` only the
    size is checked (when known).
    """

    def __init__(self, source, digest: str | None, size: int | None, what: str) -> None:
        import hashlib

        self.source = source
        self.digest = digest
        self.size = size
        self.what = what
        self.count = 0
        self.h = hashlib.new(digest.partition(":")[0]) if digest else None

    def read(self, n: int = _CHUNK) -> bytes:
        if self.size is not None:
            # One byte past the size is enough to know the blob lies.
            n = min(n, self.size + 1 - self.count)
            if n <= 0:
                return b""
        b = self.source.read(n)
        if b:
            self.count += len(b)
            if self.h is not None:
                self.h.update(b)
            if self.size is not None and self.count > self.size:
                raise _error(f"{self.what}: longer than the {self.size} bytes its descriptor says")
        return b

    def finish(self) -> None:
        while self.read(_CHUNK):
            pass
        if self.size is not None and self.count != self.size:
            raise _error(f"{self.what}: {self.count} bytes, its descriptor says {self.size}")
        if self.h is not None and f"{self.digest.partition(':')[0]}:{self.h.hexdigest()}" != self.digest:
            raise _error(f"{self.what}: content does not match its digest {self.digest}")

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> "Blob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Region:
    """``pread`` of ``size`` bytes at ``offset`` of a regular file's descriptor (``size`` None: to EOF)."""

    def __init__(self, fd: int, offset: int, size: int | None, own: bool = False) -> None:
        self.fd, self.pos, self.end, self.own = fd, offset, None if size is None else offset + size, own

    def read(self, n: int = _CHUNK) -> bytes:
        if self.end is not None:
            n = min(n, self.end - self.pos)
            if n <= 0:
                return b""
        b = os.pread(self.fd, n, self.pos)
        self.pos += len(b)
        return b

    def close(self) -> None:
        if self.own and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _open_regular(path: str, what: str) -> int:
    """A descriptor of the regular file ``path`` (never a FIFO or device; no symlink as the last part)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise _error(f"{what}: missing ({path})") from None
    except OSError as e:
        raise _error(f"{what}: cannot open {path}: {e.strerror or e}") from None
    if not _stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _error(f"{what}: {path} is not a regular file")
    return fd


def read_json(blob: Blob, limit: int, what: str) -> dict:
    """Read a whole small blob (at most ``limit`` bytes), check it, parse a JSON object."""
    import json

    from ..core.bounded import read_all

    with blob:
        data = read_all(blob.read, limit, _CHUNK, lambda: _error(f"{what}: larger than {limit} bytes"))
        blob.finish()
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise _error(f"{what}: not valid JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise _error(f"{what}: not a JSON object")
    return doc


def _descriptor(d, what: str) -> dict:
    if not isinstance(d, dict):
        raise _error(f"{what}: a descriptor that is not an object")
    check_digest(d.get("digest"), what)
    size = d.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _error(f"{what}: descriptor without a valid size")
    return d


# ---------------------------------------------------------------------------- stores


class _Store:
    """What every store offers: ``open(digest, size, what) -> Blob`` and ``top(selector)``."""

    name = ""

    def open(self, digest: str, size: int | None, what: str) -> Blob:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass


class OciDir(_Store):
    """An OCI image layout directory."""

    def __init__(self, path: str, limits) -> None:
        self.path = path
        self.name = f"oci:{path}"
        self.limits = limits
        if not os.path.isdir(path):
            raise _error(f"{path}: not a directory")
        if not os.path.isfile(os.path.join(path, "oci-layout")):
            raise _error(f"{path}: not an OCI image layout (no oci-layout file)")

    def index(self) -> dict:
        fd = _open_regular(os.path.join(self.path, "index.json"), f"{self.name}: index.json")
        return read_json(Blob(_Region(fd, 0, None, own=True), None, None, "index.json"),
                         self.limits.max_json_bytes, f"{self.name}: index.json")

    def open(self, digest: str, size: int | None, what: str) -> Blob:
        alg, _, hexd = check_digest(digest, what).partition(":")
        fd = _open_regular(os.path.join(self.path, "blobs", alg, hexd), what)
        return Blob(_Region(fd, 0, None, own=True), digest, size, what)


class _TarArchive(_Store):
    """A tar file's members by name, read in place (never extracted)."""

    def __init__(self, path: str, limits, transport: str) -> None:
        import tarfile

        self.path = path
        self.name = f"{transport}:{path}"
        self.limits = limits
        self.fd = _open_regular(path, self.name)
        head = os.pread(self.fd, 4, 0)
        if head[:2] == b"\x1f\x8b" or head == b"\x28\xb5\x2f\xfd":
            os.close(self.fd)
            raise _error(f"{self.name}: a compressed archive: decompress it first")
        self.members: dict = {}
        from .layers import normalize

        f = os.fdopen(os.dup(self.fd), "rb")
        try:
            tf = tarfile.open(fileobj=f, mode="r:")
            n = 0
            while True:
                m = tf.next()
                if m is None:
                    break
                tf.members.clear()
                n += 1
                if n > limits.max_archive_members:
                    raise _error(f"{self.name}: more than {limits.max_archive_members} members")
                name = normalize(m.name)
                if m.isreg():
                    if m.sparse:
                        continue
                    self.members[name] = ("file", m.offset_data, m.size)
                elif m.issym():
                    self.members[name] = ("symlink", m.linkname, 0)
                elif m.islnk():
                    self.members[name] = ("link", normalize(m.linkname), 0)
                elif m.isdir():
                    self.members[name] = ("dir", None, 0)
        except tarfile.TarError as e:
            os.close(self.fd)
            raise _error(f"{self.name}: not a readable tar archive ({e})") from None
        except BaseException:
            os.close(self.fd)
            raise
        finally:
            f.close()

    def member(self, name: str, what: str) -> tuple:
        """``(offset, size)`` of the regular member ``name``, following the archive's own links."""
        from .layers import normalize

        name = normalize(name)
        for _ in range(16):
            m = self.members.get(name)
            if m is None:
                raise _error(f"{what}: not in {self.name} ({name})")
            kind, arg, size = m
            if kind == "file":
                return arg, size
            if kind == "link":
                name = arg
            elif kind == "symlink":
                base = name.rsplit("/", 1)[0] if "/" in name else ""
                name = normalize(arg if arg.startswith("/") else f"{base}/{arg}")
            else:
                raise _error(f"{what}: {name} in {self.name} is a directory")
        raise _error(f"{what}: too many links in {self.name} ({name})")

    def open_member(self, name: str, digest: str | None, size: int | None, what: str) -> Blob:
        offset, msize = self.member(name, what)
        return Blob(_Region(self.fd, offset, msize), digest, size if size is not None else msize, what)

    def open(self, digest: str, size: int | None, what: str) -> Blob:
        alg, _, hexd = check_digest(digest, what).partition(":")
        return self.open_member(f"blobs/{alg}/{hexd}", digest, size, what)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class OciArchive(_TarArchive):
    def __init__(self, path: str, limits) -> None:
        super().__init__(path, limits, "oci-archive")
        if "oci-layout" not in self.members:
            self.close()
            raise _error(f"{self.name}: not an OCI archive (no oci-layout)")

    def index(self) -> dict:
        return read_json(self.open_member("index.json", None, None, f"{self.name}: index.json"),
                         self.limits.max_json_bytes, f"{self.name}: index.json")


class DockerArchive(_TarArchive):
    def __init__(self, path: str, limits) -> None:
        super().__init__(path, limits, "docker-archive")
        if "manifest.json" not in self.members:
            self.close()
            raise _error(f"{self.name}: not a docker save archive (no manifest.json)")

    def manifest(self) -> list:
        import json

        blob = self.open_member("manifest.json", None, None, f"{self.name}: manifest.json")
        parts = []
        with blob:
            while True:
                b = blob.read(_CHUNK)
                if not b:
                    break
                parts.append(b)
                if sum(map(len, parts)) > self.limits.max_json_bytes:
                    raise _error(f"{self.name}: manifest.json larger than {self.limits.max_json_bytes} bytes")
        try:
            doc = json.loads(b"".join(parts))
        except ValueError as e:
            raise _error(f"{self.name}: manifest.json is not valid JSON ({str(e)[:80]})") from None
        if not isinstance(doc, list) or not doc or not all(isinstance(x, dict) for x in doc):
            raise _error(f"{self.name}: manifest.json lists no image")
        return doc


class _Proc:
    """A child's stdout as a blob source; closing (or the watchdog) kills it."""

    def __init__(self, argv: list, timeout: float, what: str) -> None:
        import subprocess
        import threading

        from ..core.process import StderrTail, big_pipe

        self.what = what
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  bufsize=0, close_fds=True)
        self.err = StderrTail(self.p.stderr)
        big_pipe(self.p.stdout.fileno())
        self.timer = threading.Timer(timeout, self.p.kill)
        self.timer.daemon = True
        self.timer.start()
        self.timeout = timeout

    def read(self, n: int = _CHUNK) -> bytes:
        b = self.p.stdout.read(n)
        if not b:
            rc = self.p.wait()
            if rc != 0:
                why = self.err.last_line()[:300] or (f"killed after {self.timeout:.0f} s" if rc < 0 else f"exit {rc}")
                raise _error(f"{self.what}: {why}")
        return b

    def close(self) -> None:
        self.timer.cancel()
        if self.p.poll() is None:
            self.p.kill()
        self.p.stdout.close()
        self.p.wait()
        self.err.close()


#: Where containerd's socket is on the node, tried in this order when neither
#: ``--address`` nor ``CONTAINERD_ADDRESS`` names it: containerd's own default
#: (kubeadm, the GPU Operator's nodes, Docker's containerd under CRI), then the
#: distributions that run their own containerd: k3s and RKE2 (both under
#: /run/k3s, RKE2's docs: "The Containerd socket is located at
#: /run/k3s/containerd/containerd.sock") and microk8s (the snap's common dir).
CONTAINERD_SOCKETS = (
    ("/run/containerd/containerd.sock", "containerd default"),
    ("/run/k3s/containerd/containerd.sock", "k3s/RKE2"),
    ("/var/snap/microk8s/common/run/containerd.sock", "microk8s"),
)


def find_socket(address: str | None = None, host_root: str = "/") -> tuple:
    """``(address, found_by)``: containerd's socket, from ``address``, ``$CONTAINERD_ADDRESS`` or
    the first of :data:`CONTAINERD_SOCKETS` (under ``host_root``) that is a socket.

    >>> find_socket("/x/c.sock")
    ('/x/c.sock', '--address')
    >>> find_socket(None, "/nonexistent")[0]
    Traceback (most recent call last):
        ...
    compat_hook.core.errors.ImageError: containerd: no socket at /nonexistent/run/containerd/containerd.sock (containerd default), /nonexistent/run/k3s/containerd/containerd.sock (k3s/RKE2), /nonexistent/var/snap/microk8s/common/run/containerd.sock (microk8s): give --address
    """
    if address:
        return address, "--address"
    env = os.environ.get("CONTAINERD_ADDRESS")
    if env:
        return env, "CONTAINERD_ADDRESS"
    tried = []
    for path, who in CONTAINERD_SOCKETS:
        p = os.path.join(host_root, path.lstrip("/")) if host_root not in ("", "/") else path
        try:
            if _stat.S_ISSOCK(os.stat(p).st_mode):
                return p, who
        except OSError:
            pass
        tried.append(f"{p} ({who})")
    raise _error(f"containerd: no socket at {', '.join(tried)}: give --address")


class Containerd(_Store):
    """A live containerd's content store, read with ``ctr`` (``-a ADDRESS -n NAMESPACE``).

    ``address`` None: :func:`find_socket` finds it (``found_by`` says how).
    """

    def __init__(self, address: str | None, namespace: str, limits) -> None:
        import shutil

        self.ctr = shutil.which("ctr")
        if self.ctr is None:
            raise _error("containerd: no ctr binary on PATH")
        address, self.found_by = find_socket(address)
        sock = address[len("unix://"):] if address.startswith("unix://") else address
        if sock.startswith("/") and not os.path.exists(sock):
            # ctr would spend its 10 s dial timeout finding that out.
            raise _error(f"containerd: no socket at {sock} (give its address)")
        self.address = address
        self.namespace = namespace or "k8s.io"
        self.limits = limits
        self.name = f"containerd:{self.namespace}"
        self._images = None
        self._labels = None
        #: views that could not be removed (``snapshots.with_view``), for the caller to report
        self.leftover: list = []
        #: snapshotters whose stale views of ours this run looked for (:mod:`compat_hook.images.snapshots`)
        self.swept: set = set()

    def _argv(self, *args) -> list:
        return [self.ctr, "-a", self.address, "-n", self.namespace, *args]

    def images(self) -> list:
        """``[(ref, digest)]`` of every image in the namespace, as ``ctr images ls`` lists them."""
        import subprocess

        if self._images is not None:
            return self._images
        try:
            p = subprocess.run(self._argv("images", "ls"), capture_output=True, text=True,
                               timeout=self.limits.ctr_timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise _error(f"{self.name}: ctr images ls did not answer within {self.limits.ctr_timeout_s} s") from None
        if p.returncode != 0:
            lines = p.stderr.strip().splitlines()
            raise _error(f"{self.name}: ctr images ls failed: {lines[-1] if lines else p.returncode}")
        out = []
        for line in p.stdout.splitlines()[1:]:
            f = line.split()
            if len(f) >= 3 and f[2].startswith("sha"):
                out.append((f[0], f[2]))
        self._images = out
        return out

    def content_labels(self) -> dict:
        """``{digest: {label: value}}`` of every blob, from one ``ctr content ls`` (cached; {} when it fails).

        containerd's own bookkeeping: a manifest's ``containerd.io/gc.ref.content.config``, an index's
        ``...content.m.N``, a config's ``containerd.io/gc.ref.snapshot.<snapshotter>`` (its top snapshot).
        """
        import subprocess

        if self._labels is not None:
            return self._labels
        out: dict = {}
        try:
            p = subprocess.run(self._argv("content", "ls"), capture_output=True, text=True,
                               timeout=self.limits.ctr_timeout_s, stdin=subprocess.DEVNULL)
            lines = p.stdout.splitlines()[1:] if p.returncode == 0 else []
        except subprocess.TimeoutExpired:
            lines = []
        for line in lines:
            f = line.split("\t")
            if len(f) < 4 or not f[0].startswith("sha"):
                continue
            labels = {}
            for kv in f[-1].split(","):
                k, eq, v = kv.strip().partition("=")
                if eq:
                    labels[k] = v
            out[f[0].strip()] = labels
        self._labels = out
        return out

    def lookup(self, ref: str) -> tuple:
        """``(ref, digest)`` of ``ref``, also found by its short name (``bb:1`` for ``docker.io/library/bb:1``)."""
        have = dict(self.images())
        for cand in _ref_forms(ref):
            if cand in have:
                return cand, have[cand]
        raise _error(f"containerd:{ref}: no such image in namespace {self.namespace}")

    def open(self, digest: str, size: int | None, what: str) -> Blob:
        check_digest(digest, what)
        proc = _Proc(self._argv("content", "get", digest), self.limits.ctr_timeout_s, what)
        return Blob(proc, digest, size, what)


def _ref_forms(ref: str) -> list:
    """``ref`` and its fully qualified forms (docker.io, library/, :latest).

    >>> _ref_forms("bb")
    ['bb', 'bb:latest', 'docker.io/library/bb', 'docker.io/library/bb:latest']
    """
    forms = [ref]
    last = ref.rsplit("/", 1)[-1]
    if "@" not in ref and ":" not in last:
        forms.append(ref + ":latest")
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        full = "docker.io/library/" + ref
    elif "." not in first and ":" not in first and first != "localhost":
        full = "docker.io/" + ref
    else:
        full = None
    if full:
        forms.append(full)
        if "@" not in ref and ":" not in last:
            forms.append(full + ":latest")
    return forms


# ---------------------------------------------------------------------------- manifests


class Resolved:
    """The image chosen: its manifest descriptor, manifest, config and layer descriptors."""

    __slots__ = ("name", "digest", "manifest", "config", "layers", "config_digest")

    def __init__(self) -> None:
        self.name = None
        self.digest = None
        self.manifest: dict = {}
        self.config: dict = {}
        self.layers: list = []
        self.config_digest = None


def _platform_text(p) -> str:
    if not isinstance(p, dict):
        return "?"
    s = f"{p.get('os', '?')}/{p.get('architecture', '?')}"
    return s + (f"/{p['variant']}" if p.get("variant") else "")


def pick_platform(manifests: list, want: tuple, what: str) -> dict:
    """The descriptor for platform ``want`` (``(os, arch, variant)``) from an index's ``manifests``."""
    os_, arch, variant = want
    with_platform = [m for m in manifests if isinstance(m.get("platform"), dict)
                     and m["platform"].get("os") != "unknown"]
    if not with_platform:
        images = [m for m in manifests if m.get("mediaType") not in _CONFIG_TYPES]
        if len(images) == 1:
            return images[0]
        raise _error(f"{what}: an index of {len(manifests)} manifests without platforms")
    match = [m for m in with_platform if m["platform"].get("os") == os_ and m["platform"].get("architecture") == arch]
    if variant and len(match) > 1:
        exact = [m for m in match if m["platform"].get("variant") in (variant, None)]
        match = exact or match
    if not match:
        have = ", ".join(sorted({_platform_text(m.get("platform")) for m in with_platform}))
        raise _error(f"{what}: no {os_}/{arch} image in the index (it has {have})")
    return match[0]


def resolve(store, desc: dict, limits, what: str, *, platform: tuple | None = None) -> Resolved:
    """Follow ``desc`` (an index or a manifest) to the image for ``platform`` and read its config."""
    want = platform or host_platform()
    seen: set = set()
    for depth in range(limits.max_index_depth + 1):
        if depth == 0 and desc.get("size") is None:
            check_digest(desc.get("digest"), what)  # the top one, size unknown (containerd)
        else:
            _descriptor(desc, what)
        d = desc["digest"]
        if d in seen:
            raise _error(f"{what}: index cycle through {d}")
        seen.add(d)
        if (desc["size"] or 0) > limits.max_json_bytes:
            raise _error(f"{what}: manifest {d} is {desc['size']} bytes, more than a manifest can be")
        doc = read_json(store.open(d, desc["size"], f"{what}: manifest {d}"), limits.max_json_bytes,
                        f"{what}: manifest {d}")
        mt = doc.get("mediaType") or desc.get("mediaType")
        if doc.get("schemaVersion") == 1:
            raise _error(f"{what}: a Docker schema 1 manifest (unsupported, long deprecated)")
        if isinstance(doc.get("manifests"), list) or mt in _INDEX_TYPES:
            ms = doc.get("manifests")
            if not isinstance(ms, list) or not all(isinstance(m, dict) for m in ms):
                raise _error(f"{what}: index {d} has no valid manifests list")
            desc = pick_platform(ms, want, f"{what}: index {d}")
            continue
        layers, config = doc.get("layers"), doc.get("config")
        if not isinstance(layers, list) or not isinstance(config, dict):
            raise _error(f"{what}: {d} is neither an image index nor an image manifest")
        config = _descriptor(config, f"{what}: config")
        if config.get("mediaType") and config["mediaType"] not in _CONFIG_TYPES:
            raise _error(f"{what}: not a container image (config type {config['mediaType']})")
        r = Resolved()
        r.digest = d
        r.manifest = doc
        r.layers = [_descriptor(x, f"{what}: layer {i}") for i, x in enumerate(layers)]
        r.config_digest = config["digest"]
        r.config = read_json(store.open(config["digest"], config["size"], f"{what}: config"),
                             limits.max_json_bytes, f"{what}: config {config['digest']}")
        return r
    raise _error(f"{what}: indexes nested more than {limits.max_index_depth} deep")


def oci_top(index: dict, selector: str | None, what: str) -> tuple:
    """``(descriptor, name)`` of the image ``selector`` (a tag, ``@N``, or None) names in an index.json."""
    ms = index.get("manifests")
    if not isinstance(ms, list) or not ms or not all(isinstance(m, dict) for m in ms):
        raise _error(f"{what}: index.json lists no manifests")

    def names(m) -> list:
        a = m.get("annotations") if isinstance(m.get("annotations"), dict) else {}
        return [str(a[k]) for k in (_REF_NAME, _CTR_IMAGE_NAME) if a.get(k)]

    if selector is None:
        if len(ms) == 1:
            n = names(ms[0])
            return ms[0], n[0] if n else None
        tags = sorted({n[0] for n in map(names, ms) if n})
        raise _error(f"{what}: {len(ms)} images in the layout: name one ({', '.join(tags[:8]) or '@0, @1, ...'})")
    if selector.startswith("@") and selector[1:].isdigit():
        i = int(selector[1:])
        if i >= len(ms):
            raise _error(f"{what}: no image {selector} (the layout has {len(ms)})")
        n = names(ms[i])
        return ms[i], n[0] if n else None
    for m in ms:
        for n in names(m):
            if n == selector or n.endswith(":" + selector):
                return m, selector
    raise _error(f"{what}: no image tagged {selector!r}")


def oci_selectors(index: dict) -> list:
    """One selector per image of an index.json: its tag, else ``@N``."""
    out = []
    ms = index.get("manifests") if isinstance(index.get("manifests"), list) else []
    for i, m in enumerate(ms):
        a = m.get("annotations") if isinstance(m, dict) and isinstance(m.get("annotations"), dict) else {}
        out.append(str(a[_REF_NAME]) if a.get(_REF_NAME) else f"@{i}")
    return out
