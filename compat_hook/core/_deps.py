"""Import a third-party dependency, also when started with ``python3 -I -S``.

The hook entry puts the directories of compat_hook, PyYAML and pyelftools on
``sys.path`` itself and skips ``site`` (~6 ms). If a dependency moved since
the entry was generated (a distro upgrade), fall back to the system site
dirs once rather than failing: ``-I`` still keeps user site dirs and
``PYTHON*`` variables out.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["import_dep"]


def import_dep(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        if "site" in sys.modules and getattr(sys.flags, "no_site", 0) == 0:
            raise
        import site

        site.main()
        return importlib.import_module(name)
