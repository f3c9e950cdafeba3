"""Hook entries for config.json, CDI specs and hooks.d files.

The entry runs the interpreter by its absolute, resolved path (never a
pyenv-style shim: ~75-150 ms, and a PATH lookup the image could influence)
with ``-I -S``: isolated mode ignores every ``PYTHON*`` variable, the user
site and the cwd (which is the rootfs at runc's createContainer); ``-S``
skips ``site`` (~6 ms) and the code puts exactly the directories compat-hook
and its dependencies live in on ``sys.path``. The ``env`` is explicit, so
nothing of the runtime's or the image's environment reaches the hook
(CVE-2025-23266, "NVIDIAScape").

>>> e = hook_entry(stage="createContainer", config="/etc/compat-hook/config.yaml")
>>> e["args"][1:4]
['-I', '-S', '-c']
>>> e["env"][0]
'PATH=/usr/sbin:/usr/bin:/sbin:/bin'
"""

from __future__ import annotations

import os
import sys

__all__ = ["hook_entry", "hooksd_document", "python_paths", "interpreter", "stable_interpreter", "HOOK_ENV"]

HOOK_ENV = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"]


def stable_interpreter(exe: str) -> str:
    """``/usr/bin/python3`` for ``/usr/bin/python3.11`` when the former links to the latter.

    A distro upgrade to the next minor version would otherwise leave every
    registered entry pointing at a removed binary.
    """
    d, name = os.path.split(exe)
    if name.startswith("python3.") and name[8:].isdigit():
        stable = os.path.join(d, "python3")
        try:
            if os.path.realpath(stable) == os.path.realpath(exe) and os.access(stable, os.X_OK):
                return stable
        except OSError:
            pass
    return exe


def interpreter() -> str:
    """The real interpreter binary running us (a venv's python resolves to its base)."""
    exe = os.path.realpath(sys.executable or "/usr/bin/python3")
    if not os.access(exe, os.X_OK):
        return sys.executable
    return stable_interpreter(exe)


def python_paths() -> list:
    """Directories holding compat_hook, yaml and elftools (deduplicated, in that order)."""
    import compat_hook

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(compat_hook.__file__)))]
    for mod in ("yaml", "elftools"):
        try:
            m = __import__(mod)
        except ImportError:
            continue
        d = os.path.dirname(os.path.dirname(os.path.abspath(m.__file__)))
        if d not in dirs:
            dirs.append(d)
    return dirs


def boot_code(paths: list) -> str:
    # Appended, not prepended: stdlib imports then find their module on the
    # first path entry (-I already keeps the cwd and user site out).
    return f"import sys;sys.path+={paths!r};from compat_hook.cli import entry;entry()"


def hook_entry(*, stage: str = "createContainer", config: str | None = None,
               state_dir: str | None = None, timeout: int = 30) -> dict:
    """The OCI hook entry for ``stage`` (``path``, ``args``, ``env``, ``timeout``)."""
    exe = interpreter()
    args = [exe, "-I", "-S", "-c", boot_code(python_paths()), "hook", "--stage", stage]
    if config:
        args += ["--config", os.path.abspath(config)]
    if state_dir:
        args += ["--state-dir", os.path.abspath(state_dir)]
    return {"path": exe, "args": args, "env": list(HOOK_ENV), "timeout": int(timeout)}


def hooksd_document(entry: dict, stages=("createContainer",)) -> dict:
    """A hooks.d (oci-hooks(5), schema 1.0.0) file that fires for GPU containers.

    ``when`` matches containers whose process env names NVIDIA devices is
    not expressible (hooks.d matches annotations, commands and bind mounts
    only), so it fires always and the hook itself skips non-GPU containers
    in well under a millisecond past its start.
    """
    return {"version": "1.0.0", "hook": entry, "when": {"always": True}, "stages": list(stages)}
