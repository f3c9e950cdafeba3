"""The stable entry point registered runtime wrappers import: ``from compat_hook.runtime import entry``.

Wrappers rendered on nodes name this module in their boot code, so it never
moves; the wrapper lives in :mod:`compat_hook.commands.runtime` (docs/design.md,
"Entry points").
"""

from .commands.runtime import entry, main  # noqa: F401
