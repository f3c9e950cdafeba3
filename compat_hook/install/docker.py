"""``compat-hook install|uninstall docker``: a ``runtimes`` entry in daemon.json.

Docker has no drop-ins and no hooks.d: the runtime wrapper is registered in
``/etc/docker/daemon.json`` (``--engine-config`` overrides the path)::

    "runtimes": {"cuda-compat": {"path": "/usr/local/libexec/compat-hook/compat-hook-runtime"}}

and used per container (``docker run --runtime cuda-compat``) or for every
container with ``--set-as-default`` (``"default-runtime": "cuda-compat"``).
The wrapper is the node's one wrapper (:mod:`compat_hook.install.wrapper`:
``--wrapper-path``, else the Debian package's, else
``/usr/local/libexec/compat-hook/compat-hook-runtime``), rendered with
``--hook-config`` and ``--state-dir``; it execs the config's ``runtime:``
(runc by default) for every verb.
Every other key, their order and the file's indentation (detected: two
spaces, four, a tab, or one line) are kept, and a file whose settings would
not change is not rewritten. A backup is taken before each change.
``install --set-as-default`` over another default (``"nvidia"``) records it
in ``<daemon.json>.compat-hook-install``; ``uninstall`` removes the entry (and
``runtimes`` when that leaves it empty) and gives ``default-runtime`` back
exactly as it was when it still names this runtime (no record: the key goes,
Docker's default, runc, applies again). While containers created with
``--runtime NAME`` exist (running or stopped: Docker refuses to start one
whose runtime it no longer knows), the entry stays, naming the pass-through
the wrapper becomes (:func:`compat_hook.install.wrapper.wrapper_removal`);
``uninstall docker`` again once they are removed. A daemon.json left holding nothing
(``{}``) whose backups hold nothing but this entry was compat-hook's alone
and is removed with them. Docker reads the file at start:
``systemctl restart docker`` afterwards; the commands never restart it.
"""

from __future__ import annotations

import copy
import os

from . import hooksd
from .hooksd import InstallError, say

__all__ = ["DEFAULT_CONFIG", "install", "uninstall", "detect_indent", "edit", "render"]

DEFAULT_CONFIG = "/etc/docker/daemon.json"


def detect_indent(text: str):
    """The indent unit of a JSON text: ``"  "``, ``"    "``, ``"\\t"``, or None for one line."""
    lines = text.splitlines()
    if len(lines) <= 1:
        return None if text.strip() else "    "
    widths = []
    for line in lines[1:]:
        stripped = line.lstrip(" \t")
        if not stripped or stripped[0] in "}]":
            continue
        lead = line[:len(line) - len(stripped)]
        if "\t" in lead:
            return "\t"
        if lead:
            widths.append(len(lead))
    if not widths:
        return "    "
    return " " * min(widths)


def _load(path: str, text: str | None) -> dict:
    import json

    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InstallError(f"{path}: not valid JSON ({e}); fix it first, nothing was changed") from None
    if not isinstance(data, dict):
        raise InstallError(f"{path}: the top level must be an object")
    return data


def render(data: dict, indent) -> str:
    import json

    if indent is None:
        return json.dumps(data, ensure_ascii=False) + "\n"
    return json.dumps(data, indent=indent, ensure_ascii=False) + "\n"


def edit(data: dict, *, name: str, wrapper: str | None, set_default: bool, remove: bool) -> dict:
    """``data`` with the entry added (or removed); the input is not modified."""
    import copy

    data = copy.deepcopy(data)
    runtimes = data.get("runtimes")
    if runtimes is not None and not isinstance(runtimes, dict):
        raise InstallError("daemon.json: \"runtimes\" must be an object")
    if remove:
        if runtimes and name in runtimes:
            del runtimes[name]
            if not runtimes:
                del data["runtimes"]
        if data.get("default-runtime") == name:
            del data["default-runtime"]
        return data
    if runtimes is None:
        runtimes = data["runtimes"] = {}
    entry = runtimes.get(name)
    if isinstance(entry, dict):
        if entry.get("path") != wrapper:
            entry["path"] = wrapper  # other keys (args) stay
    else:
        runtimes[name] = {"path": wrapper}
    if set_default:
        data["default-runtime"] = name
    return data


def _only_ours(text: str | None, path: str, name: str) -> bool:
    """Whether a daemon.json text holds nothing but runtime ``name`` (and a default naming it)."""
    try:
        data = _load(path, text)
    except InstallError:
        return False
    return edit(data, name=name, wrapper=None, set_default=False, remove=True) == {}


RECORD_SUFFIX = ".compat-hook-install"


def _users_of(data: dict, name: str | None):
    """``f(path)``: Docker's containers still created through runtime ``name`` / binary ``path``.

    ``name`` ``None``: the container tasks running ``path`` only (a runtime entry moved to another path: a
    container created with that name runs the new path once it starts again).
    """
    from .wrapper import users

    data_root = data.get("data-root") if isinstance(data.get("data-root"), str) else "/var/lib/docker"
    exec_root = data.get("exec-root") if isinstance(data.get("exec-root"), str) else "/run/docker"
    return lambda p: users(p, containerd_states=[os.path.join(exec_root, "containerd", "daemon"), "/run/containerd"],
                           docker_roots=[data_root], docker_runtime=name)


def _read_record(path: str) -> dict:
    import json

    from .files import read_text

    text = read_text(path)
    try:
        rec = json.loads(text) if text else {}
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def _plan(opts, remove: bool):
    """``(daemon.json change, wrapper changes, wrapper path, record changes)``."""
    import json

    from .files import Change, backups_of, read_text

    path = os.path.abspath(opts.config or DEFAULT_CONFIG)
    if os.path.isdir(path):
        raise InstallError(f"{path} is a directory")
    change = Change(path, None)
    old = change.old
    data = _load(path, old)
    name = opts.runtime_name
    runtimes = data.get("runtimes") if isinstance(data.get("runtimes"), dict) else {}
    entry = runtimes.get(name)
    old_wrapper = entry.get("path") if isinstance(entry, dict) else None
    rec_path = path + RECORD_SUFFIX
    rec = _read_record(rec_path)
    records = []
    keep_entry = False
    if remove:
        users_of = _users_of(data, name)
        left = users_of(old_wrapper or "") if old_wrapper else []
        keep_entry = bool([u for u in left if u.startswith("docker/")])
        from .daemons import running

        if old_wrapper:
            wrappers = hooksd.wrapper_removal(old_wrapper, path, engine="docker", users_of=users_of,
                                              daemons=running("docker", path))
        else:  # unregistered already: a pass-through an earlier uninstall left goes once nothing needs it
            from .wrapper import DEFAULT_WRAPPER_PATH, pass_through_cleanup

            wrappers = pass_through_cleanup(os.path.abspath(opts.wrapper_path or DEFAULT_WRAPPER_PATH),
                                            users_of, "docker")
        if keep_entry:
            say(f"note: kept runtimes.{name} in {path} (naming {old_wrapper}): Docker refuses to start a container "
                f"whose runtime it does not know")
        new_path = None
        if rec:
            records.append(Change(rec_path, None, ours=True))
    else:
        from .checks import enforce
        from .wrapper import wrapper_path

        enforce(opts.hook_config, "wrapper", say)
        new_path = wrapper_path(opts)
        wrappers = hooksd.wrapper_change(opts)
        # A registration moving to another wrapper (e.g. the Debian package's) drops the old one.
        # The running dockerd and the containers' shims still name the old one until a restart / their end.
        from .daemons import running

        wrappers += hooksd.wrapper_removal(old_wrapper, path, keep=new_path, engine="docker",
                                           users_of=_users_of(data, None), daemons=running("docker", path))
        previous = data.get("default-runtime")
        prev = runtimes.get(previous) if isinstance(previous, str) else None
        real = prev.get("path") if isinstance(prev, dict) and isinstance(prev.get("path"), str) else previous
        if opts.set_as_default and previous not in (None, name):
            say(f"note: default-runtime was {previous!r}; uninstall gives it back. Containers started without "
                f"--runtime now run {name!r}, whose wrapper execs compat-hook's `runtime:` (runc unless set)"
                + (f"; for them to keep the NVIDIA runtime, set `runtime: {real}` in compat-hook's config (not "
                   f"together with the toolkit registration, which would loop)"
                   if "nvidia" in str(real) else ""))
        elif not opts.set_as_default and isinstance(previous, str) and "nvidia" in f"{previous} {real}":
            say(f"note: default-runtime is {previous!r} ({real}): containers started without --runtime keep "
                f"running it. `docker run --runtime {name}` runs compat-hook's wrapper, which execs "
                f"compat-hook's `runtime:` (runc unless set): for those containers to get their GPUs from the "
                f"NVIDIA runtime too, set `runtime: nvidia-container-runtime` in compat-hook's config, or use the "
                f"{previous!r} runtime, which reaches compat-hook through the toolkit registration")
        if opts.set_as_default and previous != name:
            if previous is not None:
                records.append(Change(rec_path, json.dumps({"default_before": previous}) + "\n", mode=0o644,
                                      ours=True))
            elif rec:
                records.append(Change(rec_path, None, ours=True))
        elif not opts.set_as_default and rec:
            records.append(Change(rec_path, None, ours=True))
    new_data = edit(data, name=name, wrapper=new_path, set_default=opts.set_as_default, remove=remove)
    if remove and keep_entry:
        new_data["runtimes"] = copy.deepcopy(data["runtimes"])
    if remove and data.get("default-runtime") == name and isinstance(rec.get("default_before"), str):
        new_data["default-runtime"] = rec["default_before"]
    elif not remove and not opts.set_as_default and data.get("default-runtime") == name and \
            isinstance(rec.get("default_before"), str):
        new_data["default-runtime"] = rec["default_before"]
    if new_data == data and old is not None:
        change.new = old  # the same settings: never reformat someone's file
    elif remove and new_data == {} and all(_only_ours(read_text(b), path, name) for b in backups_of(path)):
        change.new, change.ours = None, True  # it was ours alone: no file, no backups left
    else:
        change.new = render(new_data, detect_indent(old) if old else "    ")
        if remove:  # only our entry goes: no backup of that, none left equal to the result
            change.backup, change.restores = False, True
    _plan.kept = keep_entry
    return change, wrappers, new_path, records


def install(opts) -> int:
    hooksd.check_args(opts, "docker")
    change, wrappers, wrapper, records = _plan(opts, remove=False)
    hooksd.run([(wrappers, False), ([change], True), (records, False)], opts, "docker", verb="registered",
               after=f"docker: runtime {opts.runtime_name!r} -> {wrapper} in {change.path}; "
                     f"restart the daemon to load it (systemctl restart docker), then "
                     f"docker run --runtime {opts.runtime_name} ...")
    return 0


def uninstall(opts) -> int:
    hooksd.check_args(opts, "docker")
    change, wrappers, _, records = _plan(opts, remove=True)
    if change.old is None:
        from .wrapper import DEFAULT_WRAPPER_PATH, pass_through_cleanup

        left = pass_through_cleanup(os.path.abspath(opts.wrapper_path or DEFAULT_WRAPPER_PATH),
                                    _users_of({}, opts.runtime_name), "docker")
        if left:
            hooksd.run([(left, False)], opts, "docker", verb="unregistered")
            return 0
        say(f"docker: {change.path} does not exist; nothing to remove")
        return 0
    after = (f"docker: runtime {opts.runtime_name!r} kept in {change.path} for the containers created with it "
             f"(it runs the real runtime now); run `compat-hook uninstall docker` again once they are removed"
             if _plan.kept else
             f"docker: runtime {opts.runtime_name!r} removed from {change.path}; "
             f"restart the daemon (systemctl restart docker)")
    hooksd.run([([change], True), (wrappers, False), (records, False)], opts, "docker", verb="unregistered",
               after=after)
    return 0
