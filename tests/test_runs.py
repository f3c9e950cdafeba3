"""One model of what runs (compat_hook/cluster/workload/runs.py), shared with the NRI plugin's routing.

``packaging/nri/testdata/routing-cases.json`` is one table: each pod (its annotations, its
container's env, resources and claims), what the engine hands the plugin for it (CDI devices,
device nodes, the device plugin's env or annotations), whether it is a GPU container and why, and
whether the plugin routes it with which of the pod's ``compat-hook/*`` annotations. The Python
model is checked against it here, the plugin's ``gpuReason`` and ``CreateContainer`` by its own
``go test`` on the same file (run here too).

Then the agent's own parts on one node, as a pass runs them: the registration its installer wrote
(``agent.registration``, the Node label as the fallback), the node's pods built into workloads
(``pods.build``) and assessed against real images in a docker-archive store (``predict.assess``,
``plan``'s policy layer) on a fake R535 host with a target of R580. On an NRI node a pod that gets
its GPU only from NVIDIA's annotation and a plain GPU pod are predicted as the plugin runs them:
through compat-hook, so the compat 550 image their ``LD_LIBRARY_PATH`` names does not break on R580.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from compat_hook.cluster.node import agent
from compat_hook.cluster.workload import pods, predict, refs, runs, workloads
from compat_hook.core.config import from_mapping
from tests.support.planimages import H100, images  # noqa: F401  (the module-scoped images fixture)
from tests.support.trees import write_fake_host
from tests.support.versions import HOST_535

REPO = pathlib.Path(__file__).resolve().parent.parent
TABLE = REPO / "packaging/nri/testdata/routing-cases.json"
TARGET = "580.95.05"
LD_COMPAT = {"name": "LD_LIBRARY_PATH", "value": "/usr/local/cuda/compat"}


def cases() -> list:
    return json.loads(TABLE.read_text())["cases"]


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["name"])
def test_the_model_answers_the_shared_routing_table(case):
    pod = case["pod"]
    [c] = pod["spec"]["containers"]
    assert runs.gpu_reason(pod, c) == case["reason"]
    assert (case["reason"] is not None) == case["gpu"] and refs.gpu_pod(pod) == case["gpu"]
    # the agent's workload model and the validator's record count the same containers
    running = dict(pod, status={"phase": "Running"})
    assert len(pods.build([running], ["cuda-compat"], registration="nri").items) == int(case["gpu"])
    assert len(workloads.from_pods([running])) == int(case["gpu"])
    on_nri = runs.runs(pod, runs.Node("nri", ["cuda-compat"]))
    if not case["gpu"]:
        assert on_nri == []
        return
    [r] = on_nri
    switches = {k: v for k, v in r.annotations.items() if k.startswith("compat-hook/")}
    assert (r.path, r.reached, switches) == ("nri", case["routed"], case["effective_nri"])
    # the RuntimeClass path: the runtime's pod_annotations list none of compat-hook's
    [r] = runs.runs(dict(pod, spec=dict(pod["spec"], runtimeClassName="cuda-compat")),
                    runs.Node("runtimeclass", ["cuda-compat"]))
    assert r.path == "runtimeclass" and r.reached and not any(k.startswith("compat-hook/") for k in r.annotations)


def test_the_table_covers_every_reason_and_both_answers():
    seen = cases()
    assert {c["reason"] for c in seen} == set(runs.REASONS) | {None}
    assert {c["routed"] for c in seen if c["gpu"]} == {True, False}
    assert {c["nri_reason"] for c in seen} >= {"cdi-device", "device", "env", "annotation", "pod-annotation", None}


@pytest.mark.slow
def test_the_plugins_go_tests_pass_on_the_same_table():
    """``go test`` of packaging/nri (TestRoutingTable reads the same file), with the Go the tests build by."""
    from tests.support import kubebuild

    out = kubebuild._go("test", "-count=1", "-v", "-run", "Routing|GPUReason|CreateContainer|Wins", ".",
                        cwd=REPO / "packaging/nri", timeout=1200)
    assert "--- PASS: TestRoutingTable" in out and "FAIL" not in out, out[-3000:]


# -- the agent's pure parts on one node --------------------------------------------------------------


@pytest.fixture
def node_cfg(tmp_path):
    host = write_fake_host(tmp_path / "host", version=HOST_535, gpus={"0000:17:00.0": H100})
    return from_mapping({"log_file": None, "nvml": "off", "host_root": str(host)})


def pod(name: str, *, annotations=None, resources=None, runtime_class=None) -> dict:
    c = {"name": "app", "image": "localhost/compat:v1", "env": [LD_COMPAT]}
    if resources:
        c["resources"] = resources
    spec = {"nodeName": "n", "containers": [c]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"metadata": {"name": name, "namespace": "ml", "annotations": annotations or {}}, "spec": spec,
            "status": {"phase": "Running"}}


NVIDIA_ONLY = pod("nvidia-only", annotations={"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=all"})
PLAIN = pod("plain", resources={"limits": {"nvidia.com/gpu": "1"}})
OPTED_OUT = pod("opted-out", resources={"limits": {"nvidia.com/gpu": "1"}},
                annotations={"compat-hook/disable": "true"}, runtime_class="cuda-compat")


def assessed(cfg, images, pod_list, registration) -> dict:  # noqa: F811
    """A pass's preflight: ``{pod: (runtime, path, regression)}``."""
    ws = pods.build(pod_list, agent.settings(cfg)["compat_runtime_classes"], "compat-hook", registration=registration)
    a = predict.assess(cfg, version=TARGET, workloads=ws, stores=[images["compat"]["docker"]], address=None,
                       namespace="k8s.io")
    assert not a.missing and not a.problems, (a.missing, a.problems)
    by_name = {r["name"]: r for r in a.rows}
    out = {}
    for w in ws.items:
        r = by_name[w["name"]]
        out[ws.pods[w["name"]][0].split("/")[1]] = (w["runtime"], w["path"], r["regression"])
    return out


def test_the_agent_on_an_nri_node_predicts_what_the_plugin_runs(images, node_cfg, tmp_path):  # noqa: F811
    reg_file = tmp_path / "registration"
    reg_file.write_text("nri\n")
    node = {"metadata": {"name": "n", "labels": {}}}
    registration = runs.reported(agent.registration(str(reg_file)), node, "compat-hook.io")
    assert registration == "nri"
    got = assessed(node_cfg, images, [NVIDIA_ONLY, PLAIN, OPTED_OUT], registration)
    # both routed by the plugin: compat-hook takes the compat dir their LD_LIBRARY_PATH names off on R580
    assert got["nvidia-only"] == ("compat-hook", "nri", False), got
    assert got["plain"] == ("compat-hook", "nri", False), got
    # the plugin sees the pod's compat-hook/disable and keeps away: the toolkit alone, 803 on R580
    assert got["opted-out"] == ("compat-hook", "nri", True), got


def test_the_node_label_says_the_path_when_the_agent_has_no_file(images, node_cfg):  # noqa: F811
    labelled = {"metadata": {"labels": {"compat-hook.io/registration": "runtimeclass"}}}
    registration = runs.reported(agent.registration(None), labelled, "compat-hook.io")
    assert registration == "runtimeclass"
    got = assessed(node_cfg, images, [NVIDIA_ONLY, PLAIN, OPTED_OUT], registration)
    # no RuntimeClass named: the toolkit alone, broken on R580
    assert got["nvidia-only"] == ("toolkit", "none", True) and got["plain"] == ("toolkit", "none", True), got
    # compat-hook's RuntimeClass: its runtime never sees the pod's annotation, so compat-hook decides
    assert got["opted-out"] == ("compat-hook", "runtimeclass", False), got


def test_compat_runtime_classes_stays_an_override():
    ws = pods.build([dict(PLAIN, spec=dict(PLAIN["spec"], runtimeClassName="mine"))], ["mine"],
                    registration="nri-not-connected")
    assert [(w["runtime"], w["path"]) for w in ws.items] == [("compat-hook", "runtimeclass")]
    ws = pods.build([PLAIN], ["cuda-compat"], registration="nri-not-connected")
    assert [(w["runtime"], w["path"]) for w in ws.items] == [("toolkit", "none")]


# -- DRA claims: judged by the driver they were allocated ---------------------------------------------


def _claim(name: str, *results, ns: str = "ml") -> dict:
    c = {"metadata": {"namespace": ns, "name": name}, "spec": {"devices": {"requests": [{"name": "gpu"}]}}}
    if results:
        c["status"] = {"allocation": {"devices": {"results": [
            {"request": req, "driver": drv, "pool": "n", "device": f"d{i}"} for i, (req, drv) in enumerate(results)]}}}
    return c


def _claimed(uses, entries, statuses=None, env=None) -> tuple:
    c = {"name": "app", "image": "a:1", "resources": {"claims": uses}}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env]
    p = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [c], "resourceClaims": entries},
         "status": {"phase": "Pending", "resourceClaimStatuses": statuses or []}}
    return p, c


CLAIMS = runs.Claims([
    _claim("gpu-claim", ("gpu", "gpu.nvidia.com")),
    _claim("nic-claim", ("gpu", "nic.example.com")),
    _claim("both", ("nic", "nic.example.com"), ("gpu/h100", "gpu.nvidia.com")),
    _claim("pending"),
    _claim("gpu-claim", ("gpu", "nic.example.com"), ns="other"),  # another namespace's claim of that name
])


@pytest.mark.parametrize("uses, entries, statuses, env, want", [
    pytest.param([{"name": "g"}], [{"name": "g", "resourceClaimName": "gpu-claim"}], None, None, "claim", id="nvidia"),
    pytest.param([{"name": "n"}], [{"name": "n", "resourceClaimName": "nic-claim"}], None, None, None, id="nic"),
    pytest.param([{"name": "n"}], [{"name": "n", "resourceClaimName": "nic-claim"}], None,
                 [("NVIDIA_VISIBLE_DEVICES", "all")], "env", id="nic-and-env"),
    pytest.param([{"name": "n"}, {"name": "g"}], [{"name": "n", "resourceClaimName": "nic-claim"},
                                                  {"name": "g", "resourceClaimName": "gpu-claim"}], None, None,
                 "claim", id="nic-and-nvidia"),
    pytest.param([{"name": "b", "request": "nic"}], [{"name": "b", "resourceClaimName": "both"}], None, None, None,
                 id="request-nic"),
    pytest.param([{"name": "b", "request": "gpu"}], [{"name": "b", "resourceClaimName": "both"}], None, None, "claim",
                 id="subrequest-nvidia"),
    pytest.param([{"name": "t"}], [{"name": "t", "resourceClaimTemplateName": "tpl"}],
                 [{"name": "t", "resourceClaimName": "gpu-claim"}], None, "claim", id="template-nvidia"),
    pytest.param([{"name": "t"}], [{"name": "t", "resourceClaimTemplateName": "tpl"}],
                 [{"name": "t", "resourceClaimName": "nic-claim"}], None, None, id="template-nic"),
    pytest.param([{"name": "t"}], [{"name": "t", "resourceClaimTemplateName": "tpl"}], [{"name": "t"}], None, None,
                 id="template-none-needed"),
    pytest.param([{"name": "t"}], [{"name": "t", "resourceClaimTemplateName": "tpl"}], None, None, "claim",
                 id="template-not-created"),
    pytest.param([{"name": "p"}], [{"name": "p", "resourceClaimName": "pending"}], None, None, "claim",
                 id="not-allocated"),
    pytest.param([{"name": "m"}], [{"name": "m", "resourceClaimName": "missing"}], None, None, "claim",
                 id="not-in-the-cache"),
])
def test_a_claim_is_a_gpu_by_the_driver_it_was_allocated(uses, entries, statuses, env, want):
    pod, c = _claimed(uses, entries, statuses, env)
    assert runs.gpu_reason(pod, c, claims=CLAIMS) == want
    # without the claims (none read) every claim counts, as the plugin would route a GPU's
    assert runs.gpu_reason(pod, c) == "claim"
    # the same answer wherever the model is asked: the pods the agent builds, the images it looks up,
    # the validator's record
    ws = pods.build([pod], ["cuda-compat"], claims=CLAIMS)
    assert [w["image"] for w in ws.items] == (["docker.io/library/a:1"] if want else [])
    assert refs.gpu_pod(pod, CLAIMS) is bool(want)
    assert len(workloads.from_pods([pod], claims=CLAIMS)) == (1 if want else 0)


def test_a_claims_index_is_bounded_and_survives_odd_objects():
    odd = [None, 3, {"metadata": None}, {"metadata": {"namespace": 1, "name": "x"}},
           {"metadata": {"namespace": "ml", "name": "gpu-claim"}, "status": {"allocation": {"devices": {"results": [
               None, {"driver": 5}, {"request": "gpu", "driver": "gpu.nvidia.com"}]}}}}]
    cs = runs.Claims(odd)
    assert len(cs) == 1
    pod, c = _claimed([{"name": "g"}], [{"name": "g", "resourceClaimName": "gpu-claim"}])
    assert runs.gpu_reason(pod, c, claims=cs) == "claim"
    assert len(runs.Claims([_claim(f"c{i}") for i in range(runs.MAX_CLAIMS + 5)])) == runs.MAX_CLAIMS


# -- the validator probes each workload on the road it takes -----------------------------------------


@pytest.mark.parametrize("registration, runtime_class, path, loads, probe_class", [
    # the plugin routes it: compat-hook takes the 550 compat dir its LD_LIBRARY_PATH names off on R580
    pytest.param("nri", None, "nri", "host", "cuda-compat", id="nri-plain"),
    pytest.param("runtimeclass", "cuda-compat", "runtimeclass", "host", "cuda-compat", id="compat-class"),
    # nothing of compat-hook's reaches it: the toolkit alone, the compat driver on R580 (803), as the pod runs
    pytest.param("runtimeclass", None, "none", "compat", None, id="runtimeclass-plain"),
    pytest.param("runtimeclass", "nvidia", "none", "compat", "nvidia", id="toolkit-class"),
])
def test_the_validator_probes_and_expects_what_the_workloads_path_gives(images, tmp_path, registration,  # noqa: F811
                                                                          runtime_class, path, loads, probe_class):
    """The validator's model of what runs is the agent's (runs.Node from the Node's registration and the
    config's compat_runtime_classes): its probe pod takes the workload's road, and what it expects the
    probe to load is what that road gives, from the real image."""
    from compat_hook.cluster.node import validate
    from compat_hook.facts import hostfacts

    host = write_fake_host(tmp_path / "host", version=TARGET, gpus={"0000:17:00.0": H100})
    cfg = from_mapping({"log_file": None, "nvml": "off", "host_root": str(host)})
    node = runs.Node(runs.reported(None, {"metadata": {"labels": {"compat-hook.io/registration": registration}}},
                                   "compat-hook.io"), agent.settings(cfg)["compat_runtime_classes"])
    w = {"image": "localhost/compat:v1", "source": images["compat"]["docker"], "runtime_class": runtime_class,
         "env": ["LD_LIBRARY_PATH=/usr/local/cuda/compat", "NVIDIA_VISIBLE_DEVICES=all"], "pods": ["ml/p"]}
    assert node.path_of(runtime_class) == path
    opts = validate.ValidatorOptions("n", probe_image="localhost/compat-hook:0.1.0")
    assert validate.probe_pod(opts, w, path)["spec"].get("runtimeClassName") == probe_class
    exp = validate.expectation(cfg, opts, w, hostfacts.gather(cfg), path=path)
    assert (exp["loads"], exp["problem"]) == (loads, None), exp
