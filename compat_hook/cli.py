"""The stable entry point registered hooks import: ``from compat_hook.cli import entry``.

Hooks registered on nodes (hooks.d files, containerd/CRI-O/Docker configs)
name this module in their boot code, so it never moves; the command line
lives in :mod:`compat_hook.commands.cli` (docs/design.md, "Entry points").

A container start goes straight to :mod:`compat_hook.commands.hook`, without
the command-line layer, and with :func:`start_imports`. Started by a boot
code with ``hook`` in argv, this module imports the hook when it is itself
imported, which is inside the boot code's ``try``: an installation that
cannot run the hook (half removed) fails open there, as when the command
line was imported here. With :func:`start_imports`, compat_hook's own
modules are then loaded from their files by name, with no ``sys.path`` scan
and without the layer packages' (empty) ``__init__`` files. Measured, imports
are ~90% of the hook's own time on a start without compat (5.4 ms of imports
against 0.6 ms of work, in-process, minimum of 40 runs), and each module costs
about 42 us through the path finders against 24 us this way (28 empty modules
imported in a fresh ``python3 -I -S``: 1185 against 679 us, minimum of 25 runs).

>>> import compat_hook.cli as c
>>> c.main is __import__("compat_hook.commands.cli", fromlist=["main"]).main
True
"""

import sys

__all__ = ["entry", "main", "start_process", "start_imports", "from_boot_code", "EMPTY_PACKAGES"]

#: compat_hook's subpackages whose ``__init__.py`` is empty (docs/design.md), which
#: :func:`start_imports` makes without reading it (tests/test_hook_imports.py keeps this true).
EMPTY_PACKAGES = ("commands", "cluster", "policy", "effects", "images", "facts", "core")


def from_boot_code() -> bool:
    """Whether this process is a registration's boot code (:func:`compat_hook.core.registration.boot_code`).

    ``python3 -I -S -c CODE``: ``__main__`` has no file, and has the boot code's
    global ``f`` (``--fail-closed`` was given) as a bool.

    >>> from_boot_code()
    False
    """
    g = getattr(sys.modules.get("__main__"), "__dict__", None) or {}
    return "__file__" not in g and type(g.get("f")) is bool


def entry() -> None:
    """``python3 -I -S -c '...; from compat_hook.cli import entry; entry()' ARGS`` (the boot code)."""
    if sys.argv[1:2] == ["hook"]:
        if _hook_entry is None:  # not started by a boot code: imported now
            start_process()
            from .commands.hook import entry as hook_entry
        else:
            hook_entry = _hook_entry
        hook_entry(sys.argv[2:])  # exits
    from .commands.cli import entry as cli_entry

    cli_entry()


def __getattr__(name: str):
    # ``from compat_hook.cli import main`` (PEP 562): the command line, imported only when asked for.
    if name == "main":
        from .commands.cli import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def start_process() -> None:
    """What a container start's process (the hook, the wrapper's ``create``) sets up first.

    * No cyclic garbage collection: the process lives for one start and ends
      in ``os._exit`` (or ``exec``), so what cycles hold is never worth
      freeing, and the collector's passes over the objects the imports make
      are pure cost: 3-4 collections, 0.3-0.6 ms of a start without compat
      (``gc.callbacks``, the hook's argv).
    * :func:`start_imports`.
    """
    import gc

    gc.disable()
    start_imports()


def start_imports() -> bool:
    """From now on, import ``compat_hook.*`` straight from this installation's files.

    A meta path finder put first: ``compat_hook.a.b`` is ``<package>/a/b.py``
    (one ``stat``), found without asking every ``sys.path`` entry's finder
    (which lists each directory and tries five file suffixes), and the layer
    packages are made without reading their empty ``__init__`` files. The
    loader reads a timestamp ``.pyc`` itself, checked against its source's
    mtime and size exactly as ``importlib`` checks it; anything else (no
    ``.pyc``, a stale one, a hash-based one, ``-O``, a pycache prefix) is left
    to ``importlib``'s own ``SourceFileLoader``, which compiles and writes as
    usual, and a module with no ``.py`` to the normal finders. Returns
    whether it was installed (not on an interpreter without CPython's import
    internals); idempotent.
    """
    for f in sys.meta_path:
        if type(f).__name__ == "_Finder" and type(f).__module__ == __name__:
            return True
    try:
        finder = _make_finder()
    except Exception:  # noqa: BLE001 - no fast path here: the normal import system does the same
        return False
    sys.meta_path.insert(0, finder)
    return True


def _make_finder():
    import marshal
    import posix

    bs = sys.modules["_frozen_importlib"]
    ext = sys.modules["_frozen_importlib_external"]
    imp = sys.modules["_imp"]
    ModuleSpec, SourceFileLoader, magic = bs.ModuleSpec, ext.SourceFileLoader, ext.MAGIC_NUMBER
    tag = sys.implementation.cache_tag
    if tag is None:  # no .pyc files at all here: nothing to gain
        raise ImportError("no cache tag")
    head = magic + b"\0\0\0\0"
    # Our own pyc path only where importlib's would be the same (else cache_from_source decides).
    plain = sys.flags.optimize == 0 and getattr(sys, "pycache_prefix", None) is None
    top = __file__.rpartition("/")[0]  # .../compat_hook
    empty = frozenset("compat_hook." + x for x in EMPTY_PACKAGES)
    stat, open_, fstat, read, close = posix.stat, posix.open, posix.fstat, posix.read, posix.close
    flags = posix.O_RDONLY | posix.O_CLOEXEC

    class _Loader(SourceFileLoader):
        """``SourceFileLoader`` whose ``get_code`` reads a valid timestamp ``.pyc`` directly."""

        def get_code(self, fullname):
            st = self.st
            try:
                fd = open_(self.pyc, flags)
                try:
                    data = read(fd, fstat(fd).st_size)
                finally:
                    close(fd)
            except OSError:
                data = b""
            # importlib's checks (_classify_pyc, _validate_timestamp_pyc): magic, flags 0
            # (a timestamp pyc), the source's mtime and size, each 32 bits little-endian.
            if (data[:8] == head
                    and int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                    and int.from_bytes(data[12:16], "little") == st.st_size & 0xFFFFFFFF):
                code = marshal.loads(memoryview(data)[16:])
                imp._fix_co_filename(code, self.path)
                return code
            return super().get_code(fullname)

    class _Finder:
        """``compat_hook.*`` from ``top``; everything else (and a missing file) to the next finder."""

        def find_spec(self, name, path=None, target=None):
            if not name.startswith("compat_hook."):
                return None
            base = top + "/" + name[12:].replace(".", "/")
            if name in empty:
                spec = ModuleSpec(name, None, is_package=True)
                spec.submodule_search_locations = [base]
                return spec
            src = base + ".py"
            try:
                st = stat(src)
            except OSError:
                return None
            loader = _Loader(name, src)
            loader.st = st
            d, _, mod = base.rpartition("/")
            loader.pyc = (f"{d}/__pycache__/{mod}.{tag}.pyc" if plain
                          else ext.cache_from_source(src))
            spec = ModuleSpec(name, loader, origin=src)
            spec.has_location = True
            spec.cached = loader.pyc
            return spec

        def invalidate_caches(self):
            pass

    return _Finder()


_hook_entry = None
if sys.argv[1:2] == ["hook"] and from_boot_code():
    start_process()
    from .commands.hook import entry as _hook_entry  # noqa: E402 - inside the boot code's try (above)
