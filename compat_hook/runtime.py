"""The stable entry point registered runtime wrappers import: ``from compat_hook.runtime import entry``.

Wrappers rendered on nodes name this module in their boot code, so it never
moves; the wrapper lives in :mod:`compat_hook.commands.runtime` (docs/design.md,
"Entry points"). The rendered shell wrapper starts Python only for
``create``/``run``, a container start: a boot code's process is set up as
the hook's is (:func:`compat_hook.cli.start_process`) before the wrapper is
imported here, inside the boot code's ``try`` (an installation that cannot
run it fails open to the real runtime).
"""

from .cli import from_boot_code, start_process

if from_boot_code():
    start_process()

from .commands.runtime import entry, main  # noqa: E402,F401

__all__ = ["entry", "main"]
