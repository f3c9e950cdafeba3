"""``compat-hook install|uninstall docker``: a ``runtimes`` entry in daemon.json.

Docker has no drop-ins and no hooks.d: the runtime wrapper is registered in
``/etc/docker/daemon.json`` (``--config`` overrides the path)::

    "runtimes": {"cuda-compat": {"path": "/usr/libexec/compat-hook/compat-hook-runtime"}}

and used per container (``docker run --runtime cuda-compat``) or for every
container with ``--set-as-default`` (``"default-runtime": "cuda-compat"``).
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
    from .files import Change

    path = os.path.abspath(args.config or DEFAULT_CONFIG)
    if os.path.isdir(path):
        raise InstallError(f"{path} is a directory")
    change = Change(path, None)
    old = change.old
    data = _load(path, old)
    wrapper = None if remove else hooksd.wrapper_path(args)
    new_data = edit(data, name=args.runtime_name, wrapper=wrapper,
                    set_default=bool(getattr(args, "set_as_default", False)), remove=remove)
    if new_data == data and old is not None:
        change.new = old  # semantically unchanged: never reformat someone's file
    else:
        change.new = render(new_data, detect_indent(old) if old else "    ")
    return change


def install(args) -> int:
    hooksd.check_args(args, "docker")
    change = _plan(args, remove=False)
    hooksd.run([([change], True)], args, "docker", verb="registered",
               after=f"docker: runtime {args.runtime_name!r} registered in {change.path}; "
                     f"restart the daemon to use it (systemctl restart docker), then "
                     f"docker run --runtime {args.runtime_name} ...")
    return 0


def uninstall(args) -> int:
    hooksd.check_args(args, "docker")
    change = _plan(args, remove=True)
    if change.old is None:
        say(f"docker: {change.path} does not exist; nothing to remove")
        return 0
    hooksd.run([([change], True)], args, "docker", verb="unregistered",
               after=f"docker: runtime {args.runtime_name!r} removed from {change.path}; "
                     f"restart the daemon (systemctl restart docker)")
    return 0
