"""Hook entries for config.json, CDI specs and hooks.d files, and the one boot code.

The entry runs the interpreter by its absolute, resolved path (never a
pyenv-style shim: ~75-150 ms, and a PATH lookup the image could influence)
with ``-I -S``: isolated mode ignores every ``PYTHON*`` variable, the user
site and the cwd (which is the rootfs at runc's createContainer); ``-S``
skips ``site`` (~6 ms) and the code puts exactly the directories compat-hook
and its dependencies live in on ``sys.path``. The ``env`` is explicit, so
nothing of the runtime's or the image's environment reaches the hook
(CVE-2025-23266, "NVIDIAScape").

**Never break a container for want of compat-hook.** A registration outlives
the installation it was made from (a venv deleted, a package moved, an
interpreter removed), and a hook that cannot start stops *every* container
on the node, GPU or not. So:

* the boot code (:func:`boot_code`, the same for the hook entry and the
  runtime wrapper) catches any failure to import compat-hook and fails open:
  one line on stderr, then exit 0 (hook) or the real runtime (wrapper);
* an interpreter outside the OS's own ``/usr/bin`` / ``/bin`` (pyenv, conda,
  ``/opt/...``: the kind that disappears) is started through a ``/bin/sh -c``
  front that checks it still exists (+1 ms: hyperfine, 10.7 vs 11.7 ms for
  ``python3 -I -S -c pass``). The OS interpreter is run directly: removing it
  removes the Debian package with it (``Depends: python3``);
* ``on_error: fail``, read from the configuration **at registration**, turns
  both into a failure (exit 1) instead: ``--fail-closed`` in the entry's args,
  read by the boot code before it imports anything.

>>> e = hook_entry(stage="createContainer", config="/etc/compat-hook/config.yaml", python="/usr/bin/python3")
>>> e["args"][1:4]
['-I', '-S', '-c']
>>> e["env"][0]
'PATH=/usr/sbin:/usr/bin:/sbin:/bin'
>>> hook_entry(python="/opt/py/bin/python3")["args"][:2]
['/bin/sh', '-c']
"""

from __future__ import annotations

import os
import sys

__all__ = ["hook_entry", "hooksd_document", "boot_code", "registered_log_file", "python_paths", "interpreter",
           "stable_interpreter", "fixed",
           "HOOK_ENV", "FAIL_CLOSED", "SH"]

HOOK_ENV = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"]
#: The flag (first argument after the boot code) that makes a failed start fail the container.
FAIL_CLOSED = "--fail-closed"
SH = "/bin/sh"
#: Interpreters here belong to the OS and are run directly (see the module docstring).
_OS_BIN_DIRS = ("/usr/bin", "/bin")


def stable_interpreter(exe: str) -> str:
    """``/usr/bin/python3`` for ``/usr/bin/python3.11`` when the former links to the latter.

    A distro upgrade to the next minor version would otherwise leave every
    registered entry pointing at a removed binary.
    """
    d, name = os.path.split(exe)
    if name.startswith("python3.") and name[8:].isdigit():
        stable = os.path.join(d, "python3")
        try:
            if os.path.realpath(stable) == os.path.realpath(exe) and os.access(stable, os.X_OK):
                return stable
        except OSError:
            pass
    return exe


def interpreter() -> str:
    """The real interpreter binary running us (a venv's python resolves to its base)."""
    exe = os.path.realpath(sys.executable or "/usr/bin/python3")
    if not os.access(exe, os.X_OK):
        return sys.executable
    return stable_interpreter(exe)


def python_paths() -> list:
    """Directories holding compat_hook, yaml and elftools (deduplicated, in that order).

    Found by looking for the package's ``__init__.py`` on ``sys.path``, in
    order, as the import system would for a regular package, without
    running it (importing PyYAML costs ~30 ms) and without
    ``importlib.util`` (~4.4 ms of imports: ``-X importtime``, the wrapper's
    create path, which calls this when it adds the hook to a spec).
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # .../compat_hook (we are core/)
    dirs = [os.path.dirname(package)]
    for mod in ("yaml", "elftools"):
        for d in sys.path:
            d = os.path.abspath(d or ".")
            if os.path.isfile(os.path.join(d, mod, "__init__.py")):
                if d not in dirs:
                    dirs.append(d)
                break
    return dirs


def registered_log_file(config: str | None) -> str | None:
    """The ``log_file`` of the configuration a registration names, read now (``None``: no log, or unreadable).

    Baked into the boot code, so a fail-open is told where the decisions go even
    when compat-hook itself can no longer be imported to read the configuration.
    """
    try:
        from .config import registered

        return registered(config)[0].log_file
    except Exception:  # a bad configuration is refused elsewhere; no log line then
        return None


def _fail_open_logger(log_file: str | None, component: str) -> str:
    """Boot-code lines (one-space indent, inside ``except``) appending one JSON line to ``log_file``.

    The hook reads the container id from the state on stdin; the wrapper logs
    creates only (its last argument is the id), not the verbs that pass through.
    """
    if not log_file:
        return ""
    if component == "hook":
        who = "  i=json.loads(sys.stdin.read(1<<16) or '{}').get('id')\n"
    else:
        who = ("  a=sys.argv[1:]\n"
               "  if not ('create' in a or 'run' in a):raise SystemExit\n"
               "  i=a[-1]\n")
    return (
        " try:\n"
        "  import os,json,time\n"
        + who +
        "  d=json.dumps({'time':time.strftime('%Y-%m-%dT%H:%M:%S.000Z',time.gmtime()),"
        "'event':'fail_closed' if f else 'fail_open','decision':'error','reason':'installation_missing',"
        f"'component':{component!r},'container_id':i,'error':'%s: %s'%(type(e).__name__,e)}})+'\\n'\n"
        f"  o=os.open({log_file!r},os.O_WRONLY|os.O_APPEND|os.O_CREAT|os.O_CLOEXEC|os.O_NOFOLLOW,0o640)\n"
        "  os.write(o,d.encode());os.close(o)\n"
        " except BaseException:\n"
        "  pass\n")


def boot_code(paths: list, *, target: str = "hook", log_file: str | None = None) -> str:
    """The ``python3 -I -S -c`` code that starts compat-hook with exactly ``paths`` on sys.path.

    ``target``: ``"hook"`` (``compat_hook.cli.entry``; argv: ``[--fail-closed] hook ...``)
    or ``"runtime"`` (``compat_hook.runtime.entry``; argv: the runtime's, after an
    optional ``--fail-closed``). ``paths`` are appended, not prepended: stdlib
    imports then find their module on the first path entry (-I already keeps
    the cwd and user site out).

    When the import fails for any reason (the installation moved or half
    removed, a dependency built for another Python), the code prints one line
    and then fails open: the hook exits 0 (the container starts without
    compat-hook); the wrapper execs the real runtime the shell wrapper
    resolved (``COMPAT_HOOK_RUNTIME_FALLBACK``, else ``/usr/sbin/runc``)
    with the same arguments. With ``--fail-closed`` both exit 1 instead.
    ``log_file`` (the registration's, :func:`registered_log_file`): where that
    failure is also appended as one JSON line (``"event": "fail_open"`` or
    ``"fail_closed"``, ``"decision": "error"``, ``"reason":
    "installation_missing"``), since runc drops a successful hook's stderr;
    ``compat-hook report`` counts it as a failure.

    Its globals ``f`` (``--fail-closed`` was given; the flag is taken off argv
    before compat-hook is imported) and ``log_file`` are what compat-hook reads
    of its registration when the configuration does not load (:func:`fixed`).

    >>> code = boot_code(["/nonexistent"])
    >>> "from compat_hook.cli import entry" in code and "except BaseException" in code
    True
    """
    if target not in ("hook", "runtime"):
        raise ValueError(f"target must be 'hook' or 'runtime', not {target!r}")
    head = (f"import sys\nsys.path+={list(paths)!r}\n"
            f"f=sys.argv[1:2]==[{FAIL_CLOSED!r}]\n"
            "if f:del sys.argv[1]\n"
            f"log_file={log_file!r}\n")
    if target == "hook":
        return head + (
            "try:\n from compat_hook.cli import entry\n"
            "except BaseException as e:\n"
            " sys.stderr.write('compat-hook: cannot start (%s: %s): %s\\n'%(type(e).__name__,e,"
            "'the container is stopped (on_error: fail)' if f else 'the container starts without compat-hook'))\n"
            + _fail_open_logger(log_file, "hook") +
            " raise SystemExit(1 if f else 0)\n"
            "entry()")
    return head + (
        "try:\n from compat_hook.runtime import entry\n"
        "except BaseException as e:\n"
        " import os\n"
        " rt=os.environ.pop('COMPAT_HOOK_RUNTIME_FALLBACK','') or '/usr/sbin/runc'\n"
        + _fail_open_logger(log_file, "runtime") +
        " if f:\n"
        "  sys.stderr.write('compat-hook-runtime: %s: not running %s (on_error: fail)\\n'%(e,rt))\n"
        "  raise SystemExit(1)\n"
        " sys.stderr.write('compat-hook-runtime: %s: running %s without compat-hook\\n'%(e,rt))\n"
        " os.environ['COMPAT_HOOK_RUNTIME_ACTIVE']='1'\n"
        " os.execv(rt,[rt]+sys.argv[1:][2*(sys.argv[1:2]==['--compat-hook-config']):])\n"
        "entry()")


def fixed() -> dict:
    """What the registration that started this process fixed by itself, as configuration keys.

    ``on_error`` (``fail`` when its boot code was given ``--fail-closed``,
    else ``continue``) and ``log_file`` (the log file the registration named;
    left out for a boot code rendered before it carried one: the default log
    then), read from the boot code's globals in ``__main__`` (:func:`boot_code`).
    Used only when the configuration file does not load
    (:func:`compat_hook.core.config.load_for_start`): then the built-in
    defaults decide, with these over them. ``{}`` for a process no boot code
    started (``compat-hook hook`` by hand, tests in-process).

    >>> fixed()
    {}
    """
    main = sys.modules.get("__main__")
    g = getattr(main, "__dict__", None) or {}
    entry = g.get("entry")
    # `python3 -I -S -c CODE`: __main__ has no file, and the code imported compat-hook's entry.
    if ("__file__" in g or type(g.get("f")) is not bool
            or not getattr(entry, "__module__", "").startswith("compat_hook.")):
        return {}
    out = {"on_error": "fail" if g["f"] else "continue"}
    if "log_file" in g:
        out["log_file"] = g["log_file"]
    return out


def _front(exe: str, fail_closed: bool, log_file: str | None = None) -> str:
    """``sh -c`` text that execs ``$0`` (the interpreter) if it is still there.

    When it is not, one JSON line goes to ``log_file`` too (the container id read
    from the state on stdin with sed; a path or id JSON cannot hold as is is left out).
    """
    import shlex

    verdict = ("exit 1" if fail_closed else "exit 0")
    outcome = ("the container is stopped (on_error: fail)" if fail_closed
               else "the container starts without compat-hook")
    log = ""
    if log_file and not any(c in log_file for c in '"\\\n'):
        event = "fail_closed" if fail_closed else "fail_open"
        log = ("i=$(head -c 65536 | sed -n 's/.*\"id\" *: *\"\\([A-Za-z0-9_.:-]*\\)\".*/\\1/p' | head -n 1); "
               "case $0 in *[\\\\\\\"]*) ;; *) "
               f"printf '{{\"time\":\"%s\",\"event\":\"{event}\",\"decision\":\"error\","
               f"\"reason\":\"installation_missing\",\"component\":\"hook\",\"container_id\":\"%s\","
               f"\"error\":\"%s is missing\"}}\\n' \"$(date -u +%Y-%m-%dT%H:%M:%S.000Z)\" \"$i\" \"$0\" "
               f">> {shlex.quote(log_file)} 2>/dev/null ;; esac; ")
    return (f'[ -x "$0" ] && exec "$0" "$@"; '
            f'echo "compat-hook: cannot start ($0 is missing): {outcome}" >&2; {log}{verdict}')


def hook_entry(*, stage: str = "createContainer", config: str | None = None,
               state_dir: str | None = None, timeout: int = 30, fail_closed: bool = False,
               python: str | None = None, paths: list | None = None, log_file: str | None = None) -> dict:
    """The OCI hook entry for ``stage`` (``path``, ``args``, ``env``, ``timeout``).

    ``python``/``paths``: the interpreter and its ``sys.path`` additions
    (default: the running interpreter and where compat_hook, PyYAML and
    pyelftools are); ``fail_closed``: ``on_error: fail`` at registration;
    ``log_file``: where the boot code logs a failure to start (:func:`boot_code`).
    """
    exe = python or interpreter()
    argv = [exe, "-I", "-S", "-c", boot_code(python_paths() if paths is None else list(paths),
                                                     log_file=log_file)]
    if fail_closed:
        argv.append(FAIL_CLOSED)
    argv += ["hook", "--stage", stage]
    if config:
        argv += ["--config", os.path.abspath(config)]
    if state_dir:
        argv += ["--state-dir", os.path.abspath(state_dir)]
    if os.path.dirname(exe) not in _OS_BIN_DIRS:
        argv = [SH, "-c", _front(exe, fail_closed, log_file)] + argv
    return {"path": argv[0], "args": argv, "env": list(HOOK_ENV), "timeout": int(timeout)}


def hooksd_document(entry: dict, stages=("createContainer",)) -> dict:
    """A hooks.d (oci-hooks(5), schema 1.0.0) file that fires for GPU containers.

    ``when`` matches containers whose process env names NVIDIA devices is
    not expressible (hooks.d matches annotations, commands and bind mounts
    only), so it fires always and the hook itself skips non-GPU containers
    in well under a millisecond past its start.
    """
    return {"version": "1.0.0", "hook": entry, "when": {"always": True}, "stages": list(stages)}
