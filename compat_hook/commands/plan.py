"""``compat-hook plan``: each image's outcome on the host driver now and on a target driver.

The driver-upgrade preflight. For every image and each driver (now, after)
it runs :func:`compat_hook.policy.assess.assess` - the code the hook and the wrapper
run at container start - against a host that has that driver, and turns the
result into what the container gets (:mod:`compat_hook.policy.outcome`, CUDA's
compatibility rules):

* ``host``: the host driver, new enough for what the image needs;
* ``host-minor``: an older host driver of the same CUDA major (CUDA's
  minor-version compatibility): it runs, but PTX newer than the driver
  fails with 222;
* ``compat``: the image's compat driver; ``store``: a host-store package;
* ``compat-minor`` (``store-minor``): the compat driver serves an image
  built for a newer minor of the same CUDA major: it runs, with the same
  222 caveat;
* ``broken``: error 35 (a major-version gap), 803 or 804 (a wrong compat
  driver loaded), or 100 (``gpu_unsupported_by_driver``: the driver branch
  does not drive the GPU, :mod:`compat_hook.facts.gpusupport`).

``toolkit_only_after`` is what the NVIDIA toolkit alone (v1.20 rules, the
image's compat drop-ins and ``LD_LIBRARY_PATH`` included) gives on the
target driver, so the operator sees what compat-hook changes.
``regression`` marks a row that works now and is broken after (on another
driver); the summary counts ``regressions`` apart from
``broken_now_and_after``.

What an image needs (``needs_cuda``, ``needs_source``, ``needs_sources``) is
the highest CUDA version its runtime files or its env name
(:mod:`compat_hook.facts.cudaruntime`); disagreeing sources add a ``warnings``
entry. A source that cannot be read is a row with ``error`` and
``error_code`` and no outcome; :func:`gate` makes such a run exit
:data:`EXIT_UNREADABLE` (4) unless ``allow_unreadable``. ``--gpu`` names
resolve through :mod:`compat_hook.facts.gpunames`; without ``--gpu`` the
host's GPUs are read, the ones on the PCI bus the driver does not list
included (``gpus[].listed_by_driver``).

Exit: 0; 3 when ``--fail-on broken`` (an image broken after), ``regression``
(an image that works now broken after) or ``change`` (an outcome changes)
is met; 4 (first) when a source was unreadable or nothing was read; 2 bad usage.

The report is built by :mod:`compat_hook.policy.preflight` (also the cluster
agent's), the outcome model is :mod:`compat_hook.policy.outcome`, the sources
are opened by :mod:`compat_hook.images.sources`; this module prints.
"""

from __future__ import annotations

from ..policy.preflight import EXIT_GATE, EXIT_UNREADABLE, exit_status, gate, gpus_from_names, plan

__all__ = ["plan", "render_text", "gpus_from_names", "gate", "exit_status", "EXIT_GATE", "EXIT_UNREADABLE"]


def _cell(r) -> str:
    if r is None:
        return "-"
    s = r["outcome"]
    if r.get("cuda"):
        s += f" {r['cuda']}"
    if r.get("error"):
        s += f" ({r['error']})"
    return s


def _name(i: dict) -> str:
    """A row's first column: the image, or a workload's name and runtime."""
    from ..core.errors import one_line

    if i.get("workload"):
        return one_line(f"{i.get('name') or i.get('image')} [{i.get('runtime')}]")
    return one_line(str(i.get("image")))


def render_text(report: dict) -> str:
    """The table (one row per image), what could not be read, the regressions, the GPUs a driver
    does not drive, and a summary line."""
    from ..core.errors import one_line

    d = report["driver"]
    rows = [("IMAGE", "NEEDS", f"NOW {d['now']}", f"AFTER {d['after']}", "TOOLKIT ALONE AFTER", "NEEDS FROM")]
    for i in report["images"]:
        if i.get("error"):
            rows.append((_name(i), "-", "unreadable", "-", "-", "-"))
            continue
        if i.get("unknown"):
            rows.append((_name(i), "-", "unknown", "-", "-", "-"))
            continue
        # where the need was read: libcudart, wheel, torch, conda, env (the path is in the JSON)
        source = i["needs_source"].split()[0] if i.get("needs_source") else "-"
        rows.append((_name(i), i["needs_cuda"] or "-", _cell(i["now"]), _cell(i["after"]),
                     _cell(i["toolkit_only_after"]), source))
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    out = [("  ".join(r[k].ljust(widths[k]) for k in range(5)) + "  " + r[5]).rstrip() for r in rows]
    for i in report["images"]:
        lib = i.get("image_libcuda") or {}
        for link, target in (lib.get("symlinked") or {}).items():
            out.append(f"{_name(i)}: compat file {link} links to {target}")
        for path in lib.get("userland") or []:
            out.append(f"{_name(i)}: userland libcuda {path}")
        for d, name in (lib.get("ldconfig_picks") or {}).items():
            out.append(f"{_name(i)}: ldconfig links {d}/libcuda.so.1 -> {name} (the host's mounted beside it)")
    c = report.get("containerd")
    if c and c.get("address"):
        out.append(f"containerd: socket {c['address']} ({c['found_by']}), namespace {c['namespace']}")
    via: dict = {}
    for i in report["images"]:
        if i.get("read_via"):
            via.setdefault(i["read_via"], []).append(_name(i))
    # told when an engine's store was read (a file source has no other way to be read)
    if set(via) & {"snapshot", "stream"} or any(i.get("read_via_reason") for i in report["images"]):
        slow = via.get("blobs", []) + via.get("stream", [])
        out.append("read via: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(via.items()))
                   + (f" (decompressed: {', '.join(slow[:5])}{', ...' if len(slow) > 5 else ''})"
                      if slow and "snapshot" in via else ""))
    gpu_lines: list = []
    for i in report["images"]:
        if i.get("error"):
            out.append(f"unreadable: {_name(i)}: {i['error']}")
        if i.get("unknown"):
            out.append(f"unknown: {_name(i)}: {one_line(i['unknown'])}")
        for w in i.get("warnings") or ():
            out.append(f"warning: {_name(i)}: {one_line(w)}")
        if i.get("regression"):
            out.append(f"regression: {_name(i)}: {_cell(i['now'])} now, {_cell(i['after'])} after "
                       f"({i['after']['reason']})")
        for when, key in (("now", "now"), ("after", "after")):
            for g in (i.get(key) or {}).get("unsupported_gpus") or ():
                line = f"no device {when} ({d[key]}): {one_line(g)}"
                if line not in gpu_lines:
                    gpu_lines.append(line)
    out.extend(gpu_lines)
    s = report["summary"]
    unknown = f", {s['unknown_workloads']} not assessed" if s.get("unknown_workloads") else ""
    out.append(f"{s['images']} image(s): {s['broken_after']} broken after the upgrade, {s['changed']} change "
               f"outcome, {s['unreadable']} unreadable{unknown}; the toolkit alone would leave "
               f"{s['broken_after_toolkit_only']} broken ({s['fixed_by_compat_hook']} kept working by compat-hook); "
               f"{s['regressions']} regression(s) (working now, broken after), {s['broken_now_and_after']} "
               "broken now and after")
    return "\n".join(out) + "\n"
