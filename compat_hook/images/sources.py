"""Open a ``plan`` source: a rootfs or bundle dir, or an image read without unpacking it.

Every source yields an object with ``root`` (the filesystem as the container
will see it, with the reading methods of :class:`~compat_hook.facts.rootfs.Root`)
and ``env`` (the image config's ``Env``, or the bundle's ``process.env``),
usable as a context manager.
"""

from __future__ import annotations

import os

from ..core.errors import UsageError
from .reader import TRANSPORTS  # the one list: images/reader opens them

__all__ = ["open_source", "open_dir", "expand", "TRANSPORTS"]


def open_source(source: str, config=None, *, address: str | None = None, namespace: str = "k8s.io", reader=None):
    """The image behind ``source`` (see the module docstring); ``reader``: the
    :class:`~compat_hook.images.reader.Reader` to read it with (default: the process's, which keeps its
    caches and spooled files until the process ends; a long-running caller gives its own and closes it)."""
    if source.startswith(TRANSPORTS):
        from . import reader as images

        # the snapshotter's and graph driver's layer dirs are node paths: read under host_root
        return images.open_image(source, address=address, namespace=namespace, reader=reader,
                                 host_root=getattr(config, "host_root", None))
    if os.path.isdir(source):
        return open_dir(source)
    raise UsageError(f"{source}: not a directory, nor {', '.join(t + '...' for t in TRANSPORTS)}")


def expand(source: str, *, address: str | None = None, namespace: str = "k8s.io", reader=None) -> list:
    """One source per image: ``containerd:``, ``docker:`` and ``containers-storage:`` list every image,
    a layout or archive every tag (``reader`` as for :func:`open_source`)."""
    if source.startswith(TRANSPORTS):
        from . import reader as images

        return images.expand_sources([source], address=address, namespace=namespace, reader=reader)
    return [source]


class _DirImage:
    """A rootfs dir or an OCI bundle dir as a plan source (env from the bundle's config.json)."""

    def __init__(self, path: str) -> None:
        from ..facts import oci
        from ..facts.rootfs import Root

        self.env = []
        rootfs = path
        if os.path.isfile(os.path.join(path, "config.json")):
            spec = oci.load_spec(path)
            rootfs = oci.rootfs_path(path, spec)
            proc = spec.get("process") if isinstance(spec.get("process"), dict) else {}
            self.env = [e for e in proc.get("env") or [] if isinstance(e, str)]
        self.root = Root(rootfs)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.root.close()


def open_dir(path: str):
    """A rootfs dir or an OCI bundle dir, opened for reading."""
    return _DirImage(path)
