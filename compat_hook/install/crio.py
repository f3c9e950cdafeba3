"""``compat-hook install|uninstall crio``: the hooks.d file plus a runtime drop-in.

Two files:

* the hooks.d file (:mod:`compat_hook.install.hooksd`), which CRI-O applies to
  every container of every runtime handler, so the ldconfig mode works with
  no further setting (CRI-O watches its hooks dirs; no restart needed);
* ``/etc/crio/crio.conf.d/99-compat-hook.toml`` (``--engine-config`` overrides it),
  registering the runtime wrapper as a runtime handler for the env mode, the
  host store's spec mounts and Kubernetes RuntimeClasses (``handler:
  cuda-compat``)::

      [crio.runtime.runtimes.cuda-compat]
      runtime_path = "/usr/local/libexec/compat-hook/compat-hook-runtime"
      runtime_type = "oci"

  (the node's one wrapper, :mod:`compat_hook.install.wrapper`: ``--wrapper-path``,
  else the Debian package's, else ``/usr/local/libexec/...``).
  ``--set-as-default`` adds ``[crio.runtime] default_runtime``; the ``99-``
  prefix loads the file after other drop-ins, so that default wins.

The drop-in is edited with tomlkit (other tables and comments in it stay) and
never backed up next to itself: CRI-O loads every file in crio.conf.d, so a
backup there would register the handler again. ``uninstall`` removes our
table, the default when it names it, the file when nothing else is left in it,
the hooks.d file, and the wrapper unless another engine still names it. CRI-O
reads runtimes at start: ``systemctl restart crio`` afterwards (never done by
these commands).
"""

from __future__ import annotations

import os

from . import hooksd
from .common import tomlkit_module
from .hooksd import InstallError

__all__ = ["DEFAULT_DROPIN", "install", "uninstall", "render_dropin"]

DEFAULT_DROPIN = "/etc/crio/crio.conf.d/99-compat-hook.toml"
HEADER = ("compat-hook: the runtime wrapper as a CRI-O runtime handler "
          "(compat-hook install crio; removed by compat-hook uninstall crio)")


def _parse(path: str, text: str | None):
    tomlkit = tomlkit_module()
    if text is None:
        doc = tomlkit.document()
        doc.add(tomlkit.comment(HEADER))
        return doc
    try:
        return tomlkit.parse(text)
    except Exception as e:  # tomlkit.exceptions.ParseError and friends
        raise InstallError(f"{path}: not valid TOML ({e}); fix it first, nothing was changed") from None


def _table(parent, key: str, tomlkit):
    t = parent.get(key)
    if t is None:
        t = tomlkit.table(is_super_table=True)  # no empty [crio] header
        parent[key] = t
    elif not isinstance(t, dict):
        raise InstallError(f"crio drop-in: {key!r} must be a table")
    return t


def render_dropin(text: str | None, path: str, *, name: str, wrapper: str | None,
                  set_default: bool, remove: bool) -> str | None:
    """The new drop-in text (None: delete the file)."""
    tomlkit = tomlkit_module()
    doc = _parse(path, text)
    if remove:
        crio = doc.get("crio")
        runtime = crio.get("runtime") if isinstance(crio, dict) else None
        if not isinstance(runtime, dict):
            return text
        runtimes = runtime.get("runtimes")
        if isinstance(runtimes, dict) and name in runtimes:
            del runtimes[name]
            if not runtimes:
                del runtime["runtimes"]
        if runtime.get("default_runtime") == name:
            del runtime["default_runtime"]
        if not runtime:
            del crio["runtime"]
        if not crio:
            del doc["crio"]
        if not doc:  # nothing but comments left: the file was ours alone
            return None
        return tomlkit.dumps(doc)
    crio = _table(doc, "crio", tomlkit)
    runtime = _table(crio, "runtime", tomlkit)
    if set_default:
        runtime["default_runtime"] = name
    runtimes = _table(runtime, "runtimes", tomlkit)
    entry = runtimes.get(name)
    if entry is None:
        entry = tomlkit.table()
        runtimes[name] = entry
    if entry.get("runtime_path") != wrapper:
        entry["runtime_path"] = wrapper
    if entry.get("runtime_type") != "oci":
        entry["runtime_type"] = "oci"
    return tomlkit.dumps(doc)


def _runtime_path(text: str | None, path: str, name: str):
    if text is None:
        return None
    doc = _parse(path, text).unwrap()
    entry = (((doc.get("crio") or {}).get("runtime") or {}).get("runtimes") or {}).get(name)
    return entry.get("runtime_path") if isinstance(entry, dict) else None


def _dropin_change(opts, remove: bool, wrapper: str | None = None):
    from .files import Change

    path = os.path.abspath(opts.config or DEFAULT_DROPIN)
    change = Change(path, None, mode=None)
    if change.old is None and remove:
        return None
    new = render_dropin(change.old, path, name=opts.runtime_name, wrapper=wrapper,
                        set_default=opts.set_as_default, remove=remove)
    if new is not None and change.old is not None:
        if _parse(path, change.old).unwrap() == _parse(path, new).unwrap():
            new = change.old  # the same settings: leave the bytes alone
    change.new = new
    return change


def install(opts) -> int:
    from .checks import enforce, registered_config
    from .files import missing_dirs
    from .wrapper import wrapper_path

    hooksd.check_args(opts, "crio")
    enforce(opts.hook_config, "wrapper", hooksd.say, hook_elsewhere=True)
    if registered_config(opts.hook_config)[0].mode == "env":
        hooksd.say(f"warning: mode: env takes effect only for pods of the runtime handler {opts.runtime_name!r} "
                   f"(runtimeClassName); the hooks.d hook cannot set LD_LIBRARY_PATH")
    hooks = hooksd.changes(opts, "crio")
    created = missing_dirs(os.path.dirname(hooks[0].path))
    path = wrapper_path(opts)
    wrapper = hooksd.wrapper_change(opts)
    dropin = _dropin_change(opts, remove=False, wrapper=path)
    old = _runtime_path(dropin.old, dropin.path, opts.runtime_name)
    from .daemons import running
    from .wrapper import users

    # The running crio and conmon still name the old one until a restart / their containers' end.
    wrapper += hooksd.wrapper_removal(old, dropin.path, keep=path, engine="crio", users_of=lambda p: users(p),
                                      daemons=running("crio", os.path.dirname(dropin.path)))
    hooksd.run([(hooks + wrapper + [dropin], False)], opts, "crio", verb="registered",
               after=f"crio: hook {hooks[0].path} (used by new containers at once) and runtime handler "
                     f"{opts.runtime_name!r} -> {path} in {dropin.path}; restart CRI-O to load "
                     f"the handler (systemctl restart crio)")
    if created and not opts.dry_run:
        hooksd._record_created(created[0], created)
    hooksd.note_dir(os.path.dirname(hooks[0].path), "crio")
    return 0


def uninstall(opts) -> int:
    hooksd.check_args(opts, "crio")
    hooks = hooksd.removals(opts, "crio", keep_packaged=True)
    dropin = _dropin_change(opts, remove=True)
    groups = [(hooks, False)]
    if dropin is None:  # a pass-through an earlier uninstall left: removed once no conmon runs it
        from .wrapper import DEFAULT_WRAPPER_PATH, pass_through_cleanup, users

        groups.append((pass_through_cleanup(os.path.abspath(opts.wrapper_path or DEFAULT_WRAPPER_PATH),
                                            lambda p: users(p), "crio"), False))
    else:
        groups.append(([dropin], False))
        wrapper = _runtime_path(dropin.old, dropin.path, opts.runtime_name)
        from .daemons import running
        from .wrapper import users

        groups.append((hooksd.wrapper_removal(wrapper, dropin.path, engine="crio", users_of=lambda p: users(p),
                                              daemons=running("crio", os.path.dirname(dropin.path))), False))
    hooksd.run(groups, opts, "crio", verb="unregistered",
               after="crio: unregistered; restart CRI-O to drop the runtime handler "
                     "(systemctl restart crio)")
    if not opts.dry_run:
        hooksd._remove_created(os.path.dirname(hooksd.target_path(opts)))
    return 0
