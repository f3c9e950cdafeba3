"""docs/cluster.md "Runbook: a cluster upgrade with the gate": every ``compat-hook`` command, run as written.

The commands are taken from that section's ``sh`` blocks (so the doc cannot drift from what is
tested) and run with ``sh -c``, exactly as written, the way an operator runs them on a machine
with kubectl configured: the cluster's credentials come from ``$KUBECONFIG`` (nothing on the
command line), ``compat-hook`` on PATH runs this checkout.

The cluster is the real control plane of tests/support/kube.py (etcd, kube-apiserver, kwok) with
NVIDIA's own upgrade state machine (tests/upgrade_harness) moving the nodes. Two GPU nodes on
R535 with A100s (which R470 drives): gpu-a runs a CUDA 11.8 image, gpu-b a CUDA 12.4 image without a
compat driver, which breaks on R470; both pods on the chart's RuntimeClass. The runbook's ``kubectl`` steps are played through the API; the agent's passes (the
DaemonSet's, with the gate on) are ``compat-hook cluster agent --once`` as its ServiceAccount;
``compat-hook report`` runs "on" gpu-a, on the decision log the real hook wrote there before and
after the driver changed. The chart's fleet objects (on with the gate) are applied and its controller
runs as the chart's ServiceAccount: the version applied before step 1 is refused by the API server,
and step 3's is admitted once the fleet has judged it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

import pytest

from tests.support import chart, hookenv, rootfs
from tests.support.gpucluster import (CP, R470, R535, SKIP, STATE, agent_rbac, build_store, gpu_node, gpu_operator,
                                      gpu_pod, labels, ref, runtime_classes, set_node_driver, wait_upgraded)
from tests.support.kube import ADMIN_TOKEN, AGENT_TOKEN, ApiError, ControlPlane

pytestmark = [pytest.mark.containers, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "cluster.md"
SECTION = "## Runbook: a cluster upgrade with the gate"
#: node -> the image of its GPU pod
NODES = {"gpu-a": "legacy", "gpu-b": "infer"}


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def runbook_steps() -> list:
    """Every command line of the section's sh blocks, in order."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", section(), re.S):
        out += [ln.strip() for ln in block.splitlines() if ln.strip()]
    return out


def documented_outputs() -> list:
    """``[(command, output)]`` for each sh block of one ``compat-hook`` command followed by a ``text`` block."""
    return re.findall(r"```sh\n(compat-hook [^\n]*)\n```\n\n```text\n(.*?)```", section(), re.S)


def test_the_runbook_has_the_steps_this_test_plays():
    steps = runbook_steps()
    assert [s.split()[0] for s in steps] == ["kubectl", "compat-hook", "kubectl", "kubectl", "kubectl", "kubectl",
                                             "compat-hook", "kubectl", "kubectl", "compat-hook", "compat-hook",
                                             "kubectl"], steps
    assert [s for s in steps if s.startswith("compat-hook")] == ["compat-hook cluster status"] * 3 + ["compat-hook report"]
    assert steps[0] == f"kubectl annotate clusterpolicy cluster-policy compat-hook.io/next-driver={R470}"
    assert steps[4] == ("kubectl patch clusterpolicy cluster-policy --type merge -p "
                        f"'{{\"spec\":{{\"driver\":{{\"version\":\"{R470}\"}}}}}}'")
    assert steps[3] == "kubectl -n compat-hook get configmap gpu-b -o jsonpath='{.data.preflight\\.json}'"
    assert steps[7] == "kubectl -n apps delete pod infer-gpu-b"
    assert steps[-1] == "kubectl annotate clusterpolicy cluster-policy compat-hook.io/next-driver-"
    assert len(documented_outputs()) == 3


class Runbook:
    """The operator's shell (the doc's commands, in order) and the node agents' passes."""

    def __init__(self, cp: ControlPlane, work: pathlib.Path) -> None:
        self.cp, self.work, self.admin = cp, work, cp.admin
        self.steps = runbook_steps()
        self.next = 0
        self.agent_kc = cp.kubeconfig(AGENT_TOKEN, "agent")
        (work / "bin").mkdir()
        (work / "home").mkdir()  # no ~/.kube: the credentials are $KUBECONFIG's
        (work / "bin" / "compat-hook").write_text(
            f"#!/usr/bin/python3\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
            "from compat_hook.commands.cli import main\nsys.exit(main())\n")
        (work / "bin" / "compat-hook").chmod(0o755)
        self.env = {"PATH": f"{work / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "HOME": str(work / "home"),
                    "KUBECONFIG": str(cp.kubeconfig(ADMIN_TOKEN, "operator"))}
        self.stores, self.hosts, self.configs = {}, {}, {}
        for node, image in NODES.items():
            self.stores[node] = build_store(work / "stores" / node, [image])
            self.hosts[node] = work / "hosts" / node
            self.configs[node] = hookenv.write_config(
                work / "etc" / node / "config.yaml", host_root=self.hosts[node], log_file=work / "log" / f"{node}.log",
                nvml="off", cluster={"gate_upgrade": True, "hold_quiet_s": 0})  # step 4 deletes the pod and looks at once

    def kubectl(self, starts: str) -> str:
        """The next step is a kubectl command starting with ``starts``: the test plays it (after this returns)."""
        cmd = self.steps[self.next]
        assert cmd.startswith(starts), (self.next, cmd)
        self.next += 1
        return cmd

    def compat_hook(self, *, on_node: str | None = None) -> tuple:
        """Run the next step, a ``compat-hook`` command, exactly as written; on a node, with its config."""
        cmd = self.steps[self.next]
        assert cmd.startswith("compat-hook "), (self.next, cmd)
        self.next += 1
        env = dict(self.env, **({"COMPAT_HOOK_CONFIG": str(self.configs[on_node])} if on_node else {}))
        p = subprocess.run(["sh", "-c", cmd], cwd=self.work, env=env, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in p.stderr, p.stderr
        return cmd, p.returncode, p.stdout, p.stderr

    def agent_pass(self, node: str) -> dict:
        """One pass of the node's agent (the DaemonSet's pod, as its ServiceAccount, the gate on)."""
        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "cluster", "agent", "--node", node, "--once",
                            "--kubeconfig", str(self.agent_kc), "--store", f"oci:{self.stores[node]}",
                            "--config", str(self.configs[node]), "--state-dir", str(self.work / "state" / node)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        return [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")][-1]

    def set_driver(self, node: str, version: str) -> None:
        set_node_driver(self.admin, self.hosts[node], node, version)

    def upgraded(self, nodes, version: str) -> None:
        """NVIDIA's controller finished ``nodes``; their driver containers loaded ``version``."""
        wait_upgraded(self.admin, nodes, version)
        for n in nodes:
            self.set_driver(n, version)

    def container_start(self, node: str, name: str) -> None:
        """The real hook at a container start on the node (the runtime's createContainer hook)."""
        bundle = self.work / "bundles" / name
        rootfs.build_rootfs(bundle / "rootfs")
        (bundle / "config.json").write_text(json.dumps({
            "ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=11.8.0"]},
            "annotations": {"io.kubernetes.cri.sandbox-name": f"legacy-{node}",
                            "io.kubernetes.cri.sandbox-namespace": "apps",
                            "io.kubernetes.cri.image-name": ref(NODES[node])}}))
        state = json.dumps({"ociVersion": "1.0.2", "id": name, "status": "creating", "pid": os.getpid(),
                            "bundle": str(bundle)})
        p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "hook", "--stage", "createContainer", "--config",
                            str(self.configs[node]), "--state-dir", str(self.work / "hookstate" / node)],
                           input=state, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr

    def assert_shown(self, cmd: str, out: str) -> None:
        """The output the runbook shows after this step is what it printed."""
        idx = self.next - 1
        shown = [o for c, o in documented_outputs() if c == cmd]
        # the k-th status block of the doc is the k-th time the command ran
        k = sum(1 for s in self.steps[:idx] if s == cmd)
        assert out == shown[k], (cmd, k, out, shown[k])


@pytest.fixture
def runbook(tmp_path):
    cp = ControlPlane(tmp_path / "cp")
    fleet = None
    try:
        cp.start()
        cp.start_kwok()
        agent_rbac(cp)
        runtime_classes(cp.admin)
        for n in NODES:
            cp.admin.create("/api/v1/nodes", gpu_node(n))
        gpu_operator(cp.admin, R535)
        for n, image in NODES.items():
            cp.admin.create("/api/v1/namespaces/apps/pods", gpu_pod(f"{image}-{n}", n, ref(image)))
        rb = Runbook(cp, tmp_path)
        for n in NODES:
            rb.set_driver(n, R535)
        # The chart installed as the doc says (--set agent.gate=true): its fleet controller (fleet.enabled auto)
        # and the policy that refuses a driver version the fleet has not judged; the Deployment's one replica
        # is this process, as the chart's ServiceAccount.
        chart.apply(cp.admin, [d for d in chart.render("agent.gate=true")
                               if "fleet" in d["metadata"]["name"] and d["kind"] != "Deployment"])
        token = cp.admin.create("/api/v1/namespaces/compat-hook/serviceaccounts/compat-hook-fleet/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
        fleet = subprocess.Popen(
            ["/usr/bin/python3", "-m", "compat_hook", "cluster", "fleet", "--namespace", "compat-hook", "--identity",
             "runbook", "--resync", "0.5", "--kubeconfig", str(cp.kubeconfig(token["status"]["token"], "fleet"))],
            cwd=REPO, stdout=(tmp_path / "fleet.log").open("ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        cp.start_harness()
        wait_upgraded(cp.admin, list(NODES), R535, timeout=180)  # first reconcile: unknown -> upgrade-done

        def enforced():  # the API server's admission loads a new policy, its binding and params asynchronously
            try:
                cp.admin.request("PATCH", CP, {"spec": {"driver": {"version": R470}}},
                                 content_type="application/merge-patch+json", query={"dryRun": "All"})
            except ApiError as e:
                return e.status == 403 and "compat-hook.io/next-driver" in e.body
            return False

        cp.admin.wait("the driver-version policy in force", enforced, timeout=60, interval=0.3)
        yield rb
    finally:
        if fleet is not None and fleet.poll() is None:
            fleet.terminate()
            fleet.wait(15)
        cp.stop()
        for name in ("harness.log", "kwok.log", "apiserver.log", "../fleet.log"):
            f = tmp_path / "cp" / name
            if f.exists():
                print(f"--- {name} (tail)\n" + f.read_text(errors="replace")[-3000:])


def test_the_cluster_runbook_runs_as_written(runbook):
    rb, admin = runbook, runbook.admin
    rb.container_start("gpu-a", "before-1")  # a start on R535, for the report afterwards
    # out of order: the version applied before anyone judged it is refused by the API server, saying what to do
    with pytest.raises(ApiError) as e:
        admin.merge(CP, {"spec": {"driver": {"version": R470}}})
    refusal = json.loads(e.value.body)["message"]
    assert e.value.status == 403 and "compat-hook-fleet-driver-version" in refusal, refusal
    assert "compat-hook.io/next-driver" in refusal and "compat-hook.io/allow-unjudged-driver" in refusal, refusal

    # 1. preflight: announce the target; every agent takes it on its next pass (its watch fires at once)
    rb.kubectl("kubectl annotate clusterpolicy cluster-policy compat-hook.io/next-driver=")
    admin.merge(CP, {"metadata": {"annotations": {"compat-hook.io/next-driver": R470}}})
    passes = {n: rb.agent_pass(n) for n in NODES}
    assert passes["gpu-b"]["preflight"] == "fail" and passes["gpu-b"]["gate"] == "held", passes
    assert passes["gpu-a"]["preflight"] in ("pass", "warn") and passes["gpu-a"]["gate"] == "clear", passes
    cmd, rc, out, err = rb.compat_hook()
    assert rc == 3, (out, err)  # some node would break
    rb.assert_shown(cmd, out)

    # 2. why: the labels and the annotation kubectl shows
    rb.kubectl("kubectl get nodes -L compat-hook.io/preflight")
    lb = labels(admin, "gpu-b")
    assert (lb["compat-hook.io/preflight"], lb["compat-hook.io/preflight.broken"], lb[SKIP]) == ("fail", "1", "true"), lb
    assert lb["compat-hook.io/preflight.target-driver"] == R470
    la = labels(admin, "gpu-a")
    assert la["compat-hook.io/preflight"] == passes["gpu-a"]["preflight"] and SKIP not in la, la
    rb.kubectl("kubectl -n compat-hook get configmap gpu-b -o jsonpath=")
    doc = json.loads(admin.get("/api/v1/namespaces/compat-hook/configmaps/gpu-b")["data"]["preflight.json"])
    [broken] = doc["regressions"]
    shown = {"image": ref("infer"), "pods": ["apps/infer-gpu-b"], "now": "host-minor", "after": "broken", "error": 35,
             "cuda": "11.4", "needs": "12.4"}
    assert {k: broken[k] for k in shown} == shown, doc
    assert json.dumps(shown)[1:-1] in " ".join(section().split()), "the runbook shows other details"

    # 3. the upgrade: NVIDIA's controller moves gpu-a; gpu-b stays parked in upgrade-required
    rb.kubectl("kubectl patch clusterpolicy cluster-policy")
    # both agents judged R470 and gpu-b is held: the fleet controller says so within its resync
    admin.wait("the fleet judged the version", lambda: (admin.get(
        "/api/v1/namespaces/compat-hook/configmaps/compat-hook-fleet").get("data") or {}).get(
        f"clusterpolicy_cluster-policy_{R470}") == "ok", timeout=30, interval=0.3)
    admin.merge(CP, {"spec": {"driver": {"version": R470}}})
    rb.kubectl("kubectl get nodes -L nvidia.com/gpu-driver-upgrade-state")
    rb.upgraded(["gpu-a"], R470)
    assert labels(admin, "gpu-b").get(STATE) == "upgrade-required"
    rb.container_start("gpu-a", "after-1")  # a start on R470
    rb.agent_pass("gpu-a")
    rb.agent_pass("gpu-b")
    cmd, rc, out, err = rb.compat_hook()
    assert rc == 3, (out, err)
    rb.assert_shown(cmd, out)
    assert labels(admin, "gpu-b").get(STATE) == "upgrade-required"

    # 4. the breaking pod goes; on the agent's next pass the hold lifts and gpu-b upgrades too
    rb.kubectl("kubectl -n apps delete pod infer-gpu-b")
    admin.delete("/api/v1/namespaces/apps/pods/infer-gpu-b", gracePeriodSeconds="0")
    r = rb.agent_pass("gpu-b")
    assert (r["preflight"], r["gate"]) == ("pass", "clear"), r
    assert SKIP not in labels(admin, "gpu-b")
    rb.kubectl("kubectl get nodes -L nvidia.com/gpu-driver-upgrade-state")
    rb.upgraded(["gpu-b"], R470)
    for n in NODES:
        rb.agent_pass(n)
    cmd, rc, out, err = rb.compat_hook()
    assert rc == 0, (out, err)  # all clear
    rb.assert_shown(cmd, out)

    # 5. afterwards, on a node: what the hook decided before and after the driver changed
    cmd, rc, out, err = rb.compat_hook(on_node="gpu-a")
    assert rc == 0, (out, err)
    assert f"host driver {R535}" in out and f"host driver {R470}" in out, out
    assert out.index(f"host driver {R535}") < out.index(f"host driver {R470}"), out
    rb.kubectl("kubectl annotate clusterpolicy cluster-policy compat-hook.io/next-driver-")
    admin.merge(CP, {"metadata": {"annotations": {"compat-hook.io/next-driver": None}}})
    assert rb.next == len(rb.steps)
    # the credentials were $KUBECONFIG's: without it (and no ~/.kube/config) status says so, exit 1
    env = {k: v for k, v in rb.env.items() if k != "KUBECONFIG"}
    p = subprocess.run(["sh", "-c", "compat-hook cluster status"], cwd=rb.work, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 1, (p.returncode, p.stderr)
    assert "no cluster credentials (~/.kube/config)" in p.stderr, p.stderr
