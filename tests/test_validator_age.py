"""The validation-failed taint has an end: a workload long gone leaves the set to prove, on a real API server.

A node failed validation after a driver change (``<prefix>/validation-failed`` on it,
``validated=failed``) because of a workload of the previous driver that no pod has run for 60
days. Before, that workload was to be proven for ever, and once the node's image GC let its image
go it failed as ``not_on_node``: the node stayed tainted. Now (``cluster.workload_max_age_s``,
a week by default) it leaves the set: the validator's own ``validate`` and ``publish`` pass the
node and take the taint off; with an age that still covers it, it is proven as before (here it
fails closed at once: its store is unreachable, no probe pod is made).
"""

from __future__ import annotations

import time

import pytest

from compat_hook.cluster.node import validate

from compat_hook.cluster.workload import workloads
from compat_hook.core.config import from_mapping
from tests.support import hookenv
from tests.support.gpucluster import gpu_node
from tests.support.kube import ADMIN_TOKEN, ControlPlane
from tests.support.versions import HOST_535, HOST_555

pytestmark = [pytest.mark.containers, pytest.mark.slow]

PREFIX = "compat-hook.io"
TAINT = {"key": f"{PREFIX}/validation-failed", "value": HOST_555, "effect": "NoSchedule"}
THEIRS = {"key": "team.example.com/gpu", "value": "a100", "effect": "NoSchedule"}
DAY = 86400


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from compat_hook.cluster.api import kube

    cp = ControlPlane(tmp_path_factory.mktemp("validator-age"))
    try:
        cp.start()
        node = gpu_node("gpu-old")
        node["metadata"]["annotations"] = {}  # no kubelet: no probe pod may be needed
        node["metadata"]["labels"][f"{PREFIX}/validated"] = "failed"
        node["spec"] = {"taints": [THEIRS, TAINT]}
        cp.admin.create("/api/v1/nodes", node)
        yield cp, kube.connect(str(cp.kubeconfig(ADMIN_TOKEN, "admin")))
    finally:
        cp.stop()


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def _pod(name: str, image: str) -> dict:
    return {"metadata": {"namespace": "ml", "name": name},
            "spec": {"containers": [{"name": "c", "image": image,
                                     "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]},
            "status": {"phase": "Running"}}


def test_a_workload_gone_for_60_days_no_longer_keeps_the_node_tainted(api, tmp_path):
    cp, k = api
    rec = tmp_path / "agent"
    now = time.time()
    # ran under R535 60 days ago; the driver changed to R555 59 days ago, and it never ran again
    workloads.record(str(rec), [_pod("p0", "registry.test/apps/old:1")], driver=HOST_535, when=_stamp(now - 60 * DAY))
    workloads.record(str(rec), [], driver=HOST_555, when=_stamp(now - 59 * DAY))
    host = hookenv.fake_host(tmp_path / "host", HOST_555)
    opts = validate.ValidatorOptions("gpu-old", publish_namespace="compat-hook", probe_image="i", probe_timeout=10,
                                     deadline=30, workloads_dir=str(rec), address=str(tmp_path / "none.sock"))

    # an age that still covers it: proven as before, and with its store unreachable it fails closed
    keep = from_mapping({"host_root": str(host), "nvml": "off", "log_file": None,
                         "cluster": {"workload_max_age_s": 90 * DAY}})
    result = validate.validate(k, keep, opts, HOST_555)
    assert result["result"] == "fail" and [r["code"] for r in result["images"]] == ["no_expectation"], result

    # the default age: nothing of it is left to prove; the validator passes the node and lifts its taint
    cfg = from_mapping({"host_root": str(host), "nvml": "off", "log_file": None})
    result = validate.validate(k, cfg, opts, HOST_555)
    assert (result["result"], result["images"]) == ("pass", []), result
    validate.publish(k, opts, PREFIX, result, event=False)
    node = cp.admin.get("/api/v1/nodes/gpu-old")
    # (the node lifecycle controller adds node.kubernetes.io/not-ready to this kubelet-less node)
    assert [t for t in node["spec"]["taints"] if not t["key"].startswith("node.kubernetes.io/")] == [THEIRS]
    assert node["metadata"]["labels"][f"{PREFIX}/validated"] == HOST_555
    assert cp.admin.get("/api/v1/namespaces/compat-hook/pods")["items"] == []
