"""``compat-hook install|uninstall docker``: a ``runtimes`` entry in daemon.json.

Docker has no drop-ins and no hooks.d: the runtime wrapper is registered in
``/etc/docker/daemon.json`` (``--config`` overrides the path)::

    "runtimes": {"cuda-compat": {"path": "/usr/local/libexec/compat-hook/compat-hook-runtime"}}

and used per container (``docker run --runtime cuda-compat``) or for every
container with ``--set-as-default`` (``"default-runtime": "cuda-compat"``).
The wrapper is the one containerd's install renders (``--wrapper-path``,
default ``/usr/local/libexec/compat-hook/compat-hook-runtime``); it execs the
config's ``runtime:`` (runc by default) for every verb.
Every other key, their order and the file's indentation (detected: two
spaces, four, a tab, or one line) are kept, and a file whose settings would
not change is not rewritten. A backup is taken before each change. ``uninstall`` removes the entry (and ``runtimes`` when that leaves
it empty) and resets ``default-runtime`` only when it names this runtime
(Docker's default, runc, applies again). Docker reads the file at start:
``systemctl restart docker`` afterwards; the commands never restart it.
"""

from __future__ import annotations

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


def _plan(args, remove: bool):
    """``(daemon.json change, wrapper changes)``."""
    from .files import Change

    path = os.path.abspath(args.config or DEFAULT_CONFIG)
    if os.path.isdir(path):
        raise InstallError(f"{path} is a directory")
    change = Change(path, None)
    old = change.old
    data = _load(path, old)
    name = args.runtime_name
    if remove:
        entry = (data.get("runtimes") or {}).get(name) if isinstance(data.get("runtimes"), dict) else None
        wrappers = hooksd.wrapper_removal(entry.get("path") if isinstance(entry, dict) else None, path)
    else:
        wrapper = hooksd.wrapper_change(args)
        wrappers = [wrapper]
        previous = data.get("default-runtime")
        if getattr(args, "set_as_default", False) and previous not in (None, name, "runc"):
            entry = (data.get("runtimes") or {}).get(previous) if isinstance(data.get("runtimes"), dict) else None
            real = entry.get("path") if isinstance(entry, dict) and isinstance(entry.get("path"), str) else previous
            say(f"note: default-runtime was {previous!r}; uninstall resets it to Docker's default (runc), "
                f"not to {previous!r}. If containers need it, set `runtime: {real}` in "
                f"compat-hook's config: the wrapper execs that runtime")
    new_data = edit(data, name=name, wrapper=None if remove else wrappers[0].path,
                    set_default=bool(getattr(args, "set_as_default", False)), remove=remove)
    if new_data == data and old is not None:
        change.new = old  # the same settings: never reformat someone's file
    else:
        change.new = render(new_data, detect_indent(old) if old else "    ")
    return change, wrappers


def install(args) -> int:
    hooksd.check_args(args, "docker")
    change, wrappers = _plan(args, remove=False)
    hooksd.run([(wrappers, False), ([change], True)], args, "docker", verb="registered",
               after=f"docker: runtime {args.runtime_name!r} -> {wrappers[0].path} in {change.path}; "
                     f"restart the daemon to load it (systemctl restart docker), then "
                     f"docker run --runtime {args.runtime_name} ...")
    return 0


def uninstall(args) -> int:
    hooksd.check_args(args, "docker")
    change, wrappers = _plan(args, remove=True)
    if change.old is None:
        say(f"docker: {change.path} does not exist; nothing to remove")
        return 0
    hooksd.run([([change], True), (wrappers, False)], args, "docker", verb="unregistered",
               after=f"docker: runtime {args.runtime_name!r} removed from {change.path}; "
                     f"restart the daemon (systemctl restart docker)")
    return 0
