"""This node's target driver: from the NVIDIADriver that selects it, else the ClusterPolicy.

The GPU Operator takes the version from ClusterPolicy ``spec.driver.version``, or
per node pool from an NVIDIADriver's ``spec.version`` and ``nodeSelector`` (an
empty selector means nodes labelled ``nvidia.com/gpu.present=true``). The
NVIDIADriver that selects the node wins over the ClusterPolicy; ``--driver``
wins over both.

A version can be announced before it is applied: the annotation
``<prefix>/next-driver`` on either object is the target while it differs from
the object's own version, so the gate is in place before the operator moves
any node (the controller can move nodes past ``upgrade-required`` within one
reconcile of the version change).

>>> node = {"metadata": {"name": "n1", "labels": {"pool": "a", "nvidia.com/gpu.present": "true"}}}
>>> cp = {"metadata": {"name": "cluster-policy"}, "spec": {"driver": {"version": "550.163.01"}}}
>>> nd = {"metadata": {"name": "pool-a", "annotations": {"compat-hook.io/next-driver": "570.195.03"}},
...       "spec": {"version": "535.261.03", "nodeSelector": {"pool": "a"}}}
>>> t = node_target(node, [cp], [nd], prefix="compat-hook.io")
>>> (t.version, t.where, t.announced)
('570.195.03', 'NVIDIADriver pool-a annotation compat-hook.io/next-driver', True)
>>> node_target(node, [cp], [], prefix="compat-hook.io").where
'ClusterPolicy cluster-policy spec.driver.version'
>>> node_target(node, [], [], prefix="compat-hook.io").version is None
True
"""

from __future__ import annotations

__all__ = ["Target", "node_target", "selects"]

#: What an NVIDIADriver with no nodeSelector selects.
DEFAULT_SELECTOR = {"nvidia.com/gpu.present": "true"}
MAX_VERSION_LEN = 64


class Target:
    """The target driver ``version`` (None: unknown), ``where`` it came from, and whether it is ``announced``."""

    __slots__ = ("version", "where", "announced", "problem")

    def __init__(self, version, where: str, announced: bool = False, problem: str | None = None) -> None:
        self.version, self.where, self.announced, self.problem = version, where, announced, problem


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def selects(selector, labels: dict) -> bool:
    """Whether a ``nodeSelector`` (empty: the operator's default) matches node ``labels``.

    >>> selects({}, {"nvidia.com/gpu.present": "true"}), selects({"a": "1"}, {"a": "2"})
    (True, False)
    """
    sel = _map(selector) or DEFAULT_SELECTOR
    return all(isinstance(v, str) and labels.get(k) == v for k, v in sel.items())


def _version_text(v) -> str | None:
    from ..core.versions import try_parse_version

    if isinstance(v, (int, float)):
        v = str(v)
    if not isinstance(v, str) or not v or len(v) > MAX_VERSION_LEN or v.startswith("sha256:") or "@" in v:
        return None
    return v if try_parse_version(v) is not None and v.count(".") >= 1 else None


def _from(obj: dict, kind: str, spec_version, spec_path: str, prefix: str) -> Target:
    name = str(_map(obj.get("metadata")).get("name") or "?")[:253]
    key = f"{prefix}/next-driver"
    ann = _map(_map(obj.get("metadata")).get("annotations")).get(key)
    if ann is not None and str(ann) != str(spec_version):
        v = _version_text(ann)
        where = f"{kind} {name} annotation {key}"
        if v is None:
            return Target(None, where, True, problem=f"{where}: {str(ann)[:80]!r} is not a full driver version")
        return Target(v, where, True)
    where = f"{kind} {name} {spec_path}"
    v = _version_text(spec_version)
    if v is None:
        problem = None if spec_version is None else f"{where}: {str(spec_version)[:80]!r} is not a full driver version"
        return Target(None, where, False, problem=problem)
    return Target(v, where)


def node_target(node: dict, policies: list, drivers: list, *, prefix: str, override: str | None = None) -> Target:
    """The :class:`Target` for ``node`` (see the module docstring)."""
    if override is not None:
        return Target(override, "--driver")
    labels = {k: v for k, v in _map(_map(node.get("metadata")).get("labels")).items() if isinstance(v, str)}
    matching = [d for d in drivers if isinstance(d, dict) and selects(_map(d.get("spec")).get("nodeSelector"), labels)]
    if matching:
        matching.sort(key=lambda d: str(_map(d.get("metadata")).get("name")))
        if len(matching) > 1:
            names = ", ".join(str(_map(d.get("metadata")).get("name")) for d in matching[:5])
            return Target(None, "NVIDIADriver", problem=f"several NVIDIADrivers select this node: {names}")
        d = matching[0]
        return _from(d, "NVIDIADriver", _map(d.get("spec")).get("version"), "spec.version", prefix)
    for p in sorted((p for p in policies if isinstance(p, dict)), key=lambda p: str(_map(p.get("metadata")).get("name"))):
        drv = _map(_map(p.get("spec")).get("driver"))
        if drv.get("useNvidiaDriverCRD") is True:
            continue
        return _from(p, "ClusterPolicy", drv.get("version"), "spec.driver.version", prefix)
    return Target(None, "none", problem="no ClusterPolicy or NVIDIADriver names a driver version for this node")
