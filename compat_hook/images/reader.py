"""Read container images the way a runtime would see them, without unpacking them.

The entry points::

    with open_image("oci:/srv/layout:v1") as img:      # or a Reader's .open()
        img.env                                         # the config's Env list
        imagefacts.gather(img.root, config)             # img.root reads like rootfs.Root

Sources, named like skopeo's transports (:data:`TRANSPORTS`):

* ``oci:DIR[:TAG]`` and ``oci-archive:FILE[:TAG]`` - an OCI image layout, or
  a tar of one; ``TAG`` is the ``org.opencontainers.image.ref.name``
  annotation (or ``@N``, the N-th manifest); none: the layout's only image;
* ``docker-archive:FILE[:REF]`` - what ``docker save`` writes; ``REF`` one of
  its ``RepoTags`` (or ``@N``);
* ``containerd:REF`` - an image in a live containerd's content store, through
  ``ctr -a ADDRESS -n NAMESPACE`` (namespace ``k8s.io`` by default);
  ``containerd:`` alone stands for every image there (:func:`expand_sources`);
  an image the snapshotter unpacked is read from its layer dirs instead
  (:mod:`compat_hook.images.snapshots`; ``Limits.unpacked``);
* ``docker:REF`` / ``docker:`` - Docker's image store, through ``docker``:
  overlay2's layer dirs from ``docker image inspect``, else (vfs, the
  containerd image store) ``docker save``'s stream;
* ``containers-storage:REF`` / ``containers-storage:`` (also
  ``containers-storage:[DRIVER@ROOT+RUNROOT]REF``, as skopeo writes it) -
  Podman's and CRI-O's store, through ``podman`` the same way.

Layer dirs are read as one merged tree with overlay's rules
(:mod:`compat_hook.images.unpacked`), confined to them.

A multi-platform index gives the ``linux/<this machine>`` image. Layers are
read as streams (:mod:`compat_hook.images.layers`), applied in order to an
in-memory tree (:mod:`compat_hook.images.view`) that keeps only what the compat
checks read: every directory and symlink, and of the other entries those named
``libcuda*``/``libnvidia-*``, under a ``compat*`` dir, or ``*.conf``, and what
tells the image's CUDA runtime (``libcudart.so.*``, a runtime wheel's
``METADATA``, ``torch/version.py``, conda's ``cuda-cudart-*.json``) (so
``listdir`` elsewhere is partial); a file reached through a symlink from a
kept name is looked up again in the layers. Blobs are checked against their
digests while they stream. A layer shared by several images of one store is
read once per :class:`Reader` (while its cache, ``Limits.cache_entries``,
holds it).

Images are attacker-controlled input: whatever is wrong with one is an
:class:`ImageError` (one line, naming the image and the part), nothing is
written outside the reader's private temp dir, and everything is bounded
(:class:`Limits`).
"""

from __future__ import annotations

import os
import time

from ..core.errors import ImageError

__all__ = ["ImageError", "Limits", "Reader", "Image", "open_image", "expand_sources", "is_image_source",
           "default_reader", "split_source", "TRANSPORTS"]

TRANSPORTS = ("oci:", "oci-archive:", "docker-archive:", "containerd:", "docker:", "containers-storage:")


class Limits:
    """Bounds on reading one image (every image is attacker-controlled input).

    >>> Limits(max_layer_bytes=1 << 30).max_layer_bytes
    1073741824
    """

    #: decompressed bytes of one layer (a gzip bomb stops here)
    max_layer_bytes = 64 << 30
    #: tar members of one layer
    max_members = 2_000_000
    #: entries kept from one layer, and in one image's tree (~350 bytes each:
    #: 100k keep a reader under 64 MiB; big CUDA images keep 10-40k)
    max_entries = 100_000
    #: bytes of data of one spooled file (a compat libcuda is 30-100 MB)
    max_file_bytes = 256 << 20
    #: apparent size of one spooled file (holes are free; reading them is not)
    max_file_size = 16 << 30
    #: bytes spooled to the temp dir by one reader, in all
    max_spool_bytes = 4 << 30
    #: ld.so.conf text kept in memory per layer
    max_text_bytes_per_layer = 1 << 20
    #: an index.json, manifest, config or manifest.json
    max_json_bytes = 8 << 20
    #: indexes within indexes
    max_index_depth = 8
    #: members of an oci-archive / docker-archive file
    max_archive_members = 200_000
    #: kept entries of cached layers, in all (least recently used layers go first)
    cache_entries = 100_000
    #: seconds to read one image (None: no limit besides the byte bounds)
    deadline_s = None
    #: seconds one ctr call may take
    ctr_timeout_s = 600.0
    #: "auto" (the zstd binary, else python-zstandard), "binary" or "module"
    zstd = "auto"
    #: read what the node already unpacked (containerd's snapshotter, Docker's and
    #: containers/storage's layer dirs) before the blobs; False: the blobs only
    unpacked = True
    #: seconds to read one image from unpacked layer dirs, the checks included
    unpacked_deadline_s = 120.0

    def __init__(self, **kw) -> None:
        for k, v in kw.items():
            if not hasattr(Limits, k) or k.startswith("_"):
                raise TypeError(f"Limits: no such bound {k!r}")
            setattr(self, k, v)


class Image:
    """One image, read. ``root`` reads like :class:`~compat_hook.facts.rootfs.Root`; ``env`` is the config's Env.

    Attributes: ``source`` (as given), ``name`` (tag or reference, or None),
    ``digest`` (the manifest's, None for a docker-archive), ``platform``
    (``linux/amd64``, from the config), ``config`` (the config's ``config``
    object: Env, Entrypoint, Labels ...), ``layers`` (layer digests in
    order), ``stats`` (``layers_read``, ``layers_cached``, ``bytes``
    decompressed, ``entries`` kept, ``seconds``).
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.name = None
        self.digest = None
        self.platform = None
        self.config: dict = {}
        self.env: list = []
        self.layers: list = []
        self.root = None
        self.read_via = "blobs"
        self.read_via_reason = None
        self.stats: dict = {"layers_read": 0, "layers_cached": 0, "bytes": 0, "entries": 0, "seconds": 0.0}

    def close(self) -> None:
        if self.root is not None:
            self.root.close()

    def __enter__(self) -> "Image":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Image {self.source} {self.digest or ''}>"


def is_image_source(source: str) -> bool:
    """Whether ``source`` names an image by transport (not a directory).

    >>> is_image_source("oci:/srv/layout:v1"), is_image_source("/srv/rootfs")
    (True, False)
    """
    return isinstance(source, str) and source.startswith(TRANSPORTS)


def split_source(kind: str, rest: str) -> tuple:
    """``(path, selector or None)`` of an ``oci:`` layout (``kind`` ``oci``) or an archive source, ``rest``
    what follows ``KIND:``: the longest prefix up to a ``:`` that is such a dir or file (a path may hold ``:``).

    >>> split_source("oci", "/:latest"), split_source("oci", "/nonexistent:latest")
    (('/', 'latest'), ('/nonexistent:latest', None))
    """
    exists = os.path.isdir if kind == "oci" else os.path.isfile
    if exists(rest):
        return rest, None
    i = rest.find(":")
    while i >= 0:
        if exists(rest[:i]):
            return rest[:i], rest[i + 1:] or None
        i = rest.find(":", i + 1)
    return rest, None


class _LayerFetcher:
    """Reads one layer again for what the first pass did not keep (:class:`~compat_hook.images.view.Lazy`)."""

    __slots__ = ("reader", "opener", "what", "lower")

    def __init__(self, reader, opener, what: str, lower) -> None:
        self.reader, self.opener, self.what, self.lower = reader, opener, what, lower

    def find(self, member: str, binary: bool = False):
        """The layer's last non-directory entry ``member`` as a Node (content loaded), or None."""
        from .layers import fetch_member
        from .view import Node, Unreadable

        try:
            with self.opener() as raw:
                return fetch_member(raw, member, what=self.what, limits=self.reader.limits, spool=self.reader.spool,
                                    binary=binary)
        except ImageError as e:
            return Node.file(Unreadable(str(e)))
        except OSError as e:
            return Node.file(Unreadable(f"{self.what}: {e.strerror or e}"))

    def __call__(self, member: str, binary: bool = False):
        """The content of ``member``, from this layer or (a hard link's target) a lower one."""
        from .view import Unreadable

        fetcher = self
        while fetcher is not None:
            node = fetcher.find(member, binary)
            if node is not None and node.children is None and node.kind == "file":
                return node.content
            fetcher = fetcher.lower
        return Unreadable(f"{self.what}: {member} is not a regular file in the layers")


class _Unkept:
    """Looks up again a file the tree did not keep, reached through a symlink from a name it keeps.

    ``/etc/ld.so.conf.d/cuda.conf -> /opt/conf/cuda-paths`` keeps the link
    but not its target (any name): asked for, the target is searched in the
    layers from the top (a whiteout or opaque dir above it hides it). Only
    such paths pay a second read; a miss on a name the tree keeps is final.
    """

    def __init__(self, layers: list) -> None:
        self.layers = layers      # [(LayerEntries, _LayerFetcher)], bottom first
        self.seen: dict = {}

    def __call__(self, requested: str, parent, names: list, name: str):
        from .layers import _binary, keep, normalize

        path = "/".join(names + [name])
        requested = normalize(requested)
        if keep(requested, "file") is None or keep(path, "file") is not None:
            return None
        if path not in self.seen:
            node = None
            for entries, fetcher in reversed(self.layers):
                node = fetcher.find(path, _binary(requested))
                if node is not None:
                    break
                if path in entries.whiteouts or any(path == o or path.startswith(o + "/") or not o
                                                    for o in entries.opaques):
                    break
            self.seen[path] = node
            if node is not None:
                parent.children[name] = node
        return self.seen[path]


class Reader:
    """Reads images; layers and open stores are cached until :meth:`close`.

    ``limits``: a :class:`Limits`. Spooled files live in one private temp
    dir (0700, made under ``tmp_dir`` or the system's), removed by :meth:`close`.
    """

    def __init__(self, limits: Limits | None = None, *, tmp_dir: str | None = None) -> None:
        from collections import OrderedDict

        self.limits = limits or Limits()
        self.tmp_dir = tmp_dir
        self._spool = None
        self._layers: OrderedDict = OrderedDict()
        self._cached = 0
        self._stores: dict = {}
        self.closed = False

    @property
    def spool(self):
        if self._spool is None:
            from .layers import Spool

            self._spool = Spool(self.limits.max_spool_bytes, self.tmp_dir)
        return self._spool

    @property
    def temp_dir(self) -> str | None:
        """The private temp dir, once something was spooled (None before)."""
        return self._spool.dir if self._spool is not None else None

    def close(self) -> None:
        for s in self._stores.values():
            s.close()
        self._stores.clear()
        self._layers.clear()
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        self.closed = True

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- stores -------------------------------------------------------------
    def _store(self, kind: str, key, make):
        s = self._stores.get((kind, key))
        if s is None:
            s = self._stores[(kind, key)] = make()
        return s

    def _parse(self, source: str, address, namespace) -> tuple:
        from . import stores as st

        lim = self.limits
        if not is_image_source(source):
            raise ImageError(f"{source}: not an image source ({', '.join(t + '...' for t in TRANSPORTS)})")
        kind, _, rest = source.partition(":")
        if kind == "oci":
            path, sel = split_source(kind, rest)
            return kind, self._store(kind, os.path.realpath(path), lambda: st.OciDir(path, lim)), sel
        if kind == "oci-archive":
            path, sel = split_source(kind, rest)
            return kind, self._store(kind, os.path.realpath(path), lambda: st.OciArchive(path, lim)), sel
        if kind == "docker-archive":
            path, sel = split_source(kind, rest)
            return kind, self._store(kind, os.path.realpath(path), lambda: st.DockerArchive(path, lim)), sel
        if kind in ("docker", "containers-storage"):
            from .snapshots import Engine

            spec = None
            if kind == "containers-storage" and rest.startswith("["):
                spec, close, rest = rest[1:].partition("]")
                if not close:
                    raise ImageError(f"{source}: no ] after [DRIVER@ROOT+RUNROOT")
            return kind, self._store(kind, spec, lambda: Engine(kind, spec, lim)), rest or None
        ns = namespace or "k8s.io"
        return kind, self._store(kind, (address, ns), lambda: st.Containerd(address, ns, lim)), rest or None

    # -- the API ------------------------------------------------------------
    def expand(self, source: str, *, address: str | None = None, namespace: str = "k8s.io") -> list:
        """The image sources ``source`` stands for: ``containerd:`` every image (one reference per
        manifest: tags before digests before IDs), a layout or archive without a selector
        each of its images; anything else itself."""
        if not is_image_source(source):
            return [source]
        kind, store, sel = self._parse(source, address, namespace)
        if sel is not None:
            return [source]
        if kind in ("docker", "containers-storage"):
            return [f"{store.prefix}{ref}" for ref, _ in store.images()]
        if kind == "containerd":
            best: dict = {}
            for ref, digest in store.images():
                rank = 2 if ref.startswith("sha256:") else 1 if "@" in ref else 0
                if digest not in best or rank < best[digest][0]:
                    best[digest] = (rank, ref)
            return sorted(f"containerd:{ref}" for _, ref in best.values())
        if kind in ("oci", "oci-archive"):
            from .stores import oci_selectors

            sels = oci_selectors(store.index())
            return [source] if len(sels) <= 1 else [f"{source}:{s}" for s in sels]
        entries = store.manifest()
        if len(entries) <= 1:
            return [source]
        out = []
        for i, e in enumerate(entries):
            tags = e.get("RepoTags") if isinstance(e.get("RepoTags"), list) else []
            out.append(f"{source}:{tags[0]}" if len(tags) == 1 and isinstance(tags[0], str) else f"{source}:@{i}")
        return out

    def open(self, source: str, *, address: str | None = None, namespace: str = "k8s.io",
             host_root: str | None = None) -> Image:
        """Read the image ``source`` names; raises :class:`ImageError`.

        ``host_root``: where the node's root is seen from here (the config's ``host_root``); the
        layer dirs a snapshotter or graph driver names are node paths, read inside it (confined).
        """
        if self.closed:
            raise ImageError("the image reader is closed")
        t0 = time.monotonic()
        lim = self.limits
        kind, store, sel = self._parse(source, address, namespace)
        why = None
        if kind == "containerd" and lim.unpacked:
            from .snapshots import NotUnpacked

            try:
                return self._containerd_unpacked(store, sel, source, t0, host_root)
            except NotUnpacked as e:
                why = str(e)
        if kind in ("docker", "containers-storage"):
            return self._engine(store, sel, source, t0, host_root)
        img = Image(source)
        img.read_via_reason = why
        if kind == "docker-archive":
            layers = self._docker(store, sel, img, source)
        else:
            layers = self._oci(kind, store, sel, img, source)
        self._apply(img, layers, source, t0)
        return img

    def _apply(self, img: Image, layers: list, source: str, t0: float) -> None:
        """Read ``layers`` (blobs or a stream) into ``img``'s in-memory tree."""
        from .view import Tree

        lim = self.limits
        deadline = t0 + lim.deadline_s if lim.deadline_s else None
        cfg = img.config
        env = cfg.get("Env") if isinstance(cfg.get("Env"), list) else []
        img.env = [e for e in env if isinstance(e, str)]
        tree = Tree(max_entries=lim.max_entries)
        lower = None
        applied = []
        for i, (digest, key, opener, uncompressed, size) in enumerate(layers):
            what = f"{source}: layer {i + 1}/{len(layers)} {digest}"
            entries, lower = self._layer(key, opener, what, uncompressed, size, deadline, img, lower,
                                         {x[1] for x in layers})
            applied.append((entries, lower))
            try:
                entries.apply(tree)
            except OSError as e:
                raise ImageError(f"{what}: cannot be applied: {e.filename or ''} {e.strerror or e}") from None
        img.layers = [x[0] for x in layers]
        img.stats["entries"] = tree.entries
        img.root = tree.view(_Unkept(applied))
        img.stats["seconds"] = round(time.monotonic() - t0, 3)

    # -- unpacked ------------------------------------------------------------
    def _containerd_unpacked(self, store, sel, source: str, t0: float, host_root: str | None = None) -> Image:
        """The image from containerd's snapshotter (:mod:`compat_hook.images.snapshots`); NotUnpacked: read the blobs."""
        from . import snapshots as sn
        from .stores import check_digest, host_platform, pick_platform, read_json, resolve

        lim = self.limits
        if sel is None:
            raise ImageError("containerd: name an image (containerd:REF), or expand containerd: first")
        ref, digest = store.lookup(sel)
        labels = store.content_labels()
        d, config_digest = digest, None
        for _ in range(lim.max_index_depth + 1):
            lab = labels.get(d) or {}
            if lab.get("containerd.io/gc.ref.content.config"):
                config_digest = check_digest(lab["containerd.io/gc.ref.content.config"], f"{source}: config")
                break
            if not any(k.startswith("containerd.io/gc.ref.content.m.") for k in lab):
                break
            index = read_json(store.open(d, None, f"{source}: index {d}"), lim.max_json_bytes, f"{source}: index {d}")
            ms = index.get("manifests")
            if not isinstance(ms, list) or not all(isinstance(m, dict) for m in ms):
                raise ImageError(f"{source}: index {d} has no valid manifests list")
            d = check_digest(pick_platform(ms, host_platform(), f"{source}: index {d}").get("digest"), source)
        if config_digest is not None:
            config = read_json(store.open(config_digest, None, f"{source}: config"), lim.max_json_bytes,
                               f"{source}: config {config_digest}")
        else:  # containerd keeps no labels here: the manifests, read (and checked) as for the blobs
            r = resolve(store, {"digest": digest, "size": None}, lim, source)
            config, config_digest, d = r.config, r.config_digest, r.digest
        rootfs = config.get("rootfs") if isinstance(config.get("rootfs"), dict) else {}
        diff_ids = rootfs.get("diff_ids")
        if not isinstance(diff_ids, list) or not diff_ids:
            raise sn.NotUnpacked(f"{source}: the config lists no diff_ids")
        for x in diff_ids:
            check_digest(x, f"{source}: config diff_id")
        chain = sn.chain_id(diff_ids)
        names = sn.snapshotters_of(labels.get(config_digest) or {}, chain)
        if not names:
            if labels:
                raise sn.NotUnpacked(f"{source}: not unpacked in any snapshotter")
            names = ["overlayfs"]  # no labels to tell: containerd's default
        deadline = t0 + (lim.deadline_s or lim.unpacked_deadline_s)

        def use(dirs: list):
            from .unpacked import Layers

            try:
                return Layers(dirs, what=source, max_dir_entries=lim.max_entries, deadline=deadline,
                              host_root=host_root)
            except ImageError as e:
                raise sn.NotUnpacked(str(e)) from None

        why = []
        for name in names:
            try:
                root = sn.with_view(store, name, chain, use, source)
            except sn.NotUnpacked as e:
                why.append(str(e))
                continue
            img = Image(source)
            img.name, img.digest, img.read_via = ref, d, "snapshot"
            self._config(img, config, source)
            env = img.config.get("Env") if isinstance(img.config.get("Env"), list) else []
            img.env = [e for e in env if isinstance(e, str)]
            img.layers = list(diff_ids)
            img.root = root
            img.stats.update(snapshotter=name, layer_dirs=len(root.paths), seconds=round(time.monotonic() - t0, 3))
            return img
        raise sn.NotUnpacked("; ".join(why))

    def _engine(self, store, sel, source: str, t0: float, host_root: str | None = None) -> Image:
        """Docker's or containers/storage's image: its graph driver's layer dirs, else its save stream."""
        from .snapshots import NotUnpacked, graph_dirs

        lim = self.limits
        if sel is None:
            raise ImageError(f"{source}: name an image ({source}REF), or expand {source} first")
        info = store.inspect(sel)
        why = "not read unpacked (Limits.unpacked is off)"
        if lim.unpacked:
            try:
                dirs = graph_dirs(info)
            except NotUnpacked as e:
                why = str(e)
            else:
                from .unpacked import Layers

                img = Image(source)
                img.root = Layers(dirs, what=source, max_dir_entries=lim.max_entries,
                                  deadline=t0 + (lim.deadline_s or lim.unpacked_deadline_s), host_root=host_root)
                img.read_via = "snapshot"
                cfg = info.get("Config") if isinstance(info.get("Config"), dict) else {}
                self._config(img, {"config": cfg, "os": info.get("Os"), "architecture": info.get("Architecture"),
                                   "variant": info.get("Variant")}, source)
                env = cfg.get("Env") if isinstance(cfg.get("Env"), list) else []
                img.env = [e for e in env if isinstance(e, str)]
                img.name, img.digest = sel, info.get("Id") if isinstance(info.get("Id"), str) else None
                rootfs = info.get("RootFS") if isinstance(info.get("RootFS"), dict) else {}
                img.layers = [x for x in rootfs.get("Layers") or [] if isinstance(x, str)]
                img.stats.update(graph_driver=(info.get("GraphDriver") or {}).get("Name"), layer_dirs=len(dirs),
                                 seconds=round(time.monotonic() - t0, 3))
                return img
        # The stream: what the engine exports, read like any docker-archive, from the private temp
        # dir (unlinked once open: the archive's descriptor is what the reads use).
        from .stores import DockerArchive

        tar = os.path.join(self.spool.dir, f"save-{os.urandom(6).hex()}.tar")
        try:
            store.save(sel, tar)
            archive = DockerArchive(tar, lim)
        finally:
            try:
                os.unlink(tar)
            except FileNotFoundError:
                pass
        self._stores[("stream", tar)] = archive
        img = Image(source)
        img.read_via, img.read_via_reason = "stream", why
        layers = self._docker(archive, None, img, source)
        img.name = sel
        self._apply(img, layers, source, t0)
        return img

    # -- images -------------------------------------------------------------
    def _oci(self, kind: str, store, sel, img: Image, source: str) -> list:
        from .stores import oci_top, resolve

        if kind == "containerd":
            if sel is None:
                raise ImageError("containerd: name an image (containerd:REF), or expand containerd: first")
            ref, digest = store.lookup(sel)
            img.name = ref
            # ctr images ls tells no size: the top manifest is read bounded.
            r = resolve(store, {"digest": digest, "size": None}, self.limits, source)
        else:
            top, img.name = oci_top(store.index(), sel, source)
            r = resolve(store, top, self.limits, source)
        self._config(img, r.config, source)
        img.digest = r.digest
        # Cached per store: a layer is read once from each store that has
        # it, so every store's own blob is there and checked.
        return [(d["digest"], (store.name, d["digest"]),
                 (lambda d=d: store.open(d["digest"], d["size"], f"{source}: layer {d['digest']}")), None, d["size"])
                for d in r.layers]

    def _config(self, img: Image, config: dict, source: str) -> None:
        c = config.get("config") if isinstance(config.get("config"), dict) else {}
        img.config = c
        os_, arch = config.get("os"), config.get("architecture")
        if isinstance(os_, str) and isinstance(arch, str):
            v = config.get("variant")
            img.platform = f"{os_}/{arch}" + (f"/{v}" if isinstance(v, str) and v else "")

    def _docker(self, store, sel, img: Image, source: str) -> list:
        from .stores import read_json

        entries = store.manifest()
        if sel is None:
            if len(entries) != 1:
                raise ImageError(f"{source}: {len(entries)} images in the archive: name one (:REPO:TAG or :@N)")
            e = entries[0]
        elif sel.startswith("@") and sel[1:].isdigit():
            if int(sel[1:]) >= len(entries):
                raise ImageError(f"{source}: no image {sel} (the archive has {len(entries)})")
            e = entries[int(sel[1:])]
        else:
            from .stores import _ref_forms

            forms = set(_ref_forms(sel))
            match = [x for x in entries if isinstance(x.get("RepoTags"), list)
                     and forms & {t for t in x["RepoTags"] if isinstance(t, str)}]
            if not match:
                raise ImageError(f"{source}: no image tagged {sel}")
            e = match[0]
        tags = e.get("RepoTags") if isinstance(e.get("RepoTags"), list) else []
        img.name = tags[0] if tags and isinstance(tags[0], str) else sel
        cfg_name, layer_names = e.get("Config"), e.get("Layers")
        if not isinstance(cfg_name, str) or not isinstance(layer_names, list) or \
                not all(isinstance(x, str) for x in layer_names):
            raise ImageError(f"{source}: manifest.json entry without Config and Layers")
        cfg_digest = _digest_in_name(cfg_name)
        config = read_json(store.open_member(cfg_name, cfg_digest, None, f"{source}: config {cfg_name}"),
                           self.limits.max_json_bytes, f"{source}: config {cfg_name}")
        rootfs = config.get("rootfs") if isinstance(config.get("rootfs"), dict) else {}
        diff_ids = rootfs.get("diff_ids")
        if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names):
            raise ImageError(f"{source}: the config's rootfs.diff_ids do not match the {len(layer_names)} layers")
        from .stores import check_digest

        for d in diff_ids:
            check_digest(d, f"{source}: config diff_id")
        self._config(img, config, source)
        img.digest = None
        # Checked against the diff_id (the decompressed stream's digest); the
        # cache key is the member itself (images of one archive share them).
        out = []
        for n, d in zip(layer_names, diff_ids):
            offset, _ = store.member(n, f"{source}: layer {n}")  # missing, escaping, looping: an error now
            out.append((d, (store.name, offset, d),
                        (lambda n=n: store.open_member(n, None, None, f"{source}: layer {n}")), d, None))
        return out

    # -- layers -------------------------------------------------------------
    def _layer(self, key, opener, what: str, uncompressed, size, deadline, img: Image, lower, mine: set):
        from .layers import scan_layer

        # A cached layer's lazy nodes fetch through the fetcher of the image
        # that read it first (its lower layers for a hard link's target):
        # the same bytes wherever a layer with that digest appears.
        fetcher = _LayerFetcher(self, opener, what, lower)
        hit = self._layers.get(key)
        if hit is not None and size is not None and hit[0].blob_size != size:
            hit = None  # a descriptor that lies about the size: read it, and fail
        if hit is not None:
            self._layers.move_to_end(key)
            img.stats["layers_cached"] += 1
            return hit[0], hit[1]
        with opener() as raw:
            entries = scan_layer(raw, what=what, limits=self.limits, spool=self.spool, fetcher=fetcher,
                                 deadline=deadline, uncompressed=uncompressed,
                                 room=lambda n: self._make_room(n, mine))
        img.stats["layers_read"] += 1
        img.stats["bytes"] += entries.size
        self._layers[key] = (entries, fetcher)
        self._cached += entries.kept
        self._make_room(0, {key})
        return entries, fetcher

    def _make_room(self, growing: int, keep: set) -> None:
        """Drop least recently used cached layers (not in ``keep``) while over the budget."""
        for k in list(self._layers):
            if self._cached + growing <= self.limits.cache_entries:
                return
            if k not in keep:
                self._cached -= self._layers.pop(k)[0].kept


def _digest_in_name(name: str) -> str | None:
    """The digest a docker-archive member name carries (``<hex>.json``, ``blobs/sha256/<hex>``), or None.

    >>> _digest_in_name("blobs/sha256/" + "a" * 64)[:9], _digest_in_name("x/layer.tar")
    ('sha256:aa', None)
    """
    base = name.rsplit("/", 1)[-1]
    if base.endswith(".json"):
        base = base[:-5]
    if len(base) == 64 and all(c in "0123456789abcdef" for c in base):
        return "sha256:" + base
    return None


_default: Reader | None = None


def default_reader() -> Reader:
    """The process's shared reader (closed at exit), so a run reads a shared layer once."""
    global _default
    if _default is None or _default.closed:
        import atexit

        _default = Reader()
        atexit.register(_default.close)
    return _default


def open_image(source: str, *, address: str | None = None, namespace: str = "k8s.io",
               reader: Reader | None = None, host_root: str | None = None) -> Image:
    """Read one image (see the module docstring); raises :class:`ImageError`."""
    return (reader or default_reader()).open(source, address=address, namespace=namespace, host_root=host_root)


def expand_sources(sources, *, address: str | None = None, namespace: str = "k8s.io",
                   reader: Reader | None = None) -> list:
    """``sources`` with ``containerd:`` and multi-image layouts/archives replaced by one source per image.

    Raises :class:`ImageError` when a store cannot be listed.
    """
    r = reader or default_reader()
    out: list = []
    for s in sources:
        out.extend(r.expand(s, address=address, namespace=namespace))
    return out
