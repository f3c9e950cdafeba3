"""``compat-hook install|uninstall podman``: the hooks.d file, nothing else.

Podman needs no runtime registration: it reads hooks.d for every container.
Podman 4.x reads only ``/usr/share/containers/oci/hooks.d`` unless
``--hooks-dir`` or ``hooks_dir`` in containers.conf say otherwise, so that is
where the file goes (see :mod:`compat_hook.install.hooksd`). ``--engine-config FILE``
names the hooks.d file itself, ``--hooks-dir DIR`` its directory. The env mode
(``LD_LIBRARY_PATH``) needs the runtime wrapper instead (``podman --runtime
WRAPPER``, docs/engines.md); ``install podman`` refuses a configuration with
``mode: env``, which the hook alone can never apply.
"""

from __future__ import annotations

from . import hooksd

__all__ = ["install", "uninstall"]


def install(opts) -> int:
    hooksd.check_args(opts, "podman")
    if opts.set_as_default:
        hooksd.say("note: --set-as-default has no meaning for podman (hooks.d applies to every runtime)")
    return hooksd.install(opts, "podman")


def uninstall(opts) -> int:
    hooksd.check_args(opts, "podman")
    return hooksd.uninstall(opts, "podman")
