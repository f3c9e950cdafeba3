"""``compat-hook-runtime``: the runc-compatible runtime wrapper.

containerd's ``BinaryName`` (or Docker's ``runtimes.<name>.path``) points at
the rendered shell wrapper (``compat_hook/data/compat-hook-runtime.sh``),
which execs the real runtime for every verb but ``create``/``run`` without
starting Python, and hands those two to :func:`main` here. Installed as the
console script ``compat-hook-runtime``, :func:`main` also handles every verb
itself (non-editing verbs are passed through with ``os.execv`` after the same
quick ``runtime:`` read).

On ``create``/``run`` it edits ``<bundle>/config.json`` (atomically; see
:mod:`compat_hook.effects.specedit`), then execs the real runtime with the very same
arguments:

What it changes is planned by :func:`compat_hook.policy.assess.assess` (the same
code ``explain`` runs); this module only writes it:

* **ldconfig mode** (the default) and **both**: compat-hook's createContainer
  hook is added to the spec (``wrapper_add_hook``, on by default) when the ld
  cache must change: it writes the drop-in once the runtime has mounted the
  host driver's libraries;
* **env mode** (``mode: env`` or ``both``): when the decision enables the
  image's compat driver, its container dir goes first on ``LD_LIBRARY_PATH``;
* in every mode, when compat is wrong for this host and container (the
  decision's effect is ``host``), compat dirs the image put on
  ``LD_LIBRARY_PATH`` are removed: a stale compat path on a newer host is
  CUDA error 803. Opted-out and non-GPU containers, hosts whose driver is
  unknown and images without compat libs are left alone;
* **host store**: an image without compat libs that needs a newer CUDA than
  the host driver provides gets a read-only bind mount of a fitting store
  package at ``store_target`` plus ``LD_LIBRARY_PATH`` (any mode);
* ``wrapper_drop_oom_score_adj``: ``process.oomScoreAdj`` is dropped.

Failures fail open (one log line, the real runtime runs with the spec
unchanged) unless ``on_error: fail`` (then exit 1 and one line on stderr).
A configuration file that does not load is no such failure: the built-in
defaults decide and are applied, with the runtime the ``runtime:`` line
reader was sure of (``"config": "defaults"`` and ``config_error`` in the log
line), unless the registration is fail-closed (``--fail-closed``), which
stops the create (:func:`compat_hook.core.config.load_for_start`).
One JSON log line (``event: "runtime"``) per create/run.
"""

from __future__ import annotations

import os
import sys
import time

from ..core.realruntime import RuntimeNotFound, read_runtime_line, resolve_runtime

__all__ = ["main", "entry", "find_verb", "find_bundle", "container_id", "EDIT_VERBS"]

EDIT_VERBS = ("create", "run")
#: Set for the real runtime; seeing it on entry means the chain loops back.
ACTIVE_ENV = "COMPAT_HOOK_RUNTIME_ACTIVE"
CONFIG_FLAG = "--compat-hook-config"
#: The runtime the shell wrapper read, for the boot code when compat_hook cannot be imported.
FALLBACK_ENV = "COMPAT_HOOK_RUNTIME_FALLBACK"

# Global options (runc, crun, nvidia-container-runtime) that take a value.
_GLOBAL_VALUE_FLAGS = frozenset(
    f"{d}{n}" for d in ("-", "--")
    for n in ("root", "log", "log-format", "log-level", "criu", "rootless", "cgroup-manager"))
# Options of create/run that take a value (all others are booleans).
_VERB_VALUE_FLAGS = frozenset(
    f"{d}{n}" for d in ("-", "--")
    for n in ("bundle", "b", "console-socket", "pid-file", "preserve-fds"))


def find_verb(argv: list) -> tuple:
    """``(index, verb)`` of the first non-option argument (``(None, None)``: none)."""
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in _GLOBAL_VALUE_FLAGS:
            skip = True
        elif a.startswith("-"):
            continue
        else:
            return i, a
    return None, None


def _verb_args(argv: list, verb_index: int):
    """``(options, positionals)`` after the verb, Go-flag style (options stop at the first positional)."""
    opts, rest = [], []
    it = iter(range(verb_index + 1, len(argv)))
    for i in it:
        a = argv[i]
        if a == "--":
            rest.extend(argv[i + 1:])
            break
        if not a.startswith("-") or a == "-":
            rest.extend(argv[i:])
            break
        name, eq, val = a.partition("=")
        if not eq and name in _VERB_VALUE_FLAGS:
            val = argv[i + 1] if i + 1 < len(argv) else None
            next(it, None)
        opts.append((name.lstrip("-"), val if (eq or name in _VERB_VALUE_FLAGS) else None))
    return opts, rest


def find_bundle(argv: list, verb_index: int, cwd: str | None = None) -> str:
    """The absolute bundle dir of a create/run (``--bundle``/``-b``, default the cwd)."""
    bundle = None
    for name, val in _verb_args(argv, verb_index)[0]:
        if name in ("bundle", "b") and val is not None:
            bundle = val
    base = cwd if cwd is not None else os.getcwd()
    if not bundle:
        return base
    return os.path.normpath(os.path.join(base, bundle))


def container_id(argv: list, verb_index: int):
    rest = _verb_args(argv, verb_index)[1]
    return rest[0] if rest else None


# -- main ----------------------------------------------------------------------

def _quick_runtime(path: str) -> tuple:
    """:func:`read_runtime_line` on the file at ``path`` (missing: the default, sure)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return "runc", True
    except OSError:
        return "runc", False
    return read_runtime_line(raw.decode("utf-8", "surrogateescape"))


def _exec(real: str, argv: list) -> int:
    os.environ[ACTIVE_ENV] = "1"
    try:
        os.execv(real, [real] + argv)
    except OSError as e:
        sys.stderr.write(f"compat-hook-runtime: cannot run {real}: {e.strerror}\n")
        return 127
    return 127  # pragma: no cover


def main(argv: list | None = None) -> int:
    t0 = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.pop(FALLBACK_ENV, None)
    cfg_path = None
    if len(argv) >= 2 and argv[0] == CONFIG_FLAG:
        cfg_path, argv = argv[1], argv[2:]
    from ..core import config as _config

    path, _explicit = _config.config_path(cfg_path)
    if os.environ.get(ACTIVE_ENV):
        sys.stderr.write("compat-hook-runtime: the real runtime leads back to compat-hook-runtime (a loop)\n")
        return 1
    idx, verb = find_verb(argv)
    editing = verb in EDIT_VERBS
    quick, sure = _quick_runtime(path)
    config = cfg_error = None
    if editing or not sure:
        state_dir = os.environ.get("COMPAT_HOOK_STATE_DIR") or _config.DEFAULT_STATE_DIR

        def fixed() -> dict:
            # What the registration fixed by itself: --fail-closed and the log file (its boot
            # code), and the runtime the line reader (the shell wrapper's) was sure of.
            from ..core.registration import fixed as registration

            return dict(registration(), **({"runtime": quick} if sure else {}))

        config, cfg_error = _config.load_for_start(cfg_path, state_dir=state_dir, fixed=fixed)
    name = config.runtime if config is not None else quick
    try:
        real = resolve_runtime(name)
    except RuntimeNotFound as e:
        sys.stderr.write(f"compat-hook-runtime: {e}\n")
        return 127
    try:
        if os.path.samefile(real, sys.argv[0]) if os.path.isabs(sys.argv[0] or "") else False:
            sys.stderr.write(f"compat-hook-runtime: runtime {name!r} is this wrapper itself (a loop)\n")
            return 1
    except OSError:
        pass
    if editing:
        status = _create(argv, idx, verb, config, cfg_error, path, real, t0)
        if status is not None:
            return status
    elif cfg_error is not None:
        from ..core.errors import describe

        sys.stderr.write(f"compat-hook-runtime: {describe(cfg_error)[1]} (running {real})\n")
    return _exec(real, argv)


def entry() -> None:
    """``python3 -I -S -c '...; from compat_hook.runtime import entry; entry()' ARGS``."""
    sys.exit(main())


def _create(argv, idx, verb, config, cfg_error, cfg_path, real, t0):
    """Edit the spec; returns an exit status to stop with, or ``None`` to exec."""
    record = {"event": "runtime", "verb": verb, "container_id": container_id(argv, idx),
              "runtime": real}
    status = None
    try:
        record["bundle"] = find_bundle(argv, idx)
        if cfg_error is not None:
            if config.on_error == "fail":
                raise cfg_error  # the registration is fail-closed: nothing runs without its configuration
            from ..core.errors import describe

            msg = describe(cfg_error)[1]
            record.update(config="defaults", config_error=msg)
            sys.stderr.write(f"compat-hook-runtime: invalid configuration ({msg}): "
                             "the built-in defaults decided\n")
        _edit(config, record)
    except Exception as e:  # fail open: never a traceback, never a broken start
        from ..core.errors import describe
        from ..core.logjson import fail_open

        if fail_open(record, config, *describe(e), prog="compat-hook-runtime",
                     stopped="container not created", goes_on="spec unchanged, the runtime runs"):
            status = 1
    from ..core.logjson import finish

    finish(record, config, t0)
    return status


def _edit(config, record: dict) -> None:
    from ..facts import oci
    from ..effects import specedit
    from ..policy.assess import assess
    from ..facts.container import Request

    bundle = record["bundle"]
    spec = oci.load_spec(bundle)
    rootfs = oci.rootfs_path(bundle, spec)
    request = Request.from_spec(spec, config.annotations)
    dry = config.dry_run or request.dry_run
    record["dry_run"] = dry
    state_dir = os.environ.get("COMPAT_HOOK_STATE_DIR") or None
    if state_dir is None:
        from ..core.config import DEFAULT_STATE_DIR

        state_dir = DEFAULT_STATE_DIR
    from ..facts.rootfs import Root

    try:
        root = Root(rootfs)
    except OSError as e:
        from ..core.errors import StateError

        raise StateError(f"cannot open rootfs {rootfs}: {e.strerror}") from None

    def entry():
        from ..core.registration import hook_entry

        return hook_entry(stage="createContainer", config=config.source,
                          state_dir=os.environ.get("COMPAT_HOOK_STATE_DIR") or None,
                          fail_closed=config.on_error == "fail", log_file=config.log_file)

    with root:
        a = assess(config, request, root, spec=spec, state_dir=state_dir, actors=("wrapper",),
                   hook_entry=entry)
    record.update(a.log_fields())
    record["source"] = a.decision.source
    record["mode"] = config.mode
    if dry:
        record["actions"] = [f"dry-run: would {x}" for x in a.spec_edits]
        return
    if a.spec_edits:
        specedit.write_spec(bundle, a.new_spec)
        record["actions"] = list(a.spec_edits)
    else:
        record["actions"] = []
