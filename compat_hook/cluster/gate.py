"""The upgrade gate: hold the GPU Operator's rolling upgrade on a node whose images would break.

NVIDIA's upgrade controller (k8s-operator-libs ``pkg/upgrade``, driver name
``gpu``) leaves a node in ``upgrade-required`` while its label
``nvidia.com/gpu-driver-upgrade.skip`` is exactly ``"true"``; the label has no
effect on a node already past that state. So the gate:

* sets the skip label and ``<prefix>/holds-upgrade`` (why) while the
  preflight is ``fail`` and the state is empty, ``upgrade-done`` (the state
  between upgrades: a version change moves the node from there to
  ``upgrade-required``, where the label then parks it) or ``upgrade-required``;
* takes both off when the result clears;
* never touches a skip label it did not set (it owns the label only while its
  ``holds-upgrade`` annotation is there);
* on a node already past ``upgrade-required`` says it cannot hold.

>>> g = decide({"labels": {}, "annotations": {}}, "fail", "2 image(s) break", enabled=True, prefix="p.io")
>>> g.labels, g.state
({'nvidia.com/gpu-driver-upgrade.skip': 'true'}, 'held')
>>> node = {"labels": {STATE_LABEL: "cordon-required"}, "annotations": {}}
>>> decide(node, "fail", "x", enabled=True, prefix="p.io").state
'cannot-hold'
>>> mine = {"labels": {SKIP_LABEL: "true"}, "annotations": {"p.io/holds-upgrade": "x"}}
>>> decide(mine, "pass", "", enabled=True, prefix="p.io").labels
{'nvidia.com/gpu-driver-upgrade.skip': None}
>>> theirs = {"labels": {SKIP_LABEL: "true"}, "annotations": {}}
>>> g = decide(theirs, "pass", "", enabled=True, prefix="p.io"); (g.labels, g.state)
({}, 'skipped-by-other')
"""

from __future__ import annotations

__all__ = ["decide", "Gate", "STATE_LABEL", "SKIP_LABEL", "HOLDABLE"]

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
#: States from which the controller must pass through upgrade-required, where the skip label parks the node.
HOLDABLE = ("", "upgrade-done", "upgrade-required")
MAX_WHY = 512


class Gate:
    """What to change: ``labels``/``annotations`` (value None: remove) and the resulting ``state``.

    ``state``: ``off`` (gate disabled), ``clear``, ``held``, ``cannot-hold``, ``skipped-by-other``.
    """

    __slots__ = ("labels", "annotations", "state", "message")

    def __init__(self, state: str, message: str = "", labels=None, annotations=None) -> None:
        self.state, self.message = state, message
        self.labels, self.annotations = labels or {}, annotations or {}


def decide(meta: dict, preflight: str, why: str, *, enabled: bool, prefix: str) -> Gate:
    """The gate for a node whose ``metadata`` is ``meta`` (see the module docstring)."""
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    anns = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    hold_key = f"{prefix}/holds-upgrade"
    ours = hold_key in anns
    state = labels.get(STATE_LABEL, "")
    state = state if isinstance(state, str) else ""
    skipped = labels.get(SKIP_LABEL) == "true"
    release = Gate("clear", "the hold is lifted", labels={SKIP_LABEL: None}, annotations={hold_key: None})
    if not enabled or preflight != "fail":
        if ours:
            return release if enabled else Gate("off", "the gate is off: hold lifted", labels={SKIP_LABEL: None},
                                                annotations={hold_key: None})
        if skipped:
            return Gate("skipped-by-other", f"{SKIP_LABEL}=true was set by someone else: left alone")
        return Gate("clear" if enabled else "off")
    if ours:
        # Still ours: keep it (refresh the reason); the label may have been removed by hand.
        want = {} if skipped else {SKIP_LABEL: "true"}
        ann = {} if anns.get(hold_key) == why[:MAX_WHY] else {hold_key: why[:MAX_WHY]}
        return Gate("held", f"holding the upgrade: {why}", labels=want, annotations=ann)
    if skipped:
        return Gate("skipped-by-other", f"{SKIP_LABEL}=true was set by someone else: already held")
    if state not in HOLDABLE:
        return Gate("cannot-hold", f"cannot hold: the node is already in {state[:63]!s} (past upgrade-required); "
                                   f"{why}")
    return Gate("held", f"holding the upgrade: {why}", labels={SKIP_LABEL: "true"},
                annotations={hold_key: why[:MAX_WHY]})
