"""``compat-hook install|uninstall containerd``: a CRI runtime for compat-hook.

The runtime ``--runtime-name`` (default ``cuda-compat``) is a copy of the
``runc`` runtime (its options included) whose ``options.BinaryName`` is the
node's one runtime wrapper (``--via wrapper``, the default:
:mod:`compat_hook.install.wrapper`) or which gets a ``base_runtime_spec``
holding the hook (``--via base-spec``: ``<main dir>/compat-hook-base-spec.json``,
containerd's own default spec plus the hook at createContainer; app
containers only). ``--engine-config`` is the main file (default
``/etc/containerd/config.toml``).

**containerd 1.6/1.7 (config version 2, CRI plugin ``io.containerd.grpc.v1.cri``):
the main file is edited in place.** containerd 1.x *replaces* a whole
``plugins.<id>`` table from a drop-in (verified by tests/test_install_containerd.py),
so a drop-in holding the runtime would have to hold the whole CRI section, and
a copy taken at install time hides every later edit of config.toml (a
``runtimes.nvidia`` that ``nvidia-ctk runtime configure`` adds,
``restrict_oom_score_adj``). In place, later edits land beside ours, and a
drop-in rendered from config.toml (NVIDIA's ``99-nvidia.toml``) carries ours
along. The runtime's tables are added with tomlkit (comments and formatting
kept, a backup taken); a main file without a CRI section gets containerd's
(from ``containerd config dump``) so the defaults stay. The record,
``<main>.compat-hook-install`` (JSON, 0600; no ``.toml`` suffix, so no
``imports`` glob loads it), holds what was added, the default it replaced and
the file as it was: ``uninstall`` writes that back byte for byte when the file
is still what install wrote, else takes out only our tables (and copies of
them in drop-ins rendered from the file). Only when an imported drop-in
already carries the whole CRI section (hiding config.toml's) is the runtime
written to ``<main dir>/conf.d/99-zz-compat-hook.toml`` instead, with the
complete CRI section from ``containerd config dump`` of the files without it
(its name sorts after NVIDIA's ``99-nvidia.toml``; ``imports`` is extended
when no entry covers it); that drop-in records what install did in its
``# compat-hook-install:`` line, and an install made by an earlier build that
wrote it is migrated to the in-place edit.

**containerd 2.x (version 3, ``io.containerd.cri.v1.runtime``)** merges drop-ins
deeply: the drop-in holds only the runtime (and ``default_runtime_name``).

``--set-as-default`` sets ``default_runtime_name``; the previous one comes back
with ``uninstall``. Over the NVIDIA runtime the wrapper is chained to its
binary (``runtime:`` in compat-hook's config) when that binary is on the node
and no toolkit registration would loop, else the command says the wrapper runs
plain runc.

Idempotent (a second run prints ``no changes`` and touches nothing), every
replaced file is backed up first, ``--dry-run`` prints the unified diff and
writes nothing. After writing, ``containerd config dump`` must show the
runtime, else the previous files are put back and the command fails.
``uninstall`` leaves the wrapper as a pass-through while containerd tasks
created through it exist (:func:`compat_hook.install.wrapper.wrapper_removal`).
"""

from __future__ import annotations

import copy
import os
import sys

from ..core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CompatHookError

__all__ = ["install", "uninstall", "plan_install", "plan_uninstall", "DEFAULT_CONFIG",
           "DROPIN_NAME", "CRI_PLUGIN", "InstallError"]

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DROPIN_NAME = "99-zz-compat-hook.toml"
BASE_SPEC_NAME = "compat-hook-base-spec.json"
#: Version 4 (containerd 2.4's own default) moved server settings, not the CRI runtime table: as 3.
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
RUNC_TYPE = "io.containerd.runc.v2"
STATE_TAG = "# compat-hook-install: "
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


from .hooksd import InstallError  # noqa: E402  (one error class for every engine: exit 1)
from .common import plain, tomlkit_module  # noqa: E402


def _which(name: str):
    import shutil

    return shutil.which(name, path=SAFE_PATH)


def _run(argv: list, what: str, timeout: int = 60) -> str:
    import subprocess

    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout, env={"PATH": SAFE_PATH, "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InstallError(f"{what}: {e}") from None
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()] or [f"exit {p.returncode}"]
        raise InstallError(f"{what} failed: {lines[-1]}")
    return p.stdout


_MAJOR: dict = {}


def containerd_major(binary: str) -> int | None:
    """containerd's major version (``containerd --version``), or None."""
    if binary not in _MAJOR:
        _MAJOR[binary] = _major(binary)
    return _MAJOR[binary]


def _major(binary: str) -> int | None:
    try:
        out = _run([binary, "--version"], "containerd --version", timeout=20)
    except InstallError:
        return None
    for tok in out.split()[2:3]:
        tok = tok.lstrip("v")
        head = tok.split(".")[0]
        if head.isdigit():
            return int(head)
    return None


# -- reading configs --------------------------------------------------------

def _parse(text: str, path: str):
    tomlkit = tomlkit_module()
    try:
        return tomlkit.parse(text)
    except Exception as e:  # tomlkit.exceptions.ParseError and friends
        raise InstallError(f"{path}: not valid TOML: {e}") from None


def _load_plain(text: str, path: str) -> dict:
    """Parse TOML to plain dicts, read-only (tomllib: ~20x faster than tomlkit on a dump)."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return plain(_parse(text, path))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InstallError(f"{path}: not valid TOML: {e}") from None


def _has_glob(p: str) -> bool:
    # containerd 1.6-2.x (resolveImports) globs an entry only when it contains "*".
    return "*" in p


def _expand_imports(entries: list, base_dir: str) -> list:
    """containerd's ``resolveImports``: a glob (``*``) is expanded as given (a relative
    one against the cwd, sorted); another relative path is joined to the file's dir."""
    import glob

    out = []
    for e in entries:
        if _has_glob(e):
            out.extend(os.path.abspath(m) for m in sorted(glob.glob(e)))
        else:
            out.append(e if os.path.isabs(e) else os.path.join(base_dir, e))
    return out


def _covers(entry: str, base_dir: str, target: str) -> bool:
    """Whether an ``imports`` entry names ``target`` (Go filepath.Match: ``*`` stops at ``/``).

    A relative glob depends on containerd's cwd, so it never counts.
    """
    import fnmatch

    if not _has_glob(entry):
        return os.path.normpath(entry if os.path.isabs(entry) else os.path.join(base_dir, entry)) == target
    if not os.path.isabs(entry):
        return False
    pd, pb = os.path.split(os.path.normpath(entry))
    td, tb = os.path.split(target)
    if _has_glob(pd):
        return fnmatch.fnmatchcase(td, pd) and fnmatch.fnmatchcase(tb, pb)
    return pd == td and fnmatch.fnmatchcase(tb, pb)


def _deep_merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


def _merged_from_files(main_path: str, main: dict, version: int, exclude: str) -> dict:
    """The merged config, containerd-style, from the files alone (no binary)."""
    merged = copy.deepcopy(main)
    seen = {os.path.normpath(main_path)}

    def load(entries, base_dir):
        for p in _expand_imports(entries, base_dir):
            p = os.path.normpath(p)
            if p == exclude or p in seen:
                continue
            seen.add(p)
            try:
                with open(p, encoding="utf-8") as f:
                    sub = _load_plain(f.read(), p)
            except FileNotFoundError:
                raise InstallError(f"{main_path}: imports {p}, which does not exist") from None
            plugins = sub.get("plugins")
            if isinstance(plugins, dict):
                tgt = merged.setdefault("plugins", {})
                for pid, table in plugins.items():
                    if version >= 3 and isinstance(table, dict) and isinstance(tgt.get(pid), dict):
                        _deep_merge(tgt[pid], table)
                    else:  # 1.6/1.7: a drop-in's plugin table replaces the whole section
                        tgt[pid] = copy.deepcopy(table)
            imp = sub.get("imports")
            if isinstance(imp, list):
                load([x for x in imp if isinstance(x, str)], os.path.dirname(p))

    imp = main.get("imports")
    load([x for x in imp if isinstance(x, str)] if isinstance(imp, list) else [], os.path.dirname(main_path))
    return merged


def _merged_from_dump(binary: str, main_path: str, main_text: str, main: dict, exclude: str) -> dict:
    """``containerd config dump`` of the main file with our own drop-in left out."""
    import tempfile

    tomlkit = tomlkit_module()
    doc = _parse(main_text, main_path)
    imp = main.get("imports")
    entries = _expand_imports([x for x in imp if isinstance(x, str)] if isinstance(imp, list) else [],
                              os.path.dirname(main_path))
    entries = [e for e in entries if os.path.normpath(e) != exclude]
    if "imports" in doc or entries:
        arr = tomlkit.array()
        arr.extend(entries)
        doc["imports"] = arr
    with tempfile.TemporaryDirectory(prefix="compat-hook-ctrd-") as d:
        tmp = os.path.join(d, "config.toml")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(tomlkit.dumps(doc))
        out = _run([binary, "--config", tmp, "config", "dump"], f"{binary} --config {main_path} config dump")
    return _load_plain(out, "containerd config dump")


def _dump(binary: str, main_path: str) -> dict:
    out = _run([binary, "--config", main_path, "config", "dump"], f"{binary} --config {main_path} config dump")
    return _load_plain(out, "containerd config dump")


# -- the plan -----------------------------------------------------------------

def _read(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _state_of(dropin_text: str | None) -> dict:
    import json

    for line in (dropin_text or "").splitlines():
        if line.startswith(STATE_TAG):
            try:
                st = json.loads(line[len(STATE_TAG):])
            except ValueError:
                return {}
            return st if isinstance(st, dict) else {}
    return {}


def _version(main_text: str | None, main: dict, path: str, binary: str | None) -> int:
    if main_text is None or not main:
        major = containerd_major(binary) if binary else None
        return 3 if major is not None and major >= 2 else 2
    v = main.get("version")
    if v is None:
        raise InstallError(f"{path}: no 'version' key: a version 1 config, which compat-hook does not edit "
                           f"(migrate it first: containerd config migrate)")
    if v not in (2, 3, 4):
        raise InstallError(f"{path}: config version {v!r} is not supported (2, 3 or 4)")
    return v


class Plan:
    """What install/uninstall would write: :class:`~compat_hook.install.files.Change` list + notes."""

    record_path = None
    state_dir = None
    #: ``--set-as-default`` over the NVIDIA runtime: its binary, which the wrapper then execs.
    chain = None

    def __init__(self) -> None:
        self.changes: list = []
        self.notes: list = []
        self.main_path = None
        self.dropin_path = None
        self.runtime_name = None
        self.via = None
        self.version = None
        self.binary = None


def plan_install(opts) -> Plan:
    import json
    from ..core.config import DEFAULT_PATH
    from .checks import enforce
    from .files import Change

    tomlkit = tomlkit_module()
    plan = Plan()
    main_path = os.path.abspath(opts.config or DEFAULT_CONFIG)
    name = opts.runtime_name if opts.runtime_name is not None else "cuda-compat"
    if not name or any(c in name for c in " \t\n\"'[]."):
        raise InstallError(f"--runtime-name {name!r}: use letters, digits, '-' and '_'")
    via = opts.via or "wrapper"
    enforce(opts.hook_config, "wrapper" if via == "wrapper" else "hook", plan.notes.append)
    hook_config = os.path.abspath(opts.hook_config) if opts.hook_config else DEFAULT_PATH
    state_dir = os.path.abspath(opts.state_dir) if opts.state_dir else None
    mode = opts.config_source or "auto"
    binary = _which("containerd")
    if mode == "command" and binary is None:
        raise InstallError("--config-source command: containerd is not installed")
    main_text = _read(main_path)
    doc = _parse(main_text or "", main_path)
    main = plain(doc)
    version = _version(main_text, main, main_path, binary)
    conf_d = os.path.join(os.path.dirname(main_path), "conf.d")
    dropin = os.path.join(conf_d, DROPIN_NAME)
    old_dropin = _read(dropin)
    prev = _state_of(old_dropin)
    plan.main_path, plan.dropin_path, plan.runtime_name, plan.via = main_path, dropin, name, via
    plan.version = version
    plan.record_path = record_path(main_path)
    plan.state_dir = _containerd_state(main)
    if version == 2:
        in_place = _plan_in_place(opts, plan, doc=doc, main_text=main_text, main=main, binary=binary,
                                  mode=mode, dropin=dropin, old_dropin=old_dropin, name=name, via=via,
                                  hook_config=hook_config, state_dir=state_dir)
        if in_place is not None:
            return in_place

    # The main file: version (new/empty files) and imports.
    state = {"main": main_path, "runtime": name, "via": via}
    for k in ("main_created", "version_added", "conf_d_created"):
        if prev.get(k):
            state[k] = True
    edited = False
    if main_text is None:
        state["main_created"] = True
    if not os.path.isdir(conf_d):
        state["conf_d_created"] = True
    if "version" not in doc:
        doc["version"] = version
        state["version_added"] = edited = True
    imports = doc.get("imports")
    if imports is not None and not isinstance(plain(imports), list):
        raise InstallError(f"{main_path}: 'imports' is not a list")
    entries = [x for x in (plain(imports) or []) if isinstance(x, str)]
    base_dir = os.path.dirname(main_path)
    if not any(_covers(e, base_dir, dropin) for e in entries):
        glob_entry = os.path.join(conf_d, "*.toml")
        if imports is None:
            arr = tomlkit.array()
            arr.append(glob_entry)
            doc["imports"] = arr
            state["imports_key_added"] = True
        else:
            doc["imports"].append(glob_entry)
        state["imports_added"] = glob_entry
        edited = True
    elif prev.get("imports_added") and prev["imports_added"] in entries:
        state["imports_added"] = prev["imports_added"]
        if prev.get("imports_key_added"):
            state["imports_key_added"] = True
    new_main = tomlkit.dumps(doc) if edited else main_text

    # The merged configuration, without our drop-in. The dump is used when
    # the installed containerd speaks this config version (1.x: 2, 2.x: 3).
    exclude = os.path.normpath(dropin)
    major = containerd_major(binary) if binary is not None else None
    speaks = binary is not None and major is not None and (major >= 2) == (version >= 3)
    # The post-install check needs a containerd that reads this config version.
    plan.binary = binary if speaks else None
    if speaks and mode != "file":
        merged = _merged_from_dump(binary, main_path, main_text or "", main, exclude)
        state["source"] = "containerd config dump"
    else:
        if mode == "command":
            raise InstallError(f"--config-source command: containerd {major} does not use config version {version}")
        merged = _merged_from_files(main_path, main, version, exclude)
        state["source"] = "files"
    plugin = CRI_PLUGIN[version]
    cri = copy.deepcopy((merged.get("plugins") or {}).get(plugin) or {})
    if not isinstance(cri, dict):
        raise InstallError(f"{main_path}: plugins.{plugin!r} is not a table")
    ctrd = cri.setdefault("containerd", {})
    runtimes = ctrd.setdefault("runtimes", {})
    default_name = ctrd.get("default_runtime_name") or "runc"
    rt, state["copied_from"] = _runtime_source(cri, name)
    options = rt["options"]

    plan.changes.extend(_route(rt, options, via, opts, main_path, hook_config, state_dir, state))
    # Switching --via (or --wrapper-path): what the previous install wrote goes.
    plan.changes.extend(_replaced(state, prev))

    if version == 2:
        # The complete CRI section (1.6/1.7 replace it whole), plus our runtime.
        if default_name not in runtimes and default_name == "runc":
            runtimes["runc"] = {"runtime_type": RUNC_TYPE}
        runtimes[name] = rt
        if opts.set_as_default:
            ctrd["default_runtime_name"] = name
        section = cri
    else:
        section = {"containerd": {"runtimes": {name: rt}}}
        if opts.set_as_default:
            section["containerd"]["default_runtime_name"] = name

    out = tomlkit.document()
    for line in (
        f"Written by `compat-hook install containerd`: the runtime {name!r} "
        f"({'compat-hook-runtime wrapper' if via == 'wrapper' else 'compat-hook hook in a base_runtime_spec'}).",
        "Remove it with `compat-hook uninstall containerd`; do not edit (a re-install rewrites it).",
    ) + ((
        "containerd 1.6/1.7 replace a whole plugin section from a drop-in, so this file carries the",
        f"complete CRI section ({state['source']}); re-run the install after changing the CRI",
        f"settings in {main_path}.",
    ) if version == 2 else ()):
        out.add(tomlkit.comment(line))
    out.add(tomlkit.comment(STATE_TAG[2:] + json.dumps(state, sort_keys=True, separators=(",", ":"))))
    out.add(tomlkit.nl())
    out["version"] = version
    plugins = tomlkit.table(is_super_table=True)
    plugins[plugin] = section
    out["plugins"] = plugins
    text = tomlkit.dumps(out)
    plan.changes.insert(0, Change(dropin, text, mode=0o644, ours=True))
    if new_main != main_text:
        plan.changes.insert(0, Change(main_path, new_main, mode=None))
    plan.notes.append(f"restart containerd to load the runtime {name!r}; pods select it with "
                      f"runtimeClassName (a RuntimeClass whose handler is {name!r}: "
                      "packaging/kubernetes/compat-hook.yaml)")
    return plan


RECORD_SUFFIX = ".compat-hook-install"


def _route(rt: dict, options: dict, via: str, opts, main_path: str, hook_config, state_dir, state: dict) -> list:
    """Point runtime table ``rt`` at compat-hook; the changes that takes, ``state`` told what it names.

    ``wrapper``: the runtime wrapper as ``options.BinaryName``; ``base-spec``: a
    ``base_runtime_spec`` beside the main file carrying compat-hook's hook.
    """
    from .files import Change
    from .wrapper import fail_closed, wrapper_change, wrapper_path

    if via == "wrapper":
        wrapper = wrapper_path(opts)
        options["BinaryName"] = wrapper
        state["wrapper"] = wrapper
        return list(wrapper_change(opts))
    base_spec = os.path.join(os.path.dirname(main_path), BASE_SPEC_NAME)
    rt["base_runtime_spec"] = base_spec
    state["base_spec"] = base_spec
    return [Change(base_spec, _base_spec_text(hook_config, state_dir, fail_closed(opts.hook_config)),
                   mode=0o644, ours=True)]


def _replaced(state: dict, *earlier: dict) -> list:
    """Removals of the wrapper or base spec an earlier install (``earlier`` records) wrote and ``state`` no longer names."""
    from .files import Change

    out = []
    for key in ("wrapper", "base_spec"):
        for rec in earlier:
            old = rec.get(key)
            if isinstance(old, str) and old != state.get(key) and _is_ours(key, old):
                out.append(Change(old, None, ours=True, prune=_own_dir(old)))
    return out


def record_path(main_path: str) -> str:
    """The record of an in-place install beside the main file (no .toml suffix: no import glob loads it)."""
    return main_path + RECORD_SUFFIX


def _read_record(path: str) -> dict:
    import json

    text = _read(path)
    if not text:
        return {}
    try:
        rec = json.loads(text)
    except ValueError:
        raise InstallError(f"{path}: not compat-hook's install record (not JSON); move it away") from None
    return rec if isinstance(rec, dict) else {}


def _containerd_state(main: dict) -> str:
    """containerd's ``state`` dir (its tasks' bundles live there), default ``/run/containerd``."""
    st = main.get("state") if isinstance(main, dict) else None
    return st if isinstance(st, str) and os.path.isabs(st) else "/run/containerd"


def _runtime_source(cri: dict, name: str) -> tuple:
    """``(runtime table copy, copied from)``: runc's, else the default runtime's (never ``name`` itself)."""
    runtimes = ((cri.get("containerd") or {}).get("runtimes") or {}) if isinstance(cri, dict) else {}
    default_name = ((cri.get("containerd") or {}).get("default_runtime_name") or "runc") if isinstance(cri, dict) \
        else "runc"
    src, src_name = runtimes.get("runc"), "runc"
    if not isinstance(src, dict):
        src_name = default_name if default_name != name else None
        src = runtimes.get(src_name) if src_name else None
    rt = copy.deepcopy(src) if isinstance(src, dict) else {}
    if not rt.get("runtime_type"):
        rt["runtime_type"] = RUNC_TYPE
    rt.setdefault("options", {})
    return rt, (src_name if isinstance(src, dict) else None)


def _hiding_dropins(main_path: str, main: dict, exclude: str, plugin: str) -> list:
    """Imported files (not ``exclude``) that carry the whole CRI table: in 1.x the last one hides the main's."""
    imp = main.get("imports")
    out = []
    for p in _expand_imports([x for x in imp if isinstance(x, str)] if isinstance(imp, list) else [],
                             os.path.dirname(main_path)):
        p = os.path.normpath(p)
        if p == exclude or p == os.path.normpath(main_path):
            continue
        try:
            with open(p, encoding="utf-8") as f:
                sub = _load_plain(f.read(), p)
        except (OSError, InstallError):
            continue
        if isinstance((sub.get("plugins") or {}).get(plugin), dict):
            out.append(p)
    return out


def _nvidia_chain(cri: dict, name: str, opts, plan) -> None:
    """``--set-as-default`` over ``default_runtime_name = "nvidia"``: say what the wrapper runs then."""
    ctrd = cri.get("containerd") or {}
    default = ctrd.get("default_runtime_name")
    if not opts.set_as_default or not isinstance(default, str) or default in ("runc", name):
        return
    prev = (ctrd.get("runtimes") or {}).get(default) or {}
    binary = (prev.get("options") or {}).get("BinaryName") if isinstance(prev, dict) else None
    if not (isinstance(binary, str) and "nvidia-container-runtime" in os.path.basename(binary)):
        plan.notes.append(f"note: default_runtime_name was {default!r}; pods without runtimeClassName now run "
                          f"{name!r}, whose wrapper execs compat-hook's `runtime:` (runc unless set)")
        return
    from . import toolkit_configs

    found = binary if os.path.isabs(binary) else _which(binary)
    if not (found and os.path.isfile(found) and os.access(found, os.X_OK)):
        plan.notes.append(f"warning: default_runtime_name was {default!r}, whose binary {binary} is not on this "
                          f"node: pods without runtimeClassName now run {name!r}, whose wrapper execs plain runc "
                          f"(compat-hook's `runtime:`)")
        return
    if toolkit_configs(opts):
        plan.notes.append(
            f"warning: default_runtime_name was {default!r} ({binary}); pods without runtimeClassName now run "
            f"{name!r}: its wrapper execs compat-hook's `runtime:` (runc), NOT the NVIDIA runtime, so the toolkit "
            f"no longer injects their GPUs. The {default!r} runtime already reaches compat-hook (the toolkit "
            f"registration puts the wrapper first in its runtimes), so drop --set-as-default to keep {default!r} "
            f"the default")
        return
    plan.chain = found
    plan.notes.append(f"note: default_runtime_name was {default!r}: compat-hook's config gets `runtime: {found}`, "
                      f"so the wrapper chains to the NVIDIA runtime for every pod (uninstall takes the line out "
                      f"and gives {default!r} back as the default)")


def _plan_in_place(opts, plan, *, doc, main_text, main, binary, mode, dropin, old_dropin, name, via,
                   hook_config, state_dir):
    """containerd 1.6/1.7 (config version 2): the runtime table written into the main file itself.

    ``None`` when a drop-in carrying the whole CRI section hides the main file's
    (the drop-in route then, as NVIDIA's own ``99-nvidia.toml`` layout needs).
    Every tool that later edits config.toml (``nvidia-ctk runtime configure``,
    the GPU Operator's toolkit, an admin) edits the file that holds our runtime,
    and a drop-in rendered from config.toml copies it along: nothing hides it.
    """
    import json
    from .files import Change

    tomlkit = tomlkit_module()
    main_path, plugin = plan.main_path, CRI_PLUGIN[2]
    rec_path = plan.record_path
    imports = doc.get("imports")
    if imports is not None and not isinstance(plain(imports), list):
        raise InstallError(f"{main_path}: 'imports' is not a list")
    prev = _read_record(rec_path)
    exclude = os.path.normpath(dropin)
    legacy = _state_of(old_dropin) if old_dropin is not None else {}
    if old_dropin is not None and not legacy:
        raise InstallError(f"{dropin} exists and is not compat-hook's; move it away")

    # The legacy drop-in of an earlier install goes; what it added to the main file goes with it.
    if legacy:
        added = legacy.get("imports_added")
        if isinstance(added, str) and imports is not None and added in list(plain(imports)):
            imports.remove(added)
            if len(imports) == 0 and legacy.get("imports_key_added"):
                del doc["imports"]
        plan.changes.append(Change(dropin, None, ours=True, prune=bool(legacy.get("conf_d_created"))))
    # A re-install renders the runtime anew: what the last one added comes out first.
    original = tomlkit.dumps(doc) if legacy else main_text
    if prev and "original" in prev and prev.get("installed_sha256") == _sha(main_text):
        doc = _parse(prev["original"] or "", main_path)  # untouched since: start from what it was
    elif prev:
        # Edited since the install: a CRI section we added is shared now, only our runtime comes out,
        # and what the file is then is what uninstall gives back.
        prev = {k: v for k, v in prev.items() if k != "cri_added"}
        _remove_in_place(doc, name, prev)
        doc = _parse(tomlkit.dumps(doc).rstrip("\n") + "\n", main_path)  # no blank line left per re-install
        prev.update(original=tomlkit.dumps(doc), original_sha256=_sha(tomlkit.dumps(doc)))
    base_text = tomlkit.dumps(doc)
    base = plain(doc)

    if _hiding_dropins(main_path, base, exclude, plugin) and not _ours_in_hiding(main_path, base, exclude,
                                                                                   plugin, name):
        if legacy:
            plan.changes.clear()
        return None

    if mode == "command" and binary is None:
        raise InstallError("--config-source command: containerd is not installed")
    major = containerd_major(binary) if binary is not None else None
    speaks = binary is not None and major is not None and major < 2
    plan.binary = binary if speaks else None
    if speaks and mode != "file":
        merged = _merged_from_dump(binary, main_path, base_text, base, exclude)
        source = "containerd config dump"
    else:
        if mode == "command":
            raise InstallError(f"--config-source command: containerd {major} does not use config version 2")
        merged = _merged_from_files(main_path, base, 2, exclude)
        source = "files"
    cri_now = (merged.get("plugins") or {}).get(plugin) or {}
    if not isinstance(cri_now, dict):
        raise InstallError(f"{main_path}: plugins.{plugin!r} is not a table")
    rt, copied = _runtime_source(cri_now, name)

    state = {"mode": "in-place", "main": main_path, "runtime": name, "via": via, "copied_from": copied,
             "source": source, "version": 2}
    plan.changes.extend(_route(rt, rt["options"], via, opts, main_path, hook_config, state_dir, state))
    plan.changes.extend(_replaced(state, prev, legacy))

    # What the main file had before the first install (kept across re-installs).
    for k in ("original", "original_sha256", "main_created", "version_added", "cri_added", "tables_added",
              "default_before"):
        if k in prev:
            state[k] = prev[k]
    first = not prev
    if first:
        state["original"] = original
        state["original_sha256"] = _sha(original)
        if main_text is None:
            state["main_created"] = True
    if "version" not in doc:
        doc["version"] = 2
        if first:
            state["version_added"] = True
    plugins = doc.get("plugins")
    if plugins is None:
        plugins = tomlkit.table(is_super_table=True)
        doc["plugins"] = plugins
    cri = plugins.get(plugin)
    added = list(state.get("tables_added") or [])
    if cri is None:
        # No CRI section in the main file: containerd's (from the dump) is written whole, so
        # the runtime does not replace the defaults; uninstall takes the whole section out.
        full = copy.deepcopy(cri_now)
        full.setdefault("containerd", {}).setdefault("runtimes", {})
        if "runc" not in full["containerd"]["runtimes"] and (full["containerd"].get("default_runtime_name")
                                                             or "runc") == "runc":
            full["containerd"]["runtimes"]["runc"] = {"runtime_type": RUNC_TYPE}
        plugins[plugin] = full
        cri = plugins[plugin]
        state["cri_added"] = True
    ctrd = cri.get("containerd")
    if ctrd is None:
        cri["containerd"] = tomlkit.table(is_super_table=True)
        ctrd = cri["containerd"]
        added.append("containerd")
    runtimes = ctrd.get("runtimes")
    if runtimes is None:
        ctrd["runtimes"] = tomlkit.table(is_super_table=True)
        runtimes = ctrd["runtimes"]
        added.append("runtimes")
    if not isinstance(plain(runtimes), dict):
        raise InstallError(f"{main_path}: containerd.runtimes is not a table")
    if name in runtimes:
        raise InstallError(f"{main_path} already has a runtime {name!r} that compat-hook did not write; "
                           f"remove it or use --runtime-name")
    runtimes[name] = _toml_table(rt, tomlkit)
    if added:
        state["tables_added"] = sorted(set(added))
    if opts.set_as_default:
        _nvidia_chain(cri_now, name, opts, plan)
        if "default_before" not in state:
            state["default_before"] = plain(ctrd.get("default_runtime_name"))
        ctrd["default_runtime_name"] = name
    else:
        state.pop("default_before", None)
    new_main = tomlkit.dumps(doc)
    state["installed_sha256"] = _sha(new_main)
    if plan.chain:
        from .nvidia_toolkit import _hook_config_plan

        chg, hstate, msgs = _hook_config_plan(opts, plan.chain, prev)
        plan.changes.extend(chg)
        state.update(hstate)
        plan.notes.extend(msgs)
    elif prev.get("hook_config_line"):
        from .nvidia_toolkit import _hook_config_undo

        plan.changes.extend(_hook_config_undo(prev))
    if new_main != main_text:
        plan.changes.insert(0, Change(main_path, new_main, mode=None))
    plan.changes.insert(1 if new_main != main_text else 0,
                        Change(rec_path, json.dumps(state, sort_keys=True, indent=1) + "\n", mode=0o600,
                               ours=True))
    plan.notes.append(f"restart containerd to load the runtime {name!r} ({main_path}, edited in place); pods "
                      f"select it with runtimeClassName (a RuntimeClass whose handler is {name!r}: "
                      "packaging/kubernetes/compat-hook.yaml)")
    return plan


def _copies_removal(main_path: str, main_text: str | None, name: str, rec: dict) -> list:
    """Drop-ins rendered from config.toml after the install (NVIDIA's ``99-nvidia.toml`` copies the whole
    CRI section) carry a copy of our runtime: it goes with the original (their other settings stay)."""
    from .files import Change

    if main_text is None:
        return []
    plugin = CRI_PLUGIN[2]
    main = _load_plain(main_text, main_path)
    out = []
    for p in _hiding_dropins(main_path, main, "", plugin):
        text = _read(p)
        doc = _parse(text or "", p)
        rts = (((doc.get("plugins") or {}).get(plugin) or {}).get("containerd") or {}).get("runtimes")
        rt = plain(rts.get(name)) if rts is not None and name in rts else None
        if not isinstance(rt, dict):
            continue
        opts = rt.get("options") if isinstance(rt.get("options"), dict) else {}
        if (rec.get("wrapper") and opts.get("BinaryName") == rec["wrapper"]) or (
                rec.get("base_spec") and rt.get("base_runtime_spec") == rec["base_spec"]):
            del rts[name]
            ctrd = doc["plugins"][plugin]["containerd"]
            if plain(ctrd.get("default_runtime_name")) == name:
                before = rec.get("default_before")
                if before is None:
                    del ctrd["default_runtime_name"]
                else:
                    ctrd["default_runtime_name"] = before
            out.append(Change(p, tomlkit_module().dumps(doc)))
    return out


def _ours_in_hiding(main_path: str, main: dict, exclude: str, plugin: str, name: str) -> bool:
    """Whether the drop-ins that hide the main CRI section carry our runtime already (copied from it)."""
    merged = _merged_from_files(main_path, main, 2, exclude)
    rts = (((merged.get("plugins") or {}).get(plugin) or {}).get("containerd") or {}).get("runtimes") or {}
    return isinstance(rts.get(name), dict)


def _sha(text: str | None) -> str | None:
    import hashlib

    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def _toml_table(value: dict, tomlkit):
    t = tomlkit.table()
    for k, v in value.items():
        t[k] = _toml_table(v, tomlkit) if isinstance(v, dict) else v
    return t


def _remove_in_place(doc, name: str, rec: dict) -> bool:
    """Take the runtime ``name`` (and what the record says install added around it) out of ``doc``."""
    plugins = doc.get("plugins")
    cri = plugins.get(CRI_PLUGIN[2]) if plugins is not None else None
    if cri is None:
        return False
    if rec.get("cri_added"):
        del plugins[CRI_PLUGIN[2]]
        if len(plugins) == 0:
            del doc["plugins"]
        return True
    ctrd = cri.get("containerd")
    runtimes = ctrd.get("runtimes") if ctrd is not None else None
    changed = False
    if runtimes is not None and name in runtimes:
        del runtimes[name]
        changed = True
    added = rec.get("tables_added") or []
    if runtimes is not None and "runtimes" in added and len(runtimes) == 0:
        del ctrd["runtimes"]
    if ctrd is not None and "default_before" in rec and plain(ctrd.get("default_runtime_name")) == name:
        if rec["default_before"] is None:
            del ctrd["default_runtime_name"]
        else:
            ctrd["default_runtime_name"] = rec["default_before"]
        changed = True
    if ctrd is not None and "containerd" in added and len(ctrd) == 0:
        del cri["containerd"]
    return changed


def _plan_uninstall_in_place(opts, plan, rec: dict) -> Plan:
    """Undo an in-place install: byte for byte when the main file is what install wrote, else our tables only."""
    from .daemons import running
    from .files import Change
    from .wrapper import users, wrapper_removal

    tomlkit = tomlkit_module()
    main_path, name = plan.main_path, rec.get("runtime") or opts.runtime_name
    plan.runtime_name = name
    main_text = _read(main_path)
    if main_text is not None:
        if rec.get("installed_sha256") == _sha(main_text) and "original" in rec:
            new = rec["original"]
        else:  # edited since: a CRI section we added is shared now, only our runtime comes out
            doc = _parse(main_text, main_path)
            if not _remove_in_place(doc, name, {k: v for k, v in rec.items() if k != "cri_added"}):
                plan.notes.append(f"note: {main_path} no longer has the runtime {name!r}; left it as it is")
            if rec.get("version_added") and list(doc.keys()) == ["version"]:
                del doc["version"]
            new = tomlkit.dumps(doc)
            if rec.get("main_created") and not new.strip():
                new = None
            elif new != main_text:
                plan.notes.append(f"note: {main_path} changed since the install; compat-hook took out only its own "
                                  f"runtime {name!r}")
        if new != main_text:
            plan.changes.append(Change(main_path, new, backup=False, restores=True,
                                       ours=bool(rec.get("main_created")) and new is None))
    plan.changes.extend(_copies_removal(main_path, main_text, name, rec))
    plan.changes.append(Change(plan.record_path, None, ours=True))
    state_dir = _containerd_state(_load_plain(main_text or "", main_path))
    wrapper = rec.get("wrapper")
    if isinstance(wrapper, str):
        plan.changes.extend(wrapper_removal(wrapper, plan.record_path, engine="containerd",
                                            users_of=lambda p: users(p, containerd_states=[state_dir]),
                                            daemons=running("containerd", main_path)))
    spec = rec.get("base_spec")
    if isinstance(spec, str) and _is_ours("base_spec", spec):
        plan.changes.append(Change(spec, None, ours=True))
    if rec.get("hook_config_line"):
        from .nvidia_toolkit import _hook_config_undo

        plan.changes.extend(_hook_config_undo(rec))
    return plan


def _base_spec_text(hook_config: str, state_dir: str | None = None, fail_closed: bool = False) -> str:
    import json

    from ..core.registration import hook_entry

    ctr = _which("ctr")
    if ctr is None:
        raise InstallError("--via base-spec needs containerd's ctr (for `ctr oci spec`), which is not installed")
    try:
        spec = json.loads(_run([ctr, "oci", "spec"], "ctr oci spec"))
    except ValueError as e:
        raise InstallError(f"ctr oci spec printed no JSON: {e}") from None
    hooks = spec.setdefault("hooks", {})
    from ..core.registration import registered_log_file

    entry = hook_entry(stage="createContainer", config=hook_config, state_dir=state_dir, fail_closed=fail_closed,
                       log_file=registered_log_file(hook_config))
    hooks.setdefault("createContainer", [])
    if entry not in hooks["createContainer"]:
        hooks["createContainer"].append(entry)
    return json.dumps(spec, indent=2) + "\n"


def _own_dir(path: str) -> bool:
    """Whether ``path``'s directory is compat-hook's own (``.../compat-hook/``), removed when left empty."""
    return os.path.basename(os.path.dirname(path)) == "compat-hook"


def _is_ours(key: str, path: str) -> bool:
    """Whether ``path`` is a wrapper / base spec compat-hook wrote (never the Debian package's)."""
    if not (os.path.isabs(path) and os.path.isfile(path)):
        return False
    from .hooksd import packaged

    if packaged(path):
        return False
    head = _read(path) or ""
    if key == "wrapper":
        return head.startswith("#!/bin/sh\n# compat-hook-runtime:")
    return "compat_hook.cli import entry" in head


def plan_uninstall(opts) -> Plan:
    from .files import Change

    tomlkit = tomlkit_module()
    plan = Plan()
    main_path = os.path.abspath(opts.config or DEFAULT_CONFIG)
    dropin = os.path.join(os.path.dirname(main_path), "conf.d", DROPIN_NAME)
    plan.main_path, plan.dropin_path = main_path, dropin
    plan.record_path = record_path(main_path)
    rec = _read_record(plan.record_path)
    if rec:
        return _plan_uninstall_in_place(opts, plan, rec)
    text = _read(dropin)
    if text is None:
        from .wrapper import DEFAULT_WRAPPER_PATH, pass_through_cleanup, users

        state_dir = _containerd_state(_load_plain(_read(main_path) or "", main_path))
        plan.changes.extend(pass_through_cleanup(os.path.abspath(opts.wrapper_path or DEFAULT_WRAPPER_PATH),
                                                 lambda p: users(p, containerd_states=[state_dir]), "containerd"))
        if not plan.changes:
            plan.notes.append(f"{dropin} does not exist: nothing installed for {main_path}")
        return plan
    state = _state_of(text)
    plan.runtime_name = state.get("runtime")
    plan.changes.append(Change(dropin, None, ours=True, prune=bool(state.get("conf_d_created"))))
    for key in ("wrapper", "base_spec"):
        p = state.get(key)
        if isinstance(p, str) and os.path.isabs(p) and os.path.isfile(p):
            if key == "wrapper":
                from .daemons import running
                from .wrapper import users, wrapper_removal

                state_dir = _containerd_state(_load_plain(_read(main_path) or "", main_path))
                plan.changes.extend(wrapper_removal(p, dropin, engine="containerd",
                                                    users_of=lambda w: users(w, containerd_states=[state_dir]),
                                                    daemons=running("containerd", main_path)))
            elif _is_ours(key, p):
                plan.changes.append(Change(p, None, ours=True))
            else:
                plan.notes.append(f"left {p} alone: it is not what compat-hook wrote")
    main_text = _read(main_path)
    added = state.get("imports_added")
    if main_text is not None:
        doc = _parse(main_text, main_path)
        edited = False
        imports = doc.get("imports")
        if isinstance(added, str) and isinstance(imports, list) and added in imports:
            imports.remove(added)
            if len(imports) == 0 and state.get("imports_key_added"):
                del doc["imports"]
            edited = True
        if state.get("version_added") and list(doc.keys()) == ["version"]:
            del doc["version"]
            edited = True
        new_text = tomlkit.dumps(doc)
        if state.get("main_created") and not doc.keys() and not new_text.strip():
            plan.changes.insert(0, Change(main_path, None, ours=True))
        elif edited:  # only what install added goes: no backup of that, none left equal to the result
            plan.changes.insert(0, Change(main_path, new_text, backup=False, restores=True))
    return plan


# -- entry points -------------------------------------------------------------

def _verify(plan: Plan) -> str | None:
    """Why ``containerd config dump`` does not show the runtime as planned (``None``: it does)."""
    if plan.binary is None or not os.path.exists(plan.main_path):
        return None
    try:
        dump = _dump(plan.binary, plan.main_path)
    except InstallError as e:
        return str(e)
    rt = None
    for plugin in CRI_PLUGIN.values():  # containerd 2.x dumps a version 2 file migrated to 3
        rts = (((dump.get("plugins") or {}).get(plugin) or {}).get("containerd") or {}).get("runtimes") or {}
        rt = rt or rts.get(plan.runtime_name)
    if not isinstance(rt, dict):
        later = [p for p in _expand_imports([x for x in dump.get("imports") or [] if isinstance(x, str)], "/")
                 if os.path.basename(p) > DROPIN_NAME and os.path.dirname(p) == os.path.dirname(plan.dropin_path)]
        hint = f" (a later drop-in replaces the CRI section: {', '.join(later)})" if later else ""
        return f"containerd config dump shows no runtime {plan.runtime_name!r}{hint}"
    return None


def _restore(plan: Plan) -> None:
    from .files import remove, write_atomic

    for c in reversed(plan.changes):
        if not c.changed and c.new is not None:
            continue
        if c.old is None:
            remove(c.path, backup=False)
        else:
            write_atomic(c.path, c.old, backup=False)


def _run_plan(plan: Plan, opts, verify: bool) -> int:
    from .files import apply

    out = sys.stdout
    changed = apply(plan.changes, dry_run=opts.dry_run, out=out)
    if changed and not opts.dry_run and verify:
        why = _verify(plan)
        if why is not None:
            _restore(plan)
            raise InstallError(f"{why}; the previous files are back in place")
    if changed and not opts.dry_run:
        for n in plan.notes:
            out.write(n + "\n")
    elif not changed:
        for n in plan.notes:
            if "does not exist" in n or "left " in n:
                out.write(n + "\n")
    return EXIT_OK


def install(opts) -> int:
    return _main(lambda: _run_plan(plan_install(opts), opts, verify=True))


def uninstall(opts) -> int:
    return _main(lambda: _run_plan(plan_uninstall(opts), opts, verify=False))


def _main(fn) -> int:
    from .common import run_command

    return run_command(fn)
