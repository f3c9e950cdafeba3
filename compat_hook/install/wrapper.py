"""The runtime wrapper: the one renderer, and which file each engine registration names.

The wrapper is ``compat_hook/data/compat-hook-runtime.sh`` with absolute
paths filled in (:func:`render_wrapper`): a runc-compatible runtime for
containerd's ``BinaryName``, Docker's ``runtimes.<name>.path`` and CRI-O's
``runtime_path``. Every verb but ``create``/``run`` execs the real runtime
from shell builtins (~1 ms); those two start Python through
:func:`compat_hook.core.registration.boot_code` (``target="runtime"``).

**One wrapper per node.** ``install containerd|docker|crio`` name the same
file, rendered the same way, so installing for several engines never
rewrites it back and forth:

1. ``--wrapper-path PATH`` when given;
2. else the Debian package's ``/usr/libexec/compat-hook/compat-hook-runtime``
   when the package is installed (dpkg lists the file); it is dpkg's: never
   written or removed here, and a registration that needs another rendering
   (``--hook-config``, ``--state-dir``, ``on_error: fail``) is refused with a
   pointer to ``--wrapper-path``;
3. else ``/usr/local/libexec/compat-hook/compat-hook-runtime``.

``uninstall`` removes the wrapper (with the backups earlier installs left of
it and its ``compat-hook`` directory when that is left empty) unless another
engine's registration still names it, or a container created through it
still exists: a container's runtime is fixed when it is created, and the
engine runs the same binary to kill and delete it (containerd's shim reads
``BinaryName`` from the task's ``options.json``; Docker runs a container's
``--runtime`` by name). Then the wrapper is replaced by a *pass-through*
(:func:`render_pass_through`: ``exec <the real runtime> "$@"``, no Python,
nothing of compat-hook) that stays until :func:`users` finds no such
container; a later ``uninstall`` (of any engine naming that path) or
``install`` replaces or removes it.

**One installation per wrapper.** The rendered wrapper names the
installation it runs (``# compat-hook-installation: <python> <dir>``). An
``install`` from another installation takes it over with a message saying
so; an ``uninstall`` from another installation leaves it alone.

The pip console script ``compat-hook-runtime`` (``compat_hook.commands.runtime:main``)
does the same job in Python, starting an interpreter on every runtime verb
(+15-20 ms each): it is for trying the wrapper by hand, never what ``install``
registers.
"""

from __future__ import annotations

import os

__all__ = ["render_wrapper", "DEFAULT_WRAPPER_PATH", "PACKAGED_WRAPPER_PATH", "WRAPPER_MARK", "is_wrapper",
           "wrapper_path", "wrapper_for", "wrapper_change", "wrapper_removal", "fail_closed", "PASSTHROUGH_MARK",
           "is_pass_through", "render_pass_through", "installation_of", "this_installation", "users",
           "pass_through_cleanup", "package_pass_through", "PACKAGE_STASH", "waiting_for"]

#: Where ``install`` writes the wrapper when neither --wrapper-path nor the Debian package say otherwise.
DEFAULT_WRAPPER_PATH = "/usr/local/libexec/compat-hook/compat-hook-runtime"
#: The Debian package's copy (packaging/debian/build-deb.py renders it for /usr/bin/python3).
PACKAGED_WRAPPER_PATH = "/usr/libexec/compat-hook/compat-hook-runtime"
PACKAGED_PYTHON = "/usr/bin/python3"
PACKAGED_PATHS = ("/usr/lib/python3/dist-packages",)
WRAPPER_MARK = "#!/bin/sh\n# compat-hook-runtime:"
#: What uninstall leaves at the wrapper's path while containers created through it exist.
PASSTHROUGH_MARK = "#!/bin/sh\n# compat-hook-runtime pass-through:"
INSTALLATION_TAG = "# compat-hook-installation: "
PACKAGED_LOG = "/var/log/compat-hook.log"
_FROM_CONFIG = object()


def render_wrapper(config_path: str | None = None, *, python: str | None = None,
                   paths: list | None = None, state_dir: str | None = None, fail_closed: bool = False,
                   log_file=_FROM_CONFIG) -> str:
    """The shell wrapper's text with absolute paths filled in.

    ``config_path``: the config it reads when ``COMPAT_HOOK_CONFIG`` is unset
    (default ``/etc/compat-hook/config.yaml``); ``python``: the interpreter
    (default: the real one running this); ``paths``: its ``sys.path`` head
    (default: where compat_hook, PyYAML and pyelftools live); ``state_dir``:
    the cache dir the Python part uses unless ``COMPAT_HOOK_STATE_DIR`` is set
    (default /var/lib/compat-hook); ``fail_closed``: ``on_error: fail`` at
    registration (a create whose compat-hook cannot start fails instead of
    running the real runtime without it); ``log_file``: where a create that
    runs without compat-hook is logged (default: the ``log_file`` of
    ``config_path``, read now).

    >>> text = render_wrapper("/etc/x.yaml", python="/usr/bin/python3", paths=["/p"], log_file="/l")
    >>> text.startswith(WRAPPER_MARK) and "ch_config=/etc/x.yaml" in text and "ch_fail=''" in text
    True
    >>> installation_of(text), "ch_log=/l" in text
    ('/usr/bin/python3 /p', True)
    """
    import shlex

    from ..core.config import DEFAULT_PATH
    from ..core.registration import boot_code, interpreter, python_paths, registered_log_file

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "data", "compat-hook-runtime.sh"), encoding="utf-8") as f:
        text = f.read()
    python = python or interpreter()
    paths = paths if paths is not None else python_paths()
    if log_file is _FROM_CONFIG:
        log_file = registered_log_file(config_path)
    values = {"@PYTHON@": python,
              "@BOOT@": boot_code(paths, target="runtime", log_file=log_file),
              "@CONFIG@": os.path.abspath(config_path) if config_path else DEFAULT_PATH,
              "@STATE@": os.path.abspath(state_dir) if state_dir else "",
              "@FAIL@": "1" if fail_closed else "",
              "@LOG@": log_file or ""}
    for k, v in values.items():
        text = text.replace(f"={k}\n", f"={shlex.quote(v)}\n", 1)
    return text.replace(INSTALLATION_TAG + "@INSTALLATION@", INSTALLATION_TAG + this_installation(python, paths), 1)


def this_installation(python: str | None = None, paths: list | None = None) -> str:
    """``"<interpreter> <dir holding compat_hook>"``: the installation a wrapper runs.

    >>> this_installation("/usr/bin/python3", ["/usr/lib/python3/dist-packages", "/x"])
    '/usr/bin/python3 /usr/lib/python3/dist-packages'
    """
    from ..core.registration import interpreter, python_paths

    paths = paths if paths is not None else python_paths()
    return f"{python or interpreter()} {paths[0] if paths else '?'}"


def installation_of(text: str | None) -> str | None:
    """The installation a rendered wrapper names (``None``: none named, e.g. an older rendering)."""
    for line in (text or "").splitlines()[:40]:
        if line.startswith(INSTALLATION_TAG):
            return line[len(INSTALLATION_TAG):].strip()
    return None


def is_pass_through(text: str | None) -> bool:
    return bool(text) and text.startswith(PASSTHROUGH_MARK)


def render_pass_through(runtime: str, engine: str, daemons=()) -> str:
    """The pass-through uninstall leaves at the wrapper's path: the real runtime, nothing else.

    ``daemons``: the engine processes (:class:`~compat_hook.install.daemons.Daemon`)
    that still had the registration in memory at the uninstall, one record line
    each; the pass-through goes once they are gone (:func:`waiting_for`).

    >>> from compat_hook.install.daemons import Daemon
    >>> t = render_pass_through("/usr/sbin/runc", "containerd", [Daemon("containerd", 7, 99, "b")])
    >>> is_pass_through(t) and t.rstrip().endswith('exec /usr/sbin/runc "$@"'), waiting_for(t)
    (True, [Daemon(engine='containerd', pid=7, start=99, boot='b')])
    """
    import shlex

    from .daemons import RECORD_TAG

    records = "".join(f"{RECORD_TAG}{d.record()}\n" for d in daemons)
    return (f"{PASSTHROUGH_MARK} left by `compat-hook uninstall {engine}` because containers\n"
            "# created through compat-hook's runtime wrapper still exist, or the engine still runs with\n"
            "# compat-hook's runtime in memory (until it restarts, new pods of that runtime start here).\n"
            "# It runs the real runtime and nothing of compat-hook. Once both are over (the engine\n"
            f"# restarted), `compat-hook uninstall {engine}` (again) removes it; `compat-hook install` replaces it.\n"
            f"{records}exec {shlex.quote(runtime)} \"$@\"\n")


def waiting_for(text: str | None) -> list:
    """The engine processes a pass-through was left for (its record lines)."""
    from .daemons import RECORD_TAG, Daemon

    found = []
    for line in (text or "").splitlines()[:64]:
        if line.startswith(RECORD_TAG):
            d = Daemon.parse(line[len(RECORD_TAG):])
            if d is not None:
                found.append(d)
    return found


def is_wrapper(text: str | None) -> bool:
    """A rendered wrapper, or the pass-through an uninstall left in its place."""
    return bool(text) and (text.startswith(WRAPPER_MARK) or text.startswith(PASSTHROUGH_MARK))


def fail_closed(hook_config: str | None) -> bool:
    """``on_error: fail`` in the configuration a registration names (read now, at registration)."""
    from .checks import registered_config

    return registered_config(hook_config)[0].on_error == "fail"


def _hook_config(opts) -> str:
    from ..core.config import DEFAULT_PATH

    return os.path.abspath(opts.hook_config) if opts.hook_config else DEFAULT_PATH


def _packaged_wrapper() -> bool:
    from .common import packaged

    return os.path.isfile(PACKAGED_WRAPPER_PATH) and packaged(PACKAGED_WRAPPER_PATH)


def wrapper_path(opts) -> str:
    """The path :func:`wrapper_for` names, without rendering the wrapper (no read of the config)."""
    if opts.wrapper_path:
        return os.path.abspath(opts.wrapper_path)
    return PACKAGED_WRAPPER_PATH if _packaged_wrapper() else DEFAULT_WRAPPER_PATH


def wrapper_for(opts) -> tuple:
    """``(path, text or None)``: the wrapper a registration names and, unless it is the packaged one, its text."""
    from .common import InstallError

    cfg = _hook_config(opts)
    closed = fail_closed(opts.hook_config)
    state = os.path.abspath(opts.state_dir) if opts.state_dir else None
    if opts.wrapper_path:
        return os.path.abspath(opts.wrapper_path), render_wrapper(cfg, state_dir=state, fail_closed=closed)
    if _packaged_wrapper():
        want = render_wrapper(cfg, python=PACKAGED_PYTHON, paths=list(PACKAGED_PATHS), state_dir=state,
                              fail_closed=closed, log_file=PACKAGED_LOG)
        with open(PACKAGED_WRAPPER_PATH, encoding="utf-8", errors="replace") as f:
            have = f.read()
        if have != want:
            raise InstallError(
                f"the compat-hook package's wrapper {PACKAGED_WRAPPER_PATH} reads /etc/compat-hook/config.yaml "
                f"with the default state dir and fails open; this registration needs another one "
                f"(--hook-config, --state-dir or on_error: fail): add --wrapper-path PATH to write it there")
        mine = this_installation()
        if mine != this_installation(PACKAGED_PYTHON, list(PACKAGED_PATHS)):
            from .common import say

            say(f"note: registering the compat-hook package's wrapper {PACKAGED_WRAPPER_PATH}: containers run "
                f"the package's compat-hook ({this_installation(PACKAGED_PYTHON, list(PACKAGED_PATHS))}), not "
                f"this one ({mine}); --wrapper-path PATH writes a wrapper for this one")
        return PACKAGED_WRAPPER_PATH, None
    return DEFAULT_WRAPPER_PATH, render_wrapper(cfg, state_dir=state, fail_closed=closed)


def wrapper_change(opts) -> list:
    """The :class:`~compat_hook.install.files.Change` writing the wrapper (mode 0755); ``[]``: the packaged one."""
    from .files import Change
    from .common import InstallError

    path, text = wrapper_for(opts)
    if text is None:
        return []
    change = Change(path, text, mode=0o755, backup=False, ours=True, prune=True)
    if os.path.lexists(path) and not os.path.isfile(path):
        raise InstallError(f"{path} exists and is not a regular file")
    if change.old is not None and change.changed and not is_wrapper(change.old):
        raise InstallError(f"{path} exists and is not compat-hook's runtime wrapper; "
                           f"move it away or use --wrapper-path")
    if change.old is not None and change.changed:
        from .common import say

        theirs, mine = installation_of(change.old), installation_of(text)
        if is_pass_through(change.old):
            say(f"note: {path} was the pass-through an uninstall left; the wrapper replaces it")
        elif theirs != mine:
            say(f"note: {path} runs another compat-hook installation ({theirs or 'unnamed: an older one'}); "
                f"taking it over: every registration naming it now runs this one ({mine}). "
                f"--wrapper-path PATH keeps them apart")
    return [change]


def wrapper_removal(path, own_config: str, *, keep: str | None = None, users_of=None,
                    engine: str = "ENGINE", daemons=()) -> list:
    """Remove the wrapper at ``path`` unless another engine's registration still names it.

    ``keep``: the wrapper the registration now names (a re-install moving from
    one wrapper to another removes the old one only). The packaged wrapper is
    dpkg's and never removed here; a wrapper of another installation
    (:func:`installation_of`) is that one's. ``users_of``: ``f(path) -> list``
    of the containers still created through it (:func:`users`); ``daemons``:
    the engine processes running now with the registration in memory
    (:func:`compat_hook.install.daemons.running`). When either is left, the
    wrapper is replaced by :func:`render_pass_through` instead.
    """
    from . import common
    from .files import Change

    if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isfile(path) or path == keep:
        return []
    if common.packaged(path):
        return []
    change = Change(path, None, ours=True, prune=True)
    if not is_wrapper(change.old):
        common.say(f"note: left {path} alone: it is not compat-hook's runtime wrapper")
        return []
    theirs = installation_of(change.old)
    if theirs is not None and theirs != this_installation() and not is_pass_through(change.old):
        common.say(f"note: left {path} alone: it runs another compat-hook installation ({theirs}); "
                   f"uninstall with that one, or delete the file")
        return []
    for other in common.ENGINE_FILES:
        if os.path.abspath(other) == os.path.abspath(own_config):
            continue
        text = None
        try:
            with open(other, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            pass
        if text and path in text:
            common.say(f"note: kept {path}: {other} still uses it")
            return []
    return _pass_through_or_removal(path, change, users_of(path) if users_of is not None else [], list(daemons),
                                    engine)


def _pass_through_or_removal(path: str, change, left: list, daemons: list, engine: str) -> list:
    """The removal ``change`` when nothing needs ``path`` any more, else the pass-through (records merged)."""
    from . import common
    from .daemons import alive
    from .files import Change

    waiting = list(dict.fromkeys(alive(waiting_for(change.old)) + daemons))
    if not left and not waiting:
        return [change]
    runtime = _real_runtime(change.old)
    if left:
        shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
        common.say(f"note: {len(left)} container(s) created through {path} still exist ({shown}): it stays as a "
                   f"pass-through to {runtime} (no compat-hook) so they can be stopped and removed")
    if waiting:
        names = ", ".join(str(d) for d in waiting)
        common.say(f"note: {names} still runs with compat-hook's runtime in memory and starts new containers of it "
                   f"through {path} until it restarts: it stays as a pass-through to {runtime} (no compat-hook) "
                   f"so they start")
    flag = "" if path == DEFAULT_WRAPPER_PATH else f" --wrapper-path {path}"
    common.say(f"note: once {'they are gone and ' if left else ''}the engine has restarted, run "
               f"`compat-hook uninstall {engine}{flag}` again to remove {path}")
    text = render_pass_through(runtime, engine, waiting)
    if text == change.old:
        return []
    return [Change(path, text, mode=0o755, backup=False, ours=True)]


def pass_through_cleanup(path: str, users_of, engine: str) -> list:
    """A pass-through left at ``path`` by an earlier uninstall: removed once nobody needs it.

    Nobody: no container created through it (``users_of``, :func:`users`) and
    none of the engine processes it was left for still running (the engine
    restarted since).
    """
    from . import common
    from .daemons import alive
    from .files import Change

    if not (os.path.isabs(path) and os.path.isfile(path)) or common.packaged(path):
        return []
    change = Change(path, None, ours=True, prune=True)
    if not is_pass_through(change.old):
        return []
    left = users_of(path)
    waiting = alive(waiting_for(change.old))
    if left:
        common.say(f"note: kept the pass-through {path}: {len(left)} container(s) created through it still exist "
                   f"({', '.join(left[:10])})")
    if waiting:
        common.say(f"note: kept the pass-through {path}: {', '.join(str(d) for d in waiting)} has not restarted since "
                   f"the uninstall and may still start containers through it; restart it, then run "
                   f"`compat-hook uninstall {engine}` again")
    if left or waiting:
        return []
    return [change]


def _real_runtime(wrapper_text: str) -> str:
    """The runtime a wrapper (or pass-through) execs, as an absolute path (``runc`` resolved when unsure)."""
    import shlex

    from ..core.realruntime import RuntimeNotFound, read_runtime_line, resolve_runtime

    if is_pass_through(wrapper_text):
        last = [ln for ln in wrapper_text.splitlines() if ln.startswith("exec ")]
        if last:
            return shlex.split(last[-1])[1]
    cfg = None
    for line in wrapper_text.splitlines():
        if line.startswith("ch_config="):
            cfg = shlex.split(line[len("ch_config="):])[0]
            break
    name = "runc"
    try:
        with open(cfg or "/etc/compat-hook/config.yaml", encoding="utf-8") as f:
            rt, sure = read_runtime_line(f.read())
        if sure:
            name = rt
    except (OSError, ValueError):
        pass
    for cand in (name, "runc"):
        try:
            found = resolve_runtime(cand)
        except RuntimeNotFound:
            continue
        if os.path.isfile(found) and not is_wrapper(_head(found)):
            return found
    return "/usr/sbin/runc"


def _head(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(len(PASSTHROUGH_MARK)).decode("utf-8", "replace")
    except OSError:
        return ""


#: The shim v2 task dirs: ``<root>/<namespace>/<id>/options.json`` names the runtime binary.
TASK_DIR = "io.containerd.runtime.v2.task"


def users(path: str, *, containerd_states=(), docker_roots=(), docker_runtime: str | None = None) -> list:
    """The containers that still need the runtime binary ``path``: ``["<where>/<id>", ...]``.

    * containerd (CRI pods, ``ctr``; Docker's own containerd too): a task whose
      shim options (``<state>/io.containerd.runtime.v2.task/<ns>/<id>/options.json``)
      name ``path`` as ``BinaryName``. ``containerd_states``: containerd's
      ``state`` dirs (``/run/containerd``; Docker's ``<exec-root>/containerd/daemon``);
      a state dir that does not exist holds no task (it is a tmpfs dir made at start);
    * Docker: every container, running or not, created with ``--runtime
      docker_runtime`` (``<data-root>/containers/<id>/hostconfig.json``): Docker
      refuses to start one whose runtime it no longer knows;
    * conmon (CRI-O, Podman): a running ``conmon`` whose ``-r`` is ``path``.

    Where to look by hand: ``grep -l PATH /run/containerd/io.containerd.runtime.v2.task/*/*/options.json``.
    """
    import glob
    import json

    found = []
    for state in containerd_states:
        for opt in sorted(glob.glob(os.path.join(glob.escape(state), TASK_DIR, "*", "*", "options.json"))):
            try:
                with open(opt, encoding="utf-8", errors="replace") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and path in (data.get("binary_name"), data.get("BinaryName")):
                ns_dir, cid = os.path.split(os.path.dirname(opt))
                found.append(f"{os.path.basename(ns_dir)}/{cid}")
    if docker_runtime:
        for root in docker_roots:
            for hc in sorted(glob.glob(os.path.join(glob.escape(root), "containers", "*", "hostconfig.json"))):
                try:
                    with open(hc, encoding="utf-8", errors="replace") as f:
                        data = json.load(f)
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict) and data.get("Runtime") == docker_runtime:
                    full = os.path.basename(os.path.dirname(hc))
                    found = [u for u in found if u != f"moby/{full}"]  # its task, when running: one entry
                    found.append(f"docker/{full[:12]}")
    from .daemons import processes

    for pid, argv in processes():
        if os.path.basename(argv[0]) == b"conmon" and path.encode() in argv:
            cid = next((argv[i + 1].decode() for i, a in enumerate(argv[:-1]) if a in (b"-c", b"--cid")), str(pid))
            found.append(f"conmon/{cid[:12]}")
    return list(dict.fromkeys(found))


#: Where the package's prerm leaves the pass-through for its postrm (dpkg deletes the wrapper in between).
PACKAGE_STASH = "/var/lib/compat-hook/compat-hook-runtime.pass-through"


def package_pass_through(path: str = PACKAGED_WRAPPER_PATH, stash: str = PACKAGE_STASH, *,
                         containerd_config: str = "/etc/containerd/config.toml",
                         daemon_json: str = "/etc/docker/daemon.json", crio_dir: str = "/etc/crio/crio.conf.d") -> int:
    """The package's ``prerm remove``: when something still needs its wrapper, stash a pass-through.

    Something: containers created through it, or an engine daemon running with
    a registration of it in memory (:mod:`compat_hook.install.daemons`).

    dpkg deletes ``path`` with the package; ``postrm remove`` then puts the
    stashed pass-through there (plain shell: the package's Python is gone by
    then). Looks where a default node keeps them: containerd's ``state`` (from
    its config.toml, else ``/run/containerd``), Docker's exec-root and data-root
    (from daemon.json) for every runtime naming ``path``. Returns 0.
    """
    import json
    import sys

    from .files import read_text, remove, write_atomic

    try:
        import tomllib

        ctrd = tomllib.loads(read_text(containerd_config) or "")
    except Exception:  # no containerd, no tomllib, a broken file: the default state dir
        ctrd = {}
    state = ctrd.get("state") if isinstance(ctrd.get("state"), str) else "/run/containerd"
    try:
        docker = json.loads(read_text(daemon_json) or "{}")
    except ValueError:
        docker = {}
    docker = docker if isinstance(docker, dict) else {}
    # Where the package's registrations name the wrapper (what prerm's uninstall loop looks at too).
    containerd_files = (containerd_config, containerd_config + ".compat-hook-install",
                        os.path.join(os.path.dirname(containerd_config), "conf.d", "99-zz-compat-hook.toml"))
    crio_files = (os.path.join(crio_dir, "99-compat-hook.toml"),)
    exec_root = docker.get("exec-root") if isinstance(docker.get("exec-root"), str) else "/run/docker"
    data_root = docker.get("data-root") if isinstance(docker.get("data-root"), str) else "/var/lib/docker"
    runtimes = docker.get("runtimes") if isinstance(docker.get("runtimes"), dict) else {}
    names = [n for n, e in runtimes.items() if isinstance(e, dict) and e.get("path") == path]
    left = users(path, containerd_states=[state, os.path.join(exec_root, "containerd", "daemon")])
    for n in names:
        left += [u for u in users(path, docker_roots=[data_root], docker_runtime=n) if u.startswith("docker/")]
    left = list(dict.fromkeys(left))
    # The daemons running with a registration of ``path`` in memory: they start new containers through it
    # until they restart, though the registration is undone next (prerm's uninstall).
    daemons = []
    from .daemons import running

    for engine, config, named_in in (("containerd", containerd_config, containerd_files),
                                     ("docker", daemon_json, (daemon_json,)), ("crio", crio_dir, crio_files)):
        if any(path in (read_text(f) or "") for f in named_in):
            daemons += running(engine, config)
    if not left and not daemons:
        remove(stash, backup=False)
        return 0
    text = read_text(path) or ""
    engine = daemons[0].engine if daemons else "docker" if names else "containerd"
    write_atomic(stash, render_pass_through(_real_runtime(text), engine, daemons), mode=0o755, backup=False)
    why = [f"{len(left)} container(s) created through {path} still exist ({', '.join(left[:10])})"] if left else []
    why += [f"{d} runs with its registration in memory until it restarts" for d in daemons]
    sys.stdout.write(f"compat-hook: {'; '.join(why)}: a pass-through to the real runtime stays at {path} after the "
                     f"removal, so they can be stopped, removed and started; `apt purge compat-hook` removes it "
                     f"once no container task names it and the engine has restarted\n")
    return 0
