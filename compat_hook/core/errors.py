"""Named exceptions and the documented exit statuses.

Every error that can reach a user is one of these, so the entry points can
print a single line (``compat-hook: <message>``) and exit with the status the
README documents, never a traceback.

>>> raise ConfigError("mode: must be one of ldconfig, env, both, off")
Traceback (most recent call last):
    ...
compat_hook.core.errors.ConfigError: mode: must be one of ldconfig, env, both, off
"""

from __future__ import annotations

__all__ = [
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "CompatHookError",
    "UsageError",
    "ConfigError",
    "InvalidVersion",
    "UnsafePath",
    "StateError",
    "ImageError",
    "describe",
    "one_line",
]

#: A decision was reached (enable or skip); the hook did its job.
EXIT_OK = 0
#: The hook failed and ``on_error: fail`` is configured (the container must not start).
EXIT_FAILED = 1
#: Bad usage or unreadable input (one line on stderr).
EXIT_USAGE = 2


class CompatHookError(Exception):
    """Base of every error compat-hook raises on purpose."""

    #: Stable short code for logs (``reason`` of a failed run).
    code = "error"


class UsageError(CompatHookError):
    """Bad command line."""

    code = "usage"


class ConfigError(CompatHookError, ValueError):
    """The configuration file is unreadable, not YAML, or has a bad key/value.

    The message starts with the key's path (``compat_dirs[1]: ...``).
    """

    code = "bad_config"


class InvalidVersion(ValueError):
    """A driver or CUDA version string that is not 1-3 dot-separated numbers."""


class UnsafePath(CompatHookError, OSError):
    """A path inside the container root is not what it must be.

    Raised for paths that are not regular files where a regular file is
    required, components that are not directories, and creates that would
    follow a symlink. Never raised for "escapes": lookups clamp to the root,
    exactly like ``openat2(RESOLVE_IN_ROOT)``.
    """

    code = "unsafe_path"


class ImageError(CompatHookError):
    """An image that cannot be read: missing, malformed, lying about a digest, too large."""

    code = "bad_image"


class StateError(CompatHookError):
    """The OCI state on stdin, the bundle or its config.json is unusable."""

    code = "bad_state"


def one_line(text: str) -> str:
    """``text`` with control characters escaped: image-chosen names may hold newlines."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def describe(e: BaseException) -> tuple:
    """``(reason code, one-line message)`` for any exception a run ends with.

    >>> describe(ConfigError("mode: bad"))
    ('bad_config', 'mode: bad')
    >>> describe(FileNotFoundError(2, "No such file or directory", "/x\\n"))[0]
    'os_error'
    """
    if isinstance(e, CompatHookError):
        code, msg = e.code, str(e)
    elif isinstance(e, OSError):
        code, msg = "os_error", f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")
    else:
        code, msg = "internal_error", f"{type(e).__name__}: {e}"
    return code, one_line(msg)
