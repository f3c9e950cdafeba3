"""compat-hook's Debian package, built once per test module (the ``deb`` fixture).

``make deb`` into a temp dir; tests/test_deb.py and tests/test_install_node.py use it::

    from tests.support.debpkg import deb  # noqa: F401  (the module-scoped .deb fixture)
"""

from __future__ import annotations

import pathlib

import pytest

from tests.support.engines import sh

__all__ = ["deb", "VERSION"]

REPO = pathlib.Path(__file__).resolve().parents[2]
VERSION = __import__("compat_hook").__version__


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("dist")
    sh("make", "-C", REPO, "deb", f"DEB_OUT={out}", "PY=/usr/bin/python3", timeout=300)
    got = out / f"compat-hook_{VERSION}_all.deb"
    assert got.is_file(), list(out.iterdir())
    return got
