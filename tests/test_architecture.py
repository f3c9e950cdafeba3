"""The layers hold: import-linter's contracts (pyproject.toml) pass, and no compat_hook modules import each other in a circle.

Layers, high to low (docs/design.md): commands > cluster | install > policy >
effects | images > facts > core. A module imports only from its own layer and
the layers below; effects and images never import each other.

import-linter (PyPI; Debian does not package it) and grimp, which it brings,
are installed once into a venv under the test cache (``venv-importlinter``,
created with pip on first use, under a flock). The imports are read from the
source (every ``import`` statement, the ones inside functions included), so a
lazy import counts like a module-level one.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from tests.support.cache import cache_dir, locked

REPO = pathlib.Path(__file__).resolve().parents[1]
# Pinned: a new release could read the contracts differently. Verified to install on Debian 12.
PINS = ["import-linter==2.16", "grimp==3.20"]

# Strongly connected components of the import graph (Tarjan), one line per circle.
CYCLES = r"""
import sys
import grimp

graph = grimp.build_graph("compat_hook")
edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
index, low, stack, on, found = {}, {}, [], set(), []
sys.setrecursionlimit(10000)

def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1 or v in edges[v]:
            found.append(sorted(comp))

for m in edges:
    if m not in index:
        visit(m)
for c in found:
    print("circle: " + " <-> ".join(c))
print(f"{len(edges)} modules, {len(found)} circles")
"""


def _run(argv, **kw):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def venv() -> pathlib.Path:
    """A venv with import-linter and grimp (pinned), made on first use."""
    venv = cache_dir() / "venv-importlinter"
    marker = venv / ("pins-" + "-".join(PINS).replace("=", ""))
    with locked("venv-importlinter"):
        if not marker.exists():
            shutil.rmtree(venv, ignore_errors=True)
            p = _run(["/usr/bin/python3", "-m", "venv", venv])
            assert p.returncode == 0, p.stderr
            p = _run([venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", *PINS])
            assert p.returncode == 0, p.stdout + p.stderr
            marker.touch()
    return venv


def lint(venv: pathlib.Path, tree: pathlib.Path) -> subprocess.CompletedProcess:
    # lint-imports puts the cwd on sys.path and reads the cwd's pyproject.toml.
    return _run([venv / "bin" / "lint-imports", "--no-cache", "--no-logo"], cwd=tree)


def circles(venv: pathlib.Path, tree: pathlib.Path) -> subprocess.CompletedProcess:
    return _run([venv / "bin" / "python", "-I", "-c", f"import sys; sys.path.insert(0, {str(tree)!r})\n" + CYCLES],
                cwd=tree)


def test_the_layer_contracts_hold(venv):
    p = lint(venv, REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 kept, 0 broken" in p.stdout, p.stdout


def test_no_import_circles(venv):
    p = circles(venv, REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith(" 0 circles"), p.stdout
    assert int(p.stdout.split()[-4]) > 50, p.stdout   # it did read the package


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "compat_hook", tree / "compat_hook", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tree)
    return tree


def _append(path: pathlib.Path, line: str) -> None:
    path.write_text(path.read_text() + "\n\ndef _added():\n    " + line + "\n")


def test_an_upward_import_breaks_the_layers(venv, tmp_path):
    # A lazy import inside a function counts: the checks read every import statement.
    tree = _copy(tmp_path)
    _append(tree / "compat_hook/facts/hostfacts.py", "from ..policy import decision  # noqa: F401")
    p = lint(venv, tree)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "1 kept, 1 broken" in p.stdout, p.stdout
    assert "compat_hook.facts.hostfacts -> compat_hook.policy.decision" in p.stdout, p.stdout


def test_effects_importing_images_breaks_independence(venv, tmp_path):
    tree = _copy(tmp_path)
    _append(tree / "compat_hook/effects/mounts.py", "from ..images import view  # noqa: F401")
    p = lint(venv, tree)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "effects and images do not import each other BROKEN" in p.stdout, p.stdout


def test_a_circle_inside_a_layer_is_found(venv, tmp_path):
    # core.cache imports core.atomic; the way back closes a circle no layer contract sees.
    tree = _copy(tmp_path)
    _append(tree / "compat_hook/core/atomic.py", "from . import cache  # noqa: F401")
    assert lint(venv, tree).returncode == 0
    p = circles(venv, tree)
    assert "circle: compat_hook.core.atomic <-> compat_hook.core.cache" in p.stdout, p.stdout
    assert p.stdout.strip().endswith(" 1 circles"), p.stdout
