"""What the NVIDIA Container Toolkit does about compat on its own (v1.20 rules), and what wins.

Pure functions over facts already gathered (and :func:`ld_conf`, which
reads the image's ld.so.conf.d); used by ``explain`` (both sides of a start)
and ``plan`` (what the toolkit alone gives after a driver upgrade). The
rules are ``nvidia-cdi-hook enable-cuda-compat``'s
(NVIDIA/nvidia-container-toolkit, cmd/nvidia-cdi-hook/cudacompat):

* it looks only in ``/usr/local/cuda/compat`` for one regular
  ``libcuda.so.*.*`` (resolved in the root); on a Jetson Orin host only in
  ``/usr/local/cuda/compat_orin`` (its CSV mode's
  ``--cuda-compat-container-root``, the fix of its PR #1690): :data:`ORIN_ROOT`;
* with a note and both driver versions: the host branch must be in the
  note's ``driver`` list and the compat driver strictly newer;
* with a note but no host driver version (the Tegra/CSV path passes only
  ``--host-cuda-version``, NVML's CUDA version): the note's CUDA version must
  be strictly newer than the host's;
* without a note (no section, not ELF, bad JSON): with a host CUDA version,
  never; else the compat branch must be newer than the host's;
* the note's ``device`` list, the ELF class and machine are not checked;
* no host version at all: it does nothing.

Which library wins is ldconfig's order (checked against the real
``ldconfig -r`` in tests/test_toolkit_model.py): for one soname the
directory met **first** wins, and ldconfig meets the directories of
``/etc/ld.so.conf`` and its ``include /etc/ld.so.conf.d/*.conf`` (in file
name order) before its own built-in trusted dirs (``/lib``, ``/usr/lib``
plus the multiarch dirs on Debian and Ubuntu, ``/lib64``, ``/usr/lib64`` on
RHEL and Fedora). Those built-ins are the *host's*: the toolkit's
``update-ldcache`` and compat-hook both run the host's ldconfig on the
container root. So ``update-ldcache --folder <host lib dir>`` writes two
drop-ins that fix the order for the image:

* ``00-nvcr-<random>.conf``: the folders neither a drop-in nor the image's
  system dirs name (the host lib dir of a RHEL host in a Debian image, or of
  a Debian host in a RHEL image);
* ``zz-nvcr-<random>.conf``: the image's own system dirs (Debian-like when
  ``/etc/debian_version`` is a file: ``/lib/<triplet>``,
  ``/usr/lib/<triplet>``, ``/lib``, ``/usr/lib``; else ``/lib``, ``/usr/lib``,
  ``/lib64``, ``/usr/lib64``), sorting after nearly every drop-in.

The host libcuda is mounted at its *host* path: ``/usr/lib/<triplet>`` on
Debian and Ubuntu hosts, ``/usr/lib64`` on RHEL hosts. :func:`host_dir_first`
finds the first drop-in naming that dir; :func:`effective` sets the compat
drop-ins (the toolkit's ``00-compat-<uuid>.conf``, the image's own,
compat-hook's ``00-00-compat-hook.conf``) against it, and puts
``LD_LIBRARY_PATH`` (which beats the cache) before both.

>>> from compat_hook.facts.imagefacts import ImageFacts
>>> img = ImageFacts(); img.status = "found"; img.configured_dir = "/usr/local/cuda/compat"
>>> img.compat_dir = "/usr/local/cuda-12.4/compat"; img.compat_version = (550, 54, 15)
>>> would_enable(img, (535, 183, 1))
(True, 'no note: the compat branch 550 is newer than the host branch 535')
>>> would_enable(img, (555, 42, 2))[0]
False
>>> would_enable(img, None, host_cuda_version=(12, 2, 0))
(False, 'no note and a host CUDA version (Tegra): the toolkit never uses compat')
"""

from __future__ import annotations

__all__ = ["COMPAT_ROOT", "ORIN_ROOT", "OUR_DROPIN", "would_enable", "effective", "ld_conf", "system_dirs",
           "host_dir_first", "default_host_dir"]

#: ``--cuda-compat-container-root``'s default, the only dir the toolkit looks in.
COMPAT_ROOT = "/usr/local/cuda/compat"
#: The root its CSV (Tegra) mode passes on a Jetson Orin host ("Orin (nvgpu)" by NVML).
ORIN_ROOT = "/usr/local/cuda/compat_orin"
#: compat-hook's own drop-in (ldcache.DROPIN_PATH's file name).
OUR_DROPIN = "00-00-compat-hook.conf"
#: The sort keys of the toolkit's drop-ins (``<prefix><random>.conf``).
TOOLKIT_COMPAT = "00-compat-"
NVCR_FOLDERS = "00-nvcr-"
NVCR_SYSTEM = "zz-nvcr-"
#: Debian multiarch triplets by machine (the name of the image's multiarch drop-in, ``<triplet>.conf``).
TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
#: At most this many ld.so.conf.d files are read (an image can plant thousands).
MAX_CONF = 512


def _cuda(note) -> tuple | None:
    from ..core.versions import try_parse_version

    return try_parse_version(note.cuda_version) if note is not None and note.cuda_version else None


def _fmt(v: tuple) -> str:
    return ".".join(str(x) for x in v)


def _in_root(image, root: str):
    """The candidate dir of ``image`` found through ``root`` (the toolkit's only dir), or ``None``."""
    every = image.all() if hasattr(image, "all") else [image]
    return next((c for c in every if c.configured_dir == root), None)


def would_enable(image, host_driver, host_cuda_version=None, root: str = COMPAT_ROOT) -> tuple:
    """``(uses_compat, why)``: whether ``enable-cuda-compat`` writes its drop-in.

    ``image``: :class:`~compat_hook.facts.imagefacts.ImageFacts`; ``host_driver``:
    the host version tuple (``--host-driver-version``, the CDI path), or
    ``None``; ``host_cuda_version``: ``(major, minor, 0)`` given as
    ``--host-cuda-version`` (the Tegra/CSV path, which passes no driver
    version), or ``None``; ``root``: the dir it looks in (:data:`ORIN_ROOT`
    on an Orin host).

    >>> from compat_hook.facts.imagefacts import ImageFacts
    >>> from compat_hook.facts.elfnote import CompatNote, ElfInfo
    >>> img = ImageFacts(); img.status = "found"; img.configured_dir = COMPAT_ROOT
    >>> img.compat_version = (1, 1, 0)   # Orin's libcuda.so.1.1
    >>> img.elf = ElfInfo(note=CompatNote(format=1, cuda_version="13.2"))
    >>> would_enable(img, None, host_cuda_version=(13, 1, 0))
    (True, 'the note says CUDA 13.2, newer than the host CUDA 13.1 (no host driver version: Tegra path)')
    >>> would_enable(img, None, host_cuda_version=(13, 2, 0))[0]
    False
    >>> would_enable(img, None)
    (False, "no host driver or CUDA version: the toolkit's hook does nothing")
    """
    if host_driver is None and host_cuda_version is None:
        return False, "no host driver or CUDA version: the toolkit's hook does nothing"
    image = _in_root(image, root) if image is not None else None
    if image is None or image.status != "found":
        if image is not None and image.status == "ambiguous":
            return False, "several libcuda.so.*.* in the compat dir: the toolkit does nothing"
        return False, f"no libcuda.so.*.* in {root}"
    compat = image.compat_version
    elf = image.elf
    note = elf.note if elf is not None else None
    if note is not None and (compat is None or host_driver is None):
        # UseCompat: without both driver versions only the CUDA versions count.
        cuda = _cuda(note)
        if host_cuda_version is None:
            return False, "a note but no host CUDA version and no usable driver versions: never"
        if cuda is None:
            return False, "the note's CUDA version does not parse: never"
        if cuda > tuple(host_cuda_version):
            return True, (f"the note says CUDA {note.cuda_version}, newer than the host CUDA "
                          f"{_fmt(host_cuda_version[:2])} (no host driver version: Tegra path)")
        return False, f"the note says CUDA {note.cuda_version}, not newer than the host CUDA {_fmt(host_cuda_version[:2])}"
    if note is not None:
        if not note.driver:
            return False, "the note lists no driver branches: never"
        if host_driver[0] not in note.driver:
            return False, f"the note's driver list lacks the host branch {host_driver[0]}"
        if not compat > host_driver:
            return False, "the compat driver is not newer than the host's"
        return True, f"the note lists branch {host_driver[0]} and the compat driver is newer"
    if host_cuda_version is not None:
        return False, "no note and a host CUDA version (Tegra): the toolkit never uses compat"
    if compat is None:
        return False, "the compat file name carries no version the toolkit parses"
    if compat[0] > host_driver[0]:
        return True, f"no note: the compat branch {compat[0]} is newer than the host branch {host_driver[0]}"
    return False, f"no note: the compat branch {compat[0]} is not newer than the host branch {host_driver[0]}"


# --------------------------------------------------------------------------- ldconfig's order


def ld_conf(root, limit: int = MAX_CONF, skip: str = OUR_DROPIN, ldconf=None) -> dict:
    """The image's ldconfig configuration as ldconfig reads it: ``{"files", "order", "ldconf", "debian_like", "arch", "notes"}``.

    ``skip``: compat-hook's own drop-in is left out: every start rewrites it
    (or removes it), so an earlier start's file says nothing about the next;
    :func:`effective` adds what the next start writes (``hook_effect``).

    ``order``: ``[(key, label, [dir, ...])]``, every line ldconfig reads in its
    order (:func:`compat_hook.facts.loader.ld_so_conf`: ``/etc/ld.so.conf`` line
    by line, each ``include`` expanded in place); ``files``: the
    ``/etc/ld.so.conf.d`` files among them, ``[(name, [dir, ...])]``. Dirs are
    resolved in the root where they exist (ldconfig skips a dir it met before
    under another name: on a merged-/usr image ``/lib/x86_64-linux-gnu`` *is*
    ``/usr/lib/x86_64-linux-gnu``); ``debian_like``: ``/etc/debian_version`` is a
    regular file (the toolkit's own test); ``arch``: the machine of the image's
    multiarch drop-in (``aarch64-linux-gnu.conf``: ``aarch64``), else ``None``.
    """
    import stat as _stat
    from ..facts import loader

    lc = ldconf if ldconf is not None else loader.ld_so_conf(root, skip=skip)
    order: list = []
    files: list = []
    for key, source, d in lc.entries:
        label = source if source.startswith(loader.CONF + ":") else source.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        r = _resolved(root, d)
        if order and order[-1][0] == key and order[-1][1] == label:
            order[-1][2].append(r)
        else:
            order.append((key, label, [r]))
        if source.startswith(loader.CONF_D + "/"):
            if files and files[-1][0] == label:
                files[-1][1].append(r)
            else:
                files.append((label, [r]))
    try:
        debian_like = _stat.S_ISREG(root.stat("/etc/debian_version").st_mode)
    except (OSError, AttributeError, ValueError):
        debian_like = False
    names = set(lc.globs.get(loader.CONF_D, (0, 0, [], ""))[2])
    arch = next((m for m, t in TRIPLETS.items() if (t + ".conf") in names), None)
    return {"files": files, "order": order, "ldconf": lc, "debian_like": debian_like, "arch": arch,
            "notes": list(lc.notes)}


def _resolved(root, path: str) -> str:
    try:
        return root.realpath(path)
    except (OSError, ValueError):
        return path


def _machine(arch: str | None) -> str:
    if arch:
        return arch
    import os

    m = os.uname().machine
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(m, m)


def system_dirs(debian_like: bool, arch: str | None = "x86_64") -> list:
    """The image's system dirs as ``update-ldcache`` writes them to ``zz-nvcr-*.conf``.

    >>> system_dirs(True, "aarch64")
    ['/lib/aarch64-linux-gnu', '/usr/lib/aarch64-linux-gnu', '/lib', '/usr/lib']
    >>> system_dirs(False, "x86_64")
    ['/lib', '/usr/lib', '/lib64', '/usr/lib64', '/libx32', '/usr/libx32']
    """
    m = _machine(arch)
    if debian_like:
        t = TRIPLETS.get(m)
        return ([f"/lib/{t}", f"/usr/lib/{t}"] if t else []) + ["/lib", "/usr/lib"]
    return ["/lib", "/usr/lib"] + {"x86_64": ["/lib64", "/usr/lib64", "/libx32", "/usr/libx32"],
                                   "aarch64": ["/lib64", "/usr/lib64"]}.get(m, [])


def default_host_dir(conf: dict) -> str:
    """Where the toolkit mounts the host libcuda when the rootfs does not show it yet.

    It mounts it at its host path; this assumes a Debian or Ubuntu host
    (``/usr/lib/<triplet>``). A RHEL host's is ``/usr/lib64``: the
    container's own view (:func:`compat_hook.facts.imagefacts.host_lib_dir`) is
    used whenever the library is already there.
    """
    t = TRIPLETS.get(_machine(conf.get("arch")), "x86_64-linux-gnu")
    return f"/usr/lib/{t}"


def host_dir_first(conf: dict, host_dir: str, *, update_ldcache: bool = True) -> tuple:
    """``(file, why)``: the first line of ldconfig's configuration naming ``host_dir``, or ``(None, why)``.

    ``None``: nothing names it, so ldconfig meets it (if at all) only among its
    trusted dirs, after every configured line. ``update_ldcache``: the
    toolkit's ``update-ldcache --folder host_dir`` runs at this start (the CDI
    trio) and adds ``00-nvcr-*`` or ``zz-nvcr-*``; the file it writes is named
    by its prefix (the random part only breaks ties among its own files).
    ``file`` is a drop-in's name or ``/etc/ld.so.conf:LINE``.

    >>> deb = {"files": [("x86_64-linux-gnu.conf", ["/usr/lib/x86_64-linux-gnu"])], "debian_like": True}
    >>> host_dir_first(deb, "/usr/lib/x86_64-linux-gnu")[0]
    'x86_64-linux-gnu.conf'
    >>> host_dir_first(deb, "/usr/lib64")[0]    # a RHEL host's dir in a Debian image
    '00-nvcr-'
    >>> rhel = {"files": [], "debian_like": False}
    >>> host_dir_first(rhel, "/usr/lib64")[0], host_dir_first(rhel, "/usr/lib64", update_ldcache=False)[0]
    ('zz-nvcr-', None)
    """
    lines = conf.get("order")
    named = [(label, dirs) for _k, label, dirs in lines] if lines is not None else conf["files"]
    first = next(((label, f"{label if label.startswith('/') else '/etc/ld.so.conf.d/' + label} names {host_dir}")
                  for label, dirs in named if host_dir in dirs), None)
    if first is not None:
        return first  # update-ldcache writes no file for a folder the image already names
    if not update_ldcache:
        return None, f"nothing names {host_dir}: ldconfig meets it after every configured dir, if at all"
    if host_dir in system_dirs(conf["debian_like"], conf.get("arch")):
        nvcr = (NVCR_SYSTEM, f"{host_dir} is a system dir of the image: update-ldcache names it in "
                             f"{NVCR_SYSTEM}*.conf")
    else:
        nvcr = (NVCR_FOLDERS, f"update-ldcache names {host_dir} in {NVCR_FOLDERS}*.conf")
    return nvcr


def _key(conf, name):
    """Where ldconfig reads ``name`` (a drop-in's name or prefix, or ``/etc/ld.so.conf:LINE``).

    Without the loader's reading (``conf`` without ``ldconf``), the name itself:
    file name order, every drop-in read by one include. ``None``: never read.
    """
    lc = conf.get("ldconf") if isinstance(conf, dict) else None
    if lc is None:
        return name
    for k, label, _dirs in conf.get("order", ()):
        if label == name:
            return k
    # a prefix (the toolkit's 00-compat-<random>.conf): where its files sort
    return lc.dropin_key(name if name.endswith(".conf") else name + ".conf")


def effective(*, has_compat: bool, toolkit_enables: bool, dropins: list, ld_library_path: list,
              hook_effect: str | None, wrapper_strips: bool, host_first: tuple = (None, ""),
              links: list = (), conf: dict | None = None, ld_path: list | None = None) -> dict:
    """Which libcuda the container loads: ``{"result": "compat"|"host", "by": ...}``.

    The loader's order: ``LD_LIBRARY_PATH``, then an env's RUNPATH (``links``),
    then the ld cache, where the line ldconfig reads first wins.

    ``has_compat``: the image carries a compat libcuda; ``toolkit_enables``:
    :func:`would_enable`; ``dropins``: the compat dirs ldconfig's
    configuration names (:func:`compat_hook.facts.imagefacts.compat_dropins`,
    only dirs that hold a reachable compat libcuda); ``ld_library_path``: compat
    dirs on the image's ``LD_LIBRARY_PATH``; ``ld_path``: instead, every entry
    that holds a libcuda, in order, ``[{"entry", "kind": "compat"|"host"}]`` (an
    earlier host dir wins, a missing dir is not there); ``hook_effect``:
    compat-hook's ``compat``/``host``/``leave`` where its hook runs (``None``:
    not registered); ``wrapper_strips``: the wrapper takes compat dirs off
    ``LD_LIBRARY_PATH``; ``host_first``: :func:`host_dir_first`; ``links``:
    symlinks in an env prefix's ``lib`` into its ``cuda-compat`` dir that are
    still reachable (not masked); ``conf``: :func:`ld_conf` (the order of the
    lines; without it, file name order).

    >>> effective(has_compat=True, toolkit_enables=False, dropins=[], ld_library_path=[], hook_effect="host",
    ...           wrapper_strips=True, links=["/opt/conda/lib/libcuda.so.1"])["result"]
    'compat'

    >>> effective(has_compat=True, toolkit_enables=True, dropins=[], ld_library_path=[],
    ...           hook_effect="host", wrapper_strips=False)
    {'result': 'host', 'by': "compat-hook's drop-in naming the host driver's dir sorts first"}

    An arm64 Debian image's multiarch drop-in sorts *before* ``cuda-compat.conf``:

    >>> arm = ("aarch64-linux-gnu.conf", "/etc/ld.so.conf.d/aarch64-linux-gnu.conf names /usr/lib/aarch64-linux-gnu")
    >>> img = [{"file": "cuda-compat.conf", "dirs": ["/usr/local/cuda/compat"]}]
    >>> effective(has_compat=True, toolkit_enables=False, dropins=img, ld_library_path=[],
    ...           hook_effect=None, wrapper_strips=False, host_first=arm)["result"]
    'host'

    An earlier ``LD_LIBRARY_PATH`` entry holding the host's library wins:

    >>> effective(has_compat=True, toolkit_enables=False, dropins=[], ld_library_path=[], hook_effect=None,
    ...           wrapper_strips=False, ld_path=[{"entry": "/usr/local/nvidia/lib64", "kind": "host"},
    ...                                          {"entry": "/usr/local/cuda/compat", "kind": "compat"}])["result"]
    'host'
    """
    if not has_compat:
        named = [d["dirs"][0] for d in dropins if d.get("dirs")] + list(ld_library_path)
        if named:
            return {"result": "host", "by": (f"{', '.join(named)} named, but no compat libcuda the loader can "
                                             "reach there (a missing dir, a removed link, none or several files)")}
        return {"result": "host", "by": "the image carries no compat libcuda"}
    if ld_path is None:
        ld_path = [{"entry": e, "kind": "compat"} for e in ld_library_path]
    for item in ld_path:
        if item["kind"] == "host":
            return {"result": "host", "by": f"LD_LIBRARY_PATH names {item['entry']}, the host driver's dir, first",
                    "via": "LD_LIBRARY_PATH"}
        if not wrapper_strips:
            return {"result": "compat", "by": f"LD_LIBRARY_PATH names {item['entry']} (beats the ld cache)",
                    "via": "LD_LIBRARY_PATH", "path": item["entry"]}
    if links:
        return {"result": "compat", "by": (f"{links[0]} links into conda's cuda-compat (the env's RUNPATH is "
                                           "searched before the ld cache)"), "via": "link", "path": links[0]}
    host_at, host_why = host_first
    if conf is not None and conf.get("ldconf") is not None:
        def key(name, explicit=None):
            return explicit if explicit is not None else _key(conf, name)
        host_at = key(host_at) if host_at is not None else None
    else:
        def key(name, explicit=None):
            return name

    def where(d):
        f = d["file"]
        return f if f.startswith("/") else (f"/etc/{f}" if f.startswith("ld.so.conf:") else f"/etc/ld.so.conf.d/{f}")

    # (sort key, why, via, path): ``via``/``path`` say which compat dir wins (the caller resolves it)
    compat = [(key(d["file"], d.get("key")), f"{where(d)} names {d['dirs'][0]}", "drop-in", d["dirs"][0])
              for d in dropins if d.get("dirs")]
    if toolkit_enables:
        compat.append((key(TOOLKIT_COMPAT), "the toolkit's enable-cuda-compat drop-in (00-compat-*.conf)",
                       "toolkit", None))
    ours = key(OUR_DROPIN)
    if ours is None and conf is not None and conf.get("ldconf") is not None:
        ours = (-1.0, "")  # no include reads it: the hook names the dir on ldconfig's command line, read first
    if hook_effect == "compat" and ours is not None:
        compat.append((ours, "compat-hook's drop-in names the compat dir and sorts first", "compat-hook", None))
    elif hook_effect == "host" and ours is not None and (host_at is None or ours < host_at):
        host_at, host_why = ours, "compat-hook's drop-in naming the host driver's dir sorts first"
    compat = [c for c in compat if c[0] is not None]
    first = min(compat, key=lambda c: c[0]) if compat else None
    # A tie (one file naming both) is left to the host: ldconfig's line order is not modelled.
    if first is not None and (host_at is None or first[0] < host_at):
        return {"result": "compat", "by": first[1], "via": first[2], "path": first[3]}
    if host_at is None:
        return {"result": "host", "by": "nothing puts the compat dir first"}
    return {"result": "host", "by": host_why}
