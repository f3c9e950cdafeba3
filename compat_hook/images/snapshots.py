"""Where a node keeps an image unpacked, asked of the engine itself: containerd's snapshotter.

``plan containerd:REF`` reads an image from the layer dirs containerd's
snapshotter already unpacked (what CRI did when it pulled the image) instead
of decompressing its blobs: a few stats, whatever the image's size.

How the dirs are found, through containerd's API only (``ctr``), never by
guessing paths under containerd's root:

1. the image's config, by digest (checked), from the content store; its
   ``rootfs.diff_ids`` give the top snapshot's *chain ID*
   (:func:`chain_id`), the key containerd's unpacker commits it under;
2. which snapshotters hold it: the config's
   ``containerd.io/gc.ref.snapshot.<snapshotter>`` labels (containerd sets
   one per snapshotter that unpacked the image; ``ctr content ls`` lists them
   all in one call);
3. a read-only *view* of that snapshot, ``ctr snapshots --snapshotter S view
   --mounts KEY CHAINID``: its mounts name the dirs, an ``overlay`` mount's
   ``lowerdir=`` (top first) and ``upperdir=``, or a ``bind`` mount's source
   (the native snapshotter, and a one-layer image);
4. the dirs are opened (:class:`~compat_hook.images.unpacked.Layers`), then the view
   is removed (``ctr snapshots rm``), whatever happened, timeouts included.
   The open directory descriptors keep reading valid. A view removed by
   containerd's garbage collector first (1.6 collects unleased views) is
   fine. No lease is taken and nothing is mounted. A run killed (SIGKILL) between
   the two calls leaves its view, unreferenced: containerd's garbage collector
   takes it at some later collection, and the next run removes every view of
   ours older than :data:`STALE_VIEW_S` (their names carry the time they were
   made) before making its own.

An image with no such snapshot is read from its blobs (the caller falls back).
"""

from __future__ import annotations

import os

__all__ = ["chain_id", "layer_dirs", "snapshotters_of", "with_view", "NotUnpacked", "VIEW_PREFIX",
           "SNAPSHOT_LABEL"]

#: Every view ``plan`` creates is named ``compat-hook-plan-<unix time>-<pid>-<random>``.
VIEW_PREFIX = "compat-hook-plan-"
#: A view of ours older than this was left by a run killed between view and rm: removed.
STALE_VIEW_S = 600
SNAPSHOT_LABEL = "containerd.io/gc.ref.snapshot."
#: The snapshotters tried first, in this order, when the image is in several.
PREFERRED = ("overlayfs", "native")


class NotUnpacked(Exception):
    """The image has no snapshot to read here (the reason is the message): read its blobs."""


def chain_id(diff_ids: list) -> str:
    """The chain ID of the top layer: ``chainID(n) = sha256(chainID(n-1) + " " + diffID(n))``.

    >>> chain_id(["sha256:" + "a" * 64]) == "sha256:" + "a" * 64
    True
    >>> chain_id(["sha256:" + "a" * 64, "sha256:" + "b" * 64])[:15]
    'sha256:ccd72292'
    """
    import hashlib

    if not diff_ids:
        raise NotUnpacked("the config lists no layers")
    chain = diff_ids[0]
    for d in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {d}".encode()).hexdigest()
    return chain


def snapshotters_of(labels: dict, chain: str) -> list:
    """The snapshotters whose label on the config names ``chain``, overlayfs and native first.

    >>> snapshotters_of({SNAPSHOT_LABEL + "native": "c", SNAPSHOT_LABEL + "overlayfs": "c",
    ...                  SNAPSHOT_LABEL + "zfs": "other"}, "c")
    ['overlayfs', 'native']
    """
    have = sorted(k[len(SNAPSHOT_LABEL):] for k, v in labels.items() if k.startswith(SNAPSHOT_LABEL) and v == chain)
    return [s for s in PREFERRED if s in have] + [s for s in have if s not in PREFERRED]


def _split_lowerdir(value: str) -> list:
    r"""``lowerdir=`` dirs, top first; ``\:`` and ``\\`` are escapes, as overlayfs reads them.

    >>> _split_lowerdir("/s/2/fs:/s/1/fs"), _split_lowerdir(r"/a\:b:/c")
    (['/s/2/fs', '/s/1/fs'], ['/a:b', '/c'])
    """
    out, cur, i = [], [], 0
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            cur.append(value[i + 1])
            i += 2
            continue
        if c == ":":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return [d for d in out if d]


def layer_dirs(mounts, what: str) -> list:
    """The layer dirs (top first) a snapshot's mounts stack; NotUnpacked for anything else.

    >>> layer_dirs([{"Type": "overlay", "Source": "overlay", "Options": ["index=off", "lowerdir=/s/2/fs:/s/1/fs"]}], "x")
    ['/s/2/fs', '/s/1/fs']
    >>> layer_dirs([{"Type": "bind", "Source": "/s/1/fs", "Options": ["ro", "rbind"]}], "x")
    ['/s/1/fs']
    """
    if not isinstance(mounts, list) or len(mounts) != 1 or not isinstance(mounts[0], dict):
        raise NotUnpacked(f"{what}: the view has {len(mounts) if isinstance(mounts, list) else 'no'} mounts, "
                          "not one overlay or bind mount")
    m = mounts[0]
    kind, source = m.get("Type"), m.get("Source")
    opts = [o for o in m.get("Options") or [] if isinstance(o, str)]
    if kind == "bind" and isinstance(source, str) and source.startswith("/"):
        return [source]
    if kind == "overlay":
        lower = [o[len("lowerdir="):] for o in opts if o.startswith("lowerdir=")]
        upper = [o[len("upperdir="):] for o in opts if o.startswith("upperdir=")]
        dirs = upper[:1] + (_split_lowerdir(lower[0]) if lower else [])
        if dirs and all(d.startswith("/") for d in dirs):
            return dirs
    raise NotUnpacked(f"{what}: a {kind!s:.20} mount is not a stack of layer dirs")


def _ctr(store, args: list, what: str, timeout: float):
    import subprocess

    try:
        p = subprocess.run(store._argv(*args), capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NotUnpacked(f"{what}: ctr {' '.join(args[:3])} did not answer within {timeout:.0f} s") from None
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines()
        raise NotUnpacked(f"{what}: {lines[-1][:300] if lines else f'ctr exit {p.returncode}'}")
    return p.stdout


def with_view(store, snapshotter: str, chain: str, use, what: str):
    """``use(dirs)`` for the layer dirs of a read-only view of ``chain``; the view is removed after.

    ``store``: a :class:`~compat_hook.images.stores.Containerd`. NotUnpacked
    when there is no such snapshot (or its mounts are not layer dirs).
    """
    import json

    import time

    key = f"{VIEW_PREFIX}{int(time.time())}-{os.getpid()}-{os.urandom(6).hex()}"
    base = ["snapshots", "--snapshotter", snapshotter]
    timeout = min(store.limits.ctr_timeout_s, 60.0)
    if snapshotter not in store.swept:
        store.swept.add(snapshotter)
        _sweep(store, base, what, timeout)
    try:
        out = _ctr(store, base + ["view", "--mounts", key, chain], f"{what}: {snapshotter} snapshot {chain}",
                   timeout)
        try:
            mounts = json.loads(out)
        except ValueError:
            raise NotUnpacked(f"{what}: ctr snapshots view printed no mounts") from None
        return use(layer_dirs(mounts, what))
    finally:
        # Whatever happened (a timeout may have left the view made): remove it. Not there any more
        # (never made, or collected) is fine.
        try:
            _ctr(store, base + ["rm", key], what, timeout)
        except NotUnpacked as e:
            if "not found" not in str(e) and "does not exist" not in str(e):
                store.leftover.append(f"{snapshotter}/{key}: {e}")


def _sweep(store, base: list, what: str, timeout: float) -> list:
    """Remove the views of ours older than :data:`STALE_VIEW_S` (a killed run's); returns their keys."""
    import time

    try:
        out = _ctr(store, base + ["ls"], what, timeout)
    except NotUnpacked:
        return []
    stale = []
    for line in out.splitlines()[1:]:
        key = (line.split() or [""])[0]
        stamp = key[len(VIEW_PREFIX):].split("-")[0] if key.startswith(VIEW_PREFIX) else ""
        if stamp.isdigit() and time.time() - int(stamp) > STALE_VIEW_S:
            stale.append(key)
    if stale:
        try:
            _ctr(store, base + ["rm", *stale], what, timeout)
        except NotUnpacked as e:
            store.leftover.append(f"stale views {', '.join(stale)}: {e}")
    return stale


# ---------------------------------------------------------------------------- Docker, containers/storage


class Engine:
    """Docker's image store (``docker``) or containers/storage (``containers-storage``, through ``podman``).

    ``spec``: containers-storage's ``[DRIVER@ROOT+RUNROOT]`` as skopeo writes it (``None``: the
    engine's defaults); Docker's daemon is the CLI's (``$DOCKER_HOST``, else its default socket).
    """

    def __init__(self, kind: str, spec: str | None, limits) -> None:
        import shutil

        self.kind = kind
        self.limits = limits
        binary = "docker" if kind == "docker" else "podman"
        path = shutil.which(binary)
        if path is None:
            raise _image_error(f"{kind}: no {binary} binary on PATH")
        self.argv = [path]
        self.prefix = f"{kind}:"
        if spec:
            driver, _, rest = spec.partition("@")
            root, _, runroot = rest.partition("+")
            if not driver or not root.startswith("/") or (runroot and not runroot.startswith("/")):
                raise _image_error(f"{kind}:[{spec}]: not [DRIVER@ROOT+RUNROOT]")
            self.argv += ["--storage-driver", driver, "--root", root] + (["--runroot", runroot] if runroot else [])
            self.prefix = f"{kind}:[{spec}]"
        self.name = self.prefix
        self._images = None

    def run(self, args: list, what: str, timeout: float | None = None) -> str:
        import subprocess

        timeout = timeout or self.limits.ctr_timeout_s
        try:
            p = subprocess.run(self.argv + args, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise _image_error(f"{what}: {self.argv[0].rsplit('/', 1)[-1]} {args[0]} did not answer within "
                               f"{timeout:.0f} s") from None
        if p.returncode != 0:
            lines = p.stderr.strip().splitlines()
            raise _image_error(f"{what}: {lines[-1][:300] if lines else f'exit {p.returncode}'}")
        return p.stdout

    def images(self) -> list:
        """``[(ref, id)]``: one per image, its first tag (else its ID)."""
        if self._images is None:
            args = ["image", "ls", "--format", "{{.Repository}}:{{.Tag}}\t{{.ID}}"]
            out = self.run(args if self.kind == "docker" else ["images", "--format",
                                                              "{{.Repository}}:{{.Tag}}\t{{.ID}}"], self.name)
            best: dict = {}
            for line in out.splitlines():
                ref, _, iid = line.partition("\t")
                if not iid:
                    continue
                if "<none>" in ref:
                    ref = iid
                best.setdefault(iid, ref)
                if best[iid] == iid and ref != iid:
                    best[iid] = ref
            self._images = sorted(best.items())
        return [(ref, iid) for iid, ref in self._images]

    def inspect(self, ref: str) -> dict:
        import json

        what = f"{self.prefix}{ref}"
        out = self.run(["image", "inspect", ref], what)
        try:
            doc = json.loads(out)
        except ValueError:
            raise _image_error(f"{what}: image inspect printed no JSON") from None
        if not isinstance(doc, list) or len(doc) != 1 or not isinstance(doc[0], dict):
            raise _image_error(f"{what}: image inspect gave no one image")
        return doc[0]

    def save(self, ref: str, path: str) -> None:
        """``docker save`` / ``podman save`` (docker-archive format) of ``ref`` into ``path``."""
        args = ["save", "-o", path, ref] if self.kind == "docker" else ["save", "--format", "docker-archive",
                                                                        "-o", path, ref]
        self.run(args, f"{self.prefix}{ref}")

    def close(self) -> None:
        pass


def graph_dirs(info: dict) -> list:
    """The layer dirs (top first) an image inspect's ``GraphDriver`` names; NotUnpacked for none.

    overlay2 (Docker) and overlay (containers/storage) give ``UpperDir`` and a ``:``-separated
    ``LowerDir``; vfs and Docker's containerd image store give no dirs.

    >>> graph_dirs({"GraphDriver": {"Name": "overlay2", "Data": {"LowerDir": "/d/b/diff:/d/a/diff",
    ...                                                        "UpperDir": "/d/c/diff", "MergedDir": "/d/c/merged"}}})
    ['/d/c/diff', '/d/b/diff', '/d/a/diff']
    >>> graph_dirs({"GraphDriver": {"Name": "vfs", "Data": None}})
    Traceback (most recent call last):
        ...
    compat_hook.images.snapshots.NotUnpacked: the vfs graph driver names no layer dirs
    """
    gd = info.get("GraphDriver") if isinstance(info.get("GraphDriver"), dict) else {}
    name = gd.get("Name")
    data = gd.get("Data") if isinstance(gd.get("Data"), dict) else {}
    if name in ("overlay2", "overlay") and isinstance(data.get("UpperDir"), str):
        lower = data.get("LowerDir") if isinstance(data.get("LowerDir"), str) else ""
        dirs = [data["UpperDir"]] + [d for d in lower.split(":") if d]
        if all(d.startswith("/") for d in dirs):
            return dirs
    raise NotUnpacked(f"the {str(name)[:20]} graph driver names no layer dirs")


def _image_error(msg: str):
    from ..core.errors import ImageError

    return ImageError(msg)
