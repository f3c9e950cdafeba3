"""The hooks.d registration shared by Podman and CRI-O (oci-hooks(5), schema 1.0.0).

One file, ``50-compat-hook.json``, in the directory both engines read without
any configuration, ``/usr/share/containers/oci/hooks.d`` (``--hooks-dir``
overrides it). Podman 4.3 reads only that directory by default (verified on
Debian's 4.3.1: a file in ``/etc/containers/oci/hooks.d`` was ignored unless
``hooks_dir`` in containers.conf or ``--hooks-dir`` names it); CRI-O reads it
and ``/etc/containers/oci/hooks.d``, where a same-named file masks ours.

``when`` is ``{"always": true}``. hooks.d can match annotations, the
command (``process.args[0]``) and the presence of bind mounts, but not the
process env, and a GPU request is an env variable (``NVIDIA_VISIBLE_DEVICES``)
or a device; an annotation condition would make users annotate every GPU
container, and Podman sets none for ``--device nvidia.com/gpu=...``. So the
hook fires for every container and skips non-GPU containers itself: its fast
path decides ``no_gpu_request`` from config.json without reading any host or
image fact (one interpreter start, ~17 ms on the CI machine kind, see
docs/background.md "Test machines").

The stage is ``createContainer``: it runs in the container's mount namespace
before pivot_root with the host filesystem visible, which the ldconfig mode
and the host-store bind mount need.

The hook entry is :func:`compat_hook.core.registration.hook_entry` (``-I -S``, an
explicit ``env``, the fail-open boot code; ``--fail-closed`` when the
configuration says ``on_error: fail``). An interpreter that is
``/usr/bin/python3.11`` because ``/usr/bin/python3`` links to it is written as
``/usr/bin/python3``, so a distribution upgrade to the next Python minor
version does not leave every container start pointing at a removed binary.

The Debian package ships the same file (``packaging/debian``); on such a
system ``install podman`` finds it unchanged, and a file owned by the package
is never rewritten or removed by these commands (that is dpkg's job).
"""

from __future__ import annotations

import os

from ..core.errors import UsageError
from .common import ENGINE_FILES, InstallError, packaged, say  # noqa: F401  (the engines import them from here)

__all__ = ["DEFAULT_DIR", "OVERRIDE_DIR", "FILE_NAME", "InstallError", "document", "render",
           "target_path", "is_ours", "packaged", "changes", "removals", "install", "uninstall",
           "stable_interpreter", "package_document", "wrapper_change", "wrapper_removal", "run",
           "note_dir", "say", "check_args", "WRAPPER_MARK", "ENGINE_FILES"]

DEFAULT_DIR = "/usr/share/containers/oci/hooks.d"
OVERRIDE_DIR = "/etc/containers/oci/hooks.d"
FILE_NAME = "50-compat-hook.json"
STAGE = "createContainer"
_MARK = "compat_hook.cli"


# --------------------------------------------------------------------------- the document


def stable_interpreter(exe: str) -> str:
    """See :func:`compat_hook.core.registration.stable_interpreter`."""
    from ..core.registration import stable_interpreter as _stable

    return _stable(exe)


def document(opts, *, log_file=None) -> dict:
    """The hooks.d document for the running installation (``--hook-config``, ``--state-dir`` apply).

    ``log_file``: where a failed start is logged (default: the configuration's ``log_file``, read now).
    """
    from ..core.registration import hook_entry, hooksd_document, registered_log_file
    from .wrapper import fail_closed

    entry = hook_entry(stage=STAGE, config=opts.hook_config, state_dir=opts.state_dir,
                       fail_closed=fail_closed(opts.hook_config),
                       log_file=log_file or registered_log_file(opts.hook_config))
    return hooksd_document(entry, stages=[STAGE])


def package_document(python: str = "/usr/bin/python3",
                     paths=("/usr/lib/python3/dist-packages",), config: str | None = None) -> dict:
    """The document the Debian package ships (the installed locations, not this tree's)."""
    from ..core.registration import hook_entry, hooksd_document

    return hooksd_document(hook_entry(stage=STAGE, config=config, python=python, paths=list(paths),
                                      log_file="/var/log/compat-hook.log"), stages=[STAGE])


def render(doc: dict) -> str:
    import json

    return json.dumps(doc, indent=2) + "\n"


def is_ours(text: str | None) -> bool:
    """True when ``text`` is a hooks.d document whose hook runs compat-hook."""
    if not text:
        return False
    import json

    try:
        doc = json.loads(text)
    except ValueError:
        return False
    hook = doc.get("hook") if isinstance(doc, dict) else None
    args = hook.get("args") if isinstance(hook, dict) else None
    return isinstance(args, list) and any(isinstance(a, str) and _MARK in a for a in args)


def target_path(opts) -> str:
    """``--engine-config`` (podman: the file itself) or ``--hooks-dir`` / the default dir + ``50-compat-hook.json``."""
    if opts.engine == "podman" and opts.config:
        return os.path.abspath(opts.config)
    return os.path.join(os.path.abspath(opts.hooks_dir or DEFAULT_DIR), FILE_NAME)


# --------------------------------------------------------------------------- the runtime wrapper
# Docker and CRI-O register the same wrapper as containerd (compat_hook.install.wrapper).
from .wrapper import WRAPPER_MARK  # noqa: E402  (the mark a rendered wrapper starts with)


def wrapper_change(opts) -> list:
    """See :func:`compat_hook.install.wrapper.wrapper_change`."""
    from .wrapper import wrapper_change as _change

    return _change(opts)


def wrapper_removal(path, own_config: str, *, keep: str | None = None, users_of=None, engine: str = "ENGINE",
                    daemons=()) -> list:
    """See :func:`compat_hook.install.wrapper.wrapper_removal`."""
    from .wrapper import wrapper_removal as _removal

    return _removal(path, own_config, keep=keep, users_of=users_of, engine=engine, daemons=daemons)


# --------------------------------------------------------------------------- commands


def changes(opts, engine: str) -> list:
    """The :class:`~compat_hook.install.files.Change` that registers the hook (may be unchanged)."""
    from .files import Change

    path = target_path(opts)
    change = Change(path, render(document(opts)), mode=0o644, backup=False, ours=True)
    old = change.old
    if old is None and os.path.lexists(path) and not os.path.isfile(path):
        raise InstallError(f"{path} exists and is not a regular file")
    if old is not None and change.changed and packaged(path):
        from .wrapper import PACKAGED_LOG

        if old == render(document(opts, log_file=PACKAGED_LOG)):
            change.new = old  # the package's file; it logs a failed start to the package's default log
    if old is not None and change.changed:
        if not is_ours(old):
            raise InstallError(f"{path} exists and is not compat-hook's; move it away or use --hooks-dir")
        if packaged(path):
            raise InstallError(
                f"{path} belongs to the compat-hook package and differs from this registration; "
                f"change /etc/compat-hook/config.yaml (the packaged hook reads it) instead of "
                f"--hook-config, or register elsewhere with --hooks-dir")
    return [change]


def removals(opts, engine: str, *, keep_packaged: bool = False) -> list:
    """The Change that removes our hooks.d file (empty when there is none).

    A file of the Debian package is dpkg's: an error, or with ``keep_packaged``
    a note (CRI-O's uninstall still removes its runtime handler).
    """
    from .files import Change

    path = target_path(opts)
    change = Change(path, None, ours=True)
    if change.old is None:
        return []
    if not is_ours(change.old):
        raise InstallError(f"{path} is not compat-hook's; not removing it")
    if packaged(path):
        msg = (f"{path} belongs to the compat-hook package; remove the package "
               f"(apt remove compat-hook) to unregister the hook")
        if keep_packaged:
            say(f"note: {msg}")
            return []
        raise InstallError(msg)
    return [change]


def run(groups: list, opts, engine: str, *, verb: str, after: str = "") -> int:
    """Apply (or, with ``--dry-run``, diff) groups of ``(changes, backup)``; say what happened.

    Files compat-hook generates whole (the hooks.d file) are replaced without
    a backup; files that may hold someone else's settings get one.
    """
    from . import files

    dry = opts.dry_run
    changed = False
    for chs, backup in groups:
        if any(c.changed for c in chs):
            files.apply(chs, dry_run=dry, backup=backup)
            changed = True
    if not changed:
        say(f"{engine}: already {verb}; nothing changed")
    elif not dry and after:
        say(after)
    return 0


#: Beside our hooks.d file: the dirs install created for it (not ``*.json``: the engines skip it).
CREATED_MARK = ".compat-hook-created-dirs"


def _record_created(d: str, created: list) -> None:
    from .files import write_atomic

    write_atomic(os.path.join(d, CREATED_MARK), "\n".join(created) + "\n", mode=0o644, backup=False)


def _remove_created(d: str) -> None:
    """After our file went: the dirs install created for it, when nothing else is in them."""
    mark = os.path.join(d, CREATED_MARK)
    try:
        with open(mark, encoding="utf-8") as f:
            created = [ln for ln in f.read().splitlines() if ln.startswith("/")]
    except OSError:
        return
    if any(n != CREATED_MARK for n in os.listdir(d)):
        return
    os.unlink(mark)
    for c in created:  # deepest first
        try:
            os.rmdir(c)
        except OSError:  # not empty: someone else's files
            return
        say(f"removed {c}/")


def install(opts, engine: str = "podman") -> int:
    """Write the hooks.d file; 0 whether it changed or was already there."""
    from .checks import enforce
    from .files import missing_dirs

    enforce(opts.hook_config, "hook", say)
    ch = changes(opts, engine)
    created = missing_dirs(os.path.dirname(ch[0].path))
    run([(ch, False)], opts, engine, verb="registered",
        after=f"{engine}: the createContainer hook {ch[0].path} is in place; it fires for every "
              f"container and skips those that request no GPU")
    if created and not opts.dry_run:
        _record_created(created[0], created)
    note_dir(os.path.dirname(ch[0].path), engine)
    return 0


def uninstall(opts, engine: str = "podman") -> int:
    rm = removals(opts, engine)
    status = run([(rm, False)], opts, engine, verb="unregistered")
    if not opts.dry_run:
        _remove_created(os.path.dirname(target_path(opts)))
    return status


def note_dir(d: str, engine: str) -> None:
    if engine == "podman" and d != DEFAULT_DIR:
        say(f"note: podman reads {d} only with --hooks-dir {d} or hooks_dir in containers.conf")
    elif engine == "crio" and d not in (DEFAULT_DIR, OVERRIDE_DIR):
        say(f"note: CRI-O reads {d} only if crio.runtime.hooks_dir lists it")


def check_args(opts, engine: str) -> None:
    if opts.via not in (None, "wrapper"):
        raise UsageError(f"--via {opts.via} is containerd-only; {engine} uses hooks.d")
