"""``compat-hook install|uninstall containerd --via nri``: the NRI plugin, pre-registered.

On today's GPU Operator (CDI mode, its default since v25.10) a GPU pod runs on
plain runc and never names compat-hook's runtime; containerd applies the CDI
devices itself. NRI (the Node Resource Interface, on by default in containerd
2.x) lets a plugin add OCI hooks to every container the engine creates, so
the plugin ``compat-hook-nri`` (Go, ``packaging/nri``, containerd's NRI stub)
adds compat-hook's createContainer hook to each container that asks for a GPU.
It only routes: the hook entry is the one this module renders with
:func:`compat_hook.install.hooksd.document` (the same entry as the hooks.d file
and the runtime wrapper's), and the hook decides as everywhere else.

Two files, both in the directories containerd's NRI settings name
(``plugins.'io.containerd.nri.v1.nri'``, read with ``containerd config dump``;
defaults ``/opt/nri/plugins`` and ``/etc/nri/conf.d``):

* ``<plugin_path>/90-compat-hook``: the plugin binary (``--nri-plugin``, default
  the Debian package's :data:`PACKAGED_PLUGIN`, else :data:`DEFAULT_PLUGIN`). containerd starts every plugin there at its own start
  (a *pre-registered* plugin, index 90 from the name: after the NVIDIA
  toolkit's own NRI plugin, index 10), hands it a connected socket, and starts
  it again at its next start: no service to manage, and a containerd restart
  reconnects it by construction;
* ``<plugin_config_path>/90-compat-hook.conf``: the hook document (hooks.d
  shape, plus ``log_file`` for the plugin's trace and the directories this
  install created, for ``uninstall``); containerd hands it to the plugin at
  Configure.

Failure semantics: a plugin that is missing, dies or answers late (2 s
request timeout) is dropped and the container is created without its
changes: **fail-open** by default, traced by the plugin as a ``fail_open``
line in compat-hook's log when its connection ends. containerd 2.2 and later
can refuse the container instead: NRI's *default validator*
(``[plugins.'io.containerd.nri.v1.nri'.default_validator]``) fails a
CreateContainer while a plugin it requires is not connected.
``--nri-require`` (:data:`REQUIRE_MODES`) writes that table into a third file,
the drop-in ``<main dir>/conf.d/`` :data:`DROPIN_NAME` (containerd 2.x merges
drop-ins table by table and appends lists):

* ``per-pod``: the validator on, nothing required globally; a pod that carries
  NRI's annotation ``required-plugins.noderesource.dev/pod: "[compat-hook]"``
  (or ``.../container.NAME``) is refused without the plugin, every other pod is
  as before (static pods, compat-hook's own DaemonSet);
* ``all``: every container of the node requires the plugin, except those of a
  pod carrying the toleration annotation :data:`TOLERATE_ANNOTATION` ``/pod:
  "true"`` (compat-hook's own pods, static pods: the validator refuses those
  too when the plugin is down).

The same validator's ``reject_oci_hook_adjustment`` refuses the OCI hook the
plugin adds, so every GPU container: with it on (or about to be, with the
validator) the install refuses (:func:`validator_problem`). containerd
older than 2.2 has no such validator: ``--nri-require`` there is refused in
one line. containerd reads all of this only at start: restart it afterwards
(never done by these commands).
"""

from __future__ import annotations

import json
import os
import sys

from .hooksd import InstallError, say

__all__ = ["install", "uninstall", "detect", "detect_main", "DEFAULT_PLUGIN", "PACKAGED_PLUGIN", "PLUGIN_NAME", "PLUGIN_INDEX", "nri_settings",
           "plugin_files", "render_config", "REQUIRE_MODES", "TOLERATE_ANNOTATION", "REQUIRED_ANNOTATION",
           "DROPIN_NAME", "validator_problem", "require_dropin"]

#: Where the Debian package puts the plugin when it was built with it (``make image``, or
#: ``make deb NRI_PLUGIN=dist/compat-hook-nri``).
PACKAGED_PLUGIN = "/usr/libexec/compat-hook/compat-hook-nri"
#: Where a plugin built by hand goes when it is not named (``--nri-plugin``).
DEFAULT_PLUGIN = "/usr/local/libexec/compat-hook/compat-hook-nri"
PLUGIN_NAME = "compat-hook"
#: After NVIDIA's toolkit NRI plugin (nvidia-ctk-installer --nri-plugin-index, default 10).
PLUGIN_INDEX = "90"
NRI_PLUGIN = "io.containerd.nri.v1.nri"
DEFAULT_PLUGIN_PATH = "/opt/nri/plugins"
DEFAULT_CONFIG_PATH = "/etc/nri/conf.d"
#: NRI's per-pod annotation naming plugins a pod's containers require (``/pod`` or ``/container.NAME``
#: appended; the value a YAML list of plugin names). The default validator honours it when enabled.
REQUIRED_ANNOTATION = "required-plugins.noderesource.dev"
#: The toleration annotation key ``--nri-require all`` configures (``tolerate_missing_plugins_annotation``):
#: a pod with ``<key>/pod: "true"`` starts without any required plugin. A dotted key with no ``/``, as NRI's
#: own: the validator appends ``/pod`` and ``/container.NAME``, which must stay a valid Kubernetes key.
TOLERATE_ANNOTATION = "tolerate-missing-plugins.compat-hook.io"
#: containerd's first release with NRI's default validator (required plugins, hook rejection).
VALIDATOR_RELEASE = (2, 2)
#: The containerd drop-in that holds ``--nri-require``'s validator table (sorts after the CRI drop-in).
DROPIN_NAME = "99-zz-compat-hook-nri.toml"
#: ``--nri-require``: what each mode writes into the default validator table (``None``: no drop-in).
REQUIRE_MODES = {
    "off": None,
    "per-pod": {"enable": True},
    "all": {"enable": True, "required_plugins": [PLUGIN_NAME],
            "tolerate_missing_plugins_annotation": TOLERATE_ANNOTATION},
}
_STATE_TAG = "# compat-hook-install: "
#: A string only compat-hook-nri's binary holds (its own error text).
_BINARY_MARK = b"compat-hook-nri: no configuration"


def nri_settings(main_path: str) -> dict:
    """containerd's merged NRI table: ``containerd config dump`` when the installed containerd reads this
    config version, else the files themselves (containerd-style merge) over NRI's defaults.

    Raises :class:`InstallError` when NRI is off (containerd 1.7's default: config version 2) or the
    containerd reading a version 2 config is older than 1.7 (no NRI at all).
    """
    from .common import plain
    from .containerd import (_dump, _merged_from_files, _parse, _read, _version, _which,
                             containerd_major)

    binary = _which("containerd")
    text = _read(main_path)
    main = plain(_parse(text or "", main_path))
    # Version 4 (containerd 2.4's own) moves the server settings, not NRI's table: read as version 3.
    version = 3 if main.get("version") == 4 else _version(text, main, main_path, binary)
    if version < 3:
        # A config this containerd reads (1.6 knows no version 3): 1.6 has no NRI whatever the file says.
        old = no_nri_release(binary)
        if old is not None:
            raise InstallError(f"{old}; register the runtime wrapper instead (--via wrapper, the default)")
    major = containerd_major(binary) if binary is not None else None
    if binary is not None and major is not None and (major >= 2) == (version >= 3):
        merged = _dump(binary, main_path)
    else:
        merged = _merged_from_files(main_path, main, version, exclude="")
    nri = (merged.get("plugins") or {}).get(NRI_PLUGIN)
    nri = nri if isinstance(nri, dict) else {}
    # containerd 2.x (config version 3) has NRI on unless disabled; 1.7 (version 2) off unless enabled.
    if nri.get("disable", version < 3):
        if text is None:  # containerd 1.7 without a config file: NRI off by default, and no file to edit
            raise InstallError(
                f"containerd's NRI is off (containerd 1.7's default) and {main_path} does not exist: write it "
                f"with [plugins.'{NRI_PLUGIN}'] disable = false and restart containerd, or use --via wrapper")
        raise InstallError(
            f"containerd's NRI is off ({main_path}: plugins.'{NRI_PLUGIN}' disable = true, containerd 1.7's "
            f"default); set disable = false there and restart containerd, or use --via wrapper")
    validator = nri.get("default_validator")
    return {"plugin_path": nri.get("plugin_path") or DEFAULT_PLUGIN_PATH,
            "plugin_config_path": nri.get("plugin_config_path") or DEFAULT_CONFIG_PATH,
            "default_validator": validator if isinstance(validator, dict) else {}}


def validator_problem(validator: dict, enabling: bool = False) -> str | None:
    """One line when containerd's NRI default validator (``validator``: its merged table) refuses the OCI
    hook compat-hook's plugin adds, so every GPU container, with it on (``enable``) or turned on now
    (``enabling``); else None.

    >>> validator_problem({"enable": True, "reject_oci_hook_adjustment": True})[:60]
    "containerd's NRI default validator has reject_oci_hook_adjus"
    >>> validator_problem({"reject_oci_hook_adjustment": True}) is None
    True
    """
    if validator.get("reject_oci_hook_adjustment") and (validator.get("enable") or enabling):
        return (f"containerd's NRI default validator has reject_oci_hook_adjustment = true, which refuses the "
                f"OCI hook compat-hook's plugin adds (every GPU container would fail to be created); "
                f"turn it off in [plugins.'{NRI_PLUGIN}'.default_validator], or use --via wrapper")
    return None


def require_dropin(main_path: str, mode: str, validator: dict) -> tuple:
    """``(changes, notes)``: the :class:`~compat_hook.install.files.Change` list that puts ``--nri-require
    MODE``'s validator table in place (``off``: takes out what an earlier install put there) and lines to say.

    The drop-in is ``<main dir>/conf.d/DROPIN_NAME``; the main file gets an ``imports`` entry covering it
    when none does (created with ``version = 3`` when there is none: containerd 2.x's defaults), recorded
    in the drop-in's ``# compat-hook-install:`` line so that uninstall takes out exactly that.
    ``validator`` is containerd's merged default validator table (a toleration key set there is kept).
    """
    from .common import plain, tomlkit_module
    from .containerd import _covers, _parse, _read, _state_of
    from .files import Change

    table = REQUIRE_MODES[mode]
    dropin = os.path.join(os.path.dirname(main_path), "conf.d", DROPIN_NAME)
    old = _read(dropin)
    if old is not None and not old.startswith(_HEADER):
        raise InstallError(f"{dropin} exists and is not compat-hook's; move it away first")
    prev = _state_of(old)
    if table is None:
        return (_undo_dropin(main_path, dropin, prev) if old is not None else []), []
    tomlkit = tomlkit_module()
    notes = []
    table = dict(table)
    theirs = validator.get("tolerate_missing_plugins_annotation")
    if "tolerate_missing_plugins_annotation" in table and theirs and theirs != TOLERATE_ANNOTATION:
        # One key per containerd: the one set elsewhere stays, and compat-hook's pods need it.
        del table["tolerate_missing_plugins_annotation"]
        notes.append(f"containerd's toleration annotation stays {theirs!r}: compat-hook's own pods and static "
                     f"pods need {theirs}/pod: \"true\"")
    main_text = _read(main_path)
    doc = _parse(main_text or "", main_path)
    state = {k: prev[k] for k in ("main_created", "version_added", "imports_added", "imports_key_added",
                                  "conf_d_created") if prev.get(k)}
    if main_text is None:
        state["main_created"] = True
    if not os.path.isdir(os.path.dirname(dropin)):
        state["conf_d_created"] = True
    if "version" not in doc:
        doc["version"] = 3
        state["version_added"] = True
    imports = doc.get("imports")
    if imports is not None and not isinstance(plain(imports), list):
        raise InstallError(f"{main_path}: 'imports' is not a list")
    entries = [x for x in (plain(imports) or []) if isinstance(x, str)]
    if not any(_covers(e, os.path.dirname(main_path), dropin) for e in entries):
        glob_entry = os.path.join(os.path.dirname(dropin), "*.toml")
        if imports is None:
            doc["imports"] = tomlkit.array()
            state["imports_key_added"] = True
        doc["imports"].append(glob_entry)
        state["imports_added"] = glob_entry
    new_main = tomlkit.dumps(doc)
    out = tomlkit.document()
    out.add(tomlkit.comment(_HEADER[2:].rstrip("\n")))
    out.add(tomlkit.comment(f"--nri-require {mode}: {_MODE_TEXT[mode]}"))
    out.add(tomlkit.comment("Remove it with `compat-hook uninstall containerd --via nri`; do not edit."))
    out.add(tomlkit.comment(_STATE_TAG[2:] + json.dumps(state, sort_keys=True, separators=(",", ":"))))
    out.add(tomlkit.nl())
    out["version"] = int(doc["version"])
    plugins = tomlkit.table(is_super_table=True)
    nri = tomlkit.table(is_super_table=True)
    nri["default_validator"] = table
    plugins[NRI_PLUGIN] = nri
    out["plugins"] = plugins
    changes = []
    if main_text != new_main:
        changes.append(Change(main_path, new_main, mode=None))
    changes.append(Change(dropin, tomlkit.dumps(out), mode=0o644, backup=False, ours=True))
    return changes, notes


_HEADER = "# Written by `compat-hook install containerd --via nri --nri-require`: containerd's NRI default validator.\n"
_MODE_TEXT = {
    "per-pod": f"a pod annotated {REQUIRED_ANNOTATION}/pod: \"[{PLUGIN_NAME}]\" is refused while "
               f"compat-hook's NRI plugin is not connected",
    "all": f"every container is refused while compat-hook's NRI plugin is not connected, except those of "
           f"pods annotated {TOLERATE_ANNOTATION}/pod: \"true\"",
}


def _undo_dropin(main_path: str, dropin: str, state: dict) -> list:
    """The changes that remove the drop-in and the ``imports`` entry (and main file) its install added."""
    from .common import tomlkit_module
    from .containerd import _parse, _read
    from .files import Change

    changes = []
    main_text = _read(main_path)
    if main_text is not None:
        doc = _parse(main_text, main_path)
        imports = doc.get("imports")
        added = state.get("imports_added")
        if isinstance(added, str) and isinstance(imports, list) and added in imports:
            imports.remove(added)
            if len(imports) == 0 and state.get("imports_key_added"):
                del doc["imports"]
        if state.get("version_added") and list(doc.keys()) == ["version"]:
            del doc["version"]
        new = tomlkit_module().dumps(doc)
        if state.get("main_created") and not doc.keys() and not new.strip():
            changes.append(Change(main_path, None, ours=True))
        elif new != main_text:
            changes.append(Change(main_path, new, backup=False, restores=True))
    # The requirement goes first: a containerd starting in between requires nothing.
    return [Change(dropin, None, ours=True, prune=bool(state.get("conf_d_created"))), *changes]


def _engine_can_require(binary: str | None) -> None:
    """Raise :class:`InstallError` unless ``binary`` is a containerd with NRI's default validator (2.2+)."""
    if binary is None:
        raise InstallError("--nri-require: containerd is not on PATH, so its release (2.2 and later can "
                           "require an NRI plugin) cannot be told")
    rel = _release(binary)
    if rel is None:
        raise InstallError(f"--nri-require: {binary} --version does not say its release")
    if rel < VALIDATOR_RELEASE:
        raise InstallError(f"--nri-require: containerd {rel[0]}.{rel[1]} cannot require an NRI plugin (its "
                           f"default validator came in 2.2); compat-hook's plugin is fail-open there: "
                           f"install without --nri-require, or upgrade containerd")


def _verify_required(main_path: str, mode: str) -> str | None:
    """Why containerd's merged configuration does not hold ``mode``'s validator settings (None: it does)."""
    table = REQUIRE_MODES[mode]
    if table is None:
        return None
    try:
        got = nri_settings(main_path)["default_validator"]
    except InstallError as e:
        return str(e)
    if not got.get("enable"):
        return "containerd's merged configuration keeps the NRI default validator off (a later drop-in?)"
    if PLUGIN_NAME in table.get("required_plugins", ()) and PLUGIN_NAME not in (got.get("required_plugins") or ()):
        return f"containerd's merged configuration does not require {PLUGIN_NAME!r}"
    return None


def no_nri_release(binary: str | None) -> str | None:
    """One line when ``binary`` is a containerd older than 1.7, which has no NRI whatever its
    configuration says (1.6: Debian 12's), else None (also when its version cannot be read)."""
    rel = _release(binary) if binary is not None else None
    if rel is not None and rel < (1, 7):
        return f"containerd {rel[0]}.{rel[1]} has no NRI (1.7 and later)"
    return None


def _release(binary: str) -> tuple | None:
    """containerd's ``(major, minor)`` from ``containerd --version``, or None."""
    from .containerd import _run

    try:
        out = _run([binary, "--version"], "containerd --version", timeout=20)
    except InstallError:
        return None
    for tok in out.split()[2:3]:
        parts = tok.lstrip("v").split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return None


def detect(main_path: str) -> str | None:
    """None when the node's containerd runs NRI (so ``--via nri`` reaches its containers), else one line
    saying why not: the Helm chart's installer (``registration.path: auto``) then takes the RuntimeClass
    path. containerd 1.6 has no NRI whatever its file says; 1.7 only with ``disable = false``; 2.x unless
    disabled."""
    from .containerd import _which

    binary = _which("containerd")
    if binary is None:
        return "no containerd binary on the node's PATH"
    old = no_nri_release(binary)
    if old is not None:
        return old
    try:
        settings = nri_settings(main_path)
    except InstallError as e:
        return str(e)
    return validator_problem(settings["default_validator"])


def detect_main(argv: list | None = None) -> int:
    """``detect`` for the chart's installer script: 0 and ``nri PLUGIN`` (where the plugin's binary goes,
    which the installer then checks is still there) when NRI is on, 1 and the reason when it is off, 2 on
    a usage error (one line each, on stdout)."""
    import sys

    from ..core.errors import CompatHookError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: detect CONTAINERD_CONFIG")
        return 2
    try:
        why = detect(os.path.abspath(args[0]))
    except (CompatHookError, OSError) as e:  # an unreadable config is a reason too, in one line
        why = f"containerd's configuration could not be read: {e}"
    if why is None:
        print("nri", plugin_files(nri_settings(os.path.abspath(args[0])))[0])
        return 0
    print(" ".join(why.split()))
    return 1


def plugin_files(settings: dict) -> tuple:
    """``(binary path, config path)`` of compat-hook's plugin in containerd's NRI directories."""
    base = f"{PLUGIN_INDEX}-{PLUGIN_NAME}"
    return (os.path.join(settings["plugin_path"], base),
            os.path.join(settings["plugin_config_path"], base + ".conf"))


def render_config(opts, created: list) -> str:
    """The plugin's configuration: the hooks.d document of this registration, ``log_file``, ``created_dirs``."""
    from ..core.registration import registered_log_file
    from .hooksd import document

    doc = document(opts)
    # The hook's log line then says which path added it (`"via": "nri"`).
    doc["hook"]["args"] += ["--via", "nri"]
    doc["log_file"] = registered_log_file(opts.hook_config) or ""
    if created:
        doc["created_dirs"] = created
    return json.dumps(doc, indent=2) + "\n"


def _is_our_config(text: str | None) -> bool:
    from .hooksd import is_ours

    return is_ours(text)


def _is_our_binary(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return _BINARY_MARK in f.read()
    except OSError:
        return False


def _source_binary(opts) -> str:
    if opts.nri_plugin:
        src = os.path.abspath(opts.nri_plugin)
        if not os.path.isfile(src):
            raise InstallError(f"the NRI plugin {src} does not exist; build it (make nri-plugin) "
                               f"or name it with --nri-plugin PATH")
    else:
        src = next((p for p in (PACKAGED_PLUGIN, DEFAULT_PLUGIN) if os.path.isfile(p)), "")
        if not src:
            raise InstallError(f"no NRI plugin at {PACKAGED_PLUGIN} (a Debian package built with it: make image) "
                               f"or {DEFAULT_PLUGIN}; build it (make nri-plugin) and name it with --nri-plugin PATH")
    if not _is_our_binary(src):
        raise InstallError(f"{src} is not compat-hook's NRI plugin (compat-hook-nri)")
    return src


def install(opts) -> int:
    """Put the plugin and its configuration in place; 0 (also when nothing changed), 1 on an install error."""
    return _main(lambda: _install(opts))


def uninstall(opts) -> int:
    """Remove the plugin, its configuration and the dirs install created for them."""
    return _main(lambda: _uninstall(opts))


def _main(fn) -> int:
    from .common import run_command

    return run_command(fn)


def _install(opts) -> int:
    from ..core.atomic import replace
    from .checks import enforce
    from .files import missing_dirs, read_text, write_atomic
    from .wrapper import fail_closed

    from .containerd import _which

    main_path = os.path.abspath(opts.config or "/etc/containerd/config.toml")
    enforce(opts.hook_config, "hook", say)
    settings = nri_settings(main_path)  # first: containerd 1.6 has no NRI, whatever plugin there is
    mode = opts.nri_require or "off"
    if mode not in REQUIRE_MODES:
        from ..core.errors import UsageError

        raise UsageError(f"--nri-require {mode!r}: one of {', '.join(REQUIRE_MODES)}")
    if REQUIRE_MODES[mode] is not None:
        _engine_can_require(_which("containerd"))
    why = validator_problem(settings["default_validator"], enabling=REQUIRE_MODES[mode] is not None)
    if why is not None:
        raise InstallError(why)
    required, required_notes = require_dropin(main_path, mode, settings["default_validator"])
    src = _source_binary(opts)
    binary, conf = plugin_files(settings)
    old_conf = read_text(conf)
    if old_conf is not None and not _is_our_config(old_conf):
        raise InstallError(f"{conf} exists and is not compat-hook's; move it away first")
    if os.path.lexists(binary) and not _is_our_binary(binary):
        raise InstallError(f"{binary} exists and is not compat-hook's NRI plugin; move it away first")
    created = []
    if old_conf is not None:
        try:
            created = [d for d in json.loads(old_conf).get("created_dirs", []) if isinstance(d, str)]
        except ValueError:
            created = []
    for d in (os.path.dirname(binary), os.path.dirname(conf)):
        for m in reversed(missing_dirs(d)):
            if m not in created:
                created.append(m)
    # Deepest first, for uninstall's rmdir.
    created.sort(key=lambda p: p.count("/"), reverse=True)
    new_conf = render_config(opts, created)
    with open(src, "rb") as f:
        data = f.read()
    try:
        with open(binary, "rb") as f:
            same_binary = f.read() == data
    except OSError:
        same_binary = False
    if opts.dry_run:
        from .files import diff

        if not same_binary:
            say(f"would write {binary} (the NRI plugin, from {src})")
        d = diff(old_conf, new_conf, conf)
        if d:
            say(d.rstrip("\n"))
        for c in required:
            if c.changed:
                say(c.diff().rstrip("\n"))
        if same_binary and not d and not any(c.changed for c in required):
            say("no changes")
        return 0
    changed = False
    if old_conf != new_conf:
        write_atomic(conf, new_conf, mode=0o644, backup=False)
        say(f"wrote {conf}")
        changed = True
    if not same_binary:
        os.makedirs(os.path.dirname(binary), mode=0o755, exist_ok=True)
        replace(binary, data, 0o755, fsync=True)
        say(f"wrote {binary}")
        changed = True
    # The requirement after the plugin it requires: a containerd starting in between finds the plugin.
    if _apply_quiet(required):
        changed = True
        why = _verify_required(main_path, mode)
        if why is not None:
            _undo(required)
            raise InstallError(f"{why}; its drop-in and imports are back as they were (the plugin is in place)")
        for n in required_notes:
            say(n)
        if REQUIRE_MODES[mode] is not None:
            say(f"containerd: NRI's default validator now {_MODE_TEXT[mode]} (after containerd's restart)")
    if not changed:
        say("containerd: already registered; nothing changed")
        return 0
    say(f"containerd: the NRI plugin {os.path.basename(binary)} adds compat-hook's createContainer hook to every "
        f"container that asks for a GPU (CDI devices, cdi.k8s.io/ annotations, NVIDIA_VISIBLE_DEVICES); "
        f"restart containerd to start it (systemctl restart containerd)")
    if fail_closed(opts.hook_config) and REQUIRE_MODES[mode] is None:
        say("note: on_error: fail applies to the hook; containerd's NRI drops a plugin that is missing or "
            "dead and creates the container without it (fail-open, traced in compat-hook's log; "
            "--nri-require refuses such containers on containerd 2.2 and later)")
    return 0


def _apply_quiet(changes: list) -> bool:
    """Write ``changes`` (files.apply, its ``wrote``/``removed`` lines); whether any changed."""
    from .files import apply

    if not any(c.changed for c in changes):
        return False
    return apply(changes, out=sys.stdout)


def _undo(changes: list) -> None:
    """Put back what :func:`_apply_quiet` changed (the files as they were before)."""
    from .files import remove, write_atomic

    for c in reversed(changes):
        if c.old is None:
            remove(c.path, backup=False)
        else:
            write_atomic(c.path, c.old, backup=False)


def _uninstall(opts) -> int:
    from .files import read_text, remove

    main_path = os.path.abspath(opts.config or "/etc/containerd/config.toml")
    try:
        settings = nri_settings(main_path)
    except InstallError:  # NRI turned off since: the files are still where the defaults put them
        settings = {"plugin_path": DEFAULT_PLUGIN_PATH, "plugin_config_path": DEFAULT_CONFIG_PATH}
    binary, conf = plugin_files(settings)
    required, _ = require_dropin(main_path, "off", {})
    old_conf = read_text(conf)
    if old_conf is not None and not _is_our_config(old_conf):
        raise InstallError(f"{conf} is not compat-hook's; not removing it")
    if os.path.lexists(binary) and not _is_our_binary(binary):
        raise InstallError(f"{binary} is not compat-hook's NRI plugin; not removing it")
    created = []
    if old_conf is not None:
        try:
            created = [d for d in json.loads(old_conf).get("created_dirs", []) if isinstance(d, str)]
        except ValueError:
            pass
    gone = [p for p in (binary, conf) if os.path.lexists(p)]
    if not gone and not required:
        say("containerd: already unregistered; nothing changed")
        return 0
    if opts.dry_run:
        for c in required:
            say(c.diff().rstrip("\n"))
        for p in gone:
            say(f"would remove {p}")
        return 0
    # The requirement first: a containerd starting now requires no plugin that is going.
    _apply_quiet(required)
    # The binary first: a containerd starting now finds no plugin rather than one without its configuration.
    for p in (binary, conf):
        if os.path.lexists(p):
            remove(p, backup=False)
            say(f"removed {p}")
    for d in created:
        try:
            os.rmdir(d)
            say(f"removed {d}/")
        except OSError:  # not empty (someone else's plugins) or gone
            pass
    say("containerd: unregistered; a running compat-hook-nri stops with containerd's next restart "
        "(until then it still adds the hook)")
    return 0
