"""Stored compat packages as facts: each one an image-like candidate, and the store decision.

The packages were validated when ``compat-hook store add`` stored them
(:mod:`compat_hook.commands.store`); their ELF facts are read back from the JSON kept
beside each one, so no ELF parsing happens at container start.
"""

from __future__ import annotations

__all__ = ["packages", "decide_for"]


def packages(store_dir: str) -> list:
    """Stored packages as :class:`~compat_hook.facts.imagefacts.ImageFacts` (host paths)."""
    from ..facts.storeindex import list_entries

    entries = list_entries(store_dir)
    if not entries:  # the usual store: empty or absent; a container start imports no more for it
        return []
    from ..facts.elfinfo import ElfInfo
    from ..facts.imagefacts import ImageFacts
    from ..core.versions import try_parse_version

    out = []
    for e in entries:
        f = ImageFacts()
        f.status = "found"
        f.compat_dir = e["path"]
        f.candidate = "libcuda.so." + e["version"]
        f.compat_version_text = e["version"]
        f.compat_version = try_parse_version(e["version"])
        try:
            f.elf = ElfInfo.from_dict(e["elf"])
        except (ValueError, KeyError, TypeError):
            continue
        out.append(f)
    return out


def decide_for(host, request, config):
    """The host-store decision for a container whose image has no compat libs."""
    from .decision import decide_store

    pkgs = packages(config.store_dir)
    need = request.required_cuda() if request is not None else (None, None)
    return decide_store(host, request, pkgs, config, need)
