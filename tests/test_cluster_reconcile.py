"""The agent's reconcile and apply plan without a server: pure functions of the Node as read.

``reconcile.reconcile`` (what the Node should say after a pass) and ``nodeapply.plan`` (the
server-side apply and, for keys another manager owns, the patch that makes it say that) are
pure: these tests feed them Node metadata, findings and a clock and read their answer. The same
code on a real API server, with the admission policy and NVIDIA's upgrade controller, is
tests/test_cluster.py and tests/test_admission.py.
"""

from __future__ import annotations

import json

from compat_hook.cluster.node import nodeapply, reconcile
from compat_hook.cluster.node.gate import SKIP_LABEL, STATE_LABEL

P = "p.io"
HOLD = f"{P}/holds-upgrade"
ST = reconcile.Settings(prefix=P, gate=True, quiet=100.0, interval=300.0, details="ns/n")
COUNTS = {"workloads": 1, "assessed": 1, "regressions": 0, "broken_now_and_after": 0, "changed": 0,
          "unreadable": 0, "unknown_workloads": 0, "not_in_store": 0, "pods": 1}


def found(regressing=None, present=None, **kw) -> reconcile.Findings:
    """A complete pass over one workload ``w1`` on target 470: regressing unless ``regressing={}``."""
    regressing = {"w1": "r/app:1"} if regressing is None else regressing
    present = set(regressing) if present is None else present
    c = dict(COUNTS, regressions=len(regressing), workloads=len(present), assessed=len(present))
    args = dict(counts=c, problems=(), reasons=("regression",) if regressing else (), complete=True,
                verdict="fail" if regressing else "pass", regressing=regressing, judged=frozenset(present),
                present=frozenset(present), unjudged=(), target="470.256.02", target_from="--driver",
                now="535.1", blocked=None, current=True)
    args.update(kw)
    return reconcile.Findings(**args)


def written(meta: dict, d: reconcile.Desired) -> dict:
    """``meta`` once ``d``'s keys are written."""
    out = {k: dict(meta.get(k) or {}) for k in ("labels", "annotations")}
    for kind, keys in d.keys.items():
        for k, v in keys.items():
            if v is None:
                out[kind].pop(k, None)
            else:
                out[kind][k] = v
    return out


def test_a_regression_holds_and_a_clean_pass_lifts_it():
    d = reconcile.reconcile({}, found(), ST, now=1000.0)
    assert (d.verdict, d.gate.state) == ("fail", "held")
    assert d.keys["labels"][SKIP_LABEL] == "true" and d.keys["labels"][f"{P}/preflight"] == "fail"
    assert d.keys["annotations"][HOLD].startswith("1 workload(s) regress on driver 470.256.02")
    doc = json.loads(d.keys["annotations"][f"{P}/preflight"])
    assert doc == d.doc and doc["gate"] == "held" and doc["held"]["w"] == {"w1": ["r/app:1", None]}
    meta = written({}, d)
    again = reconcile.reconcile(meta, found(), ST, now=1060.0)
    assert again.gate.state == "held" and not nodeapply.plan("n", meta, again.keys).changed  # nothing to write
    # the workload judged again, no longer regressing (its image fixed): lifted at once, the pair together
    fixed = reconcile.reconcile(meta, found(regressing={}, present={"w1"}), ST, now=1100.0)
    assert (fixed.verdict, fixed.gate.state) == ("pass", "clear")
    assert fixed.keys["labels"][SKIP_LABEL] is None and fixed.keys["annotations"][HOLD] is None


def test_a_regressing_workload_without_a_pod_stays_held_for_the_quiet_time_and_a_restart_agrees():
    meta = written({}, reconcile.reconcile({}, found(), ST, now=1000.0))
    gap = found(regressing={}, present=set())  # its pod deleted and not yet back
    d = reconcile.reconcile(meta, gap, ST, now=1005.0)
    assert (d.verdict, d.gate.state, d.counts["absent_regressions"], d.next_expiry) == ("fail", "held", 1, 1105.0)
    meta = written(meta, d)
    # a restarted agent (no word of its own) reads the clock from the Node: still held, the same expiry
    restarted = reconcile.reconcile(meta, gap, ST, now=1050.0, own=None)
    assert (restarted.gate.state, restarted.next_expiry) == ("held", 1105.0)
    assert not nodeapply.plan("n", meta, restarted.keys).changed  # nothing new to say
    # absent for the quiet time: lifted
    late = reconcile.reconcile(meta, gap, ST, now=1106.0)
    assert (late.verdict, late.gate.state) == ("pass", "clear") and late.keys["labels"][SKIP_LABEL] is None


def test_a_skip_label_of_someone_elses_is_never_among_the_keys():
    theirs = {"labels": {SKIP_LABEL: "true"}, "annotations": {}}
    for f in (found(), found(regressing={}, present={"w1"})):
        d = reconcile.reconcile(theirs, f, ST, now=1000.0)
        assert d.gate.state == "skipped-by-other" and SKIP_LABEL not in d.keys["labels"]
        w = nodeapply.plan("n", dict(theirs, resourceVersion="5"), d.keys)
        assert SKIP_LABEL not in json.dumps(w.apply) and w.remove is None


def test_a_skip_label_taken_off_by_hand_is_remembered_on_the_node_across_a_restart():
    meta = written({}, reconcile.reconcile({}, found(), ST, now=1000.0))
    del meta["labels"][SKIP_LABEL]  # an admin pushes the node through
    d = reconcile.reconcile(meta, found(), ST, now=1010.0)
    assert (d.gate.state, d.gate.released_by, d.keys["annotations"][HOLD]) == ("released-by-other", "label", None)
    meta = written(meta, d)
    for own in (d.doc, None):  # the same process, or one restarted: not held again for these regressions
        again = reconcile.reconcile(meta, found(), ST, now=1020.0, own=own)
        assert again.gate.state == "released-by-other" and SKIP_LABEL not in again.keys["labels"]
    # a new regression is a new hold
    new = reconcile.reconcile(meta, found(regressing={"w1": "r/app:1", "w2": "r/other:2"}), ST, now=1030.0)
    assert new.gate.state == "held"


def test_a_release_is_honoured_by_the_process_that_saw_it_and_a_new_agent_starts_fresh():
    held = reconcile.reconcile({}, found(), ST, now=1000.0)
    meta = written({}, held)
    # `cluster release`: the hold's pair and the doc go
    del meta["labels"][SKIP_LABEL], meta["annotations"][HOLD], meta["annotations"][f"{P}/preflight"]
    seen = reconcile.reconcile(meta, found(), ST, now=1010.0, own=held.doc)
    assert (seen.gate.state, seen.gate.released_by, seen.doc["released_by"]) == ("released-by-other", "release",
                                                                                  "release")
    meta = written(meta, seen)
    assert reconcile.reconcile(meta, found(), ST, now=1020.0, own=seen.doc).gate.state == "released-by-other"
    # an agent installed again reads that doc as not its own (the module docstring says why): it holds
    assert reconcile.reconcile(meta, found(), ST, now=1030.0, own=None).gate.state == "held"


def test_a_release_binds_the_agents_of_the_installation_that_saw_it():
    mine = reconcile.Settings(**dict(reconcile.vars_of(ST), installation="ds-uid-1"))
    held = reconcile.reconcile({}, found(), mine, now=1000.0)
    meta = written({}, held)
    del meta["labels"][SKIP_LABEL], meta["annotations"][HOLD], meta["annotations"][f"{P}/preflight"]
    seen = reconcile.reconcile(meta, found(), mine, now=1010.0, own=held.doc)
    assert (seen.doc["released_by"], seen.doc["agent"]) == ("release", "ds-uid-1")
    meta = written(meta, seen)
    # restarted (or its pod replaced by a rollout): the same DaemonSet, the release stands
    restarted = reconcile.reconcile(meta, found(), mine, now=1020.0, own=None)
    assert restarted.gate.state == "released-by-other" and not nodeapply.plan("n", meta, restarted.keys).changed
    # installed again (another DaemonSet), or run by hand: fresh
    again = reconcile.Settings(**dict(reconcile.vars_of(ST), installation="ds-uid-2"))
    assert reconcile.reconcile(meta, found(), again, now=1030.0).gate.state == "held"
    assert reconcile.reconcile(meta, found(), ST, now=1030.0).gate.state == "held"


def test_too_late_takes_its_own_hold_off_and_sets_none():
    meta = written({}, reconcile.reconcile({}, found(), ST, now=1000.0))
    meta["labels"][STATE_LABEL] = "drain-required"
    d = reconcile.reconcile(meta, found(), ST, now=1010.0)
    assert d.gate.state == "too-late" and d.keys["labels"][SKIP_LABEL] is None and d.keys["annotations"][HOLD] is None


def test_an_incomplete_pass_keeps_a_hold_and_a_known_regression_holds_beside_an_unknown_workload():
    meta = written({}, reconcile.reconcile({}, found(), ST, now=1000.0))
    blind = found(regressing={}, present={"w1"}, judged=frozenset(), complete=False, verdict="unknown",
                  problems=("the store is unreachable",), current=True)
    d = reconcile.reconcile(meta, blind, ST, now=1010.0)
    assert d.gate.state == "held" and d.keys["labels"][SKIP_LABEL] == "true"
    beside = found(present={"w1", "w2"}, complete=False, unjudged=("app (ml/p c): envFrom",))
    d = reconcile.reconcile({}, beside, ST, now=1000.0)
    assert d.gate.state == "held" and "not judged: app (ml/p c): envFrom" in d.gate.message


# ----------------------------------------------------------------------------- the apply plan


def _mf(manager: str, operation: str, labels=(), annotations=()) -> dict:
    f = {}
    if labels:
        f["f:labels"] = {f"f:{k}": {} for k in labels}
    if annotations:
        f["f:annotations"] = {f"f:{k}": {} for k in annotations}
    return {"manager": manager, "operation": operation, "fieldsV1": {"f:metadata": f}}


def test_a_fresh_node_gets_one_apply_of_every_key_and_nothing_is_forced():
    d = reconcile.reconcile({}, found(), ST, now=1000.0)
    w = nodeapply.plan("gpu-a", {"resourceVersion": "7", "labels": {"team": "a"}}, d.keys)
    assert w.remove is None and not w.force
    m = w.apply["metadata"]
    assert (w.apply["kind"], m["name"], m["resourceVersion"]) == ("Node", "gpu-a", "7")  # conditional
    assert set(m["labels"]) == {f"{P}/preflight", f"{P}/preflight.broken", f"{P}/preflight.target-driver", SKIP_LABEL}
    assert set(m["annotations"]) == {f"{P}/preflight", HOLD} and "team" not in m["labels"]


def test_a_key_only_the_agent_applied_goes_by_leaving_it_out_and_every_other_stays_in_the_body():
    keys = [f"{P}/preflight", SKIP_LABEL]
    meta = {"resourceVersion": "8", "labels": {f"{P}/preflight": "fail", SKIP_LABEL: "true", "team": "a"},
            "annotations": {HOLD: "x"}, "managedFields": [_mf("compat-hook-agent", "Apply", keys, [HOLD]),
                                                          _mf("admin", "Update", ["team"])]}
    w = nodeapply.plan("n", meta, {"labels": {f"{P}/preflight": "pass", SKIP_LABEL: None},
                                   "annotations": {HOLD: None}})
    assert w.remove is None and not w.force
    assert w.apply["metadata"]["labels"] == {f"{P}/preflight": "pass"} and "annotations" not in w.apply["metadata"]


def test_keys_another_manager_owns_go_by_one_patch_with_the_holds_pair_together():
    meta = {"resourceVersion": "9", "labels": {f"{P}/preflight": "fail", SKIP_LABEL: "true"},
            "annotations": {HOLD: "x"},
            "managedFields": [_mf("compat-hook", "Update", [f"{P}/preflight", SKIP_LABEL], [HOLD])]}
    w = nodeapply.plan("n", meta, {"labels": {f"{P}/preflight": "pass", SKIP_LABEL: None},
                                   "annotations": {HOLD: None}})
    assert w.remove == {"metadata": {"resourceVersion": "9", "labels": {SKIP_LABEL: None},
                                     "annotations": {HOLD: None}}}
    # the verdict changes on a key an older agent's merge patch owns: forced (it is compat-hook's)
    assert w.apply["metadata"]["labels"] == {f"{P}/preflight": "pass"} and w.force
    # the same value on a key someone else owns too: no write at all
    assert not nodeapply.plan("n", meta, {"labels": {f"{P}/preflight": "fail"}, "annotations": {}}).changed


def test_keys_the_agent_applied_that_it_no_longer_decides_are_kept():
    """A changed label prefix: what the agent applied under the former one (a hold too) is not taken
    off by omission; `cluster release --prefix FORMER` removes it."""
    old = ["old.io/preflight", SKIP_LABEL]
    meta = {"resourceVersion": "3", "labels": {"old.io/preflight": "fail", SKIP_LABEL: "true"},
            "annotations": {"old.io/holds-upgrade": "x"},
            "managedFields": [_mf("compat-hook-agent", "Apply", old, ["old.io/holds-upgrade"])]}
    w = nodeapply.plan("n", meta, {"labels": {f"{P}/preflight": "fail"}, "annotations": {}})
    assert w.remove is None
    assert w.apply["metadata"]["labels"] == {"old.io/preflight": "fail", SKIP_LABEL: "true", f"{P}/preflight": "fail"}
    assert w.apply["metadata"]["annotations"] == {"old.io/holds-upgrade": "x"}


def test_owners_reads_managed_fields_and_ignores_odd_entries():
    meta = {"managedFields": [None, {"manager": "m"}, _mf("a", "Apply", ["x"], ["y"]), _mf("b", "Update", ["x"]),
                              {"manager": "c", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": []}}}]}
    assert nodeapply.owners(meta) == {("labels", "x"): {("a", "Apply"), ("b", "Update")},
                                      ("annotations", "y"): {("a", "Apply")}}


def test_the_gate_table_is_total_and_only_two_of_its_cells_take_a_hold_of_ours_off():
    """The gate's table (need x owner) has one action per cell, and what lifts a hold of ours is what the
    module says: a complete pass without a regression (``lift``), or the label taken off by hand
    (``unmark``); everything else that lifts one (the gate off, the override, the upgrade begun) comes
    before the table, and an incomplete pass keeps it."""
    from compat_hook.cluster.node import gate

    assert set(gate.TABLE) == {(n, o) for n in gate.NEEDS for o in gate.OWNERS}
    assert {a for a in gate.TABLE.values()} == {"hold", "keep", "lift", "clear", "leave", "unmark", "not-again"}
    assert {k for k, a in gate.TABLE.items() if a == "lift"} == {("no", "ours")}
    assert {k for k, a in gate.TABLE.items() if a == "unmark"} == {(n, "taken") for n in gate.NEEDS}
    assert gate.TABLE["unknown", "ours"] == "keep" and gate.TABLE["yes", "ours"] == "hold"
    # each cell, through decide(): a hold of ours loses its label only where the table lifts it
    ours = {"labels": {SKIP_LABEL: "true", STATE_LABEL: "upgrade-required"}, "annotations": {"p/holds-upgrade": "w"}}
    for verdict, complete in (("fail", True), ("fail", False), ("pass", True), ("warn", False), ("unknown", False)):
        g = gate.decide(ours, verdict=verdict, complete=complete, why="w", enabled=True, prefix="p")
        lifted = g.labels.get(SKIP_LABEL, "kept") is None
        assert lifted == (gate.TABLE[gate.need(verdict, complete), "ours"] == "lift"), (verdict, complete, g.state)
