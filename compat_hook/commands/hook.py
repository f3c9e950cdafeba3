"""``compat-hook hook``: the OCI hook (prestart, createRuntime, createContainer).

One run = parse flags -> gather facts -> the pure decision -> apply -> one
log line. Works the same under runc and crun at any of the three stages,
because it needs only the bundle from the state and the rootfs from
config.json.

Exit status: 0 when a decision was carried out, and also on any failure
unless ``on_error: fail`` (then 1, with one line on stderr, which runc shows
in its error). The hook never prints a traceback. A configuration file that
does not load does not make it step aside: the built-in defaults decide
(``"config": "defaults"`` and ``config_error`` in the log line), unless the
registration is fail-closed (``--fail-closed``), which stops the container
(:func:`compat_hook.core.config.load_for_start`).

This module is the hot path: it imports only what each step needs, when it
needs it (see benchmarks/).
"""

from __future__ import annotations

import sys
import time

from ..core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, describe, one_line

__all__ = ["main", "run", "entry"]

STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")


HELP = f"""\
usage: compat-hook hook [--config FILE] [--stage STAGE] [--state-dir DIR] [--dry-run]
                        [--host-root DIR] [--host-driver-version V] [--via PATH]

The OCI hook. A container engine runs it at container start with the container's
state JSON on stdin; it decides whether the image's compat driver is used, makes
it so, and appends one JSON line to the log. `compat-hook hook-entry` prints the
entry to register; `compat-hook explain` shows a decision without a container.

options:
  --config FILE          compat-hook's configuration (default /etc/compat-hook/config.yaml;
                         never taken from the environment)
  --stage STAGE          the stage it is registered at: {', '.join(STAGES[:3])}
  --state-dir DIR        the cache dir (default /var/lib/compat-hook)
  --dry-run              log the decision and the edits it would make; change nothing
  --host-root DIR        read host facts under DIR (default /; for testing)
  --host-driver-version V
                         assume this host kernel driver version (for testing)
  --via PATH             the path that added this hook, recorded as "via" in the log line
                         (nri: compat-hook's NRI plugin; set by the registration)
  -h, --help             show this help and exit (nothing is read or logged)

exit status: 0 a decision was carried out, or any failure with on_error: continue
(the container starts without compat); 1 a failure with on_error: fail; 2 bad usage.
A configuration that does not load: the built-in defaults decide (logged with
config_error), unless the registration says on_error: fail (then 1).
"""


class HelpRequested(Exception):
    """``-h``/``--help``: print :data:`HELP`; not a run, so nothing is logged."""


#: The paths a registration may name with ``--via`` (the others add the hook without it).
VIAS = ("nri",)


def _parse(argv: list) -> dict:
    # Hand-rolled: argparse costs ~5 ms to import, the hook's whole budget (docs/design.md, "Hot path rules").
    opts = {"config": None, "stage": None, "state_dir": None, "dry_run": False,
            "host_root": None, "host_driver_version": None, "via": None}
    it = iter(argv)
    for a in it:
        key, eq, val = a.partition("=")
        name = key[2:].replace("-", "_") if key.startswith("--") else None
        if name == "dry_run" and not eq:
            opts["dry_run"] = True
        elif name in opts and name != "dry_run":
            if not eq:
                val = next(it, None)
                if val is None:
                    raise UsageError(f"{key} needs a value")
            opts[name] = val
        elif a in ("-h", "--help"):
            raise HelpRequested()
        else:
            raise UsageError(f"unknown argument: {a}")
    if opts["stage"] is not None and opts["stage"] not in STAGES:
        raise UsageError(f"unknown stage {opts['stage']!r} (one of {', '.join(STAGES)})")
    if opts["via"] is not None and opts["via"] not in VIAS:
        raise UsageError(f"unknown --via {opts['via']!r} (one of {', '.join(VIAS)})")
    return opts


def run(argv: list, stdin_fd: int = 0, environ=None) -> tuple:
    """Do one hook run; returns ``(exit_status, log_record)``. Never raises.

    ``log_record`` is None for ``--help``, which is no run and logs nothing.

    The process environment is never read: a runtime that ignores the entry's
    ``env`` hands the hook the image's ``ENV``, and ``COMPAT_HOOK_CONFIG`` /
    ``COMPAT_HOOK_STATE_DIR`` from there would let the image pick the config
    (``ldconfig:``, a program run as root on the host) and a host dir to write.
    The config and state dir come from argv (the registration) or the defaults;
    ``environ`` is only for in-process callers that pass one explicitly.
    """
    t0 = time.monotonic()
    from ..core.logjson import fail_open, finish

    env = {} if environ is None else environ
    record = {"event": "hook", "container_id": None, "stage": None}
    config = None
    try:
        opts = _parse(argv)
    except HelpRequested:
        # Help is not a container start: no log line (a failure record here
        # would make `report --fail-on failures` fail), no state, exit 0.
        sys.stdout.write(HELP)
        return EXIT_OK, None
    except UsageError as e:
        msg = one_line(str(e))
        record.update(decision="error", reason=e.code, error=msg)
        sys.stderr.write(f"compat-hook: {msg}\n")
        finish(record, _config_for_log(argv, env), t0)
        return EXIT_USAGE, record
    record["stage"] = opts["stage"]
    if opts["via"]:
        record["via"] = opts["via"]
    state_dir = opts["state_dir"] or env.get("COMPAT_HOOK_STATE_DIR") or None
    started = False
    try:
        from ..core import config as _config

        config, cfg_error = _config.load_for_start(opts["config"], state_dir=state_dir or _config.DEFAULT_STATE_DIR,
                                                   environ=env, fixed=_registration)
        if cfg_error is not None:
            if config.on_error == "fail":
                raise cfg_error  # the registration is fail-closed: nothing runs without its configuration
            msg = describe(cfg_error)[1]
            record.update(config="defaults", config_error=msg)
            sys.stderr.write(f"compat-hook: invalid configuration ({msg}): the built-in defaults decided\n")
        changes = {}
        if opts["host_root"]:
            changes["host_root"] = opts["host_root"]
        if opts["host_driver_version"]:
            changes["host_driver_version"] = opts["host_driver_version"]
        if changes:
            config = config.replace(**changes)
        state_dir = state_dir or _config.DEFAULT_STATE_DIR
        started = True
        _hook(opts, config, state_dir, stdin_fd, record)
        status = EXIT_OK
    except Exception as e:  # last line of defence: never a traceback, never a broken container
        _not_in_effect(record)
        status = EXIT_FAILED if fail_open(record, config, *describe(e), prog="compat-hook",
                                          stopped="container stopped",
                                          goes_on="container starts without compat") else EXIT_OK
        if not started:  # failed before the state was read: stdin is unread, name the container from it
            _identify(record, stdin_fd)
    finish(record, config, t0)
    return status, record


def _not_in_effect(record: dict) -> None:
    """A failed run claims no ``maps``: the file it meant to make win is ``not_in_effect``, and the
    container maps what the image and the other hooks give it (``outcome`` says the start goes on
    without compat-hook's effect)."""
    meant = record.pop("maps", None)
    if meant:
        record["not_in_effect"] = meant


def _registration() -> dict:
    """What the hook's registration fixed by itself (``--fail-closed``, its log file): asked only when
    the configuration does not load (:func:`compat_hook.core.config.load_for_start`)."""
    from ..core.registration import fixed

    return fixed()


def _identify(record: dict, stdin_fd: int) -> None:
    """Name the container of a failed run (``container_id``, ``bundle``, the CRI's pod/image annotations)
    from the OCI state, so ``report`` can say which start failed. Best effort: never raises."""
    try:
        from ..facts import oci
        from ..facts.container import LABEL_ANNOTATIONS

        state = oci.read_state(stdin_fd)
        record["container_id"] = state.get("id") if isinstance(state.get("id"), str) else None
        record["bundle"] = state["bundle"]
        ann = state.get("annotations") if isinstance(state.get("annotations"), dict) else {}
        for field, keys in LABEL_ANNOTATIONS.items():
            value = next((ann[k] for k in keys if isinstance(ann.get(k), str) and ann[k]), None)
            if value is not None:
                record[field] = value
    except Exception:  # noqa: BLE001 - the failure is already recorded; this only adds names
        pass


def _config_for_log(argv: list, env):
    """For a usage error: the configuration named on the command line (for its log_file; one that does
    not load: the registration's log file), or None."""
    path = None
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif a.startswith("--config="):
            path = a[len("--config="):]
    try:
        from ..core import config as _config

        return _config.load_for_start(path, environ=env, fixed=_registration)[0]
    except Exception:
        return None


def _hook(opts: dict, config, state_dir: str, stdin_fd: int, record: dict) -> None:
    from ..facts import oci
    from ..policy.assess import assess
    from ..facts.container import Request

    state = oci.read_state(stdin_fd)
    record["container_id"] = state.get("id") if isinstance(state.get("id"), str) else None
    bundle = state["bundle"]
    spec = oci.load_spec(bundle, members=oci.HOOK_MEMBERS)
    # Kept alive to the end of the process, which exits without freeing it
    # (cli.entry): freeing a 1 MB spec's objects costs ~1.8 ms.
    _KEEP[:] = [spec]  # one slot: in-process callers (tests) do not accumulate
    rootfs = oci.rootfs_path(bundle, spec)
    record["rootfs"] = rootfs
    try:
        request = Request.from_spec(spec, config.annotations, state.get("annotations"))
    except ValueError as e:  # a member parsed only now (oci.load_spec)
        from ..core.errors import StateError

        raise StateError(f"{bundle}/config.json: not JSON: {e}") from None
    dry = config.dry_run or opts["dry_run"] or request.dry_run
    record["dry_run"] = dry

    from ..facts.rootfs import Root

    try:
        root = Root(rootfs)
    except OSError as e:
        from ..core.errors import StateError

        raise StateError(f"cannot open rootfs {rootfs}: {e.strerror}") from None
    # One reading of the image's ld.so.conf for this start: the assessment's, reused by the
    # drop-in's write under the lock (compat_hook.facts.loader.ld_so_conf).
    root.ld_so_conf_memo = {}
    with root:
        a = assess(config, request, root, state_dir=state_dir, actors=("hook",), stage=opts["stage"])
        record.update(a.log_fields())
        if a.decision.enable and a.existing_dropin is not None and a.hook == [("ldconfig", None)]:
            record["dropin"] = "unchanged"
        record["planned"] = [act for act, _ in a.hook]
        if dry:
            record["actions"] = ([f"dry-run: would bind-mount {a.hook_mount[0]} at {a.hook_mount[1]}"]
                                 if a.hook_mount else [])
            record["actions"] += [f"dry-run: would bind-mount {x['source']} over {x['target']}"
                                  for x in a.host_over + a.compat_over if x["by"] == "hook"]
            record["actions"] += [f"dry-run: would mask {d}" for d in a.hook_masks]
            record["actions"] += [f"dry-run: would {act}" + (f" {arg}" if arg else "") for act, arg in a.hook]
            return
        done: list = []
        record["actions"] = done
        if a.hook_mount is not None:
            from ..effects.mounts import bind_readonly

            done += bind_readonly(root, *a.hook_mount)
        # the host's libcuda in place of each compat file (effect host; one in a dir masked below: inside the
        # mask), or the chosen compat libcuda in place of each libcuda LD_LIBRARY_PATH reaches before it
        # (effect compat: policy/shadow)
        over = [x for x in a.host_over + a.compat_over if x["by"] == "hook"]
        if any(not x.get("mask") for x in over):
            from ..effects.mounts import bind_file_over

            for x in over:
                if not x.get("mask"):
                    done += bind_file_over(root, x["source"], x["target"], x.get("in_rootfs", False))
        if a.hook_masks:
            from ..effects.mounts import mask_dir

            for d in a.hook_masks:
                keep = [(x["target"].rsplit("/", 1)[1], x["source"], x.get("in_rootfs", False))
                        for x in over if x.get("mask") == d]
                done += mask_dir(root, d, keep)
        if a.hook:
            from ..effects import ldcache

            if (a.ldconf is not None and a.ldconf.incomplete in ("ld_so_conf_bounded", "ld_so_conf_deadline")
                    and any(act == "ldconfig" for act, _ in a.hook)):
                # a hostile include tree (20,000 entries kept ldconfig busy past the runtime's hook timeout)
                raise ldcache.LdConfUnfinished(f"{a.ldconf.why_incomplete()}: ldconfig would read the same tree, "
                                               "so it is not run", a.ldconf.incomplete)
            try:
                if ldcache.read_only(root):
                    # crun makes the root read-only before createContainer (runc only after it): the
                    # cache is rebuilt beside it and mounted over it, where a mount lands in the container
                    from ..effects.mounts import in_container_mount_ns

                    if not in_container_mount_ns(opts["stage"]):
                        raise ldcache.ReadOnlyRoot(f"the root {rootfs} is read-only here and a mount made "
                                                   "at this stage would not reach the container")
                    actions, did = ldcache.apply_mounted(root, a.hook_target, a.hook_purpose, config,
                                                         a.hook_refresh)
                    note = None
                else:
                    # At createContainer we are in the container's mount namespace already, and the
                    # state's pid may name another process (a pod sharing its pid namespace).
                    ns_pid = None if opts["stage"] in ("createContainer", "startContainer") else \
                        ldcache.namespace_pid(state)
                    actions, did, note = ldcache.apply_locked(root, a.hook_target, a.hook_purpose, config,
                                                              state_dir, ns_pid, a.hook_refresh)
            except ldcache.ReadOnlyRoot:
                if not done:  # nothing of ours changed the container: what maps is the image's own
                    _instead(record, config, request, root, state_dir, opts["stage"])
                raise
            except Exception as e:
                done += getattr(e, "done", [])
                raise
            done += did
            record["planned"] = [act for act, _ in actions]
            if note:
                record["lock"] = note


def _instead(record: dict, config, request, root, state_dir: str, stage) -> None:
    """Where the decision cannot take effect: ``maps_instead``, the libcuda the loader model says the
    container maps without compat-hook (``explain``'s "alone"). Only on this failure's path."""
    try:
        from ..effects.ldcache import LD_SO_CACHE

        if not root.exists(LD_SO_CACHE):
            # No cache: ld.so searches LD_LIBRARY_PATH, then its default dirs (the multiarch ones first)
            arch = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(__import__("posix").uname()[4])
            dirs = [d for d in (request.env.get("LD_LIBRARY_PATH") or "").split(":") if d.startswith("/")]
            dirs += [f"/lib/{arch}", f"/usr/lib/{arch}"] if arch else []
            dirs += ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]
            for d in dirs:
                if root.exists(f"{d}/libcuda.so.1"):  # named as the loader names it: its dir resolved
                    record["maps_instead"] = f"{root.realpath(d)}/libcuda.so.1"
                    return
            return
        from ..policy.assess import assess

        alone = assess(config, request, root, state_dir=state_dir, actors=("hook",), stage=stage,
                       toolkit=True).toolkit["alone"]
        if alone.get("maps"):
            record["maps_instead"] = alone["maps"]
    except Exception:  # noqa: BLE001 - the failure is what the line reports; this only adds to it
        pass


_KEEP: list = []


def main(argv: list | None = None) -> int:
    status, _ = run(sys.argv[1:] if argv is None else argv)
    return status


def entry(argv: list) -> None:
    """Run the hook on ``argv`` (what follows ``hook``) and end the process with its exit status.

    The log line is already written (``os.write``) and nothing else is
    pending, so interpreter finalization is skipped: ~3 ms of every container
    start (hyperfine: ``-I -S -c 'sys.exit(0)'`` 14.2 ms, ``os._exit(0)`` 11.3 ms).
    """
    status = main(argv)
    import posix  # os._exit, without importing os (compat_hook.core.fastos)

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        posix._exit(status)
