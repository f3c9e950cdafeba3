"""Will the configuration take effect on the path it is registered for? Asked at install time.

A registration is one of two *paths*: ``"hook"`` (the createContainer hook
alone: Podman's and CRI-O's hooks.d, containerd's ``--via base-spec``) or
``"wrapper"`` (the runtime wrapper, which edits the spec and adds the hook
when the decision needs rootfs effects: containerd's BinaryName, Docker,
CRI-O's runtime handler). :func:`problems` returns what would not work:

* ``error``: the registration would break containers (the wrapper's
  ``runtime:`` cannot be found); ``install`` refuses (exit 1) and says what
  to change;
* ``warning``: it cannot take effect as configured (``mode: env`` on the
  hook alone, ``dry_run: true``): printed with the install's result, since
  the configuration is read at every start and may change before the next.

``install`` reads the configuration the registered hook will read (the
``--hook-config`` file, or ``/etc/compat-hook/config.yaml``; never
``$COMPAT_HOOK_CONFIG``, which the hook ignores). A file that does not exist
yet means the defaults plus a note; one that does not validate is refused
(exit 2), since every start would then fail open with an error line.

>>> from compat_hook.core.config import from_mapping
>>> problems(from_mapping({"mode": "env"}), "hook")[0][0]
'warning'
>>> problems(from_mapping({}), "wrapper")
[]
"""

from __future__ import annotations

import os

__all__ = ["registered_config", "problems", "enforce"]


def registered_config(hook_config: str | None):
    """``(Config, note or None)`` for the file a registration names (:func:`compat_hook.core.config.registered`)."""
    from ..core import config as _config

    return _config.registered(hook_config)


def problems(cfg, path: str, *, hook_elsewhere: bool = False) -> list:
    """``[(level, message)]`` for config ``cfg`` registered on ``path`` (``"hook"`` or ``"wrapper"``).

    ``hook_elsewhere``: the registration also installs the hook by itself (CRI-O's hooks.d file).
    """
    out = []
    if (path == "wrapper" and not hook_elsewhere and cfg.mode in ("ldconfig", "both")
            and not getattr(cfg, "wrapper_add_hook", True)):
        out.append(("warning", "wrapper_add_hook: false: in ldconfig mode the wrapper alone changes no ld "
                               "cache, so compat is never turned on unless the hook is registered another "
                               "way (hooks.d, a base_runtime_spec)"))
    if cfg.mode == "env" and path == "hook":
        out.append(("warning", "mode: env sets LD_LIBRARY_PATH, which only the runtime wrapper can do; this "
                               "registration runs the hook alone, so compat is never turned on until the "
                               "mode is ldconfig or both (or register the wrapper: containerd --via wrapper, "
                               "docker, crio's runtime handler, podman --runtime)"))
    if cfg.dry_run:
        out.append(("warning", "dry_run: true: decisions are logged, nothing is changed"))
    if path == "wrapper":
        from ..core.realruntime import RuntimeNotFound, resolve_runtime

        try:
            resolve_runtime(cfg.runtime)
        except RuntimeNotFound as e:
            out.append(("error", f"runtime: {e}: every container of this runtime would fail to start"))
        else:
            if cfg.runtime.startswith("/") and not os.access(cfg.runtime, os.X_OK):
                out.append(("error", f"runtime: {cfg.runtime} is not an executable file: every container "
                                     f"of this runtime would fail to start"))
    return out


def enforce(hook_config: str | None, path: str, say, *, hook_elsewhere: bool = False) -> None:
    """Print notes and warnings through ``say``; raise InstallError on an error."""
    from .common import InstallError

    cfg, note = registered_config(hook_config)
    if note:
        say(note)
    errors = []
    for level, msg in problems(cfg, path, hook_elsewhere=hook_elsewhere):
        if level == "error":
            errors.append(msg)
        else:
            say(f"warning: {msg}")
    if errors:
        where = cfg.source or "the default configuration"
        raise InstallError(f"{where}: {errors[0]}")
