"""The cluster side without a cluster: the Kubernetes client stays off every other path, and the
command lines fail with one clear line (the control-plane tests are tests/test_cluster.py)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "compat_hook", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)


def test_no_other_command_imports_the_kubernetes_client_or_the_cluster_package():
    code = ("import sys\nbefore = set(sys.modules)\n"
            "import compat_hook.cli, compat_hook.commands.hook, compat_hook.runtime, compat_hook.commands.plan, compat_hook.commands.explain\n"
            "compat_hook.cli.main(['config'])\n"
            "new = set(sys.modules) - before\n"
            "bad = sorted(m for m in new if m.split('.')[0] in ('kubernetes', 'urllib3') or m.startswith('compat_hook.cluster'))\n"
            "print('BAD', bad)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "BAD []", p.stdout


def test_nothing_outside_the_cluster_package_imports_it_but_the_cli_dispatch():
    hits = []
    for f in (REPO / "compat_hook").rglob("*.py"):
        if "cluster" in f.relative_to(REPO / "compat_hook").parts:
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if "import" in line and ("from .cluster" in line or "from ..cluster" in line
                                     or "compat_hook.cluster" in line):
                hits.append(f"{f.relative_to(REPO)}:{n}")
    assert len(hits) == 1 and hits[0].startswith("compat_hook/commands/cli.py:"), hits


@pytest.mark.parametrize("args", [["cluster", "--help"], ["cluster", "-h"], ["cluster", "agent", "--help"],
                                  ["cluster", "status", "--help"], ["cluster", "release", "--help"]])
def test_every_cluster_help_exits_0(args):
    p = _run(*args)
    assert p.returncode == 0 and p.stdout.startswith("usage: compat-hook cluster"), (p.stdout, p.stderr)


@pytest.mark.parametrize("args, want", [
    (["cluster"], "usage: compat-hook cluster"),
    (["cluster", "release"], "one of the arguments --node --all is required"),
    (["cluster", "release", "--all", "--prefix", "Not_A.Prefix"], "--prefix: not a label prefix"),
    (["cluster", "agent", "--node", "n", "--once", "--publish-namespace", "a.b"], "--publish-namespace: not a namespace"),
    (["cluster", "agent"], "the following arguments are required: --node"),
    (["cluster", "agent", "--node", "n", "--interval", "0"], "--interval: at least 1 second"),
    (["cluster", "agent", "--node", "../../api/v1/secrets?x=", "--once"], "--node: not a node name"),
    (["cluster", "agent", "--node", "n", "--once", "--driver", "sha256:abc"], "image digest"),
    (["cluster", "agent", "--node", "n", "--once", "--host-root", "/nonexistent-dir"], "no such directory"),
    # a store the agent cannot use stops its start (the pod's), not every pass silently
    (["cluster", "agent", "--node", "n", "--store", "bogus:x"], "--store bogus:x: not an image source"),
    (["cluster", "agent", "--node", "n", "--store", "oci:/nonexistent-dir"], "--store oci:/nonexistent-dir: no such"),
    (["cluster", "release", "--node", "n", "--purge"], "--purge: only with --all"),
    (["cluster", "release", "--all", "--purge", "--publish-namespace", "A_B"], "--publish-namespace: not a namespace"),
])
def test_bad_usage_is_one_line_exit_2(args, want):
    p = _run(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert want in p.stdout + p.stderr and "Traceback" not in p.stderr


def test_no_credentials_is_one_line_exit_1(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C"}
    p = _run("cluster", "status", "--kubeconfig", str(tmp_path / "missing"), env=env)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "no cluster credentials" in p.stderr, p.stderr
    p = _run("cluster", "agent", "--node", "n", "--once", "--kubeconfig", str(tmp_path / "missing"),
             "--state-dir", str(tmp_path / "state"), env=env)
    assert p.returncode == 1 and '"event":"cluster_error"' in p.stdout and "no cluster credentials" in p.stdout, p
    assert "Traceback" not in p.stderr


def test_unreachable_api_server_is_one_line(tmp_path):
    kc = tmp_path / "kc"
    kc.write_text('{"apiVersion": "v1", "kind": "Config", "current-context": "t", '
                  '"clusters": [{"name": "t", "cluster": {"server": "https://127.0.0.1:1"}}], '
                  '"users": [{"name": "u", "user": {"token": "x"}}], '
                  '"contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}]}')
    p = _run("cluster", "status", "--kubeconfig", str(kc))
    assert p.returncode == 1 and "unreachable" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_each_pass_frees_what_the_image_reader_spooled(tmp_path):
    """An agent pass reads its pods' images with an image reader of its own and removes what it spooled
    (the compat libcuda kept for the ELF checks) when it ends. The process's shared reader keeps its
    spool until the process exits: in a long-running agent, past its 4 GiB bound every image that
    needs a spool would fail. Two passes in one process, then the shared reader for contrast."""
    import json
    import os

    from tests.support import debs
    from tests.support.gpucluster import A100, build_store, ref
    from tests.support.toolkit import noted_compat_lib
    from tests.support.trees import write_fake_host
    from tests.support.versions import COMPAT_550, HOST_535

    store = build_store(tmp_path / "store", ["train"],
                        {"noted": noted_compat_lib(debs.libcuda(COMPAT_550), tmp_path / "noted")})
    host = write_fake_host(tmp_path / "host", version=HOST_535, gpus={"0000:17:00.0": A100})
    spool = tmp_path / "tmp"
    spool.mkdir()
    code = r'''
import json, os, sys
from compat_hook.cluster.workload import pods, predict
from compat_hook.core.config import from_mapping
from compat_hook.images import reader
from compat_hook.images.sources import open_source
cfg = from_mapping({"log_file": None, "nvml": "off", "host_root": sys.argv[1]})
pod = {"metadata": {"name": "p", "namespace": "apps"},
       "spec": {"runtimeClassName": "cuda-compat", "containers": [
           {"name": "c", "image": sys.argv[3], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
out = []
for _ in range(2):
    a = predict.assess(cfg, version="580.95.05", workloads=pods.build([pod], ["cuda-compat"]),
                       stores=[sys.argv[2]], address=None, namespace="k8s.io")
    out.append({"now": [(r.get("now") or {}).get("outcome") for r in a.rows],
                "left": sorted(os.listdir(os.environ["TMPDIR"]))})
shared_before = reader._default is not None
src = a.rows[0]["image"]
with open_source(src, cfg) as img:
    pass
print(json.dumps({"passes": out, "shared_before": shared_before, "shared_left": sorted(os.listdir(os.environ["TMPDIR"]))}))
'''
    p = subprocess.run([sys.executable, "-c", code, str(host), f"oci:{store}", ref("train")], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, TMPDIR=str(spool)))
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout.splitlines()[-1])
    # each pass read the image (its compat driver found) and left nothing in the temp dir
    assert doc["passes"] == [{"now": ["compat"], "left": []}] * 2, doc
    assert doc["shared_before"] is False, doc
    # the same image through the process's shared reader: its spool stays while the process lives
    assert [n for n in doc["shared_left"] if n.startswith("compat-hook-images-")], doc


def test_the_validators_record_counts_the_gpu_pods_the_preflight_counts():
    """A pod with a GPU by a resource, a resource claim, a CDI annotation or its env is a workload of
    the preflight (pods.build) and of the record the validator proves (workloads.from_pods) alike; a
    CPU pod is in neither, and neither is the validator's own probe."""
    from compat_hook.cluster.workload import pods, workloads
    from compat_hook.cluster.node import validate

    def pod(name, *, resources=None, env=None, annotations=None, ns="apps"):
        c = {"name": "c", "image": f"registry.test/{name}:1"}
        if resources:
            c["resources"] = resources
        if env:
            c["env"] = env
        return {"metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
                "spec": {"nodeName": "n", "containers": [c]}, "status": {"phase": "Running"}}

    listed = [pod("resource", resources={"limits": {"nvidia.com/gpu": "1"}}),
              pod("claim", resources={"claims": [{"name": "gpu"}]}),
              pod("cdi", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
              pod("env", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]),
              pod("cpu"), pod("cdi-other", annotations={"cdi.k8s.io/x": "vendor.example/dev=0"}),
              validate.probe_pod(validate.ValidatorOptions("n", publish_namespace="compat-hook"),
                                 {"image": "registry.test/probed:1", "env": [], "runtime_class": None})]
    preflight = sorted(w["image"] for w in pods.build(listed, ["cuda-compat"], "compat-hook").items)
    record = sorted(w["image"] for w in workloads.from_pods(listed, probe_namespace="compat-hook"))
    want = sorted(f"registry.test/{n}:1" for n in ("resource", "claim", "cdi", "env"))
    assert preflight == want and record == want, (preflight, record)


def test_the_hold_record_keeps_the_node_annotation_bounded():
    """Many regressing workloads, long image names: the Node's annotation stays within its bound, the
    workloads pods run now kept first (the record is what a restarted agent goes on)."""
    import json

    from compat_hook.cluster.node import holds, nodedoc

    now = 1_000_000.0
    regressing = {f"{i:012x}": "registry.test/" + "x" * 300 + f"/{i}:1" for i in range(40)}
    prev = holds.track(None, target="470.256.02", regressing=regressing, present=set(regressing), now=now,
                       quiet=600).doc()
    assert len(prev["w"]) == holds.MAX_ENTRIES
    # half of them go: absent, counted until the quiet time has passed
    still = dict(list(regressing.items())[:8])
    rec = holds.track(prev, target="470.256.02", regressing=still, present=set(still), now=now + 5, quiet=600)
    assert len(rec.absent) == holds.MAX_ENTRIES - 8 and rec.next_expiry == int(now + 5) + 600
    doc = nodedoc.node_doc(verdict_="fail", target="470.256.02", target_from="x", now="535.261.03", gate="held",
                           c={"regressions": 16}, reasons=["regression"] * 12, key="k", interval=300,
                           details="compat-hook/n", since="t", held=rec.doc())
    assert len(json.dumps(doc, separators=(",", ":"))) <= nodedoc.MAX_NODE_DOC
    kept = doc["held"]["w"]
    assert set(still) <= set(kept) and all(len(v[0]) <= holds.MAX_IMAGE for v in kept.values()), kept
    # the record comes back from the annotation as it went (what another agent process reads)
    again = holds.track(json.loads(json.dumps(doc["held"])), target="470.256.02", regressing=still,
                        present=set(still), now=now + 6, quiet=600)
    assert {k: e["gone"] for k, e in again.entries.items()} == {k: kept[k][1] for k in kept}
    # junk in the annotation is dropped, never trusted
    junk = {"target": "470.256.02", "w": {"a": ["img", "soon"], "b": [1, None], "c": ["ok", None], 5: ["x", None]}}
    assert list(holds.track(junk, target="470.256.02", regressing={}, present={"c"}, now=now, quiet=600).entries) == ["c"]


@pytest.mark.parametrize("text, want", [
    ("apiVersion: v1\nclusters: [\n  - name: x\n    cluster: {server: \"https://a\"\n", "not valid YAML (line "),
    ("- just\n- a list\n", "not a kubeconfig (a list, not a mapping)"),
    ("apiVersion: v1\nclusters: {a: b}\n", "clusters: not a list of named entries"),
])
@pytest.mark.parametrize("command", [
    ["cluster", "status"], ["cluster", "release", "--all"], ["cluster", "release", "--node", "n"],
    ["cluster", "agent", "--node", "n", "--once"],
    ["cluster", "validate", "--node", "n", "--once", "--probe-image", "x"],
])
def test_an_invalid_kubeconfig_is_one_line_in_every_cluster_command(tmp_path, text, want, command):
    """A kubeconfig that is not YAML (or not a kubeconfig): one line naming the file, exit 1, never a traceback;
    through --kubeconfig and through $KUBECONFIG alike."""
    kc = tmp_path / "bad.kubeconfig"
    kc.write_text(text)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C"}
    extra = ["--state-dir", str(tmp_path / "state")] if command[1] in ("agent", "validate") else []
    for how in ("flag", "env"):
        argv = command + extra + (["--kubeconfig", str(kc)] if how == "flag" else [])
        p = _run(*argv, env=dict(env, KUBECONFIG=f"{tmp_path / 'missing'}:{kc}") if how == "env" else env)
        out = p.stdout + p.stderr
        assert p.returncode == 1, (how, out)
        assert "Traceback" not in out and str(kc) in out and want in out, (how, out)
        if command[1] in ("status", "release"):
            assert p.stderr.count("\n") == 1 and p.stdout == "", (how, out)
        else:  # the agent and the validator speak JSON lines: one of them says it
            [line] = [ln for ln in p.stdout.splitlines() if str(kc) in ln]
            assert "no cluster credentials" in line, line


def test_an_unknown_context_and_no_context_are_one_line(tmp_path):
    kc = tmp_path / "kc"
    kc.write_text('{"apiVersion": "v1", "kind": "Config", '
                  '"clusters": [{"name": "t", "cluster": {"server": "https://127.0.0.1:1"}}], '
                  '"users": [{"name": "u", "user": {"token": "x"}}], '
                  '"contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}]}')
    p = _run("cluster", "status", "--kubeconfig", str(kc))
    assert p.returncode == 1 and "no current-context" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    p = _run("cluster", "status", "--kubeconfig", str(kc), "--context", "prod")
    assert p.returncode == 1 and "no context 'prod' (there are: t)" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    p = _run("cluster", "release", "--all", "--kubeconfig", str(kc), "--context", "t")
    assert p.returncode == 1 and "127.0.0.1:1" in p.stderr and "unreachable" in p.stderr, p.stderr
