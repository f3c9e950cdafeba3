"""``compat-hook install|uninstall nvidia-toolkit``: compat-hook's wrapper under nvidia-container-runtime.

nvidia-container-runtime edits the spec on ``create`` (its CDI, jit-cdi or
legacy modifications: the ``enable-cuda-compat`` and ``update-ldcache``
hooks, the prestart hook), writes it back to ``<bundle>/config.json`` and
execs the first runtime of ``[nvidia-container-runtime] runtimes`` that it
finds. ``install`` puts compat-hook's runtime wrapper first in that list::

    runtimes = ["/usr/local/libexec/compat-hook/compat-hook-runtime", "runc", "crun"]

so the wrapper sees the *final* spec, the toolkit's hooks included, adds
compat-hook's createContainer hook after them and execs the real runtime:
compat-hook's decision is the last word (tests/test_toolkit_containers.py,
tests/test_install_nvidia_toolkit.py run it with the toolkit's own
binaries). The toolkit's own entries stay behind ours: should the wrapper
ever go missing, the toolkit falls back to them (a container never fails
for want of compat-hook).

The wrapper execs compat-hook's config ``runtime:`` (default ``runc``).
``install`` resolves the runtime the toolkit would have run (the first of
its entries found in ``/usr/local/sbin:...:/bin``) and, when that is not
already what compat-hook's config names, adds ``runtime: <it>`` to that
config (``--hook-config``, default ``/etc/compat-hook/config.yaml``; the
file is created when missing). An explicit, different ``runtime:`` is left
alone with a warning (other registrations share the file), and one naming
nvidia-container-runtime is refused (the chain would loop).

The file: ``--engine-config PATH``, else ``$NVIDIA_CTK_CONFIG_FILE_PATH`` (the
variable the toolkit itself reads; said in the output when used), else
``/etc/nvidia-container-runtime/config.toml``. It must exist. It is edited
with tomlkit (comments and formatting kept), backed up first, and the
``runtimes`` line carries the record of what was done
(``# compat-hook-install: {...}``: the previous value, exactly as it was
written, and what was added elsewhere). ``uninstall`` puts that back and
removes the ``runtime:`` line it added and the wrapper (unless another
engine's registration names it); when nothing else changed the file is
byte-for-byte what it was (checked against the SHA-256 in the record).
``--dry-run`` prints the diffs and writes nothing; a second ``install``
changes nothing. When the config's ``[nvidia-ctk] path`` names an installed
``nvidia-ctk``, the result is checked with ``nvidia-ctk config`` (the
toolkit's own parser) and the old files are put back if it disagrees.

Settings a hook or wrapper cannot override are reported (:func:`problems`):
``modes.legacy.cuda-compat-mode = "mount"`` (and the
``allow-cuda-compat-libs-from-container`` feature without a mode, which
means the same): libnvidia-container bind-mounts the image's compat
libraries over the host driver's at prestart, which no later hook can take
back; compat-hook says to set ``"ldconfig"`` (the default) or ``"hook"``.

Under the GPU Operator the file is
``/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml``
and the operator's toolkit container (``nvidia-ctk-installer``) deletes
``/usr/local/nvidia/toolkit`` and writes the file anew from its options at
every start: an edit does not survive. The lasting registration there is the
toolkit container's environment, ``NVIDIA_CONTAINER_RUNTIME_RUNTIMES`` (the
installer's ``--nvidia-container-runtime.runtimes``; ClusterPolicy
``spec.toolkit.env``); ``install`` says so when the path looks like it.

>>> s = settings({"nvidia-container-runtime": {"modes": {"legacy": {"cuda-compat-mode": "mount"}}}})
>>> s["mode"], s["cuda_compat_mode"], [lvl for lvl, _ in problems(s, "/etc/x.toml")]
('auto', 'mount', ['warning', 'note'])
"""

from __future__ import annotations

import os

from ..core.errors import UsageError
from .common import plain, tomlkit_module
from .hooksd import InstallError, say

__all__ = ["DEFAULT_CONFIG", "OPERATOR_CONFIG", "CONFIG_ENV", "install", "uninstall", "config_path",
           "settings", "problems", "names_first"]

DEFAULT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
#: Where the GPU Operator's toolkit container writes it (toolkit.installDir /usr/local/nvidia).
OPERATOR_CONFIG = "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
CONFIG_ENV = "NVIDIA_CTK_CONFIG_FILE_PATH"
TABLE = "nvidia-container-runtime"
#: The toolkit's ``runtimes`` when the key is absent (v1.20 api/config/v1 defaults).
DEFAULT_RUNTIMES = ("runc", "crun")
STATE_TAG = "compat-hook-install: "
RUNTIME_NOTE = "# added by compat-hook install nvidia-toolkit (the toolkit's runtime)"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENGINE = "nvidia-toolkit"


# --------------------------------------------------------------------------- reading


def config_path(opts, environ=None) -> tuple:
    """``(path, note or None)``: ``--engine-config``, else ``$NVIDIA_CTK_CONFIG_FILE_PATH``, else the default."""
    env = os.environ if environ is None else environ
    if opts.config:
        return os.path.abspath(opts.config), None
    if env.get(CONFIG_ENV):
        p = os.path.abspath(env[CONFIG_ENV])
        return p, f"note: using ${CONFIG_ENV} = {p}"
    return DEFAULT_CONFIG, None


def _parse(text: str, path: str):
    try:
        return tomlkit_module().parse(text)
    except Exception as e:  # tomlkit's ParseError and friends
        raise InstallError(f"{path}: not valid TOML ({e}); fix it first, nothing was changed") from None


def settings(doc: dict) -> dict:
    """The settings that matter here, from the parsed file (plain dicts), defaults filled in."""
    rt = doc.get(TABLE) if isinstance(doc.get(TABLE), dict) else {}
    legacy = ((rt.get("modes") or {}).get("legacy") or {}) if isinstance(rt.get("modes"), dict) else {}
    features = doc.get("features") if isinstance(doc.get("features"), dict) else {}
    ctk = doc.get("nvidia-ctk") if isinstance(doc.get("nvidia-ctk"), dict) else {}
    runtimes = rt.get("runtimes")
    return {"mode": rt.get("mode") or "auto",
            "runtimes": list(runtimes) if isinstance(runtimes, list) else list(DEFAULT_RUNTIMES),
            "cuda_compat_mode": legacy.get("cuda-compat-mode") if isinstance(legacy, dict) else None,
            "allow_container_compat": features.get("allow-cuda-compat-libs-from-container") is True,
            "disable_hook": features.get("disable-cuda-compat-lib-hook") is True,
            "ctk_path": ctk.get("path")}


def problems(s: dict, path: str) -> list:
    """``[(level, message)]`` about settings a hook or wrapper cannot override, and where it does not apply."""
    out = []
    mode = s["mode"]
    legacy_used = "" if mode == "legacy" else f" (mode = {mode!r} here; it applies whenever legacy mode runs)"
    mount = ("in legacy mode libnvidia-container bind-mounts the image's compat libraries over the host "
             "driver's at prestart; no later hook or wrapper can take a mount back, so a compat-hook skip "
             "cannot take effect (error 803/804)")
    if s["cuda_compat_mode"] == "mount":
        out.append(("warning", f'modes.legacy.cuda-compat-mode = "mount": {mount}{legacy_used}. Set it to '
                               f'"ldconfig" (the default: compat-hook\'s createContainer hook rebuilds the ld '
                               f'cache after it) or "hook"'))
    elif s["cuda_compat_mode"] is None and s["allow_container_compat"]:
        out.append(("warning", "features.allow-cuda-compat-libs-from-container = true without "
                               "modes.legacy.cuda-compat-mode: nvidia-container-cli then uses its own default, "
                               f"mount: {mount}{legacy_used}. Set modes.legacy.cuda-compat-mode = \"ldconfig\""))
    if s["disable_hook"]:
        out.append(("note", "features.disable-cuda-compat-lib-hook = true: the toolkit adds no "
                            "enable-cuda-compat hook in legacy/csv mode; compat-hook decides alone there"))
    if mode == "legacy":
        out.append(("note", "mode = \"legacy\": Docker's --gpus with its default runc runs libnvidia-container's "
                            "prestart hook without nvidia-container-runtime, so without this registration: "
                            "register compat-hook for Docker too (compat-hook install docker)"))
    else:
        out.append(("note", "engines that inject CDI devices themselves (containerd enable_cdi, CRI-O, Podman "
                            "--device, Docker features.cdi) run the toolkit's CDI hooks without "
                            "nvidia-container-runtime; there compat-hook's own engine registration makes its "
                            "decision final (compat-hook install containerd|crio|podman|docker)"))
    if path.endswith("/toolkit/.config/nvidia-container-runtime/config.toml"):
        out.append(("warning", f"{path} looks like the GPU Operator's: its toolkit container deletes "
                               f"{path.split('/.config/')[0]} and rewrites this file at every start, so this edit "
                               "does not last. Set NVIDIA_CONTAINER_RUNTIME_RUNTIMES=<wrapper>,runc,crun in the "
                               "toolkit container's environment (ClusterPolicy spec.toolkit.env) instead"))
    return out


def names_first(text: str, wrapper: str) -> bool:
    """Whether the toolkit config ``text`` runs ``wrapper`` first: what :func:`install` makes true.

    >>> names_first('[nvidia-container-runtime]\\n  runtimes = ["/w", "runc"]\\n', "/w")
    True
    >>> names_first('[nvidia-container-runtime]\\n  runtimes = ["runc"]\\n', "/w"), names_first("a = [", "/w")
    (False, False)
    """
    try:
        _, item = _runtimes_item(_parse(text, "config.toml"), "config.toml")
    except InstallError:
        return False
    runtimes = plain(item) if item is not None else []
    return bool(runtimes) and runtimes[0] == wrapper


# --------------------------------------------------------------------------- the record


def _state_of(item) -> dict:
    import json

    comment = getattr(getattr(item, "trivia", None), "comment", "") or ""
    body = comment.lstrip("#").strip()
    if not body.startswith(STATE_TAG):
        return {}
    try:
        st = json.loads(body[len(STATE_TAG):])
    except ValueError:
        return {}
    return st if isinstance(st, dict) else {}


def _is_ours(entry, wrapper: str | None) -> bool:
    """An entry of ``runtimes`` that is a compat-hook wrapper (this one, or one whose first line says it is)."""
    from .wrapper import WRAPPER_MARK

    if not isinstance(entry, str):
        return False
    if wrapper is not None and entry == wrapper:
        return True
    if not (os.path.isabs(entry) and os.path.isfile(entry)):
        return False
    try:  # only the head: the other entries are runtime binaries of megabytes
        with open(entry, "rb") as f:
            return f.read(len(WRAPPER_MARK)) == WRAPPER_MARK.encode()
    except OSError:
        return False


def _resolve(name: str) -> str | None:
    from ..core.realruntime import RuntimeNotFound, resolve_runtime

    try:
        p = resolve_runtime(name, SAFE_PATH)
    except RuntimeNotFound:
        return None
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


def _sha(text: str | None) -> str | None:
    import hashlib

    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- compat-hook's config


def _hook_config_path(opts) -> str:
    from ..core.config import DEFAULT_PATH

    return os.path.abspath(opts.hook_config) if opts.hook_config else DEFAULT_PATH


def _runtime_of(path: str, text: str | None) -> tuple:
    """``(runtime, explicit, sure)`` of compat-hook's config text (``runc``, not explicit, when unset).

    ``sure``: the line reader the shell wrapper uses vouches for the file, so
    a line appended to it is read the same way by the wrapper and by YAML.
    """
    from ..core.realruntime import read_runtime_line

    if text is None:
        return "runc", False, True
    rt, sure = read_runtime_line(text)
    if sure:
        return rt, any(line.startswith("runtime:") for line in text.split("\n")), True
    from ..core import config as _config

    cfg = _config.load(path, environ={})  # a bad file is refused here (exit 2)
    return cfg.runtime, None, False


def _hook_config_plan(opts, target: str, prev: dict) -> tuple:
    """``(changes, state, messages)`` making compat-hook's ``runtime:`` the toolkit's runtime ``target``."""
    from .files import Change

    path = _hook_config_path(opts)
    change = Change(path, None, mode=0o644)
    text = change.old
    state = {"hook_config": path}
    ours = prev.get("hook_config_line") if prev.get("hook_config") == path else None
    current, explicit, sure = _runtime_of(path, text)
    if ours and text is not None and ours in text.split("\n"):
        state["hook_config_line"] = ours
        for k in ("hook_config_created", "hook_config_newline"):
            if prev.get(k):
                state[k] = True
    have, want = _resolve(current), _resolve(target)
    if have is not None and have == want:
        return [], state, []
    if os.path.basename(current).startswith("nvidia-container-runtime") or (
            have is not None and os.path.basename(have).startswith("nvidia-container-runtime")):
        raise InstallError(f"{path}: runtime: {current} runs the NVIDIA toolkit from compat-hook's wrapper; "
                           f"the toolkit running the wrapper too would loop. Use one chain: uninstall this "
                           f"registration, or set runtime: {target} there")
    if not sure:
        raise InstallError(f"{path} uses YAML compat-hook will not append to; add `runtime: {target}` "
                           f"(the toolkit's runtime) to it yourself, then run the install again")
    if explicit:
        return [], state, [f"warning: {path} says runtime: {current}; the toolkit ran {target} "
                           f"({want or 'not found'}). Containers of the toolkit now run under {current}; set "
                           f"runtime: {target} there to keep {target} (other registrations share that file)"]
    line = f"runtime: {target}  {RUNTIME_NOTE}"
    base = text or ""
    sep = "" if not base or base.endswith("\n") else "\n"
    change.new = base + sep + line + "\n"
    state["hook_config_line"] = line
    if sep:
        state["hook_config_newline"] = True
    if text is None:
        state["hook_config_created"] = True
    return [change], state, []


def _hook_config_undo(state: dict) -> list:
    from .files import Change

    path, line = state.get("hook_config"), state.get("hook_config_line")
    if not (isinstance(path, str) and isinstance(line, str) and os.path.isabs(path)):
        return []
    change = Change(path, None)
    if change.old is None:
        return []
    lines = change.old.split("\n")
    if line not in lines:
        say(f"note: {path} no longer has the line compat-hook added ({line!r}); left it alone")
        return []
    lines.remove(line)
    new = "\n".join(lines)
    if state.get("hook_config_newline") and new.endswith("\n"):
        new = new[:-1]  # the file had no final newline before the line was added
    change.new = None if state.get("hook_config_created") and not new.strip() else new
    return [change]


# --------------------------------------------------------------------------- the toolkit's config


def _read_toolkit_config(path: str) -> tuple:
    from .files import read_text

    if os.path.isdir(path):
        raise InstallError(f"{path} is a directory")
    text = read_text(path) if os.path.lexists(path) else None
    if text is None:
        raise InstallError(f"{path} does not exist: is the NVIDIA Container Toolkit installed? "
                           f"(--engine-config PATH, or ${CONFIG_ENV})")
    return text, _parse(text, path)


def _runtimes_item(doc, path: str):
    table = doc.get(TABLE)
    if table is not None and not isinstance(table, dict):
        raise InstallError(f"{path}: {TABLE!r} is not a table")
    item = table.get("runtimes") if table is not None else None
    if item is not None and not (isinstance(plain(item), list) and all(isinstance(x, str) for x in plain(item))):
        raise InstallError(f"{path}: {TABLE}.runtimes is not a list of strings")
    return table, item


def _render_install(text: str, path: str, wrapper: str, extra_state: dict):
    """``(new text, state, toolkit runtimes before compat-hook)`` for ``text`` with ``wrapper`` first."""
    import json

    tomlkit = tomlkit_module()
    doc = _parse(text, path)
    table, item = _runtimes_item(doc, path)
    prev = _state_of(item)
    if prev:  # a re-install: what was there before the first one stays the record
        state = {k: prev[k] for k in ("previous", "comment", "table_added", "super_table", "original_sha256")
                 if k in prev}
        before = list(DEFAULT_RUNTIMES) if item is None else [x for x in plain(item) if not _is_ours(x, wrapper)]
    else:
        state = {"original_sha256": _sha(text)}
        if item is None:
            state["previous"] = None
            before = list(DEFAULT_RUNTIMES)
        else:
            state["previous"] = item.as_string()
            state["comment"] = [item.trivia.comment_ws, item.trivia.comment]
            before = [x for x in plain(item) if not _is_ours(x, wrapper)]
        if table is None:
            state["table_added"] = True
        elif table.is_super_table():
            state["super_table"] = True
    state["wrapper"] = wrapper
    state.update(extra_state)
    if table is None:
        table = tomlkit.table()
        doc[TABLE] = table
    value = tomlkit.array()
    value.extend([wrapper] + before)
    table["runtimes"] = value
    new_item = table["runtimes"]
    new_item.trivia.comment_ws = " "
    new_item.trivia.comment = "# " + STATE_TAG + json.dumps(state, sort_keys=True, separators=(",", ":"))
    return tomlkit.dumps(doc), state, before


def _render_uninstall(text: str, path: str) -> tuple:
    """``(new text or None when nothing of ours is there, state)``."""
    tomlkit = tomlkit_module()
    doc = _parse(text, path)
    table, item = _runtimes_item(doc, path)
    if item is None:
        return None, {}
    state = _state_of(item)
    wrapper = state.get("wrapper") if isinstance(state.get("wrapper"), str) else None
    values = plain(item)
    rest = [x for x in values if not _is_ours(x, wrapper)]
    if not state and rest == values:
        return None, {}
    if state and "previous" in state and values == [wrapper] + _previous_values(state, path):
        if state["previous"] is None:
            del table["runtimes"]
            if state.get("table_added") and len(table) == 0:
                del doc[TABLE]
            elif state.get("super_table") and all(isinstance(plain(v), dict) for v in table.values()):
                table._is_super_table = True  # tomlkit 0.11 has no public setter; back to no [header]
        else:
            table["runtimes"] = tomlkit.parse("k = " + state["previous"] + "\n")["k"]
            ws, comment = (state.get("comment") or ["", ""])[:2]
            table["runtimes"].trivia.comment_ws, table["runtimes"].trivia.comment = ws, comment
    else:  # the list was changed after install: take out only what is ours
        value = tomlkit.array()
        value.extend(rest)
        table["runtimes"] = value
        table["runtimes"].trivia.comment_ws = table["runtimes"].trivia.comment = ""
        say(f"note: {path}: {TABLE}.runtimes changed since compat-hook's install; removed only its wrapper")
    out = tomlkit.dumps(doc)
    want = state.get("original_sha256")
    if want and _sha(out) != want and out.endswith("\n\n") and _sha(out[:-1]) == want:
        out = out[:-1]  # tomlkit's blank line before a table it added and removed again
    return out, state


def _previous_values(state: dict, path: str) -> list:
    prev = state.get("previous")
    if prev is None:
        return list(DEFAULT_RUNTIMES)
    try:
        return list(plain(tomlkit_module().parse("k = " + prev + "\n")["k"]))
    except Exception:  # a hand-edited record
        return []


# --------------------------------------------------------------------------- commands


def _check_opts(opts) -> None:
    from .hooksd import check_args

    check_args(opts, ENGINE)
    if opts.set_as_default:
        raise UsageError("--set-as-default has no meaning for nvidia-toolkit (the wrapper runs under the toolkit)")


def _verify(path: str, s: dict, wrapper: str) -> str | None:
    """What the toolkit's own ``nvidia-ctk config`` says is wrong with the file (None: nothing, or no nvidia-ctk)."""
    import subprocess

    ctk = s.get("ctk_path")
    if not isinstance(ctk, str) or not ctk:
        return None
    exe = ctk if os.path.isabs(ctk) else _resolve(ctk)
    if exe is None or not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return None
    try:
        p = subprocess.run([exe, "--quiet", "config", "--config-file", path], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60, env={"PATH": SAFE_PATH, "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{exe} config: {e}"
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()] or [f"exit {p.returncode}"]
        return f"{exe} config --config-file {path} failed: {lines[-1]}"
    try:
        import tomllib
        seen = settings(tomllib.loads(p.stdout))["runtimes"]
    except Exception as e:  # Python < 3.11 or unexpected output: the exit status is all we have
        return None if isinstance(e, ImportError) else f"{exe} config printed no TOML: {e}"
    if not seen or seen[0] != wrapper:
        return f"the toolkit reads runtimes = {seen} from {path}, not the wrapper first"
    return None


def _restore(changes: list) -> None:
    from .files import remove, write_atomic

    for c in reversed(changes):
        if not c.changed:
            continue
        if c.old is None:
            remove(c.path, backup=False)
        else:
            write_atomic(c.path, c.old, backup=False)


def install(opts) -> int:
    from .checks import problems as hook_problems
    from .files import Change
    from .hooksd import run
    from .wrapper import wrapper_change, wrapper_path, wrapper_removal

    _check_opts(opts)
    path, note = config_path(opts)
    if note:
        say(note)
    text, doc = _read_toolkit_config(path)
    s = settings(plain(doc))
    _, item = _runtimes_item(doc, path)
    prev = _state_of(item)
    wrapper = wrapper_path(opts)
    wrappers = wrapper_change(opts)
    old_wrapper = prev.get("wrapper")
    if isinstance(old_wrapper, str) and old_wrapper != wrapper:  # moved (e.g. to --wrapper-path)
        wrappers += wrapper_removal(old_wrapper, path, keep=wrapper)
    _, _, before = _render_install(text, path, wrapper, {})
    target = next((r for r in before if _resolve(r) is not None), None)
    if target is None:
        raise InstallError(f"{path}: none of the toolkit's runtimes {before} is installed "
                           f"(looked in {SAFE_PATH})")
    hook_changes, hook_state, messages = _hook_config_plan(opts, target, prev)
    new_text, _, _ = _render_install(text, path, wrapper, {"runtime": target, **hook_state})
    toolkit_change = Change(path, new_text, mode=None)

    # Will the registered wrapper work with the configuration it will read?
    from .checks import registered_config

    cfg, cfg_note = registered_config(opts.hook_config)
    if hook_changes and hook_changes[0].new is not None:
        cfg = cfg.replace(runtime=target)
    errors = [m for lvl, m in hook_problems(cfg, "wrapper") if lvl == "error"]
    if errors:
        raise InstallError(f"{cfg.source or 'the default configuration'}: {errors[0]}")
    for lvl, m in hook_problems(cfg, "wrapper"):
        if lvl != "error":
            say(f"{lvl}: {m}")
    if cfg_note and not hook_changes:
        say(cfg_note)
    for m in messages:
        say(m)
    for lvl, m in problems(s, path):
        say(f"{lvl}: {m}")

    groups = [(wrappers, False), (hook_changes, True), ([toolkit_change], True)]
    run(groups, opts, ENGINE, verb="registered",
        after=f"{ENGINE}: {path}: runtimes = [{wrapper}, ...]; the wrapper runs {target}. "
              f"New containers use it at once (no daemon restart)")
    if not opts.dry_run and toolkit_change.changed:
        why = _verify(path, s, wrapper)
        if why is not None:
            _restore([c for chs, _ in groups for c in chs])
            raise InstallError(f"{why}; the previous files are back in place")
    return 0


def uninstall(opts) -> int:
    from .files import Change
    from .hooksd import run
    from .wrapper import wrapper_removal

    _check_opts(opts)
    path, note = config_path(opts)
    if note:
        say(note)
    if not os.path.lexists(path):
        say(f"{ENGINE}: {path} does not exist; nothing to remove")
        return 0
    text, _ = _read_toolkit_config(path)
    new_text, state = _render_uninstall(text, path)
    if new_text is None:
        say(f"{ENGINE}: {path} names no compat-hook wrapper; nothing to remove")
        return 0
    change = Change(path, new_text, mode=None)
    wrapper = state.get("wrapper")
    wrappers = wrapper_removal(wrapper, path) if isinstance(wrapper, str) and not opts.keep_wrapper else []
    hook_changes = _hook_config_undo(state)
    run([([change], True), (hook_changes, True), (wrappers, False)], opts, ENGINE, verb="unregistered",
        after=f"{ENGINE}: compat-hook's wrapper removed from {path}")
    if not opts.dry_run and state.get("original_sha256") and _sha(new_text) != state["original_sha256"]:
        say(f"note: {path} is not byte-for-byte what it was before the install (edited since); "
            "compat-hook took out only its own part")
    return 0
