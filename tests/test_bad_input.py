"""Bad OCI input to the registered hook: the state on stdin, the bundle, config.json, argv.

The contract (compat_hook/core/errors.py, hook.py): unusable input is a failed run,
never a traceback. With ``on_error: continue`` (the default) the hook exits 0
and the container starts without compat; with ``on_error: fail`` it exits 1
and writes exactly one line, ``compat-hook: <why>``, on stderr (runc shows
it in its error). Usage errors exit 2 with one such line. Every run leaves
exactly one whole JSON line in the configured log, with a short ``reason``
code and a one-line ``error``.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from tests.support import hostile as h
from tests.support import runtimes as rt

Path = pathlib.Path

GOOD_SPEC = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
             "process": {"args": ["/bin/true"], "env": ["NVIDIA_VISIBLE_DEVICES=all"], "cwd": "/"}}


def _spec(**root) -> bytes:
    s = json.loads(json.dumps(GOOD_SPEC))
    s["root"] = root
    return json.dumps(s).encode()


class Ctx:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.bundle = tmp_path / "bundle"
        self.bundle.mkdir(parents=True)
        h.base_rootfs(self.bundle / "rootfs")

    def state(self, **over) -> bytes:
        d = json.loads(h.state_json(self.bundle))
        d.update(over)
        return json.dumps(d).encode()

    def config(self, data) -> None:
        p = self.bundle / "config.json"
        if callable(data):
            data(os.fsencode(p))
        else:
            p.write_bytes(data)


# name -> (setup(ctx) -> stdin, reason code expected in the log)
STATE_CASES = {
    "stdin-closed": (lambda c: None, "bad_state"),
    "stdin-empty": (lambda c: b"", "bad_state"),
    "stdin-whitespace": (lambda c: b" \n\t\r\n", "bad_state"),
    "stdin-truncated": (lambda c: c.state()[:30], "bad_state"),
    "stdin-truncated-after-bundle": (lambda c: c.state()[:-1], "bad_state"),
    "stdin-huge-100MB": (lambda c: b'{"bundle":"' + str(c.bundle).encode() + b'","pad":"' + b"x" * (100 << 20) + b'"}',
                         "bad_state"),
    "stdin-not-json": (lambda c: b"\x00\xffgarbage\n", "bad_state"),
    "stdin-not-utf8": (lambda c: b'{"bundle":"/\xff\xfe"}', "bad_state"),
    "stdin-utf8-bom": (lambda c: b"\xef\xbb\xbf" + c.state(), "bad_state"),
    "stdin-json-array": (lambda c: b"[]", "bad_state"),
    "stdin-json-string": (lambda c: b'"' + str(c.bundle).encode() + b'"', "bad_state"),
    "stdin-nan": (lambda c: b'{"bundle": NaN}', "bad_state"),
    "stdin-two-documents": (lambda c: c.state() + c.state(), "bad_state"),
    "stdin-nested-100000-deep": (lambda c: b"[" * 100000 + b"]" * 100000, "bad_state"),
    "state-without-bundle": (lambda c: b'{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1}', "bad_state"),
    "state-bundle-relative": (lambda c: c.state(bundle="bundle"), "bad_state"),
    "state-bundle-not-a-string": (lambda c: c.state(bundle=5), "bad_state"),
    "state-bundle-null": (lambda c: c.state(bundle=None), "bad_state"),
    "state-bundle-nul-byte": (lambda c: c.state(bundle=str(c.bundle) + "\0/x"), "bad_state"),
    "state-bundle-missing-dir": (lambda c: c.state(bundle=str(c.tmp / "no-such-bundle")), "bad_state"),
}

# Not here: stdin a directory. CPython itself refuses that before any hook
# code runs ("Fatal Python error: init_sys_streams: <stdin> is a directory",
# exit 1); no runtime passes one (runc and crun give a pipe).

# name -> (config.json content or node maker, reason)
SPEC_CASES = {
    "config-json-missing": (None, "bad_state"),
    "config-json-empty": (b"", "bad_state"),
    "config-json-truncated": (json.dumps(GOOD_SPEC).encode()[:40], "bad_state"),
    "config-json-not-json": (b"root: rootfs\n", "bad_state"),
    "config-json-not-utf8": (b'{"root":{"path":"rootfs\xff"}}', "bad_state"),
    "config-json-array": (b"[]", "bad_state"),
    "config-json-is-a-directory": (h.directory, "bad_state"),
    "config-json-is-a-fifo": (h.fifo, "bad_state"),
    "config-json-is-dev-zero": (h.chardev(1, 5), "bad_state"),
    "config-json-65MB": (h.sparse(65 << 20, b'{"root":{"path":"rootfs"},"x":"'), "bad_state"),
    "root-missing": (json.dumps({"ociVersion": "1.0.2", "process": GOOD_SPEC["process"]}).encode(), "bad_state"),
    "root-not-an-object": (json.dumps(dict(GOOD_SPEC, root="rootfs")).encode(), "bad_state"),
    "root-path-missing": (_spec(readonly=False), "bad_state"),
    "root-path-empty": (_spec(path=""), "bad_state"),
    "root-path-not-a-string": (_spec(path=["rootfs"]), "bad_state"),
    "root-path-nul-byte": (_spec(path="rootfs\0x"), "bad_state"),
    "root-path-does-not-exist": (_spec(path="no-such-rootfs"), "bad_state"),
    "root-path-is-a-file": (_spec(path="config.json"), "bad_state"),
}

USAGE_CASES = {
    "stage-bogus": lambda a: _replace_stage(a, "bogus"),
    "stage-empty": lambda a: _replace_stage(a, ""),
    "unknown-flag": lambda a: a + ["--bogus"],
    "flag-without-value": lambda a: a + ["--host-root"],
}


def _replace_stage(args, stage):
    args = list(args)
    args[args.index("--stage") + 1] = stage
    return args


@pytest.fixture(autouse=True)
def _no_leaks(tmp_path):
    yield
    assert rt.mounts_under(tmp_path) == []
    assert h.processes_mentioning(str(tmp_path)) == []


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad-input-env")
    return {mode: h.make_hook_env(base / mode, on_error=mode) for mode in ("continue", "fail")}


def _check(res: h.HookResult, env: h.HookEnv, nlines_before: int, *, rc: int, reason: str, stderr_line: bool):
    assert b"Traceback" not in res.stdout + res.stderr, res
    assert res.rc == rc, res
    assert res.duration < h.HOOK_TIMEOUT / 2, res
    assert res.stdout == b"", res
    lines = res.stderr.decode("utf-8", "replace").splitlines()
    if stderr_line:
        assert len(lines) == 1 and lines[0].startswith("compat-hook: "), res
        assert res.stderr.endswith(b"\n"), res
    else:
        assert lines == [], res
    recs = env.log_records()
    assert len(recs) == nlines_before + 1, recs[nlines_before:]
    rec = recs[-1]
    assert rec["decision"] == "error" and rec["reason"] == reason, rec
    assert isinstance(rec["error"], str) and rec["error"] and "\n" not in rec["error"], rec
    assert "Traceback" not in rec["error"]
    if stderr_line:
        assert lines[0] == "compat-hook: " + rec["error"], (lines, rec)
    return rec


@pytest.mark.parametrize("mode", ["continue", "fail"])
@pytest.mark.parametrize("name", sorted(STATE_CASES))
def test_bad_state(name, mode, tmp_path, envs):
    env = envs[mode]
    ctx = Ctx(tmp_path)
    setup, reason = STATE_CASES[name]
    stdin = setup(ctx)
    n = len(env.log_lines())
    res = h.run_hook(env.entry, stdin, cwd=ctx.bundle / "rootfs")
    _check(res, env, n, rc=0 if mode == "continue" else 1, reason=reason, stderr_line=mode == "fail")
    assert not (ctx.bundle / "rootfs" / h.DROPIN).exists()


@pytest.mark.parametrize("mode", ["continue", "fail"])
@pytest.mark.parametrize("name", sorted(SPEC_CASES))
def test_bad_bundle(name, mode, tmp_path, envs):
    env = envs[mode]
    ctx = Ctx(tmp_path)
    content, reason = SPEC_CASES[name]
    if content is not None:
        ctx.config(content)
    n = len(env.log_lines())
    res = h.run_hook(env.entry, ctx.state(), cwd=ctx.bundle / "rootfs")
    _check(res, env, n, rc=0 if mode == "continue" else 1, reason=reason, stderr_line=mode == "fail")
    assert not (ctx.bundle / "rootfs" / h.DROPIN).exists()


@pytest.mark.parametrize("mode", ["continue", "fail"])
@pytest.mark.parametrize("name", sorted(USAGE_CASES))
def test_usage_error(name, mode, tmp_path, envs):
    env = envs[mode]
    ctx = Ctx(tmp_path)
    ctx.config(json.dumps(GOOD_SPEC).encode())
    n = len(env.log_lines())
    res = h.run_hook(env.entry, ctx.state(), cwd=ctx.bundle / "rootfs", args=USAGE_CASES[name](env.entry["args"]))
    _check(res, env, n, rc=2, reason="usage", stderr_line=True)
    assert not (ctx.bundle / "rootfs" / h.DROPIN).exists()


def test_good_input_control(tmp_path, envs):
    """The same harness with good input enables compat: the failures above are the input's."""
    for mode, env in envs.items():
        ctx = Ctx(tmp_path / mode)
        ctx.config(json.dumps(GOOD_SPEC).encode())
        res = h.run_hook(env.entry, ctx.state(), cwd=ctx.bundle / "rootfs")
        assert res.rc == 0 and res.stderr == b"", res
        rec = env.last_record()
        assert rec["decision"] == "enable", rec
        assert (ctx.bundle / "rootfs" / h.DROPIN).read_text() == h.dropin_text(h.COMPAT_DIR)


def test_error_message_is_one_line_even_for_hostile_names(tmp_path, envs):
    """An image-chosen name with a newline in an error must not split the stderr line."""
    env = envs["fail"]
    ctx = Ctx(tmp_path)
    ctx.config(json.dumps(GOOD_SPEC).encode())
    root = ctx.bundle / "rootfs"
    h.rm_tree(root / "etc")
    os.symlink("et\nc", root / "etc")  # dangling, with a newline: the error names it
    n = len(env.log_lines())
    res = h.run_hook(env.entry, ctx.state(), cwd=root)
    rec = _check(res, env, n, rc=1, reason="unsafe_path", stderr_line=True)
    assert "et" in rec["error"]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_through_the_registered_entry_is_help_not_a_failure(flag, tmp_path):
    """``hook --help`` prints the usage on stdout, exits 0, logs nothing and writes no state.

    It used to be a usage error: exit 2, ``usage: usage:`` on stderr, and a failure record
    in the log that made ``report --fail-on failures`` exit 3.
    """
    import subprocess
    import sys

    for mode in ("continue", "fail"):
        env = h.make_hook_env(tmp_path / mode, on_error=mode)
        n = len(env.log_lines())
        state_before = sorted(p.relative_to(env.state_dir) for p in env.state_dir.rglob("*"))
        res = h.run_hook(env.entry, b"", cwd=tmp_path, args=env.entry["args"] + [flag])
        assert res.rc == 0 and res.stderr == b"", (mode, res)
        out = res.stdout.decode()
        assert out.startswith("usage: compat-hook hook ") and "usage: usage:" not in out, out
        for word in ("--config", "--stage", "--state-dir", "--dry-run", "stdin", "exit"):
            assert word in out, (word, out)
        assert len(env.log_lines()) == n, env.log_records()[n:]
        assert sorted(p.relative_to(env.state_dir) for p in env.state_dir.rglob("*")) == state_before
        rep = subprocess.run([sys.executable, "-m", "compat_hook", "report", "--log", str(env.log),
                              "--fail-on", "failures"], capture_output=True, text=True, timeout=60,
                             cwd=h.REPO)
        assert rep.returncode != 3, rep.stdout + rep.stderr
