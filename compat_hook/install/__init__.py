"""``compat-hook install|uninstall ENGINE``: registration with container engines.

One module per engine (``containerd``, ``podman``, ``crio``, ``docker``), each
exposing ``install(opts) -> int`` and ``uninstall(opts) -> int`` where
``opts`` is an :class:`Options` (the command line builds it: ``cli``). All
of them are idempotent, write atomically (temp file + rename, backup of what
they replace) and print a unified diff instead of writing with ``--dry-run``.
Shared helpers: :mod:`~compat_hook.install.files` (host files),
:mod:`~compat_hook.install.wrapper` (the rendered runtime wrapper),
:mod:`~compat_hook.install.hooksd` (the hooks.d file),
:mod:`~compat_hook.install.checks` (will the configuration take effect?).

>>> Options(engine="podman", hooks_dir="/tmp/h").runtime_name
'cuda-compat'
"""

from __future__ import annotations

import dataclasses
import importlib
import sys

__all__ = ["Options", "run_install", "toolkit_configs", "ENGINES"]

ENGINES = ("containerd", "podman", "crio", "docker", "nvidia-toolkit")


@dataclasses.dataclass(frozen=True)
class Options:
    """What one ``install``/``uninstall`` is asked to do (paths as given; the engines make them absolute)."""

    engine: str
    #: The engine's config file (containerd's main config, daemon.json, the CRI-O drop-in, podman's hooks.d file).
    config: str | None = None
    #: compat-hook's configuration the registered hook and wrapper read (default /etc/compat-hook/config.yaml).
    hook_config: str | None = None
    runtime_name: str = "cuda-compat"
    set_as_default: bool = False
    dry_run: bool = False
    #: containerd: ``wrapper`` (BinaryName), ``base-spec`` (the hook in a base_runtime_spec) or
    #: ``nri`` (the NRI plugin: :mod:`compat_hook.install.nri`).
    via: str = "wrapper"
    #: containerd ``--via nri``: the built compat-hook-nri binary to register (default: nri.DEFAULT_PLUGIN).
    nri_plugin: str | None = None
    #: containerd ``--via nri``: ``off`` (fail-open), ``per-pod`` or ``all``: what NRI's default validator
    #: requires of compat-hook's plugin (containerd 2.2 and later: :data:`compat_hook.install.nri.REQUIRE_MODES`).
    nri_require: str | None = None
    hooks_dir: str | None = None
    wrapper_path: str | None = None
    #: The hook's and the wrapper's state (cache) dir (default /var/lib/compat-hook).
    state_dir: str | None = None
    #: containerd: how the current config is read (``auto``, ``file``, ``command``).
    config_source: str = "auto"
    #: containerd, Docker: the NVIDIA toolkit's config.toml to register under as well (``None``:
    #: the ones found on the node; ``"none"``: do not).
    toolkit_config: str | None = None
    #: nvidia-toolkit uninstall run by an engine's: the engine's uninstall decides about the wrapper
    #: (a pass-through while its containers live), so the toolkit's leaves it.
    keep_wrapper: bool = False

    @classmethod
    def from_namespace(cls, ns) -> "Options":
        """From an argparse namespace of ``compat-hook install`` (fields it lacks keep their defaults)."""
        values = {}
        for f in dataclasses.fields(cls):
            if hasattr(ns, f.name):
                v = getattr(ns, f.name)
                if v is not None or f.default is None:
                    values[f.name] = v
        return cls(**values)


def run_install(opts, uninstall: bool = False) -> int:
    """Dispatch to ``compat_hook.install.<engine>``; ``opts``: :class:`Options` (or an argparse namespace)."""
    if not isinstance(opts, Options):
        opts = Options.from_namespace(opts)
    if opts.engine not in ENGINES:
        from ..core.errors import UsageError

        raise UsageError(f"unknown engine {opts.engine!r} (one of {', '.join(ENGINES)})")
    if opts.via == "nri" and opts.engine != "containerd":
        from ..core.errors import UsageError

        raise UsageError(f"--via nri is containerd's (2.x); {opts.engine} is registered without it")
    if opts.nri_require not in (None, "off") and opts.via != "nri":
        from ..core.errors import UsageError

        raise UsageError(f"--nri-require is --via nri's (containerd's NRI default validator); not --via {opts.via}")
    # containerd --via nri: the NRI plugin (its own module; the containerd module edits the CRI config).
    name = "nri" if opts.engine == "containerd" and opts.via == "nri" else opts.engine.replace('-', '_')
    mod = importlib.import_module(f"compat_hook.install.{name}")
    # The NRI plugin sees every container, whatever runtime it names: the toolkit's chain is not needed.
    with_toolkit = opts.engine in _WITH_TOOLKIT and opts.via != "nri"
    if uninstall and with_toolkit:
        # First out of the toolkit's chain, then the wrapper it would name goes.
        _with_toolkit(opts, uninstall=True)
    status = (mod.uninstall if uninstall else mod.install)(opts)
    if not uninstall and status == 0 and with_toolkit:
        _with_toolkit(opts, uninstall=False)
    if not uninstall and status == 0 and not opts.dry_run:
        _prepare_log(opts)
    if uninstall and status == 0 and not opts.dry_run and opts.state_dir:
        _prune_state_dir(opts.state_dir)
    return status


def _prepare_log(opts) -> None:
    """The log's spool, made now: a user-namespaced container's hook cannot make it, and the first start
    on a fresh host may be one (docs/engines.md, "The log's spool")."""
    from ..core import logjson
    from ..core.registration import registered_log_file

    log = registered_log_file(opts.hook_config)
    if log and not logjson.prepare_spool(log):
        print(f"compat-hook: note: could not make the log's spool {logjson.spool_dir(log)} (mode 1733): "
              "a user-namespaced container's line waits until a start on the host makes it", file=sys.stderr)


#: Engines whose containers may run through the NVIDIA toolkit's runtime (the ``nvidia``
#: runtime/RuntimeClass): their install registers under the toolkit too.
_WITH_TOOLKIT = ("containerd", "docker")


def toolkit_configs(opts) -> list:
    """The NVIDIA toolkit config.toml files an engine install registers under as well.

    ``--toolkit-config PATH`` names one, ``none`` none; by default those on the node:
    ``/etc/nvidia-container-runtime/config.toml`` and the GPU Operator's
    (:data:`~compat_hook.install.nvidia_toolkit.OPERATOR_CONFIG`).
    """
    import os

    if opts.toolkit_config == "none":
        return []
    if opts.toolkit_config:
        return [os.path.abspath(opts.toolkit_config)]
    from .nvidia_toolkit import DEFAULT_CONFIG, OPERATOR_CONFIG

    return [p for p in (DEFAULT_CONFIG, OPERATOR_CONFIG) if os.path.isfile(p)]


def _with_toolkit(opts, uninstall: bool) -> None:
    """Register under (or out of) the NVIDIA toolkit found beside the engine, with the same wrapper."""
    import sys

    from . import nvidia_toolkit

    for path in toolkit_configs(opts):
        sys.stdout.write(f"the NVIDIA Container Toolkit's {path} is on this node: "
                         f"{'un' if uninstall else ''}registering there too (--toolkit-config none: not)\n")
        sub = dataclasses.replace(opts, engine="nvidia-toolkit", config=path, set_as_default=False,
                                  via="wrapper", toolkit_config=None, keep_wrapper=uninstall)
        (nvidia_toolkit.uninstall if uninstall else nvidia_toolkit.install)(sub)


def _prune_state_dir(state_dir: str) -> None:
    """Remove a ``--state-dir`` (and its ``cache/``) when nothing is left in them.

    A cache the hook still fills is kept (another registration may use it),
    and so is a dir holding anything else (the host store). The default
    ``/var/lib/compat-hook`` is the Debian package's (``apt purge``).
    """
    import os

    base = os.path.abspath(state_dir)
    for d in (os.path.join(base, "cache"), base):
        try:
            os.rmdir(d)
        except OSError:  # missing or not empty
            pass
