"""``compat-hook demo``: the main job on a built-in example.

It generates an image rootfs carrying a CUDA 12.9 compat driver
(``libcuda.so.575.57.08`` with NVIDIA's real note payload, made by
:mod:`compat_hook.facts.elfgen`) and a set of simulated hosts (fake
``/proc/driver/nvidia`` trees), and shows the decision for each. When runc
and a static busybox are present and we are root, it then starts real runc
containers with the hook registered and shows, from inside the container,
that the compat driver is configured on an old host, and gone again after
the same container is restarted on an upgraded host.
"""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["run_demo", "HOSTS"]

#: (label, kernel driver version, GPU model)
HOSTS = [
    ("R535 LTS, A100", "535.261.03", "NVIDIA A100-SXM4-80GB"),
    ("R550, H100", "550.54.15", "NVIDIA H100 80GB HBM3"),
    ("R575 older build, same branch", "575.51.03", "NVIDIA L40S"),
    ("R575 same build", "575.57.08", "NVIDIA L40S"),
    ("R545, branch not in the note", "545.23.08", "NVIDIA A10"),
    ("R580 (newer than the compat driver)", "580.65.06", "NVIDIA H200"),
    ("R535 on a GeForce", "535.261.03", "NVIDIA GeForce RTX 4090"),
]

_VERSION_LINE = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
                 "(dvs-builder@U16)  Tue May 20 19:00:00 UTC 2025\nGCC version:  gcc version 12.2.0\n")


def _write(path: str, data, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def make_image(rootfs: str) -> str:
    """A CUDA 12.9-style image rootfs; returns the compat driver's path."""
    from ..facts.elfgen import NOTE_575, make_elf

    compat = os.path.join(rootfs, "usr/local/cuda-12.9/compat")
    lib = os.path.join(compat, "libcuda.so.575.57.08")
    _write(lib, make_elf(note_json=NOTE_575))
    os.symlink("libcuda.so.575.57.08", os.path.join(compat, "libcuda.so.1"))
    os.symlink("cuda-12.9", os.path.join(rootfs, "usr/local/cuda"))
    _write(os.path.join(rootfs, "etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n")
    os.makedirs(os.path.join(rootfs, "etc/ld.so.conf.d"), exist_ok=True)
    return lib


def make_host(root: str, version: str, model: str) -> str:
    _write(os.path.join(root, "proc/driver/nvidia/version"), _VERSION_LINE.format(v=version))
    _write(os.path.join(root, "proc/driver/nvidia/gpus/0000:17:00.0/information"),
           f"Model: \t\t {model}\nIRQ:   \t\t 42\nBus Type: \t\t PCIe\n")
    return root


def _config(work: str, host_root: str, name: str) -> str:
    path = os.path.join(work, f"config-{name}.yaml")
    _write(path, f"host_root: {host_root}\nlog_file: {work}/compat-hook.log\n")
    return path


def _table(work: str, rootfs: str) -> None:
    from ..core import config as _config_mod
    from .explain import explain

    print("The image: /usr/local/cuda -> cuda-12.9, compat driver libcuda.so.575.57.08,")
    print('note {"CUDA version":"12.9","driver":[535,550,560,565,570,575],"device":[1,2,7..14]}\n')
    print(f"{'host':46} {'decision':8} reason")
    print(f"{'-' * 46} {'-' * 8} {'-' * 30}")
    for i, (label, version, model) in enumerate(HOSTS):
        host = make_host(os.path.join(work, f"host{i}"), version, model)
        cfg = _config_mod.load(_config(work, host, f"h{i}"))
        r = explain(cfg, rootfs=rootfs)
        print(f"{label + ' ' + version:46} {r['decision']:8} {r['reason']}")
    print("\n(each line is `compat-hook explain --rootfs IMAGE --host-root HOST`; it changes nothing)")


def _plan(work: str, rootfs: str) -> None:
    """``compat-hook plan`` for the example images across a driver upgrade."""
    import json

    from ..core import config as _config_mod
    from .plan import plan, render_text

    images = []
    for name, root, env in (("cuda-12.9-with-compat", rootfs, ["CUDA_VERSION=12.9.0"]),
                            ("cuda-12.9-no-compat", os.path.join(work, "plain"), ["CUDA_VERSION=12.9.0"]),
                            ("cuda-12.2-no-compat", os.path.join(work, "plain"), ["CUDA_VERSION=12.2.2"])):
        os.makedirs(root, exist_ok=True)
        bundle = os.path.join(work, "images", name)
        _write(os.path.join(bundle, "config.json"),
               json.dumps({"ociVersion": "1.0.2", "root": {"path": root}, "process": {"env": env}}))
        images.append(bundle)
    host = make_host(os.path.join(work, "plan-host"), "550.54.15", "NVIDIA H100 80GB HBM3")
    cfg = _config_mod.load(_config(work, host, "plan"))
    print("\nBefore a rolling upgrade from R550 to R580, `compat-hook plan IMAGE... --driver 580.65.06`")
    print("predicts each image's outcome on both drivers (the same assessment the hook runs):\n")
    report = plan(cfg, images, driver="580.65.06")
    for i in report["images"]:
        i["image"] = os.path.basename(i["image"])
    print(render_text(report), end="")


def _can_run_containers() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    for tool in ("runc", "busybox"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"{tool} not installed"
    busybox = shutil.which("busybox", path="/usr/sbin:/usr/bin:/sbin:/bin")
    with open(busybox, "rb") as f:
        head = f.read(4096)
    if b"/lib64/ld-linux" in head or b"/lib/ld-linux" in head:
        return "busybox is not static (install busybox-static)"
    return None


def _bundle(work: str, rootfs: str, hook_args: dict, name: str) -> str:
    import json
    import subprocess

    bundle = os.path.join(work, f"bundle-{name}")
    os.makedirs(bundle, exist_ok=True)
    runc = shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin")
    subprocess.run([runc, "spec"], cwd=bundle, check=True, capture_output=True)
    with open(os.path.join(bundle, "config.json")) as f:
        spec = json.load(f)
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/bin/sh", "-c",
                               "echo \"  drop-in: $(cat /etc/ld.so.conf.d/00-00-compat-hook.conf 2>/dev/null"
                               " | grep -v '^#' || echo none)\"; "
                               "echo \"  ld cache: $(strings /etc/ld.so.cache | grep -m1 compat || echo "
                               "'no compat entry')\""]
    spec["process"]["env"] = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    spec["root"] = {"path": rootfs, "readonly": False}
    spec["hooks"] = {"createContainer": [hook_args]}
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(spec, f, indent=2)
    return bundle


def _containers(work: str, rootfs: str) -> bool:
    import subprocess

    from ..core.registration import hook_entry

    busybox = shutil.which("busybox", path="/usr/sbin:/usr/bin:/sbin:/bin")
    os.makedirs(os.path.join(rootfs, "bin"), exist_ok=True)
    shutil.copy2(busybox, os.path.join(rootfs, "bin/busybox"))
    for app in ("sh", "cat", "echo", "grep", "strings"):
        os.symlink("busybox", os.path.join(rootfs, "bin", app))
    for d in ("proc", "sys", "dev", "tmp"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    runc = shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin")
    state = os.path.join(work, "runc-state")
    ok = True
    print("\nReal runc containers, one rootfs, the hook registered at createContainer:")
    steps = [("old host, R535", "535.261.03", True), ("same host after a rolling upgrade to R580", "580.65.06", False)]
    for i, (label, version, expect) in enumerate(steps):
        host = make_host(os.path.join(work, f"chost{i}"), version, "NVIDIA A100-SXM4-80GB")
        entry = hook_entry(stage="createContainer", config=_config(work, host, f"c{i}"),
                           state_dir=os.path.join(work, "state"))
        bundle = _bundle(work, rootfs, entry, f"c{i}")
        print(f"- start on the {label} ({version}):")
        p = subprocess.run([runc, "--root", state, "run", "--bundle", bundle, f"compat-hook-demo-{i}"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            print(f"  runc failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
            ok = False
            continue
        seen = "/usr/local/cuda-12.9/compat" in p.stdout
        ok = ok and seen == expect
    if ok:
        print("Proved: the hook configured the compat driver inside a real container on the old host,")
        print("and removed it when the same rootfs started again on the upgraded host (no stale drop-in).")
    else:
        print("UNEXPECTED: the containers did not show the expected compat state")
    return ok


def run_demo(containers: bool = True, keep: bool = False) -> int:
    import tempfile

    work = tempfile.mkdtemp(prefix="compat-hook-demo-")
    try:
        rootfs = os.path.join(work, "image")
        make_image(rootfs)
        _table(work, rootfs)
        _plan(work, rootfs)
        ok = True
        if containers:
            why = _can_run_containers()
            if why is None:
                ok = _containers(work, rootfs)
            else:
                print(f"\n(no real containers: {why}; the table above is the explain fallback)")
        print(f"\nDecision log (one JSON line per hook run): {work}/compat-hook.log" if keep else "")
        return 0 if ok else 1
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
