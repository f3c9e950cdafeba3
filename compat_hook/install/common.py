"""What every engine's installer shares: the error, the output line, dpkg's file list, the engines' files,
tomlkit and its values as plain Python.

>>> InstallError("x").code
'install_failed'
>>> plain(tomlkit_module().parse('a = [1, {b = "c"}]')["a"])
[1, {'b': 'c'}]
"""

from __future__ import annotations

import os
import sys

from ..core.errors import CompatHookError

__all__ = ["InstallError", "say", "packaged", "tomlkit_module", "plain", "ENGINE_FILES", "DPKG_INFO", "PACKAGE"]

#: Where dpkg lists the files of installed packages (tests point it elsewhere).
DPKG_INFO = "/var/lib/dpkg/info"
PACKAGE = "compat-hook"
#: Where the other engines' registrations name the wrapper (read to tell whether it is shared).
ENGINE_FILES = ("/etc/containerd/config.toml.compat-hook-install",
                "/etc/containerd/conf.d/99-zz-compat-hook.toml", "/etc/docker/daemon.json",
                "/etc/crio/crio.conf.d/99-compat-hook.toml")


class InstallError(CompatHookError):
    """A registration cannot be done safely (exit status 1)."""

    code = "install_failed"


def say(msg: str) -> None:
    sys.stdout.write(msg + "\n")


def packaged(path: str) -> bool:
    """True when dpkg lists ``path`` as a file of the compat-hook package."""
    try:
        with open(os.path.join(DPKG_INFO, PACKAGE + ".list"), encoding="utf-8",
                  errors="replace") as f:
            return any(line.rstrip("\n") == path for line in f)
    except OSError:
        return False


def tomlkit_module():
    """The ``tomlkit`` module (imported on demand: only the installers that edit TOML need it).

    Raises InstallError naming the packages when it is not installed.
    """
    try:
        import tomlkit
    except ImportError:
        raise InstallError("tomlkit is not installed (apt-get install python3-tomlkit, "
                           "or pip install tomlkit)") from None
    return tomlkit


def plain(item):
    """A tomlkit document, table or value as plain Python (dicts, lists, str...); anything else as it is.

    A tomlkit older than ``unwrap()`` (0.11) gives its tables as dict copies.
    """
    if hasattr(item, "unwrap"):
        return item.unwrap()
    if isinstance(item, dict):
        import copy

        return copy.deepcopy(dict(item))
    return item


def run_command(fn) -> int:
    """``fn()``'s exit status; an :class:`InstallError` is one line and exit 1, another named error one line
    and exit 2 (bad usage or input): what every install/uninstall command returns."""
    from ..core.errors import EXIT_FAILED, EXIT_USAGE

    try:
        return fn()
    except InstallError as e:
        sys.stderr.write(f"compat-hook: {e}\n")
        return EXIT_FAILED
    except CompatHookError as e:
        sys.stderr.write(f"compat-hook: {e}\n")
        return EXIT_USAGE
