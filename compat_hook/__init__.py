"""compat-hook: CUDA Forward Compatibility per container, decided at every start.

The package is split by job (see docs/design.md):

* facts: :mod:`compat_hook.hostfacts`, :mod:`compat_hook.imagefacts`,
  :mod:`compat_hook.storefacts`, :mod:`compat_hook.container` (what the
  host, image, store and spec say);
* the decision: :mod:`compat_hook.decision` (pure, no I/O);
* the one assessment: :mod:`compat_hook.assess` (facts -> decision ->
  each actor's planned effects, as data);
* effects: :mod:`compat_hook.ldcache`, :mod:`compat_hook.specedit`,
  :mod:`compat_hook.mounts`;
* entry points that only wire them: :mod:`compat_hook.cli`,
  :mod:`compat_hook.hook`, :mod:`compat_hook.runtime`,
  :mod:`compat_hook.explain`, :mod:`compat_hook.plan`.

Importing this package imports nothing else: the hook runs on every
container start and pays for each module it loads.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
