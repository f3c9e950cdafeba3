"""How the agent writes its Node: server-side apply of compat-hook's keys, under its own field manager.

The agent's intent for its Node is a set of keys (:func:`.reconcile.reconcile`): each label or
annotation compat-hook governs there, with the value it should have, or None (it should not be
there). :func:`plan` turns that and the Node as read into the requests (pure, plain data);
:func:`.applyintent.write_node` sends them:

* **apply** (``application/apply-patch+yaml``, field manager :data:`MANAGER`): every key that
  should be there, always all of them, since a key the manager applied before and leaves out now is
  removed (so a key it applied before that the intent does not name, one under a former label
  prefix, is carried at its value: only a key the intent says None goes). ``kubectl get node NAME -o yaml --show-managed-fields`` then names compat-hook's keys
  (manager ``compat-hook-agent``, operation ``Apply``). The body carries the Node's
  ``metadata.resourceVersion`` as read: a Node changed since (the GPU Operator's upgrade controller,
  an admin, ``cluster release``) is a 409, read again and decided again, so a concurrent writer
  never loses a label and the agent never acts on a hold it did not see. ``force`` is set only
  when a key whose value changes is owned by another manager (an agent before this one wrote its
  keys with a merge patch, an admin wrote one by hand); only keys compat-hook governs are in the
  body, so force takes over nothing else. A skip label of someone else's is never in it (never
  applied, never forced, never removed).
* **remove** (a JSON merge patch, conditional on the same resourceVersion): a key that should go
  but that another manager owns too. Server-side apply removes a key only when the applier is its
  last owner; a key an older agent wrote by merge patch (manager ``compat-hook``, operation
  ``Update``), or one set again by hand, would stay for ever. So when one such key goes, every key
  that goes is in a patch, sent before the apply: the pair that makes a hold (the skip label and
  ``<prefix>/holds-upgrade``) is removed in one request, as the admission policy requires.

Nothing is sent when the Node already says it all: no write without a change. Keys another
manager owns with the value compat-hook wants are left so (shared, no write).

>>> meta = {"resourceVersion": "9", "labels": {"p/a": "1", "p/old": "x", "team": "t"},
...         "managedFields": [{"manager": "compat-hook", "operation": "Update",
...                            "fieldsV1": {"f:metadata": {"f:labels": {"f:p/a": {}, "f:p/old": {}}}}}]}
>>> w = plan("n", meta, {"labels": {"p/a": "2", "p/old": None}, "annotations": {}})
>>> w.remove
{'metadata': {'resourceVersion': '9', 'labels': {'p/old': None}}}
>>> w.apply["metadata"]["labels"], w.force
({'p/a': '2'}, True)
>>> plan("n", meta, {"labels": {"p/a": "1"}, "annotations": {}}).changed
False
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MANAGER", "owners", "plan", "Writes"]

#: The agent's field manager for its Node's keys.
MANAGER = "compat-hook-agent"
KINDS = ("labels", "annotations")


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def owners(meta: dict) -> dict:
    """``{(kind, key): {(manager, operation), ...}}`` for the labels and annotations of ``meta``'s
    ``managedFields``.

    >>> owners({"managedFields": [{"manager": "m", "operation": "Apply",
    ...                            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:a": {}}}}}]})
    {('labels', 'a'): {('m', 'Apply')}}
    """
    out: dict = {}
    for entry in meta.get("managedFields") or []:
        if not isinstance(entry, dict):
            continue
        who = (str(entry.get("manager")), str(entry.get("operation")))
        fields = _map(_map(entry.get("fieldsV1")).get("f:metadata"))
        for kind in KINDS:
            for f in _map(fields.get(f"f:{kind}")):
                if isinstance(f, str) and f.startswith("f:"):
                    out.setdefault((kind, f[2:]), set()).add(who)
    return out


@dataclass(frozen=True)
class Writes:
    """The requests that make the Node say the desired keys: ``remove`` (a merge patch, or None),
    then ``apply`` (the apply body, or None) with ``force``; ``changed``: whether any is needed.
    Plain data: :mod:`.applyintent` sends them."""

    remove: dict | None
    apply: dict | None
    force: bool

    @property
    def changed(self) -> bool:
        return self.remove is not None or self.apply is not None


def plan(name: str, meta: dict, desired: dict, manager: str = MANAGER) -> Writes:
    """The :class:`Writes` for the Node ``name`` whose metadata is ``meta``; ``desired``:
    ``{"labels": {key: value or None}, "annotations": {...}}``, the keys compat-hook governs on it
    (None: absent). A key the manager applied before that ``desired`` does not name (one under a
    former label prefix, a skip label that was compat-hook's under it) stays as it is: only a key
    ``desired`` says None is ever removed."""
    own = owners(meta)
    mine = (manager, "Apply")
    rv = str(meta.get("resourceVersion") or "")
    body: dict = {k: {} for k in KINDS}
    to_set, to_remove, sole = [], [], True
    for kind in KINDS:
        have = _map(meta.get(kind))
        want = _map(desired.get(kind))
        for key, value in have.items():  # what this manager applied before and is not decided now: kept
            if key not in want and mine in own.get((kind, key), ()):
                body[kind][key] = value
        for key, value in want.items():
            if value is not None:
                body[kind][key] = value
                if have.get(key) != value:
                    to_set.append((kind, key))
            elif key in have:
                to_remove.append((kind, key))
                sole = sole and own.get((kind, key)) == {mine}
    remove = None
    if to_remove and not sole:
        # one patch takes off every key that goes (the hold's pair in one request); the apply omits them
        m: dict = {"resourceVersion": rv}
        for kind, key in sorted(to_remove):
            m.setdefault(kind, {})[key] = None
        remove = {"metadata": m}
    apply, force = None, False
    if to_set or (to_remove and remove is None):
        m = {"name": name, "resourceVersion": rv}
        m.update({kind: body[kind] for kind in KINDS if body[kind]})
        apply = {"apiVersion": "v1", "kind": "Node", "metadata": m}
        # a value changed on a key another manager owns too: a conflict unless forced (the key is compat-hook's)
        force = any(own.get(k, set()) - {mine} for k in to_set)
    return Writes(remove, apply, force)
