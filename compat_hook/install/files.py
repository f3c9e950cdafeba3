"""File helpers shared by every ``compat-hook install`` engine module.

The whole API (nothing else here is meant to be used from outside):

``read_text(path) -> str | None``
    The file's text, ``None`` when it does not exist.
``diff(old, new, path) -> str``
    A unified diff of two texts (``None`` = the file does not exist), with
    ``a/PATH`` / ``b/PATH`` headers; ``""`` when they are equal.
``write_atomic(path, text, mode=None, backup=True) -> str | None``
    Write ``text`` to ``path`` through a temp file in the same directory,
    ``fsync`` and ``rename`` (a reader sees the old or the new file, never
    half of one). Parent directories are created (0755). A symlink at ``path``
    is followed (the file it points to is replaced, the link stays). ``mode``:
    ``None`` keeps the existing file's mode (new files get 0644); owner and
    group of an existing file are kept. Returns the backup's path when a
    previous, *different* file was copied aside (``backup=True``), else
    ``None``. Writing the same bytes again changes nothing (no write, no
    backup).
``remove(path, backup=True) -> str | None``
    Delete ``path`` (a missing file is fine); returns the backup path.
``backup_path(path) -> str``
    The name a backup of ``path`` gets: ``PATH.compat-hook-YYYYmmddTHHMMSS.bak``
    (``-2``, ``-3``... when taken within the same second). The suffix never ends
    in ``.toml``/``.json``/``.conf``, so engines' drop-in globs never load a backup.
``backups_of(path) -> list``
    The backups :func:`backup_path` made of ``path`` (sorted).
``Change(path, new, mode=None, *, backup=None, ours=False, prune=False, restores=False)``
    One planned file change (``new=None``: delete). ``.old``, ``.changed``,
    ``.diff()``. ``backup``: take a backup before replacing (``None``: as
    :func:`apply` says). ``ours``: compat-hook generates the file whole, so
    deleting it takes no backup and also deletes the backups earlier
    changes of it left (nothing of ours stays behind). ``restores``: an
    uninstall taking out only what install added; backups identical to the
    result are dropped (the file is what they hold). ``prune``: after
    deleting it, remove its directory too when that is left empty (and
    then an empty ``libexec`` above it, which the install created for it).
``apply(changes, *, dry_run=False, out=None, backup=True) -> bool``
    Dry run: print the diff of every changed file (``no changes`` when there
    is none). Otherwise write them in order and print one line per file
    (``wrote PATH (backup: B)`` / ``removed PATH``), or ``no changes``.
    Returns whether anything was (or would be) changed.

Every write of a host file in ``compat-hook install`` goes through
:func:`write_atomic`; the container-side writes (``rootfs.Root.write_file``)
are separate, confined to a directory fd.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["read_text", "diff", "write_atomic", "remove", "backup_path", "backups_of", "missing_dirs", "Change", "apply"]


def read_text(path: str) -> str | None:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def diff(old: str | None, new: str | None, path: str) -> str:
    import difflib

    if old == new:
        return ""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    # A last line without a newline would glue onto the next hunk line.
    if a and not a[-1].endswith("\n"):
        a[-1] += "\n\\ No newline at end of file\n"
    if b and not b[-1].endswith("\n"):
        b[-1] += "\n\\ No newline at end of file\n"
    return "".join(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a{path}",
                                        "/dev/null" if new is None else f"b{path}"))


def backup_path(path: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    base = f"{path}.compat-hook-{stamp}"
    cand, n = base + ".bak", 1
    while os.path.lexists(cand):
        n += 1
        cand = f"{base}-{n}.bak"
    return cand


def backups_of(path: str) -> list:
    import glob

    return sorted(glob.glob(glob.escape(path) + ".compat-hook-*.bak"))


def _target(path: str) -> str:
    # Follow a symlinked config (e.g. /etc/containerd/config.toml -> /srv/...).
    return os.path.realpath(path) if os.path.islink(path) else path


def _fsync_dir(d: str) -> None:
    from ..core.atomic import fsync_dir

    fsync_dir(d)


def _copy_aside(path: str) -> str:
    import shutil

    dst = backup_path(path)
    shutil.copy2(path, dst, follow_symlinks=True)
    return dst


def missing_dirs(d: str) -> list:
    """``d`` and its ancestors that do not exist yet (deepest first): what an install creates, and
    records so that uninstall removes those (and no others) once they are empty."""
    out = []
    while d and d != "/" and not os.path.lexists(d):
        out.append(d)
        d = os.path.dirname(d)
    return out


def write_atomic(path: str, text: str, mode: int | None = None, backup: bool = True) -> str | None:
    path = _target(os.path.abspath(path))
    data = text.encode("utf-8")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        with open(path, "rb") as f:
            same = f.read() == data
        if same and (mode is None or (st.st_mode & 0o7777) == mode):
            return None
    d = os.path.dirname(path) or "."
    os.makedirs(d, mode=0o755, exist_ok=True)
    bak = _copy_aside(path) if (backup and st is not None and not same) else None
    want = mode if mode is not None else (st.st_mode & 0o7777 if st is not None else 0o644)
    from ..core.atomic import replace

    replace(path, data, want, owner=(st.st_uid, st.st_gid) if st is not None else None, fsync=True)
    return bak


def remove(path: str, backup: bool = True) -> str | None:
    path = os.path.abspath(path)
    if not os.path.lexists(path):
        return None
    bak = _copy_aside(_target(path)) if backup and os.path.isfile(path) else None
    os.unlink(path)
    _fsync_dir(os.path.dirname(path) or ".")
    return bak


class Change:
    """A planned change of one file: ``new`` text, or ``None`` to delete it."""

    __slots__ = ("path", "new", "mode", "old", "backup", "ours", "prune", "restores")

    def __init__(self, path: str, new: str | None, mode: int | None = None, *, backup: bool | None = None,
                 ours: bool = False, prune: bool = False, restores: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.new = new
        self.mode = mode
        self.backup = backup
        self.ours = ours
        self.prune = prune
        self.restores = restores
        self.old = read_text(_target(self.path)) if os.path.lexists(self.path) else None

    @property
    def changed(self) -> bool:
        if self.new != self.old:
            return True
        if self.new is not None and self.mode is not None:
            return (os.stat(self.path).st_mode & 0o7777) != self.mode
        return False

    def diff(self) -> str:
        d = diff(self.old, self.new, self.path)
        if not d and self.changed:
            d = f"mode of {self.path} -> {self.mode:04o}\n"
        return d

    def __repr__(self) -> str:
        return f"Change({self.path!r}, {'delete' if self.new is None else 'write'})"


#: libexec dirs of the system (FHS) or of other installations: never removed, even when empty.
_SYSTEM_LIBEXEC = ("/usr/libexec", "/usr/local/libexec")


def _prune(d: str, out) -> None:
    """Remove ``d`` when empty, then its parent when that is an empty ``libexec`` (created for it)."""
    for _ in range(2):
        if d in _SYSTEM_LIBEXEC:
            return
        try:
            os.rmdir(d)
        except OSError:  # not empty (someone else's files) or gone
            return
        out.write(f"removed {d}/\n")
        d = os.path.dirname(d)
        if os.path.basename(d) != "libexec":
            return


def apply(changes, *, dry_run: bool = False, out=None, backup: bool = True) -> bool:
    out = out if out is not None else sys.stdout
    todo = [c for c in changes if c.changed]
    if not todo:
        out.write("no changes\n")
        return False
    for c in todo:
        keep = (backup if c.backup is None else c.backup) and not (c.new is None and c.ours)
        if dry_run:
            out.write(c.diff())
            continue
        if c.new is None:
            bak = remove(c.path, backup=keep)
            out.write(f"removed {c.path}" + (f" (backup: {bak})" if bak else "") + "\n")
            if c.ours:
                for old in backups_of(c.path):
                    os.unlink(old)
                    out.write(f"removed {old}\n")
            if c.prune:
                _prune(os.path.dirname(c.path), out)
        else:
            bak = write_atomic(c.path, c.new, mode=c.mode, backup=keep)
            out.write(f"wrote {c.path}" + (f" (backup: {bak})" if bak else "") + "\n")
            if c.restores:
                for old in backups_of(c.path):
                    if read_text(old) == c.new:  # the file is that backup again
                        os.unlink(old)
                        out.write(f"removed {old} (the file is back as it was)\n")
    if dry_run:
        out.write(f"dry run: {len(todo)} file(s) would change; nothing written\n")
    return True
