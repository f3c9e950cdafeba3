"""Hostile input through the cluster half's loops, without a server: property tests (hypothesis).

What another node's agent, a tenant's image or an operator's file may say reaches compat-hook as
Node annotations and labels, a Lease, a probe pod's termination message, a state file or a
kubeconfig. Each is bounded before it is parsed (:mod:`compat_hook.core.safejson`,
:func:`compat_hook.cluster.api.kubeconfig.check_shape`), and the code that reads it answers for every
value: ``cluster status``'s rows and exit status (:func:`compat_hook.cluster.overview.status.report`, which
the fleet's rows share), the fleet's reconcile, the agent's reconcile and apply plan, the
validator's reading of a probe pod and its verdict, and the kubeconfig loader. No exception
escapes, and a value that cannot be read is the documented reason. The same on a real API server
is tests/test_hostile_cluster.py.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat_hook.cluster.overview import fleet, status

from compat_hook.cluster.api import kubeconfig

from compat_hook.cluster.node import nodeapply, reconcile, validate
from compat_hook.cluster.node.gate import OVERRIDE, SKIP_LABEL, STATE_LABEL
from compat_hook.core import safejson

P = "p.io"
DOC = f"{P}/preflight"
HOLD = f"{P}/holds-upgrade"
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- what a hostile writer sends

#: Any JSON value (bounded in size, not in type).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=12)


@st.composite
def nested(draw) -> str:
    """Deep nesting of the shapes a writer may choose, sometimes closed, sometimes inside a document."""
    n = draw(st.sampled_from([33, 100, 999, 1001, 5000, 30000, 100000]) | st.integers(0, 2000))
    opener = draw(st.sampled_from(["[", "{\"a\":", "[{\"a\":", "[\"x\","]))
    closer = {"[": "]", "{\"a\":": "}", "[{\"a\":": "}]", "[\"x\",": "]"}[opener]
    body = opener * n + "1" + (closer * n if draw(st.booleans()) else "")
    if draw(st.booleans()):
        body = '{"v": 2, "gate": "held", "held": ' + body + "}"
    return body


#: What a hostile annotation value can be: text, nested JSON, valid JSON of any shape.
hostile_text = (st.text(max_size=80) | nested() | json_values.map(json.dumps)
                | st.sampled_from(["NaN", "Infinity", "1" * 5000, '{"v": 2, "since": 1e999}', "\"\\", "{" * 64]))

#: The preflight doc's own keys, with values of any type.
DOC_KEYS = ["v", "verdict", "target", "from", "now", "gate", "since", "reasons", "key", "held", "released_by",
            "agent", "regressions", "counts", "interval", "details"]
schema_docs = st.dictionaries(st.sampled_from(DOC_KEYS), json_values, max_size=10).map(json.dumps)

HELD_DOCS = st.fixed_dictionaries({"v": st.just(2), "gate": st.sampled_from(["held", "clear", "released-by-other"]),
                                   "held": st.fixed_dictionaries({"target": st.just("470.256.02"), "w": st.dictionaries(
                                       st.text(min_size=1, max_size=16),
                                       st.lists(json_values, min_size=2, max_size=2), max_size=4)})}).map(json.dumps)

label_values = st.text(max_size=70) | st.sampled_from(["pass", "warn", "fail", "unknown", "true", "upgrade-required",
                                                       "upgrade-done", "nri", "12", "9999999"])


@st.composite
def hostile_meta(draw) -> dict:
    """A Node's metadata as a hostile agent (or anyone who may label a Node) leaves it."""
    labels = draw(st.dictionaries(st.sampled_from([f"{P}/preflight", f"{P}/preflight.broken", f"{P}/registration",
                                                   f"{P}/validated", f"{P}/preflight.target-driver", SKIP_LABEL,
                                                   STATE_LABEL, "nvidia.com/cuda.driver-version.full"]),
                                  label_values, max_size=8))
    labels["nvidia.com/gpu.present"] = "true"
    anns = draw(st.dictionaries(st.sampled_from([DOC, HOLD, f"{P}/{OVERRIDE}", f"{P}/next-driver"]),
                                hostile_text | schema_docs | HELD_DOCS, max_size=4))
    return {"name": draw(st.sampled_from(["gpu-a", "gpu-b"])), "labels": labels, "annotations": anns,
            "resourceVersion": "7"}


leases = st.none() | st.fixed_dictionaries({"spec": st.dictionaries(
    st.sampled_from(["renewTime", "leaseDurationSeconds", "acquireTime", "holderIdentity"]),
    json_values | st.sampled_from(["2026-12-07T04:00:00.000000Z", "9999-99-99T99:99:99Z"]) | st.integers(-1, 10 ** 30),
    max_size=4)}) | json_values


def _unreadable(meta: dict) -> str | None:
    """Why the node's doc cannot be read (None: it can, or there is none), by the shared bounds."""
    if DOC not in meta["annotations"]:
        return None
    return safejson.parse_object(meta["annotations"][DOC], max_bytes=status.MAX_ANNOTATION)[1]


# --------------------------------------------------------------------------- the bounded parser


@pytest.mark.slow
@SETTINGS
@given(json_values)
def test_safejson_reads_what_json_reads_within_its_bounds(v):
    text = json.dumps(v)
    got, reason = safejson.parse(text)
    assert (got, reason) == (v, None)
    assert safejson.depth(text) == _depth(v)


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


@pytest.mark.slow
@SETTINGS
@given(hostile_text | st.binary(max_size=300) | json_values)
def test_safejson_never_raises_and_says_why(text):
    value, reason = safejson.parse(text, max_bytes=4096, max_depth=16)
    assert reason in safejson.REASONS or (reason is None and safejson.depth(json.dumps(value)) <= 16)
    if reason is None:
        assert isinstance(text, (str, bytes))


def test_safejson_refuses_the_deep_document_before_the_parser_sees_it():
    for text in ("[" * 100000, "[" * 60000 + "]" * 60000, '{"a":' * 10000 + "1" + "}" * 10000):
        assert safejson.parse(text, max_bytes=1 << 20) == (None, "too_deep")
    # brackets inside strings are not nesting; an escaped quote does not end a string
    assert safejson.parse(json.dumps({"a": "[" * 1000 + '\\"' + "{" * 1000}))[1] is None
    assert safejson.parse("[1]" * 3)[1] == "not_json" and safejson.parse('"\\u0000"') == ("\0", None)


# --------------------------------------------------------------------------- cluster status, the fleet


@pytest.mark.slow
@SETTINGS
@given(st.lists(hostile_meta(), min_size=1, max_size=3), st.lists(leases, max_size=3),
       st.floats(min_value=0, max_value=4e9))
def test_status_rows_whatever_the_nodes_say(metas, lease_docs, now):
    nodes = [{"metadata": m} for m in metas]
    named = [dict(lv, metadata={"name": m["name"]}) if isinstance(lv, dict) else lv
             for m, lv in zip(metas, lease_docs)]
    rep = status.report(nodes, [x for x in named if isinstance(x, dict)], [], [], P, now=now)
    assert len(rep["nodes"]) == len(nodes)  # one row per GPU node, whatever its keys
    rc = status.exit_status(rep["nodes"])
    assert rc in (0, 2, 3, 5)
    text = status.render_text(rep)
    assert len(text.splitlines()) == len(nodes) + 2
    json.dumps(rep)  # --json
    for m, row in zip(sorted(metas, key=lambda m: m["name"]), rep["nodes"]):
        why = _unreadable(m)
        if why is not None:  # the documented answer: no verdict to act on, and why
            assert (row["verdict"], row["reason"], rc != 0) == ("unknown", "preflight_unreadable", True), row
            assert row["note"].startswith(f"unknown: preflight annotation unreadable: {why}"), row
        assert row.get("reason") != "row_error", row  # every shape foreseen: its documented reason
        assert (row["reason"] is None) == (row["verdict"] in ("pass", "warn", "fail") and not row["stale"]
                                           and (row["verdict"] == "pass" or row["complete"])), row


@pytest.mark.slow
@SETTINGS
@given(st.lists(hostile_meta(), min_size=1, max_size=3), st.floats(min_value=0, max_value=4e9))
def test_the_fleet_judges_hostile_nodes_and_never_passes_an_unreadable_one(metas, now):
    nodes = tuple({"metadata": m} for m in metas)
    cp = {"metadata": {"name": "cluster-policy"}, "spec": {"driver": {"version": "570.195.03"}}}
    data = fleet.reconcile(fleet.Snapshot(nodes=nodes, leases={}, policies=(cp,), now=now), P)
    if any(_unreadable(m) for m in metas):
        for key in ("clusterpolicy_cluster-policy_570.195.03", "driver_570.195.03"):
            assert data[key] != fleet.OK, data


def test_status_of_the_issue_s_node():
    """``compat-hook.io/preflight: "[[[[..."`` (100000 of them) with a ``pass`` label: unknown, exit 2."""
    node = {"metadata": {"name": "gpu-x", "labels": {"nvidia.com/gpu.present": "true", f"{P}/preflight": "pass"},
                         "annotations": {DOC: "[" * 100000}}}
    deep = {"metadata": {"name": "gpu-y", "labels": {"nvidia.com/gpu.present": "true", f"{P}/preflight": "pass"},
                         "annotations": {DOC: "[" * 5000 + "]" * 5000}}}
    rep = status.report([node, deep], [], [], [], P, now=0.0)
    assert [(r["name"], r["preflight"], r["note"].split(";")[0]) for r in rep["nodes"]] == [
        ("gpu-x", "unknown", "unknown: preflight annotation unreadable: too_large"),
        ("gpu-y", "unknown", "unknown: preflight annotation unreadable: too_deep")]
    assert status.exit_status(rep["nodes"]) == 2


# --------------------------------------------------------------------------- the agent's reconcile


COUNTS = {"workloads": 1, "assessed": 1, "regressions": 0, "broken_now_and_after": 0, "changed": 0,
          "unreadable": 0, "unknown_workloads": 0, "not_in_store": 0, "pods": 1}


def _found(regressing: bool, current: bool) -> reconcile.Findings:
    reg = {"w1": "r/app:1"} if regressing else {}
    return reconcile.Findings(counts=dict(COUNTS, regressions=len(reg)), problems=(), reasons=(), complete=True,
                              verdict="fail" if reg else "pass", regressing=reg, judged=frozenset({"w1"}),
                              present=frozenset({"w1"}), unjudged=(), target="470.256.02", target_from="--driver",
                              now="535.1", blocked=None, current=current)


@pytest.mark.slow
@SETTINGS
@given(hostile_meta(), st.booleans(), st.booleans(), st.booleans(), st.floats(min_value=0, max_value=4e9))
def test_the_agent_reconciles_whatever_its_node_says(meta, regressing, current, gate_on, now):
    st_ = reconcile.Settings(prefix=P, gate=gate_on, quiet=100.0, interval=300.0, details="ns/n")
    d = reconcile.reconcile(meta, _found(regressing, current), st_, now=now)
    if _unreadable(meta) is not None:
        assert d.previous is None  # an unreadable doc is no previous word
    assert d.verdict in ("pass", "warn", "fail", "unknown")
    # what it writes is its own well-formed doc, whatever it read
    doc, why = safejson.parse_object(d.keys["annotations"][DOC])
    assert why is None and doc["v"] == 2 and doc == d.doc
    for kind in ("labels", "annotations"):
        assert all(v is None or isinstance(v, str) for v in d.keys[kind].values())
    w = nodeapply.plan("gpu-a", meta, d.keys)
    json.dumps(w.apply)


@pytest.mark.slow
@SETTINGS
@given(hostile_text | schema_docs | json_values)
def test_the_agent_reads_any_details_configmap(raw):
    from compat_hook.cluster.node import applyintent, detailscm

    cm = {"data": {detailscm.DETAILS_KEY: raw}}
    got = detailscm.details_of(cm)
    assert got is None or isinstance(got, dict)
    assert isinstance(applyintent.details_of(cm), dict)


# --------------------------------------------------------------------------- the validator


CODES = {"ok", "no_expectation", "no_probe_result", "no_libcuda", "two_libcuda", "wrong_libcuda", "driver_api_failed",
         "insufficient_driver", "minor_version_compatibility", "cuinit_failed"}
EXPECT = st.fixed_dictionaries({"loads": st.sampled_from([None, "host", "compat", "store"]),
                                "compat_version": st.sampled_from([None, "550.163.01"]),
                                "compat_dir": st.sampled_from([None, "/usr/local/cuda/compat"]),
                                "needs": st.sampled_from([None, "12.4", "11.8", "x.y", "13"]),
                                "problem": st.sampled_from([None, "unreadable"])})
def _marker(_nested: str) -> str:
    return "NESTED"  # replaced by the nested text once the doc is dumped (json.dumps would escape it)


probe_docs = st.fixed_dictionaries({"probe": st.sampled_from([1, 1, 2, "1"])}, optional={
    k: json_values | nested().map(_marker) for k in
    ("libcuda", "loaded_as", "glibc", "error", "driver_api", "driver_api_rc", "cuinit", "gpu", "maps")})


@st.composite
def probe_output(draw) -> str:
    """What a tenant's image (its libcuda, its loader) may make the probe's termination message say."""
    doc = json.dumps(draw(probe_docs))
    if "NESTED" in doc:
        doc = doc.replace('"NESTED"', draw(nested()), 1)
    prefix = draw(st.sampled_from(["", "warning: x\n", "{", "[[[["]))
    return draw(st.sampled_from([prefix + doc, doc[: draw(st.integers(0, len(doc)))], draw(hostile_text)]))


@pytest.mark.slow
@SETTINGS
@given(probe_output(), EXPECT, st.booleans())
def test_the_validator_judges_any_probe_output(text, expect, unjudged_ok):
    p = validate.parse_probe(text)
    if p is not None:  # only checked fields, of their types
        assert all(p[k] is None or isinstance(p[k], str) for k in ("libcuda", "loaded_as", "glibc", "error"))
        assert all(p[k] is None or (isinstance(p[k], int) and not isinstance(p[k], bool))
                   for k in ("driver_api", "driver_api_rc", "cuinit"))
        assert all(isinstance(m, str) for m in p["maps"])
    v = validate.judge(expect, p, unjudged_ok=unjudged_ok)
    assert isinstance(v["ok"], bool) and v["code"] in CODES and isinstance(v["message"], str)
    if p is None or (expect["loads"] is None and not unjudged_ok):
        assert not v["ok"]  # nothing proven: fails closed


def test_the_issue_s_nested_probe_output_is_no_result():
    text = '{"probe": 1, "maps": ' + "[" * 3000 + "]" * 3000 + "}"
    assert validate.parse_probe(text) is None
    assert validate.judge({"loads": "host"}, validate.parse_probe(text))["code"] == "no_probe_result"


pod_status = st.recursive(json_values, lambda inner: st.fixed_dictionaries({}, optional={
    "phase": json_values | st.sampled_from(["Succeeded", "Failed", "Pending"]),
    "containerStatuses": st.lists(st.fixed_dictionaries({}, optional={
        "name": st.sampled_from(["probe", "stage", 7]),
        "state": st.dictionaries(st.sampled_from(["waiting", "terminated"]), st.dictionaries(
            st.sampled_from(["reason", "message", "exitCode"]), json_values | probe_output(), max_size=3)) | inner}))
    | inner, "initContainerStatuses": inner}), max_leaves=5)


@pytest.mark.slow
@SETTINGS
@given(pod_status)
def test_the_validator_reads_any_probe_pod(st_doc):
    phase, waiting, message = validate._pod_state({"status": st_doc})
    assert phase is None or isinstance(phase, str)
    assert waiting is None or isinstance(waiting, str)
    validate.parse_probe(message)


@pytest.mark.slow
@SETTINGS
@given(hostile_text | json_values.map(json.dumps) | st.fixed_dictionaries(
    {"driver": json_values, "result": st.sampled_from(["pass", "fail", 3]), "epoch": json_values,
     "images": json_values}).map(json.dumps))
def test_the_validator_reads_any_state_file(tmp_path_factory, text):
    d = tmp_path_factory.mktemp("st")
    (d / validate.STATE_FILE).write_text(text)
    state = validate._load_state(validate.ValidatorOptions("n", state_dir=str(d)))
    assert state == {} or (isinstance(state["driver"], str) and state["result"] in ("pass", "fail")
                           and isinstance(state["epoch"], (int, float)) and isinstance(state["images"], list))


def test_a_validation_the_validator_could_not_finish_fails():
    r = validate.failed("570.195.03", RecursionError("maximum recursion depth exceeded"))
    assert (r["result"], r["code"]) == ("fail", "validator_error")
    assert validate.taints_after([], P, r["driver"], r["result"] != "pass") == [
        {"key": f"{P}/validation-failed", "value": "570.195.03", "effect": "NoSchedule"}]
    assert validate.event_message(r["driver"], r["images"], r["problem"]).startswith(
        "driver 570.195.03: validation failed: validator_error: RecursionError")


# --------------------------------------------------------------------------- kubeconfigs


GOOD = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}


@st.composite
def kubeconfig_text(draw) -> str:
    import yaml

    kind = draw(st.sampled_from(["good", "typed", "nested", "block", "dashes", "aliases", "text"]))
    n = draw(st.sampled_from([10, 33, 200, 1000, 20000]))
    if kind == "good":
        return yaml.safe_dump(GOOD)
    if kind == "typed":  # the right keys, values of any type
        doc = {k: draw(json_values | st.just(v)) for k, v in GOOD.items()}
        return yaml.safe_dump(doc) if draw(st.booleans()) else json.dumps(doc)
    if kind == "nested":
        return "users: " + "[" * n + "]" * n * draw(st.integers(0, 1))
    if kind == "block":
        return "users:\n" + "".join(" " * i + "- a:\n" for i in range(0, 2 * n, 2))
    if kind == "dashes":
        return "clusters:\n" + "- " * n + "x\n"
    if kind == "aliases":  # a billion laughs
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
        return "\n".join(lines) + "\n"
    return draw(st.text(max_size=300))


@pytest.mark.slow
@SETTINGS
@given(kubeconfig_text())
def test_any_kubeconfig_is_loaded_or_one_line(tmp_path_factory, text):
    f = tmp_path_factory.mktemp("kc") / "config"
    f.write_text(text)
    try:
        merged, name, _ = kubeconfig.load(str(f), None)
    except kubeconfig.KubeconfigError as e:
        assert "\n" not in str(e), e
        return
    assert name in [c["name"] for c in merged["contexts"]]


@pytest.mark.parametrize("text, needle", [
    ("users: " + "[" * 100000, "nested deeper than 32 levels"),
    ("users:\n" + "".join(" " * i + "- a:\n" for i in range(0, 400, 2)), "nested deeper than 32 levels"),
    ("\n".join(["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 40)]),
     "more than 64 YAML aliases"),
])
def test_a_hostile_kubeconfig_is_refused_before_it_is_built(tmp_path, text, needle):
    f = tmp_path / "config"
    f.write_text(text)
    with pytest.raises(kubeconfig.KubeconfigError, match=needle):
        kubeconfig.load(str(f), None)
