"""Edits of a bundle's ``config.json`` for the runtime wrapper.

The edits are pure functions on the parsed spec (a dict), each returning
whether it changed anything; :func:`plan` applies the wanted ones to a copy
and lists what it did, :func:`validate` checks the result still has what the
runtime-spec requires, and :func:`write_spec` puts it in place atomically
(temp file in the bundle + ``rename``, the file's mode kept). Everything the
edits do not name is carried over untouched: same keys, same order, same
values (the test suite compares the JSON trees).

>>> spec = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
...         "process": {"cwd": "/", "args": ["sh"], "env": ["PATH=/bin"], "oomScoreAdj": -998,
...                     "user": {"uid": 0, "gid": 0}}}
>>> new, done = plan(spec, ld_dir="/usr/local/cuda-12.4/compat", drop_oom=True)
>>> new["process"]["env"], "oomScoreAdj" in new["process"], "oomScoreAdj" in spec["process"]
(['PATH=/bin', 'LD_LIBRARY_PATH=/usr/local/cuda-12.4/compat'], False, True)
>>> done
['LD_LIBRARY_PATH=/usr/local/cuda-12.4/compat', 'dropped process.oomScoreAdj (-998)']
>>> validate(new)
"""

from __future__ import annotations

import os

from ..core.errors import CompatHookError

__all__ = ["SpecError", "STORE_MOUNT_OPTIONS", "store_mount", "FILE_MOUNT_OPTIONS", "file_mount", "set_ld_library_path", "add_mount",
           "add_hook", "drop_oom_score_adj", "plan", "validate", "write_spec", "mount_at"]

#: Options of the host-store bind mount (read-only, no setuid, no devices).
STORE_MOUNT_OPTIONS = ("rbind", "ro", "nosuid", "nodev")


class SpecError(CompatHookError):
    """The edited spec would not be a valid runtime spec (never written)."""

    code = "bad_spec"


def store_mount(source: str, destination: str) -> dict:
    """The spec mount of a host-store package."""
    return {"destination": destination, "type": "bind", "source": source,
            "options": list(STORE_MOUNT_OPTIONS)}


#: Options of a file bind-mounted over a compat file (the host's libcuda, or /dev/null).
FILE_MOUNT_OPTIONS = ("bind", "ro", "nosuid", "nodev")


def file_mount(source: str, destination: str) -> dict:
    """The spec mount of one host file over one container file, read-only."""
    return {"destination": destination, "type": "bind", "source": source, "options": list(FILE_MOUNT_OPTIONS)}


def _process(spec: dict) -> dict:
    p = spec.get("process")
    if not isinstance(p, dict):
        raise SpecError("config.json has no process object")
    return p


def set_ld_library_path(spec: dict, enable_dir: str | None, known=(), keep=()) -> tuple:
    """Rewrite ``LD_LIBRARY_PATH`` in ``process.env`` (see :mod:`compat_hook.core.ldpath`).

    ``enable_dir``: prepend it (and drop every other compat dir); ``None``:
    only drop compat dirs, but the entries of ``keep``. Returns ``(changed, old_value, new_value)``.
    """
    from ..core.ldpath import rewrite_env

    p = _process(spec)
    env = p.get("env")
    if env is None:
        env = []
    if not isinstance(env, list):
        raise SpecError("process.env is not a list")
    old = _last_ld(env)
    new_env, changed = rewrite_env(env, enable_dir, known, keep)
    if changed:
        p["env"] = new_env
    return changed, old, _last_ld(new_env)


def _last_ld(env: list):
    for item in reversed(env):
        if isinstance(item, str) and item.startswith("LD_LIBRARY_PATH="):
            return item[len("LD_LIBRARY_PATH="):]
    return None


def mount_at(spec: dict, destination: str):
    """The spec's mount whose destination is ``destination`` (normalised), or ``None``."""
    import posixpath

    want = posixpath.normpath(destination)
    mounts = spec.get("mounts")
    for m in mounts if isinstance(mounts, list) else ():
        d = m.get("destination") if isinstance(m, dict) else None
        if isinstance(d, str) and posixpath.normpath(d) == want:
            return m
    return None


def add_mount(spec: dict, mount: dict) -> bool:
    """Append ``mount`` unless an identical one is there already.

    A *different* mount at the same destination is an error: the caller
    decides before (see :func:`mount_at`), an edit never shadows one.
    """
    mounts = spec.get("mounts")
    if mounts is None:
        mounts = spec["mounts"] = []
    if not isinstance(mounts, list):
        raise SpecError("mounts is not a list")
    existing = mount_at(spec, mount["destination"])
    if existing is not None:
        if existing == mount:
            return False
        raise SpecError(f"a mount at {mount['destination']} exists already")
    mounts.append(dict(mount))
    return True


def add_hook(spec: dict, stage: str, entry: dict) -> bool:
    """Append a hook entry to ``hooks.<stage>`` unless the same one is there."""
    hooks = spec.get("hooks")
    if hooks is None:
        hooks = spec["hooks"] = {}
    if not isinstance(hooks, dict):
        raise SpecError("hooks is not an object")
    lst = hooks.get(stage)
    if lst is None:
        lst = hooks[stage] = []
    if not isinstance(lst, list):
        raise SpecError(f"hooks.{stage} is not a list")
    for h in lst:
        if isinstance(h, dict) and h.get("path") == entry["path"] and h.get("args") == entry.get("args"):
            return False
    lst.append(dict(entry))
    return True


def drop_oom_score_adj(spec: dict):
    """Remove ``process.oomScoreAdj``; returns the old value (``None``: absent)."""
    p = spec.get("process")
    if isinstance(p, dict) and "oomScoreAdj" in p:
        return p.pop("oomScoreAdj")
    return None


def _copy_for_edit(spec: dict) -> dict:
    # Copy only the containers the edits may touch; every other value is
    # shared with the original (it is never modified).
    new = dict(spec)
    if isinstance(spec.get("process"), dict):
        new["process"] = dict(spec["process"])
        if isinstance(spec["process"].get("env"), list):
            new["process"]["env"] = list(spec["process"]["env"])
    if isinstance(spec.get("mounts"), list):
        new["mounts"] = list(spec["mounts"])
    if isinstance(spec.get("hooks"), dict):
        new["hooks"] = {k: (list(v) if isinstance(v, list) else v) for k, v in spec["hooks"].items()}
    if isinstance(spec.get("annotations"), dict):
        new["annotations"] = dict(spec["annotations"])
    return new


def add_annotation(spec: dict, key: str, value: str) -> bool:
    """Set ``annotations[key]`` to ``value``; whether it changed."""
    ann = spec.get("annotations")
    if ann is None:
        ann = spec["annotations"] = {}
    if not isinstance(ann, dict):
        raise SpecError("annotations is not an object")
    if ann.get(key) == value:
        return False
    ann[key] = value
    return True


def plan(spec: dict, *, ld_dir: str | None = None, strip: bool = False, known=(), keep=(),
         mounts=(), hooks=(), drop_oom: bool = False, record_ld: str | None = None) -> tuple:
    """Apply the wanted edits to a copy of ``spec``: ``(new_spec, done)``.

    ``ld_dir``: put this container dir first on ``LD_LIBRARY_PATH``;
    ``strip``: (without ``ld_dir``) remove compat dirs from it, but the
    entries of ``keep`` (the chosen compat dir, in ldconfig mode); ``known``:
    extra paths that count as compat dirs; ``mounts``: mounts to add;
    ``hooks``: ``(stage, entry)`` pairs to add; ``drop_oom``: drop
    ``process.oomScoreAdj``; ``record_ld``: an annotation that keeps
    ``LD_LIBRARY_PATH``'s value from before an edit, for the hook added after
    it. ``done`` lists what changed, for the log.
    ``spec`` itself is never modified.
    """
    new = _copy_for_edit(spec)
    done: list = []
    for m in mounts:
        if add_mount(new, m):
            done.append(f"mount {m['source']} at {m['destination']} ({','.join(m.get('options', ()))})")
    if ld_dir or strip:
        changed, old, value = set_ld_library_path(new, ld_dir, known, keep)
        if changed:
            done.append(f"LD_LIBRARY_PATH={value}" if value is not None
                        else f"unset LD_LIBRARY_PATH (was {old})")
            if record_ld and old:
                add_annotation(new, record_ld, old)
                record_ld = None
    if record_ld and isinstance(new.get("annotations"), dict) and record_ld in new["annotations"]:
        # only this wrapper says what it took off: a value the spec brought along is not its
        del new["annotations"][record_ld]
        done.append(f"dropped annotation {record_ld} (not this wrapper's)")
    for stage, entry in hooks:
        if add_hook(new, stage, entry):
            done.append(f"added {stage} hook {entry['path']}")
    if drop_oom:
        old = drop_oom_score_adj(new)
        if old is not None:
            done.append(f"dropped process.oomScoreAdj ({old})")
    return new, done


def _strs(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def validate(spec: dict) -> None:
    """Raise :class:`SpecError` unless the runtime-spec's required fields are sound.

    Checks what runc needs on Linux and what the edits touch: ``ociVersion``;
    ``root.path``; ``process`` with ``cwd`` (absolute), non-empty string
    ``args``, string ``env`` entries of ``KEY=VALUE``, ``user.uid``/``gid``;
    every mount's ``destination`` (and string ``type``/``source``/``options``);
    every hook's absolute ``path`` and string ``args``/``env``, a positive
    ``timeout``; an integer ``oomScoreAdj``.
    """
    if not isinstance(spec, dict):
        raise SpecError("the spec is not a JSON object")
    if not isinstance(spec.get("ociVersion"), str):
        raise SpecError("ociVersion: missing or not a string")
    root = spec.get("root")
    if not isinstance(root, dict) or not isinstance(root.get("path"), str) or not root["path"]:
        raise SpecError("root.path: missing or not a string")
    p = spec.get("process")
    if p is not None:
        if not isinstance(p, dict):
            raise SpecError("process: not an object")
        if not isinstance(p.get("cwd"), str) or not p["cwd"].startswith("/"):
            raise SpecError("process.cwd: missing or not absolute")
        if "args" in p and (not _strs(p["args"]) or not p["args"]):
            raise SpecError("process.args: must be a non-empty list of strings")
        if "env" in p and (not _strs(p["env"]) or any("=" not in e for e in p["env"])):
            raise SpecError("process.env: must be a list of KEY=VALUE strings")
        u = p.get("user")
        if u is not None and (not isinstance(u, dict) or not isinstance(u.get("uid"), int)
                              or not isinstance(u.get("gid"), int)):
            raise SpecError("process.user: uid and gid must be integers")
        if "oomScoreAdj" in p and (isinstance(p["oomScoreAdj"], bool) or not isinstance(p["oomScoreAdj"], int)):
            raise SpecError("process.oomScoreAdj: not an integer")
    mounts = spec.get("mounts")
    if mounts is not None:
        if not isinstance(mounts, list):
            raise SpecError("mounts: not a list")
        for i, m in enumerate(mounts):
            if not isinstance(m, dict) or not isinstance(m.get("destination"), str):
                raise SpecError(f"mounts[{i}].destination: missing or not a string")
            for k in ("type", "source"):
                if k in m and not isinstance(m[k], str):
                    raise SpecError(f"mounts[{i}].{k}: not a string")
            if "options" in m and not _strs(m["options"]):
                raise SpecError(f"mounts[{i}].options: not a list of strings")
    hooks = spec.get("hooks")
    if hooks is not None:
        if not isinstance(hooks, dict):
            raise SpecError("hooks: not an object")
        for stage, lst in hooks.items():
            if not isinstance(lst, list):
                raise SpecError(f"hooks.{stage}: not a list")
            for i, h in enumerate(lst):
                where = f"hooks.{stage}[{i}]"
                if not isinstance(h, dict) or not isinstance(h.get("path"), str) or not h["path"].startswith("/"):
                    raise SpecError(f"{where}.path: missing or not absolute")
                for k in ("args", "env"):
                    if k in h and not _strs(h[k]):
                        raise SpecError(f"{where}.{k}: not a list of strings")
                t = h.get("timeout")
                if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t <= 0):
                    raise SpecError(f"{where}.timeout: must be a positive integer")


def write_spec(bundle: str, spec: dict) -> str:
    """Validate ``spec`` and atomically replace ``<bundle>/config.json``; returns its path.

    The temp file is created ``O_EXCL|O_NOFOLLOW`` next to it and renamed
    over it, so the runtime reads either the old or the new spec, and a
    symlink planted at the temp name is never followed. The old file's mode
    (and owner) are kept.
    """
    from ..core import jsonfast

    validate(spec)
    path = os.path.join(bundle, "config.json")
    data = jsonfast.dumps(spec).encode()
    try:
        st = os.stat(path)
        mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    except FileNotFoundError:
        mode, owner = 0o600, None
    from ..core.atomic import replace

    replace(path, data, mode, owner=owner)
    return path
