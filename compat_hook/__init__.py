"""compat-hook: CUDA Forward Compatibility per container, decided at every start.

The package is split by job (see docs/design.md):

* facts: :mod:`compat_hook.facts.hostfacts`, :mod:`compat_hook.facts.imagefacts`,
  :mod:`compat_hook.policy.storefacts`, :mod:`compat_hook.facts.container` (what the
  host, image, store and spec say);
* the decision: :mod:`compat_hook.policy.decision` (pure, no I/O);
* the one assessment: :mod:`compat_hook.policy.assess` (facts -> decision ->
  each actor's planned effects, as data);
* effects: :mod:`compat_hook.effects.ldcache`, :mod:`compat_hook.effects.specedit`,
  :mod:`compat_hook.effects.mounts`;
* entry points that only wire them: :mod:`compat_hook.commands.cli`,
  :mod:`compat_hook.commands.hook`, :mod:`compat_hook.commands.runtime`,
  :mod:`compat_hook.commands.explain`, :mod:`compat_hook.commands.plan`.

Importing this package imports nothing else: the hook runs on every
container start and pays for each module it loads.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
