"""The runtime wrapper: the one renderer, and which file each engine registration names.

The wrapper is ``compat_hook/data/compat-hook-runtime.sh`` with absolute
paths filled in (:func:`render_wrapper`): a runc-compatible runtime for
containerd's ``BinaryName``, Docker's ``runtimes.<name>.path`` and CRI-O's
``runtime_path``. Every verb but ``create``/``run`` execs the real runtime
from shell builtins (~1 ms); those two start Python through
:func:`compat_hook.registration.boot_code` (``target="runtime"``).

**One wrapper per node.** ``install containerd|docker|crio`` name the same
file, rendered the same way, so installing for several engines never
rewrites it back and forth:

1. ``--wrapper-path PATH`` when given;
2. else the Debian package's ``/usr/libexec/compat-hook/compat-hook-runtime``
   when the package is installed (dpkg lists the file); it is dpkg's: never
   written or removed here, and a registration that needs another rendering
   (``--hook-config``, ``--state-dir``, ``on_error: fail``) is refused with a
   pointer to ``--wrapper-path``;
3. else ``/usr/local/libexec/compat-hook/compat-hook-runtime``.

``uninstall`` removes the wrapper (with the backups earlier installs left of
it and its ``compat-hook`` directory when that is left empty) unless another
engine's registration still names it.

The pip console script ``compat-hook-runtime`` (``compat_hook.runtime:main``)
does the same job in Python, starting an interpreter on every runtime verb
(+15-20 ms each): it is for trying the wrapper by hand, never what ``install``
registers.
"""

from __future__ import annotations

import os

__all__ = ["render_wrapper", "DEFAULT_WRAPPER_PATH", "PACKAGED_WRAPPER_PATH", "WRAPPER_MARK", "is_wrapper",
           "wrapper_for", "wrapper_change", "wrapper_removal", "fail_closed"]

#: Where ``install`` writes the wrapper when neither --wrapper-path nor the Debian package say otherwise.
DEFAULT_WRAPPER_PATH = "/usr/local/libexec/compat-hook/compat-hook-runtime"
#: The Debian package's copy (packaging/debian/build-deb.py renders it for /usr/bin/python3).
PACKAGED_WRAPPER_PATH = "/usr/libexec/compat-hook/compat-hook-runtime"
PACKAGED_PYTHON = "/usr/bin/python3"
PACKAGED_PATHS = ("/usr/lib/python3/dist-packages",)
WRAPPER_MARK = "#!/bin/sh\n# compat-hook-runtime:"


def render_wrapper(config_path: str | None = None, *, python: str | None = None,
                   paths: list | None = None, state_dir: str | None = None, fail_closed: bool = False) -> str:
    """The shell wrapper's text with absolute paths filled in.

    ``config_path``: the config it reads when ``COMPAT_HOOK_CONFIG`` is unset
    (default ``/etc/compat-hook/config.yaml``); ``python``: the interpreter
    (default: the real one running this); ``paths``: its ``sys.path`` head
    (default: where compat_hook, PyYAML and pyelftools live); ``state_dir``:
    the cache dir the Python part uses unless ``COMPAT_HOOK_STATE_DIR`` is set
    (default /var/lib/compat-hook); ``fail_closed``: ``on_error: fail`` at
    registration (a create whose compat-hook cannot start fails instead of
    running the real runtime without it).

    >>> text = render_wrapper("/etc/x.yaml", python="/usr/bin/python3", paths=["/p"])
    >>> text.startswith(WRAPPER_MARK) and "ch_config=/etc/x.yaml" in text and "ch_fail=''" in text
    True
    """
    import shlex

    from ..config import DEFAULT_PATH
    from ..registration import boot_code, interpreter, python_paths

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "data", "compat-hook-runtime.sh"), encoding="utf-8") as f:
        text = f.read()
    values = {"@PYTHON@": python or interpreter(),
              "@BOOT@": boot_code(paths if paths is not None else python_paths(), target="runtime"),
              "@CONFIG@": os.path.abspath(config_path) if config_path else DEFAULT_PATH,
              "@STATE@": os.path.abspath(state_dir) if state_dir else "",
              "@FAIL@": "1" if fail_closed else ""}
    for k, v in values.items():
        text = text.replace(f"={k}\n", f"={shlex.quote(v)}\n", 1)
    return text


def is_wrapper(text: str | None) -> bool:
    return bool(text) and text.startswith(WRAPPER_MARK)


def fail_closed(hook_config: str | None) -> bool:
    """``on_error: fail`` in the configuration a registration names (read now, at registration)."""
    from .checks import registered_config

    return registered_config(hook_config)[0].on_error == "fail"


def _hook_config(opts) -> str:
    from ..config import DEFAULT_PATH

    return os.path.abspath(opts.hook_config) if opts.hook_config else DEFAULT_PATH


def _packaged_wrapper() -> bool:
    from . import hooksd

    return os.path.isfile(PACKAGED_WRAPPER_PATH) and hooksd.packaged(PACKAGED_WRAPPER_PATH)


def wrapper_for(opts) -> tuple:
    """``(path, text or None)``: the wrapper a registration names and, unless it is the packaged one, its text."""
    from .hooksd import InstallError

    cfg = _hook_config(opts)
    closed = fail_closed(opts.hook_config)
    state = os.path.abspath(opts.state_dir) if opts.state_dir else None
    if opts.wrapper_path:
        return os.path.abspath(opts.wrapper_path), render_wrapper(cfg, state_dir=state, fail_closed=closed)
    if _packaged_wrapper():
        want = render_wrapper(cfg, python=PACKAGED_PYTHON, paths=list(PACKAGED_PATHS), state_dir=state,
                              fail_closed=closed)
        with open(PACKAGED_WRAPPER_PATH, encoding="utf-8", errors="replace") as f:
            have = f.read()
        if have != want:
            raise InstallError(
                f"the compat-hook package's wrapper {PACKAGED_WRAPPER_PATH} reads /etc/compat-hook/config.yaml "
                f"with the default state dir and fails open; this registration needs another one "
                f"(--hook-config, --state-dir or on_error: fail): add --wrapper-path PATH to write it there")
        return PACKAGED_WRAPPER_PATH, None
    return DEFAULT_WRAPPER_PATH, render_wrapper(cfg, state_dir=state, fail_closed=closed)


def wrapper_change(opts) -> list:
    """The :class:`~compat_hook.install.files.Change` writing the wrapper (mode 0755); ``[]``: the packaged one."""
    from .files import Change
    from .hooksd import InstallError

    path, text = wrapper_for(opts)
    if text is None:
        return []
    change = Change(path, text, mode=0o755, backup=False, ours=True, prune=True)
    if os.path.lexists(path) and not os.path.isfile(path):
        raise InstallError(f"{path} exists and is not a regular file")
    if change.old is not None and change.changed and not is_wrapper(change.old):
        raise InstallError(f"{path} exists and is not compat-hook's runtime wrapper; "
                           f"move it away or use --wrapper-path")
    return [change]


def wrapper_removal(path, own_config: str, *, keep: str | None = None) -> list:
    """Remove the wrapper at ``path`` unless another engine's registration still names it.

    ``keep``: the wrapper the registration now names (a re-install moving from
    one wrapper to another removes the old one only). The packaged wrapper is
    dpkg's and never removed here.
    """
    from . import hooksd
    from .files import Change

    if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isfile(path) or path == keep:
        return []
    if hooksd.packaged(path):
        return []
    change = Change(path, None, ours=True, prune=True)
    if not is_wrapper(change.old):
        hooksd.say(f"note: left {path} alone: it is not compat-hook's runtime wrapper")
        return []
    for other in hooksd.ENGINE_FILES:
        if os.path.abspath(other) == os.path.abspath(own_config):
            continue
        text = None
        try:
            with open(other, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            pass
        if text and path in text:
            hooksd.say(f"note: kept {path}: {other} still uses it")
            return []
    return [change]
