"""The CUDA runtime an image carries, read from its files: what ``plan`` says the image needs.

The hook decides on what the container's env says (``CUDA_VERSION``,
``NVIDIA_REQUIRE_CUDA``); many images set neither. An image built on
``python`` with pip's PyTorch carries its runtime in the
``nvidia-cuda-runtime-cu12`` wheel, a conda env in ``cuda-cudart``, and an
image that copies a toolkit's libraries only the library. Whether it runs on a
driver is decided by the runtime it loads, so ``plan`` reads every source
there is (:func:`sources`) and takes the highest (:func:`needs`):

* ``libcudart``: ``libcudart.so.X.Y.Z`` (or ``.X``) in the CUDA toolkit's dirs
  (``/usr/local/cuda*/lib64``, ``targets/*/lib``), the distribution's library
  dirs, and the wheels' ``nvidia/cuda_runtime/lib`` and ``nvidia/cu13/lib``;
* ``wheel``: the ``Version`` of ``nvidia_cuda_runtime_cu*-*.dist-info/METADATA``;
* ``torch``: ``cuda = '12.4'`` in ``torch/version.py`` (the runtime PyTorch was built for);
* ``conda``: ``conda-meta/cuda-cudart-<version>-<build>.json`` (or ``cudatoolkit-``);
* ``env``: ``CUDA_VERSION`` / ``NVIDIA_REQUIRE_CUDA`` (the request's own reading).

Sources that name different CUDA versions (major.minor) are a warning: an image
may carry a toolkit and a wheel of different releases; the highest is what the
driver must provide for everything in it to run.

Every read goes through the root object (:class:`~compat_hook.facts.rootfs.Root`
for a dir, the image view for an image) and is bounded: a fixed list of dirs,
at most :data:`MAX_DIRS` Python or conda dirs (8 ``python3*`` dirs a prefix),
:data:`MAX_LISTING` entries a directory, :data:`MAX_READ` bytes a file.

>>> _lib_version("libcudart.so.13.0.48"), _lib_version("libcudart.so.12"), _lib_version("libcudart.so")
((13, 0, 48), (12,), None)
>>> _torch_cuda(b"__version__ = '2.5.1+cu124'\\ncuda: Optional[str] = '12.4'\\n")
(12, 4)
>>> _conda_version("cuda-cudart-12.4.127-h99ab3db_0.json"), _conda_version("cuda-cudart-dev-12.4.127-0.json")
((12, 4, 127), None)
"""

from __future__ import annotations

__all__ = ["sources", "needs", "MAX_DIRS", "MAX_LISTING", "MAX_READ"]

#: Python prefixes / conda envs / CUDA toolkit dirs considered, each.
MAX_DIRS = 32
#: Entries of one directory looked at (a hostile image can make a dir huge).
MAX_LISTING = 100_000
#: Bytes read of a METADATA or version.py file.
MAX_READ = 64 << 10

_LIB = "libcudart.so."
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib/sbsa-linux-gnu",
             "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/local/lib",
             "/opt/conda/lib")
_PY_PREFIXES = ("/usr/lib", "/usr/local/lib", "/usr/lib64", "/opt/conda/lib", "/opt/venv/lib", "/venv/lib",
                "/app/.venv/lib", "/root/.local/lib", "/opt/miniconda3/lib", "/opt/miniforge3/lib")
_CONDA_ROOTS = ("/opt/conda", "/opt/miniconda3", "/opt/miniforge3", "/opt/mamba", "/root/miniconda3",
                "/usr/local")
_WHEEL_LIB_DIRS = ("nvidia/cuda_runtime/lib", "nvidia/cu13/lib")


def _numbers(text: str) -> tuple | None:
    """``"13.0.48"`` -> ``(13, 0, 48)``; None unless 1-3 numeric parts."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _lib_version(name: str) -> tuple | None:
    return _numbers(name[len(_LIB):]) if name.startswith(_LIB) else None


def _conda_version(name: str) -> tuple | None:
    """The version in ``cuda-cudart-<version>-<build>.json`` / ``cudatoolkit-<version>-<build>.json``."""
    for prefix in ("cuda-cudart-", "cudatoolkit-"):
        if name.startswith(prefix) and name.endswith(".json"):
            ver = name[len(prefix):-5].split("-", 1)[0]
            return _numbers(ver)
    return None


def _metadata_version(data: bytes) -> tuple | None:
    """``Version:`` of a wheel's METADATA (its headers come first)."""
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.strip():
            break  # the end of the headers
        if line.startswith("Version:"):
            return _numbers(line[8:].strip().split("+")[0].split("rc")[0].split(".post")[0])
    return None


def _torch_cuda(data: bytes) -> tuple | None:
    """``cuda = '12.4'`` (or ``cuda: Optional[str] = '12.4'``) in torch/version.py; None for a CPU build."""
    for line in data.decode("utf-8", "replace").splitlines():
        s = line.strip()
        if not s.startswith("cuda") or not s[4:5] in (" ", ":", "="):
            continue
        value = s.split("=", 1)[1].strip() if "=" in s else ""
        if len(value) >= 2 and value[0] in "'\"" and value[-1] == value[0]:
            v = _numbers(value[1:-1])
            if v is not None and len(v) >= 2:
                return v
    return None


def _listdir(root, path: str) -> list:
    try:
        return root.listdir(path)[:MAX_LISTING]
    except OSError:
        return []


def _read(root, path: str) -> bytes | None:
    try:
        return root.read_file(path, MAX_READ)
    except OSError:
        return None


def _libs_in(root, d: str, out: list, what: str = "libcudart") -> None:
    """The most precise ``libcudart.so.*`` of each major in ``d``."""
    best: dict = {}
    for name, kind in _listdir(root, d):
        v = _lib_version(name)
        if v is not None and kind in ("file", "symlink") and len(v) > len(best.get(v[0], ((),))[0]):
            best[v[0]] = (v, name)
    for v, name in best.values():
        out.append({"source": what, "path": f"{d.rstrip('/')}/{name}", "version": v})


def _cuda_dirs(root) -> list:
    """``/usr/local/cuda`` and ``/usr/local/cuda-*`` library dirs (``lib64``, ``targets/*/lib``)."""
    tops = ["/usr/local/cuda"] + sorted(f"/usr/local/{n}" for n, k in _listdir(root, "/usr/local")
                                        if n.startswith("cuda-") and k in ("dir", "symlink"))[:MAX_DIRS]
    dirs = []
    for t in tops:
        dirs.append(f"{t}/lib64")
        dirs += [f"{t}/targets/{n}/lib" for n, k in _listdir(root, f"{t}/targets") if k == "dir"][:4]
    return dirs


def _site_dirs(root) -> list:
    """Python ``site-packages`` / ``dist-packages`` dirs under the usual prefixes and conda envs."""
    prefixes = list(_PY_PREFIXES)
    prefixes += [f"/opt/conda/envs/{n}/lib" for n, k in _listdir(root, "/opt/conda/envs") if k == "dir"][:MAX_DIRS]
    out = []
    for p in prefixes:
        pythons = [n for n, k in _listdir(root, p) if n.startswith("python3") and k in ("dir", "symlink")]
        for n in sorted(pythons)[:8]:  # python3, python3.12 ...: a few per prefix, whatever the image holds
            for sub in ("site-packages", "dist-packages"):
                if root.is_dir(f"{p}/{n}/{sub}"):
                    out.append(f"{p}/{n}/{sub}")
        if len(out) >= MAX_DIRS:
            break
    return out[:MAX_DIRS]


def sources(root) -> list:
    """Every CUDA runtime the image's files name: ``[{"source", "path", "version" (tuple)}]``.

    ``root`` reads like :class:`~compat_hook.facts.rootfs.Root`; nothing is followed
    out of it. Duplicates (one file reached as two dirs) are listed once.
    """
    out: list = []
    seen_dirs: set = set()
    for d in _cuda_dirs(root) + list(_LIB_DIRS):
        try:
            real = root.realpath(d)
        except OSError:
            continue
        if real not in seen_dirs:
            seen_dirs.add(real)
            _libs_in(root, d, out)
    for sp in _site_dirs(root):
        for sub in _WHEEL_LIB_DIRS:
            _libs_in(root, f"{sp}/{sub}", out)
        for name, kind in _listdir(root, sp):
            if kind == "dir" and name.startswith("nvidia_cuda_runtime") and name.endswith(".dist-info"):
                meta = f"{sp}/{name}/METADATA"
                data = _read(root, meta)
                v = _metadata_version(data) if data else None
                if v is None:  # the dir's own name: nvidia_cuda_runtime_cu12-12.4.127.dist-info
                    v = _numbers(name[:-len(".dist-info")].rsplit("-", 1)[-1])
                if v is not None:
                    out.append({"source": "wheel", "path": meta, "version": v})
        data = _read(root, f"{sp}/torch/version.py")
        v = _torch_cuda(data) if data else None
        if v is not None:
            out.append({"source": "torch", "path": f"{sp}/torch/version.py", "version": v})
    conda = [f"{r}/conda-meta" for r in _CONDA_ROOTS]
    conda += [f"/opt/conda/envs/{n}/conda-meta" for n, k in _listdir(root, "/opt/conda/envs") if k == "dir"][:MAX_DIRS]
    for d in conda:
        for name, kind in _listdir(root, d):
            v = _conda_version(name)
            if v is not None and kind == "file":
                out.append({"source": "conda", "path": f"{d}/{name}", "version": v})
    uniq, keys = [], set()
    for s in out:
        try:
            key = (s["source"], root.realpath(s["path"]))
        except OSError:
            key = (s["source"], s["path"])
        if key not in keys:
            keys.add(key)
            uniq.append(s)
    return uniq


def _text(v: tuple) -> str:
    return ".".join(str(x) for x in v)


def needs(found: list, env_need=None, env_source: str | None = None) -> dict:
    """What the image needs: the highest of ``found`` (:func:`sources`) and the env's reading.

    Returns ``{"version" (a (major, minor, 0) tuple or None), "source", "sources", "warning"}``;
    ``warning`` when the sources name different CUDA major.minor versions.

    >>> r = needs([{"source": "libcudart", "path": "/usr/local/cuda/lib64/libcudart.so.13.0.48",
    ...             "version": (13, 0, 48)}], (12, 4, 0), "CUDA_VERSION")
    >>> r["version"], r["source"]
    ((13, 0, 0), 'libcudart /usr/local/cuda/lib64/libcudart.so.13.0.48')
    >>> r["warning"]
    'the image names several CUDA versions: 13.0 (libcudart /usr/local/cuda/lib64/libcudart.so.13.0.48), 12.4 (env CUDA_VERSION); planned for the highest, 13.0'
    """
    allv = [dict(s, version=tuple(s["version"])) for s in found]
    if env_need is not None:
        allv.append({"source": "env", "path": env_source or "env", "version": tuple(env_need)})
    if not allv:
        return {"version": None, "source": None, "sources": [], "warning": None}

    def mm(v):  # a major alone (libcudart.so.12) is major.0 at least
        return (v[0], v[1] if len(v) > 1 else 0)

    best = max(allv, key=lambda s: (mm(s["version"]), len(s["version"]), s["source"] != "env"))
    distinct = []
    # major.minor first; a major alone (libcudart.so.12) agrees with any minor of that major
    for s in [s for s in allv if len(s["version"]) > 1] + [s for s in allv if len(s["version"]) == 1]:
        v = s["version"]
        key = (v[0],) if len(v) == 1 else mm(v)
        if not any(k == key or (len(key) == 1 and key[0] == k[0]) for k, _ in distinct):
            distinct.append((key, s))
    label = lambda s: f"{s['source']} {s['path']}"  # noqa: E731
    warning = None
    if len(distinct) > 1:
        warning = ("the image names several CUDA versions: "
                   + ", ".join(f"{_text(k)} ({label(s)})" for k, s in distinct)
                   + f"; planned for the highest, {_text(mm(best['version']))}")
    return {"version": mm(best["version"]) + (0,), "source": label(best),
            "sources": [{"source": s["source"], "path": s["path"], "version": _text(s["version"])} for s in allv],
            "warning": warning}
