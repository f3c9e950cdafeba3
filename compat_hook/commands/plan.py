"""``compat-hook plan``: each image's outcome on the host driver now and on a target driver.

The driver-upgrade preflight. For every image and each driver (now, after)
it runs :func:`compat_hook.policy.assess.assess` - the code the hook and the wrapper
run at container start - against a host that has that driver, and turns the
result into what the container gets:

* ``host``: the host driver, new enough for what the image needs;
* ``host-minor``: an older host driver of the same CUDA major (CUDA's
  minor-version compatibility): it runs, but PTX newer than the driver
  fails with 222;
* ``compat``: the image's compat driver; ``store``: a host-store package;
* ``broken``: error 35 (insufficient driver), 803 or 804.

``toolkit_only_after`` is what the NVIDIA toolkit alone (v1.20 rules, the
image's compat drop-ins and ``LD_LIBRARY_PATH`` included) gives on the
target driver, so the operator sees what compat-hook changes.

What an image needs (``needs_cuda``, ``needs_source``, ``needs_sources``) is
the highest CUDA version its runtime files or its env name
(:mod:`compat_hook.facts.cudaruntime`); disagreeing sources add a ``warnings``
entry. A source that cannot be read is a row with ``error`` and
``error_code`` and no outcome; :func:`gate` makes such a run exit
:data:`EXIT_UNREADABLE` (4) unless ``allow_unreadable``. ``--gpu`` names
resolve through :mod:`compat_hook.facts.gpunames`.

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


def render_text(report: dict) -> str:
    """The table (one row per image), the sources that could not be read, and a summary line."""
    from ..core.errors import one_line

    d = report["driver"]
    rows = [("IMAGE", "NEEDS", f"NOW {d['now']}", f"AFTER {d['after']}", "TOOLKIT ALONE AFTER", "NEEDS FROM")]
    for i in report["images"]:
        if i.get("error"):
            rows.append((one_line(i["image"]), "-", "unreadable", "-", "-", "-"))
            continue
        # where the need was read: libcudart, wheel, torch, conda, env (the path is in the JSON)
        source = i["needs_source"].split()[0] if i.get("needs_source") else "-"
        rows.append((one_line(i["image"]), i["needs_cuda"] or "-", _cell(i["now"]), _cell(i["after"]),
                     _cell(i["toolkit_only_after"]), source))
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    out = [("  ".join(r[k].ljust(widths[k]) for k in range(5)) + "  " + r[5]).rstrip() for r in rows]
    c = report.get("containerd")
    if c and c.get("address"):
        out.append(f"containerd: socket {c['address']} ({c['found_by']}), namespace {c['namespace']}")
    via: dict = {}
    for i in report["images"]:
        if i.get("read_via"):
            via.setdefault(i["read_via"], []).append(one_line(i["image"]))
    # told when an engine's store was read (a file source has no other way to be read)
    if set(via) & {"snapshot", "stream"} or any(i.get("read_via_reason") for i in report["images"]):
        slow = via.get("blobs", []) + via.get("stream", [])
        out.append("read via: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(via.items()))
                   + (f" (decompressed: {', '.join(slow[:5])}{', ...' if len(slow) > 5 else ''})"
                      if slow and "snapshot" in via else ""))
    for i in report["images"]:
        if i.get("error"):
            out.append(f"unreadable: {one_line(i['image'])}: {i['error']}")
        for w in i.get("warnings") or ():
            out.append(f"warning: {one_line(i['image'])}: {one_line(w)}")
    s = report["summary"]
    out.append(f"{s['images']} image(s): {s['broken_after']} broken after the upgrade, {s['changed']} change "
               f"outcome, {s['unreadable']} unreadable; the toolkit alone would leave "
               f"{s['broken_after_toolkit_only']} broken ({s['fixed_by_compat_hook']} kept working by compat-hook)")
    return "\n".join(out) + "\n"
