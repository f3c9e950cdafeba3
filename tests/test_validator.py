"""The validator's parts without a cluster: the probe on an old glibc, the verdict, the workload record,
the probe pod, the chart's validator objects and the command line.

The validator on a real node (probe pods through compat-hook's RuntimeClass, the Node's label, the
Event, readiness) is tests/test_node_validator.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
import yaml

from compat_hook.cluster.node import validate

from compat_hook.cluster.workload import workloads
from compat_hook.cluster.node.validate import ValidatorOptions, judge, parse_probe, probe_pod
from tests.support import debs, rootfs
from tests.support.versions import COMPAT_550, HOST_535, HOST_555, OLD_GLIBC

REPO = pathlib.Path(__file__).resolve().parent.parent
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


# --------------------------------------------------------------------------- the probe


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> pathlib.Path:
    """compat-hook-probe as the image gets it (packaging/oci-image/stage-probe.sh, which checks the
    ELF asks for no symbol version newer than GLIBC_2.3)."""
    root = tmp_path_factory.mktemp("probe-stage")
    p = subprocess.run([str(REPO / "packaging/oci-image/stage-probe.sh"), str(root)], capture_output=True, text=True,
                       env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    return root / "usr/local/libexec/compat-hook-probe"


def _old_root(dest: pathlib.Path, probe: pathlib.Path, compat: pathlib.Path | None) -> pathlib.Path:
    """A root with bullseye's glibc 2.31 only (dlopen still in libdl.so.2), the probe, and a compat libcuda."""
    shutil.copytree(debs.old_libc(), dest, symlinks=True)
    for d in ("opt", "proc", "dev", "usr/local/cuda/compat"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(probe, dest / "opt/probe")
    shutil.copy(rootfs.probe_binary(), dest / "opt/tests-probe")  # built the ordinary way, for contrast
    if compat is not None:
        rootfs.install_libcuda(dest, compat, "usr/local/cuda/compat")
    return dest


def _run_in(root: pathlib.Path, argv: list, env: dict) -> subprocess.CompletedProcess:
    script = 'mount -t proc proc "$1/proc" && exec chroot "$@"'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", str(root),
                           *argv], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.containers
def test_the_probe_runs_on_an_old_glibc_and_names_what_the_loader_took(probe, tmp_path):
    root = _old_root(tmp_path / "root", probe, debs.libcuda(COMPAT_550))
    p = _run_in(root, ["/opt/probe"], {"LD_LIBRARY_PATH": "/usr/local/cuda/compat"})
    assert p.returncode == 0, p.stdout + p.stderr
    got = parse_probe(p.stdout)
    lib = f"/usr/local/cuda/compat/libcuda.so.{COMPAT_550}"
    assert got["glibc"] == OLD_GLIBC and got["libcuda"] == lib and got["maps"] == [lib], got
    assert got["loaded_as"] == "/usr/local/cuda/compat/libcuda.so.1"
    assert got["driver_api"] == debs.EXPECTED_CUDA[COMPAT_550] and got["driver_api_rc"] == 0
    assert got["gpu"] is False and got["cuinit"] is None and got["error"] is None  # no GPU: no cuInit
    # the same root without the compat dir on the path: nothing to load, said, and still exit 0
    p = _run_in(root, ["/opt/probe"], {})
    got = parse_probe(p.stdout)
    assert p.returncode == 0 and got["libcuda"] is None and "libcuda.so.1" in got["error"], p.stdout
    # a program built the ordinary way on this machine does not even start there
    p = _run_in(root, ["/opt/tests-probe"], {"LD_LIBRARY_PATH": "/usr/local/cuda/compat"})
    assert p.returncode != 0 and "GLIBC_2.34" in p.stderr, p.stderr


@pytest.mark.containers
def test_the_probe_reports_the_host_library_and_escapes_its_path(probe, tmp_path):
    root = _old_root(tmp_path / "root", probe, None)
    odd = root / 'usr/lib/x86_64-linux-gnu/dir "x"\\y'
    rootfs.install_libcuda(root, debs.libcuda(HOST_555), str(odd.relative_to(root)))
    p = _run_in(root, ["/opt/probe"], {"LD_LIBRARY_PATH": "/" + str(odd.relative_to(root))})
    got = parse_probe(p.stdout)
    assert got is not None, p.stdout
    assert got["libcuda"] == f"/{odd.relative_to(root)}/libcuda.so.{HOST_555}"
    assert got["driver_api"] == debs.EXPECTED_CUDA[HOST_555]


# --------------------------------------------------------------------------- the verdict

COMPAT = {"loads": "compat", "compat_version": COMPAT_550, "compat_dir": "/usr/local/cuda-12.4/compat", "needs": "12.4"}
HOST = dict(COMPAT, loads="host")
UNKNOWN = {"loads": None, "compat_version": None, "compat_dir": None, "needs": None}
COMPAT_LIB = f"/usr/local/cuda-12.4/compat/libcuda.so.{COMPAT_550}"
HOST_LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"


def _probe(lib=HOST_LIB, api=12050, **kw) -> dict:
    return dict({"libcuda": lib, "driver_api": api, "driver_api_rc": 0, "maps": [lib], "gpu": False,
                 "cuinit": None, "error": None}, **kw)


@pytest.mark.parametrize("expect,probe,ok,code", [
    (COMPAT, _probe(COMPAT_LIB, 12040), True, "ok"),
    (COMPAT, _probe(HOST_LIB, 12020), False, "wrong_libcuda"),           # compat decided, host loaded
    (HOST, _probe(COMPAT_LIB, 12040), False, "wrong_libcuda"),           # host decided, the image's compat loaded
    (HOST, _probe(HOST_LIB, 12050), True, "ok"),
    (HOST, _probe(HOST_LIB, 12020), True, "minor_version_compatibility"),  # 12.2 < 12.4: same major
    (HOST, _probe(HOST_LIB, 11040), False, "insufficient_driver"),       # R470 under CUDA 12.4: error 35
    (HOST, _probe(HOST_LIB, 12050, gpu=True, cuinit=803), False, "cuinit_failed"),
    (HOST, _probe(HOST_LIB, 12050, gpu=True, cuinit=0), True, "ok"),
    (HOST, _probe(HOST_LIB, 12050, gpu=False, cuinit=100), True, "ok"),   # no GPU: cuInit never counts
    (HOST, _probe(HOST_LIB, 12050, maps=[HOST_LIB, COMPAT_LIB]), False, "two_libcuda"),
    (HOST, _probe(None, None, error="libcuda.so.1: cannot open shared object file"), False, "no_libcuda"),
    (HOST, _probe(HOST_LIB, None, driver_api_rc=3), False, "driver_api_failed"),
    (HOST, None, False, "no_probe_result"),
    # no decision to compare with (the image could not be read): it fails closed, whatever the probe saw
    (UNKNOWN, _probe(HOST_LIB, 11040), False, "no_expectation"),
    (UNKNOWN, _probe(HOST_LIB, 12050), False, "no_expectation"),
])
def test_judge(expect, probe, ok, code):
    got = judge(expect, probe)
    assert (got["ok"], got["code"]) == (ok, code), got
    assert got["message"] and "\n" not in got["message"]


def test_judge_without_a_decision_passes_only_when_the_config_allows_it():
    """cluster.validation_allow_unverified: the probe's own checks alone (the old, looser judgement)."""
    got = judge(UNKNOWN, _probe(HOST_LIB, 11040), unjudged_ok=True)
    assert (got["ok"], got["code"]) == (True, "ok"), got
    got = judge(UNKNOWN, _probe(None, None, error="no libcuda"), unjudged_ok=True)
    assert (got["ok"], got["code"]) == (False, "no_libcuda"), got
    got = judge(dict(UNKNOWN, problem="containerd: connection refused"), None)
    assert got["code"] == "no_expectation" and "containerd: connection refused" in got["message"], got


@pytest.mark.parametrize("taints,failed,enabled,want", [
    ([], True, True, [{"key": "compat-hook.io/validation-failed", "value": "470.256.02", "effect": "NoSchedule"}]),
    ([], True, False, None),                                   # validation_taint: false
    ([], False, True, None),                                   # a pass: nothing to remove
    ([{"key": "x", "effect": "NoExecute"}, {"key": "compat-hook.io/validation-failed", "value": "1", "effect": "NoSchedule"}],
     False, True, [{"key": "x", "effect": "NoExecute"}]),      # a pass removes ours and keeps theirs
    ([{"key": "compat-hook.io/validation-failed", "value": "470.256.02", "effect": "NoSchedule"}], True, True, None),
])
def test_the_validation_failed_taint(taints, failed, enabled, want):
    assert validate.taints_after(taints, "compat-hook.io", "470.256.02", failed, enabled) == want


@pytest.mark.parametrize("text", [
    None, "", "[]", "{}", '{"probe": 2}', '{"probe": 1, "libcuda": 5}', '{"probe": 1, "driver_api": true}',
    '{"probe": 1, "driver_api": 1.5}', '{"probe": 1, "maps": "x"}', "{" * 100000, '{"probe": 1' + " " * 70000 + "}",
    '{"probe": 1, "driver_api": ' + "9" * 5000 + "}", "\x00\xff",
])
def test_parse_probe_refuses_what_is_not_a_probe_result(text):
    got = parse_probe(text)
    assert got is None or (got["driver_api"] is None and got["libcuda"] is None and got["maps"] == [])


def test_parse_probe_keeps_fields_bounded():
    got = parse_probe(json.dumps({"probe": 1, "libcuda": "x" * 5000, "maps": ["m"] * 100 + [3], "gpu": "yes"}))
    assert len(got["libcuda"]) == 1024 and len(got["maps"]) == 8 and got["gpu"] is False


def test_event_message_names_the_failing_images_and_stays_bounded():
    rows = [{"image": f"registry.test/app{i}:1", "pods": [f"ml/p{i}"], "ok": i % 2 == 1, "message": "why " * 10}
            for i in range(100)]
    msg = validate.event_message(HOST_535, rows)
    assert msg.startswith(f"driver {HOST_535}: 50 of 100 workload image(s) failed validation: registry.test/app0:1 "
                          "(pods ml/p0)")
    assert len(msg) <= validate.MAX_EVENT and "app1:1" not in msg


# --------------------------------------------------------------------------- the probe pod


def test_the_probe_pod_is_pinned_bounded_and_never_one_of_the_chart_s():
    o = ValidatorOptions("gpu-a.example", probe_image="localhost/compat-hook:0.1.0", runtime_class="cuda-compat",
                         probe_timeout=77, publish_namespace="gpu-ops")
    w = {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "runtime_class": "nvidia", "pods": ["ml/a"],
         "env": ["NVIDIA_VISIBLE_DEVICES=GPU-1", "CUDA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=GPU-2"]}
    pod = probe_pod(o, w)
    spec, meta = pod["spec"], pod["metadata"]
    assert meta["namespace"] == "gpu-ops" and len(meta["name"]) <= 63
    # the chart's DaemonSets select app.kubernetes.io/name=compat-hook(-validator): a probe pod is neither
    assert meta["labels"]["app.kubernetes.io/name"] == workloads.PROBE_NAME
    assert "app" not in meta["labels"]  # not app=nvidia-operator-validator: the upgrade does not wait for it
    assert spec["nodeName"] == "gpu-a.example" and spec["runtimeClassName"] == "cuda-compat"
    assert spec["activeDeadlineSeconds"] == 77 and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False and not spec.get("hostNetwork") and not spec.get("hostPID")
    assert all("hostPath" not in v for v in spec["volumes"])
    keys = {(t.get("key"), t.get("effect")) for t in spec["tolerations"]}
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in keys and ("nvidia.com/gpu", None) in keys
    (c,) = spec["containers"]
    assert c["image"] == w["image"] and c["imagePullPolicy"] == "Never"  # never pulls
    assert c["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-1"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]
    assert "resources" in c and "limits" in c["resources"] and not any("nvidia.com" in k for k in c["resources"]["limits"])
    (init,) = spec["initContainers"]
    assert init["image"] == "localhost/compat-hook:0.1.0" and init["command"][1] == validate.PROBE_BINARY
    # no GPU env in the workload: the runtime is asked for one, as the device plugin would
    assert probe_pod(o, dict(w, env=[]))["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                              "value": "all"}]
    # or the device plugin gives it one (the runtime ignores an unprivileged pod's env there)
    o.gpu_resource = "nvidia.com/gpu"
    c = probe_pod(o, dict(w, env=[]))["spec"]["containers"][0]
    assert c["env"] == [] and c["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_a_probe_pod_claims_its_gpu_where_gpus_come_only_from_dra_claims():
    """``--claim-template`` (``validator.deviceClass``): the GPU from a claim of the chart's template, which only
    the scheduler allocates: no nodeName, a required node affinity naming the node alone, the taints it would
    meet tolerated (the cordon, the GPU's, compat-hook's own on a failed node, under the config's prefix)."""
    o = ValidatorOptions("gpu-a.example", probe_image="localhost/compat-hook:0.1.0", publish_namespace="gpu-ops",
                         claim_template="compat-hook-probe-gpu", taint_key="p.example/validation-failed")
    w = {"image": "cuda:12.4", "runtime_class": None, "pods": ["ml/a"], "env": ["CUDA_VISIBLE_DEVICES=0"]}
    spec = probe_pod(o, w)["spec"]
    assert "nodeName" not in spec and spec["affinity"] == {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-a.example"]}]}]}}}
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "compat-hook-probe-gpu"}]
    (c,) = spec["containers"]
    assert c["resources"]["claims"] == [{"name": "gpu"}] and not any("nvidia.com" in k for k in c["resources"]["limits"])
    assert c["env"] == [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]  # no GPU asked for in the env
    assert "resources" not in spec["initContainers"][0] or "claims" not in spec["initContainers"][0]["resources"]
    keys = {(t["key"], t.get("effect")) for t in spec["tolerations"]}
    assert {("node.kubernetes.io/unschedulable", "NoSchedule"), ("nvidia.com/gpu", None),
            ("p.example/validation-failed", "NoSchedule")} <= keys


def test_without_a_device_class_a_dra_only_node_fails_closed_saying_what_to_set():
    """The default probe pod asks for its GPU in its env only (no claim, no resource): on a node whose GPUs come only
    from DRA claims it gets none, its probe loads no libcuda, and the workload fails, the message naming
    validator.deviceClass (tests/test_node_dra.py runs the claimed way on a real node)."""
    o = ValidatorOptions("gpu-a", probe_image="localhost/compat-hook:0.1.0")
    spec = probe_pod(o, {"image": "cuda:12.4", "runtime_class": None, "pods": ["ml/a"], "env": []})["spec"]
    assert spec["nodeName"] == "gpu-a" and "resourceClaims" not in spec and "affinity" not in spec
    assert spec["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert "claims" not in spec["containers"][0]["resources"]
    expect = {"loads": "host", "compat_version": None, "compat_dir": None, "needs": "12.4"}
    probe = parse_probe('{"probe": 1, "libcuda": null, "error": "libcuda.so.1: cannot open shared object file", '
                        '"maps": []}')
    r = validate.judge_probe(o, expect, probe)
    assert not r["ok"] and r["code"] == "no_libcuda", r
    assert "asked for a GPU in its env" in r["message"] and "validator.deviceClass" in r["message"], r
    # with a claim the message says so (what the probe pod had), not what to set
    r = validate.judge_probe(ValidatorOptions("gpu-a", claim_template="compat-hook-probe-gpu"), expect, probe)
    assert r["code"] == "no_libcuda" and "ResourceClaimTemplate compat-hook-probe-gpu" in r["message"], r


# --------------------------------------------------------------------------- the workload record


def _pod(name, image="cuda-app:1", *, gpu=True, phase="Running", env=None, labels=None, rc="cuda-compat"):
    e = list(env or [])
    if gpu:
        e.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return {"metadata": {"namespace": "ml", "name": name, "labels": labels or {}},
            "spec": {"runtimeClassName": rc, "containers": [{"name": "c", "image": image, "env": e}]},
            "status": {"phase": phase}}


def test_record_keeps_the_previous_drivers_workloads_on_a_driver_change(tmp_path):
    d = str(tmp_path)
    workloads.record(d, [_pod("a", "app:1"), _pod("b", "app:1"), _pod("c", "other:2")], driver=HOST_535)
    doc = workloads.load(d)
    assert doc["driver"] == HOST_535 and "previous" not in doc
    by = {w["image"]: w for w in doc["workloads"]}
    assert by["docker.io/library/app:1"]["pods"] == ["ml/a", "ml/b"]
    # the driver changes; the pods were drained: the new record is empty, the old one kept
    workloads.record(d, [], driver=HOST_555)
    doc = workloads.load(d)
    assert doc["driver"] == HOST_555 and doc["workloads"] == []
    assert doc["previous"]["driver"] == HOST_535 and len(doc["previous"]["workloads"]) == 2
    assert {w["image"] for w in workloads.for_driver(doc, HOST_555)} == {"docker.io/library/app:1",
                                                                          "docker.io/library/other:2"}
    # while no kernel module is loaded nothing is recorded
    assert workloads.record(d, [_pod("x", "new:3")], driver=None) is None
    assert workloads.load(d) == doc


def test_record_is_written_only_when_it_changes_and_accumulates(tmp_path):
    d = str(tmp_path)
    workloads.record(d, [_pod("a", "app:1")], driver=HOST_535, when="2026-12-03T10:00:00.000Z")
    f = tmp_path / workloads.FILE
    st = f.stat()
    workloads.record(d, [_pod("a", "app:1")], driver=HOST_535, when="2026-12-03T10:05:00.000Z")
    assert f.stat().st_ino == st.st_ino and f.stat().st_mtime_ns == st.st_mtime_ns  # same: not rewritten
    # a job that ran earlier under this driver still counts after its pod is gone
    workloads.record(d, [_pod("b", "later:1")], driver=HOST_535, when="2026-12-03T11:00:00.000Z")
    assert {w["image"] for w in workloads.load(d)["workloads"]} == {"docker.io/library/app:1",
                                                                    "docker.io/library/later:1"}
    # ... until it has not been seen for MAX_AGE_S
    workloads.record(d, [_pod("b", "later:1")], driver=HOST_535, when="2026-12-11T11:00:00.000Z")
    assert {w["image"] for w in workloads.load(d)["workloads"]} == {"docker.io/library/later:1"}


def test_from_pods_keeps_gpu_workloads_only_and_their_gpu_env():
    pods = [_pod("gpu", env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "1"}, {"name": "HOME", "value": "/"},
                             {"name": "LD_LIBRARY_PATH", "valueFrom": {"configMapKeyRef": {}}}]),
            _pod("cpu", "cpu-only:1", gpu=False),
            _pod("done", "finished:1", phase="Succeeded"),
            _probe_pod("probe", "probe-of:1"),
            "not a pod", {"metadata": None, "spec": {"containers": "x"}}]
    got = workloads.from_pods(pods, probe_namespace="compat-hook")
    assert [(w["image"], w["env"]) for w in got] == [
        ("docker.io/library/cuda-app:1", ["CUDA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=all"])]
    # the label alone, in a tenant's namespace: a workload like any other
    tenant = _pod("tenant", "labelled:1", labels={"app.kubernetes.io/name": workloads.PROBE_NAME})
    got = workloads.from_pods([tenant], probe_namespace="compat-hook")
    assert [w["image"] for w in got] == ["docker.io/library/labelled:1"]


def _sidecar_pod() -> dict:
    """A GPU container with a busybox init container, a busybox sidecar (an init container with
    restartPolicy Always) and a plain busybox container beside it; its LD_LIBRARY_PATH refers to
    another variable."""
    pod = _pod("with-sidecars", "registry.test/apps/infer:1",
               env=[{"name": "BASE", "value": "/opt/app"}, {"name": "LD_LIBRARY_PATH", "value": "$(BASE)/lib"}])
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox:1.36", "env": [{"name": "CUDA_X", "value": "1"}]},
                                     {"name": "proxy", "image": "busybox:1.36", "restartPolicy": "Always"}]
    pod["spec"]["containers"].append({"name": "log", "image": "busybox:1.36",
                                      "env": [{"name": "LD_LIBRARY_PATH", "value": "/x"}]})
    return pod


def test_the_record_holds_the_gpu_containers_only_as_the_agent_judges_them():
    """One workload model (compat_hook.cluster.workload.pods.Container) for the agent and the validator: the GPU
    container, its env expanded as the kubelet does; no init container, no sidecar."""
    from compat_hook.cluster.workload import pods as podsmod

    pod = _sidecar_pod()
    got = workloads.from_pods([pod])
    assert [(w["image"], w["env"]) for w in got] == [
        ("registry.test/apps/infer:1", ["LD_LIBRARY_PATH=/opt/app/lib", "NVIDIA_VISIBLE_DEVICES=all"])], got
    [c] = podsmod.gpu_containers(pod)[0]  # what the agent assesses: the same container, the same env
    assert (c.image, list(c.env)) == (got[0]["image"], got[0]["env"])
    with pytest.raises(AttributeError):
        c.image = "other"  # frozen: one model, nobody's to change


def _probe_pod(name, image) -> dict:
    """A probe pod as the validator makes it: its namespace, label and probe-of annotation."""
    pod = _pod(name, image, labels={"app.kubernetes.io/name": workloads.PROBE_NAME})
    pod["metadata"].update(namespace="compat-hook", annotations={workloads.PROBE_OF: "docker.io/library/x:1"})
    return pod


def test_from_pods_is_bounded():
    pods = [_pod(f"p{i}", f"img{i}:1", env=[{"name": f"NVIDIA_X{j}", "value": "v" * 2000 if j == 0 else "v"}
                                            for j in range(50)]) for i in range(300)]
    pods += [_pod(f"same{i}", "img0:1", env=pods[0]["spec"]["containers"][0]["env"][:-1]) for i in range(40)]
    got = workloads.from_pods(pods)
    assert len(got) == workloads.MAX_WORKLOADS
    assert all(len(w["env"]) <= workloads.MAX_ENV and len(w["pods"]) <= workloads.MAX_PODS for w in got)
    assert all(not e.startswith("NVIDIA_X0=") for w in got for e in w["env"])  # an oversized value is left out


def test_load_refuses_hostile_files(tmp_path):
    good = tmp_path / "good"
    workloads.record(str(good), [_pod("a")], driver=HOST_535)
    text = (good / workloads.FILE).read_text()
    cases = {
        "symlink": lambda f: os.symlink(good / workloads.FILE, f),
        "fifo": lambda f: os.mkfifo(f),
        "dir": lambda f: f.mkdir(),
        "huge": lambda f: f.write_text(text[:-2] + " " * (workloads.MAX_FILE + 10) + "}\n"),
        "not-json": lambda f: f.write_bytes(b"\xff\xfe{"),
        "deep": lambda f: f.write_text("[" * 100000),
        "wrong-version": lambda f: f.write_text(json.dumps({"version": 2, "driver": HOST_535, "workloads": []})),
    }
    for name, make in cases.items():
        d = tmp_path / name
        d.mkdir()
        make(d / workloads.FILE)
        assert workloads.load(str(d)) is None, name
    # wrong types inside: the bad entries are dropped, the good one kept
    d = tmp_path / "mixed"
    d.mkdir()
    doc = json.loads(text)
    doc["workloads"] += [None, 5, {"image": 7}, {"image": "a b"}, {"image": "x:1", "pods": "no", "env": [1, "A=B"],
                                                                    "runtime_class": ["x"], "seen": None}]
    doc["previous"] = {"driver": 5, "workloads": "nope"}
    (d / workloads.FILE).write_text(json.dumps(doc))
    got = workloads.load(str(d))
    assert [w["image"] for w in got["workloads"]] == ["docker.io/library/cuda-app:1", "x:1"]
    assert got["workloads"][1] == {"image": "x:1", "source": None, "pods": [], "env": ["A=B"], "runtime_class": None,
                                   "seen": "1970-01-01T00:00:00.000Z"}
    assert got["previous"] == {"driver": None, "until": None, "workloads": []}


def test_record_replaces_a_planted_symlink_without_following_it(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep me\n")
    d = tmp_path / "state"
    d.mkdir()
    os.symlink(target, d / workloads.FILE)
    workloads.record(str(d), [_pod("a")], driver=HOST_535)
    assert target.read_text() == "keep me\n"
    assert not (d / workloads.FILE).is_symlink() and workloads.load(str(d))["driver"] == HOST_535


# --------------------------------------------------------------------------- the chart and the command line


@pytest.mark.slow
def test_the_chart_s_validator_objects():
    from tests.support import kubebuild

    def render(*values):
        p = subprocess.run([str(kubebuild.helm()), "template", "compat-hook", str(REPO / "packaging/helm/compat-hook"),
                            "--namespace", "gpu-ops", *values], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return [d for d in yaml.safe_load_all(p.stdout) if d]

    docs = {(d["kind"], d["metadata"]["name"]): d for d in render()}
    ds = docs[("DaemonSet", "compat-hook-validator")]
    tpl = ds["spec"]["template"]
    assert tpl["metadata"]["labels"]["app"] == "nvidia-operator-validator"
    assert tpl["metadata"]["labels"].get("app.kubernetes.io/part-of") != "gpu-operator"
    # the two DaemonSets never select each other's pods, nor the probe pods
    main_sel = docs[("DaemonSet", "compat-hook")]["spec"]["selector"]["matchLabels"]
    assert not all(tpl["metadata"]["labels"].get(k) == v for k, v in main_sel.items())
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "compat-hook-validator"}
    (c,) = tpl["spec"]["containers"]
    assert c["command"][:3] == ["compat-hook", "cluster", "validate"] and "--runtime-class=cuda-compat" in c["command"]
    assert "--probe-image=localhost/compat-hook:0.1.0" in c["command"]
    assert c["readinessProbe"]["exec"]["command"][0] == "/bin/sh"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/var/lib/compat-hook-agent"]["readOnly"]
    # of the node, only what it reads (the agent's own view, read-only): not its /, not the kubelet's keys
    vols = {v["name"]: v for v in tpl["spec"]["volumes"]}
    host = {m["mountPath"]: vols[m["name"]]["hostPath"]["path"] for m in c["volumeMounts"] if "hostPath" in vols[m["name"]]}
    agent = docs[("DaemonSet", "compat-hook")]["spec"]["template"]["spec"]
    avols = {v["name"]: v for v in agent["volumes"]}
    [actr] = [x for x in agent["containers"] if x["name"] == "agent"]
    agent_host = {m["mountPath"]: avols[m["name"]]["hostPath"]["path"] for m in actr["volumeMounts"]
                  if "hostPath" in avols[m["name"]] and m["mountPath"].startswith("/host/")}
    assert "/" not in host.values() and "/host" not in host
    assert {k: v for k, v in host.items() if k.startswith("/host/")} == agent_host, host
    assert all(mounts[m]["readOnly"] for m in agent_host)
    assert {k: v for k, v in host.items() if not k.startswith("/host/")} == {
        "/var/lib/compat-hook-agent": "/var/lib/compat-hook-agent",
        "/var/lib/compat-hook-validator": "/var/lib/compat-hook-validator"}
    sock = [a for a in c["command"] if a.startswith("--address=")][0].split("=", 1)[1]
    assert any(sock.startswith(m + "/") for m in host), sock  # its socket is under what it mounts
    # no capability at all (no DAC_READ_SEARCH: it reads as root what root may read)
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # least privilege: pods create/get/delete in its namespace, Events in "default", its Node cluster-wide
    assert docs[("Role", "compat-hook-validator")]["metadata"]["namespace"] == "gpu-ops"
    assert docs[("Role", "compat-hook-validator")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]}]
    assert docs[("Role", "compat-hook-validator-events")]["metadata"]["namespace"] == "default"
    assert docs[("Role", "compat-hook-validator-events")]["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert docs[("ClusterRole", "compat-hook-validator")]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    gpu = {(d["kind"], d["metadata"]["name"]): d for d in render("--set", "validator.gpuResource=nvidia.com/gpu")}
    assert "--gpu-resource=nvidia.com/gpu" in gpu[("DaemonSet", "compat-hook-validator")]["spec"]["template"][
        "spec"]["containers"][0]["command"]
    assert not [a for a in c["command"] if a.startswith("--gpu-resource")]
    # validator.deviceClass: the chart's ResourceClaimTemplate (one device of the class) and the flag naming it
    assert not [d for d in docs.values() if d["kind"] == "ResourceClaimTemplate"]
    assert not [a for a in c["command"] if a.startswith("--claim-template")]
    dra = {(d["kind"], d["metadata"]["name"]): d for d in render("--set", "validator.deviceClass=gpu.nvidia.com")}
    rct = dra[("ResourceClaimTemplate", "compat-hook-probe-gpu")]
    assert rct["apiVersion"] == "resource.k8s.io/v1" and rct["metadata"]["namespace"] == "gpu-ops"
    assert rct["spec"]["spec"]["devices"]["requests"] == [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]
    assert "--claim-template=compat-hook-probe-gpu" in dra[("DaemonSet", "compat-hook-validator")]["spec"][
        "template"]["spec"]["containers"][0]["command"]
    for values in (["--set", "validator.enabled=false"], ["--set", "agent.enabled=false"]):
        assert not [d for d in render(*values) if "validator" in d["metadata"]["name"]], values


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "validate", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=dict(ENV, KUBECONFIG="/nonexistent"))


@pytest.mark.parametrize("args,needle", [
    ((), "the following arguments are required"),
    (("--node", "../x", "--probe-image", "i"), "not a node name"),
    (("--node", "a", "--probe-image", "i", "--probe-timeout", "1"), "--probe-timeout: at least 10"),
    (("--node", "a", "--probe-image", "i", "--parallel", "0"), "--parallel: at least 1"),
    (("--node", "a", "--probe-image", "i", "--bogus"), "unrecognized arguments"),
    (("--node", "a", "--probe-image", "i", "--gpu-resource", "nvidia.com/gpu", "--claim-template", "t"),
     "--gpu-resource and --claim-template"),
    (("--node", "a", "--probe-image", "i", "--claim-template", "../x"), "--claim-template: not an object name"),
])
def test_cli_usage_errors_are_one_line_and_exit_2(args, needle):
    p = _cli(*args)
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_cli_once_without_a_driver_or_cluster_exits_1(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"host_root: {tmp_path}\nlog_file: null\n")
    p = _cli("--node", "a", "--probe-image", "i", "--config", str(cfg), "--once", "--state-dir", str(tmp_path / "s"))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr


# --------------------------------------------------------------------------- bounded, against a real API server


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """A real API server with kwok playing the node: a pod bound to it goes Running and never ends,
    as a probe whose image hangs would."""
    from compat_hook.cluster.api import kube
    from tests.support.gpucluster import gpu_node
    from tests.support.kube import ADMIN_TOKEN, ControlPlane

    cp = ControlPlane(tmp_path_factory.mktemp("validator-api"))
    try:
        cp.start()
        cp.start_kwok()
        cp.admin.create("/api/v1/nodes", gpu_node("gpu-k"))
        cp.admin.create("/apis/node.k8s.io/v1/runtimeclasses", {"metadata": {"name": "cuda-compat"},
                                                                "handler": "cuda-compat"})
        cp.admin.wait("gpu-k Ready", lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in cp.admin.get(
            "/api/v1/nodes/gpu-k").get("status", {}).get("conditions", [])), timeout=60)
        yield cp, kube.connect(str(cp.kubeconfig(ADMIN_TOKEN, "admin")))
    finally:
        cp.stop()


def _opts(node: str = "gpu-k", **kw) -> ValidatorOptions:
    return ValidatorOptions(node, publish_namespace="compat-hook", probe_image="localhost/compat-hook:0.1.0",
                            **kw)


W = {"image": "registry.test/apps/hang:1", "runtime_class": None, "env": [], "pods": ["apps/hang"],
     "source": None, "seen": "2026-12-03T10:00:00.000Z"}


def _pods(cp) -> list:
    return cp.admin.get("/api/v1/namespaces/compat-hook/pods", labelSelector="app.kubernetes.io/name=compat-hook-probe")[
        "items"]


@pytest.mark.containers
@pytest.mark.slow
def test_a_probe_pod_that_never_ends_times_out_and_is_deleted(api):
    import time

    cp, k = api
    # a pod of the same name left by an earlier run is replaced, not an error
    cp.admin.create("/api/v1/namespaces/compat-hook/pods", probe_pod(_opts(), W))
    t0 = time.monotonic()
    got = validate.run_probe(k, _opts(probe_timeout=10), W, time.monotonic() + 60)
    took = time.monotonic() - t0
    assert got["probe"] is None and "did not finish in 10 s" in got["error"], got
    assert 10 <= took < 30, took
    assert _pods(cp) == []


@pytest.mark.containers
@pytest.mark.slow
def test_a_stopped_validator_deletes_its_probe_pods_at_once(api):
    import threading
    import time

    cp, k = api
    out = {}
    t = threading.Thread(target=lambda: out.update(validate.run_probe(k, _opts(probe_timeout=300), W,
                                                                     time.monotonic() + 600)))
    t.start()
    try:
        cp.admin.wait("the probe pod Running", lambda: [p for p in _pods(cp)
                                                         if p.get("status", {}).get("phase") == "Running"], timeout=30)
        t0 = time.monotonic()
        validate.STOP.set()  # what SIGTERM does
        t.join(30)
        assert not t.is_alive() and time.monotonic() - t0 < 5
    finally:
        validate.STOP.clear()
    assert out["error"] == "stopped" and _pods(cp) == []


@pytest.mark.containers
@pytest.mark.slow
def test_a_validation_that_cannot_prove_fails_within_its_deadline_and_says_why(api, tmp_path):
    import time

    from compat_hook.core.config import from_mapping
    from tests.support import hookenv

    cp, k = api
    host = hookenv.fake_host(tmp_path / "host", HOST_555)
    cfg = from_mapping({"host_root": str(host), "nvml": "off", "log_file": None})
    rec = tmp_path / "agent"
    workloads.record(str(rec), [_pod(f"p{i}", f"registry.test/apps/hang{i}:1") for i in range(3)], driver=HOST_535)
    # these images are in no store: allowed here, so that each is probed (and hangs) rather than failed at once
    opts = _opts(probe_timeout=10, deadline=15, parallel=2, workloads_dir=str(rec), state_dir=str(tmp_path / "st"),
                 once=True, ready_file=str(tmp_path / "ready"), allow_unverified=True)
    assert validate.read_driver(cfg)[0] == HOST_555
    t0 = time.monotonic()
    rc = validate.run(lambda: k, cfg, opts, "compat-hook.io")
    took = time.monotonic() - t0
    assert rc == validate.EXIT_FAILED and took < 60, (rc, took)
    st = json.loads((tmp_path / "st" / validate.STATE_FILE).read_text())
    assert st["driver"] == HOST_555 and st["result"] == "fail"
    codes = sorted(r["code"] for r in st["images"])
    # two probed at a time and timed out; the third started after the deadline: not probed
    assert codes == ["not_probed", "probe_failed", "probe_failed"], st["images"]
    assert not (tmp_path / "ready").exists() and _pods(cp) == []
    node = cp.admin.get("/api/v1/nodes/gpu-k")
    assert node["metadata"]["labels"]["compat-hook.io/validated"] == "failed"
    evs = cp.admin.get("/api/v1/namespaces/default/events", fieldSelector="involvedObject.name=gpu-k,"
                                                                          "reason=CompatHookValidation")["items"]
    assert evs and evs[-1]["type"] == "Warning" and "registry.test/apps/hang0:1 (pods ml/p0)" in evs[-1]["message"]
    # the failed node carries compat-hook's own taint, so that an uncordon does not bring work back to it
    [taint] = [t for t in node["spec"].get("taints") or [] if t["key"] == "compat-hook.io/validation-failed"]
    assert (taint["value"], taint["effect"]) == (HOST_555, "NoSchedule"), node["spec"]


@pytest.mark.containers
@pytest.mark.slow
def test_a_workload_the_validator_cannot_judge_fails_and_taints_the_node_until_a_pass(api, tmp_path):
    """The store unreachable: no expectation can be formed, so the workload fails (no probe pod is
    made), the Node gets the taint, and a pass takes only that taint off (someone else's stays)."""
    import time

    from compat_hook.core.config import from_mapping
    from tests.support import hookenv

    cp, k = api
    cp.admin.merge("/api/v1/nodes/gpu-k", {"spec": {"taints": [{"key": "team.example.com/gpu", "effect": "NoSchedule"}]}})
    host = hookenv.fake_host(tmp_path / "host", HOST_555)
    cfg = from_mapping({"host_root": str(host), "nvml": "off", "log_file": None})
    rec = tmp_path / "agent"
    workloads.record(str(rec), [_pod("p0", "registry.test/apps/infer:1")], driver=HOST_535)
    opts = _opts(probe_timeout=10, deadline=60, workloads_dir=str(rec), state_dir=str(tmp_path / "st"), once=True,
                 address=str(tmp_path / "no-containerd.sock"))
    t0 = time.monotonic()
    assert validate.run(lambda: k, cfg, opts, "compat-hook.io") == validate.EXIT_FAILED
    assert time.monotonic() - t0 < 60  # inside its deadline
    st = json.loads((tmp_path / "st" / validate.STATE_FILE).read_text())
    [row] = st["images"]
    assert (st["result"], row["ok"], row["code"]) == ("fail", False, "no_expectation"), row
    assert "could not be formed" in row["message"] and "seconds" not in row, row  # never probed
    node = cp.admin.get("/api/v1/nodes/gpu-k")
    assert node["metadata"]["labels"]["compat-hook.io/validated"] == "failed"
    assert {t["key"]: t.get("value") for t in node["spec"]["taints"]} == {
        "team.example.com/gpu": None, "compat-hook.io/validation-failed": HOST_555}, node["spec"]
    # a pass (as the loop publishes it): the label says the driver, compat-hook's taint goes, theirs stays
    validate.publish(k, opts, "compat-hook.io", {"driver": HOST_555, "result": "pass", "images": []}, event=False)
    node = cp.admin.get("/api/v1/nodes/gpu-k")
    assert node["metadata"]["labels"]["compat-hook.io/validated"] == HOST_555
    assert [t["key"] for t in node["spec"]["taints"]] == ["team.example.com/gpu"], node["spec"]
    # validation_taint: false: a failure sets none
    validate.publish(k, _opts(taint=False), "compat-hook.io", {"driver": HOST_555, "result": "fail", "images": []},
                     event=False)
    assert [t["key"] for t in cp.admin.get("/api/v1/nodes/gpu-k")["spec"]["taints"]] == ["team.example.com/gpu"]
    cp.admin.merge("/api/v1/nodes/gpu-k", {"spec": {"taints": None}})


@pytest.mark.containers
@pytest.mark.slow
def test_a_pod_with_a_busybox_sidecar_is_validated_on_its_gpu_container_only(api, tmp_path):
    """The validator proves what the agent recorded: the GPU container alone (a sidecar would fail
    every upgrade's validation); its store is unreachable here, so the one row fails closed, at once."""
    from compat_hook.core.config import from_mapping
    from tests.support import hookenv

    cp, k = api
    host = hookenv.fake_host(tmp_path / "host", HOST_555)
    cfg = from_mapping({"host_root": str(host), "nvml": "off", "log_file": None})
    rec = tmp_path / "agent"
    workloads.record(str(rec), [_sidecar_pod()], driver=HOST_535)
    opts = _opts(probe_timeout=10, deadline=30, workloads_dir=str(rec), address=str(tmp_path / "none.sock"))
    result = validate.validate(k, cfg, opts, HOST_555)
    assert [(r["image"], r["env"], r["code"]) for r in result["images"]] == [
        ("registry.test/apps/infer:1", ["LD_LIBRARY_PATH=/opt/app/lib", "NVIDIA_VISIBLE_DEVICES=all"], "no_expectation")]
    assert result["result"] == "fail" and _pods(cp) == []


@pytest.mark.containers
@pytest.mark.slow
def test_a_workload_image_gone_from_the_node_fails_unless_allowed(api, tmp_path):
    """The kubelet garbage-collected the image during the drain: the probe (imagePullPolicy Never)
    waits in ErrImageNeverPull, nothing is proven, so the workload fails; with
    cluster.validation_allow_unverified it passes as not verified. No kubelet runs this node: the
    test reports the probe container's state as the kubelet does."""
    import threading
    import time

    from compat_hook.core.config import from_mapping
    from tests.support import hookenv
    from tests.support.gpucluster import build_store, gpu_node, ref

    cp, k = api
    node = gpu_node("gpu-gc")
    node["metadata"]["annotations"] = {}  # not kwok's: nothing runs its pods
    cp.admin.create("/api/v1/nodes", node)
    store = build_store(tmp_path / "store", ["infer"])
    host = hookenv.fake_host(tmp_path / "host", HOST_555)
    cfg = from_mapping({"host_root": str(host), "nvml": "off", "log_file": None})
    rec = tmp_path / "agent"
    workloads.record(str(rec), [_pod("p0", ref("infer"))], driver=HOST_535,
                     sources={f"oci:{store}:{ref('infer')}": [ref("infer")]})

    def kubelet() -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pods = [p for p in _pods(cp) if p["spec"]["nodeName"] == "gpu-gc"]
            if pods:
                name = pods[0]["metadata"]["name"]
                cp.admin.request("PATCH", f"/api/v1/namespaces/compat-hook/pods/{name}/status", {"status": {
                    "phase": "Pending", "containerStatuses": [{
                        "name": "probe", "ready": False, "restartCount": 0, "image": ref("infer"), "imageID": "",
                        "state": {"waiting": {"reason": "ErrImageNeverPull", "message":
                                              f'Container image "{ref("infer")}" is not present with pull policy of Never'}}}]}},
                    content_type="application/merge-patch+json")
                return
            time.sleep(0.2)

    for allow in (False, True):
        t = threading.Thread(target=kubelet)
        t.start()
        opts = _opts(node="gpu-gc", probe_timeout=30, deadline=60, workloads_dir=str(rec), allow_unverified=allow)
        result = validate.validate(k, cfg, opts, HOST_555)
        t.join()
        [row] = result["images"]
        assert row["expected"] == "host" and row["needs"] == "12.4", row  # the decision was formed from the store
        assert (row["ok"], row["code"], row.get("unverified")) == (allow, "not_on_node", True), row
        assert "not on the node" in row["message"], row
        assert result["result"] == ("pass" if allow else "fail") and _pods(cp) == []
        if allow:
            assert "not verified (not on the node): " + ref("infer") in validate.event_message(HOST_555, result["images"])


def test_once_without_a_driver_names_the_file_and_sigterm_stops_the_loop(api, tmp_path):
    """``validate --once`` with no kernel driver says which file it read; the loop (the DaemonSet's
    container, its PID 1) ends on SIGTERM at once, exit 0."""
    import signal
    import time

    from tests.support.kube import ADMIN_TOKEN

    cp, _ = api
    (tmp_path / "host").mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"host_root: {tmp_path / 'host'}\nlog_file: null\n")
    kc = cp.kubeconfig(ADMIN_TOKEN, "validator-cli")
    argv = ["--node", "gpu-k", "--probe-image", "i", "--config", str(cfg), "--state-dir", str(tmp_path / "s"),
            "--workloads-dir", str(tmp_path / "w"), "--kubeconfig", str(kc), "--publish-namespace", "compat-hook"]
    p = _cli(*argv, "--once")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    [rec] = [json.loads(ln) for ln in p.stdout.splitlines() if '"no_driver"' in ln]
    want = str(tmp_path / "host" / "proc/driver/nvidia/version")
    assert rec["file"] == want and want in rec["message"], rec
    proc = subprocess.Popen(["/usr/bin/python3", "-m", "compat_hook", "cluster", "validate", *argv], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        time.sleep(3)  # connected, no driver: waiting for one
        assert proc.poll() is None, proc.stdout.read()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = proc.stdout.read()
    print(f"validator exit after SIGTERM: {took:.3f} s")
    assert rc == 0 and took < 1.0 and '"validation_stopped"' in out, (rc, took, out)
