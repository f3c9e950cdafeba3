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

Failure semantics (containerd 2.0/2.1): a plugin that is missing, dies or
answers late (2 s request timeout) is dropped and the container is created
without its changes: **fail-open**, traced by the plugin as a ``fail_open``
line in compat-hook's log when its connection ends. containerd's NRI
validator that can require a plugin (``RequiredPlugins``) is not in 2.1; where
the engine lacks it, ``on_error: fail`` cannot make NRI fail closed (the
install says so). containerd reads the directory only at start: restart it
afterwards (never done by these commands).
"""

from __future__ import annotations

import json
import os

from .hooksd import InstallError, say

__all__ = ["install", "uninstall", "detect", "detect_main", "DEFAULT_PLUGIN", "PACKAGED_PLUGIN", "PLUGIN_NAME", "PLUGIN_INDEX", "nri_settings",
           "plugin_files", "render_config"]

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
    version = _version(text, main, main_path, binary)
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
    return {"plugin_path": nri.get("plugin_path") or DEFAULT_PLUGIN_PATH,
            "plugin_config_path": nri.get("plugin_config_path") or DEFAULT_CONFIG_PATH}


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
        nri_settings(main_path)
    except InstallError as e:
        return str(e)
    return None


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

    main_path = os.path.abspath(opts.config or "/etc/containerd/config.toml")
    enforce(opts.hook_config, "hook", say)
    settings = nri_settings(main_path)  # first: containerd 1.6 has no NRI, whatever plugin there is
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
        if same_binary and not d:
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
    if not changed:
        say("containerd: already registered; nothing changed")
        return 0
    say(f"containerd: the NRI plugin {os.path.basename(binary)} adds compat-hook's createContainer hook to every "
        f"container that asks for a GPU (CDI devices, cdi.k8s.io/ annotations, NVIDIA_VISIBLE_DEVICES); "
        f"restart containerd to start it (systemctl restart containerd)")
    if fail_closed(opts.hook_config):
        say("note: on_error: fail applies to the hook; containerd's NRI drops a plugin that is missing or "
            "dead and creates the container without it (fail-open, traced in compat-hook's log)")
    return 0


def _uninstall(opts) -> int:
    from .files import read_text, remove

    main_path = os.path.abspath(opts.config or "/etc/containerd/config.toml")
    try:
        settings = nri_settings(main_path)
    except InstallError:  # NRI turned off since: the files are still where the defaults put them
        settings = {"plugin_path": DEFAULT_PLUGIN_PATH, "plugin_config_path": DEFAULT_CONFIG_PATH}
    binary, conf = plugin_files(settings)
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
    if not gone:
        say("containerd: already unregistered; nothing changed")
        return 0
    if opts.dry_run:
        for p in gone:
            say(f"would remove {p}")
        return 0
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
