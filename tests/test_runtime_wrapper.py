"""``compat-hook-runtime``: the shell fast path, the Python wrapper and real runc containers.

* The shell wrapper's ``runtime:`` reader agrees with Python's (``read_runtime_line``)
  on every file, and with the YAML config loader on every valid one it is sure of;
  on the others it hands over to Python.
* Every verb but create/run reaches the real runtime with the same argv and
  without Python (the rendered interpreter path is bogus in those tests).
* create/run edit config.json atomically and exactly (JSON trees compared),
  then exec the real runtime: real runc containers on the harness rootfs
  (busybox, glibc, the probe) with real Debian libcuda builds. The "host
  driver" is a fake host root (its /proc/driver/nvidia/version) plus the
  harness's NVIDIA-toolkit stand-in hook that bind-mounts the host libcuda.

The helpers shared with tests/test_containerd.py (``write_config``,
``standin_runtime``...) are in tests/support/wrapperenv.py.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import random
import stat
import subprocess

import pytest

from compat_hook.facts.container import ANNOTATION_LD_BEFORE

from compat_hook.commands import runtime as rtw
from compat_hook.core.realruntime import read_runtime_line
from compat_hook.install.wrapper import render_wrapper
from compat_hook.effects import specedit
from compat_hook.commands import store
from compat_hook.core.registration import hook_entry
from tests.support.wrapperenv import (SYS_LIB, fake_host, log_records, probe_of, standin_calls,  # noqa: F401
                                      standin_runtime, write_config)
from tests.support import debs, rootfs, runtimes as rt
from tests.support.trees import machine_driver_argv
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

PY = "/usr/bin/python3"
RUNC = rt.RUNC
H535, C550, H555 = HOST_535, COMPAT_550, HOST_555
COMPAT_DIR = "/usr/local/cuda-12.4/compat"
PROBE = "/usr/local/bin/probe"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


# --------------------------------------------------------------------------- helpers


def render(path: pathlib.Path, config_path, *, python: str | None = None) -> pathlib.Path:
    """Write the rendered shell wrapper to ``path`` (mode 0755)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_wrapper(str(config_path) if config_path else None, python=python))
    path.chmod(0o755)
    return path


def spec_diff(before: dict, after: dict) -> dict:
    """Top-level/process keys that differ (for messages)."""
    out = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    return out


# --------------------------------------------------------------------------- the runtime: reader


def _yaml_runtime(text: str):
    """What the Python config loader says the runtime is (``None``: the config is invalid)."""
    import yaml

    from compat_hook.core.config import from_mapping

    try:
        return from_mapping(yaml.safe_load(text)).runtime
    except Exception:
        return None


RUNTIME_LINES = [
    None, "runtime: crun", 'runtime: "crun"', "runtime: 'crun'", "runtime: crun # the fast one",
    "runtime: crun\t# tab comment", "runtime:    nvidia-container-runtime   ", "runtime: /usr/bin/crun",
    'runtime: "/opt/rt/runc+1.0_x"   # quoted path', "runtime: crun#no-space", "runtime: true",
    "runtime: off", "runtime: 123", 'runtime: "123"', "runtime: rel/path", "runtime:", "runtime: ~",
    "runtime: null", "runtime: a b", "runtime: &anchor crun", "runtime: !!str crun", "runtime: crun\r",
    "runtime:\tcrun", '"runtime": crun', "runtime : crun", "runtime:crun", "runtime: 'cr''un'",
    'runtime: "cr\\x75n"', "runtime: crun extra", "runtime: -crun", "runtime: .runc", "runtime: Runc",
    "runtime: _x", "runtime: \"crun", "runtime: crun'", "runtime: [crun]", "runtime: {a: b}",
]

CONTEXTS = [
    ("", ""),
    ("# compat-hook config\n\n", "\n# end\n"),
    ("mode: env\non_error: continue\n", "log_file: /var/log/compat-hook.log\n"),
    ('log_file: "/var/log/x.log"  # quoted\n', "store_target: '/usr/local/cuda/compat'\n"),
    ("annotations:\n  runtime: nvidia-container-runtime\n  a: b\n", "compat_dirs:\n- /usr/local/cuda/compat\n"),
    ("compat_dirs:\n  - /usr/local/cuda/compat\n  - /opt/compat\n", "dry_run: false\n"),
    ("compat_dirs: [/usr/local/cuda/compat, /opt/c]\n", "annotations: {x: y}\n"),
    ("---\n", "...\n"),
    ("runtime: runc\n", ""),                       # a duplicate key: the last one wins
    ("", "runtime: crun\n"),
    ("annotations: {\nruntime: crun\n}\n", ""),    # flow mapping over lines
    ('log_file: "/a\nruntime: crun\n"\n', ""),     # a double-quoted scalar over lines
    ("log_file: '/a''\nruntime: crun\nx: y'\n", ""),  # an escaped quote, then more lines
    ('compat_dirs: ["/a", "/b"]\n', ""),
    ("compat_dirs: [/a, # c\n  /b]\n", ""),
    ("host_driver_version: |\n  550.54.15\n", ""),
    ("x: &a crun\n", "runtime: *a\n"),
    ("{mode: env}\n", ""),
    ("? runtime\n: crun\n", ""),
    ("mode: env\r\n", "dry_run: true\r\n"),
    ("\ufeffmode: env\n", ""),
    ("mode:env\n", ""),
    ("Mode: env\n", ""),
    ("mode: env\n  # indented comment\n", ""),
    ("%YAML 1.1\n---\n", ""),
]


def corpus() -> list:
    texts = []
    for pre, post in CONTEXTS:
        for line in RUNTIME_LINES:
            texts.append(pre + (line + "\n" if line is not None else "") + post)
    rng = random.Random(4)
    fragments = [c for c, _ in CONTEXTS] + [p for _, p in CONTEXTS] + [ln + "\n" for ln in RUNTIME_LINES if ln]
    for _ in range(150):
        texts.append("".join(rng.choice(fragments) for _ in range(rng.randint(1, 5))))
    texts.append("runtime: crun")  # no newline at the end
    return texts


def test_python_line_reader_agrees_with_the_yaml_loader():
    checked_sure = 0
    for text in corpus():
        quick, sure = read_runtime_line(text)
        full = _yaml_runtime(text)
        if sure and full is not None:
            assert quick == full, (text, quick, full)
            checked_sure += 1
    assert checked_sure >= 150


@pytest.mark.slow
def test_shell_reader_agrees_with_python(tmp_path):
    wrapper = render(tmp_path / "w.sh", None, python="/nonexistent/python3")
    cfg = tmp_path / "config.yaml"
    sure_plain = 0
    texts = corpus()
    # One shell per file; the files are checked in batches to keep it quick.
    script = tmp_path / "batch.sh"
    for start in range(0, len(texts), 100):
        batch = texts[start:start + 100]
        lines = []
        for i, text in enumerate(batch):
            p = tmp_path / f"c{start + i}.yaml"
            p.write_bytes(text.encode("utf-8"))
            lines.append(f"COMPAT_HOOK_CONFIG={p} {wrapper} --compat-hook-resolve")
        script.write_text("\n".join(lines) + "\n")
        out = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, env=ENV)
        assert out.returncode == 0, out.stderr
        results = out.stdout.splitlines()
        assert len(results) == len(batch), out
        for text, res in zip(batch, results):
            quick, sure = read_runtime_line(text)
            assert res == (f"runtime={quick}" if sure else "unsure"), (text, res, quick, sure)
            full = _yaml_runtime(text)
            if sure and full is not None:
                assert quick == full, (text, quick, full)
                sure_plain += 1
    assert sure_plain >= 150
    # The plain, realistic files are read without Python.
    for text, want in [("runtime: crun\n", "crun"), ("# c\nmode: env\nruntime: \"/usr/bin/crun\"  # x\n", "/usr/bin/crun"),
                       (pathlib.Path("config/compat-hook.yaml").read_text(), "runc"), ("", "runc"),
                       ("compat_dirs:\n  - /a\nannotations:\n  runtime: x\nruntime: nvidia-container-runtime\n",
                        "nvidia-container-runtime")]:
        cfg.write_text(text)
        out = subprocess.run([str(wrapper), "--compat-hook-resolve"], capture_output=True, text=True,
                             env=dict(ENV, COMPAT_HOOK_CONFIG=str(cfg)))
        assert out.stdout.strip() == f"runtime={want}", (text, out)
        assert _yaml_runtime(text) == want


def test_the_config_path_rules(tmp_path):
    """env COMPAT_HOOK_CONFIG, else the rendered path, else /etc/compat-hook/config.yaml."""
    a = write_config(tmp_path / "a.yaml", runtime="crun")
    b = write_config(tmp_path / "b.yaml", runtime="/usr/sbin/runc")
    wrapper = render(tmp_path / "w.sh", b, python="/nonexistent/python3")

    def resolve(**env):
        return subprocess.run([str(wrapper), "--compat-hook-resolve"], capture_output=True, text=True,
                              env=dict(ENV, **env)).stdout.strip()

    assert resolve() == "runtime=/usr/sbin/runc"
    assert resolve(COMPAT_HOOK_CONFIG=str(a)) == "runtime=crun"
    assert resolve(COMPAT_HOOK_CONFIG=str(tmp_path / "missing.yaml")) == "runtime=runc"
    text = render(tmp_path / "d.sh", None).read_text()
    assert "ch_config=/etc/compat-hook/config.yaml\n" in text


# --------------------------------------------------------------------------- pass-through


def recorder(path: pathlib.Path, log: pathlib.Path) -> pathlib.Path:
    path.write_text("#!/bin/sh\n"
                    f"{{ [ $# -eq 0 ] || printf '%s\\037' \"$@\"; printf 'ACTIVE=%s\\n' \"$COMPAT_HOOK_RUNTIME_ACTIVE\"; }} >> {log}\n")
    path.chmod(0o755)
    return path


PASS_THROUGH = [
    ["--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format", "json", "start", "c1"],
    ["--root", "/r", "state", "c1"], ["kill", "c1", "9"], ["delete", "--force", "c1"],
    ["--root=/r", "--systemd-cgroup", "exec", "--process", "/p.json", "c1"], ["features"], ["--version"],
    ["ps", "--format", "json", "c1"], ["--debug", "list"], ["--log-format", "create", "pause", "c1"],
    ["--root", "run", "state", "c1"], ["spec", "--bundle", "/b"], [],
]


def test_pass_through_verbs_skip_python(tmp_path):
    log = tmp_path / "argv.log"
    real = recorder(tmp_path / "real-runtime", log)
    cfg = write_config(tmp_path / "config.yaml", runtime=str(real))
    wrapper = render(tmp_path / "w.sh", cfg, python="/nonexistent/python3")
    for argv in PASS_THROUGH:
        log.unlink(missing_ok=True)
        p = subprocess.run([str(wrapper), *argv], capture_output=True, text=True, env=ENV)
        assert p.returncode == 0 and p.stderr == "", (argv, p)
        fields = log.read_text().rstrip("\n").split("\x1f")
        assert fields[:-1] == argv and fields[-1] == "ACTIVE=1", (argv, fields)


def test_create_without_python_fails_open(tmp_path):
    log = tmp_path / "argv.log"
    real = recorder(tmp_path / "real-runtime", log)
    cfg = write_config(tmp_path / "config.yaml", runtime=str(real))
    wrapper = render(tmp_path / "w.sh", cfg, python="/nonexistent/python3")
    argv = ["--root", "/r", "create", "--bundle", str(tmp_path), "c1"]
    p = subprocess.run([str(wrapper), *argv], capture_output=True, text=True, env=ENV)
    assert p.returncode == 0 and "/nonexistent/python3 is missing" in p.stderr
    assert log.read_text().rstrip("\n").split("\x1f")[:-1] == argv


def test_create_without_compat_hook_importable_fails_open(tmp_path):
    log = tmp_path / "argv.log"
    real = recorder(tmp_path / "real-runtime", log)
    cfg = write_config(tmp_path / "config.yaml", runtime=str(real))
    wrapper = tmp_path / "w.sh"
    wrapper.write_text(render_wrapper(str(cfg), python=PY, paths=[str(tmp_path / "gone")]))
    wrapper.chmod(0o755)
    argv = ["--root", "/r", "create", "--bundle", str(tmp_path), "c1"]
    p = subprocess.run([str(wrapper), *argv], capture_output=True, text=True, env=ENV)
    assert p.returncode == 0, p
    assert p.stderr == f"compat-hook-runtime: No module named 'compat_hook': running {real} without compat-hook\n"
    fields = log.read_text().rstrip("\n").split("\x1f")
    assert fields[:-1] == argv and fields[-1] == "ACTIVE=1"


def test_runtime_resolution_and_loops(tmp_path):
    wrapper = render(tmp_path / "w.sh", tmp_path / "config.yaml", python=PY)
    cfg = tmp_path / "config.yaml"

    state = {"COMPAT_HOOK_STATE_DIR": str(tmp_path / "state")}

    def run(*argv, **env):
        return subprocess.run([str(wrapper), *argv], capture_output=True, text=True, env=dict(ENV, **state, **env))

    write_config(cfg, runtime="no-such-runtime-xyz")
    p = run("state", "x")
    assert p.returncode == 127 and "'no-such-runtime-xyz' not found" in p.stderr
    write_config(cfg, runtime=str(wrapper))
    p = run("state", "x")
    assert p.returncode == 1 and "this wrapper itself" in p.stderr
    write_config(cfg, runtime="runc")
    p = run("state", "x", COMPAT_HOOK_RUNTIME_ACTIVE="1")
    assert p.returncode == 1 and "a loop" in p.stderr
    # The Python entry point guards the same way.
    p = subprocess.run([PY, "-c", "import sys; sys.path.insert(0, '.'); from compat_hook.runtime import entry; entry()",
                        "state", "x"], capture_output=True, text=True,
                       env=dict(ENV, **state, COMPAT_HOOK_CONFIG=str(cfg), COMPAT_HOOK_RUNTIME_ACTIVE="1"))
    assert p.returncode == 1 and "a loop" in p.stderr
    cfg.write_text("runtime: [odd]\n")  # unsure for the shell: Python reads it, rejects it, runs runc
    p = run("--version")
    assert p.returncode == 0 and "runc version" in p.stdout and "runtime: must be" in p.stderr


@pytest.mark.parametrize("argv,verb,bundle,cid", [
    (["--root", "/r", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/p", "c1"],
     "create", "/b", "c1"),
    (["create", "-b", "rel", "c2"], "create", "/cwd/rel", "c2"),
    (["create", "--bundle=/x/", "--console-socket", "/s", "c3"], "create", "/x", "c3"),
    (["-root", "/r", "run", "-bundle", "/b", "-d", "c4"], "run", "/b", "c4"),
    (["run", "--detach", "--keep", "c5"], "run", "/cwd", "c5"),
    (["--systemd-cgroup", "create", "--no-pivot", "--preserve-fds", "2", "-b=/b2", "c6"], "create", "/b2", "c6"),
    (["create", "--", "c7"], "create", "/cwd", "c7"),
])
def test_argument_parsing(argv, verb, bundle, cid):
    i, v = rtw.find_verb(argv)
    assert v == verb
    assert rtw.find_bundle(argv, i, cwd="/cwd") == bundle
    assert rtw.container_id(argv, i) == cid


# --------------------------------------------------------------------------- specedit


def _spec():
    s = rt.default_spec()
    s["process"]["env"] = ["PATH=/bin", "LD_LIBRARY_PATH=/opt/lib:/usr/local/cuda/compat", "NVIDIA_VISIBLE_DEVICES=all"]
    s["process"]["oomScoreAdj"] = -998
    s["annotations"] = {"io.kubernetes.cri.container-type": "container", "n": "ü\u2028"}
    s["hooks"] = {"prestart": [{"path": "/bin/true", "args": ["true"]}]}
    s["linux"]["resources"] = {"cpu": {"shares": 2, "quota": 1.5e5}, "memory": {"limit": 9007199254740993}}
    return s


def test_plan_changes_only_what_it_names():
    spec = _spec()
    orig = copy.deepcopy(spec)
    entry = hook_entry(stage="createContainer", config="/etc/compat-hook/config.yaml")
    m = specedit.store_mount("/var/lib/compat-hook/store/550.163.01", "/usr/local/cuda/compat")
    new, done = specedit.plan(spec, ld_dir="/usr/local/cuda/compat", known={"/usr/local/cuda/compat"},
                              mounts=[m], hooks=[("createContainer", entry)], drop_oom=True)
    assert spec == orig  # the input is never modified
    want = copy.deepcopy(orig)
    want["process"]["env"][1] = "LD_LIBRARY_PATH=/usr/local/cuda/compat:/opt/lib"
    del want["process"]["oomScoreAdj"]
    want["mounts"].append(m)
    want["hooks"]["createContainer"] = [entry]
    assert new == want, spec_diff(want, new)
    assert list(new) == list(orig)  # key order kept
    assert len(done) == 4
    specedit.validate(new)
    # The same edits again change nothing more.
    again, done2 = specedit.plan(new, ld_dir="/usr/local/cuda/compat", mounts=[m], hooks=[("createContainer", entry)],
                                 drop_oom=True)
    assert again == new and done2 == []
    # Strip only: the image's compat entry goes, the rest stays.
    stripped, done3 = specedit.plan(orig, strip=True)
    assert stripped["process"]["env"][1] == "LD_LIBRARY_PATH=/opt/lib" and done3 == ["LD_LIBRARY_PATH=/opt/lib"]
    only = copy.deepcopy(orig)
    only["process"]["env"][1] = "LD_LIBRARY_PATH=/usr/local/cuda-12.4/compat"
    gone, done4 = specedit.plan(only, strip=True)
    assert [e for e in gone["process"]["env"] if e.startswith("LD_")] == [] and done4[0].startswith("unset")


def test_validate_and_mount_conflicts():
    spec = _spec()
    specedit.validate(spec)
    for path, value, msg in [
        (("ociVersion",), None, "ociVersion"), (("root",), {"path": 3}, "root.path"),
        (("process", "cwd"), "rel", "process.cwd"), (("process", "args"), [], "process.args"),
        (("process", "env"), ["NOEQUALS"], "process.env"), (("process", "user"), {"uid": "0", "gid": 0}, "process.user"),
        (("mounts",), [{"source": "/x"}], "mounts[0].destination"),
        (("hooks",), {"prestart": [{"path": "rel"}]}, "hooks.prestart[0].path"),
        (("hooks",), {"prestart": [{"path": "/x", "timeout": 0}]}, "timeout"),
        (("process", "oomScoreAdj"), "1", "oomScoreAdj"),
    ]:
        s = copy.deepcopy(spec)
        tgt = s
        for k in path[:-1]:
            tgt = tgt[k]
        if value is None:
            del tgt[path[-1]]
        else:
            tgt[path[-1]] = value
        with pytest.raises(specedit.SpecError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            specedit.validate(s)
    s = copy.deepcopy(spec)
    s["mounts"].append({"destination": "/usr/local/cuda/compat/", "type": "bind", "source": "/elsewhere"})
    assert specedit.mount_at(s, "/usr/local/cuda/compat") is not None
    with pytest.raises(specedit.SpecError, match="exists already"):
        specedit.add_mount(s, specedit.store_mount("/store/550", "/usr/local/cuda/compat"))


def test_write_spec_is_atomic_and_keeps_the_mode(tmp_path):
    spec = _spec()
    p = tmp_path / "config.json"
    p.write_text(json.dumps(spec, indent=2))
    p.chmod(0o640)
    ino = p.stat().st_ino
    new, _ = specedit.plan(spec, drop_oom=True)
    specedit.write_spec(str(tmp_path), new)
    assert json.loads(p.read_text()) == new
    assert stat.S_IMODE(p.stat().st_mode) == 0o640 and p.stat().st_ino != ino
    assert sorted(os.listdir(tmp_path)) == ["config.json"]
    bad = copy.deepcopy(new)
    del bad["root"]
    with pytest.raises(specedit.SpecError):
        specedit.write_spec(str(tmp_path), bad)
    assert json.loads(p.read_text()) == new and sorted(os.listdir(tmp_path)) == ["config.json"]


# --------------------------------------------------------------------------- real runc containers


@pytest.fixture(scope="module")
def libs() -> dict:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


class Box:
    """One test's work dir: config, wrapper, fake host, bundle, log."""

    def __init__(self, tmp: pathlib.Path, libs: dict, *, host: str, compat: str | None = C550,
                 env=(), mount_host_lib: bool = True, bundle_edit=None, **config) -> None:
        self.tmp = tmp
        self.log = tmp / "compat-hook.log"
        self.state_dir = tmp / "state"
        self.host = fake_host(tmp / "host", host)
        self.cfg = write_config(tmp / "config.yaml", host_root=str(self.host), log_file=str(self.log), **config)
        self.wrapper = render(tmp / "bin" / "compat-hook-runtime", self.cfg, python=PY)
        root = rootfs.build_rootfs(tmp / "bundle" / "rootfs", compat_lib=libs[compat] if compat else None)
        hooks = {"prestart": [rt.nvidia_standin_hook(libs[host], tmp / "work")]} if mount_host_lib else None
        self.bundle = rt.make_bundle(tmp / "bundle", root, args=[PROBE],
                                     env=list(rt.DEFAULT_ENV) + list(env), hooks=hooks, edit=bundle_edit)
        self.spec_before = json.loads((self.bundle / "config.json").read_text())

    @property
    def spec_after(self) -> dict:
        return json.loads((self.bundle / "config.json").read_text())

    def run(self, *, runtime: str | None = None, extra_env=None) -> rt.Result:
        cid = rt.new_container_id("rtw")
        state = self.tmp / "runc-state"
        binary = runtime or str(self.wrapper)
        env = dict(ENV, COMPAT_HOOK_STATE_DIR=str(self.state_dir), **(extra_env or {}))
        try:
            p = subprocess.run([binary, "--root", str(state), "run", "--bundle", str(self.bundle), cid],
                               cwd=self.bundle, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               env=env, timeout=120)
        finally:
            subprocess.run([RUNC, "--root", str(state), "delete", "--force", cid], capture_output=True, env=ENV)
        return rt.Result(p.returncode, p.stdout, p.stderr, binary, cid)

    def record(self) -> dict:
        recs = log_records(self.log)
        assert len(recs) == 1, recs
        return recs[0]


def _env_with(spec: dict, **changes) -> dict:
    """``spec`` with env entries set (in place, as rewrite_env keeps positions), appended or removed (None)."""
    want = copy.deepcopy(spec)
    old = {e.split("=", 1)[0]: i for i, e in enumerate(want["process"]["env"])}
    out = list(want["process"]["env"])
    for k, v in changes.items():
        if k in old:
            if v is None:
                out[old[k]] = None
            else:
                out[old[k]] = f"{k}={v}"
        elif v is not None:
            out.append(f"{k}={v}")
    want["process"]["env"] = [e for e in out if e is not None]
    return want


def _pop_our_hook(spec: dict) -> bool:
    """Remove the createContainer hook the wrapper added (and ``hooks`` if it was the only one)."""
    hooks = spec.get("hooks", {})
    ours = [h for h in hooks.get("createContainer", []) if "compat_hook" in " ".join(h["args"])]
    if len(ours) != 1 or ours[0]["args"][-4:-2] != ["--stage", "createContainer"] and \
            "createContainer" not in ours[0]["args"]:
        return False
    hooks["createContainer"].remove(ours[0])
    if not hooks["createContainer"]:
        del hooks["createContainer"]
    return True


@pytest.mark.containers
def test_env_mode_enables_the_image_compat_dir(tmp_path, libs):
    box = Box(tmp_path, libs, host=H535, mode="env")
    res = box.run()
    assert res.rc == 0, str(res)
    assert probe_of(res.stdout) == {"cuDriverGetVersion": "12040", "libcuda": f"{COMPAT_DIR}/libcuda.so.{C550}"}, res
    assert box.spec_after == _env_with(box.spec_before, LD_LIBRARY_PATH=COMPAT_DIR)
    rec = box.record()
    assert (rec["decision"], rec["reason"], rec["compat_dir"], rec["verb"]) == \
        ("enable", "compat_major_newer", COMPAT_DIR, "run")
    assert rec["actions"] == [f"LD_LIBRARY_PATH={COMPAT_DIR}"] and rec["runtime"] == RUNC
    assert rec["host_driver_version"] == H535 and rec["bundle"] == str(box.bundle)


@pytest.mark.containers
def test_newer_host_strips_a_stale_image_compat_path(tmp_path, libs):
    box = Box(tmp_path, libs, host=H555, mode="env", env=["LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/lib"])
    control = box.run(runtime=RUNC)  # plain runc: the stale path wins, the container gets the older driver
    assert probe_of(control.stdout)["cuDriverGetVersion"] == "12040", control
    res = box.run()
    assert res.rc == 0, str(res)
    assert probe_of(res.stdout) == {"cuDriverGetVersion": "12050", "libcuda": f"{SYS_LIB}/libcuda.so.{H555}"}, res
    after = copy.deepcopy(box.spec_after)
    # compat is wrong here: besides the env edit, the hook is added, whose drop-in makes the
    # host driver win over compat drop-ins (the image's, the NVIDIA toolkit's)
    assert _pop_our_hook(after)
    # what came off LD_LIBRARY_PATH is handed to that hook, so it sees the same candidates
    assert after.pop("annotations") == {ANNOTATION_LD_BEFORE: "/usr/local/cuda/compat:/usr/local/lib"}
    assert after == _env_with(box.spec_before, LD_LIBRARY_PATH="/usr/local/lib")
    rec = box.record()
    assert (rec["decision"], rec["reason"], rec["effect"]) == ("skip", "compat_not_newer", "host")
    assert rec["actions"][0] == "LD_LIBRARY_PATH=/usr/local/lib"
    assert rec["actions"][1].startswith("added createContainer hook ") and len(rec["actions"]) == 2


@pytest.mark.containers
def test_ldconfig_mode_leaves_env_alone_and_can_add_the_hook(tmp_path, libs):
    box = Box(tmp_path, libs, host=H535, mode="ldconfig", wrapper_add_hook=True)
    res = box.run()
    assert res.rc == 0, str(res)
    # The hook the wrapper added (createContainer) wrote the ld.so drop-in and refreshed the cache.
    assert probe_of(res.stdout) == {"cuDriverGetVersion": "12040", "libcuda": f"{COMPAT_DIR}/libcuda.so.{C550}"}, res
    want = copy.deepcopy(box.spec_before)
    want.setdefault("hooks", {}).setdefault("createContainer", []).append(
        hook_entry(stage="createContainer", config=str(box.cfg), state_dir=str(box.state_dir), log_file=str(box.log)))
    assert box.spec_after == want, spec_diff(want, box.spec_after)
    hook_recs = log_records(box.log, "hook")
    assert len(hook_recs) == 1 and hook_recs[0]["decision"] == "enable", hook_recs


@pytest.mark.containers
def test_store_injection_for_an_image_without_compat(tmp_path, libs):
    sd = tmp_path / "store"
    pkg = tmp_path / "pkg" / "usr/local/cuda-12.4/compat"
    rootfs.install_libcuda(tmp_path / "pkg", libs[C550], "usr/local/cuda-12.4/compat")
    store.add(str(sd), str(pkg.parent.parent.parent.parent), None)
    box = Box(tmp_path, libs, host=H535, compat=None, mount_host_lib=False, env=["CUDA_VERSION=12.4.1"],
              mode="ldconfig", store_dir=str(sd))
    res = box.run()
    assert res.rc == 0, str(res)
    assert probe_of(res.stdout) == {"cuDriverGetVersion": "12040",
                                    "libcuda": f"/usr/local/cuda/compat/libcuda.so.{C550}"}, res
    want = _env_with(box.spec_before, LD_LIBRARY_PATH="/usr/local/cuda/compat")
    want["mounts"].append({"destination": "/usr/local/cuda/compat", "type": "bind", "source": str(sd / C550),
                           "options": ["rbind", "ro", "nosuid", "nodev"]})
    assert box.spec_after == want, spec_diff(want, box.spec_after)
    rec = box.record()
    assert (rec["decision"], rec["reason"], rec["source"]) == ("enable", "store_package", "store")
    assert rec["store"]["version"] == C550
    assert rt.mounts_under(tmp_path) == []


@pytest.mark.containers
def test_oom_score_adj_is_dropped(tmp_path, libs):
    def oom(spec):
        spec["process"]["oomScoreAdj"] = -998

    box = Box(tmp_path, libs, host=H555, mode="env", bundle_edit=oom, wrapper_drop_oom_score_adj=True)
    res = box.run()
    assert res.rc == 0, str(res)
    assert probe_of(res.stdout)["cuDriverGetVersion"] == "12050"
    want = copy.deepcopy(box.spec_before)
    del want["process"]["oomScoreAdj"]
    after = copy.deepcopy(box.spec_after)
    assert _pop_our_hook(after)  # compat is wrong on 555: the hook makes the host driver win
    assert after == want
    assert box.record()["actions"][-1] == "dropped process.oomScoreAdj (-998)"


@pytest.mark.containers
def test_chaining_to_a_second_runtime(tmp_path, libs):
    calls = tmp_path / "standin.log"
    host_lib = libs[H555]
    box = Box(tmp_path, libs, host=H555, mode="env", mount_host_lib=False,
              runtime=str(tmp_path / "nvidia-container-runtime"))
    standin_runtime(tmp_path / "nvidia-container-runtime", calls, host_lib)
    res = box.run()
    assert res.rc == 0, str(res)
    # The stand-in mounted the host driver; compat stays off on the newer host.
    assert probe_of(res.stdout) == {"cuDriverGetVersion": "12050", "libcuda": f"{SYS_LIB}/libcuda.so.1"}, res
    [argv] = standin_calls(calls)
    assert argv[:3] == ["--root", str(tmp_path / "runc-state"), "run"] and argv[3:5] == ["--bundle", str(box.bundle)]
    assert box.record()["runtime"] == str(tmp_path / "nvidia-container-runtime")


@pytest.mark.containers
def test_failures_fail_open_or_stop_with_on_error_fail(tmp_path, libs):
    # A broken store (a file where the store dir should be): the wrapper
    # cannot decide, the container itself is fine.
    bad_store = tmp_path / "store"
    bad_store.write_text("not a directory")
    box = Box(tmp_path, libs, host=H535, compat=None, mode="env", env=["CUDA_VERSION=12.4.1"],
              store_dir=str(bad_store))
    res = box.run()
    assert res.rc == 0, str(res)
    # Unchanged spec: the container got the host driver only.
    assert probe_of(res.stdout)["cuDriverGetVersion"] == "12020", res
    assert box.spec_after == box.spec_before
    rec = box.record()
    assert rec["decision"] == "error" and rec["reason"] == "os_error" and str(bad_store) in rec["error"]
    assert "on_error: continue" in rec["outcome"]

    write_config(box.cfg, host_root=str(box.host), log_file=str(box.log), mode="env", on_error="fail",
                 store_dir=str(bad_store))
    res = box.run()
    assert res.rc == 1 and res.stdout == "", str(res)
    assert res.stderr.startswith(f"compat-hook-runtime: {bad_store}: Not a directory"), res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert box.spec_after == box.spec_before


@pytest.mark.containers
def test_an_invalid_config_decides_with_the_defaults(tmp_path, libs):
    """A config that does not load takes no protection away: the built-in defaults decide (mode
    ldconfig: the wrapper adds the hook, which makes the image's compat driver win on the older host).

    The defaults read the host driver at /: the fake host's /proc/driver is bind-mounted over this
    machine's in a private mount namespace, which the container's (and so the hook's) is copied from."""
    box = Box(tmp_path, libs, host=H535, mode="env")
    box.cfg.write_text("runtime: runc\nmode: bogus\n")
    control = box.run(runtime=RUNC)  # runc alone: the host driver
    assert probe_of(control.stdout)["cuDriverGetVersion"] == "12020", control
    cid = rt.new_container_id("rtw")
    state = tmp_path / "runc-state"
    argv = machine_driver_argv(box.host) + [str(box.wrapper), "--root", str(state), "run", "--bundle",
                                            str(box.bundle), cid]
    try:
        p = subprocess.run(argv, cwd=box.bundle, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           env=dict(ENV, COMPAT_HOOK_STATE_DIR=str(box.state_dir)), timeout=120)
    finally:
        subprocess.run([RUNC, "--root", str(state), "delete", "--force", cid], capture_output=True, env=ENV)
    assert p.returncode == 0, p
    assert probe_of(p.stdout) == {"cuDriverGetVersion": "12040", "libcuda": f"{COMPAT_DIR}/libcuda.so.{C550}"}, p
    error = "mode: must be one of ldconfig, env, both, got 'bogus'"
    assert p.stderr.startswith(f"compat-hook-runtime: invalid configuration ({error}): the built-in defaults "
                               "decided\n"), p.stderr
    want = copy.deepcopy(box.spec_before)
    want.setdefault("hooks", {}).setdefault("createContainer", []).append(
        hook_entry(stage="createContainer", config=str(box.cfg), state_dir=str(box.state_dir), log_file=str(box.log)))
    assert box.spec_after == want, spec_diff(want, box.spec_after)
    # Both lines go to the log file the registration named; each is its decision plus the config error.
    rec = box.record()
    assert (rec["decision"], rec["effect"], rec["config"], rec["config_error"]) == \
        ("enable", "compat", "defaults", error), rec
    [hook] = log_records(box.log, "hook")
    assert (hook["decision"], hook["config"], hook["config_error"]) == ("enable", "defaults", error), hook


@pytest.mark.containers
def test_opted_out_and_non_gpu_containers_are_untouched(tmp_path, libs):
    box = Box(tmp_path, libs, host=H555, mode="env",
              env=["COMPAT_HOOK_DISABLE=1", "LD_LIBRARY_PATH=/usr/local/cuda/compat"])
    res = box.run()
    assert probe_of(res.stdout)["cuDriverGetVersion"] == "12040", res  # the image's own choice stands
    assert box.spec_after == box.spec_before
    assert box.record()["reason"] == "opt_out"
