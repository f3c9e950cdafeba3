"""Every docstring example in compat_hook runs: an example that shows code must be code that works.

The modules are found by walking the package (a new module is covered without
editing this file); ``__main__`` is left out, since importing it runs the CLI.
Importing a module must do nothing but define things (checked below), so the
walk is safe.
"""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import subprocess
import sys

import pytest

import compat_hook

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules() -> list:
    names = ["compat_hook"]
    for m in pkgutil.walk_packages(compat_hook.__path__, "compat_hook."):
        if m.name.rsplit(".", 1)[-1] != "__main__":
            names.append(m.name)
    return sorted(names)


MODULES = _modules()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    mod = importlib.import_module(name)
    out: list = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    attempted = 0
    for test in doctest.DocTestFinder().find(mod, name):
        runner.run(test, out=out.append)
        attempted += len(test.examples)
    assert runner.failures == 0, "".join(out)
    # A module whose source shows an example must have it found and run here
    # (an example the finder cannot reach would silently never run).
    with open(mod.__file__, encoding="utf-8") as f:       # inspect.getsource fails on an empty file
        source = f.read()
    if ">>> " in source:
        assert attempted > 0, f"{name}: examples in the source, none collected"


def test_the_walk_finds_every_module():
    found = {n.replace(".", "/") for n in MODULES}
    on_disk = set()
    for dirpath, _dirs, files in os.walk(os.path.join(REPO, "compat_hook")):
        for f in files:
            if f.endswith(".py") and f != "__main__.py":
                rel = os.path.relpath(os.path.join(dirpath, f), REPO)[:-3]
                on_disk.add(rel[: -len("/__init__")] if rel.endswith("/__init__") else rel)
    assert found == on_disk


def test_importing_every_module_has_no_side_effects(tmp_path):
    # A fresh interpreter in an empty cwd: importing must print nothing, write
    # nothing and exit cleanly (the doctest walk above relies on it).
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib\n"
            "for name in sys.argv[2:]: importlib.import_module(name)\n")
    p = subprocess.run([sys.executable, "-I", "-c", code, REPO, *MODULES], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert list(tmp_path.iterdir()) == []
