"""The host compat store's index, as the hook reads it: one JSON file beside each stored package.

``compat-hook store`` (:mod:`compat_hook.commands.store`) writes
``<store_dir>/<version>.json`` next to ``<store_dir>/<version>/`` after
validating the package; this module only reads them back.

>>> is_version_name("550.54.15"), is_version_name("550"), is_version_name("../x")
(True, False, False)
>>> list_entries("/nonexistent")
[]
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start

__all__ = ["is_version_name", "list_entries"]


def is_version_name(name: str) -> bool:
    from ..core.versions import try_parse_version

    return name.count(".") >= 1 and try_parse_version(name) is not None


def list_entries(store_dir: str) -> list:
    """Every stored package's entry, oldest version first (broken ones are skipped)."""
    from ..core import jsonfast
    from ..core.versions import try_parse_version

    try:
        names = os.listdir(store_dir)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        if not n.endswith(".json") or not is_version_name(n[:-5]):
            continue
        try:
            with open(os.path.join(store_dir, n), "rb") as f:
                e = jsonfast.loads(f.read(1 << 20))
        except (OSError, ValueError):
            continue
        if isinstance(e, dict) and e.get("version") == n[:-5] and os.path.isdir(os.path.join(store_dir, n[:-5])):
            e["path"] = os.path.join(store_dir, n[:-5])
            out.append(e)
    out.sort(key=lambda e: try_parse_version(e["version"]) or (0, 0, 0))
    return out
