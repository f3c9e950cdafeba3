"""Workloads no pod has run for ``cluster.workload_max_age_s`` leave the set the validator proves.

Before, the previous driver's workloads were proven for ever: a workload deleted 60 days ago was
still to be proven after a driver change, and once the node's image GC let its image go the
validator failed it as ``not_on_node``, keeping the node tainted. The record
(``compat_hook.cluster.workload.workloads``) now drops a workload when it is older than the configured
age, the previous driver's included, and ``for_driver`` (what the validator proves) leaves it out.
"""

from __future__ import annotations

import pytest

from compat_hook.cluster.workload import workloads
from compat_hook.core.config import ConfigError, from_mapping

HOST_535, HOST_555 = "535.261.03", "555.58.02"
DAY = 86400


def _pod(name, image):
    return {"metadata": {"namespace": "ml", "name": name},
            "spec": {"containers": [{"name": "c", "image": image,
                                     "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]},
            "status": {"phase": "Running"}}


def _stamp(day: int) -> str:
    return f"2026-10-{day:02d}T10:00:00.000Z"


def _images(items) -> set:
    return {w["image"].rsplit("/", 1)[-1] for w in items}


def test_a_workload_gone_for_longer_than_the_age_is_not_proven(tmp_path):
    d = str(tmp_path)
    workloads.record(d, [_pod("old", "old:1"), _pod("new", "new:1")], driver=HOST_535, when=_stamp(1))
    workloads.record(d, [_pod("new", "new:1")], driver=HOST_535, when=_stamp(5))  # old:1 not run since day 1
    workloads.record(d, [], driver=HOST_555, when=_stamp(6))  # the driver changes
    doc = workloads.load(d)
    t = workloads._epoch(_stamp(6))
    assert _images(workloads.for_driver(doc, HOST_555, now=t)) == {"old:1", "new:1"}  # within a week
    # day 10: old:1 last ran 9 days ago, new:1 5 days ago
    t10 = workloads._epoch(_stamp(10))
    assert _images(workloads.for_driver(doc, HOST_555, now=t10)) == {"new:1"}
    assert _images(workloads.for_driver(doc, HOST_555, now=t10, max_age=2 * DAY)) == set()
    # 60 days on, nothing of the previous driver is left to prove, and the record forgets it too
    t60 = workloads._epoch("2026-12-05T10:00:00")
    assert workloads.for_driver(doc, HOST_555, now=t60) == []
    doc = workloads.record(d, [], driver=HOST_555, when="2026-12-05T10:00:00.000Z")
    assert doc["previous"]["workloads"] == [] and workloads.load(d) == doc


def test_the_age_is_a_setting_of_the_cluster_section():
    cfg = from_mapping({"cluster": {"workload_max_age_s": 3 * DAY}})
    assert workloads.max_age_of(cfg) == 3 * DAY
    assert workloads.max_age_of(from_mapping({})) == workloads.MAX_AGE_S == 7 * DAY
    for bad in (0, 60, True, "3d", 10 ** 9):
        with pytest.raises(ConfigError, match="cluster.workload_max_age_s: must be a number of seconds"):
            from_mapping({"cluster": {"workload_max_age_s": bad}})


def test_a_record_written_with_a_shorter_age_keeps_only_what_ran_within_it(tmp_path):
    d = str(tmp_path)
    workloads.record(d, [_pod("a", "a:1")], driver=HOST_535, when=_stamp(1), max_age=2 * DAY)
    doc = workloads.record(d, [_pod("b", "b:1")], driver=HOST_535, when=_stamp(4), max_age=2 * DAY)
    assert _images(doc["workloads"]) == {"b:1"}
