"""Run real OCI containers with runc or crun, plus hook helpers.

* :func:`make_bundle` writes ``config.json`` from ``runc spec``'s defaults.
* :func:`run_container` runs a bundle to completion with a private state dir
  (``--root``) and a unique id, then always ``delete --force``\\s it and removes
  the state dir.  crun refuses hybrid cgroups on the CI machine kind
  (``/sys/fs/cgroup/unified`` is a cgroup2 mount with ``hugetlb`` in
  ``cgroup.controllers``), so it runs inside ``unshare -m --propagation
  private`` with that mount removed (docs/background.md "Test machines"); the
  host's mounts are untouched.  Where no hybrid mount exists crun runs directly.
* :func:`nvidia_standin_hook` is a stand-in for the NVIDIA Container Toolkit
  legacy prestart hook: it bind-mounts a "host" libcuda into the container's
  ``/usr/lib/x86_64-linux-gnu``, runs ``ldconfig -r`` on the container root and links
  ``libcuda.so`` to ``libcuda.so.1`` there, as the toolkit's generated CDI specs do.
* :func:`container_ns_hook` runs an arbitrary command in the container's mount
  namespace (e.g. a later ``ldconfig -r {rootfs}``), :func:`hook_entry` makes
  an entry for any argv.

Hooks run without the test's environment, so every generated hook script has
its paths substituted as absolute literals, and every entry sets ``env``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import tempfile
import time
from typing import Callable, Iterable, Sequence

Path = pathlib.Path

RUNC = shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/runc"
CRUN = shutil.which("crun", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/bin/crun"
UNSHARE = shutil.which("unshare", path="/usr/bin:/bin") or "/usr/bin/unshare"
NSENTER = shutil.which("nsenter", path="/usr/bin:/bin") or "/usr/bin/nsenter"
MOUNT = shutil.which("mount", path="/usr/bin:/bin") or "/usr/bin/mount"
LDCONFIG = "/sbin/ldconfig"
HOOK_PYTHON = "/usr/bin/python3"  # never the pyenv shim on PATH (148 ms per start)

DEFAULT_ARGS = ("/usr/local/bin/probe",)
DEFAULT_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all")
HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
RUNTIME_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
CGROUP2_HYBRID = "/sys/fs/cgroup/unified"

_ids = itertools.count()
#: every private ``--root`` state dir used by this process (all removed after each run)
STATE_DIRS: list[Path] = []


# --------------------------------------------------------------------------- mounts


def _unescape(field: str) -> str:
    """Decode mountinfo's octal escapes (``\\040`` = space ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mountinfo(pid: str | int = "self") -> list[tuple[str, str]]:
    """``[(mount_point, fstype), ...]`` of ``/proc/<pid>/mountinfo``."""
    res = []
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields = pre.split()
            res.append((_unescape(fields[4]), post.split()[0]))
    return res


def mounts_under(path: Path | str) -> list[str]:
    """Mount points at or below ``path`` in the caller's mount namespace (should be ``[]``)."""
    base = os.path.realpath(str(path)).rstrip("/") or "/"
    return [mp for mp, _ in mountinfo() if mp == base or mp.startswith(base + "/")]


def cgroup_hybrid() -> bool:
    """True when ``/sys/fs/cgroup/unified`` is a cgroup2 mount (systemd "hybrid" layout)."""
    return any(mp == CGROUP2_HYBRID and fs == "cgroup2" for mp, fs in mountinfo())


# --------------------------------------------------------------------------- bundles


@functools.lru_cache(maxsize=1)
def _default_spec_text() -> str:
    with tempfile.TemporaryDirectory(prefix="runc-spec-") as d:
        subprocess.run([RUNC, "spec"], cwd=d, check=True, stdin=subprocess.DEVNULL,
                       capture_output=True, env=RUNTIME_ENV)
        return (Path(d) / "config.json").read_text()


def default_spec() -> dict:
    """A fresh copy of ``runc spec``'s default config (generated once per process)."""
    return json.loads(_default_spec_text())


def make_bundle(
    dir: Path,
    rootfs: Path,
    *,
    args: Sequence[str] = DEFAULT_ARGS,
    env: Sequence[str] = DEFAULT_ENV,
    hooks: dict | None = None,
    mounts_extra: list | None = None,
    annotations: dict | None = None,
    readonly: bool = False,
    move_rootfs: bool = False,
    edit: Callable[[dict], None] | None = None,
) -> Path:
    """Write ``<dir>/config.json`` and return ``dir``.

    ``rootfs`` at ``<dir>/rootfs`` gives ``root.path = "rootfs"``.  A rootfs
    elsewhere is used through an absolute ``root.path``, or moved to
    ``<dir>/rootfs`` when ``move_rootfs`` is true.  ``hooks`` maps stage names
    to lists of entries (see :func:`hook_entry`).  ``edit`` may change the spec
    dict last.
    """
    bundle = Path(dir)
    bundle.mkdir(parents=True, exist_ok=True)
    bundle = bundle.resolve()
    rootfs = Path(rootfs).resolve()
    if not rootfs.is_dir():
        raise FileNotFoundError(f"rootfs {rootfs} does not exist")
    if rootfs == bundle / "rootfs":
        root_path = "rootfs"
    elif move_rootfs:
        dst = bundle / "rootfs"
        if dst.exists():
            raise FileExistsError(f"{dst} exists")
        try:
            os.rename(rootfs, dst)
        except OSError:
            shutil.copytree(rootfs, dst, symlinks=True)
            shutil.rmtree(rootfs)
        root_path = "rootfs"
    else:
        root_path = str(rootfs)

    spec = default_spec()
    spec["process"]["terminal"] = False
    spec["process"]["args"] = list(args)
    spec["process"]["env"] = list(env)
    spec["root"] = {"path": root_path, "readonly": bool(readonly)}
    if hooks:
        bad = set(hooks) - set(STAGES)
        if bad:
            raise ValueError(f"unknown hook stage(s) {sorted(bad)}")
        spec["hooks"] = {stage: [dict(h) for h in entries] for stage, entries in hooks.items() if entries}
    if annotations:
        spec["annotations"] = dict(annotations)
    if mounts_extra:
        spec["mounts"] = spec.get("mounts", []) + [dict(m) for m in mounts_extra]
    if edit is not None:
        edit(spec)
    (bundle / "config.json").write_text(json.dumps(spec, indent=2) + "\n")
    return bundle


def bundle_rootfs(bundle: Path) -> Path:
    """The rootfs a bundle's config.json points at (absolute or relative root.path)."""
    root = json.loads((Path(bundle) / "config.json").read_text())["root"]["path"]
    return Path(root) if os.path.isabs(root) else Path(bundle) / root


# --------------------------------------------------------------------------- running


@dataclasses.dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    runtime: str = ""
    container_id: str = ""
    duration: float = 0.0

    @property
    def probe(self) -> dict[str, str]:
        """``key=value`` lines of the probe's stdout as a dict."""
        out = {}
        for line in self.stdout.splitlines():
            k, sep, v = line.partition("=")
            if sep and k and all(c.isalnum() or c in "_-" for c in k):
                out[k] = v
        return out

    def __str__(self) -> str:
        return (f"{self.runtime} {self.container_id}: rc={self.rc} ({self.duration:.2f}s)\n"
                f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}")


def _runtime_argv(runtime: str, state: Path, *verb: str) -> list[str]:
    if runtime == "runc":
        return [RUNC, "--root", str(state), *verb]
    if runtime == "crun":
        argv = [CRUN, "--root", str(state), *verb]
        if cgroup_hybrid():
            # crun 1.8.1 refuses hybrid cgroups ("cgroups in hybrid mode not supported, drop all
            # controllers from cgroupv2"); without the cgroup2 mount it picks legacy mode. The
            # umount happens in a private mount namespace only (docs/background.md "Test machines").
            argv = [UNSHARE, "-m", "--propagation", "private", "sh", "-c",
                    f'umount {CGROUP2_HYBRID} && exec "$@"', "sh", *argv]
        return argv
    raise ValueError(f"unknown runtime {runtime!r} (runc or crun)")


def new_container_id(prefix: str = "ch") -> str:
    return f"{prefix}{os.getpid()}-{next(_ids)}-{secrets.token_hex(3)}"


def run_container(bundle: Path, runtime: str, *, timeout: float = 60) -> Result:
    """``<runtime> run`` the bundle to completion (stdin ``/dev/null``) and clean up.

    Uses a private ``--root`` state dir and a unique container id; afterwards
    ``delete --force`` runs and the state dir is removed, whatever happened.
    """
    bundle = Path(bundle).resolve()
    cid = new_container_id()
    state = Path(tempfile.mkdtemp(prefix=f"chrt-{runtime}-"))
    STATE_DIRS.append(state)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            _runtime_argv(runtime, state, "run", "--bundle", str(bundle), cid),
            cwd=bundle, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=RUNTIME_ENV, start_new_session=True,
        )
        note = b""
        try:
            out, err = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            # Kill the container first: its processes hold our stdout/stderr pipes, and a
            # container init is pid 1 of its namespace, so it survives the runtime's death.
            # `delete --force` SIGKILLs it while `run` is still alive to notice and clean up.
            _delete(runtime, state, cid)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    out, err = proc.communicate(timeout=5)
                except subprocess.TimeoutExpired:  # pipes still held by something: stop reading
                    for f in (proc.stdout, proc.stderr):
                        f.close()
                    proc.wait()
                    out, err = b"", b"[harness] output lost: pipes held open after kill"
            rc = 124
            note = f"\n[harness] {runtime} run timed out after {timeout}s; container killed".encode()
        return Result(rc, out.decode(errors="replace"), (err + note).decode(errors="replace"),
                      runtime, cid, time.monotonic() - t0)
    finally:
        # `run` deletes the container itself when it exits; this covers timeouts and crashes.
        _delete(runtime, state, cid)
        shutil.rmtree(state, ignore_errors=True)
        _reap_cgroups(cid)


def _reap_cgroups(cid: str, wait: float = 5.0) -> None:
    """Remove the container's *empty* cgroup dirs a raced ``delete --force`` left (cgroup v1, under load).

    A ``delete --force`` while ``run`` is still tearing down can meet the init still exiting:
    rmdir gets EBUSY and the runtime gives up on an empty dir (seen once in a full run, 2 cores).
    A dir that still holds a process is a real leak and stays, for the leak checks to report.
    """
    deadline = time.monotonic() + wait
    while True:
        left = [p for p in [*Path("/sys/fs/cgroup").glob(f"*/{cid}"), Path("/sys/fs/cgroup", cid)] if p.is_dir()]
        for d in left:
            try:
                if not (d / "cgroup.procs").read_text().strip():
                    d.rmdir()
            except OSError:
                pass
        if not any(p.is_dir() for p in left) or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _delete(runtime: str, state: Path, cid: str) -> None:
    subprocess.run(_runtime_argv(runtime, state, "delete", "--force", cid), stdin=subprocess.DEVNULL,
                   capture_output=True, env=RUNTIME_ENV, timeout=30)


# --------------------------------------------------------------------------- hooks


def hook_entry(argv: list[str], env: list[str] | None = None, timeout: int = 10) -> dict:
    """OCI hook entry running ``argv`` (``argv[0]`` absolute) with an explicit env."""
    argv = [str(a) for a in argv]
    if not argv or not os.path.isabs(argv[0]):
        raise ValueError(f"hook argv[0] must be an absolute path: {argv!r}")
    return {"path": argv[0], "args": argv, "env": list(HOOK_ENV if env is None else env), "timeout": int(timeout)}


_NS_HOOK = r'''#!/usr/bin/python3 -I
# Generated by tests/support/runtimes.py: {title}
# Reads the OCI state on stdin, finds the rootfs from <bundle>/config.json and
# acts in the *container's* mount namespace: via nsenter --mount=/proc/<pid>/ns/mnt
# for runtime-namespace stages (prestart, createRuntime; pid = host pid of the
# container's init), directly for createContainer (already in that namespace,
# pre-pivot, host root visible; runc gives pid 1, crun pid 0 there).
# A host-side bind mount would be invisible in the container and leak (docs section 3).
import json, os, subprocess, sys, time
PLAN = json.loads({plan!r})

def log(msg):
    with open(PLAN["log"], "a") as f:
        f.write("%.6f %s\n" % (time.time(), msg))

def main():
    stage = PLAN["stage"]
    state = json.load(sys.stdin)
    bundle = state["bundle"]
    with open(os.path.join(bundle, "config.json")) as f:
        root = json.load(f)["root"]["path"]
    rootfs = os.path.realpath(root if os.path.isabs(root) else os.path.join(bundle, root))
    pid = int(state.get("pid") or 0)
    log("stage=%s id=%s status=%s pid=%s rootfs=%s self_mnt=%s" % (
        stage, state.get("id"), state.get("status"), pid, rootfs, os.readlink("/proc/self/ns/mnt")))
    if stage in ("createContainer", "startContainer"):
        prefix = []
    else:
        if pid <= 0:
            raise SystemExit("no usable pid in state: %r" % (state,))
        prefix = [PLAN["nsenter"], "--mount=/proc/%d/ns/mnt" % pid]
    subst = {{"rootfs": rootfs, "bundle": bundle, "pid": str(pid), "id": state.get("id", "")}}
    for src, rel in PLAN["bind"]:
        dst = os.path.join(rootfs, rel.lstrip("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.lexists(dst):
            open(dst, "a").close()  # mount point; a regular file in the rootfs dir, like NCT creates
        run(prefix + [PLAN["mount"], "--bind", src, dst])
        run(prefix + [PLAN["mount"], "-o", "remount,bind,ro,nosuid,nodev", dst])
    for argv in PLAN["run"]:
        run(prefix + [a.format(**subst) for a in argv])
    log("done")

def run(argv):
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    log("rc=%d %s %s" % (p.returncode, argv, (p.stdout + p.stderr).strip()))
    if p.returncode != 0:
        sys.stderr.write("%s failed (%d): %s\n" % (argv, p.returncode, p.stderr.strip()))
        raise SystemExit(1)

try:
    main()
except SystemExit:
    raise
except BaseException as e:
    log("error: %r" % (e,))
    sys.stderr.write("hook error: %r\n" % (e,))
    raise SystemExit(1)
'''


def _write_ns_hook(work: Path, name: str, title: str, stage: str, bind: list, run: list,
                   timeout: int) -> dict:
    if stage not in ("prestart", "createRuntime", "createContainer"):
        raise ValueError(f"stage {stage!r}: use prestart, createRuntime or createContainer")
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    script = work / f"{name}-{stage}-{secrets.token_hex(3)}.py"
    plan = {"stage": stage, "log": str(script.with_suffix(".log")), "nsenter": NSENTER, "mount": MOUNT,
            "bind": [[str(s), str(d)] for s, d in bind], "run": [[str(a) for a in argv] for argv in run]}
    script.write_text(_NS_HOOK.format(title=title, plan=json.dumps(plan)))
    script.chmod(0o755)
    return hook_entry([str(script), stage], timeout=timeout)


#: The toolkit's ``create-symlinks --link libcuda.so.1::<dir>/libcuda.so``: numba's dlopen("libcuda.so") finds it.
_LINK_LIBCUDA_SO = ["/bin/sh", "-c", "l={rootfs}/usr/lib/x86_64-linux-gnu/libcuda.so; "
                    "[ -e $l ] || [ -L $l ] || ln -s libcuda.so.1 $l"]


def nvidia_standin_hook(host_lib: Path, work: Path, stage: str = "prestart", *, timeout: int = 10,
                        host_dir: str | None = None, extra=(), ldconfig: bool = True) -> dict:
    """Hook entry for a stand-in of the NVIDIA Container Toolkit legacy prestart hook.

    Bind-mounts ``host_lib`` (read-only) onto the container's
    ``/usr/lib/x86_64-linux-gnu/libcuda.so.<ver>``, runs
    ``/sbin/ldconfig -r <rootfs>`` in the container's mount namespace, so
    ``libcuda.so.1`` resolves to it, and links ``libcuda.so`` to ``libcuda.so.1``
    (the toolkit's ``create-symlinks --link libcuda.so.1::<dir>/libcuda.so``).  Works at prestart/createRuntime
    (``nsenter``) and createContainer, under runc and crun.  Its log is
    ``work/nvidia-standin-<stage>-*.log``.

    ``host_dir``: mount it in this container dir instead, beside a ``libcuda.so.1`` link to it, as a
    device plugin mounts the host's driver dir (GKE's ``/usr/local/nvidia/lib64``); no ldconfig reads it.
    ``extra``: ``[(host file, file name, soname)]``, the driver's other libraries the plugin mounts there too
    (``libnvidia-ptxjitcompiler.so.<ver>`` beside its ``libnvidia-ptxjitcompiler.so.1`` link).
    ``ldconfig``: False leaves the ldconfig run to a later hook (:func:`start_ldconfig_hook`).
    """
    from tests.support.rootfs import lib_version  # local: keeps runtimes importable alone

    host_lib = Path(host_lib).resolve()
    ver = lib_version(host_lib)
    if host_dir is not None:
        d = host_dir.strip("/")
        return _write_ns_hook(
            work, "nvidia-standin", f"a device plugin stand-in, host libcuda {host_lib} in /{d}", stage,
            bind=[(host_lib, f"{d}/libcuda.so.{ver}")] + [(Path(f).resolve(), f"{d}/{n}") for f, n, _ in extra],
            run=[["/bin/sh", "-c", f"ln -sfn libcuda.so.{ver} {{rootfs}}/{d}/libcuda.so.1"]]
            + [["/bin/sh", "-c", f"ln -sfn {n} {{rootfs}}/{d}/{so}"] for _, n, so in extra], timeout=timeout)
    return _write_ns_hook(
        work, "nvidia-standin", f"NVIDIA Container Toolkit stand-in, host libcuda {host_lib}", stage,
        bind=[(host_lib, f"usr/lib/x86_64-linux-gnu/libcuda.so.{ver}")],
        run=([[LDCONFIG, "-r", "{rootfs}"]] if ldconfig else []) + [_LINK_LIBCUDA_SO], timeout=timeout,
    )


def start_ldconfig_hook(timeout: int = 10) -> dict:
    """A startContainer hook running the container's own ``/usr/sbin/ldconfig`` (in the container, after every
    createContainer hook): the toolkit's ``update-ldcache`` where it runs after compat-hook's hook."""
    return hook_entry(["/usr/sbin/ldconfig"], timeout=timeout)


def container_ns_hook(argv: Iterable[str], work: Path, stage: str = "prestart", *, timeout: int = 10) -> dict:
    """Hook entry running ``argv`` in the container's mount namespace (pre-pivot).

    ``{rootfs}``, ``{bundle}``, ``{pid}`` and ``{id}`` in ``argv`` are replaced
    at run time, e.g. ``[LDCONFIG, "-r", "{rootfs}"]``.
    """
    return _write_ns_hook(work, "ns-exec", f"runs {list(argv)!r}", stage, bind=[], run=[list(argv)],
                          timeout=timeout)


def ldconfig_hook(work: Path, stage: str = "prestart", *, timeout: int = 10) -> dict:
    """``/sbin/ldconfig -r <rootfs>`` in the container's mount namespace (sees the stand-in's mount)."""
    return container_ns_hook([LDCONFIG, "-r", "{rootfs}"], work, stage, timeout=timeout)
