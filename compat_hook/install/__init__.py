"""``compat-hook install|uninstall ENGINE``: registration with container engines.

One module per engine (``containerd``, ``podman``, ``crio``, ``docker``), each
exposing ``install(args) -> int`` and ``uninstall(args) -> int`` where
``args`` is the argparse namespace of the command (see ``cli._parser``). All
of them are idempotent, write atomically (temp file + rename, backup of what
they replace) and print a unified diff instead of writing with ``--dry-run``.
Shared helpers live in :mod:`compat_hook.install.files`.
"""

from __future__ import annotations

import importlib

__all__ = ["run_install", "ENGINES"]

ENGINES = ("containerd", "podman", "crio", "docker")


def run_install(args, uninstall: bool = False) -> int:
    mod = importlib.import_module(f"compat_hook.install.{args.engine}")
    return (mod.uninstall if uninstall else mod.install)(args)
