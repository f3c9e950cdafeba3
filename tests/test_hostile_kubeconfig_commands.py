"""Hostile kubeconfigs through the whole command: property tests (hypothesis), each run a real process.

The kubeconfig loader's own properties are tests/test_hostile_cluster_input.py; here the same kind
of file (bad YAML, deep nesting, a huge file, binary, wrong types, no current-context, a server
address that is not one, a FIFO someone writes, a symlink loop, a directory) is what
``$KUBECONFIG`` names for ``compat-hook cluster agent --once``, ``cluster fleet``, ``cluster status``
and ``cluster validate --once``, each started as ``python3 -m compat_hook``. What docs/cluster.md
says ("Credentials"): a file that is not a kubeconfig is one line naming it, exit 1. So each run
ends within :data:`BOUND` CPU seconds (and never hangs) with exit status 1, no traceback, and one line of error: on
standard error for ``status`` and ``fleet``, as the one JSON log line on standard output for the
agent and the validator (their logs are JSON lines). A file that loads, whose server cannot be
reached (every one here is ``127.0.0.1:1``, refused), is an API error: the same exit 1 for the
commands that run once; the fleet, a controller, keeps trying (one JSON line a try) and ends on
SIGTERM with 0. A FIFO nobody writes blocks the open as it does for kubectl (tests/test_cli.py
stops such a run with SIGTERM), so the FIFO here is written.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat_hook.cluster.workload import workloads

pytestmark = [pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parent.parent
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
#: CPU seconds a run may take (a start of the cluster half takes about 1.5 s), and the wall-clock
#: seconds after which it is a hang whatever the machine's load.
BOUND, WALL = 10.0, 60.0
MAX_FILE = 4 << 20  # compat_hook.cluster.api.kubeconfig.MAX_FILE
#: Each example starts the four commands at once; with the seven fixed cases below, 27 runs of each
#: command. A run takes about 0.8 s of CPU (kubeconfig refused): about a minute on an idle 2-core machine.
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))

#: A kubeconfig that would load, on a server that refuses (never a real one).
GOOD = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)

BAD_SERVERS = ["ht!tp://::garbage::", "https://[::1", "https://127.0.0.1:99999", "https://a b:1", "https://\x00:1",
               "unix:///run/x.sock", "https://" + "a" * 70000, "", "   ", "https://:0", "//127.0.0.1:1", "ftp://x",
               "https://127.0.0.1:1/" + "%" * 5, "http://[fe80::1%25eth0]:1", "https://user:pw@127.0.0.1:-1"]


def _doc(**changes) -> dict:
    doc = json.loads(json.dumps(GOOD))
    doc.update(changes)
    return doc


@st.composite
def hostile(draw) -> tuple:
    """``(kind, bytes)``: what the kubeconfig file is (``file``, ``fifo``, ``loop``, ``dir``) and says."""
    import yaml

    kind = draw(st.sampled_from(["yaml", "nested", "huge", "binary", "typed", "entry", "no_context", "server",
                                 "fifo", "loop", "dir"]))
    if kind == "yaml":
        text = draw(st.sampled_from(["a: b: c", "{", "- [", "key: 'x", "\t- a", "a: &x\n  b: *y", "%YAML 9.9\n---",
                                     "? [a, b]\n: c", "!!python/object:os.system {}", "clusters: !!binary x"]))
        return "file", (text + draw(st.text(max_size=40))).encode("utf-8", "surrogatepass")
    if kind == "nested":
        n = draw(st.sampled_from([33, 200, 5000, 100000]))
        opener = draw(st.sampled_from(["[", "{a: ", "- "]))
        return "file", ("users: " + opener * n + "x").encode()
    if kind == "huge":
        filler = draw(st.sampled_from([b"#", b"a: b\n", b" "]))
        return "file", filler * (MAX_FILE // len(filler) + draw(st.integers(1, 4096)))
    if kind == "binary":
        return "file", draw(st.sampled_from([b"\x00", b"\xff\xfe", b"\x7fELF", b"\x1f\x8b"])) + draw(st.binary(max_size=300))
    if kind == "typed":  # the right keys, values of the wrong types
        key = draw(st.sampled_from(["clusters", "users", "contexts", "current-context", "apiVersion", "preferences"]))
        doc = _doc(**{key: draw(json_values)})
        return "file", (yaml.safe_dump(doc) if draw(st.booleans()) else json.dumps(doc)).encode()
    if kind == "entry":  # one entry's body of the wrong type, or an auth no client can use
        doc = _doc()
        where, field = draw(st.sampled_from([
            ("clusters", "cluster"), ("users", "user"), ("contexts", "context"),
            ("clusters", "cluster.certificate-authority-data"), ("clusters", "cluster.certificate-authority"),
            ("users", "user.client-key-data"), ("users", "user.client-certificate"), ("users", "user.token"),
            ("users", "user.tokenFile"), ("users", "user.exec"), ("users", "user.auth-provider"),
            ("users", "user.username"), ("contexts", "context.cluster"), ("contexts", "context.user"),
            ("clusters", "cluster.server"), ("clusters", "cluster.insecure-skip-tls-verify")]))
        value = draw(json_values | st.sampled_from([
            "!!!not base64", "/nonexistent/ca.crt", "/dev/zero", "/proc/self/mem", {"command": "/nonexistent/plugin"},
            {"name": "gcp", "config": {"cmd-path": "/nonexistent"}}, "-----BEGIN CERTIFICATE-----\nx\n"]))
        body = doc[where][0]
        parts = field.split(".")
        if len(parts) == 1:
            body[parts[0]] = value
        else:
            body[parts[0]] = dict(body[parts[0]], **{parts[1]: value})
        return "file", yaml.safe_dump(doc).encode()
    if kind == "no_context":
        doc = _doc()
        how = draw(st.sampled_from(["none", "missing", "empty", "no_cluster"]))
        if how == "none":
            del doc["current-context"]
        elif how == "missing":
            doc["current-context"] = draw(st.text(min_size=1, max_size=20).filter(lambda s: s != "c"))
        elif how == "empty":
            doc["contexts"] = []
        else:
            doc["clusters"] = []
        return "file", yaml.safe_dump(doc).encode()
    if kind == "server":
        doc = _doc()
        doc["clusters"][0]["cluster"]["server"] = draw(st.sampled_from(BAD_SERVERS) | st.text(max_size=40))
        return "file", json.dumps(doc).encode()
    if kind == "fifo":
        inner = draw(st.sampled_from([b"users: " + b"[" * 1000, b"\x00\x01", json.dumps(_doc(**{"current-context": 5})).encode(),
                                      b"a: b: c", b""]))
        return "fifo", inner
    return kind, b""


def _feed(fifo: str, data: bytes) -> None:
    """Write ``data`` into ``fifo`` once a reader opens it (a reader that stops early is no error)."""
    try:
        fd = os.open(fifo, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass


def _make(where: pathlib.Path, kind: str, data: bytes) -> str:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "config"
    if kind == "file":
        path.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(path)
        threading.Thread(target=_feed, args=(str(path), data), daemon=True).start()
    elif kind == "loop":
        os.symlink(where / "config2", path)
        os.symlink(path, where / "config2")
    elif kind == "dir":
        path.mkdir()
    return str(path)


def _unblock(path: str) -> None:
    """A FIFO's writer still waiting (the command never opened it): a reader that lets it go."""
    if os.path.exists(path) and pathlib.Path(path).is_fifo():
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            pass


#: One GPU workload on the node (the validator's record of it is made by the agent's own code).
POD = {"metadata": {"name": "app-1", "namespace": "apps", "uid": "p-1"},
       "spec": {"nodeName": "gpu-a", "runtimeClassName": "cuda-compat",
                "containers": [{"name": "main", "image": "registry.example/app:1",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}

COMMANDS = {
    "agent": ["agent", "--node", "gpu-a", "--once"],
    "fleet": ["fleet", "--namespace", "compat-hook"],
    "status": ["status"],
    "validate": ["validate", "--node", "gpu-a", "--once", "--probe-image", "registry.example/compat-hook:1"],
}


def _start(name: str, base: pathlib.Path, kind: str, data: bytes) -> tuple:
    where = base / name
    path = _make(where, kind, data)
    args = list(COMMANDS[name])
    if name in ("agent", "validate"):
        state = where / "state"
        state.mkdir()
        args += ["--state-dir", str(state)]
    if name == "validate":  # a driver is loaded (faked at its file), so the validator goes on to the API server
        host = where / "host"
        (host / "proc/driver/nvidia").mkdir(parents=True)
        (host / "proc/driver/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Release Build  (dvs-builder@U16)\n")
        args += ["--workloads-dir", str(where / "state"), "--host-root", str(host)]
        # and the record of the node's workloads the agent writes, so there is something to prove
        workloads.record(str(where / "state"), [POD], driver="535.183.01")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(KUBECONFIG=path, HOME=str(where), PYTHONDONTWRITEBYTECODE="1")
    with open(where / "stdout", "wb") as out, open(where / "stderr", "wb") as err:
        p = subprocess.Popen([PYTHON, "-m", "compat_hook", "cluster", *args], cwd=REPO, env=env,
                             stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    return p, where, path, time.monotonic()


def _finish(p, where: pathlib.Path, path: str, t0: float) -> tuple:
    """``(exit status, stdout, stderr, CPU seconds, ended by itself)``. A run still going after
    :data:`WALL` seconds gets SIGTERM (then SIGKILL). The bound is on the CPU time the run took (the
    machine may be busy with other work; a hang is the wall clock's)."""
    ended, status, usage = False, None, None
    try:
        while time.monotonic() - t0 < WALL:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                ended = True
                break
            if where.name == "fleet" and (where / "stdout").read_bytes().count(b"\n") >= 2:
                break  # the controller logs its tries: it runs on, as it should
            time.sleep(0.05)
        if not ended:
            p.send_signal(signal.SIGTERM)
            for _ in range(100):
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.05)
            else:
                p.kill()
                _, status, usage = os.wait4(p.pid, 0)
    finally:
        _unblock(path)
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    out = (where / "stdout").read_text(errors="replace")
    err = (where / "stderr").read_text(errors="replace")
    return p.returncode, out, err, usage.ru_utime + usage.ru_stime, ended


def _json_lines(out: str) -> list:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    recs = [json.loads(ln) for ln in lines]  # every line the agent, fleet and validator log is JSON
    assert all(isinstance(r, dict) for r in recs), lines
    return recs


def _judge(name: str, rc: int, out: str, err: str, seconds: float, ended: bool) -> None:
    where = f"{name}: rc={rc} {seconds:.1f} CPU s\nstdout: {out[-1500:]}\nstderr: {err[-1500:]}"
    assert "Traceback" not in err and "Traceback" not in out, where
    if name == "fleet" and not ended:
        # the file loaded and only the (refusing) server is unreachable: the controller keeps trying
        assert rc == 0 and err == "", where
        recs = _json_lines(out)
        assert recs and all(r.get("event") != "fleet_error" or (isinstance(r.get("error"), str) and r["error"])
                            for r in recs), where
        # only an unreachable server keeps it going: an address that is not one is refused at the start
        assert all("Failed to parse" not in str(r.get("error")) for r in recs), where
        return
    assert ended and seconds < BOUND, where
    assert rc == 1, where  # docs/cluster.md: a file that is not a kubeconfig is one line naming it, exit 1
    if name in ("status", "fleet"):
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"compat-hook cluster {name}: "), where
        assert out == "", where
        return
    recs = _json_lines(out)
    errors = [r for r in recs if r.get("event") in ("cluster_error", "validation_error")]
    assert len(errors) == 1 and isinstance(errors[0].get("message"), str) and errors[0].get("reason"), where
    assert "\n" not in errors[0]["message"], where
    assert err == "", where


@SETTINGS
@given(hostile())
def test_every_cluster_command_refuses_a_hostile_kubeconfig_in_one_line(tmp_path_factory, case):
    kind, data = case
    base = tmp_path_factory.mktemp("kc")
    runs = {name: _start(name, base, kind, data) for name in COMMANDS}  # the four at once
    for name, run in runs.items():
        _judge(name, *_finish(*run))


@pytest.mark.parametrize("kind, data", [
    ("file", b"users: " + b"[" * 100000), ("loop", b""), ("dir", b""),
    ("file", json.dumps({**GOOD, "clusters": [{"name": "k", "cluster": {"server": "ht!tp://::garbage::"}}]}).encode()),
    ("fifo", b"users: [[["),
    ("file", json.dumps({**GOOD, "clusters": [{"name": "k", "cluster": {"server": "https://[::1"}}]}).encode()),
    ("file", json.dumps({**GOOD, "clusters": [{"name": "k", "cluster": "!!!not base64"}]}).encode()),
], ids=["deep", "symlink-loop", "directory", "garbage-server", "fifo", "unclosed-bracket", "cluster-not-a-mapping"])
def test_the_issue_s_kubeconfigs(tmp_path, kind, data):
    """The shapes the issue names, each through the four commands (the property draws them too)."""
    runs = {name: _start(name, tmp_path, kind, data) for name in COMMANDS}
    for name, run in runs.items():
        rc, out, err, seconds, ended = _finish(*run)
        _judge(name, rc, out, err, seconds, ended)
        assert ended  # none of these loads: every command ends by itself
