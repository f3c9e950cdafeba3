"""``compat-hook install|uninstall podman``: the hooks.d file, nothing else.

Podman needs no runtime registration: it reads hooks.d for every container
(``/usr/share/containers/oci/hooks.d`` by default; see
:mod:`compat_hook.install.hooksd`). ``--config FILE`` names the hooks.d file
itself, ``--hooks-dir DIR`` its directory. The env mode (``LD_LIBRARY_PATH``)
needs the runtime wrapper instead: ``podman --runtime /usr/bin/compat-hook-runtime``
(docs/engines.md).
"""

from __future__ import annotations

from . import hooksd

__all__ = ["install", "uninstall"]


def _notes(args) -> None:
    if getattr(args, "set_as_default", False):
        hooksd.say("note: --set-as-default has no meaning for podman (hooks.d applies to every runtime)")


def install(args) -> int:
    hooksd.check_args(args, "podman")
    _notes(args)
    return hooksd.install(args, "podman")


def uninstall(args) -> int:
    hooksd.check_args(args, "podman")
    return hooksd.uninstall(args, "podman")
