"""The ``compat-hook`` command line: it only parses and wires.

``compat-hook hook`` is dispatched before anything heavy is imported (it
runs on every container start); the other commands use argparse.

Exit statuses (also in the README): 0 a decision was reached / the command
did its job; 1 the hook failed with ``on_error: fail``, or a command failed;
2 bad usage or unreadable input.
"""

from __future__ import annotations

import os
import sys

from ..core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CompatHookError

__all__ = ["main", "entry"]


def _die(msg: str, status: int = EXIT_USAGE) -> int:
    sys.stderr.write(f"compat-hook: {msg}\n")
    return status


def _end_on_signal_as_pid1() -> None:
    """As a container's PID 1 (the cluster's agent, validator and fleet controller), a signal with no
    handler is ignored: a SIGTERM that comes while the process is still starting (imports, the
    kubeconfig) would make the kubelet wait out the whole grace period, then SIGKILL it. Until a
    long-running command installs its own handler (which stops it cleanly), SIGTERM and SIGINT end the
    process at once: it has written nothing yet."""
    if os.getpid() != 1:
        return
    import signal

    def end(signum, _frame):
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "hook":
        from .hook import main as hook_main

        return hook_main(argv[1:])
    _end_on_signal_as_pid1()
    try:
        return _main(argv)
    except CompatHookError as e:
        return _die(str(e), EXIT_USAGE if e.code in ("usage", "bad_config", "bad_state") else EXIT_FAILED)
    except KeyboardInterrupt:
        return _die("interrupted", 130)
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:
        return _die(f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}", EXIT_FAILED)


def entry() -> None:
    """``compat-hook ARGS`` from a boot code: :func:`main`, then exit with its status.

    The registered hook does not come here (``compat_hook.cli.entry`` runs the
    hook directly); ``hook`` is still handled, by :func:`compat_hook.commands.hook.entry`.
    """
    if sys.argv[1:2] == ["hook"]:
        from .hook import entry as hook_entry

        hook_entry(sys.argv[2:])
    sys.exit(main(sys.argv[1:]))


#: --config means compat-hook's own configuration in every command (install/uninstall: --hook-config).
_CONFIG_HELP = "compat-hook's configuration (default: $COMPAT_HOOK_CONFIG, else /etc/compat-hook/config.yaml)"


def _parser():
    import argparse

    from .. import __version__
    from ..core.argparser import Parser

    p = Parser(prog="compat-hook", description=(
        "Turn on CUDA Forward Compatibility per container, decided at every start."))
    p.add_argument("--version", action="version", version=f"compat-hook {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    e = sub.add_parser("explain", help="show the facts, the decision and what would change (changes nothing)")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--rootfs", metavar="DIR", help="a container root filesystem (treated as a GPU container)")
    src.add_argument("--bundle", metavar="DIR", help="an OCI bundle (config.json + its root)")
    e.add_argument("--host-root", metavar="DIR", help="read host facts under DIR (default /)")
    e.add_argument("--host-driver-version", metavar="V", help="assume this host kernel driver version")
    e.add_argument("--host-cuda-version", metavar="V", help="assume this host CUDA version (Tegra path)")
    e.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
    e.add_argument("--json", action="store_true", help="print one JSON object")

    pl = sub.add_parser("plan", help="predict each image's outcome on a target driver before an upgrade")
    pl.add_argument("sources", nargs="+", metavar="SOURCE",
                    help="a rootfs or OCI bundle dir, oci:DIR[:TAG], oci-archive:FILE[:TAG], "
                         "docker-archive:FILE, containerd:REF or containerd: (every image), docker:REF or "
                         "docker:, containers-storage:REF or containers-storage: (unpacked layers read in place)")
    tgt = pl.add_mutually_exclusive_group(required=True)
    tgt.add_argument("--driver", metavar="VERSION", help="the target driver version (550.54.15)")
    tgt.add_argument("--manifest", metavar="FILE",
                     help="a ClusterPolicy or NVIDIADriver manifest naming the target version")
    pl.add_argument("--from-driver", metavar="VERSION", help="the current driver (default: the host's)")
    pl.add_argument("--host-root", metavar="DIR", help="read host facts under DIR (default /)")
    pl.add_argument("--gpu", action="append", metavar="NAME", default=[],
                    help="a GPU: its NVML name, GFD's nvidia.com/gpu.product label or a model name "
                         "(H100, L40S, RTX 4090) (repeatable; default: the host's, with the NVIDIA GPUs on its "
                         "PCI bus that its driver does not list)")
    pl.add_argument("--store", metavar="DIR", help="the host compat store to consider (default: the config's)")
    pl.add_argument("--address", metavar="SOCKET",
                    help="containerd's socket for containerd: sources (default: $CONTAINERD_ADDRESS, else the "
                         "first of /run/containerd, k3s/RKE2's and microk8s's sockets that exists)")
    pl.add_argument("--namespace", metavar="NS", default="k8s.io", help="containerd namespace (default k8s.io)")
    pl.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
    pl.add_argument("--json", action="store_true", help="print one JSON object")
    pl.add_argument("--fail-on", choices=("broken", "regression", "change"),
                    help="exit 3 when an image is broken after the upgrade (broken), works now and is broken "
                         "after it (regression), or any outcome changes (change); exit 4 when a source cannot be "
                         "read or no image was read")
    pl.add_argument("--allow-unreadable", action="store_true",
                    help="do not exit 4 when a source cannot be read or no image was read")

    rp = sub.add_parser("report", help="what the hook and the wrapper decided, per host driver version (from the log)")
    rp.add_argument("--log", action="append", metavar="FILE", default=[],
                    help="a decision log, plain or .gz (repeatable; default: the config's log_file); "
                         "its rotated siblings FILE.1, FILE.2.gz ... are read too")
    rp.add_argument("--no-rotated", action="store_true", help="read only the files named")
    rp.add_argument("--since", metavar="TIME", help="only records from TIME on: ISO 8601, or an age (30m, 2h, 3d)")
    rp.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
    rp.add_argument("--json", action="store_true", help="print one JSON object")
    rp.add_argument("--fail-on", choices=("failures",), help="exit 3 when any record is a failure (decision error)")

    sub.add_parser("hook", help="the OCI hook: reads the state JSON on stdin (see the README)")

    he = sub.add_parser("hook-entry", help="print the OCI hook entry (path, args, env, timeout) as JSON")
    he.add_argument("--stage", default="createContainer",
                    choices=("prestart", "createRuntime", "createContainer"))
    he.add_argument("--config", metavar="FILE",
                    help="compat-hook's configuration the entry names (default: none named; the hook "
                         "then reads /etc/compat-hook/config.yaml, never $COMPAT_HOOK_CONFIG)")
    he.add_argument("--state-dir", metavar="DIR")
    he.add_argument("--format", default="oci", choices=("oci", "cdi", "hooks.d"),
                    help="oci: a config.json hooks entry; cdi: a CDI containerEdits hook; hooks.d: a whole hooks.d file")

    cl = sub.add_parser("cluster", add_help=False,
                        help="the cluster side: `cluster agent` (per node, in the DaemonSet), `cluster status`, "
                             "`cluster release`, `cluster validate`, `cluster fleet` (the driver-version admission's "
                             "controller)")
    cl.add_argument("cluster_args", nargs=argparse.REMAINDER)

    d = sub.add_parser("demo", help="show the main job on a built-in example")
    d.add_argument("--no-containers", action="store_true", help="explain only, even when runc is present")
    d.add_argument("--keep", action="store_true", help="keep the generated example tree")

    c = sub.add_parser("config", help="print the default configuration (commented YAML), or check a file")
    c.add_argument("--check", metavar="FILE", help="validate FILE and print its effective settings")

    s = sub.add_parser("store", help="the host compat store")
    ssub = s.add_subparsers(dest="store_command", metavar="ACTION", parser_class=Parser)
    sa = ssub.add_parser("add", help="import a cuda-compat package (unpacked dir or .deb)")
    sa.add_argument("path")
    ssub.add_parser("list", help="list stored packages")
    sr = ssub.add_parser("remove", help="remove a stored package")
    sr.add_argument("version")
    for x in (sa, sr, ssub.choices["list"]):
        x.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
        x.add_argument("--store-dir", metavar="DIR")
        x.add_argument("--json", action="store_true")

    for verb in ("install", "uninstall"):
        _install_options(sub.add_parser(verb, **_INSTALL_TEXT[verb]), verb)
    return p


#: The two verbs share their options but not their text.
_INSTALL_TEXT = {
    "install": dict(
        help="register compat-hook with an engine",
        description="Register compat-hook with a container engine: the runtime wrapper (containerd, "
                    "Docker, CRI-O runtime handler), the hooks.d file (Podman, CRI-O) or the NVIDIA "
                    "toolkit's runtime chain. A file that may hold other settings is backed up "
                    "first; --dry-run prints the diff. Restart the engine afterwards (not Podman)."),
    "uninstall": dict(
        help="undo install for an engine",
        description="Undo `compat-hook install` for a container engine: put back what install changed "
                    "in the engine's configuration and remove what it created (the wrapper, drop-in or "
                    "hooks.d file, backups of files it created, its empty dirs). Give the same options "
                    "as at install (--engine-config, --runtime-name, --hooks-dir, --wrapper-path). "
                    "Restart the engine afterwards (not Podman)."),
}


def _install_options(i, verb: str) -> None:
    """The options of ``install`` and ``uninstall`` (``verb``), which take the same ones."""
    done = "gets" if verb == "install" else "loses"
    i.add_argument("engine", choices=("containerd", "podman", "crio", "docker", "nvidia-toolkit"),
                   help=f"the engine whose configuration {done} the registration")
    # --config is compat-hook's own config in every other command; here it used to be the
    # engine's file. It stays, for one release, as a deprecated alias of --engine-config.
    # dest "config" is the engine's file in install.Options.
    eng = i.add_mutually_exclusive_group()
    eng.add_argument("--engine-config", dest="config", metavar="PATH",
                     help="the engine's config file (containerd config.toml, Docker daemon.json, the "
                          "CRI-O drop-in, Podman's hooks.d file, the NVIDIA toolkit's config.toml; "
                          "default: the engine's own)")
    eng.add_argument("--config", dest="config", metavar="PATH", action=_deprecated_alias_action(),
                     help="deprecated alias of --engine-config (this release only); "
                          "compat-hook's own config is --hook-config")
    i.add_argument("--hook-config", metavar="FILE",
                   help="compat-hook's own config for the registered entry (default "
                        "/etc/compat-hook/config.yaml; what --config means in the other commands)")
    i.add_argument("--runtime-name", default="cuda-compat",
                   help="containerd/CRI-O runtime handler (the RuntimeClass handler), Docker runtime name")
    i.add_argument("--set-as-default", action="store_true",
                   help="also make it the engine's default runtime (containerd, CRI-O, Docker)" if verb == "install"
                   else "install's option, accepted here: uninstall takes back a default runtime that "
                        "names this runtime whether or not it is given")
    i.add_argument("--dry-run", action="store_true", help="print the diff; write nothing")
    i.add_argument("--via", choices=("wrapper", "base-spec", "nri"), default="wrapper",
                   help="containerd: the runtime wrapper as BinaryName (default), the hook in a "
                        "base_runtime_spec (app containers only), or the NRI plugin, which adds the hook "
                        "to every GPU container whatever runtime it names (containerd 2.x)")
    i.add_argument("--nri-plugin", metavar="PATH",
                   help="containerd --via nri: the built compat-hook-nri binary (default the Debian package's "
                        "/usr/libexec/compat-hook/compat-hook-nri, else /usr/local/libexec/compat-hook/compat-hook-nri)")
    i.add_argument("--nri-require", choices=("off", "per-pod", "all"),
                   help="containerd 2.2+ --via nri: fail closed through NRI's default validator: refuse a "
                        "container while compat-hook's plugin is not connected: pods annotated "
                        "required-plugins.noderesource.dev/pod: \"[compat-hook]\" (per-pod), or every pod "
                        "but those annotated tolerate-missing-plugins.compat-hook.io/pod: \"true\" (all); "
                        "default off (fail-open)" if verb == "install"
                   else "install's option, accepted here: uninstall takes out the requirement install wrote")
    i.add_argument("--hooks-dir", metavar="DIR",
                   help="Podman/CRI-O: where the hooks.d file goes (default /usr/share/containers/oci/hooks.d)")
    i.add_argument("--wrapper-path", metavar="PATH",
                   help="where the runtime wrapper is written (default: the Debian package's when it is "
                        "installed, else /usr/local/libexec/compat-hook/compat-hook-runtime)")
    i.add_argument("--state-dir", metavar="DIR",
                   help="state dir (cache) for the registered hook entry / wrapper (default /var/lib/compat-hook)")
    i.add_argument("--toolkit-config", metavar="PATH|none",
                   help="containerd, Docker: also register under this NVIDIA toolkit config.toml "
                        "(default: /etc/nvidia-container-runtime/config.toml and the GPU Operator's, "
                        "where they exist; none: do not)")
    i.add_argument("--config-source", choices=("auto", "file", "command"), default="auto",
                   help="containerd: read the current config with `containerd config dump` "
                        "(command), from the files (file), or command when containerd is installed (auto)")


def _deprecated_alias_action():
    import argparse

    class DeprecatedAlias(argparse._StoreAction):
        """Store like the flag it stands for, with a one-line notice on stderr."""

        def __call__(self, parser, namespace, values, option_string=None):
            sys.stderr.write(f"compat-hook: {option_string} of {parser.prog.split()[-1]} is deprecated: "
                             f"use --engine-config (compat-hook's own config is --hook-config)\n")
            super().__call__(parser, namespace, values, option_string)

    return DeprecatedAlias


def _main(argv: list) -> int:
    if argv[:1] == ["cluster"]:
        # Its own parser: argparse's REMAINDER takes no option as the first word (cluster --help).
        return _cmd_cluster(argv[1:])
    p = _parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse already printed its one-line error
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    if args.command is None:
        p.print_help()
        return EXIT_USAGE
    return globals()["_cmd_" + args.command.replace("-", "_")](args)


def _load_config(path, **changes):
    from ..core import config as _config

    cfg = _config.load(path)
    changes = {k: v for k, v in changes.items() if v is not None}
    return cfg.replace(**changes) if changes else cfg


def _dir_arg(flag: str, value):
    """``value`` when it names a directory (or is None); else a one-line usage error."""
    import os

    from ..core.errors import UsageError

    if value is not None and not os.path.isdir(value):
        raise UsageError(f"{flag} {value}: no such directory")
    return value


def _version_arg(flag: str, value):
    """``value`` when it is a version (or None), the check the config applies to the same key."""
    if value is None:
        return None
    from ..core.errors import InvalidVersion, UsageError
    from ..core.versions import parse_version

    try:
        parse_version(value)
    except InvalidVersion:
        raise UsageError(f"{flag}: not a version of 1-3 numeric parts, got {value!r}") from None
    return value


def _print(report: dict, as_json: bool, render) -> None:
    """One JSON object (``--json``) or the command's text rendering, on stdout."""
    if as_json:
        import json

        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render(report))


def _cmd_explain(args) -> int:
    from .explain import explain, render_text

    # A missing --host-root would read no host at all and explain the
    # "driver unknown" case without saying why.
    cfg = _load_config(args.config, host_root=_dir_arg("--host-root", args.host_root))
    report = explain(cfg, rootfs=args.rootfs, bundle=args.bundle,
                     host_driver_version=_version_arg("--host-driver-version", args.host_driver_version),
                     host_cuda_version=_version_arg("--host-cuda-version", args.host_cuda_version))
    _print(report, args.json, render_text)
    return EXIT_OK


def _cmd_plan(args) -> int:
    from .plan import gate, plan, render_text

    cfg = _load_config(args.config, host_root=_dir_arg("--host-root", args.host_root), store_dir=args.store)
    report = plan(cfg, args.sources, driver=args.driver, manifest=args.manifest,
                  from_driver=args.from_driver, gpus=args.gpu, address=args.address, namespace=args.namespace,
                  allow_unreadable=args.allow_unreadable)
    _print(report, args.json, render_text)
    status, why = gate(report, args.fail_on, args.allow_unreadable)
    if why:
        _die(why, status)
    return status


def _cmd_report(args) -> int:
    from ..core.errors import UsageError
    from .report import exit_status, parse_since, render_text, report

    since = parse_since(args.since) if args.since is not None else None
    logs = args.log
    if not logs:
        cfg = _load_config(args.config)
        if not cfg.log_file:
            raise UsageError("no log: the config's log_file is null; give --log FILE")
        logs = [cfg.log_file]
    rep = report(logs, since=since, rotated=not args.no_rotated)
    _print(rep, args.json, render_text)
    return exit_status(rep, args.fail_on)


def _cmd_hook_entry(args) -> int:
    import json
    from ..core.registration import hook_entry, hooksd_document

    from ..install.wrapper import fail_closed

    # on_error: fail is decided now, at registration (the boot code reads it before any import).
    from ..core.registration import registered_log_file

    entry = hook_entry(stage=args.stage, config=args.config, state_dir=args.state_dir,
                       fail_closed=fail_closed(args.config), log_file=registered_log_file(args.config))
    if args.format == "cdi":
        doc = dict(hookName=args.stage, **entry)
    elif args.format == "hooks.d":
        doc = hooksd_document(entry, stages=[args.stage])
    else:
        doc = entry
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    return EXIT_OK


def _cmd_cluster(argv: list) -> int:
    # Parsed and imported only here: the Kubernetes client never loads on any other command's path.
    from ..cluster.cli import main as cluster_main

    return cluster_main(argv)


def _cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(containers=not args.no_containers, keep=args.keep)


def _cmd_config(args) -> int:
    from ..core import config as _config

    if args.check:
        import json

        try:
            cfg = _config.load(args.check)
        except _config.ConfigError as e:
            # Every problem, one a line. load() names the file for read and YAML
            # errors, only the key for a bad value.
            for msg in _config.error_lines(e):
                prefix = "" if msg.startswith(args.check + ": ") else args.check + ": "
                sys.stderr.write(f"compat-hook: {prefix}{msg}\n")
            return EXIT_USAGE
        sys.stdout.write(json.dumps(cfg.to_dict(), indent=2) + "\n")
        # What install would say: settings that cannot take effect on a registration path.
        from ..install.checks import problems

        status = EXIT_OK
        for path, label in (("hook", "registered as a hook alone (hooks.d, base-spec)"),
                            ("wrapper", "registered through the runtime wrapper")):
            for level, message in problems(cfg, path):
                sys.stderr.write(f"compat-hook: {args.check}: {level} when {label}: {message}\n")
                if level == "error":
                    status = EXIT_FAILED
        return status
    sys.stdout.write(_config.render_default_yaml())
    return EXIT_OK


def _cmd_store(args) -> int:
    import json
    from . import store

    if args.store_command is None:
        return _die("store needs an action: add, list or remove")
    cfg = _load_config(args.config, store_dir=args.store_dir)
    if args.store_command == "add":
        entry = store.add(cfg.store_dir, args.path, cfg)
        out = entry if args.json else f"stored compat driver {entry['version']} at {entry['path']}"
    elif args.store_command == "list":
        entries = store.list_entries(cfg.store_dir)
        if args.json:
            out = entries
        else:
            out = "\n".join(f"{e['version']}  CUDA {e.get('cuda_version') or '?'}  {e['path']}"
                            for e in entries) or "(the store is empty)"
    else:
        store.remove(cfg.store_dir, args.version)
        out = {"removed": args.version} if args.json else f"removed {args.version}"
    sys.stdout.write((json.dumps(out, indent=2) if args.json else out) + "\n")
    return EXIT_OK


def _cmd_install(args) -> int:
    from ..install import Options, run_install

    return run_install(Options.from_namespace(args), uninstall=False)


def _cmd_uninstall(args) -> int:
    from ..install import Options, run_install

    return run_install(Options.from_namespace(args), uninstall=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
