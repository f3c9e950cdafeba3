"""Kubeconfig files read and merged as kubectl does (client-go's ``clientcmd`` loading rules).

* ``--kubeconfig FILE``: that file only, which must exist;
* else every file in ``$KUBECONFIG`` (``:``-separated; a missing one is skipped, a path named twice
  is read once), else ``~/.kube/config``;
* entries of ``clusters``, ``users`` and ``contexts`` are kept whole by name, and the first file that
  names one wins (its fields are never mixed with a later file's); ``current-context`` and
  ``preferences`` come from the first file that sets them;
* a relative path in an entry (a CA, a client certificate or key, a token file, an exec plugin's
  command with a ``/``) is relative to the file that holds the entry;
* ``--context NAME`` replaces ``current-context``.

A file that is not a kubeconfig (not YAML, not a mapping, a list that is not a list of named
entries) is one line naming the file (:class:`KubeconfigError`), never a traceback. Size and
nesting are bounded before the document is built (:func:`check_shape`): more than :data:`MAX_FILE`
bytes, nesting deeper than :data:`MAX_DEPTH` or more than :data:`MAX_ALIASES` YAML aliases is not
a kubeconfig (a real one is 5 levels deep and has none), so no ``RecursionError`` and no
exponential expansion reach the code that walks it.

The merged document goes to the Kubernetes client (``load_kube_config_from_dict``), which reads
the context's cluster and credentials (exec plugins, tokens, certificates) as it always does.

>>> merged, _ = merge([("a", {"current-context": "", "users": [{"name": "u", "user": {"token": "A"}}]}),
...                    ("b", {"current-context": "x", "users": [{"name": "u", "user": {"token": "B"}},
...                                                             {"name": "v", "user": {}}]})])
>>> merged["current-context"], [(u["name"], u["user"]) for u in merged["users"]]
('x', [('u', {'token': 'A'}), ('v', {})])
"""

from __future__ import annotations

import os

from ...core.errors import CompatHookError

__all__ = ["KubeconfigError", "load", "merge", "paths", "check_shape", "MAX_FILE", "MAX_DEPTH", "MAX_ALIASES"]

#: A kubeconfig larger than this is not one (an operator's file is a few KiB).
MAX_FILE = 4 << 20
#: Nesting (mappings and sequences) a kubeconfig may have; an exec plugin's env is 5 levels deep.
MAX_DEPTH = 32
#: YAML aliases a kubeconfig may use (kubectl's writes none).
MAX_ALIASES = 64
_LISTS = ("clusters", "users", "contexts")
#: Keys of an entry's body that name a file, by list (client-go's ResolvePaths).
_PATH_KEYS = {"clusters": ("certificate-authority",), "users": ("client-certificate", "client-key", "tokenFile")}


class KubeconfigError(CompatHookError):
    """A kubeconfig that cannot be used: one line naming the file and what is wrong."""

    code = "bad_kubeconfig"


def paths(kubeconfig: str | None) -> tuple:
    """``(files, explicit)``: the files to read, in order, and whether ``--kubeconfig`` named one."""
    if kubeconfig is not None:
        return [kubeconfig], True
    env = os.environ.get("KUBECONFIG") or ""
    out: list = []
    for p in env.split(os.pathsep):
        p = os.path.expanduser(p.strip())
        if p and p not in out:
            out.append(p)
    return (out or [os.path.expanduser("~/.kube/config")]), False


def _read(path: str) -> dict | None:
    """One file as a mapping (None: empty)."""
    import yaml

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE + 1)
    except OSError as e:
        raise KubeconfigError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE:
        raise KubeconfigError(f"{path}: larger than {MAX_FILE} bytes, not a kubeconfig")
    try:
        problem = check_shape(raw)
        if problem:
            raise KubeconfigError(f"{path}: not a kubeconfig: {problem}")
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise KubeconfigError(f"{path}: not valid YAML{where}: {problem}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise KubeconfigError(f"{path}: not a kubeconfig: {e}") from None
    except RecursionError:  # check_shape bounds the nesting: kept as the last guard
        raise KubeconfigError(f"{path}: not a kubeconfig: nested too deeply") from None
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path}: not a kubeconfig (a {type(doc).__name__}, not a mapping)")
    for key in _LISTS:
        items = doc.get(key)
        if items is None:
            continue
        if not isinstance(items, list) or not all(
                isinstance(i, dict) and isinstance(i.get("name"), str) and i["name"] for i in items):
            raise KubeconfigError(f"{path}: {key}: not a list of named entries")
    for key in ("current-context",):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise KubeconfigError(f"{path}: {key}: not a string")
    return doc


def check_shape(raw: bytes) -> str | None:
    """Why ``raw`` cannot be a kubeconfig by its shape alone (None: it may be one): its flow brackets
    nest deeper than :data:`MAX_DEPTH` (a linear scan, before the YAML scanner sees them), or its
    YAML events do (the parser is a loop; only building the document recurses), or it has more than
    :data:`MAX_ALIASES` aliases. Raises ``yaml.YAMLError`` for what is not YAML.

    >>> check_shape(b"[" * 100000), check_shape(b"- " * 100 + b"a"), check_shape(b"a: &x [1]\\nb: *x\\n")
    ('nested deeper than 32 levels', 'nested deeper than 32 levels', None)
    """
    import yaml

    from ...core.safejson import depth

    text = raw.decode("utf-8", "replace")
    if depth(text, MAX_DEPTH) > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    level = aliases = 0
    for ev in yaml.parse(raw, Loader=yaml.SafeLoader):
        if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            level += 1
            if level > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            level -= 1
        elif isinstance(ev, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                return f"more than {MAX_ALIASES} YAML aliases"
    return None


def _absolute(entry: dict, kind: str, base: str) -> dict:
    """``entry`` with its relative file paths made absolute against ``base`` (the file's directory)."""
    import copy

    entry = copy.deepcopy(entry)
    body = entry.get(kind[:-1])  # clusters -> cluster, users -> user
    if not isinstance(body, dict):
        return entry
    for key in _PATH_KEYS.get(kind, ()):
        v = body.get(key)
        if isinstance(v, str) and v and not os.path.isabs(v):
            body[key] = os.path.join(base, v)
    ex = body.get("exec") if kind == "users" else None
    if isinstance(ex, dict) and isinstance(ex.get("command"), str):
        c = ex["command"]
        if "/" in c and not os.path.isabs(c):  # a bare name is looked up in $PATH, as kubectl does
            ex["command"] = os.path.join(base, c)
    return entry


def merge(docs: list) -> tuple:
    """``[(path, doc)]`` merged by kubectl's rules: ``(merged, {what: path it came from})``."""
    merged: dict = {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": []}
    origin: dict = {}
    for path, doc in docs:
        if not doc:
            continue
        base = os.path.dirname(os.path.abspath(path))
        for kind in _LISTS:
            seen = {e["name"] for e in merged[kind]}
            for entry in doc.get(kind) or []:
                if entry["name"] not in seen:
                    seen.add(entry["name"])
                    merged[kind].append(_absolute(entry, kind, base))
                    origin[f"{kind}/{entry['name']}"] = path
        for key in ("current-context", "preferences"):
            if doc.get(key) and key not in merged:
                merged[key] = doc[key]
                origin[key] = path
    return merged, origin


def load(kubeconfig: str | None, context: str | None) -> tuple:
    """``(merged document, context name, where)``: where says which files were read."""
    files, explicit = paths(kubeconfig)
    docs = []
    for p in files:
        if not explicit and not os.path.exists(p):
            continue
        docs.append((p, _read(p)))
    src = ":".join(files)
    if not any(d for _, d in docs):
        raise KubeconfigError("no kubeconfig file there (set $KUBECONFIG or --kubeconfig)")
    merged, origin = merge(docs)
    name = context or merged.get("current-context")
    if not name:
        raise KubeconfigError(f"{src}: no current-context (name one with --context)")
    names = [c["name"] for c in merged["contexts"]]
    if name not in names:
        known = ", ".join(names[:10]) or "none"
        raise KubeconfigError(f"{src}: no context {name!r} (there are: {known})")
    ctx = next(c for c in merged["contexts"] if c["name"] == name).get("context")
    if not isinstance(ctx, dict) or not isinstance(ctx.get("cluster"), str):
        raise KubeconfigError(f"{origin.get('contexts/' + name, src)}: context {name!r} names no cluster")
    if ctx["cluster"] not in {c["name"] for c in merged["clusters"]}:
        raise KubeconfigError(f"{origin.get('contexts/' + name, src)}: context {name!r}: no cluster "
                              f"{ctx['cluster']!r}")
    # A cluster entry that is not a mapping, or names no server, would leave the client on its default,
    # http://localhost: the credentials sent in clear to whatever listens there. kubectl refuses it too.
    cluster = next(c for c in merged["clusters"] if c["name"] == ctx["cluster"])
    body = cluster.get("cluster")
    if not isinstance(body, dict) or not isinstance(body.get("server"), str) or not body["server"].strip():
        raise KubeconfigError(f"{origin.get('clusters/' + ctx['cluster'], src)}: cluster {ctx['cluster']!r} "
                              f"names no server")
    user = ctx.get("user")
    entry = next((u for u in merged["users"] if u["name"] == user), None) if isinstance(user, str) else None
    if entry is not None and entry.get("user") is not None and not isinstance(entry["user"], dict):
        raise KubeconfigError(f"{origin.get('users/' + user, src)}: user {user!r} is not a mapping")
    merged["current-context"] = name
    return merged, name, src
