"""compat-hook: CUDA Forward Compatibility per container, decided at every start.

One subpackage per layer, high to low; a module imports only from its own
layer and the layers below (docs/design.md; import-linter checks it):

* ``commands``: entry points that only wire the layers (``cli``, ``hook``,
  ``runtime``, ``explain``, ``plan``, ``report``, ``store``, ``demo``);
* ``install``: engine registration;
* ``policy``: the decision (pure, no I/O) and the one assessment (facts ->
  decision -> each actor's planned effects, as data);
* ``effects`` (the ld cache, config.json, mounts) and ``images`` (reading an
  image without unpacking it), which never import each other;
* ``facts``: what the host, image, store and spec say;
* ``core``: no policy (versions, errors, JSON, config, cache, registration).

``compat_hook.cli`` and ``compat_hook.runtime`` are the stable entry points
registered hooks and wrappers import; they send a container start straight to
``commands.hook`` / ``commands.runtime`` and the rest to ``commands.cli``.

Importing this package imports nothing else: the hook runs on every
container start and pays for each module it loads.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
