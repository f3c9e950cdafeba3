"""The hook's environment and cwd as an attack surface (NVIDIAScape, CVE-2025-23266).

The image controls the cwd of a createContainer hook under runc (the rootfs)
and, under a runtime that ignores a hook's ``env``, the environment too
(crun passes its own environ, including the image ``ENV``, to a hook that has
no ``env``). The planted payloads write a marker file on the host when they
run: Python modules the hook imports (``yaml``, ``json``, ``re``, ``os`` ...,
``elftools``, ``compat_hook`` itself), ``site``/``sitecustomize``/
``usercustomize``, and a shared object built with gcc whose constructor runs
under ``LD_PRELOAD``.

* With the registered entry (explicit ``env``), nothing the image planted
  runs, under a direct exec, runc and crun.
* Worst case, a runtime that ignores ``env`` and passes the hijacked
  environment: ``-I -S`` still keeps every ``PYTHON*`` variable, the cwd, the
  user site and ``site`` out; the entry's ``--config``/``--state-dir`` win over
  ``COMPAT_HOOK_*``. The decision is the correct one.
* ``LD_PRELOAD`` and ``LD_LIBRARY_PATH`` are honoured by the dynamic loader
  before Python runs: no interpreter flag can stop them. Only the explicit
  ``env`` does, which is why every entry carries one. The positive controls
  show the payloads do fire when given the chance, so their silence above
  means something.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from tests.support import hostile as h
from tests.support import runtimes as rt

Path = pathlib.Path

#: file (relative to the planted dir) -> marker name
PY_PAYLOADS = {
    "yaml.py": "yaml", "yaml/__init__.py": None,  # a module and a package of the same name: one wins
    "json.py": "json", "re.py": "re", "os.py": "os", "typing.py": "typing", "struct.py": "struct",
    "stat.py": "stat", "errno.py": "errno", "zlib.py": "zlib", "resource.py": "resource",
    "select.py": "select", "ctypes.py": "ctypes", "importlib.py": "importlib",
    "site.py": "site", "sitecustomize.py": "sitecustomize", "usercustomize.py": "usercustomize",
    "encodings/__init__.py": "encodings", "elftools/__init__.py": "elftools",
    "elftools/elf/__init__.py": "elftools.elf", "compat_hook/__init__.py": "compat_hook",
    "compat_hook/cli.py": "compat_hook.cli",  # the stable entry point the boot code imports
    "compat_hook/commands/cli.py": "compat_hook.commands.cli", "compat_hook/commands/hook.py": "compat_hook.commands.hook",
    "startup.py": "startup",
    ".local/lib/python3.11/site-packages/usercustomize.py": "user-site",
    ".local/lib/python3.11/site-packages/evil.pth": None,
}


def _payload(markers: Path, name: str) -> str:
    return f"open({str(markers / name)!r}, 'a').write('ran\\n')\n"


def plant(where: Path, markers: Path, so: Path) -> None:
    """Put every payload under ``where`` (the rootfs or the bundle: whatever the cwd is)."""
    for rel, name in PY_PAYLOADS.items():
        p = where / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".pth"):
            p.write_text("import os; " + _payload(markers, "pth").strip() + "\n")
        elif name is None:
            p.write_text(_payload(markers, rel.replace("/", "."))) if not p.exists() else None
        else:
            p.write_text(_payload(markers, name))
    shutil.copyfile(so, where / "poc.so")
    (where / "evil.yaml").write_text(f"log_file: {where / 'evil.log'}\nldconfig: /bin/false\n")


def hijacked_env(entry: dict, where: Path, *, preload: bool = False) -> dict:
    """The entry's env plus what an image ``ENV`` could add (the "runtime ignores env" case)."""
    env = h.entry_env(entry)
    env.update({
        "PYTHONPATH": f"{where}:.:/proc/self/cwd",
        "PYTHONHOME": str(where),
        "PYTHONSTARTUP": str(where / "startup.py"),
        "PYTHONINSPECT": "1",
        "PYTHONUSERBASE": str(where / ".local"),
        "PYTHONPYCACHEPREFIX": str(where / "pycache"),
        "PYTHONWARNINGS": "error",
        "PYTHONPLATLIBDIR": str(where),
        "PYTHONSAFEPATH": "",
        "PYTHONNOUSERSITE": "",
        "PYTHONEXECUTABLE": str(where / "python"),
        "PYTHONBREAKPOINT": "os.system",
        "HOME": str(where),
        "COMPAT_HOOK_CONFIG": str(where / "evil.yaml"),
        "COMPAT_HOOK_STATE_DIR": str(where / "evil-state"),
        "COMPAT_HOOK_DISABLE": "1",
    })
    if preload:
        env["LD_PRELOAD"] = "/proc/self/cwd/poc.so"
    return env


@pytest.fixture(scope="module")
def marker_so(tmp_path_factory):
    d = tmp_path_factory.mktemp("marker-so")
    return d, h.build_marker_so(d / "poc.so", d / "markers" / "preload")


@pytest.fixture
def setup(tmp_path, marker_so):
    so_dir, so = marker_so
    markers = so_dir / "markers"  # compiled-in path of the .so's marker
    markers.mkdir(exist_ok=True)
    for m in markers.iterdir():
        m.unlink()
    env = h.make_hook_env(tmp_path / "hookenv")
    bundle = h.write_bundle(tmp_path / "bundle")
    root = h.base_rootfs(bundle / "rootfs")
    plant(root, markers, so)
    yield env, bundle, root, markers
    for m in markers.iterdir():
        m.unlink()


@pytest.fixture(autouse=True)
def _no_leaks(tmp_path):
    yield
    assert rt.mounts_under(tmp_path) == []
    assert h.processes_mentioning(str(tmp_path)) == []


def _fired(markers: Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir())


def _assert_correct_decision(env: h.HookEnv, root: Path) -> None:
    rec = env.last_record()
    assert rec["decision"] == "enable" and rec["compat_dir"] == h.COMPAT_DIR, rec
    assert (root / h.DROPIN).read_text() == h.dropin_text(h.COMPAT_DIR)


def test_registered_entry_is_explicit(setup):
    env, _, _, _ = setup
    e = env.entry
    assert e["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"]
    assert not any(v.startswith(("LD_", "PYTHON")) for v in e["env"])
    assert e["args"][1:3] == ["-I", "-S"]
    # absolute, and the real interpreter, not a shim script: it may be the
    # stable /usr/bin/python3 link, but what it resolves to is an ELF binary
    assert os.path.isabs(e["path"]) and e["args"][0] == e["path"]
    with open(os.path.realpath(e["path"]), "rb") as f:
        assert f.read(4) == b"\x7fELF"
    assert "--config" in e["args"] and "--state-dir" in e["args"]


def test_registered_env_with_hostile_cwd(setup):
    env, bundle, root, markers = setup
    res = h.run_hook(env.entry, h.state_json(bundle), cwd=root)
    assert res.rc == 0 and res.stderr == b"", res
    assert _fired(markers) == []
    _assert_correct_decision(env, root)


def test_worst_case_runtime_ignores_env(setup):
    """Every PYTHON* variable, HOME and COMPAT_HOOK_* pointing into the image, cwd = rootfs."""
    env, bundle, root, markers = setup
    res = h.run_hook(env.entry, h.state_json(bundle), cwd=root, env=hijacked_env(env.entry, root))
    assert res.rc == 0, res
    assert b"Traceback" not in res.stderr, res
    assert _fired(markers) == []
    _assert_correct_decision(env, root)
    assert not (root / "evil-state").exists() and not (root / "evil.log").exists()
    assert not (root / "pycache").exists()
    assert len(env.log_records()) == 1


def _private_var(tmp: Path):
    """preexec_fn: a private mount namespace whose /var/log and /var/lib are test dirs.

    The default registration names no --config and no --state-dir, so the hook
    uses /etc/compat-hook/config.yaml (absent: defaults), /var/log/compat-hook.log
    and /var/lib/compat-hook: those land in ``tmp`` instead of on the host.
    """
    log, lib = os.fsencode(tmp / "var-log"), os.fsencode(tmp / "var-lib")
    os.makedirs(log)
    os.makedirs(lib)

    def pre():
        h.check_rc(h.libc.unshare(h.CLONE_NEWNS), "unshare")
        h.check_rc(h.libc.mount(None, b"/", None, h.MS_REC | h.MS_PRIVATE, None), "private")
        h.check_rc(h.libc.mount(log, b"/var/log", None, h.MS_BIND, None), "bind /var/log")
        h.check_rc(h.libc.mount(lib, b"/var/lib", None, h.MS_BIND, None), "bind /var/lib")

    return pre


def test_worst_case_default_entry_ignores_COMPAT_HOOK_env(setup, tmp_path):
    """The default registration names no --config / --state-dir: an image ENV must not pick them.

    Otherwise ``COMPAT_HOOK_CONFIG=/proc/self/cwd/evil.yaml`` (cwd = the rootfs)
    hands the image the hook's settings: ``ldconfig:`` is a program the hook
    runs as root on the host, ``log_file:`` a host file it appends to, and
    ``COMPAT_HOOK_STATE_DIR`` a host directory it creates and writes.
    """
    env, bundle, root, markers = setup
    entry = h.registered_entry(None, None)
    assert "--config" not in entry["args"] and "--state-dir" not in entry["args"]
    fake = root / "fakehost/proc/driver/nvidia"
    fake.mkdir(parents=True)
    (fake / "version").write_text(h.HOST_VERSION_LINE)
    h.build_marker_exe(root / "evil-ldconfig", markers / "evil-ldconfig")
    # An attacker who can guess the rootfs' host path (overlay snapshot dirs are
    # numbered) names it; /proc/self/cwd works for everything the hook opens itself.
    (root / "evil.yaml").write_text(
        f"host_root: {root / 'fakehost'}\nldconfig: {root / 'evil-ldconfig'}\n"
        "log_file: /proc/self/cwd/evil.log\nstore_inject: false\nnvml: 'off'\n")
    hij = hijacked_env(entry, root)
    hij["COMPAT_HOOK_CONFIG"] = "/proc/self/cwd/evil.yaml"
    hij["COMPAT_HOOK_STATE_DIR"] = "/proc/self/cwd/evil-state"
    res = h.run_hook(entry, h.state_json(bundle), cwd=root, env=hij, preexec_fn=_private_var(tmp_path))
    assert res.rc == 0, res
    assert _fired(markers) == [], "the image chose the hook's ldconfig"
    assert not (root / "evil.log").exists(), "the image chose the hook's log file"
    assert not (root / "evil-state").exists(), "the image chose the hook's state dir"


def test_worst_case_with_cwd_bundle_like_crun(setup):
    """crun's createContainer cwd is the bundle: plant there too."""
    env, bundle, root, markers = setup
    _, so = markers.parent, markers.parent / "poc.so"
    plant(bundle, markers, so)
    res = h.run_hook(env.entry, h.state_json(bundle), cwd=bundle, env=hijacked_env(env.entry, bundle))
    assert res.rc == 0, res
    assert _fired(markers) == []
    _assert_correct_decision(env, root)


def test_positive_control_python_payloads_fire_without_isolation(setup):
    """Without -I -S, PYTHONPATH and the cwd run the image's code: the markers above are live."""
    env, bundle, root, markers = setup
    ctl = root / "ctl"
    ctl.mkdir()
    for name in ("json", "yaml", "sitecustomize"):
        (ctl / f"{name}.py").write_text(_payload(markers, name))
    (root / "cwdmod.py").write_text(_payload(markers, "cwd"))
    hij = dict(h.entry_env(env.entry), PYTHONPATH=str(ctl))
    res = h.run_hook(env.entry, b"", cwd=root, env=hij,
                     args=[env.entry["path"], "-c", "import json, yaml, cwdmod"])
    assert res.rc == 0, res
    fired = _fired(markers)  # yaml: the cwd's package or PYTHONPATH's module, whichever comes first
    assert {"cwd", "json", "sitecustomize"} <= set(fired) and any(f.startswith("yaml") for f in fired), fired
    # The same, isolated as the entry is: nothing.
    for m in markers.iterdir():
        m.unlink()
    res = h.run_hook(env.entry, b"", cwd=root, env=hij,
                     args=[env.entry["path"], "-I", "-S", "-c", "import json\ntry:\n import cwdmod\nexcept ImportError: pass"])
    assert res.rc == 0, res
    assert _fired(markers) == [], res


def test_positive_control_ld_preload_fires_when_env_is_inherited(setup):
    """LD_PRELOAD runs before the interpreter: only the explicit env keeps it out (see module doc)."""
    env, bundle, root, markers = setup
    res = h.run_hook(env.entry, h.state_json(bundle), cwd=root, env=hijacked_env(env.entry, root, preload=True))
    assert res.rc == 0, res
    assert _fired(markers) == ["preload"], res  # the loader ran it; Python's -I -S kept the rest out
    _assert_correct_decision(env, root)


@pytest.mark.containers
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_real_runtime_image_env_does_not_reach_hook(runtime, setup):
    """The image ENV carries LD_PRELOAD=/proc/self/cwd/poc.so and PYTHON*; the hook is registered."""
    env, bundle, root, markers = setup
    h.rm_tree(root)
    h.busybox_rootfs(root)
    so = markers.parent / "poc.so"
    plant(root, markers, so)
    plant(bundle, markers, so)
    image_env = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"] + [
        f"{k}={v}" for k, v in hijacked_env(env.entry, Path("/"), preload=True).items()
        if k.startswith(("LD_", "PYTHON")) or k == "HOME"]
    rt.make_bundle(bundle, root, args=["/bin/sh", "-c", "cat /etc/ld.so.conf.d/00-00-compat-hook.conf"],
                   env=image_env, hooks={"createContainer": [env.entry]})
    res = rt.run_container(bundle, runtime, timeout=60)
    assert res.rc == 0 and h.COMPAT_DIR in res.stdout, str(res)
    assert _fired(markers) == [], "image code ran in the hook"
    rec = env.last_record()
    assert rec["decision"] == "enable" and rec["stage"] == "createContainer", rec
    assert json.loads(json.dumps(rec))  # one valid record
