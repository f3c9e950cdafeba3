"""The part of ``os`` a container start uses, without importing ``os``.

The hook runs ``python3 -I -S``: without ``site``, nothing imports ``os`` but
the hook itself, and ``import os`` is ~1 ms of a start here (most of it
``_collections_abc``'s ABCs, which ``os`` needs for ``os.environ``; a fresh
``python3 -I -S``: ``import posix; posix._exit(0)`` 8.4 ms of CPU against 9.4
with ``os``, medians of 50). Modules on the start path therefore import this
one as ``os``: it is ``posix``, the C module ``os`` itself re-exports, plus the
few Python-level functions they call, with CPython's own code for ``str``
arguments (``os``, ``posixpath`` and ``genericpath`` of 3.11; anything else,
bytes or a path-like object, goes to the real function). What is not here
(``os.environ``, ``os.walk``, ``os.path.realpath``, ...) is the real ``os``'s,
imported on first use (module ``__getattr__``): correct everywhere, and fast
where the start path needs it (tests/test_hook_imports.py pins that it does not
import ``os``; tests/test_fastos.py compares each of those functions with the
real one).

>>> from compat_hook.core import fastos as os
>>> os.path.join("/etc", "ld.so.conf.d", "x.conf"), os.path.normpath("/a//b/../c/.")
('/etc/ld.so.conf.d/x.conf', '/a/c')
>>> os.environ is __import__("os").environ, os.walk is __import__("os").walk
(True, True)
"""

import posix
import sys
from posix import *  # noqa: F401,F403 - os's own functions (open, stat, posix_spawn ...)

__all__ = ["path", "fsencode", "fsdecode", "fdopen", "makedirs", "SEEK_SET", "SEEK_CUR", "SEEK_END", "curdir",
           "sep"]

del environ  # noqa: F821 - posix.environ maps bytes to bytes; os.environ (str) is the real os's, below

SEEK_SET, SEEK_CUR, SEEK_END = 0, 1, 2
sep = "/"
curdir = "."
_S_IFMT, _S_IFDIR, _S_IFREG, _S_IFLNK = 0o170000, 0o040000, 0o100000, 0o120000


def __getattr__(name: str):
    # Everything else is the real os's (PEP 562): imported now, once. Not the module
    # protocol's dunders: the import system asks for __path__ on every from-import.
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import os

    return getattr(os, name)


def _real(name: str):
    if name.startswith("__"):
        raise AttributeError(f"module 'posixpath' has no attribute {name!r}")
    import posixpath

    return getattr(posixpath, name)


_encoding, _errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def fsencode(filename):
    """``os.fsencode``."""
    filename = fspath(filename)  # noqa: F405 - posix.fspath
    return filename.encode(_encoding, _errors) if isinstance(filename, str) else filename


def fsdecode(filename):
    """``os.fsdecode``."""
    filename = fspath(filename)  # noqa: F405
    return filename.decode(_encoding, _errors) if isinstance(filename, bytes) else filename


def fdopen(fd, mode="r", buffering=-1, encoding=None, *args, **kwargs):
    """``os.fdopen``."""
    if not isinstance(fd, int):
        raise TypeError("invalid fd type (%s, expected integer)" % type(fd))
    import io

    if "b" not in mode and hasattr(io, "text_encoding"):
        encoding = io.text_encoding(encoding)
    return io.open(fd, mode, buffering, encoding, *args, **kwargs)


def makedirs(name, mode=0o777, exist_ok=False):
    """``os.makedirs``."""
    head, tail = path.split(name)
    if not tail:
        head, tail = path.split(head)
    if head and tail and not path.exists(head):
        try:
            makedirs(head, exist_ok=exist_ok)
        except FileExistsError:
            pass  # created meanwhile by another process
        if tail == (b"." if isinstance(tail, bytes) else curdir):
            return
    try:
        mkdir(name, mode)  # noqa: F405
    except OSError:
        # Not EEXIST alone: the system may report EACCES or EROFS first.
        if not exist_ok or not path.isdir(name):
            raise


# -- os.path: posixpath's functions for str, the real ones for anything else


def _join(a, *p):
    if type(a) is not str or any(type(b) is not str for b in p):
        return _real("join")(a, *p)
    result = a
    for b in p:
        if b.startswith("/"):
            result = b
        elif not result or result.endswith("/"):
            result += b
        else:
            result += "/" + b
    return result


def _split(p):
    if type(p) is not str:
        return _real("split")(p)
    i = p.rfind("/") + 1
    head, tail = p[:i], p[i:]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head, tail


def _dirname(p):
    return _split(p)[0] if type(p) is str else _real("dirname")(p)


def _basename(p):
    return p[p.rfind("/") + 1:] if type(p) is str else _real("basename")(p)


def _isabs(s):
    return s.startswith("/") if type(s) is str else _real("isabs")(s)


def _normpath(p):
    if type(p) is not str or not hasattr(posix, "_path_normpath"):
        return _real("normpath")(p)
    return posix._path_normpath(p) or "."


def _abspath(p):
    if type(p) is not str:
        return _real("abspath")(p)
    if not p.startswith("/"):
        p = _join(getcwd(), p)  # noqa: F405
    return _normpath(p)


def _mode(p, follow: bool):
    try:
        return (stat(p) if follow else lstat(p)).st_mode  # noqa: F405
    except (OSError, ValueError):
        return None


def _exists(p):
    return _mode(p, True) is not None


def _lexists(p):
    return _mode(p, False) is not None


def _isfile(p):
    m = _mode(p, True)
    return m is not None and m & _S_IFMT == _S_IFREG


def _isdir(p):
    m = _mode(p, True)
    return m is not None and m & _S_IFMT == _S_IFDIR


def _islink(p):
    m = _mode(p, False)
    return m is not None and m & _S_IFMT == _S_IFLNK


#: ``os.path``: the functions above; any other name is posixpath's (imported then).
path = type(sys)(__name__ + ".path")
for _name, _fn in (("join", _join), ("split", _split), ("dirname", _dirname), ("basename", _basename),
                   ("isabs", _isabs), ("normpath", _normpath), ("abspath", _abspath), ("exists", _exists),
                   ("lexists", _lexists), ("isfile", _isfile), ("isdir", _isdir), ("islink", _islink)):
    setattr(path, _name, _fn)
path.sep, path.curdir = sep, curdir
path.__getattr__ = _real
del _name, _fn
