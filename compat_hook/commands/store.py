"""The host compat store: cuda-compat packages kept on the node (``compat-hook store``).

Layout under ``store_dir`` (default ``/var/lib/compat-hook/store``)::

    550.54.15/                 the package's compat dir: libcuda.so.550.54.15,
                               libcuda.so.1 -> ..., libnvidia-ptxjitcompiler..., links kept
    550.54.15.json             what was validated: ELF facts, note, files, source

Only the version directory is ever mounted into a container (read-only);
the metadata stays beside it. Packages are validated with the same ELF
checks as an image's compat driver before they are stored, and the decision
for a container uses the stored ELF facts, so no ELF parsing happens at
container start (:mod:`compat_hook.policy.storefacts` reads them;
:mod:`compat_hook.effects.mounts` is the hook's bind mount).
"""

from __future__ import annotations

import os
import stat as _stat

from ..core.errors import CompatHookError
from ..facts.storeindex import is_version_name as _is_version_name, list_entries

__all__ = ["StoreError", "add", "list_entries", "remove"]


class StoreError(CompatHookError):
    code = "store_error"


def _find_compat_dir(top: str) -> tuple:
    """``(dir, lib)``: the single directory under ``top`` holding a regular libcuda.so.<version>."""
    from ..facts.imagefacts import is_candidate_name

    found = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        libs = [n for n in filenames if is_candidate_name(n)
                and _stat.S_ISREG(os.lstat(os.path.join(dirpath, n)).st_mode)]
        if libs:
            found.append((dirpath, libs))
    if not found:
        raise StoreError(f"{top}: no regular libcuda.so.<version> found (not a cuda-compat package?)")
    if len(found) > 1 or len(found[0][1]) > 1:
        names = ", ".join(os.path.relpath(os.path.join(d, n), top) for d, ls in sorted(found) for n in sorted(ls))
        raise StoreError(f"{top}: several compat drivers, refusing to guess: {names}")
    return found[0][0], found[0][1][0]


def _extract_deb(deb: str, dest: str) -> None:
    import subprocess

    try:
        subprocess.run(["dpkg-deb", "-x", deb, dest], check=True, capture_output=True, timeout=300)
    except FileNotFoundError:
        raise StoreError("dpkg-deb not found: unpack the .deb and add the directory instead") from None
    except subprocess.CalledProcessError as e:
        msg = e.stderr.decode("utf-8", "replace").strip().splitlines()
        raise StoreError(f"{deb}: dpkg-deb failed: {msg[-1] if msg else e.returncode}") from None


def add(store_dir: str, path: str, config) -> dict:
    """Validate and import a package (unpacked dir or .deb); returns its entry."""
    import shutil
    import tempfile

    import json
    from ..facts.elfnote import inspect_elf, machine_for_arch
    from ..core.logjson import timestamp

    if not os.path.exists(path):
        raise StoreError(f"{path}: no such file or directory")
    os.makedirs(store_dir, mode=0o755, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".add-", dir=store_dir)
    try:
        src = path
        if os.path.isfile(path):
            if not path.endswith(".deb"):
                raise StoreError(f"{path}: not a directory or a .deb")
            src = os.path.join(work, "unpacked")
            _extract_deb(path, src)
        cdir, lib = _find_compat_dir(src)
        version = lib[len("libcuda.so."):]
        if version == "1.1":
            raise StoreError(f"{lib}: a Tegra (Orin) compat driver carries no driver version; "
                             "the store holds versioned drivers only")
        if not _is_version_name(version):
            raise StoreError(f"{lib}: the file name carries no driver version")
        with open(os.path.join(cdir, lib), "rb") as f:
            info = inspect_elf(f)
        machine = machine_for_arch(os.uname().machine)
        why = info.loadable_for(machine) if machine else "elf_machine"
        if why is not None:
            from ..policy.decision import REASONS

            detail = f": {info.error}" if info.error else ""
            raise StoreError(f"{lib}: not a loadable libcuda for this host "
                             f"({REASONS.get(why, why)}{detail})")
        final = os.path.join(store_dir, version)
        if os.path.lexists(final):
            raise StoreError(f"compat driver {version} is already stored (store remove {version} first)")
        stage = os.path.join(work, version)
        os.mkdir(stage, 0o755)
        files, skipped = [], []
        for n in sorted(os.listdir(cdir)):
            p = os.path.join(cdir, n)
            st = os.lstat(p)
            if _stat.S_ISREG(st.st_mode):
                shutil.copyfile(p, os.path.join(stage, n), follow_symlinks=False)
                os.chmod(os.path.join(stage, n), 0o644)
                files.append(n)
            elif _stat.S_ISLNK(st.st_mode):
                target = os.readlink(p)
                # Only links to a sibling: the store never points elsewhere.
                if "/" not in target and target not in ("", ".", ".."):
                    os.symlink(target, os.path.join(stage, n))
                    files.append(f"{n} -> {target}")
                else:
                    skipped.append(f"{n} -> {target}")
            else:
                skipped.append(n)
        from ..core.versions import branch_max_cuda, format_version, try_parse_version

        note = info.note.to_dict() if info.note is not None else None
        cuda = note.get("cuda_version") if note else None
        provides = try_parse_version(cuda) if cuda else branch_max_cuda(try_parse_version(version)[0])
        entry = {"version": version, "path": os.path.join(store_dir, version), "files": files,
                 "skipped": skipped, "elf": info.to_dict(), "cuda_version": cuda,
                 "provides_cuda": format_version(provides, 2) if provides else None,
                 "source": os.path.abspath(path), "added": timestamp()}
        if os.path.lexists(final):
            raise StoreError(f"compat driver {version} is already stored (store remove {version} first)")
        meta_tmp = os.path.join(work, "meta.json")
        with open(meta_tmp, "w") as f:
            f.write(json.dumps(entry, indent=2) + "\n")
        os.rename(stage, final)
        os.rename(meta_tmp, final + ".json")
        return entry
    finally:
        shutil.rmtree(work, ignore_errors=True)


def remove(store_dir: str, version: str) -> None:
    import shutil

    if not _is_version_name(version) or "/" in version:
        raise StoreError(f"not a stored version: {version!r}")
    d = os.path.join(store_dir, version)
    if not os.path.isdir(d):
        raise StoreError(f"compat driver {version} is not in the store")
    trash = os.path.join(store_dir, f".remove-{version}-{os.getpid()}")
    os.rename(d, trash)
    try:
        os.unlink(d + ".json")
    except FileNotFoundError:
        pass
    shutil.rmtree(trash, ignore_errors=True)
