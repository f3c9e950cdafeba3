"""A hold is lifted in four ways only, whatever sequence of passes the agent makes.

The agent's reconcile (``compat_hook.cluster.node.reconcile``, with the gate and the record of
regressing workloads, ``gate`` and ``holds``) is pure: these tests drive it with sequences of
passes as a node sees them (pods recreated, evicted and back; a pass without a target, as when
the announcement has a typo; an incomplete pass; the agent restarted, reading only the Node) and
write its keys back onto the Node's metadata each time, as the apply does. compat-hook's hold
(the skip label with ``<prefix>/holds-upgrade``) may come off only:

* on a complete pass, with a target, that judged every workload recorded as regressing on it
  either fine now or absent for the quiet time (no pass saw it run, or found it regressing, since);
* under the admin's override (``<prefix>/allow-upgrade=true``);
* with the gate turned off;
* on a node past ``upgrade-required`` (where the label does nothing).

The same server-free shape as tests/test_cluster_reconcile.py; the real API server and NVIDIA's
upgrade controller are tests/test_cluster.py's.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compat_hook.cluster.node import reconcile
from compat_hook.cluster.node.gate import HOLDABLE, OVERRIDE, SKIP_LABEL, STATE_LABEL
from tests.test_cluster_reconcile import written  # ``meta`` once a Desired's keys are written

P = "p.io"
HOLD = f"{P}/holds-upgrade"
QUIET = 100.0
ST = reconcile.Settings(prefix=P, gate=True, quiet=QUIET, interval=300.0, details="ns/n")
WORKLOADS = ("w1", "w2", "w3")
IMAGES = {"w1": "r/a:1", "w2": "r/b:2", "w3": "r/c:3"}


def held(meta: dict) -> bool:
    return meta["labels"].get(SKIP_LABEL) == "true" and HOLD in meta["annotations"]


def findings(*, target, present, judged, regressing, complete, current) -> reconcile.Findings:
    counts = {"workloads": len(present), "assessed": len(judged), "regressions": len(regressing),
              "broken_now_and_after": 0, "changed": len(regressing), "unreadable": 0, "unknown_workloads": 0,
              "not_in_store": 0, "pods": len(present)}
    problems = () if complete else (("no target: the announcement names no driver",) if target is None
                                    else ("an image could not be read",))
    verdict = "fail" if regressing else ("pass" if complete else "unknown")
    return reconcile.Findings(counts=counts, problems=problems, reasons=("regression",) if regressing else (),
                              complete=complete, verdict=verdict, regressing={w: IMAGES[w] for w in regressing},
                              judged=frozenset(judged), present=frozenset(present), unjudged=(), target=target,
                              target_from="ClusterPolicy/cluster-policy", now="535.261.03", blocked=None,
                              current=current)


def test_a_pass_without_a_target_carries_the_record_over():
    """The issue's case: the regressing pod is recreated, a pass sees a typo in the announcement (no
    target), and the pass after that must still wait the quiet time since the pod left."""
    meta = {"labels": {}, "annotations": {}}
    d = reconcile.reconcile(meta, findings(target="470", present={"w1"}, judged={"w1"}, regressing={"w1"},
                                           complete=True, current=True), ST, now=1000.0)
    meta = written(meta, d)
    assert held(meta)
    own = d.doc
    # the pod deleted (recreated in a moment), and the announcement now has a typo: no target
    typo = reconcile.reconcile(meta, findings(target=None, present=set(), judged=set(), regressing=set(),
                                              complete=False, current=True), ST, now=1010.0, own=own)
    meta, own = written(meta, typo), typo.doc
    assert held(meta) and typo.doc["held"]["target"] == "470" and typo.doc["held"]["w"]
    # fixed 10 s later; the pod has not come back: a complete pass, held until the quiet time is over
    for now in (1020.0, 1060.0, 1110.0):
        d = reconcile.reconcile(meta, findings(target="470", present=set(), judged=set(), regressing=set(),
                                               complete=True, current=True), ST, now=now, own=own)
        meta, own = written(meta, d), d.doc
        assert held(meta), (now, d.gate.state)
    d = reconcile.reconcile(meta, findings(target="470", present=set(), judged=set(), regressing=set(),
                                           complete=True, current=True), ST, now=1020.0 + QUIET, own=own)
    assert not held(written(meta, d)) and d.gate.state == "clear"


def test_an_incomplete_pass_neither_ends_nor_starts_an_absence():
    meta = {"labels": {}, "annotations": {}}
    d = reconcile.reconcile(meta, findings(target="470", present={"w1"}, judged={"w1"}, regressing={"w1"},
                                           complete=True, current=True), ST, now=1000.0)
    meta = written(meta, d)
    # the image unreadable, the pod judged as nothing: the workload stays recorded, its clock unstarted
    blind = findings(target="470", present={"w1"}, judged={"w1"}, regressing=set(), complete=False, current=True)
    d = reconcile.reconcile(meta, blind, ST, now=1010.0)
    meta = written(meta, d)
    assert held(meta) and d.doc["held"]["w"]
    gone = findings(target="470", present=set(), judged=set(), regressing=set(), complete=False, current=True)
    d = reconcile.reconcile(meta, gone, ST, now=1020.0 + 10 * QUIET)
    meta = written(meta, d)
    assert held(meta) and list(d.doc["held"]["w"].values())[0][1] is None  # no absence counted
    # complete passes count it from the first one that sees it gone
    done = findings(target="470", present=set(), judged=set(), regressing=set(), complete=True, current=True)
    d = reconcile.reconcile(meta, done, ST, now=3000.0)
    meta = written(meta, d)
    assert held(meta) and d.next_expiry == 3000.0 + QUIET


step = st.fixed_dictionaries({
    "dt": st.integers(min_value=0, max_value=150),
    "target": st.sampled_from(["470", "470", "470", "470", None, "575"]),
    "present": st.sets(st.sampled_from(WORKLOADS)),
    "complete": st.booleans(),
    "current": st.sampled_from([True, True, True, False]),
    "judged_frac": st.sets(st.sampled_from(WORKLOADS)),
    "restart": st.sampled_from([False, False, False, True]),
    "state": st.sampled_from(["", "", "", "upgrade-required", "upgrade-required", "cordon-required"]),
    "override": st.sampled_from([False] * 9 + [True]),
    "gate_off": st.sampled_from([False] * 9 + [True]),
})
# which workload regresses on which target (a store package may fix one: a second table from some pass on)
table = st.fixed_dictionaries({(w, t): st.booleans() for w in WORKLOADS for t in ("470", "575")})


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=30), regresses=table, fixed=table,
       fix_at=st.integers(min_value=0, max_value=30))
def test_no_sequence_of_passes_lifts_a_hold_but_in_the_four_ways(steps, regresses, fixed, fix_at):
    meta = {"labels": {}, "annotations": {}}
    own = None
    now = 1000
    # what the passes saw, per target since it last changed: each workload's last word ("regress" or
    # "fine", the latter only from a complete and current pass) and when a pass last saw it run
    target_since = None
    word: dict = {}
    seen_at: dict = {}
    for i, s in enumerate(steps):
        now += s["dt"]
        table_now = regresses if i < fix_at else fixed
        target = s["target"]
        # as reconcile.findings has it: a pass is complete only with a target and a current view of the pods
        complete = s["complete"] and target is not None and s["current"]
        present = set(s["present"])
        judged = present if complete else present & set(s["judged_frac"])
        regressing = {w for w in judged if target is not None and table_now[(w, target)]}
        f = findings(target=target, present=present, judged=judged, regressing=regressing, complete=complete,
                     current=s["current"])
        labels = dict(meta["labels"], **{STATE_LABEL: s["state"]})
        anns = dict(meta["annotations"])
        if s["override"]:
            anns[f"{P}/{OVERRIDE}"] = "true"
        else:
            anns.pop(f"{P}/{OVERRIDE}", None)
        before = {"labels": labels, "annotations": anns}
        settings_now = reconcile.Settings(**dict(reconcile.vars_of(ST), gate=not s["gate_off"]))
        if s["restart"]:
            own = None  # a fresh process: only the Node's record
        d = reconcile.reconcile(before, f, settings_now, now=float(now), own=own)
        after = written(before, d)
        own = d.doc

        # the model: what this pass saw
        if target is not None and target != target_since:
            target_since, word, seen_at = target, {}, {}
        for w in present:
            seen_at[w] = now
        if target is not None:
            for w in regressing:
                word[w] = "regress"
            if complete and f.current:
                for w in judged - regressing:
                    word[w] = "fine"

        if held(before) and not held(after):
            legit = (s["gate_off"] or s["override"] or s["state"] not in HOLDABLE)
            if not legit:
                assert complete and f.current and target is not None, (i, d.gate.state, d.gate.message)
                for w, last in word.items():
                    if last != "regress":
                        continue
                    assert w not in present, (i, w, d.gate.state)
                    assert now - seen_at.get(w, -10 ** 9) >= QUIET, (i, w, now, seen_at.get(w), d.gate.state)
        meta = after
        meta["labels"].pop(STATE_LABEL, None)
        meta["annotations"].pop(f"{P}/{OVERRIDE}", None)
