"""Configuration: defaults, validation, and where the file is found.

The file is YAML (``/etc/compat-hook/config.yaml``; ``--config`` or the
``COMPAT_HOOK_CONFIG`` variable override it). A missing *default* file means
defaults; a missing explicit file is an error. Unknown keys and bad values are
rejected, every one of them, each with its key's path:

>>> from_mapping({"mode": "ldconfig", "compat_dirs": ["/usr/local/cuda/compat", "rel"]})
Traceback (most recent call last):
    ...
compat_hook.core.config.ConfigErrors: compat_dirs[1]: must be an absolute path, got 'rel'
>>> from_mapping({"modee": "env", "mode": "nope"})
Traceback (most recent call last):
    ...
compat_hook.core.config.ConfigErrors: modee: unknown key (did you mean mode?); mode: must be one of ldconfig, env, both, got 'nope'
>>> from_mapping({}).mode
'ldconfig'

PyYAML costs ~25 ms to import, more than the hook may spend, so a parsed file
is kept as JSON in the state directory next to the exact text it came from;
a cached entry is used only when the file's bytes are identical, so the cache
can never change what a file means (see :func:`load`).
"""

from __future__ import annotations

from . import fastos as os  # os without importing os: ~1 ms of a container start (fastos)

from .. import __version__
from .errors import ConfigError

__all__ = ["Config", "ConfigError", "ConfigErrors", "error_lines", "DEFAULT_PATH", "DEFAULT_STATE_DIR", "load", "from_mapping",
           "config_path", "registered", "load_for_start", "START_FIXED_KEYS"]

DEFAULT_PATH = "/etc/compat-hook/config.yaml"
DEFAULT_STATE_DIR = "/var/lib/compat-hook"

_MODES = ("ldconfig", "env", "both")
_ON_ERROR = ("continue", "fail")
_DEVICE_CHECK = ("enforce", "warn", "off")
_NVML = ("auto", "off")

_SAFE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+-")


def _abs_path(v, where):
    if not isinstance(v, str) or not v.startswith("/") or "\0" in v or "\n" in v:
        raise ConfigError(f"{where}: must be an absolute path, got {v!r}")
    return os.path.normpath(v)


def _opt_abs_path(v, where):
    return None if v is None else _abs_path(v, where)


def _choice(options, *, false_is=None):
    """One of ``options``; with ``false_is``, YAML's false stands for that option.

    YAML 1.1 (PyYAML) reads an unquoted ``off`` as false, so ``nvml: off`` as the
    shipped config's comment writes it arrives as ``False``.

    >>> _choice(("auto", "off"), false_is="off")(False, "nvml")
    'off'
    >>> _choice(("auto", "off"), false_is="off")(True, "nvml")
    Traceback (most recent call last):
    ...
    compat_hook.core.errors.ConfigError: nvml: must be one of auto, off, got True
    """
    def check(v, where):
        if false_is is not None and v is False:
            return false_is
        if v not in options:
            raise ConfigError(f"{where}: must be one of {', '.join(options)}, got {v!r}")
        return v
    return check


def _bool(v, where):
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: must be true or false, got {v!r}")
    return v


def _positive_number(v, where):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 3600:
        raise ConfigError(f"{where}: must be a number of seconds in (0, 3600], got {v!r}")
    return v


def _path_list(v, where):
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}: must be a non-empty list of absolute paths, got {v!r}")
    out, errors = [], []
    for i, item in enumerate(v):
        try:
            p = _abs_path(item, f"{where}[{i}]")
        except ConfigError as e:
            errors.append(str(e))  # every bad item, not only the first
            continue
        if p not in out:
            out.append(p)
    if errors:
        raise ConfigErrors(errors)
    return out


def _opt_version(v, where):
    if v is None:
        return None
    if not isinstance(v, str):
        # YAML reads 12.10 as the float 12.1: a version must be quoted.
        raise ConfigError(f"{where}: must be a quoted version string (\"12.4\"), got {v!r}")
    from .versions import InvalidVersion, parse_version

    try:
        parse_version(v)
    except InvalidVersion:
        raise ConfigError(f"{where}: not a version (quote it: \"550.54.15\"), got {v!r}") from None
    return v


def _runtime(v, where):
    # The runtime wrapper's pass-through path reads this key with a few lines
    # of shell (no Python start, see compat_hook/data/compat-hook-runtime.sh),
    # so the value is restricted to what that reader handles exactly.
    if not isinstance(v, str) or not v or not _SAFE_CHARS.issuperset(v):
        raise ConfigError(f"{where}: must be a runtime name or absolute path of "
                          f"[A-Za-z0-9_./+-], got {v!r}")
    if "/" in v and not v.startswith("/"):
        raise ConfigError(f"{where}: a runtime path must be absolute, got {v!r}")
    return v


def _opt_str_map(v, where):
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise ConfigError(f"{where}: must be a mapping of strings to strings")
    return dict(v)


def _name_list(v, where):
    # RuntimeClass names (DNS subdomains), "" (no RuntimeClass) or "*" (every one).
    if not isinstance(v, list) or not all(isinstance(x, str) and len(x) <= 253 and x.isascii() and x.isprintable()
                                          and " " not in x for x in v):
        raise ConfigError(f"{where}: must be a list of RuntimeClass names (\"\": none, \"*\": every one)")
    return list(v)


def _opt_quiet(v, where):
    # Seconds (0 .. a week) a regressing workload must be absent before its hold lifts; null: the default.
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 7 * 24 * 3600:
        raise ConfigError(f"{where}: must be a number of seconds from 0 to 604800, or null (the default: "
                          f"twice the agent's interval, at least 120)")
    return v


def _opt_max_age(v, where):
    # Seconds (an hour .. a year) after which a workload no pod ran leaves the set the validator proves.
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 3600 <= v <= 366 * 24 * 3600:
        raise ConfigError(f"{where}: must be a number of seconds from 3600 to 31622400, or null (the default: "
                          f"604800, a week)")
    return v


#: Label prefixes that are others' (the GPU Operator's, Kubernetes' own): refused, with their subdomains.
RESERVED_PREFIXES = ("nvidia.com", "kubernetes.io", "k8s.io")


def _label_prefix(x, where):
    ok = isinstance(x, str) and 0 < len(x) <= 253 and all(
        p and len(p) <= 63 and p[0].isalnum() and p[-1].isalnum() and p.isascii()
        and all(c.isalnum() and not c.isupper() or c == "-" for c in p) for p in x.split("."))
    if not ok:
        raise ConfigError(f"{where}: must be a DNS subdomain (compat-hook.io), got {x!r}")
    for r in RESERVED_PREFIXES:
        if x == r or x.endswith("." + r):
            raise ConfigError(f"{where}: {x!r} is {r}'s (the GPU Operator's or Kubernetes' own keys): "
                              "choose a domain of yours (compat-hook.io)")
    return x


_CLUSTER_KEYS = {"gate_upgrade": _bool, "label_prefix": _label_prefix, "nfd_features_file": _opt_abs_path,
                 "textfile": _opt_abs_path, "compat_runtime_classes": _name_list, "hold_quiet_s": _opt_quiet,
                 "validation_allow_unverified": _bool, "validation_taint": _bool,
                 "workload_max_age_s": _opt_max_age}


def _cluster(v, where):
    """``cluster:`` settings of ``compat-hook cluster agent`` (defaults filled in by compat_hook.cluster);
    every bad key is named (:class:`ConfigErrors`), not the first only.

    >>> _cluster({"label_prefix": "gpu.nvidia.com", "gate": True, "gate_upgrade": "yes"}, "cluster")
    Traceback (most recent call last):
    ...
    compat_hook.core.config.ConfigErrors: cluster.label_prefix: 'gpu.nvidia.com' is nvidia.com's (the GPU Operator's or Kubernetes' own keys): choose a domain of yours (compat-hook.io); cluster.gate: unknown key (one of gate_upgrade, label_prefix, nfd_features_file, textfile, compat_runtime_classes, hold_quiet_s, validation_allow_unverified, validation_taint, workload_max_age_s); cluster.gate_upgrade: must be true or false, got 'yes'
    """
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: must be a mapping")

    def check(k, x):
        if k not in _CLUSTER_KEYS:
            raise ConfigError(f"{where}.{k}: unknown key (one of {', '.join(_CLUSTER_KEYS)})")
        return _CLUSTER_KEYS[k](x, f"{where}.{k}")

    return _each_key(v, check)


def _each_key(v: dict, check) -> dict:
    """``{key: check(key, value)}`` for the mapping ``v``, in its order; a key's :class:`ConfigError`
    is collected, and every problem of every key raised at the end as one :class:`ConfigErrors`."""
    out, errors = {}, []
    for k, x in v.items():
        try:
            out[k] = check(k, x)
        except ConfigErrors as e:
            errors += e.errors
        except ConfigError as e:
            errors.append(str(e))
    if errors:
        raise ConfigErrors(errors)
    return out


# key -> (default, validator, comment). The comment is what `compat-hook
# config` prints above each key (render_default_yaml); config/compat-hook.yaml
# carries the same text.
SCHEMA = {
    "host_root": ("/", _abs_path, "where host facts (/proc, /sys, driver libraries) are read"),
    "driver_lib_dirs": ([
        "/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/nvidia/current",
        "/usr/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu/nvidia/current",
        "/usr/lib64", "/usr/lib", "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
        "/run/nvidia/driver/usr/lib64",
    ], _path_list, "host dirs (under host_root) searched for libcuda.so.X.Y[.Z] when /proc and /sys say nothing"),
    "host_driver_version": (None, _opt_version, "force the host kernel driver version (skips detection)"),
    "host_cuda_version": (None, _opt_version, "force the host CUDA version (Tegra path)"),
    "compat_dirs": (["/usr/local/cuda/compat", "/usr/local/cuda/compat_orin"], _path_list,
                    "container dirs searched, in order, for the compat libcuda"),
    "mode": ("ldconfig", _choice(_MODES), "ldconfig (drop-in + ld cache), env (LD_LIBRARY_PATH, wrapper only) or both"),
    "dry_run": (False, _bool, "log the decision and the edits it would make; change nothing"),
    "on_error": ("continue", _choice(_ON_ERROR), "continue: a failure lets the container start without compat; fail (taken at install): it "
                                                      "stops the container, also when this file no longer loads (continue: the built-in defaults decide then)"),
    "log_file": ("/var/log/compat-hook.log", _opt_abs_path, "one JSON line per run is appended here (null: no log)"),
    "device_check": ("enforce", _choice(_DEVICE_CHECK, false_is="off"), "GPU brand check of the container's GPUs: the note's device list, or NVIDIA's data-center list without one (GeForce/TITAN: never, short of off)"),
    "nvml": ("auto", _choice(_NVML, false_is="off"), "auto: use NVML (nvidia-ml-py) when installed; off: never"),
    "store_dir": ("/var/lib/compat-hook/store", _abs_path, "host compat store (compat-hook store add)"),
    "store_inject": (True, _bool, "mount a host-store compat package into images that need one and carry none"),
    "store_target": ("/usr/local/cuda/compat", _abs_path, "container path the host-store package is mounted at"),
    "runtime": ("runc", _runtime, "the real OCI runtime the wrapper execs (runc, crun, nvidia-container-runtime or a path)"),
    "ldconfig": ("/sbin/ldconfig", _abs_path, "host ldconfig used (confined with -r) to refresh the container's ld cache"),
    "ldconfig_timeout": (10, _positive_number, "seconds before the ldconfig child is killed"),
    "require_gpu_request": (True, _bool, "skip containers that request no GPU (NVIDIA_VISIBLE_DEVICES, nvidia devices, CDI)"),
    "cache": (True, _bool, "remember parsed libraries and config in the state dir (never changes a decision)"),
    "wrapper_add_hook": (True, _bool, "wrapper: add compat-hook's createContainer hook to the spec when the ld cache must change (compat on in ldconfig mode, or a compat dir the image or the NVIDIA toolkit set up must lose); false only when the hook is registered another way"),
    "wrapper_drop_oom_score_adj": (False, _bool, "wrapper: drop process.oomScoreAdj (hosts without CAP_SYS_RESOURCE)"),
    "annotations": ({}, _opt_str_map, "extra annotations to treat as set on every container (testing)"),
    "cluster": ({}, _cluster, "compat-hook cluster agent: gate_upgrade (false), label_prefix (compat-hook.io), "
                              "nfd_features_file, textfile (null: not written), compat_runtime_classes "
                              "([cuda-compat]: the RuntimeClasses that run through compat-hook where a node is "
                              "not on NRI; its registration says), hold_quiet_s "
                              "(null: a regressing workload no pod runs keeps its hold for twice the agent's "
                              "interval, at least 120 s), validation_allow_unverified (false: a workload the "
                              "validator cannot judge fails), validation_taint (true: <prefix>/validation-failed "
                              "taint while validation fails), workload_max_age_s (null: a workload no pod has run "
                              "for a week leaves the set the validator proves)"),
}


class ConfigErrors(ConfigError):
    """Every problem :func:`from_mapping` found, each a line starting with its key path.

    ``str()`` joins them with ``"; "`` so the error stays one line (a log
    line, a command's error); ``config --check`` prints :attr:`errors` one a line.

    >>> e = ConfigErrors(["mode: bad", "modee: unknown key"])
    >>> str(e), e.errors
    ('mode: bad; modee: unknown key', ['mode: bad', 'modee: unknown key'])
    """

    def __init__(self, errors: list) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


def error_lines(e: ConfigError) -> list:
    """The lines of a configuration error: each problem of a :class:`ConfigErrors`, else the one."""
    return list(e.errors) if isinstance(e, ConfigErrors) else [str(e)]


class Config:
    """Validated settings; attribute per key of :data:`SCHEMA`."""

    __slots__ = tuple(SCHEMA) + ("source",)

    def __init__(self, values: dict, source: str | None = None) -> None:
        for k in SCHEMA:
            setattr(self, k, values[k])
        self.source = source

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in SCHEMA}

    def replace(self, **changes) -> "Config":
        d = self.to_dict()
        d.update(changes)
        return from_mapping(d, self.source)


def from_mapping(data, source: str | None = None) -> Config:
    """Validate a mapping (parsed YAML) into a :class:`Config`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigErrors([f"(top level): must be a mapping of keys, got {type(data).__name__}"])

    def check(k, v):
        if k not in SCHEMA:
            import difflib

            close = difflib.get_close_matches(str(k), list(SCHEMA), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{k}: unknown key{hint}")
        return SCHEMA[k][1](v, k)

    values = _each_key(data, check)  # in the file's order, so the errors are too
    for k, (default, _, _) in SCHEMA.items():
        if k not in values:
            values[k] = (list(default) if isinstance(default, list)
                         else dict(default) if isinstance(default, dict) else default)
    return Config(values, source)


def defaults() -> Config:
    return from_mapping({})


def config_path(explicit: str | None, environ=None) -> tuple:
    """``(path, explicit)``: ``--config``, else ``$COMPAT_HOOK_CONFIG``, else the default."""
    if explicit:
        return explicit, True
    env = (environ if environ is not None else os.environ).get("COMPAT_HOOK_CONFIG")
    if env:
        return env, True
    return DEFAULT_PATH, False


def _parse_yaml(text: str, path: str):
    from ._deps import import_dep

    yaml = import_dep("yaml")

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None


def load(path: str | None = None, *, state_dir: str | None = None, environ=None) -> Config:
    """Find, read and validate the configuration.

    ``state_dir`` enables the parse cache (``<state_dir>/cache/config-*.json``).
    """
    path, explicit = config_path(path, environ)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{path}: no such file") from None
        return from_mapping({}, None)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    if state_dir:
        from . import cache

        cached = cache.get_config(state_dir, path, text)
        if cached is not None:
            try:
                return from_mapping(cached, path)
            except ConfigError:
                pass  # a tampered entry can only fall back to parsing
    data = _parse_yaml(text, path)
    cfg = from_mapping(data, path)
    if state_dir:
        from . import cache

        cache.put_config(state_dir, path, text, data if data is not None else {})
    return cfg


#: The keys a registration fixes by itself (:func:`load_for_start`): the rest come from the file.
START_FIXED_KEYS = ("on_error", "log_file", "runtime")


def load_for_start(path: str | None = None, *, state_dir: str | None = None, environ=None,
                   fixed=None) -> tuple:
    """``(Config, error or None)``: the configuration one container start decides with.

    The hook and the runtime wrapper read their configuration through this, and
    only they: a file that loads is the configuration (error ``None``). One that
    does not (not YAML, a bad value, unreadable, a named file missing) must not
    take compat-hook's protection away from every start until it is fixed (an
    image's stale compat path on a newer host is error 803 again), so the
    built-in defaults decide, with what the registration itself fixed laid over
    them, and the error comes back for the start's log line. ``fixed``: a
    callable returning those settings (keys of :data:`START_FIXED_KEYS`:
    ``on_error: fail`` from ``--fail-closed``, the registration's log file, the
    runtime the wrapper's line reader was sure of); it is called only when the
    file fails, so a normal start imports nothing for it, and a value that does
    not validate is left at its default. With ``on_error: fail`` the caller
    stops the start instead (that operator wants nothing run without their
    configuration). :func:`load` caches only a file that validated, so the
    fixed file is read at the next start. The fallback's ``source`` is still
    the file's path: a hook the wrapper adds names the same file.

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "config.yaml")
    >>> with open(p, "w") as f:
    ...     _ = f.write("mode: sideways\\n")
    >>> cfg, err = load_for_start(p, fixed=lambda: {"log_file": "/var/log/x.log", "runtime": "crun"})
    >>> cfg.mode, cfg.runtime, cfg.log_file, cfg.on_error, cfg.source == p
    ('ldconfig', 'crun', '/var/log/x.log', 'continue', True)
    >>> str(err)
    "mode: must be one of ldconfig, env, both, got 'sideways'"
    >>> cfg = load_for_start(p, fixed=lambda: {"on_error": "fail", "log_file": "rel", "mode": "env"})[0]
    >>> cfg.on_error, cfg.log_file, cfg.mode
    ('fail', '/var/log/compat-hook.log', 'ldconfig')
    >>> with open(p, "w") as f:
    ...     _ = f.write("mode: env\\n")
    >>> cfg, err = load_for_start(p)
    >>> cfg.mode, err
    ('env', None)
    """
    try:
        return load(path, state_dir=state_dir, environ=environ), None
    except Exception as e:  # noqa: BLE001 - whatever kept the file from loading, the defaults decide
        error = e
    where = config_path(path, environ)[0]
    values = {}
    try:
        wanted = fixed() if fixed is not None else {}
    except Exception:  # noqa: BLE001 - what the registration fixed is best effort; the defaults stand
        wanted = {}
    for k, v in (wanted or {}).items():
        if k in START_FIXED_KEYS:
            try:
                values[k] = SCHEMA[k][1](v, k)
            except ConfigError:
                pass
    return from_mapping(values, where), error


def render_default_yaml() -> str:
    """The default configuration as commented YAML (config/compat-hook.yaml)."""
    import json

    lines = [f"# compat-hook {__version__} configuration. Every key is optional;",
             "# the values shown are the defaults.", ""]
    for k, (default, _, comment) in SCHEMA.items():
        lines.append(f"# {comment}")
        if isinstance(default, list):
            lines.append(f"{k}:")
            lines.extend(f"  - {item}" for item in default)
        elif default is None:
            lines.append(f"{k}: null")
        elif isinstance(default, dict):
            lines.append(f"{k}: {{}}")
        elif isinstance(default, bool):
            lines.append(f"{k}: {'true' if default else 'false'}")
        elif isinstance(default, str):
            lines.append(f"{k}: {json.dumps(default) if ':' in default else default}")
        else:
            lines.append(f"{k}: {default}")
        lines.append("")
    return "\n".join(lines)


def registered(hook_config: str | None):
    """``(Config, note or None)`` for the file a registration names (``None``: the default path).

    A missing file means the defaults, as the hook and the wrapper read it at
    container start; the note says so when the file was named explicitly.
    """

    path = os.path.abspath(hook_config) if hook_config else DEFAULT_PATH
    if not os.path.lexists(path):
        note = (f"note: {path} is missing: the registered hook and wrapper use the defaults until it is written"
                if hook_config else None)
        return from_mapping({}, None), note
    return load(path, environ={}), None
