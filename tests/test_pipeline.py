"""One pipeline: what ``explain --json`` plans is what the wrapper writes into config.json and
what the hook writes into the rootfs (differential, over a matrix of images, hosts and modes).

Each case builds a bundle (a rootfs with or without compat libs, baked compat drop-ins, an image
``LD_LIBRARY_PATH``, the host driver's libcuda where the runtime would mount it) and a fake host
root, then:

* runs ``compat-hook explain --bundle --json`` (a subprocess, the CLI a user runs);
* runs the wrapper's ``create`` on a copy of the bundle, with ``runtime: /bin/true`` so only
  the edit happens, and compares config.json before/after with explain's ``effects.wrapper``;
* runs the hook (``compat-hook hook`` with the state on stdin, in a private mount namespace
  like createContainer) on another copy and compares the rootfs with ``hook_actions`` (the
  drop-in, and whether ldconfig rewrote the ld cache), and the mounts it made, read from that
  namespace's ``/proc/self/mountinfo`` before the shell holding it exits, with the bind mount
  and the masks of explain's ``effects.hook``.

The assertions on the log lines (``_wiring_check_*``) are wiring checks: they show the log
carries what the same assessment planned, not that anything happened; the effect checks look at
config.json, the rootfs and the mount table themselves.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from compat_hook.effects import ldcache
from tests.conftest import Symlink, build_tree, elf, snapshot_tree
from tests.elfgen import NOTE_575

REPO = str(pathlib.Path(__file__).resolve().parent.parent)
PYTHON = "/usr/bin/python3"
COMPAT = "usr/local/cuda-12.9/compat"
SYS = "usr/lib/x86_64-linux-gnu"
STALE_LD = "/usr/local/cuda/compat:/usr/local/nvidia/lib64"

IMAGES = {
    "compat575": {f"{COMPAT}/libcuda.so.575.57.08": elf(NOTE_575),
                  f"{COMPAT}/libcuda.so.1": Symlink("libcuda.so.575.57.08"),
                  "usr/local/cuda": Symlink("cuda-12.9")},
    "no-compat": {"usr/local/cuda-12.9/lib64/libcudart.so.12": b"x", "usr/local/cuda": Symlink("cuda-12.9")},
    # conda-forge's cuda-compat, its activation links baked into the prefix's lib (issue 27)
    "conda575": {"opt/conda/cuda-compat/libcuda.so.575.57.08": elf(NOTE_575),
                 "opt/conda/cuda-compat/libcuda.so.1": Symlink("libcuda.so.575.57.08"),
                 "opt/conda/lib/libcuda.so.1": Symlink("/opt/conda/cuda-compat/libcuda.so.1"),
                 "opt/conda/lib/libcuda.so.575.57.08": Symlink("/opt/conda/cuda-compat/libcuda.so.575.57.08"),
                 "opt/conda/lib/libz.so.1": b"x"},
    # two versioned compat dirs: cuda -> 12.9 (575), and a 12.4 one (550) the image's LD_LIBRARY_PATH names
    "two-dirs": {f"{COMPAT}/libcuda.so.575.57.08": elf(NOTE_575), "usr/local/cuda": Symlink("cuda-12.9"),
                 "usr/local/cuda-12.4/compat/libcuda.so.550.54.14": elf(None),
                 "usr/local/cuda-12.4/compat/libcuda.so.1": Symlink("libcuda.so.550.54.14")},
}
#: What an image's own ENV says (its LD_LIBRARY_PATH goes after the stale one of "image-ld-path").
IMAGE_LD = {"two-dirs": "/usr/local/cuda-12.4/compat"}
HOSTS = {"older": "550.54.15", "newer": "580.65.06", "unknown": None}


def _case_ids():
    for image, host, mode, extra in itertools.product(
            IMAGES, HOSTS, ("ldconfig", "env", "both"),
            ("plain", "baked-dropin", "baked-dropin-so1", "image-ld-path", "opt-out", "no-gpu", "no-compute",
             "our-stale-dropin", "store")):
        if mode != "ldconfig" and extra in ("opt-out", "no-gpu", "no-compute"):
            continue  # the request decides alone; one mode is enough
        if extra == "store" and image != "no-compat":
            continue  # a store package is only for images without compat libs
        if image in ("conda575", "two-dirs") and extra in ("opt-out", "no-gpu", "no-compute", "our-stale-dropin",
                                                           "store"):
            continue  # the new layouts add nothing to these
        # Each case starts three or four interpreters (~0.3 s): `make test-fast` keeps a
        # cross-section (every image and host; the ld cache path, the env path with an
        # image LD_LIBRARY_PATH and with a store package), `make test` the whole matrix.
        marks = () if (mode, extra) in _FAST else (pytest.mark.slow,)
        yield pytest.param(image, host, mode, extra, id=f"{image}-{host}-{mode}-{extra}", marks=marks)


_FAST = {("ldconfig", "plain"), ("env", "image-ld-path"), ("env", "store"), ("ldconfig", "baked-dropin-so1")}


def _bundle(base: pathlib.Path, image: str, host: str | None, extra: str) -> pathlib.Path:
    entries = dict(IMAGES[image])
    entries["etc/ld.so.conf.d/x86_64-linux-gnu.conf"] = "/usr/local/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"
    entries["etc/ld.so.conf"] = "include /etc/ld.so.conf.d/*.conf\n"
    if host is not None and extra == "baked-dropin-so1":  # mounted as libcuda.so.1 alone
        entries[f"{SYS}/libcuda.so.1"] = b"\x7fELF host libcuda"
    elif host is not None:  # where the NVIDIA runtime mounts the host driver's library
        entries[f"{SYS}/libcuda.so.{HOSTS[host]}"] = b"\x7fELF host libcuda"
    if extra in ("baked-dropin", "baked-dropin-so1"):
        entries["etc/ld.so.conf.d/00-cuda-compat.conf"] = "/usr/local/cuda/compat\n"
    if extra == "our-stale-dropin":
        entries[ldcache.DROPIN_PATH.lstrip("/")] = ldcache.dropin_text("/usr/local/cuda-11.8/compat")
    build_tree(base / "rootfs", entries)
    env = ["PATH=/usr/bin:/bin", "CUDA_VERSION=12.9.0"]
    env.append("NVIDIA_VISIBLE_DEVICES=void" if extra == "no-gpu" else "NVIDIA_VISIBLE_DEVICES=all")
    ld = [STALE_LD] if extra == "image-ld-path" else []
    ld += [IMAGE_LD[image]] if image in IMAGE_LD else []
    if ld:
        env.append(f"LD_LIBRARY_PATH={':'.join(ld)}")
    if extra == "opt-out":
        env.append("COMPAT_HOOK_DISABLE=1")
    if extra == "no-compute":  # NVIDIA's runtime gives such a container no libcuda
        env.append("NVIDIA_DRIVER_CAPABILITIES=utility,video")
    spec = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"args": ["/bin/true"], "cwd": "/", "env": env, "user": {"uid": 0, "gid": 0}},
            "annotations": {}, "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]}
    (base / "config.json").write_text(json.dumps(spec, indent=1))
    return base


def _host_root(base: pathlib.Path, host: str | None) -> pathlib.Path:
    entries = {"proc/driver/nvidia": None, SYS: None}
    base.mkdir(parents=True)
    for d in entries:
        (base / d).mkdir(parents=True)
    if host is not None:
        (base / "proc/driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {HOSTS[host]}  Mon Jan  6 2025\n")
    return base


def _config(path: pathlib.Path, host_root, mode, log) -> pathlib.Path:
    path.write_text(json.dumps({"host_root": str(host_root), "mode": mode, "nvml": "off",
                                "log_file": str(log), "runtime": "/bin/true",
                                "store_dir": str(path.parent / "store")}))
    return path


def _run(argv, **kw):
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, **kw)


def _records(log: pathlib.Path) -> list:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _spec_changes(before: dict, after: dict) -> list:
    """What the wrapper changed, as explain words it (specedit.plan's lines)."""
    out = []
    b_env, a_env = before["process"]["env"], after["process"]["env"]
    b_ld = next((e for e in reversed(b_env) if e.startswith("LD_LIBRARY_PATH=")), None)
    a_ld = next((e for e in reversed(a_env) if e.startswith("LD_LIBRARY_PATH=")), None)
    for m in after.get("mounts", []):
        if m not in before.get("mounts", []):
            out.append(f"mount {m['source']} at {m['destination']} ({','.join(m.get('options', ()))})")
    if a_ld != b_ld:
        out.append(a_ld if a_ld is not None else f"unset LD_LIBRARY_PATH (was {b_ld.split('=', 1)[1]})")
    for stage, hooks in after.get("hooks", {}).items():
        for h in hooks:
            if h not in before.get("hooks", {}).get(stage, []):
                out.append(f"added {stage} hook {h['path']}")
    return out


def _hook_in_namespace(hb: pathlib.Path, conf: pathlib.Path, state_dir: pathlib.Path):
    """Run the hook as at createContainer, in a private mount namespace standing in for the
    container's, and read that namespace's mount table before and after it (before the shell that
    holds the namespace exits). Returns ``(process, mountinfo before, mountinfo after)``."""
    state = json.dumps({"ociVersion": "1.0.2", "id": "cid", "status": "creating", "pid": 1, "bundle": str(hb)})
    before, after = hb.parent / "mountinfo.before", hb.parent / "mountinfo.after"
    script = ('cat /proc/self/mountinfo > "$1"; shift; after="$1"; shift; "$@"; rc=$?; '
              'cat /proc/self/mountinfo > "$after"; exit $rc')
    h = _run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", str(before), str(after),
              PYTHON, "-m", "compat_hook", "hook", "--stage", "createContainer", "--config", str(conf),
              "--state-dir", str(state_dir)], input=state, env={"PATH": "/usr/bin:/bin"})
    return h, _mountinfo(before), _mountinfo(after)


def _mountinfo(path: pathlib.Path) -> list:
    """``[(mount id, major:minor, root, mount point, options, fstype)]`` of a saved /proc/self/mountinfo."""
    out = []
    for line in path.read_text().splitlines():
        left, right = line.split(" - ", 1)
        f = left.split()
        out.append((f[0], f[2], f[3], f[4], set(f[5].split(",")), right.split()[0]))
    return out


def _observed_hook_mounts(before: list, after: list, rootfs: pathlib.Path) -> list:
    """The mounts the hook made under ``rootfs``, worded as explain's ``effects.hook`` words them."""
    ids = {m[0] for m in before}
    base = str(rootfs.resolve())
    out = []
    new = [m for m in after if m[0] not in ids and (m[3] + "/").startswith(base + "/")]
    for mid, dev, root, point, opts, fstype in new:
        inside = point[len(base):] or "/"
        assert "ro" in opts, (point, opts)  # every mount the hook makes is read-only
        if fstype == "tmpfs" and root == "/":
            # a mask: empty, or holding only the compat file it keeps as the host's (a bind mount inside it)
            kept = [m[3].rsplit("/", 1)[1] for m in new if m[3].rsplit("/", 1)[0] == point]
            out.append(f"mask {inside} with a read-only tmpfs holding only {', '.join(kept)}, the host's libcuda "
                       "(createContainer)" if kept else f"mask {inside} with an empty read-only tmpfs (createContainer)")
            continue
        # a bind mount: map its root back to a host path through a mount of the same device
        src = [m[3].rstrip("/") + root[len(m[2].rstrip("/")):] for m in before
               if m[1] == dev and (root + "/").startswith(m[2].rstrip("/") + "/")]
        out.append(f"bind-mount {min(src, key=len) if src else '?' + root} at {inside} (ro, createContainer)")
    return out


def _planned_hook_mounts(plan: dict, rootfs: pathlib.Path) -> list:
    """explain's ``effects.hook`` mount and mask lines, targets resolved in the rootfs (as the hook does)."""
    from compat_hook.facts.rootfs import Root

    out = []
    with Root(str(rootfs)) as root:
        for line in plan["effects"]["hook"]:
            if line.startswith("bind-mount ") and " over " in line.split(" (ro, ", 1)[0]:
                # the host's libcuda (or /dev/null) over a compat file: a bind mount like any other
                src, rest = line[len("bind-mount "):].split(" over ", 1)
                if src.endswith(" (in the container)"):  # the host library the runtime put in the rootfs
                    src = str(rootfs.resolve()) + src[:-len(" (in the container)")]
                out.append(f"bind-mount {src} at {root.realpath(rest.split(' (', 1)[0])} (ro, createContainer)")
            elif line.startswith("bind-mount "):
                src, rest = line[len("bind-mount "):].split(" at ", 1)
                target = rest.rsplit(" (", 1)[0]
                try:
                    target = root.realpath(target)
                except OSError:
                    pass  # not there yet: the hook creates it
                out.append(f"bind-mount {src} at {target} (ro, createContainer)")
            elif line.startswith("mask "):
                out.append(line)
    return out


def _wiring_check_wrapper(plan: dict, wrec: dict) -> None:
    """Wiring check, not an effect: the wrapper's log line carries what explain planned (the same
    assessment reached both). The effect is checked on config.json itself."""
    assert (wrec["decision"], wrec["reason"]) == (plan["decision"], plan["reason"])
    assert wrec["actions"] == plan["effects"]["wrapper"]


def _wiring_check_hook(plan: dict, hrec: dict) -> None:
    """Wiring check, not an effect: the hook's log line carries explain's decision and planned ld cache
    actions. The effects are checked on the rootfs and in the mount namespace."""
    assert hrec.get("error") is None, hrec
    assert (hrec["decision"], hrec["reason"], hrec["effect"]) == (plan["decision"], plan["reason"], plan["effect"])
    assert hrec["planned"] == [a for a, _ in plan["hook_actions"]]


def _effect_check_ld_cache(plan: dict, snap: dict, rootfs: pathlib.Path) -> None:
    """``refresh the container's ld cache`` planned: ldconfig really rewrote /etc/ld.so.cache; else untouched."""
    now = snapshot_tree(rootfs).get(b"etc/ld.so.cache")
    was = snap.get(b"etc/ld.so.cache")
    if "refresh the container's ld cache (ldconfig -r)" in plan["effects"]["hook"]:
        assert now is not None and now != was, (was, now)
    else:
        assert now == was


@pytest.mark.parametrize("image, host, mode, extra", list(_case_ids()))
def test_explain_plans_what_the_wrapper_and_the_hook_do(tmp_path, image, host, mode, extra):
    src = _bundle(tmp_path / "src", image, host, extra)
    host_root = _host_root(tmp_path / "host", host)
    log = tmp_path / "log" / "compat-hook.log"
    conf = _config(tmp_path / "config.yaml", host_root, mode, log)
    if extra == "store":  # a stored cuda-compat package (575, note 12.9) the image may get
        pkg = build_tree(tmp_path / "pkg", {"compat/libcuda.so.575.57.08": elf(NOTE_575),
                                             "compat/libcuda.so.1": Symlink("libcuda.so.575.57.08")})
        add = _run([PYTHON, "-m", "compat_hook", "store", "add", str(pkg), "--config", str(conf)])
        assert add.returncode == 0, add.stderr

    out = _run([PYTHON, "-m", "compat_hook", "explain", "--bundle", str(src), "--config", str(conf), "--json"])
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)

    # -- the wrapper, on its own copy -------------------------------------------------
    wb = tmp_path / "wrapper-bundle"
    shutil.copytree(src, wb, symlinks=True)
    before = json.loads((wb / "config.json").read_text())
    env = {"PATH": "/usr/bin:/bin", "COMPAT_HOOK_CONFIG": str(conf),
           "COMPAT_HOOK_STATE_DIR": str(tmp_path / "state")}
    w = _run([PYTHON, "-c", "import sys; from compat_hook.commands.runtime import main; sys.exit(main())",
              "create", "--bundle", str(wb), "cid"], env=env)
    assert w.returncode == 0, w.stderr
    after = json.loads((wb / "config.json").read_text())
    assert _spec_changes(before, after) == plan["effects"]["wrapper"], (before, after)
    [wrec] = [r for r in _records(log) if r["event"] == "runtime"]
    _wiring_check_wrapper(plan, wrec)

    # -- the hook, on its own copy, in a private mount namespace (as at createContainer) --
    hb = tmp_path / "hook-bundle"
    shutil.copytree(src, hb, symlinks=True)
    snap = snapshot_tree(hb / "rootfs")
    h, mounts_before, mounts_after = _hook_in_namespace(hb, conf, tmp_path / "state")
    assert h.returncode == 0, h.stderr
    [hrec] = [r for r in _records(log) if r["event"] == "hook"]
    _wiring_check_hook(plan, hrec)
    # effects.hook's mounts and masks, as the container's mount namespace shows them
    assert _observed_hook_mounts(mounts_before, mounts_after, hb / "rootfs") == \
        _planned_hook_mounts(plan, hb / "rootfs"), (plan["effects"]["hook"], hrec["actions"])
    _effect_check_ld_cache(plan, snap, hb / "rootfs")
    dropin = hb / "rootfs" / ldcache.DROPIN_PATH.lstrip("/")
    written = [arg for act, arg in plan["hook_actions"] if act == "write_dropin"]
    if written:
        purpose = "host" if plan["effect"] == "host" else "compat"
        assert dropin.read_text() == ldcache.dropin_text(written[0], purpose)
    elif ["remove_dropin", None] in plan["hook_actions"]:
        assert not os.path.lexists(dropin)
    elif plan["hook_actions"] == [["ldconfig", None]]:  # masked a compat dir: only the cache is rebuilt
        after = snapshot_tree(hb / "rootfs")
        assert {k for k in set(snap) | set(after) if snap.get(k) != after.get(k)} <= {b"etc", b"etc/ld.so.cache"}
    else:
        assert snapshot_tree(hb / "rootfs") == snap  # nothing planned, nothing changed

    # -- the policy the two share -------------------------------------------------------
    if plan["effect"] == "host":
        assert any(e.startswith("added createContainer hook") for e in plan["effects"]["wrapper"])
        if extra == "image-ld-path":
            assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in plan["effects"]["wrapper"]
    if extra == "baked-dropin-so1" and plan["effect"] == "host" and image == "compat575":
        # the host library cannot be named: the compat dir is hidden at createContainer instead
        # (keeping its compat file as the host's library: an absolute dlopen of it maps the host's)
        assert plan["effects"]["hook"][0].startswith("mask /usr/local/cuda-12.9/compat with a"), plan["effects"]
        assert hrec["actions"][0].startswith("masked /usr/local/cuda-12.9/compat ("), hrec
        assert plan["hook_actions"] == [["ldconfig", None]] and not plan["warnings"]
    # -- the new layouts (issue 27): the compat dirs the decision did not choose lose ------
    if image == "conda575" and plan["effect"] == "host":
        # conda's links in /opt/conda/lib dangle once the package's dir is hidden
        # (the package's libcuda file stays, as the host's: the links into it name libcuda.so.1, which is gone)
        assert any(e.startswith("mask /opt/conda/cuda-compat with a") for e in plan["effects"]["hook"]), plan
        assert any(a.startswith("masked /opt/conda/cuda-compat (") for a in hrec["actions"]), hrec
    if image == "conda575" and plan["effect"] == "compat":
        assert plan["compat_dir"] == "/opt/conda/cuda-compat" and not any(
            e.startswith("mask ") for e in plan["effects"]["hook"])
    if image == "two-dirs" and plan["effect"] in ("compat", "host"):
        losers = [x["dir"] for x in plan["losing_compat_dirs"]]
        assert "/usr/local/cuda-12.4/compat" in losers and (plan["effect"] == "host") == ("/" + COMPAT in losers)
        # the wrapper takes the losing entry off LD_LIBRARY_PATH in every mode; the hook alone hides it
        assert not any("/usr/local/cuda-12.4/compat" in e for e in plan["effects"]["wrapper"]
                       if e.startswith("LD_LIBRARY_PATH=")), plan["effects"]["wrapper"]
        assert any(e.startswith(("LD_LIBRARY_PATH=", "unset LD_LIBRARY_PATH")) for e in plan["effects"]["wrapper"])
        assert any(e.startswith("mask /usr/local/cuda-12.4/compat with a") for e in plan["effects"]["hook"]), plan
        if plan["effect"] == "compat":
            assert plan["compat_dir"] == "/" + COMPAT
    if extra == "store" and host == "older":
        assert plan["reason"] == "store_package"
        assert f"mount {tmp_path}/store/575.57.08 at /usr/local/cuda/compat (rbind,ro,nosuid,nodev)" \
            in plan["effects"]["wrapper"]
        assert hrec["actions"][0].startswith(f"bind-mounted {tmp_path}/store/575.57.08 at ")
    if extra == "no-compute":
        assert (plan["reason"], plan["effect"]) == ("no_compute_capability", "leave")
        assert (hrec["reason"], wrec["reason"]) == ("no_compute_capability", "no_compute_capability")
    if plan["reason"] in ("host_driver_unknown", "opt_out", "no_gpu_request", "no_compute_capability"):
        assert not any(e.startswith("LD_LIBRARY_PATH") or e.startswith("unset")
                       for e in plan["effects"]["wrapper"])
