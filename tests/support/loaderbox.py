"""Images whose compat libcuda sits where the dynamic loader, not a fixed path, finds it (issue 32).

The pieces the loader tests share (tests/test_loader_containers.py, tests/test_loader_differential.py):

* :class:`Image` describes one image: files and links under the harness rootfs
  (tests/support/rootfs.py), ``/etc/ld.so.conf`` and its drop-ins, the process (env, args,
  cwd, user). :meth:`Image.build` writes it into a fresh rootfs and runs the build-time
  ``ldconfig -r`` (before ``after_ldconfig`` steps, e.g. NGC removing its ``compat/lib`` link).
* :class:`Box` is one fake host (a driver version and a GPU model in
  ``/proc/driver/nvidia``; NVML off, so the brand comes from the model name), one config, one
  log, and one pristine rootfs of an image, copied afresh for each start so that no start sees
  what an earlier one left (compat-hook's drop-in, the toolkit stand-in's ``ldconfig``).
  It starts the image without compat-hook, with compat-hook's hook (createContainer, runc or
  crun) and through compat-hook's runtime wrapper (runc behind it), always with the NVIDIA
  toolkit stand-in (tests/support/runtimes.py ``nvidia_standin_hook``) mounting the host's
  real libcuda at its versioned name and running ``ldconfig -r``; and runs ``explain --json``
  on the very spec the container gets (hooks left out).

What a start maps is the probe's word (``dlopen("libcuda.so.1")``, then the realpath the loader
mapped and ``cuDriverGetVersion``): the loader's, never compat-hook's.

Also shared by the one-row tests of issue 42 (tests/test_shadow_containers.py,
tests/test_readonly_userns_containers.py): the link-time stub (:func:`build_stub`), a read-only
root (:func:`readonly_edit`) and a user namespace (:func:`userns_edit`, :func:`open_to_mapped`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess

from compat_hook.core import logjson, registration
from compat_hook.install.wrapper import render_wrapper
from tests.support import debs, hookenv, rootfs, runtimes as rt
from tests.support.trees import write_fake_host

Path = pathlib.Path

SYS = "/usr/lib/x86_64-linux-gnu"
PY = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
#: The GPU models the fake hosts report (``/proc/driver/nvidia/gpus/<bdf>/information``).
DATA_CENTER = "NVIDIA H100 80GB HBM3"
GEFORCE = "NVIDIA GeForce RTX 4090"
BRANDS = {"dc": DATA_CENTER, "geforce": GEFORCE}
#: A pixi workspace's manifest (beside its ``.pixi/envs``).
PIXI_TOML = '[workspace]\nname = "app"\nchannels = ["conda-forge"]\nplatforms = ["linux-64"]\n'
#: The CUDA toolkit's stub: every entry point answers CUDA_ERROR_STUB_LIBRARY.
STUB_C = "int cuInit(unsigned f) { (void)f; return 34; }\nint cuDriverGetVersion(int *v) { (void)v; return 34; }\n"
#: The host uid a user-namespaced container's root maps to.
MAPPED = 100000


def build_stub(d: Path) -> Path:
    """A link-time stub ``d/libcuda.so.1`` (soname ``libcuda.so.1``) built from :data:`STUB_C`."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stub.c").write_text(STUB_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(d / "libcuda.so.1"),
                    str(d / "stub.c")], check=True, capture_output=True)
    return d / "libcuda.so.1"


def readonly_edit(spec: dict) -> None:
    """``root.readonly: true`` (crun makes the root read-only before createContainer, runc after)."""
    spec["root"]["readonly"] = True


def userns_edit(spec: dict) -> None:
    """A user namespace: the container's root is :data:`MAPPED` on the host."""
    spec["linux"]["namespaces"].append({"type": "user"})
    spec["linux"]["uidMappings"] = [{"containerID": 0, "hostID": MAPPED, "size": 65536}]
    spec["linux"]["gidMappings"] = [{"containerID": 0, "hostID": MAPPED, "size": 65536}]
    # sysfs cannot be mounted anew in a user namespace without a network namespace of its own
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/sys"] + [
        {"destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}]
    spec["linux"].pop("resources", None)


def open_to_mapped(path: Path, rootfs: Path | None = None) -> None:
    """Make ``path`` and the dirs above it passable by the mapped root (a hook in the user namespace
    reads its config and writes its log's spool under them); ``rootfs``: chown it to that uid."""
    p = Path(path)
    while str(p) != "/":
        os.chmod(p, os.stat(p).st_mode | 0o011)
        p = p.parent
    if rootfs is not None:
        subprocess.run(["chown", "-R", f"{MAPPED}:{MAPPED}", str(rootfs)], check=True)


def host_lib(version: str) -> str:
    """Where the toolkit stand-in mounts the host's library in the container."""
    return f"{SYS}/libcuda.so.{version}"


@dataclasses.dataclass
class Image:
    """One image: what it carries and how its process starts.

    ``libs``: in-container dir -> libcuda version installed there (``libcuda.so.<ver>`` and the
    ``libcuda.so.1``/``libcuda.so`` links); ``links``: path -> symlink target; ``files``:
    path -> text; ``ld_so_conf``: the whole ``/etc/ld.so.conf`` (None: the harness's
    ``include`` line); ``after_ldconfig``: links removed after the build-time ldconfig;
    ``runpath_probe``: where to put a probe built with ``DT_RUNPATH $ORIGIN/../lib``;
    ``rpath_probe``: ``(where, dir)``, a probe built with ``DT_RPATH`` naming ``dir``;
    ``copies``: path -> a file of this machine copied there (a stub library); ``readonly``: a
    read-only root (:func:`readonly_edit`); ``userns``: a user namespace (:func:`userns_edit`).
    """

    libs: dict = dataclasses.field(default_factory=dict)
    links: dict = dataclasses.field(default_factory=dict)
    files: dict = dataclasses.field(default_factory=dict)
    ld_so_conf: str | None = None
    after_ldconfig: list = dataclasses.field(default_factory=list)
    runpath_probe: str | None = None
    rpath_probe: tuple | None = None
    env: list = dataclasses.field(default_factory=list)
    args: list = dataclasses.field(default_factory=lambda: ["/usr/local/bin/probe"])
    cwd: str = "/"
    uid: int = 0
    passwd: list = dataclasses.field(default_factory=list)
    copies: dict = dataclasses.field(default_factory=dict)  # path -> a file of this machine copied there
    readonly: bool = False  # root.readonly in config.json
    userns: bool = False  # a user namespace, its root MAPPED on the host

    def build(self, root: Path, libcuda: dict) -> None:
        """Write the image into the harness rootfs ``root`` (``libcuda``: version -> real file)."""
        for d, ver in self.libs.items():
            rootfs.install_libcuda(root, libcuda[ver], d)
        for link, target in self.links.items():
            p = root / link.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, p)
        for path, src in self.copies.items():
            p = root / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, p)
        for path, text in self.files.items():
            p = root / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        if self.ld_so_conf is not None:
            (root / "etc/ld.so.conf").write_text(self.ld_so_conf)
        if self.runpath_probe is not None:
            p = root / self.runpath_probe.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(rootfs.probe_binary(runpath="$ORIGIN/../lib").read_bytes())
            p.chmod(0o755)
        if self.rpath_probe is not None:
            where, rpath = self.rpath_probe
            p = root / where.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(rootfs.probe_binary(rpath=rpath).read_bytes())
            p.chmod(0o755)
        for line in self.passwd:
            with open(root / "etc/passwd", "a") as f:
                f.write(line + "\n")
            name, _, uid, gid, _, home, _ = line.split(":")
            h = root / home.lstrip("/")
            h.mkdir(parents=True, exist_ok=True)
            os.chown(h, int(uid), int(gid))
        rootfs.run_ldconfig(root)  # the image's own build-time ldconfig
        for link in self.after_ldconfig:
            (root / link.lstrip("/")).unlink()

    def spec_edit(self, spec: dict) -> None:
        spec["process"]["cwd"] = self.cwd
        spec["process"]["user"] = {"uid": self.uid, "gid": self.uid}
        if self.readonly:
            readonly_edit(spec)
        if self.userns:
            userns_edit(spec)


@dataclasses.dataclass
class Loaded:
    """What one start mapped, or why it did not (``error``)."""

    cuda: int | None
    path: str | None
    error: str = ""
    id: str | None = None  # st_dev:st_ino of the mapped file (a bind mount keeps the name, not these)
    #: the probe's PROBE_ALSO names: name -> (realpath, st_dev:st_ino), or (None, the dlopen error)
    also: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, res: rt.Result) -> "Loaded":
        p = res.probe
        if res.rc != 0 or "cuDriverGetVersion" not in p:
            return cls(None, p.get("libcuda"), f"exit {res.rc}: {(res.stdout + res.stderr).strip()[-400:]}")
        also = {}
        for k, v in p.items():
            if k.startswith("also") and k[4:].isdigit():
                name, _, rest = v.partition(" ")
                where, _, what = rest.partition(" ")
                also[name] = (None, what) if where == "error" else (where, what)
        return cls(int(p["cuDriverGetVersion"]), p["libcuda"], id=p.get("libcuda_id"), also=also)

    def pair(self) -> tuple:
        return self.cuda, self.path


class Box:
    """One fake host (driver ``host``, GPU ``model``), one config, one log, one pristine image rootfs."""

    def __init__(self, tmp: Path, libcuda: dict, host: str, image: Image, *, model: str = DATA_CENTER,
                 host_dir: str | None = None, host_extra=(), ldconfig_at_start: bool = False, **config) -> None:
        self.tmp, self.libcuda, self.host, self.image = Path(tmp), libcuda, host, image
        self.host_dir = host_dir  # None: the toolkit's place (SYS); else a device plugin's dir
        self.host_extra = list(host_extra)  # [(host file, name, soname)] the device plugin mounts beside libcuda
        # the toolkit stand-in's ldconfig at startContainer (after compat-hook's hook), not with its mount at prestart
        self.ldconfig_at_start = ldconfig_at_start
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.host_root = write_fake_host(self.tmp / "host", version=host, gpus={"0000:17:00.0": model}).resolve()
        # the host's driver dir holds its libcuda (the runtime wrapper's source for the host's library)
        os.symlink(str(libcuda[host]), self.host_root / SYS.lstrip("/") / f"libcuda.so.{host}")
        self.log = self.tmp / "compat-hook.log"
        self.state = self.tmp / "state"
        self.config = hookenv.write_config(self.tmp / "config.yaml", host_root=self.host_root, log_file=self.log,
                                           nvml="off", **config)
        self.pristine = rootfs.build_rootfs(self.tmp / "pristine")
        image.build(self.pristine, libcuda)
        if image.userns:  # the hook runs as the mapped root: its line goes to the log's spool
            open_to_mapped(self.tmp)
            logjson.prepare_spool(str(self.log))
        self._n = 0
        self.started: list = []

    # -- rootfs copies -------------------------------------------------------
    def fresh(self, name: str) -> Path:
        """A copy of the pristine rootfs at ``<tmp>/<name>-<n>/rootfs`` (its bundle dir is the parent)."""
        self._n += 1
        bundle = self.tmp / f"{name}-{self._n}"
        bundle.mkdir()
        subprocess.run(["cp", "-a", str(self.pristine), str(bundle / "rootfs")], check=True)
        if self.image.userns:
            open_to_mapped(bundle, bundle / "rootfs")
        return bundle / "rootfs"

    def _edit(self, spec: dict) -> None:
        """The image's own edits, then a device plugin's mount of the host's driver dir (``host_dir``): as GKE's
        plugin hands the kubelet its mounts, a bind mount of a host dir in the spec, which the runtime makes
        before any hook runs (and ``explain`` and the wrapper read); each of the driver's files is bound over
        its name there, so that a process mapping it maps the host's very file."""
        self.image.spec_edit(spec)
        if self.host_dir is None:
            return
        ver = self.host
        files = [(Path(self.libcuda[ver]).resolve(), f"libcuda.so.{ver}", "libcuda.so.1")]
        files += [(Path(f).resolve(), n, so) for f, n, so in self.host_extra]
        plugin = self.tmp / "device-plugin"
        if not plugin.exists():
            plugin.mkdir()
            for _, name, so in files:
                (plugin / name).touch()  # where the host's file is bound
                os.symlink(name, plugin / so)
        d = self.host_dir.rstrip("/")
        spec.setdefault("mounts", []).append({"destination": d, "type": "bind", "source": str(plugin),
                                              "options": ["rbind", "ro"]})
        spec["mounts"] += [{"destination": f"{d}/{name}", "type": "bind", "source": str(src), "options": ["bind", "ro"]}
                           for src, name, _ in files]

    def _bundle(self, root: Path, hooks: dict) -> Path:
        return rt.make_bundle(root.parent, root, hooks=hooks, env=self.image.env, args=self.image.args,
                              edit=self._edit)

    def _standin(self, root: Path) -> dict:
        return rt.nvidia_standin_hook(self.libcuda[self.host], root.parent / "work", "prestart",
                                      ldconfig=not self.ldconfig_at_start)

    def _hooks(self, root: Path, create=()) -> dict:
        """The spec's hooks: the toolkit stand-in (none where a device plugin's mount brings the driver),
        ``create`` at createContainer, its late ldconfig if so."""
        hooks = {"prestart": [self._standin(root)]} if self.host_dir is None else {}
        if create:
            hooks["createContainer"] = list(create)
        if self.ldconfig_at_start:
            hooks["startContainer"] = [rt.start_ldconfig_hook()]
        return hooks

    # -- starts --------------------------------------------------------------
    def alone(self, runtime: str = "runc") -> Loaded:
        """Without compat-hook: what the layout loads on its own (the toolkit stand-in only)."""
        root = self.fresh("alone")
        return self._run(root, self._hooks(root), runtime)

    def hook(self, runtime: str, root: Path | None = None) -> Loaded:
        """compat-hook registered at createContainer (as users register it), under ``runtime``."""
        root = root or self.fresh("hook")
        hooks = self._hooks(root, [registration.hook_entry(stage="createContainer", config=str(self.config),
                                                           state_dir=str(self.state))])
        return self._run(root, hooks, runtime)

    def _run(self, root: Path, hooks: dict, runtime: str) -> Loaded:
        res = rt.run_container(self._bundle(root, hooks), runtime)
        self.started.append(res.container_id)
        self.last = res
        return Loaded.of(res)

    def wrapper(self, root: Path | None = None) -> Loaded:
        """Through compat-hook's runtime wrapper (runc behind it), which edits config.json on create."""
        root = root or self.fresh("wrapper")
        wrapper = self.tmp / "bin" / "compat-hook-runtime"
        if not wrapper.exists():
            wrapper.parent.mkdir(parents=True)
            wrapper.write_text(render_wrapper(str(self.config), python=PY))
            wrapper.chmod(0o755)
        bundle = self._bundle(root, self._hooks(root))
        cid = rt.new_container_id("ldr")
        state = self.tmp / "runc-state"
        rt.STATE_DIRS.append(state)
        try:
            p = subprocess.run([str(wrapper), "--root", str(state), "run", "--bundle", str(bundle), cid],
                               cwd=bundle, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               env=dict(ENV, COMPAT_HOOK_STATE_DIR=str(self.state)), timeout=120)
        finally:
            subprocess.run([rt.RUNC, "--root", str(state), "delete", "--force", cid], capture_output=True, env=ENV)
            subprocess.run(["rm", "-rf", str(state)], capture_output=True)
        self.started.append(cid)
        self.last = rt.Result(p.returncode, p.stdout, p.stderr, str(wrapper), cid)
        return Loaded.of(self.last)

    def cleanup(self) -> None:
        """Remove the rootfs copies (a few hundred MB a box); a leaked mount keeps them, for the leak checks."""
        if rt.mounts_under(self.tmp) == []:
            for d in [self.pristine, *self.tmp.glob("*-[0-9]*/rootfs")]:
                shutil.rmtree(d, ignore_errors=True)

    # -- what compat-hook says -------------------------------------------------
    def explain(self, root: Path) -> dict:
        """``explain --json`` on the spec a start of ``root`` gets, hooks left out (read-only)."""
        b = root.parent / "explain-bundle"
        rt.make_bundle(b, root, env=self.image.env, args=self.image.args, edit=self._edit)
        p = subprocess.run([PY, "-m", "compat_hook", "explain", "--json", "--config", str(self.config),
                            "--bundle", str(b)], cwd=str(REPO), capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise AssertionError(f"explain failed (exit {p.returncode}): {p.stderr.strip()}")
        return json.loads(p.stdout)

    def log_records(self) -> list:
        """The log's records, the lines a user-namespaced hook spooled merged first (as the next
        start on the host merges them)."""
        if self.image.userns:
            self.log.touch()
            logjson.merge_spool(str(self.log))
        return hookenv.read_log(self.log)

    def records(self, event: str = "hook") -> list:
        return [r for r in self.log_records() if r.get("event") == event]

    def why(self) -> str:
        """The last log record's decision, in one line (for failure messages)."""
        recs = self.log_records()
        if not recs:
            return "no compat-hook record"
        r = recs[-1]
        return (f"{r.get('event')}: {r.get('decision')}/{r.get('reason')} effect={r.get('effect')} "
                f"compat_dir={r.get('compat_dir')} actions={r.get('actions')} error={r.get('error')}")


def predicted(report: dict, actor: str) -> tuple:
    """``(result, dir)`` explain predicts for ``actor`` (``with_hook`` or ``with_wrapper``)."""
    tk = report.get("toolkit") or {}
    got = tk.get(actor) or {}
    return got.get("result"), got.get("dir")


def outcome(loaded: Loaded, host: str, root: Path | None = None, host_file: str | None = None) -> tuple:
    """``(result, dir)`` of a real start, in explain's terms: the host library, or compat from a dir.

    With the probe's ``PROBE_ID`` (the mapped file's ``st_dev:st_ino``) the file is told by its identity,
    not its name. ``root``: the rootfs of that start: where compat-hook put a compat libcuda over the
    host's file (an ``LD_LIBRARY_PATH`` dir before the compat dir), the host's name maps the compat
    file, and the file of the rootfs with that device and inode names its dir. ``host_file``: the
    host's libcuda on this machine: a start that maps that very file under a compat file's name (the
    host's library bind-mounted in its place, compat_hook.policy.hostover, also in a mask that keeps
    the file) maps the host's driver.
    """
    if loaded.path == host_lib(host):
        if root is not None and loaded.id and loaded.cuda is not None and loaded.cuda != debs.EXPECTED_CUDA[host]:
            for dirpath, _dirs, names in os.walk(root):
                for n in names:
                    p = os.path.join(dirpath, n)
                    if n.startswith("libcuda.so.") and not os.path.islink(p):
                        st = os.stat(p)
                        if f"{st.st_dev}:{st.st_ino}" == loaded.id:
                            return "compat", "/" + os.path.relpath(dirpath, root)
        return "host", None
    if host_file is not None and loaded.id is not None:
        st = os.stat(host_file)
        if loaded.id == f"{st.st_dev}:{st.st_ino}":
            return "host", None
    if loaded.path is None:
        return "error", None
    if root is not None and loaded.id is not None:
        # another file mounted over the name (a compat libcuda over a stub, over the host's driver in a
        # device plugin's dir): the rootfs's file of that identity names the dir
        named = root / loaded.path.lstrip("/")
        if not named.exists() or _id(named) != loaded.id:
            for dirpath, _dirs, names in os.walk(root):
                for n in names:
                    p = os.path.join(dirpath, n)
                    if n.startswith("libcuda.so.") and not os.path.islink(p) and _id(p) == loaded.id:
                        return "compat", "/" + os.path.relpath(dirpath, root)
    return "compat", os.path.dirname(loaded.path)


def _id(path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"



def resolve(root: Path, path: str, depth: int = 0) -> str | None:
    """``path`` resolved inside the rootfs ``root`` as the container sees it (absolute links
    from the rootfs's top), or ``None`` where a component is missing."""
    if depth > 40:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    cur = "/"
    for i, part in enumerate(parts):
        if part == "..":
            cur = os.path.dirname(cur.rstrip("/")) or "/"
            continue
        nxt = os.path.join(cur, part)
        host = root / nxt.lstrip("/")
        if host.is_symlink():
            target = os.readlink(host)
            base = target if target.startswith("/") else os.path.join(cur, target)
            rest = "/".join(parts[i + 1:])
            return resolve(root, base + ("/" + rest if rest else ""), depth + 1)
        if not os.path.lexists(host):
            return None
        cur = nxt
    return cur
