"""Facts about the image: its compat dirs, the candidate libcuda in each and what it is.

Read only through a :class:`compat_hook.facts.rootfs.Root`. A candidate is the
single *regular file* named ``libcuda.so.<version>`` (at least two dotted
parts) in a compat dir; directories are ignored, and where the dir holds no
such file, a symlink of that name counts by its target, resolved inside the
root and a regular file (:attr:`ImageFacts.link_targets`: the loader follows
the link); none means no compat there, several means ambiguous (no compat,
like NVIDIA's toolkit). The userland libcuda files of the image's system lib
dirs are facts too (:func:`userland_libcuda`: ``cuda-drivers`` installed in the
image), read for ``explain`` and ``plan``, and by the hook only where the host's
driver is chosen over compat files. The
compat dir is reported as the container resolves it
(``/usr/local/cuda-12.4/compat`` when ``/usr/local/cuda`` links to
``cuda-12.4``), which is what the ld.so drop-in must name.

Every compat dir an image may load from is a candidate dir, in this order:

1. the configured ``compat_dirs`` (``/usr/local/cuda/compat``, ``compat_orin``);
2. conda's ``cuda-compat`` package, ``$PREFIX/cuda-compat``, in each prefix the
   image may use: ``CONDA_PREFIX`` in its env, ``MAMBA_ROOT_PREFIX`` and the
   well-known roots (:data:`CONDA_ROOTS`) with their ``envs/*``; its activation
   script links each file into ``$PREFIX/lib`` (:attr:`ImageFacts.links`),
   which the env's libraries search before the ld cache (their RUNPATH);
3. each compat dir the image's ``LD_LIBRARY_PATH`` names (a versioned
   ``/usr/local/cuda-12.4/compat`` beside ``/usr/local/cuda -> cuda-12.8``).

The first dir holding a candidate fills the :class:`ImageFacts` itself (the
*primary*, where the NVIDIA toolkit looks when it is ``/usr/local/cuda/compat``);
the others are :attr:`ImageFacts.others`, each an :class:`ImageFacts` of its
own; :func:`compat_hook.policy.decision.decide` picks among them. A prefix is
only probed on cheap evidence: a root that does not exist costs one lookup
(docs/design.md, "Hot path rules").

The ELF inspection (pyelftools: its import is the cost, docs/design.md) is cached in the
state dir and reused only for byte-identical input; see :mod:`compat_hook.core.cache`.
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start
import stat as _stat

from ..core.versions import try_parse_version
from . import loader as _loader

__all__ = ["ImageFacts", "gather", "scan_compat_dir", "userland_libcuda", "ldconfig_picks", "is_candidate_name", "host_lib_dir",
           "compat_dropins", "conda_prefixes", "CANDIDATE_PREFIX", "CONTAINER_LIB_DIRS", "CONDA_ROOTS",
           "UNLINKED_DIRS"]

CANDIDATE_PREFIX = "libcuda.so."
_OTHER_LIBS = ("libcudadebugger.so.", "libnvidia-nvvm.so.", "libnvidia-ptxjitcompiler.so.",
               "libnvidia-gpucomp.so.", "libnvidia-tileiras.so.", "libnvidia-pkcs11.so.",
               "libnvidia-pkcs11-openssl3.so.", "libnvidia-nvvm70.so.")
_KNOWN = _OTHER_LIBS + (CANDIDATE_PREFIX,)
#: Where a conda install usually lives when no env variable says (:data:`compat_hook.facts.loader.KNOWN_ROOTS`).
CONDA_ROOTS = _loader.KNOWN_ROOTS
#: The package's own dir under a prefix (conda-forge ``cuda-compat-impl``).
CONDA_COMPAT = "cuda-compat"
#: At most this many ``envs/*`` of one root, compat entries of ``LD_LIBRARY_PATH`` and
#: files of a conda compat dir are looked at (an image can name thousands).
MAX_ENVS = 64
MAX_LD_DIRS = 16
MAX_LINKS = 64


def is_candidate_name(name: str) -> bool:
    """Whether ``name`` is a compat driver's file name (``libcuda.so.<version>``).

    >>> is_candidate_name("libcuda.so.550.54.15"), is_candidate_name("libcuda.so.1")
    (True, False)
    """
    # NVIDIA globs libcuda.so.*.*: at least one dot after the prefix.
    suffix = name[len(CANDIDATE_PREFIX):] if name.startswith(CANDIDATE_PREFIX) else ""
    return "." in suffix and not suffix.startswith(".") and not suffix.endswith(".")


class ImageFacts:
    """What one compat dir carries. ``status`` is ``found``, ``none`` or ``ambiguous``.

    ``origin``: how the dir was found (``configured``, ``conda``,
    ``LD_LIBRARY_PATH``); ``prefix``: the conda prefix of a ``conda`` dir;
    ``links``: files in ``$PREFIX/lib`` that are symlinks resolving into the
    dir (what conda's activation script made); ``others``: the further
    candidate dirs (on the primary only).

    >>> f = ImageFacts(); f.status = "found"; f.compat_dir = "/usr/local/cuda-13.2/compat_orin"
    >>> f.flavour, [x.compat_dir for x in f.all()]
    ('orin', ['/usr/local/cuda-13.2/compat_orin'])
    """

    __slots__ = ("status", "compat_dir", "configured_dir", "candidate", "candidates",
                 "compat_version", "compat_version_text", "tegra_lib", "elf", "elf_source",
                 "other_libs", "dirs_checked", "notes", "origin", "prefix", "links", "others", "package",
                 "link_targets", "userland")

    def __init__(self) -> None:
        self.status = "none"
        self.compat_dir = None          # container-side resolved dir of the candidate
        self.configured_dir = None      # the path it was found through (a compat_dirs entry, ...)
        self.candidate = None           # file name, e.g. libcuda.so.550.54.15
        self.candidates: list = []
        self.compat_version = None      # tuple, None when not a driver version
        self.compat_version_text = None
        self.tegra_lib = False          # libcuda.so.1.1 (Orin): no driver version
        self.elf = None                 # compat_hook.facts.elfnote.ElfInfo
        self.elf_source = None          # "parsed" | "cache"
        self.other_libs: list = []
        self.dirs_checked: list = []
        self.notes: list = []
        self.origin = "configured"
        self.prefix = None
        self.links: list = []
        self.others: list = []
        self.package = None             # conda-meta record of the package, e.g. cuda-compat-impl-550.54.15-h0_0
        self.link_targets: dict = {}    # candidate name -> the regular file its symlink resolves to (in the root)
        self.userland: list = []        # libcuda files of the image's system lib dirs (primary only; userland())

    @property
    def flavour(self) -> str:
        """``orin`` for Jetson Orin's compat (``compat_orin``, ``libcuda.so.1.1``), else ``dgpu``.

        NVIDIA builds Orin's forward-compatibility package apart from the
        SBSA/dGPU one (which Thor and later Jetson use): docs/background.md, "Tegra".
        """
        for d in (self.configured_dir, self.compat_dir):
            if d and d.rstrip("/").rsplit("/", 1)[-1].startswith("compat_orin"):
                return "orin"
        return "orin" if self.tegra_lib else "dgpu"

    def file_of(self, name: str) -> str:
        """The container path of candidate ``name``: the regular file a symlinked candidate resolves to."""
        return self.link_targets.get(name) or f"{(self.compat_dir or '').rstrip('/')}/{name}"

    def all(self) -> list:
        """Every candidate dir: this one (when it holds a candidate) and :attr:`others`."""
        return ([self] if self.status != "none" else []) + list(self.others)

    def to_dict(self) -> dict:
        d = self._own_dict()
        d["others"] = [o._own_dict() for o in self.others]
        return d

    def _own_dict(self) -> dict:
        return {
            "status": self.status,
            "compat_dir": self.compat_dir,
            "configured_dir": self.configured_dir,
            "origin": self.origin,
            "prefix": self.prefix,
            "flavour": self.flavour if self.status != "none" else None,
            "candidate": self.candidate,
            "candidates": list(self.candidates),
            "compat_version": self.compat_version_text,
            "tegra_lib": self.tegra_lib,
            "elf": self.elf.to_dict() if self.elf is not None else None,
            "elf_source": self.elf_source,
            "other_libs": list(self.other_libs),
            "links": list(self.links),
            "package": self.package,
            "link_targets": dict(self.link_targets),
            "userland": list(self.userland),
            "dirs_checked": list(self.dirs_checked),
            "notes": list(self.notes),
        }


def scan_compat_dir(root, path: str):
    """``(resolved_dir, candidates, other_libs)`` for one compat dir, or raises OSError."""
    resolved = root.realpath(path)
    entries = root.listdir(resolved)
    candidates = sorted(n for n, kind in entries if kind == "file" and is_candidate_name(n))
    others = []
    for n, kind in sorted(entries):
        # One C-level startswith over the tuple first: most names match nothing.
        if kind not in ("file", "symlink") or not n.startswith(_KNOWN) or n in candidates:
            continue
        for prefix in _KNOWN:
            if n.startswith(prefix):
                others.append({"name": n, "kind": kind, "version": n[len(prefix):] or None})
                break
    return resolved, candidates, others


def _inspect(root, path: str, state_dir: str | None, use_cache: bool, facts: ImageFacts):
    from .elfinfo import ElfInfo

    f = root.open_regular(path, follow=False)
    try:
        st = os.fstat(f.fileno())
        if use_cache and state_dir:
            from ..core import cache

            hit = cache.get_elf(state_dir, st, f.fileno())
            if hit is not None:
                try:
                    facts.elf, facts.elf_source = ElfInfo.from_dict(hit), "cache"
                    return
                except (ValueError, KeyError, TypeError):
                    facts.notes.append("ignored a malformed cache entry")
        from .elfnote import inspect_elf

        if use_cache and state_dir and _stat.S_ISREG(st.st_mode):
            from ..core import cache

            rec = cache.Recorder(f)
            facts.elf, facts.elf_source = inspect_elf(rec), "parsed"
            cache.put_elf(state_dir, st, facts.elf.to_dict(), rec)
        else:
            facts.elf, facts.elf_source = inspect_elf(f), "parsed"
    finally:
        f.close()


def conda_prefixes(root, env=None, roots=None, cwd=None, exe=None) -> list:
    """The conda, pixi and mamba prefixes an image may use: ``[(prefix, why)]``, probed only on cheap evidence.

    :func:`compat_hook.facts.loader.env_prefixes`: ``CONDA_PREFIX`` as named,
    ``PATH`` entries with a ``conda-meta`` beside them, the working dir's pixi
    envs, ``MAMBA_ROOT_PREFIX``, the well-known roots and each home's, with
    their ``envs/*``.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); os.makedirs(d + "/opt/conda/envs/torch")
    >>> from compat_hook.facts.rootfs import Root
    >>> with Root(d) as r:
    ...     conda_prefixes(r, {"CONDA_PREFIX": "/srv/env"})
    [('/srv/env', 'CONDA_PREFIX'), ('/opt/conda', 'a conda root'), ('/opt/conda/envs/torch', 'an env of /opt/conda')]
    """
    return _loader.env_prefixes(root, env, cwd, _loader.KNOWN_ROOTS if roots is None else roots, exe)


def _links_into(root, prefix: str, resolved: str) -> tuple:
    """``(links, notes)``: the ``$PREFIX/lib`` files that are symlinks into the compat dir ``resolved``.

    conda's activation script links every file of ``$PREFIX/cuda-compat`` into
    ``$PREFIX/lib`` (absolute links); an image built with the env active keeps
    them. A regular libcuda there (a copy) cannot be hidden without hiding
    the whole dir: a note says so.
    """
    links: list = []
    notes: list = []
    try:
        names = sorted(n for n, kind in root.listdir(resolved) if kind in ("file", "symlink")
                       and (n.startswith(_KNOWN) or n == "libcuda.so"))[:MAX_LINKS]
    except OSError:
        return links, notes
    lib = prefix.rstrip("/") + "/lib"
    for n in names:
        path = f"{lib}/{n}"
        try:
            st = root.lstat(path)
        except OSError:
            continue
        if _stat.S_ISLNK(st.st_mode):
            try:
                target = root.realpath(path)
            except OSError:
                continue
            if target.startswith(resolved.rstrip("/") + "/"):
                links.append(path)
        elif _stat.S_ISREG(st.st_mode) and n.startswith("libcuda.so"):
            notes.append(f"{path} is a regular file, not a link into {resolved}: compat-hook cannot hide it "
                         f"without hiding {lib}")
    return links, notes


def _conda_package(root, prefix: str) -> str | None:
    """The conda-meta record of the cuda-compat package in ``prefix`` (``cuda-compat-impl-<ver>-<build>``)."""
    try:
        names = sorted(n for n, _ in root.listdir(prefix.rstrip("/") + "/conda-meta")
                       if n.startswith("cuda-compat") and n.endswith(".json"))
    except OSError:
        return None
    pick = [n for n in names if n.startswith("cuda-compat-impl-")] or names
    return pick[0][:-len(".json")] if pick else None


def gather(root, config, *, state_dir: str | None = None, inspect: bool = True, env=None,
           cwd: str | None = None, conf=None, extra_ld=(), exe: str | None = None,
           userland: bool = False) -> ImageFacts:
    """Find and inspect the compat candidates in the image behind ``root``.

    ``env``: the container's environment (:attr:`compat_hook.facts.container.Request.env`):
    ``CONDA_PREFIX``, ``MAMBA_ROOT_PREFIX``, ``PATH`` and ``LD_LIBRARY_PATH`` name further
    dirs; ``cwd``: the process's working dir (a pixi project); ``conf``: ldconfig's reading of
    the image (:func:`compat_hook.facts.loader.ld_so_conf`), whose dirs holding a libcuda are
    candidates too; ``extra_ld``: ``LD_LIBRARY_PATH`` entries a runtime wrapper took off;
    ``userland``: read :attr:`ImageFacts.userland` (else left for the caller that needs it).
    """
    facts = ImageFacts()
    found: list = []
    seen: set = set()

    def scan(d: str, origin: str, prefix: str | None = None, quiet_missing: bool = False):
        """Whether ``d`` holds a candidate (a new one, or one found through another name); ``None``: no dir."""
        try:
            resolved, candidates, others = scan_compat_dir(root, d)
        except FileNotFoundError:
            if not quiet_missing:
                facts.dirs_checked.append({"dir": d, "resolved": None, "status": "missing"})
            return None
        except NotADirectoryError:
            facts.dirs_checked.append({"dir": d, "resolved": None, "status": "not a directory"})
            return False
        except (OSError, ValueError) as e:
            facts.dirs_checked.append({"dir": d, "resolved": None,
                                       "status": f"unreadable: {getattr(e, 'strerror', None) or e}"})
            return False
        if resolved in seen:
            facts.dirs_checked.append({"dir": d, "resolved": resolved, "status": "checked already"})
            return any(c.compat_dir == resolved for c in found)
        seen.add(resolved)
        targets: dict = {}
        if not candidates and others:
            # a compat dir whose libcuda.so.<version> links elsewhere (/opt/nv/libcuda.so.550.x): the loader
            # follows the link, so its target is the candidate (a regular file, resolved inside the root)
            candidates, targets = _linked_candidates(root, resolved, others)
            # links into a compat dir found already (a conda env's lib links into its cuda-compat) are that
            # dir's candidate reached by another name, not one of their own
            known_files = {f"{f.compat_dir.rstrip('/')}/{n}" for f in found if not f.link_targets for n in f.candidates}
            targets = {n: t for n, t in targets.items() if t not in known_files}
            candidates = [n for n in candidates if n in targets]
            others = [o for o in others if o["name"] not in targets]
        facts.dirs_checked.append({"dir": d, "resolved": resolved, "status": f"{len(candidates)} candidate(s)"
                                   + (" (symlinked)" if targets else "")})
        if not candidates:
            if others and not facts.other_libs and not found:
                facts.other_libs = others
            return False
        c = facts if not found else ImageFacts()
        if c is facts:
            facts.other_libs = []
        c.compat_dir, c.configured_dir, c.other_libs, c.origin, c.prefix = resolved, d, others, origin, prefix
        c.candidates = candidates
        c.link_targets = targets
        for n, t in targets.items():
            c.notes.append(f"{resolved}/{n} links to {t}: the candidate is that file")
        found.append(c)
        if prefix is None and resolved.endswith("/" + CONDA_COMPAT):
            # an env's cuda-compat named by LD_LIBRARY_PATH or a drop-in: its links in $PREFIX/lib count too
            parent = resolved[:-len(CONDA_COMPAT) - 1] or "/"
            try:
                if _stat.S_ISDIR(root.stat(parent + "/conda-meta").st_mode):
                    prefix = parent
            except (OSError, ValueError):
                pass
        if prefix is not None:
            c.links, notes = _links_into(root, prefix, resolved)
            c.notes.extend(notes)
            c.package = _conda_package(root, prefix)
        if len(candidates) > 1:
            c.status = "ambiguous"
            return True
        c.status = "found"
        name = candidates[0]
        c.candidate = name
        suffix = name[len(CANDIDATE_PREFIX):]
        c.compat_version_text = suffix
        if suffix == "1.1":
            c.tegra_lib = True
        elif suffix == suffix.strip():
            # parse_version tolerates surrounding whitespace (for /sys and
            # config values); a file name with it is no version name.
            c.compat_version = try_parse_version(suffix)
        if inspect:
            path = c.file_of(name)
            try:
                _inspect(root, path, state_dir, config.cache, c)
            except OSError as e:
                # The entry was a regular file when listed; a swap since then
                # (or an unreadable file) means we cannot vouch for it.
                c.notes.append(f"cannot open {path}: {e}")
                c.elf = None
        return True

    for d in config.compat_dirs:
        if scan(d, "configured") is False:
            # NGC's images keep the driver in <compat>/lib.real, named through a lib -> lib.real link
            # (which a build may remove) by their own drop-in: the dir the loader really reads.
            for sub in NGC_SUBDIRS:
                if scan(d.rstrip("/") + "/" + sub, "configured", quiet_missing=True):
                    break
    for prefix, _why in conda_prefixes(root, env, cwd=cwd, exe=exe):
        scan(prefix.rstrip("/") + "/" + CONDA_COMPAT, "conda", prefix, quiet_missing=True)
    known = set(config.compat_dirs) | seen
    for e in _ld_entries_with_libcuda(root, env, known, extra_ld)[:MAX_LD_DIRS]:
        scan(e, "LD_LIBRARY_PATH")
    if conf is not None:
        # A dir ldconfig reads (a drop-in, a line of /etc/ld.so.conf) holding a libcuda of its own:
        # /opt/nvidia/compat named only by an image's drop-in is as reachable as the configured dir.
        for _key, _src, d in conf.entries[:MAX_CONF_DIRS]:
            if d in CONTAINER_LIB_DIRS or d in seen:
                continue
            if _may_hold_libcuda(root, d, known):
                scan(d, "ld.so.conf", quiet_missing=True)
    facts.others = found[1:]
    if userland:
        # explain, plan; the hook reads them only where the host's driver is chosen over compat files
        facts.userland = userland_libcuda(root)
    return facts


def _linked_candidates(root, resolved: str, others: list) -> tuple:
    """``(names, {name: target})``: the symlinks of a compat dir named ``libcuda.so.<version>`` whose
    target, resolved inside the root, is a regular file (at most :data:`MAX_LINKS` are followed)."""
    names: list = []
    targets: dict = {}
    for o in others[:MAX_LINKS]:
        n = o["name"]
        if o["kind"] != "symlink" or not is_candidate_name(n):
            continue
        try:
            t = root.realpath(f"{resolved.rstrip('/')}/{n}")
            if not _stat.S_ISREG(root.lstat(t).st_mode):
                continue
        except (OSError, ValueError):
            continue
        if t in targets.values():
            continue
        names.append(n)
        targets[n] = t
    return names, targets


def ldconfig_picks(userland: list, host_dir: str | None = None, driver_text: str | None = None) -> dict:
    """``{dir: file name}``: the ``libcuda.so.1`` ldconfig links in each dir holding a userland libcuda.

    ldconfig keeps one file per soname and dir, the highest version (compared
    number by number): the image's ``libcuda.so.550.x`` beats the host's
    ``libcuda.so.535.x`` mounted beside it in ``host_dir``.

    >>> ldconfig_picks([{"path": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "version": "550.54.15"}],
    ...                "/usr/lib/x86_64-linux-gnu", "535.288.01")
    {'/usr/lib/x86_64-linux-gnu': 'libcuda.so.550.54.15'}
    """
    def key(v: str) -> tuple:
        return tuple(int(x) if x.isdigit() else -1 for x in (v or "").split("."))

    best: dict = {}
    for u in userland:
        d = u["path"].rsplit("/", 1)[0]
        vs = best.setdefault(d, [])
        vs.append(u.get("version") or "")
        if host_dir and d == host_dir.rstrip("/") and driver_text and driver_text not in vs:
            vs.append(driver_text)
    return {d: CANDIDATE_PREFIX + max(vs, key=key) for d, vs in best.items()}


#: The names through which a system lib dir's libcuda is reached (the search, numba's dlopen("libcuda.so")).
_USERLAND_LINKS = ("libcuda.so.1", "libcuda.so")


def in_compat_dir(path: str) -> bool:
    """Whether ``path`` lies in a compat dir: a parent named ``compat``, ``compat_<arch>`` (``compat_orin``),
    ``compat-<version>`` or ``cuda-compat`` (conda's). A dir whose name merely starts with the word
    (``/opt/compat-tools``, ``/srv/compatibility``) is not one.

    >>> in_compat_dir("/usr/local/cuda-12.4/compat/libcuda.so.1"), in_compat_dir("/opt/cuda-compat/lib/x")
    (True, True)
    >>> in_compat_dir("/usr/local/cuda/compat_orin/libcuda.so.1"), in_compat_dir("/opt/compat-12.4/libcuda.so.1")
    (True, True)
    >>> in_compat_dir("/tmp/compat-hook-tests-x/hostlibs/libcuda.so.1"), in_compat_dir("/srv/compatibility/x")
    (False, False)
    """
    for part in path.split("/")[:-1]:
        if part in ("compat", "cuda-compat") or part.startswith("compat_") \
                or (part.startswith("compat-") and part[7:8].isdigit()):
            return True
    return False


def userland_libcuda(root, dirs=None, listed=None) -> list:
    """The libcuda files of the image's system lib dirs: ``[{"path", "name", "version", "via"}]``.

    A userland driver (``cuda-drivers``, ``libnvidia-compute``) installed in the
    image: ``libcuda.so.1`` (and ``libcuda.so``) in ``/usr/lib/x86_64-linux-gnu``
    and the other dirs of :data:`CONTAINER_LIB_DIRS` resolved inside the root to a
    regular ``libcuda.so.<version>`` (``via`` that link), two lookups a dir; then every
    regular ``libcuda.so.<version>`` that no link leads to (``via`` ``None``) in the dirs a
    runtime mounts the host's driver into (``listed``, :data:`UNLINKED_DIRS`): an absolute
    ``dlopen`` maps it, and an ``ldconfig`` at the start (the NVIDIA toolkit's
    ``update-ldcache``) links ``libcuda.so.1`` to it where it is the dir's highest
    version, over the host's file beside it. One listing of each of those dirs that
    exists (names only: :meth:`compat_hook.facts.rootfs.Root.names`; ~1 us an entry,
    a 900-entry multiarch dir +1.0 ms, 4,500 entries +4.2 ms, medians on a busy test
    machine), read only where the host's driver is chosen over compat files, and by
    ``explain`` and ``plan``.
    The host driver's own file is among them once the runtime mounted it: the caller
    tells it apart by its version.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); os.makedirs(d + "/usr/lib/x86_64-linux-gnu")
    >>> open(d + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "w").close()
    >>> os.symlink("libcuda.so.550.54.15", d + "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    >>> open(d + "/usr/lib/x86_64-linux-gnu/libcuda.so.560.28.03", "w").close()
    >>> from compat_hook.facts.rootfs import Root
    >>> with Root(d) as r:
    ...     [(x["path"].rsplit("/", 1)[1], x["via"]) for x in userland_libcuda(r)]
    [('libcuda.so.550.54.15', '/usr/lib/x86_64-linux-gnu/libcuda.so.1'), ('libcuda.so.560.28.03', None)]
    """
    out: list = []
    seen: set = set()
    done: list = []
    for d in CONTAINER_LIB_DIRS if dirs is None else dirs:
        for link in _USERLAND_LINKS:
            via = f"{d}/{link}"
            try:
                p = root.realpath(via)
                if p in seen or not _stat.S_ISREG(root.lstat(p).st_mode):
                    continue
            except (OSError, ValueError):
                continue
            seen.add(p)
            name = p.rsplit("/", 1)[-1]
            if in_compat_dir(p) or not name.startswith(CANDIDATE_PREFIX):
                continue
            out.append({"path": p, "name": name, "version": name[len(CANDIDATE_PREFIX):] or None, "via": via})
    for d in UNLINKED_DIRS if listed is None else listed:
        try:
            r = root.realpath(d)
        except (OSError, ValueError):
            continue
        if r in done or in_compat_dir(r + "/x"):
            continue  # one dir by two names (a link) is listed once; a link into a compat dir never
        done.append(r)
        try:
            # names only, filtered in C: a big image's multiarch dir holds thousands (Root.names)
            # the highest versions first: ldconfig links the highest of a dir, so a cut keeps that one
            names = sorted((n for n in root.names(r, CANDIDATE_PREFIX) if is_candidate_name(n)),
                           key=_version_key, reverse=True)[:MAX_UNLINKED]
        except (OSError, ValueError):
            continue
        for n in names:
            p = f"{r.rstrip('/')}/{n}"
            try:
                if p in seen or not _stat.S_ISREG(root.lstat(p).st_mode):
                    continue  # a link (its target was looked at), a dir: never a fact by its name
            except (OSError, ValueError):
                continue
            seen.add(p)
            out.append({"path": p, "name": n, "version": n[len(CANDIDATE_PREFIX):] or None, "via": None})
    return out


#: At most this many unlinked ``libcuda.so.<version>`` files of one system lib dir are facts.
MAX_UNLINKED = 16


def _version_key(name: str) -> tuple:
    """``libcuda.so.550.54.15`` -> ``(550, 54, 15)``, number by number as ldconfig compares them.

    >>> sorted(["libcuda.so.99.1", "libcuda.so.550.54.15", "libcuda.so.550.9"], key=_version_key)
    ['libcuda.so.99.1', 'libcuda.so.550.9', 'libcuda.so.550.54.15']
    """
    return tuple(int(x) if x.isdigit() else -1 for x in name[len(CANDIDATE_PREFIX):].split("."))
#: The system lib dirs listed for a ``libcuda.so.<version>`` no link leads to: where runtimes mount the host's
#: driver (the NVIDIA toolkit: the host's multiarch dir, ``/usr/lib64`` from a RHEL host; GKE's device plugin),
#: so ldconfig at the start weighs the image's file against the host's there. Not ``/usr/lib``, ``/lib``:
#: their unlinked files are not listed (the links to a file there are looked up).
UNLINKED_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                 "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")


#: NGC's layout: ``<compat>/lib.real`` holds the driver, ``<compat>/lib`` links to it.
NGC_SUBDIRS = ("lib.real", "lib")
#: At most this many dirs of ldconfig's configuration are looked at.
MAX_CONF_DIRS = 128


def _may_hold_libcuda(root, d: str, known=()) -> bool:
    """Whether dir ``d`` may hold a compat libcuda: a compat dir's name, or a ``libcuda.so.1`` in it.

    One lookup for a dir that is neither (the image's ``/usr/local/lib``,
    ``/usr/local/cuda/lib64``): its listing is never read.
    """
    if "compat" in d or d in known:
        # core.ldpath only where a name may be one: the usual start imports nothing more
        from ..core.ldpath import is_compat_entry

        if is_compat_entry(d, known):
            return True
    try:
        root.lstat(d.rstrip("/") + "/libcuda.so.1")
    except (OSError, ValueError):
        return False
    return True


def _ld_entries_with_libcuda(root, env, known, extra=()) -> list:
    """The ``LD_LIBRARY_PATH`` entries that may hold a compat libcuda, in order.

    ``extra``: entries a runtime wrapper took off before this hook ran (its
    annotation), so hook and wrapper see the same candidates.
    """
    value = (env or {}).get("LD_LIBRARY_PATH") or ""
    entries = [e for e in value.split(":") if e.startswith("/")] + [e for e in extra if e.startswith("/")]
    out = []
    for e in entries[:2 * MAX_LD_DIRS]:
        n = e.rstrip("/") or "/"
        if n in CONTAINER_LIB_DIRS or n in out:
            continue
        if _may_hold_libcuda(root, n, known):
            out.append(e)
    return out


#: Container dirs where runtimes put the host driver's libraries (the NVIDIA
#: toolkit's CDI specs and libnvidia-container mount them into the image's
#: multiarch dir; older device plugins used /usr/local/nvidia).
CONTAINER_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                      "/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/lib",
                      "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")


def host_lib_dir(root, driver_text: str | None, dirs=CONTAINER_LIB_DIRS) -> str | None:
    """The container dir (resolved) holding the host driver's ``libcuda.so.<driver_text>``.

    Only the name is looked at: at prestart the runtime's bind mount is not
    visible from the host's mount namespace, only its (empty, regular)
    mount point. A dir inside a compat dir never counts.
    """
    if not driver_text:
        return None
    name = CANDIDATE_PREFIX + driver_text
    for d in dirs:
        try:
            resolved = root.realpath(d)
            st = root.lstat(resolved.rstrip("/") + "/" + name)
        except OSError:
            continue
        if _stat.S_ISREG(st.st_mode) and not in_compat_dir(resolved.rstrip("/") + "/" + name):
            return resolved
    return None


#: At most this many ld.so.conf.d entries are read (an image can plant thousands).
MAX_DROPINS = 512


def compat_dropins(root, own: str = "00-00-compat-hook.conf", limit: int = MAX_DROPINS, conf=None,
                   dirs=()) -> tuple:
    """``(dropins, notes)``: what ldconfig's configuration names that is a compat dir.

    Each is ``{"file", "path", "dirs", "by", "key"}`` in ldconfig's order (the
    key of :class:`compat_hook.facts.loader.LdConf`): the ``/etc/ld.so.conf.d``
    files (``file`` their name) and the lines of ``/etc/ld.so.conf`` itself
    (``file`` ``ld.so.conf:LINE``), naming a compat dir by its name or, with
    ``dirs`` (the candidate dirs, resolved), one resolving into a candidate
    (``/opt/nvidia/compat``). ``00-compat-*.conf`` files are the NVIDIA toolkit's
    ``enable-cuda-compat`` (at this start or a stale one); others are the image's
    (NGC's ``00-cuda-compat.conf``, vLLM's ``cuda-compat.conf``). Only regular
    files are read (bounded, confined to the root); our own drop-in is left out.
    """
    from ..core.ldpath import is_compat_entry

    if conf is None:
        conf = _loader.ld_so_conf(root, skip=own)
    notes = [n for n in conf.notes if "ld.so.conf" in n and "includes no" not in n]
    resolved_dirs = [d.rstrip("/") for d in dirs if d]

    def into_candidate(d: str) -> bool:
        if not resolved_dirs:
            return False
        try:
            r = root.realpath(d)
        except (OSError, ValueError):
            return False
        return any(r == c or r.startswith(c + "/") for c in resolved_dirs)

    out: list = []
    for key, source, d in conf.entries:
        if not (is_compat_entry(d) or into_candidate(d)):
            continue
        top = source.startswith(_loader.CONF + ":")
        path = source.rsplit(":", 1)[0]  # the file; a line of /etc/ld.so.conf itself keeps its number
        name = source[len("/etc/"):] if top else path.rsplit("/", 1)[-1]
        if out and out[-1]["path"] == (source if top else path) and out[-1]["key"] == key:
            out[-1]["dirs"].append(d)
            continue
        by = ("nvidia-toolkit" if name.startswith("00-compat-") and path.startswith(_loader.CONF_D + "/")
              else "image")
        out.append({"file": name, "path": source if top else path, "dirs": [d], "by": by, "key": key})
    return out, notes
