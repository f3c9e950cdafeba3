"""What a container start imports: the hook's modules, pinned (issue 28); the fast import it uses.

The hook runs on every container start, and what it imports is most of what
it costs beyond the interpreter's own start (benchmarks/README.md, "Where the
time goes"). So the set of modules the registered hook imports is pinned here,
on its two common paths, as the registration runs it: the entry's very argv
and env (``compat-hook hook-entry``), a fresh ``python3 -I -S`` with
``-X importtime`` added, the OCI state on stdin.

* no compat: a GPU container whose image carries no compat driver (the
  host store is empty, as it is unless ``compat-hook store add`` filled it);
* enable: a GPU container whose compat driver is turned on, the library's
  facts from the state-dir cache (the image was seen before), the drop-in
  written and the ld cache rebuilt (the container's first start).

compat_hook's modules are pinned exactly. Standard-library modules are
pinned as an upper bound, counted past what ``python3 -I -S -c pass``
imports by itself: a new one fails, one that goes away does not. Nothing is
timed: the time is measured by benchmarks/run.py. To change a pin, add or
remove the module in the sets below in the same commit as the change that
brings it, with the measured cost in its commit message.

The fast import (:func:`compat_hook.cli.start_imports`) is checked against
what it replaces: the same files, a stale ``.pyc`` left to importlib, and
the subpackages whose ``__init__.py`` it does not read are empty.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from tests.support import hostile as h

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = h.HOOK_PYTHON

#: compat_hook's modules on both paths.
COMMON = frozenset({
    "compat_hook", "compat_hook.cli",
    "compat_hook.commands", "compat_hook.commands.hook",
    "compat_hook.core", "compat_hook.core.errors", "compat_hook.core.jsonfast", "compat_hook.core.logjson",
    "compat_hook.core.fastos",
    "compat_hook.core.config", "compat_hook.core.cache", "compat_hook.core.versions", "compat_hook.core.bounded",
    "compat_hook.facts", "compat_hook.facts.oci", "compat_hook.facts.container", "compat_hook.facts.surface",
    "compat_hook.facts.rootfs", "compat_hook.facts.hostfacts", "compat_hook.facts.imagefacts",
    # ldconfig's reading of the image (/etc/ld.so.conf, its includes) and the env roots, at every start
    "compat_hook.facts.loader",
    "compat_hook.facts.elfinfo",
    "compat_hook.policy", "compat_hook.policy.assess", "compat_hook.policy.decision",
    "compat_hook.effects", "compat_hook.effects.mounts", "compat_hook.effects.ldcache",
})
#: A GPU container without compat libs: the host store is looked at (``store_inject``, on by default).
NOCOMPAT = COMMON | {"compat_hook.policy.storefacts", "compat_hook.facts.storeindex"}
#: Compat turned on (cached library facts, drop-in written, ldconfig).
ENABLE = COMMON | {"compat_hook.core.ldpath", "compat_hook.core.atomic"}

#: Standard-library modules the no-compat path may import beyond the interpreter's own.
NOCOMPAT_STDLIB = frozenset({"__future__", "stat", "_stat", "_json", "gc", "errno"})
#: ... and the enable path (the cache's digest, the rootfs lock, ldconfig's rlimits and wait).
ENABLE_STDLIB = NOCOMPAT_STDLIB | {"_blake2", "fcntl", "resource", "select"}

_HOW = ("every module is paid for at each container start; if it must be there, measure it "
        "(benchmarks/run.py) and change the pin in tests/test_hook_imports.py in the same commit")


def _imported(stderr: bytes) -> list:
    """Module names in ``-X importtime`` order (each import's first load only)."""
    out = []
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line and "imported package" not in line:
            out.append(line.rsplit("|", 1)[1].strip())
    return out


@pytest.fixture(scope="module")
def interpreter_own() -> frozenset:
    p = subprocess.run([PY, "-I", "-S", "-X", "importtime", "-c", "pass"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    own = frozenset(_imported(p.stderr))
    assert "encodings" in own, p.stderr  # it did list something
    return own


def _run(env: h.HookEnv, bundle: pathlib.Path) -> tuple:
    """Run the registered entry with ``-X importtime``: ``(imported, log record)``."""
    args = list(env.entry["args"])
    assert args[0] == env.entry["path"] == PY and args[1:3] == ["-I", "-S"], args[:3]
    args[1:1] = ["-X", "importtime"]
    r = h.run_hook(env.entry, h.state_json(bundle), args=args, cwd=bundle / "rootfs")
    assert r.rc == 0, str(r)
    return _imported(r.stderr), env.last_record()


def _check(path: str, imported: list, own: frozenset, pinned: frozenset, stdlib: frozenset) -> None:
    assert len(imported) == len(set(imported)), imported
    mods = set(imported)
    ours = {m for m in mods if m.split(".")[0] == "compat_hook"}
    new, gone = ours - pinned, pinned - ours
    assert not new, f"the hook's {path} path now imports {sorted(new)}: {_HOW}"
    assert not gone, f"the hook's {path} path no longer imports {sorted(gone)}: take them out of the pin"
    extra = mods - ours - own - stdlib
    assert not extra, f"the hook's {path} path now imports the standard library's {sorted(extra)}: {_HOW}"


@pytest.fixture
def hook_env(tmp_path) -> h.HookEnv:
    return h.make_hook_env(tmp_path / "hookenv")


def test_no_compat_path_imports_the_pinned_modules(hook_env, tmp_path, interpreter_own):
    bundle = h.write_bundle(tmp_path / "bundle")
    h.base_rootfs(bundle / "rootfs", compat=False)
    _run(hook_env, bundle)  # the first start parses the config (PyYAML) and caches it
    imported, rec = _run(hook_env, bundle)
    assert (rec["decision"], rec["reason"], rec["actions"]) == ("skip", "no_candidate", []), rec
    _check("no-compat", imported, interpreter_own, NOCOMPAT, NOCOMPAT_STDLIB)
    # What the hot path must never load (docs/design.md, "Hot path rules").
    for heavy in ("compat_hook.commands.cli", "compat_hook.facts.elfnote", "os", "argparse", "json", "re", "yaml"):
        assert heavy not in imported, heavy


def test_enable_path_imports_the_pinned_modules(hook_env, tmp_path, interpreter_own):
    bundle = h.write_bundle(tmp_path / "bundle")
    root = h.base_rootfs(bundle / "rootfs")
    dropin = root / h.DROPIN
    first, rec = _run(hook_env, bundle)  # first sight of the library: parsed and cached
    assert rec["decision"] == "enable" and rec["elf_source"] == "parsed", rec
    assert "compat_hook.facts.elfnote" in first  # the reader is there when it is needed
    dropin.unlink()  # the next container on this image: a fresh rootfs, no drop-in yet
    imported, rec = _run(hook_env, bundle)
    assert (rec["decision"], rec["elf_source"], rec["compat_dir"]) == ("enable", "cache", h.COMPAT_DIR), rec
    assert rec["planned"] == ["write_dropin", "ldconfig"], rec
    assert dropin.read_text() == h.dropin_text(h.COMPAT_DIR)
    _check("enable", imported, interpreter_own, ENABLE, ENABLE_STDLIB)
    for heavy in ("compat_hook.commands.cli", "compat_hook.facts.elfnote", "os", "elftools", "yaml", "subprocess"):
        assert heavy not in imported, heavy


# ---- the fast import itself


def _probe(top: pathlib.Path, code: str) -> str:
    """Run ``code`` in ``python3 -I -S`` with ``top`` on sys.path after ``start_imports()``."""
    prog = (f"import sys\nsys.path.append({str(top)!r})\nimport compat_hook.cli as c\n"
            f"assert c.start_imports() and c.start_imports()\n" + code)
    p = subprocess.run([PY, "-I", "-S", "-c", prog], capture_output=True, text=True, timeout=60, cwd="/")
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_fast_import_loads_the_same_files():
    out = _probe(REPO, (
        "import compat_hook.facts.oci as m, compat_hook.core.versions as v, importlib.machinery as im\n"
        "print(m.__file__, m.__spec__.origin, m.__cached__, type(m.__loader__).__name__)\n"
        "print(im.PathFinder.find_spec('compat_hook.facts.oci', m.__spec__.parent and\n"
        "      sys.modules['compat_hook.facts'].__path__).origin)\n"
        "print(m.__spec__.loader.get_source(m.__name__) == open(m.__file__).read(), v.parse_version('550.54.15'))\n"
        "import compat_hook.core as core\nprint(core.__path__, core.versions is v)\n"))
    lines = out.splitlines()
    src = str(REPO / "compat_hook/facts/oci.py")
    file_, origin, cached, loader = lines[0].split()
    assert file_ == origin == src and lines[1] == src
    assert pathlib.Path(cached).parent == REPO / "compat_hook/facts/__pycache__"
    assert pathlib.Path(cached).name.startswith("oci.") and cached.endswith(".pyc")
    assert loader == "_Loader"
    assert lines[2] == "True (550, 54, 15)"
    assert lines[3] == f"[{str(REPO / 'compat_hook/core')!r}] True"


def test_fast_import_leaves_a_stale_pyc_to_importlib(tmp_path):
    top = tmp_path / "tree"
    shutil.copytree(REPO / "compat_hook", top / "compat_hook", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([PY, "-I", "-m", "compileall", "-q", str(top)], check=True, timeout=120)
    src = top / "compat_hook/core/versions.py"
    pyc = next((src.parent / "__pycache__").glob("versions.*.pyc"))
    # The source changes after its .pyc was written (an upgrade in place): same mtime,
    # another size. The .pyc must not be used; importlib compiles the source and rewrites it.
    st = src.stat()
    src.write_text(src.read_text() + "\nSTALE_CHECK = 'from the source'\n")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    old = pyc.read_bytes()
    out = _probe(top, "import compat_hook.core.versions as v\nprint(v.STALE_CHECK, v.__file__)\n")
    assert out.split() == ["from", "the", "source", str(src)]
    assert pyc.read_bytes() != old  # rewritten by importlib, as without the fast import
    # A module with no source falls through to the normal finders (here: none has it).
    out = _probe(top, "try:\n import compat_hook.core.nonexistent\nexcept ModuleNotFoundError as e:\n print(e.name)\n")
    assert out.strip() == "compat_hook.core.nonexistent"


def test_the_packages_the_fast_import_does_not_read_are_empty():
    from compat_hook.cli import EMPTY_PACKAGES

    pkg = REPO / "compat_hook"
    empty = {d.name for d in pkg.iterdir() if (d / "__init__.py").is_file()
             and (d / "__init__.py").read_text().strip() == ""}
    assert set(EMPTY_PACKAGES) == empty, (
        "compat_hook.cli.EMPTY_PACKAGES must name exactly the subpackages whose __init__.py is empty: "
        "the hook's fast import (compat_hook.cli.start_imports) does not run those files")


# ---- a start that cannot import what it runs still fails open


@pytest.fixture
def half_removed(tmp_path) -> pathlib.Path:
    """An installation whose compat_hook/cli.py and runtime.py are there but not the code they start."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "compat_hook", site / "compat_hook", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(site / "compat_hook" / "commands")
    return site


def _boot(site: pathlib.Path, target: str, log: pathlib.Path) -> str:
    from compat_hook.core.registration import boot_code, python_paths

    return boot_code([str(site)] + python_paths()[1:], target=target, log_file=str(log))


@pytest.mark.parametrize("fail_closed", [False, True])
def test_hook_of_a_half_removed_installation_fails_open(half_removed, tmp_path, fail_closed):
    log = tmp_path / "hook.log"
    argv = [PY, "-I", "-S", "-c", _boot(half_removed, "hook", log)] + (["--fail-closed"] if fail_closed else [])
    p = subprocess.run(argv + ["hook", "--stage", "createContainer"], input=h.state_json(tmp_path, id="c1"),
                       capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    err = p.stderr.decode()
    assert p.returncode == (1 if fail_closed else 0), err
    assert err.startswith("compat-hook: cannot start (ModuleNotFoundError: ") and "Traceback" not in err, err
    assert err.rstrip().endswith("the container is stopped (on_error: fail)" if fail_closed
                                 else "the container starts without compat-hook"), err
    (rec,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (rec["event"], rec["reason"], rec["container_id"]) == (
        "fail_closed" if fail_closed else "fail_open", "installation_missing", "c1"), rec


def test_wrapper_of_a_half_removed_installation_runs_the_real_runtime(half_removed, tmp_path):
    log = tmp_path / "runtime.log"
    argv = [PY, "-I", "-S", "-c", _boot(half_removed, "runtime", log), "create", "--bundle", "b", "c2"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "COMPAT_HOOK_RUNTIME_FALLBACK": "/bin/echo"})
    assert p.returncode == 0, p.stderr
    assert p.stdout == "create --bundle b c2\n"  # the stand-in runtime ran with the same arguments
    assert "running /bin/echo without compat-hook" in p.stderr and "Traceback" not in p.stderr, p.stderr
    (rec,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (rec["event"], rec["component"], rec["container_id"]) == ("fail_open", "runtime", "c2"), rec
