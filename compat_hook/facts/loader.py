"""Where the container's dynamic loader looks for ``libcuda.so.1``, in its own order.

glibc's loader maps the first ``libcuda.so.1`` it meets along:

1. ``LD_LIBRARY_PATH``, entry by entry (a missing dir is passed over);
2. the ``DT_RUNPATH`` of the object that asks for it: a conda, pixi or mamba
   env's libraries carry ``$ORIGIN``-relative RUNPATHs, so a process of the env
   searches ``$PREFIX/lib`` (where conda's activation links ``cuda-compat``'s
   files) before the cache;
3. ``/etc/ld.so.cache``, which ``ldconfig`` builds from ``/etc/ld.so.conf``
   *line by line*, each ``include`` expanded in place (its glob's files in name
   order), and then its built-in trusted dirs; for one soname the dir met first
   wins. Every GPU start rebuilds it (the NVIDIA toolkit's ``update-ldcache``,
   compat-hook's own ``ldconfig -r``).

This module reads (2)'s roots and (3)'s order from the image; the decision and
``explain`` (:mod:`compat_hook.policy.toolkit`) walk them. Every read is confined
to the root (:class:`compat_hook.facts.rootfs.Root` or an image view), bounded, and
costs a few lookups on an image without any of it (docs/design.md, "Hot path rules").

>>> c = LdConf([((0.0, ""), "/etc/ld.so.conf:1", "/opt/first"), ((2.0, "a.conf"), "/etc/ld.so.conf.d/a.conf", "/a")],
...            {"/etc/ld.so.conf.d": (1.0, 3.0, ["a.conf"], "*.conf")})
>>> c.dropin_key("00-00-compat-hook.conf") < c.dropin_key("a.conf") < c.dropin_key("b.conf")
True
>>> c.label(c.dropin_key("a.conf"))
'/etc/ld.so.conf.d/a.conf'
"""

from __future__ import annotations

import stat as _stat

__all__ = ["LdConf", "ld_so_conf", "env_prefixes", "TRUSTED", "CONF", "CONF_D", "INCOMPLETE"]

CONF = "/etc/ld.so.conf"
CONF_D = "/etc/ld.so.conf.d"
#: The key of ldconfig's built-in trusted dirs: after every configured line.
TRUSTED = (float("inf"), "")
#: Bounds: an image may plant thousands of files, lines or homes.
MAX_FILES = 512
MAX_LINES = 256
#: ... and at most this many dirs in all (512 files of 256 lines would be 131072).
MAX_ENTRIES = 1024
MAX_DEPTH = 4
MAX_READ = 16384
#: ``include`` patterns expanded per line, and in all (glibc has no bound: a 16 KB line may hold
#: hundreds, each listing the same dir again).
MAX_PATTERNS = 16
MAX_INCLUDES = 64
#: A glob longer than a file name can be (NAME_MAX) matches nothing worth reading.
MAX_GLOB = 255
#: Seconds one reading of an image's configuration may take (a real one takes well under a
#: millisecond); checked between files, patterns and every few hundred names matched.
DEADLINE_S = 0.25
#: The reason codes of a reading that stopped short (:attr:`LdConf.incomplete`).
INCOMPLETE = {
    "ld_so_conf_bounded": "/etc/ld.so.conf and its includes hold more than compat-hook reads (files, lines, "
                          "dirs or include patterns past their bounds): only the first were read",
    "ld_so_conf_deadline": f"/etc/ld.so.conf and its includes were not read within {DEADLINE_S} s: "
                           "only what was read by then counts",
}
MAX_NOTES = 16
MAX_HOMES = 32
MAX_ENVS = 64
MAX_PATH = 16


class LdConf:
    """ldconfig's reading of the image: each configured dir with a sort key, in order.

    ``entries``: ``[(key, source, dir)]`` (``source``: ``/etc/ld.so.conf:LINE`` or
    the included file's path; ``dir`` as written, without a trailing ``/``); a key
    is ``(place, file name)``: files that are not there yet sort among each other
    by name in the gap they fall in;
    ``globs``: for each included dir, ``(first_key, end_key, names, pattern)``, so
    the key of a file that is not there yet (compat-hook's own drop-in, the
    toolkit's ``00-compat-*``) is known: :meth:`dropin_key`;
    ``incomplete``: None, or the reason code (a key of :data:`INCOMPLETE`) of a
    reading that stopped at a bound or at its deadline: what was read is kept,
    and whoever acts on it says so (the hook's log, ``explain``; ``plan`` gives
    no verdict on such an image).
    """

    __slots__ = ("entries", "globs", "notes", "has_conf", "incomplete")

    def __init__(self, entries=(), globs=None, notes=(), has_conf: bool = True, incomplete=None) -> None:
        self.entries = list(entries)
        self.globs = dict(globs or {})
        self.notes = list(notes)
        self.has_conf = has_conf
        self.incomplete = incomplete

    def note(self, text: str, code: str | None = None) -> None:
        """One note (each said once, :data:`MAX_NOTES` at most); ``code``: the reading is incomplete.

        A deadline outranks a bound: it is what stopped the reading.
        """
        if code is not None and self.incomplete != "ld_so_conf_deadline":
            self.incomplete = code
        if text not in self.notes and len(self.notes) < MAX_NOTES:
            self.notes.append(text)

    def why_incomplete(self) -> str | None:
        """The incomplete reading as one line (``CODE: what``), None when complete."""
        if self.incomplete is None:
            return None
        return f"{self.incomplete}: {INCOMPLETE.get(self.incomplete, self.incomplete)}"

    def dropin_key(self, name: str, where: str = CONF_D):
        """The key at which ldconfig would read ``<where>/<name>``; ``None``: no include reads it."""
        g = self.globs.get(where)
        if g is None or not fnmatchcase(name, g[3]):
            return None
        first, end, names, _ = g
        # A file's own lines are at first + (index + 0.5) * step: between files, ties excluded.
        step = (end - first) / (len(names) + 1)
        i = 0
        while i < len(names) and names[i] < name:
            i += 1
        if i < len(names) and names[i] == name:
            return (first + (i + 1) * step, name)
        return (first + (i + 0.5) * step, name)

    def label(self, key) -> str:
        """Where the line at ``key`` comes from, in words."""
        if key == TRUSTED:
            return "ldconfig's trusted dirs"
        key = key[0]
        for d, (first, end, names, _) in self.globs.items():
            if first <= key < end:
                step = (end - first) / (len(names) + 1)
                i = round((key - first) / step - 1)
                if 0 <= i < len(names) and abs(first + (i + 1) * step - key) < 1e-9:
                    return f"{d}/{names[i]}"
                # a file that is not there yet: by its neighbours
                return f"{d}/<{'a file sorting there' if names else 'any file'}>"
        return next((s for k, s, _ in self.entries if k[0] == key), CONF)

    def dirs_before(self, key) -> list:
        """``[(key, source, dir)]`` read before ``key``."""
        return [e for e in self.entries if e[0] < key]


def fnmatchcase(name: str, pattern: str) -> bool:
    """glob(3)'s ``*`` and ``?`` on one file name (``[...]`` taken literally).

    Not :mod:`fnmatch`: it imports ``re`` (~10 ms of a container start, docs/design.md).

    >>> fnmatchcase("00-cuda.conf", "*.conf"), fnmatchcase("a.conf~", "*.conf"), fnmatchcase("x1", "x?")
    (True, False, True)
    >>> fnmatchcase(".hidden.conf", "*.conf")   # glob(3) never matches a leading dot with a wildcard
    False
    """
    if name.startswith(".") and not pattern.startswith("."):
        return False
    if "*" not in pattern and "?" not in pattern:
        return name == pattern
    if pattern.startswith("*") and "*" not in pattern[1:] and "?" not in pattern:
        return name.endswith(pattern[1:])
    # general case: a small backtracking matcher over * and ?
    p = n = 0
    star = -1
    mark = 0
    while n < len(name):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == name[n]):
            p += 1
            n += 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark = p, n
            p += 1
        elif star != -1:
            p = star + 1
            mark += 1
            n = mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def _lines(text: str) -> tuple:
    """``([(number, line)], cut)`` as glibc's ldconfig reads them: lines end at ``\n`` (a ``\r`` stays in
    an include's glob), a NUL ends the line (C strings), ``#`` starts a comment; ``cut``: more than
    :data:`MAX_LINES` lines (the rest not read)."""
    out = []
    lines = text.split("\n", MAX_LINES)
    cut = len(lines) > MAX_LINES and bool(lines[MAX_LINES].strip())
    for n, line in enumerate(lines[:MAX_LINES], 1):
        line = line.split("\0", 1)[0].split("#", 1)[0].strip(" \t\v\f")
        if line.strip():
            out.append((n, line))
    return out, cut


def _read(root, path: str):
    try:
        return root.read_file(path, MAX_READ).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def _squeeze(glob: str) -> str:
    """``glob`` with each run of ``*`` made one (the same matches, a bounded backtrack).

    >>> _squeeze("a***b**"), _squeeze("*.conf")
    ('a*b*', '*.conf')
    """
    while "**" in glob:
        glob = glob.replace("**", "*")
    return glob


class _Stop(Exception):
    """The reading's deadline passed (internal to :func:`ld_so_conf`)."""


def ld_so_conf(root, skip: str | None = None, deadline: float | None = None) -> LdConf:
    """Read ``/etc/ld.so.conf`` as ldconfig does: lines in order, ``include`` globs expanded in place.

    ``skip``: a file name in ``/etc/ld.so.conf.d`` whose lines are left out
    (compat-hook's own drop-in: every start rewrites it); its place stays known.
    A relative include is relative to the including file's dir, as in glibc.

    Bounded in files (:data:`MAX_FILES`), lines, dirs, include patterns (per line
    and in all) and time: each dir is listed once and each glob matched once per
    reading, and the reading stops at ``deadline`` (a ``time.monotonic()`` value;
    default :data:`DEADLINE_S` after the first include). What it could not read is
    :attr:`LdConf.incomplete`, never a hang: an image can plant a 16 KB include
    line over a dir of 20,000 names, each one including it again.

    ``root.ld_so_conf_memo`` (a dict, or absent): the reading is kept there per
    ``skip`` and given again (:attr:`compat_hook.facts.rootfs.Root.ld_so_conf_memo`).
    """
    # The hook's one start reads it twice (the assessment, then the drop-in's write under the
    # rootfs lock): a Root the hook opened carries a memo, so the second costs nothing (~0.3 ms of
    # a fresh process's first start, measured with benchmarks/run.py's hook_compat_dropin row).
    memo = getattr(root, "ld_so_conf_memo", None) if deadline is None else None
    if memo is not None and skip in memo:
        return memo[skip]
    conf = _ld_so_conf(root, skip, deadline)
    if memo is not None:
        memo[skip] = conf
    return conf


def _ld_so_conf(root, skip, deadline) -> LdConf:
    conf = LdConf()
    text = _read(root, CONF)
    if text is None:
        # compat-hook's hook creates it with this one line (effects/ldcache) before its ldconfig runs
        conf.has_conf = False
        conf.notes.append(f"no readable {CONF}: read as 'include {CONF_D}/*.conf', the file compat-hook's "
                          "hook creates")
        text = f"include {CONF_D}/*.conf\n"
    counter = [0.0]
    budget = [MAX_FILES]
    expanded = [0]
    listings: dict = {}   # dir -> the sorted names of its files and links: one listdir per dir
    matched: dict = {}    # (dir, glob) -> names
    texts: dict = {}      # path -> text (a file included twice is read once)
    clock: list = [deadline, None]

    def tick() -> None:
        # The clock is read only once an include is met: an image without one costs nothing more.
        if clock[1] is None:
            from time import monotonic  # a builtin module, loaded by the interpreter itself

            clock[1] = monotonic
            if clock[0] is None:
                clock[0] = monotonic() + DEADLINE_S
        if clock[1]() > clock[0]:
            raise _Stop

    def walk(path: str, text: str, depth: int) -> None:
        base = path.rsplit("/", 1)[0] or "/"
        lines, cut = _lines(text)
        if cut:
            conf.note(f"{path}: more than {MAX_LINES} lines: only the first read", "ld_so_conf_bounded")
        for n, line in lines:
            parts = line.split(None, 1)
            word, rest = parts[0], (parts[1] if len(parts) > 1 else "")
            if word == "include":
                patterns = [p for p in (x.strip(" \t") for x in rest.split(" ")) if p]
                if len(patterns) > MAX_PATTERNS:
                    conf.note(f"{path}:{n}: more than {MAX_PATTERNS} include patterns on one line: only the "
                              f"first {MAX_PATTERNS} read", "ld_so_conf_bounded")
                    patterns = patterns[:MAX_PATTERNS]
                for pattern in patterns:
                    include(pattern if pattern.startswith("/") else f"{base}/{pattern}", depth)
                continue
            if word == "hwcap":
                continue
            if len(conf.entries) >= MAX_ENTRIES:
                conf.note(f"more than {MAX_ENTRIES} dirs configured: only the first read", "ld_so_conf_bounded")
                continue
            d = line.split("=", 1)[0].strip()  # the old "dir=TYPE" form
            if d.startswith("/"):
                conf.entries.append(((counter[0], ""), f"{path}:{n}", d.rstrip("/") or "/"))
                counter[0] += 1.0

    def listing(d: str) -> list:
        names = listings.get(d)
        if names is None:
            try:
                entries = root.listdir(d)
            except (OSError, ValueError):
                entries = []
            names = listings[d] = sorted(n for n, kind in entries if kind in ("file", "symlink"))
        return names

    def match(d: str, glob: str) -> list:
        got = matched.get((d, glob))
        if got is None:
            got = []
            if len(glob.replace("*", "")) <= MAX_GLOB:  # else no file name is long enough
                for i, name in enumerate(listing(d)):
                    if not i & 255:
                        tick()
                    if fnmatchcase(name, glob):
                        got.append(name)
            matched[(d, glob)] = got
        return got

    def include(pattern: str, depth: int) -> None:
        tick()
        if expanded[0] >= MAX_INCLUDES:
            conf.note(f"more than {MAX_INCLUDES} include patterns: only the first {MAX_INCLUDES} read",
                      "ld_so_conf_bounded")
            return
        expanded[0] += 1
        d, _, glob = pattern.rpartition("/")
        d = d or "/"
        first = counter[0]
        names = match(d, _squeeze(glob))
        if len(names) > budget[0]:
            conf.note(f"{len(names)} files match {pattern}: only the first {budget[0]} read", "ld_so_conf_bounded")
            names = names[:budget[0]]
        budget[0] -= len(names)
        # Each file's lines get keys strictly between its neighbours' places.
        step = 1.0
        span = (len(names) + 1) * step
        if d not in conf.globs:
            conf.globs[d] = (first, first + span, names, glob)
        for i, name in enumerate(names):
            if name == skip and d == CONF_D:
                continue
            tick()
            path = f"{d}/{name}"
            sub = texts[path] if path in texts else texts.setdefault(path, _read(root, path))
            if sub is None:
                conf.note(f"{path}: not read")
                continue
            at = (first + (i + 1) * step, name)
            before = len(conf.entries)
            saved = counter[0]
            counter[0] = at[0]
            try:
                if depth < MAX_DEPTH:
                    walk(path, sub, depth + 1)
            finally:
                # the file's own lines share its key, in line order (a stable sort keeps it)
                for j in range(before, len(conf.entries)):
                    k, s, dd = conf.entries[j]
                    conf.entries[j] = (at, s, dd)
                counter[0] = saved
        counter[0] = first + span + 1.0

    try:
        walk(CONF, text, 0)
    except _Stop:
        conf.note(f"{CONF}: not read to the end within {DEADLINE_S} s", "ld_so_conf_deadline")
    if CONF_D not in conf.globs and conf.incomplete is None:
        conf.notes.append(f"{CONF} includes no {CONF_D}/*.conf: a drop-in there is never read")
    return conf


# --------------------------------------------------------------------------- environment roots

#: Where a conda install usually lives when no variable says: conda's, miniforge's and the
#: micromamba image's root, micromamba 1's default for root, pixi's and mamba 2's global roots.
KNOWN_ROOTS = ("/opt/conda", "/root/micromamba", "/opt/micromamba", "/root/.local/share/mamba")
#: Under a user's home: micromamba 2's default root, micromamba 1's, the installers' defaults.
HOME_ROOTS = (".local/share/mamba", "micromamba", "miniconda3", "miniforge3")
#: System dirs on PATH: never an env's bin.
_SYSTEM_BIN = frozenset(("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"))


def _is_dir(root, path: str) -> bool:
    try:
        return _stat.S_ISDIR(root.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _homes(root) -> list:
    """The home dirs ``/etc/passwd`` names for root and for login users (uid >= 1000)."""
    text = _read(root, "/etc/passwd")
    out: list = []
    for line in (text or "").splitlines()[:512]:
        f = line.split(":")
        if len(f) < 7 or not f[5].startswith("/") or f[5] in ("/", "/nonexistent"):
            continue
        try:
            uid = int(f[2])
        except ValueError:
            continue
        if (uid == 0 or 1000 <= uid < 65534) and f[5] not in out:
            out.append(f[5].rstrip("/"))
        if len(out) >= MAX_HOMES:
            break
    return out


def exe_prefix(root, exe: str | None, env=None) -> str | None:
    """The env prefix the container's program lives in (``<prefix>/bin/<exe>`` beside a ``conda-meta``).

    A relative name is looked up along the image's ``PATH``, as ``execvp`` does; its
    libraries' RUNPATH then reaches ``<prefix>/lib`` first.
    """
    if not isinstance(exe, str) or not exe:
        return None
    cands = [exe] if exe.startswith("/") else []
    if not cands and "/" not in exe:
        path = (env or {}).get("PATH")
        for d in (path.split(":") if isinstance(path, str) else [])[:MAX_PATH]:
            if d.startswith("/") and d.rstrip("/") not in _SYSTEM_BIN:
                cands.append(d.rstrip("/") + "/" + exe)
    for c in cands:
        parent = c.rsplit("/", 1)[0]
        if not parent.endswith("/bin"):
            continue
        prefix = parent[:-len("/bin")] or "/"
        if _is_dir(root, prefix + "/conda-meta") and (c == exe or _exists(root, c)):
            return prefix
    return None


def _exists(root, path: str) -> bool:
    try:
        root.stat(path)
        return True
    except (OSError, ValueError):
        return False


def env_prefixes(root, env=None, cwd: str | None = None, roots=KNOWN_ROOTS, exe: str | None = None) -> list:
    """The conda, pixi and mamba prefixes a process of the image may run in: ``[(prefix, why)]``.

    Named ones first (``CONDA_PREFIX``, ``PIXI_PROJECT_ROOT``'s envs, ``MAMBA_ROOT_PREFIX``), then
    ``PATH`` entries whose parent has a ``conda-meta`` (an env put on ``PATH`` by ``ENV``, as pixi and
    micromamba images do), the working dir's ``.pixi/envs/*`` (a pixi project), the well-known roots
    and, for each home of ``/etc/passwd``, micromamba 2's ``~/.local/share/mamba`` and the installers'
    defaults, each with its ``envs/*``. A root that is not there costs one lookup.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); os.makedirs(d + "/app/.pixi/envs/default/conda-meta")
    >>> from compat_hook.facts.rootfs import Root
    >>> with Root(d) as r:
    ...     env_prefixes(r, {"CONDA_PREFIX": "/srv/env"}, cwd="/app")
    [('/srv/env', 'CONDA_PREFIX'), ('/app/.pixi/envs/default', 'a pixi env of /app')]
    """
    env = env or {}
    out: list = []
    seen: set = set()

    def add(p: str, why: str) -> None:
        p = p.rstrip("/") or "/"
        if p not in seen:
            seen.add(p)
            out.append((p, why))

    def envs_of(top: str, why: str) -> None:
        try:
            entries = root.listdir(top + "/envs")
        except (OSError, ValueError):
            return
        for name, kind in sorted(entries)[:MAX_ENVS]:
            if kind in ("dir", "symlink"):
                add(f"{top}/envs/{name}", why)

    named = env.get("CONDA_PREFIX")
    if isinstance(named, str) and named.startswith("/"):
        add(named, "CONDA_PREFIX")
    mine = exe_prefix(root, exe, env) if exe else None
    if mine is not None:
        add(mine, "the container's program")
    projects = []
    pixi = env.get("PIXI_PROJECT_ROOT")
    if isinstance(pixi, str) and pixi.startswith("/"):
        projects.append(pixi.rstrip("/") or "/")
    if isinstance(cwd, str) and cwd.startswith("/") and cwd.rstrip("/") not in projects:
        projects.append(cwd.rstrip("/") or "/")
    path = env.get("PATH")
    if isinstance(path, str):
        for entry in path.split(":")[:MAX_PATH]:
            e = entry.rstrip("/")
            if e.endswith("/bin") and e.startswith("/") and e not in _SYSTEM_BIN:
                prefix = e[:-len("/bin")] or "/"
                if prefix not in seen and _is_dir(root, prefix + "/conda-meta"):
                    add(prefix, "PATH")
    for proj in projects:
        envs_of(proj.rstrip("/") + "/.pixi", f"a pixi env of {proj}")
    tops = []
    mamba = env.get("MAMBA_ROOT_PREFIX")
    if isinstance(mamba, str) and mamba.startswith("/"):
        tops.append((mamba.rstrip("/") or "/", "MAMBA_ROOT_PREFIX"))
    tops += [(r, "a conda root") for r in roots]
    for home in _homes(root):
        tops += [(f"{home}/{sub}", f"a root under {home}") for sub in HOME_ROOTS]
        tops.append((f"{home}/.pixi", f"pixi's global envs under {home}"))
    looked: set = set()
    for top, why in tops:
        if top in looked:
            continue
        looked.add(top)
        if top in seen or not _is_dir(root, top):
            continue  # the common case: one lookup, nothing more
        if not top.endswith("/.pixi"):
            add(top, why)
        envs_of(top, f"an env of {top}")
    return out
