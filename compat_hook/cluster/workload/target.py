"""This node's target driver, and whether the GPU Operator's upgrade could be held there at all.

The GPU Operator works from one ClusterPolicy. Older operators mark every other
one ``status.state: ignored`` (the first one they reconciled wins); newer ones
take the oldest (``creationTimestamp``, then the lowest name). So: the
ClusterPolicies not marked ``ignored``, oldest first, name as the tie-breaker
(:func:`active_policy`), and the target says which one it used.

* ``spec.driver.useNvidiaDriverCRD: true`` hands the driver to NVIDIADriver
  objects: the one whose ``nodeSelector`` (empty: ``nvidia.com/gpu.present=true``)
  and ``nodeAffinity`` select the node gives ``spec.version``;
* otherwise ``spec.driver.version`` of the active ClusterPolicy;
* ``--driver`` wins over both.

A version can be announced before it is applied: the annotation
``<prefix>/next-driver`` on the object in charge is the target while it
differs from the object's own version. What is accepted (:func:`check_version`)
is what the operator accepts: a full version (``570.195.03``, ``550.54``), or a
branch (``570``) where the object sets ``usePrecompiled: true`` (precompiled
driver images are tagged by branch). Anything else (``latest``, ``v570.195.03``,
a branch without ``usePrecompiled``) is a bad announcement: no target, and a
reason (``bad_announcement``) that the agent turns into a Warning Event.

A hold cannot work (``blocked``) where NVIDIA's upgrade controller does not run
its state machine: the active ClusterPolicy's ``spec.driver.upgradePolicy`` is
absent or says ``autoUpgrade: false``, ``sandboxWorkloads.enabled`` is true, the
driver is not the operator's (``spec.driver.enabled: false``, or the node's
``nvidia.com/gpu.deploy.driver=pre-installed``), or there is no ClusterPolicy.

>>> node = {"metadata": {"name": "n1", "labels": {"pool": "a", "nvidia.com/gpu.present": "true"}}}
>>> up = {"autoUpgrade": True}
>>> cp = {"metadata": {"name": "cluster-policy"}, "spec": {"driver": {"version": "550.163.01", "upgradePolicy": up}}}
>>> t = node_target(node, [cp], [], prefix="compat-hook.io")
>>> (t.version, t.where, t.blocked)
('550.163.01', 'ClusterPolicy cluster-policy spec.driver.version', None)
>>> nd = {"metadata": {"name": "pool-a", "annotations": {"compat-hook.io/next-driver": "570.195.03"}},
...       "spec": {"version": "535.261.03", "nodeSelector": {"pool": "a"}}}
>>> cpnd = {"metadata": {"name": "cp"}, "spec": {"driver": {"useNvidiaDriverCRD": True, "upgradePolicy": up}}}
>>> t = node_target(node, [cpnd], [nd], prefix="compat-hook.io")
>>> (t.version, t.where, t.announced)
('570.195.03', 'NVIDIADriver pool-a annotation compat-hook.io/next-driver', True)
>>> bad = {"metadata": {"name": "cp", "annotations": {"compat-hook.io/next-driver": "latest"}}, "spec": cp["spec"]}
>>> t = node_target(node, [bad], [], prefix="compat-hook.io")
>>> (t.version, t.reason)
(None, 'bad_announcement')
>>> off = {"metadata": {"name": "cp"}, "spec": {"driver": {"version": "550.163.01"}}}
>>> node_target(node, [off], [], prefix="compat-hook.io").blocked
'ClusterPolicy cp has no spec.driver.upgradePolicy.autoUpgrade: true (the upgrade controller does not run)'
>>> node_target(node, [], [], prefix="compat-hook.io").version is None
True
"""

from __future__ import annotations

import re

__all__ = ["Target", "node_target", "selects", "active_policy", "check_version", "Effective", "effective",
           "drives", "GPUCLUSTER_KIND"]

#: What an NVIDIADriver with no nodeSelector selects.
DEFAULT_SELECTOR = {"nvidia.com/gpu.present": "true"}
MAX_VERSION_LEN = 64
DEPLOY_DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"
_FULL = re.compile(r"[0-9]{2,4}\.[0-9]{1,4}(\.[0-9]{1,4})?")
_BRANCH = re.compile(r"[0-9]{3,4}")


class Target:
    """The target driver of a node.

    ``version``: the full version, or a precompiled branch (``branch`` true), None when unknown;
    ``where``: where it came from; ``announced``: from ``<prefix>/next-driver``;
    ``problem`` and ``reason``: why there is none (``reason`` a code: ``no_target``,
    ``bad_announcement``, ``bad_version``, ``several_drivers``); ``blocked``: why a hold
    cannot work here (None: it can); ``fixed``: given with ``--driver``.
    """

    __slots__ = ("version", "where", "announced", "problem", "reason", "blocked", "branch", "fixed")

    def __init__(self, version, where: str, announced: bool = False, problem: str | None = None,
                 reason: str | None = None, blocked: str | None = None, branch: bool = False,
                 fixed: bool = False) -> None:
        self.version, self.where, self.announced, self.problem = version, where, announced, problem
        self.reason = reason or ("no_target" if version is None else None)
        self.blocked, self.branch, self.fixed = blocked, branch, fixed

    def key(self) -> tuple:
        """What a change of target is (a new pass is due when it differs)."""
        return (self.version, self.where, self.problem, self.blocked, self.branch)

    def plan_version(self) -> str | None:
        """The version ``plan`` assesses: a branch as its first release (``570`` -> ``570.0``)."""
        if self.version is None:
            return None
        return f"{self.version}.0" if self.branch else self.version


def _map(v) -> dict:
    return v if isinstance(v, dict) else {}


def _name(obj) -> str:
    return str(_map(_map(obj).get("metadata")).get("name") or "?")[:253]


def check_version(value, precompiled: bool) -> tuple:
    """``(version or None, is_branch, problem or None)`` for a target driver text.

    >>> check_version("570.195.03", False), check_version("570", True)[:2]
    (('570.195.03', False, None), ('570', True))
    >>> check_version("570", False)[2]
    "'570' is a branch: only usePrecompiled: true takes one (else give the full version, 570.195.03)"
    >>> check_version("v570.195.03", False)[2]
    "'v570.195.03' is not a driver version (570.195.03)"
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        return None, False, "no driver version"
    t = value.strip()
    shown = repr(t[:80])
    if len(t) > MAX_VERSION_LEN:
        return None, False, f"{shown} is not a driver version"
    if t.startswith("sha256:") or "@" in t:
        return None, False, f"{shown} is an image digest: it names no version (announce one with next-driver)"
    if _FULL.fullmatch(t):
        return t, False, None
    if _BRANCH.fullmatch(t):
        if precompiled:
            return t, True, None
        return None, False, (f"{shown} is a branch: only usePrecompiled: true takes one "
                             f"(else give the full version, 570.195.03)")
    return None, False, f"{shown} is not a driver version (570.195.03)"


#: The kind of gpu-operator v26.7's experimental DRA resource: its drivers are not judged by compat-hook.
GPUCLUSTER_KIND = "GPUCluster"
_TAG_FULL = re.compile(r"([0-9]{2,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?)(?:-.*)?")
_TAG_BRANCH = re.compile(r"([0-9]{3,4})(?:-.*)?")


class Effective:
    """The driver the GPU Operator will pull for one ClusterPolicy or NVIDIADriver, resolved as the operator
    resolves it (``imagePath``): ``image`` the full reference (``""``: the operator's own default, which no
    object names), ``version`` the driver version it carries (None: not knowable from the object: a digest,
    a tag that is not a version, the default), ``branch`` a precompiled branch, ``problem`` why there is no
    version. The admission policy's CEL computes the same from the object it sees."""

    __slots__ = ("image", "version", "branch", "problem")

    def __init__(self, image: str, version, branch: bool, problem) -> None:
        self.image, self.version, self.branch, self.problem = image, version, branch, problem

    def __repr__(self) -> str:
        return f"Effective({self.image!r}, {self.version!r}, branch={self.branch}, problem={self.problem!r})"


def _text(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    return v.strip() if isinstance(v, str) else ""


def effective(obj: dict, kind: str) -> Effective:
    """The :class:`Effective` driver of ``obj`` (``kind``: ``clusterpolicy`` or ``nvidiadriver``).

    The operator's rule: ``repository`` and ``version`` both empty and ``image`` set: ``image`` as it is (a
    full path with a tag or an ``@sha256:`` digest, as kbld/carvel pin images); else
    ``repository/image:version``, or ``repository/image@version`` for a ``sha256:`` version. The version is the
    tag's leading driver version (``570.195.03-ubuntu22.04`` -> ``570.195.03``), a branch where
    ``usePrecompiled`` (``570-6.8.0-40-generic-ubuntu24.04`` -> ``570``).

    >>> cp = {"spec": {"driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "570.195.03"}}}
    >>> effective(cp, "clusterpolicy")
    Effective('nvcr.io/nvidia/driver:570.195.03', '570.195.03', branch=False, problem=None)
    >>> effective({"spec": {"image": "nvcr.io/nvidia/driver:470.256.02-ubuntu22.04"}}, "nvidiadriver").version
    '470.256.02'
    >>> e = effective({"spec": {"image": "nvcr.io/nvidia/driver@sha256:" + "a" * 64}}, "nvidiadriver")
    >>> e.version, e.problem[:45]
    (None, "'nvcr.io/nvidia/driver@sha256:aaaaaaaaaaaaaaa")
    >>> effective({"spec": {"usePrecompiled": True, "repository": "r", "image": "driver", "version": "570"}},
    ...           "nvidiadriver").branch
    True
    >>> effective({"spec": {}}, "nvidiadriver").problem
    "no driver image (the operator's default DRIVER_IMAGE): it names no version"
    """
    spec = _map(obj.get("spec"))
    if kind == "clusterpolicy":
        spec = _map(spec.get("driver"))
    repo, img, ver = _text(spec.get("repository")), _text(spec.get("image")), _text(spec.get("version"))
    precompiled = spec.get("usePrecompiled") is True
    if not repo and not ver:
        path = img
    elif ver.startswith("sha256:"):
        path = f"{repo}/{img}@{ver}"
    else:
        path = f"{repo}/{img}:{ver}"
    if not path:
        return Effective("", None, False, "no driver image (the operator's default DRIVER_IMAGE): it names no version")
    shown = repr(path[:120])
    if "@" in path:
        return Effective(path, None, False, f"{shown} is pinned by digest: it names no driver version")
    slash = path.rfind("/")
    colon = path.rfind(":")
    tag = path[colon + 1:] if colon > slash else ""
    m = (_TAG_BRANCH if precompiled else _TAG_FULL).fullmatch(tag) if len(tag) <= 128 else None
    if m is None and precompiled:
        m = _TAG_FULL.fullmatch(tag) if len(tag) <= 128 else None
    if m is None:
        return Effective(path, None, False, f"{shown}: its tag is not a driver version")
    v = m.group(1)
    return Effective(path, v, "." not in v, None)


def drives(obj: dict, kind: str, policies: list) -> bool:
    """Whether ``obj`` sets the driver of the nodes it selects, as the objects are now: a ClusterPolicy whose
    ``spec.driver.enabled`` is not false and that does not hand drivers to NVIDIADrivers; an NVIDIADriver when
    the active ClusterPolicy hands drivers to NVIDIADrivers, or there is none (gpu-operator v26.7)."""
    if kind == "clusterpolicy":
        drv = _map(_map(obj.get("spec")).get("driver"))
        return drv.get("enabled") is not False and drv.get("useNvidiaDriverCRD") is not True
    cp, _ = active_policy(policies)
    return cp is None or _map(_map(cp.get("spec")).get("driver")).get("useNvidiaDriverCRD") is True


def _expr_match(expr: dict, labels: dict) -> bool:
    key, op = expr.get("key"), expr.get("operator")
    vals = [v for v in expr.get("values") or [] if isinstance(v, str)] if isinstance(expr.get("values"), list) else []
    have = labels.get(key)
    if op == "In":
        return have in vals
    if op == "NotIn":
        return have not in vals
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and vals and have is not None:
        try:
            a, b = int(have), int(vals[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _affinity_match(affinity, labels: dict, name: str | None = None) -> bool:
    """``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`` (terms ORed; a term's
    ``matchExpressions`` on labels and ``matchFields`` on ``metadata.name`` ANDed, as the scheduler does; a
    term with neither selects nothing)."""
    req = _map(_map(affinity).get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = req.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        return True
    fields = {"metadata.name": name} if name is not None else {}
    for term in terms:
        exprs = _map(term).get("matchExpressions")
        mfields = _map(term).get("matchFields")
        exprs = exprs if isinstance(exprs, list) else []
        mfields = mfields if isinstance(mfields, list) else []
        if not exprs and not mfields:
            continue
        if all(isinstance(e, dict) and _expr_match(e, labels) for e in exprs) and \
                all(isinstance(e, dict) and e.get("key") == "metadata.name" and
                    e.get("operator") in ("In", "NotIn") and _expr_match(e, fields) for e in mfields):
            return True
    return False


def selects(selector, labels: dict, affinity=None, name: str | None = None) -> bool:
    """Whether a ``nodeSelector`` (empty: the operator's default) and ``nodeAffinity`` match ``labels``.

    >>> selects({}, {"nvidia.com/gpu.present": "true"}), selects({"a": "1"}, {"a": "2"})
    (True, False)
    >>> aff = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    ...     {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}]}}
    >>> selects({"nvidia.com/gpu.present": "true"}, {"nvidia.com/gpu.present": "true", "pool": "b"}, aff)
    True
    >>> byname = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    ...     {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]}]}}
    >>> selects({}, {"nvidia.com/gpu.present": "true"}, byname, "gpu-a"), selects({}, {"nvidia.com/gpu.present": "true"}, byname, "gpu-b")
    (True, False)
    """
    sel = _map(selector) or DEFAULT_SELECTOR
    return all(isinstance(v, str) and labels.get(k) == v for k, v in sel.items()) and \
        _affinity_match(affinity, labels, name)


def active_policy(policies: list) -> tuple:
    """``(the ClusterPolicy the operator uses or None, a note on the others or "")``.

    >>> a = {"metadata": {"name": "b", "creationTimestamp": "2026-01-01T00:00:00Z"}}
    >>> b = {"metadata": {"name": "a", "creationTimestamp": "2026-02-01T00:00:00Z"}}
    >>> c = {"metadata": {"name": "0", "creationTimestamp": "2025-01-01T00:00:00Z"}, "status": {"state": "ignored"}}
    >>> p, note = active_policy([b, c, a]); (_name(p), note)
    ('b', 'the active one of 3 (1 marked ignored)')
    """
    cps = [p for p in policies if isinstance(p, dict)]
    if not cps:
        return None, ""
    live = [p for p in cps if _map(p.get("status")).get("state") != "ignored"] or cps

    def order(p):
        meta = _map(p.get("metadata"))
        return (str(meta.get("creationTimestamp") or "~"), str(meta.get("name") or ""))

    live.sort(key=order)
    note = ""
    if len(cps) > 1:
        ignored = len(cps) - len([p for p in cps if _map(p.get("status")).get("state") != "ignored"])
        note = f"the active one of {len(cps)}" + (f" ({ignored} marked ignored)" if ignored else "")
    return live[0], note


def _blocked(cp, labels: dict) -> str | None:
    if cp is None:
        return "no ClusterPolicy: the GPU Operator's upgrade controller does not run"
    name = _name(cp)
    spec = _map(cp.get("spec"))
    drv = _map(spec.get("driver"))
    if drv.get("enabled") is False:
        return f"ClusterPolicy {name} spec.driver.enabled is false: the operator does not manage the driver"
    if labels.get(DEPLOY_DRIVER_LABEL) == "pre-installed":
        return f"the node's driver is pre-installed ({DEPLOY_DRIVER_LABEL}=pre-installed): the operator does not upgrade it"
    if _map(spec.get("sandboxWorkloads")).get("enabled") is True:
        return f"ClusterPolicy {name} sandboxWorkloads.enabled: the upgrade controller does not run"
    if _map(drv.get("upgradePolicy")).get("autoUpgrade") is not True:
        return f"ClusterPolicy {name} has no spec.driver.upgradePolicy.autoUpgrade: true (the upgrade controller does not run)"
    return None


def _blocked_by_driver(nd: dict, labels: dict) -> str | None:
    """Why a hold cannot work on a node whose NVIDIADriver carries its own ``upgradePolicy`` (gpu-operator
    v26.7: an NVIDIADriver drives upgrades with no ClusterPolicy, or its own policy beside one)."""
    name = _name(nd)
    if labels.get(DEPLOY_DRIVER_LABEL) == "pre-installed":
        return f"the node's driver is pre-installed ({DEPLOY_DRIVER_LABEL}=pre-installed): the operator does not upgrade it"
    if _map(_map(nd.get("spec")).get("upgradePolicy")).get("autoUpgrade") is not True:
        return (f"NVIDIADriver {name} has no spec.upgradePolicy.autoUpgrade: true "
                f"(the upgrade controller does not run for it)")
    return None


def _from(obj: dict, kind: str, eff: Effective, spec_path: str, precompiled: bool, prefix: str,
          note: str = "") -> Target:
    name = _name(obj)
    key = f"{prefix}/next-driver"
    ann = _map(_map(obj.get("metadata")).get("annotations")).get(key)
    suffix = f" ({note})" if note else ""
    if ann is not None and str(ann).strip() != (eff.version or ""):
        where = f"{kind} {name} annotation {key}{suffix}"
        v, branch, problem = check_version(ann, precompiled)
        if v is None:
            return Target(None, where, True, problem=f"{kind} {name} annotation {key}: {problem}",
                          reason="bad_announcement")
        return Target(v, where, True, branch=branch)
    where = f"{kind} {name} {spec_path}{suffix}"
    if not eff.image:
        return Target(None, where, problem=f"{kind} {name} names no driver version ({spec_path})")
    if eff.version is None:
        return Target(None, where, problem=f"{kind} {name} {spec_path}: {eff.problem}", reason="bad_version")
    v, branch, problem = check_version(eff.version, precompiled)
    if v is None:
        return Target(None, where, problem=f"{kind} {name} {spec_path}: {problem}", reason="bad_version")
    return Target(v, where, branch=branch)


def node_target(node: dict, policies: list, drivers: list, *, prefix: str, override: str | None = None) -> Target:
    """The :class:`Target` for ``node`` (see the module docstring)."""
    labels = {k: v for k, v in _map(_map(node.get("metadata")).get("labels")).items() if isinstance(v, str)}
    node_name = _map(node.get("metadata")).get("name")
    node_name = node_name if isinstance(node_name, str) else None
    cp, note = active_policy(policies)
    blocked = _blocked(cp, labels)
    if override is not None:
        return Target(override, "--driver", blocked=blocked, fixed=True)
    cp_driver = _map(_map(cp.get("spec")).get("driver")) if cp is not None else {}
    if cp is None or cp_driver.get("useNvidiaDriverCRD") is True:
        matching = [d for d in drivers if isinstance(d, dict) and selects(
            _map(d.get("spec")).get("nodeSelector"), labels, _map(d.get("spec")).get("nodeAffinity"), node_name)]
        if len(matching) > 1:
            names = ", ".join(sorted(_name(d) for d in matching)[:5])
            return Target(None, "NVIDIADriver", problem=f"several NVIDIADrivers select this node: {names}",
                          reason="several_drivers", blocked=blocked)
        if matching:
            d = matching[0]
            spec = _map(d.get("spec"))
            t = _from(d, "NVIDIADriver", effective(d, "nvidiadriver"), "spec.version",
                      spec.get("usePrecompiled") is True, prefix)
            # v26.7: with no ClusterPolicy, or its own upgradePolicy, the NVIDIADriver's policy is the one
            t.blocked = _blocked_by_driver(d, labels) if cp is None or isinstance(spec.get("upgradePolicy"), dict) \
                else blocked
            return t
        if cp is not None:
            return Target(None, f"ClusterPolicy {_name(cp)}", blocked=blocked,
                          problem=f"ClusterPolicy {_name(cp)} hands drivers to NVIDIADrivers and none selects this node")
        return Target(None, "none", blocked=blocked,
                      problem="no ClusterPolicy or NVIDIADriver names a driver version for this node")
    t = _from(cp, "ClusterPolicy", effective(cp, "clusterpolicy"), "spec.driver.version",
              cp_driver.get("usePrecompiled") is True, prefix, note)
    t.blocked = blocked
    return t
