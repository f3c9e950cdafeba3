"""Open a ``plan`` source: a rootfs or bundle dir, or an image read without unpacking it.

Every source yields an object with ``root`` (the filesystem as the container
will see it, with the reading methods of :class:`~compat_hook.rootfs.Root`)
and ``env`` (the image config's ``Env``, or the bundle's ``process.env``),
usable as a context manager.
"""

from __future__ import annotations

import os

from .errors import UsageError

__all__ = ["open_source", "expand", "TRANSPORTS"]

TRANSPORTS = ("oci:", "oci-archive:", "docker-archive:", "containerd:", "docker:", "containers-storage:")


def open_source(source: str, config=None, *, address: str | None = None, namespace: str = "k8s.io"):
    """The image behind ``source`` (see the module docstring)."""
    if source.startswith(TRANSPORTS):
        from . import images

        return images.open_image(source, address=address, namespace=namespace)
    if os.path.isdir(source):
        from .plan import open_dir

        return open_dir(source)
    raise UsageError(f"{source}: not a directory, nor {', '.join(t + '...' for t in TRANSPORTS)}")


def expand(source: str, *, address: str | None = None, namespace: str = "k8s.io") -> list:
    """One source per image: ``containerd:``, ``docker:`` and ``containers-storage:`` list every image,
    a layout or archive every tag."""
    if source.startswith(TRANSPORTS):
        from . import images

        return images.expand_sources([source], address=address, namespace=namespace)
    return [source]
