"""Facts about the image: its compat dirs, the candidate libcuda in each and what it is.

Read only through a :class:`compat_hook.facts.rootfs.Root`. A candidate is the
single *regular file* named ``libcuda.so.<version>`` (at least two dotted
parts) in a compat dir; symlinks and directories are ignored, none means no
compat there, several means ambiguous (no compat, like NVIDIA's toolkit). The
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

__all__ = ["ImageFacts", "gather", "scan_compat_dir", "is_candidate_name", "host_lib_dir",
           "compat_dropins", "conda_prefixes", "CANDIDATE_PREFIX", "CONTAINER_LIB_DIRS", "CONDA_ROOTS"]

CANDIDATE_PREFIX = "libcuda.so."
_OTHER_LIBS = ("libcudadebugger.so.", "libnvidia-nvvm.so.", "libnvidia-ptxjitcompiler.so.",
               "libnvidia-gpucomp.so.", "libnvidia-tileiras.so.", "libnvidia-pkcs11.so.",
               "libnvidia-pkcs11-openssl3.so.", "libnvidia-nvvm70.so.")
_KNOWN = _OTHER_LIBS + (CANDIDATE_PREFIX,)
#: Where a conda install usually lives when no env variable says: conda's, miniforge's and the
#: micromamba image's root (``/opt/conda``), and micromamba's default root for root.
CONDA_ROOTS = ("/opt/conda", "/root/micromamba")
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
                 "other_libs", "dirs_checked", "notes", "origin", "prefix", "links", "others", "package")

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


def conda_prefixes(root, env=None, roots=CONDA_ROOTS) -> list:
    """The conda prefixes an image may use: ``[(prefix, why)]``, probed only on cheap evidence.

    ``CONDA_PREFIX`` (the env an image built with ``ENV`` or an activation
    runs in) is taken as named; ``MAMBA_ROOT_PREFIX`` and each of ``roots``
    cost one lookup when absent, and when present add their ``envs/*``.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); os.makedirs(d + "/opt/conda/envs/torch")
    >>> from compat_hook.facts.rootfs import Root
    >>> with Root(d) as r:
    ...     conda_prefixes(r, {"CONDA_PREFIX": "/srv/env"})
    [('/srv/env', 'CONDA_PREFIX'), ('/opt/conda', 'a conda root'), ('/opt/conda/envs/torch', 'an env of /opt/conda')]
    """
    out: list = []
    env = env or {}
    named = env.get("CONDA_PREFIX")
    if isinstance(named, str) and named.startswith("/"):
        out.append((named.rstrip("/") or "/", "CONDA_PREFIX"))
    mamba = env.get("MAMBA_ROOT_PREFIX")
    tops = [(mamba.rstrip("/") or "/", "MAMBA_ROOT_PREFIX")] if isinstance(mamba, str) and mamba.startswith("/") else []
    tops += [(r, "a conda root") for r in roots]
    for top, why in tops:
        try:
            if not _stat.S_ISDIR(root.stat(top).st_mode):
                continue
        except OSError:
            continue  # the common case: one lookup, nothing more
        out.append((top, why))
        try:
            entries = root.listdir(top + "/envs")
        except OSError:
            continue
        for name, kind in sorted(entries)[:MAX_ENVS]:
            if kind in ("dir", "symlink"):
                out.append((f"{top}/envs/{name}", f"an env of {top}"))
    return out


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


def _ld_compat_entries(env, known) -> list:
    value = (env or {}).get("LD_LIBRARY_PATH")
    # Most images set one (/usr/local/nvidia/lib...): core.ldpath is imported only when
    # an entry may be a compat dir, so the usual start imports nothing more.
    if not value or ("compat" not in value and not any(k in value for k in known)):
        return []
    from ..core.ldpath import is_compat_entry

    return [e for e in value.split(":") if is_compat_entry(e, known)]


def gather(root, config, *, state_dir: str | None = None, inspect: bool = True, env=None) -> ImageFacts:
    """Find and inspect the compat candidates in the image behind ``root``.

    ``env``: the container's environment (:attr:`compat_hook.facts.container.Request.env`):
    ``CONDA_PREFIX``, ``MAMBA_ROOT_PREFIX`` and ``LD_LIBRARY_PATH`` name further dirs.
    """
    facts = ImageFacts()
    found: list = []
    seen: set = set()

    def scan(d: str, origin: str, prefix: str | None = None, quiet_missing: bool = False) -> None:
        try:
            resolved, candidates, others = scan_compat_dir(root, d)
        except FileNotFoundError:
            if not quiet_missing:
                facts.dirs_checked.append({"dir": d, "resolved": None, "status": "missing"})
            return
        except NotADirectoryError:
            facts.dirs_checked.append({"dir": d, "resolved": None, "status": "not a directory"})
            return
        except OSError as e:
            facts.dirs_checked.append({"dir": d, "resolved": None, "status": f"unreadable: {e.strerror or e}"})
            return
        if resolved in seen:
            facts.dirs_checked.append({"dir": d, "resolved": resolved, "status": "checked already"})
            return
        seen.add(resolved)
        facts.dirs_checked.append({"dir": d, "resolved": resolved, "status": f"{len(candidates)} candidate(s)"})
        if not candidates:
            if others and not facts.other_libs and not found:
                facts.other_libs = others
            return
        c = facts if not found else ImageFacts()
        if c is facts:
            facts.other_libs = []
        c.compat_dir, c.configured_dir, c.other_libs, c.origin, c.prefix = resolved, d, others, origin, prefix
        c.candidates = candidates
        found.append(c)
        if prefix is not None:
            c.links, notes = _links_into(root, prefix, resolved)
            c.notes.extend(notes)
            c.package = _conda_package(root, prefix)
        if len(candidates) > 1:
            c.status = "ambiguous"
            return
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
            path = resolved.rstrip("/") + "/" + name
            try:
                _inspect(root, path, state_dir, config.cache, c)
            except OSError as e:
                # The entry was a regular file when listed; a swap since then
                # (or an unreadable file) means we cannot vouch for it.
                c.notes.append(f"cannot open {path}: {e}")
                c.elf = None

    for d in config.compat_dirs:
        scan(d, "configured")
    for prefix, _why in conda_prefixes(root, env):
        scan(prefix.rstrip("/") + "/" + CONDA_COMPAT, "conda", prefix, quiet_missing=True)
    known = set(config.compat_dirs) | seen
    for e in _ld_compat_entries(env, known)[:MAX_LD_DIRS]:
        scan(e, "LD_LIBRARY_PATH")
    facts.others = found[1:]
    return facts


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
        if _stat.S_ISREG(st.st_mode) and "/compat" not in resolved:
            return resolved
    return None


#: At most this many ld.so.conf.d entries are read (an image can plant thousands).
MAX_DROPINS = 512


def compat_dropins(root, own: str = "00-00-compat-hook.conf", limit: int = MAX_DROPINS) -> tuple:
    """``(dropins, notes)``: the ``/etc/ld.so.conf.d/*.conf`` files naming a compat dir.

    Each is ``{"file": name, "dirs": [...], "by": "nvidia-toolkit" | "image"}``
    in ldconfig's order (file name). ``00-compat-*.conf`` files are the
    NVIDIA toolkit's ``enable-cuda-compat`` (at this start or a stale one);
    others are baked into the image (NGC's ``00-cuda-compat.conf``, vLLM's
    ``cuda-compat.conf``). Only regular files are read (at most 4 KiB each,
    confined to the root); our own drop-in is left out.
    """
    from ..core.ldpath import is_compat_entry

    notes: list = []
    try:
        entries = root.listdir("/etc/ld.so.conf.d")
    except OSError:
        return [], notes
    names = sorted(n for n, kind in entries if n.endswith(".conf") and n != own and kind in ("file", "symlink"))
    if len(names) > limit:
        notes.append(f"{len(names)} drop-ins in /etc/ld.so.conf.d: only the first {limit} read")
        names = names[:limit]
    out = []
    for n in names:
        try:
            text = root.read_file("/etc/ld.so.conf.d/" + n, 4096).decode("utf-8", "replace")
        except OSError as e:  # a symlink out, a FIFO, a vanished file: not a drop-in we can vouch for
            notes.append(f"/etc/ld.so.conf.d/{n}: not read ({getattr(e, 'strerror', None) or e})")
            continue
        dirs = []
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("include") and is_compat_entry(line):
                dirs.append(line)
        if dirs:
            out.append({"file": n, "dirs": dirs,
                        "by": "nvidia-toolkit" if n.startswith("00-compat-") else "image"})
    return out, notes
