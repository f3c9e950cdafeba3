"""Test-side name for the project's ELF fixture generator (compat_hook.facts.elfgen)."""

from compat_hook.facts.elfgen import *  # noqa: F401,F403
from compat_hook.facts.elfgen import __all__  # noqa: F401
