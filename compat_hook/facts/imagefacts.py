"""Facts about the image: its compat dir, the candidate libcuda and what it is.

Read only through a :class:`compat_hook.facts.rootfs.Root`. The candidate is the
single *regular file* named ``libcuda.so.<version>`` (at least two dotted
parts) in the first configured compat dir that holds one; symlinks and
directories are ignored, none means no compat, several means ambiguous (no
compat, like NVIDIA's toolkit). The compat dir is reported as the container
resolves it (``/usr/local/cuda-12.4/compat`` when ``/usr/local/cuda`` links to
``cuda-12.4``), which is what the ld.so drop-in must name.

The ELF inspection (pyelftools: its import is the cost, docs/design.md) is cached in the
state dir and reused only for byte-identical input; see :mod:`compat_hook.core.cache`.
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start
import stat as _stat

from ..core.versions import try_parse_version

__all__ = ["ImageFacts", "gather", "scan_compat_dir", "is_candidate_name", "host_lib_dir",
           "compat_dropins", "CANDIDATE_PREFIX", "CONTAINER_LIB_DIRS"]

CANDIDATE_PREFIX = "libcuda.so."
_OTHER_LIBS = ("libcudadebugger.so.", "libnvidia-nvvm.so.", "libnvidia-ptxjitcompiler.so.",
               "libnvidia-gpucomp.so.", "libnvidia-tileiras.so.", "libnvidia-pkcs11.so.",
               "libnvidia-pkcs11-openssl3.so.", "libnvidia-nvvm70.so.")
_KNOWN = _OTHER_LIBS + (CANDIDATE_PREFIX,)


def is_candidate_name(name: str) -> bool:
    """Whether ``name`` is a compat driver's file name (``libcuda.so.<version>``).

    >>> is_candidate_name("libcuda.so.550.54.15"), is_candidate_name("libcuda.so.1")
    (True, False)
    """
    # NVIDIA globs libcuda.so.*.*: at least one dot after the prefix.
    suffix = name[len(CANDIDATE_PREFIX):] if name.startswith(CANDIDATE_PREFIX) else ""
    return "." in suffix and not suffix.startswith(".") and not suffix.endswith(".")


class ImageFacts:
    """What the image carries. ``status`` is ``found``, ``none`` or ``ambiguous``."""

    __slots__ = ("status", "compat_dir", "configured_dir", "candidate", "candidates",
                 "compat_version", "compat_version_text", "tegra_lib", "elf", "elf_source",
                 "other_libs", "dirs_checked", "notes")

    def __init__(self) -> None:
        self.status = "none"
        self.compat_dir = None          # container-side resolved dir of the candidate
        self.configured_dir = None      # the compat_dirs entry it was found through
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

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "compat_dir": self.compat_dir,
            "configured_dir": self.configured_dir,
            "candidate": self.candidate,
            "candidates": list(self.candidates),
            "compat_version": self.compat_version_text,
            "tegra_lib": self.tegra_lib,
            "elf": self.elf.to_dict() if self.elf is not None else None,
            "elf_source": self.elf_source,
            "other_libs": list(self.other_libs),
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


def gather(root, config, *, state_dir: str | None = None, inspect: bool = True) -> ImageFacts:
    """Find and inspect the compat candidate in the image behind ``root``."""
    facts = ImageFacts()
    for d in config.compat_dirs:
        try:
            resolved, candidates, others = scan_compat_dir(root, d)
        except FileNotFoundError:
            facts.dirs_checked.append({"dir": d, "resolved": None, "status": "missing"})
            continue
        except NotADirectoryError:
            facts.dirs_checked.append({"dir": d, "resolved": None, "status": "not a directory"})
            continue
        except OSError as e:
            facts.dirs_checked.append({"dir": d, "resolved": None,
                                       "status": f"unreadable: {e.strerror or e}"})
            continue
        facts.dirs_checked.append({"dir": d, "resolved": resolved,
                                   "status": f"{len(candidates)} candidate(s)"})
        if not candidates:
            if others and not facts.other_libs:
                facts.other_libs = others
            continue
        facts.compat_dir, facts.configured_dir, facts.other_libs = resolved, d, others
        facts.candidates = candidates
        if len(candidates) > 1:
            facts.status = "ambiguous"
            return facts
        facts.status = "found"
        name = candidates[0]
        facts.candidate = name
        suffix = name[len(CANDIDATE_PREFIX):]
        facts.compat_version_text = suffix
        if suffix == "1.1":
            facts.tegra_lib = True
        elif suffix == suffix.strip():
            # parse_version tolerates surrounding whitespace (for /sys and
            # config values); a file name with it is no version name.
            facts.compat_version = try_parse_version(suffix)
        if inspect:
            path = resolved.rstrip("/") + "/" + name
            try:
                _inspect(root, path, state_dir, config.cache, facts)
            except OSError as e:
                # The entry was a regular file when listed; a swap since then
                # (or an unreadable file) means we cannot vouch for it.
                facts.notes.append(f"cannot open {path}: {e}")
                facts.elf = None
        return facts
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
