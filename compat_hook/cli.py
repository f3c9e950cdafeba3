"""The stable entry point registered hooks import: ``from compat_hook.cli import entry``.

Hooks registered on nodes (hooks.d files, containerd/CRI-O/Docker configs)
name this module in their boot code, so it never moves; the command line
lives in :mod:`compat_hook.commands.cli` (docs/design.md, "Entry points").
"""

from .commands.cli import entry, main  # noqa: F401
