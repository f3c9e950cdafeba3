"""The upgrade gate: hold the GPU Operator's rolling upgrade on a node where a workload would regress.

NVIDIA's upgrade controller (k8s-operator-libs ``pkg/upgrade``, driver name
``gpu``) leaves a node in ``upgrade-required`` while its label
``nvidia.com/gpu-driver-upgrade.skip`` is exactly ``"true"``. It reads the label
there and nowhere else: on a node already past ``upgrade-required`` the label
does nothing. So the gate (:func:`decide`, one state per pass):

``held``
    A pass found a regression (``fail``: a workload read and judged, or one
    recorded recently, :mod:`.holds`) and the node is in ``""``,
    ``upgrade-done`` (between upgrades: a version change moves it from there to
    ``upgrade-required``, where the label parks it) or ``upgrade-required``: the
    skip label and ``<prefix>/holds-upgrade`` (why) are set together.
    Completeness is judged per regressing workload: a known regression is held
    even when other workloads could not be judged (the message names what was
    not). An existing hold is kept by any pass that is not complete (the
    target or the node's driver unknown, an image not read, the store or the
    API failing): only a complete pass with no regression lifts it.
``incomplete``
    No longer decided (kept so that an older agent's annotation still reads):
    an incomplete pass that finds a regression holds.
``clear``
    No hold; nothing to hold, or a complete pass found no regression (a hold of
    ours is lifted).
``too-late``
    A regression on a node already past ``upgrade-required``: the label would do
    nothing, so none is set (never again, even when the hold was ours; ours is
    taken off, so that no one reads a hold that is not there).
``cannot-hold``
    A regression, but the operator's upgrade controller does not run for this
    node (``autoUpgrade`` off, the driver not the operator's): none is set; a
    hold of ours is kept in case that changes.
``override``
    The admin's annotation ``<prefix>/allow-upgrade=true``: ours is lifted and
    none is set while it is there.
``released-by-other``
    Someone took our skip label off by hand (our annotation still there,
    ``released_by`` ``label``), or released our hold (``released_by``
    ``release``: ``compat-hook cluster release``, both gone while our last
    published gate was ``held``, as when ``helm uninstall``'s pre-delete Job
    runs before the agent is stopped): we take our annotation off and do not
    hold again for the same target and regressions (a new target or a new
    regression holds again). ``previous`` is the last published word, on the
    Node (:mod:`.reconcile` chooses it): for a label taken off, whoever reads
    it; for a ``release``, only the process that saw it and the agents of its
    installation (the doc names it), so that an agent installed again starts
    fresh.
``skipped-by-other``
    A skip label someone else set: never touched.
``off``
    The gate is off (``cluster.gate_upgrade: false``): ours is lifted.

>>> fail = dict(verdict="fail", complete=True, why="2 workload(s) break", enabled=True, prefix="p.io")
>>> g = decide({"labels": {}, "annotations": {}}, **fail); (g.labels, g.state)
({'nvidia.com/gpu-driver-upgrade.skip': 'true'}, 'held')
>>> mine = {"labels": {SKIP_LABEL: "true"}, "annotations": {"p.io/holds-upgrade": "x"}}
>>> unknown = dict(fail, verdict="unknown", complete=False)
>>> (decide(mine, **unknown).state, decide(mine, **unknown).labels)
('held', {})
>>> g = decide({"labels": {}, "annotations": {}}, **dict(fail, complete=False, problem="1 unknown workload"))
>>> (g.state, g.labels, g.message)
('held', {'nvidia.com/gpu-driver-upgrade.skip': 'true'}, 'holding the upgrade: 2 workload(s) break (not judged: 1 unknown workload)')
>>> decide(mine, **dict(fail, verdict="pass")).labels
{'nvidia.com/gpu-driver-upgrade.skip': None}
>>> late = {"labels": {SKIP_LABEL: "true", STATE_LABEL: "drain-required"}, "annotations": {"p.io/holds-upgrade": "x"}}
>>> g = decide(late, **fail); (g.state, g.labels)
('too-late', {'nvidia.com/gpu-driver-upgrade.skip': None})
>>> gone = {"labels": {STATE_LABEL: "drain-required"}, "annotations": {}}
>>> decide(gone, **fail).labels
{}
>>> theirs = {"labels": {SKIP_LABEL: "true"}, "annotations": {}}
>>> g = decide(theirs, **dict(fail, verdict="pass")); (g.labels, g.state)
({}, 'skipped-by-other')
>>> released = {"labels": {}, "annotations": {}}  # `cluster release` took both off
>>> g = decide(released, **fail, key="k1", previous={"gate": "held", "key": "k1"}); (g.labels, g.state, g.released_by)
({}, 'released-by-other', 'release')
>>> decide(released, **fail, key="k2", previous={"gate": "held", "key": "k1"}).state  # a new regression
'held'
"""

from __future__ import annotations

__all__ = ["decide", "need", "owner", "Gate", "TABLE", "NEEDS", "OWNERS", "STATE_LABEL", "SKIP_LABEL", "HOLDABLE",
           "OVERRIDE", "STATES"]

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
#: States from which the controller must pass through upgrade-required, where the skip label parks the node.
HOLDABLE = ("", "upgrade-done", "upgrade-required")
#: ``<prefix>/`` + this, value ``true``: the admin's override.
OVERRIDE = "allow-upgrade"
STATES = ("off", "clear", "held", "incomplete", "too-late", "cannot-hold", "override", "released-by-other",
          "skipped-by-other")
#: States worth a Warning Event (a regression not held).
WARNING = ("incomplete", "too-late", "cannot-hold", "released-by-other")
MAX_WHY = 512


class Gate:
    """What to change: ``labels``/``annotations`` (value None: remove) and the resulting ``state``
    (one of :data:`STATES`) with a one-line ``message``."""

    __slots__ = ("labels", "annotations", "state", "message", "released_by")

    def __init__(self, state: str, message: str = "", labels=None, annotations=None, released_by=None) -> None:
        self.state, self.message = state, message
        self.labels, self.annotations = labels or {}, annotations or {}
        #: For ``released-by-other``: ``label`` (the skip label taken off, our annotation left) or
        #: ``release`` (both keys gone while our last word was ``held``: ``cluster release``).
        self.released_by = released_by

    def __eq__(self, other) -> bool:  # plain data: two passes that decide alike give equal intents
        return isinstance(other, Gate) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # mutable dicts inside

    def __repr__(self) -> str:
        return f"Gate({self.state!r}, {self.message!r})"

    @property
    def warning(self) -> bool:
        return self.state in WARNING


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


#: Whether this pass needs a hold: ``yes`` (a regression), ``no`` (a complete pass found none),
#: ``unknown`` (a pass that found none but did not read everything: it cannot lift a hold).
NEEDS = ("yes", "no", "unknown")
#: Who owns the skip label: ``none`` (neither key), ``ours`` (the label with our annotation), ``theirs``
#: (the label without it), ``taken`` (our annotation, the label taken off by hand), ``released`` (neither
#: key, while our last published word for this target and these regressions was a hold, or such a
#: release: ``cluster release`` or a hand took them off).
OWNERS = ("none", "ours", "theirs", "taken", "released")
#: The gate: (need, owner) -> what to do. The actions: ``hold`` (set both keys, or keep ours with its
#: reason brought up to date), ``keep`` (ours as it is), ``lift`` (take ours off), ``clear`` (nothing
#: to do), ``leave`` (someone else's label: never touched), ``unmark`` (the label went by hand: our
#: annotation goes too, and no new hold for this target), ``not-again`` (released: not held again for
#: this target and these regressions). Three things come before the table, as they do not depend on
#: who owns the label: the gate off, the admin's override, and a node past ``upgrade-required`` (a
#: regression there is ``too-late``; a hold of ours is lifted, the upgrade has begun). One comes after:
#: where a hold cannot work (``blocked``), a ``hold`` or ``keep`` is ``cannot-hold`` instead.
TABLE = {
    ("yes", "none"): "hold", ("no", "none"): "clear", ("unknown", "none"): "clear",
    ("yes", "ours"): "hold", ("no", "ours"): "lift", ("unknown", "ours"): "keep",
    ("yes", "theirs"): "leave", ("no", "theirs"): "leave", ("unknown", "theirs"): "leave",
    ("yes", "taken"): "unmark", ("no", "taken"): "unmark", ("unknown", "taken"): "unmark",
    ("yes", "released"): "not-again", ("no", "released"): "clear", ("unknown", "released"): "clear",
}


def need(verdict: str, complete: bool) -> str:
    """The pass's row of :data:`TABLE`.

    >>> need("fail", False), need("pass", True), need("warn", False)
    ('yes', 'no', 'unknown')
    """
    return "yes" if verdict == "fail" else "no" if complete else "unknown"


def owner(labels: dict, anns: dict, prefix: str, *, key: str = "", previous: dict | None = None) -> tuple:
    """``(owner, released_by)``: the column of :data:`TABLE` (``released_by``: for ``taken``/``released``).

    >>> owner({SKIP_LABEL: "true"}, {}, "p"), owner({}, {"p/holds-upgrade": "x"}, "p")
    (('theirs', None), ('taken', 'label'))
    >>> owner({}, {}, "p", key="k", previous={"gate": "held", "key": "k"})
    ('released', 'release')
    """
    ours = f"{prefix}/holds-upgrade" in anns
    skipped = labels.get(SKIP_LABEL) == "true"
    if ours:
        return ("ours", None) if skipped else ("taken", "label")
    if skipped:
        return "theirs", None
    prev = _map(previous)
    if prev.get("key") == key and prev.get("gate") == "released-by-other":
        return "released", prev.get("released_by") or "label"
    if prev.get("key") == key and prev.get("gate") == "held":
        # Our last word on this Node was a hold, and both its keys are gone: someone released it (the
        # release command, as helm uninstall runs it while this agent still runs). Holding again at
        # once would undo that, and outlive the agent about to be stopped.
        return "released", "release"
    return "none", None


def decide(meta: dict, *, verdict: str, complete: bool, why: str, enabled: bool, prefix: str,
           blocked: str | None = None, key: str = "", previous: dict | None = None, problem: str = "") -> Gate:
    """The gate for a node whose ``metadata`` is ``meta`` (see the module docstring and :data:`TABLE`).

    ``verdict``: the pass's (``fail`` means a regression); ``complete``: whether it read everything a
    release (or a new hold) needs, ``problem`` what it could not; ``blocked``: why a hold cannot work
    here (None: it can); ``key``: what the regressions are (target and workloads); ``previous``: the
    last published summary (its ``gate`` and ``key``), for ``released``.
    """
    labels, anns = _map(meta.get("labels")), _map(meta.get("annotations"))
    hold_key = f"{prefix}/holds-upgrade"
    skipped = labels.get(SKIP_LABEL) == "true"
    state = labels.get(STATE_LABEL, "")
    state = state[:63] if isinstance(state, str) else ""
    why = why[:MAX_WHY]
    row = need(verdict, complete)
    col, released_by = owner(labels, anns, prefix, key=key, previous=previous)
    mine = col in ("ours", "taken")
    lift = {"labels": {SKIP_LABEL: None} if skipped else {}, "annotations": {hold_key: None}}

    # Before the table: what does not depend on who owns the label.
    if not enabled:
        if mine:
            return Gate("off", "the gate is off (cluster.gate_upgrade): our hold is lifted", **lift)
        return Gate("off")
    if anns.get(f"{prefix}/{OVERRIDE}") == "true":
        msg = f"{prefix}/{OVERRIDE}=true: no hold" + ("; our hold is lifted" if mine else "")
        if skipped and not mine:
            msg += f" ({SKIP_LABEL}=true is someone else's: left alone)"
        return Gate("override", msg, **(lift if mine else {}))
    if state not in HOLDABLE:
        if row == "yes":
            msg = (f"too late to hold: the node is in {state} (past upgrade-required, where "
                   f"{SKIP_LABEL} no longer has an effect); {why}")
            return Gate("too-late", msg, **(lift if mine else {}))
        if col == "ours":
            return Gate("clear", f"the upgrade has begun ({state}): our hold is lifted", **lift)

    action = TABLE[row, col]
    if blocked and action in ("hold", "keep", "not-again"):
        if col == "ours":
            ann = {hold_key: why} if row == "yes" and anns.get(hold_key) != why else {}
            return Gate("cannot-hold", f"cannot hold: {blocked} (our hold is kept)", annotations=ann)
        return Gate("cannot-hold", f"cannot hold: {blocked}; {why}")
    if action == "clear":
        return Gate("clear")
    if action == "lift":
        return Gate("clear", "a complete pass found no regression: the hold is lifted", **lift)
    if action == "keep":
        return Gate("held", f"keeping the hold: this pass is incomplete ({why})")
    if action == "leave":
        return Gate("skipped-by-other", f"{SKIP_LABEL}=true was set by someone else: "
                    + (f"already held; {why}" if row == "yes" else "left alone"))
    if action == "unmark":
        return Gate("released-by-other", f"{SKIP_LABEL} was removed by someone else: the hold is released "
                                         f"for this target", released_by="label", annotations={hold_key: None})
    if action == "not-again":
        if _map(previous).get("gate") == "held":
            return Gate("released-by-other", f"our hold was released by someone else ({SKIP_LABEL} and "
                                             f"{hold_key} removed): not held again for this target; {why}",
                        released_by="release")
        return Gate("released-by-other", f"{SKIP_LABEL} was removed by someone else: not held again for this "
                                         f"target; {why}", released_by=released_by)
    # hold
    if col == "ours":
        return Gate("held", f"holding the upgrade: {why}",
                    annotations={} if anns.get(hold_key) == why else {hold_key: why})
    msg = f"holding the upgrade: {why}"
    if not complete:
        # Completeness is judged per regressing workload: the one that regresses was read and judged,
        # so what this pass could not read elsewhere (another pod's envFrom, an image not in the store)
        # cannot make it any better. Hold, and say what was not judged.
        msg += f" (not judged: {(problem or 'not everything was read')[:MAX_WHY]})"
    return Gate("held", msg, labels={SKIP_LABEL: "true"}, annotations={hold_key: why})
