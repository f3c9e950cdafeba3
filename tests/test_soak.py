"""The shortened soak (benchmarks/soak.py) in CI, and the toolkit watcher it relies on.

The soak drives a live containerd 2.x through the CRI with compat-hook
installed with every default, while it flips the host driver, rewrites the
NVIDIA toolkit's config.toml as the GPU Operator does (the DaemonSet's
``compat-hook-k8s.sh watch`` registers again), rotates and fills the log,
damages the state cache, breaks the config, kills hooks and wrappers and
races installs. Here it runs 40 starts (every fault at least once) and the
figures must meet the issue's targets: 0 wrong libcuda, 0 corrupted files,
0 leftovers, 0 lost decision lines, failures only where that start's own
hook or wrapper was killed, the next start after a fault fine, nothing
written outside compat-hook's and the engine's own dirs, and the
re-registration window at most 1 s.

The watcher (compat_hook/install/watch.py) is also checked alone, on real inotify:
a config.toml deleted with its dirs and written anew is reported, and so is
one written in place.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"


def soak_faults() -> tuple:
    """benchmarks/soak.py's fault names (read from the file: it is a script, not a package)."""
    import ast

    tree = ast.parse((REPO / "benchmarks/soak.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FAULTS":
            return ast.literal_eval(node.value)
    raise AssertionError("no FAULTS in benchmarks/soak.py")


class Lines:
    """``python3 -m compat_hook.install.watch ARGS`` and the lines it prints, read with a deadline."""

    def __init__(self, *args) -> None:
        self.p = subprocess.Popen([PY, "-m", "compat_hook.install.watch", *map(str, args)], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        os.set_blocking(self.p.stdout.fileno(), False)
        self.buf = ""

    def next(self, timeout: float = 10) -> str | None:
        deadline = time.monotonic() + timeout
        while "\n" not in self.buf:
            if time.monotonic() > deadline:
                return None
            try:
                chunk = os.read(self.p.stdout.fileno(), 4096)
            except BlockingIOError:
                chunk = b""
            if chunk:
                self.buf += chunk.decode()
            else:
                time.sleep(0.01)
        line, self.buf = self.buf.split("\n", 1)
        return line

    def close(self) -> str:
        self.p.kill()
        self.p.wait()
        return self.p.stderr.read().decode()


def test_watch_reports_a_config_written_anew_with_its_dirs(tmp_path):
    cfg = tmp_path / "toolkit/.config/nvidia-container-runtime/config.toml"
    w = Lines("--every", 60, cfg)
    try:
        assert w.next() == "ready"
        assert w.next(0.3) is None  # nothing changed: quiet (the fallback poll is 60 s away)
        cfg.parent.mkdir(parents=True)
        cfg.write_text("a = 1\n")
        assert w.next(5) == "change"
        assert w.next(0.3) is None
        # the operator's toolkit container: the whole dir deleted, then written again from scratch
        shutil.rmtree(tmp_path / "toolkit")
        assert w.next(5) == "change"
        cfg.parent.mkdir(parents=True)
        t0 = time.monotonic()
        (cfg.parent / "new").write_text("b = 2\n")
        os.rename(cfg.parent / "new", cfg)
        assert w.next(5) == "change"
        assert time.monotonic() - t0 < 1.0
        # written in place, and an unrelated file beside it (no line for that)
        (cfg.parent / "other.toml").write_text("x\n")
        time.sleep(0.2)
        with open(cfg, "a") as f:
            f.write("c = 3\n")
        assert w.next(5) == "change"
        assert w.next(0.3) is None
    finally:
        assert w.close() == ""


def test_watch_polls_as_the_fallback_and_rejects_bad_usage(tmp_path):
    w = Lines("--every", 0.2, tmp_path / "none.toml")
    try:
        assert [w.next(), w.next(2), w.next(2)] == ["ready", "poll", "poll"]
    finally:
        w.close()
    for args in ([], ["--every"], ["--every", "0", "x"], ["--frequency", "1", "x"]):
        p = subprocess.run([PY, "-m", "compat_hook.install.watch", *args], cwd=REPO, capture_output=True, text=True)
        assert p.returncode == 2 and p.stderr.startswith("compat-hook watch: ") and "Traceback" not in p.stderr, \
            (args, p.stderr)


@pytest.mark.containers
@pytest.mark.slow
def test_short_soak_meets_the_targets(tmp_path):
    out = tmp_path / "soak.json"
    # Every fault, uninstall-race included: an uninstall while a pod's sandbox starts used to remove the
    # wrapper between the sandbox's create and start ("fork/exec .../compat-hook-runtime: no such file
    # or directory"); it now leaves a pass-through while containerd runs with the runtime in memory.
    faults = ",".join(soak_faults())
    p = subprocess.run([PY, str(REPO / "benchmarks/soak.py"), "--starts", "40", "--every", "5", "--seed", "3",
                        "--faults", faults, "--json", out, "--work", tmp_path / "work"], cwd=REPO, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=900, env=dict(os.environ))
    assert out.exists(), (p.stdout, p.stderr[-4000:])
    fig = json.loads(out.read_text())
    why = f"\n{p.stdout}\n{p.stderr[-3000:]}"
    assert fig["attempted"] == 40, why
    # every fault kind hit at least one start, and the driver both rose and fell
    assert set(soak_faults()) <= set(fig["faults"]) and all(n >= 1 for n in fig["faults"].values()), \
        (fig["faults"], why)
    assert fig["expected"]["compat"] and fig["expected"]["host"], why
    assert fig["wrong_libcuda"] == [], why
    assert fig["corrupted"] == [], why
    assert fig["leftovers"] == [], why
    assert fig["lost_lines"] == [], why
    # starts under an invalid config.yaml were decided (by the defaults) and their lines say so
    assert fig["config_invalid_starts"] >= 1 and fig["config_invalid_logged"] == fig["config_invalid_starts"], why
    assert fig["log_nul_bytes"] == 0 and fig["log_bad_lines"] == [], why
    assert fig["failed"] == fig["failed_allowed"], (fig["failures"], why)
    assert fig["next_start_after_fault_failed"] == [], why
    assert fig["written_outside_own_dirs"] == [] and fig["host_changes"] == [], why
    assert fig["reregistration_ms"] and fig["reregistration_ms_max"] <= 1000, why
    assert fig["engine_left"] == {"processes": [], "mounts": []}, why
    assert p.returncode == 0 and "targets met: yes" in p.stdout, why


# What the soak found: a log line written as the log's filesystem fills up came out torn (a
# fragment without its newline, the next start's line glued to it: two lines lost).
TORN = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
from compat_hook.core import logjson
d = sys.argv[1]
log = os.path.join(d, "compat-hook.log")
logjson.write_line(log, {"event": "hook", "pad": "a" * 3800})  # the page's tail: ~240 bytes left
fill = os.open(os.path.join(d, "fill"), os.O_WRONLY | os.O_CREAT)
for chunk in (65536, 4096, 1):
    try:
        while os.write(fill, b"\0" * chunk):
            pass
    except OSError:
        pass
print("full:", logjson.write_line(log, {"event": "hook", "container_id": "full", "pad": "b" * 600}))
os.close(fill)
os.unlink(os.path.join(d, "fill"))
print("after:", logjson.write_line(log, {"event": "hook", "container_id": "after"}))
sys.stdout.write(open(log, "rb").read().decode())
"""


@pytest.mark.containers
def test_a_full_log_filesystem_never_leaves_a_torn_line(tmp_path):
    d = tmp_path / "logfs"
    d.mkdir()
    script = tmp_path / "torn.py"
    script.write_text(TORN)
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                        f'mount -t tmpfs -o size=64k t "$1" && exec {PY} "$2" "$1" "$3"', "sh", d, script, REPO],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[:2] == ["full: False", "after: True"], (out, p.stderr)
    assert "cannot write log" in p.stderr and "Traceback" not in p.stderr, p.stderr
    lines = out[2:]
    assert [json.loads(ln).get("container_id") for ln in lines] == [None, "after"], lines  # whole lines only


ROTATE = r"""
set -eu
mount -t tmpfs -o size=8m,mode=0755 tmpfs /var/log   # root-owned 0755, as on a node
write() {{ PYTHONPATH={repo} /usr/bin/python3 -I -c "import sys; sys.path.insert(0, '{repo}')
from compat_hook.core import logjson
for i in range($1):
    logjson.write_line('/var/log/compat-hook.log', {{'event': 'hook', 'container_id': 'c%d' % i,
                       'decision': 'skip', 'reason': 'no_gpu_request'}})"; }}
write 3
logrotate -f -s {state} {conf}
write 2
logrotate -f -s {state} {conf}
write 1
ls /var/log
cd {repo} && /usr/bin/python3 -m compat_hook report --log /var/log/compat-hook.log --json
"""


@pytest.mark.containers
def test_the_shipped_logrotate_file_rotates_and_report_reads_every_copy(tmp_path):
    """The package's /etc/logrotate.d/compat-hook, run by the real logrotate twice over the default log:
    the live file, ``.1`` and ``.2.gz`` (delaycompress) hold every line, none torn, and ``report``
    reads the rotated copies with the live file (6 records)."""
    script = tmp_path / "rotate.sh"
    script.write_text(ROTATE.format(repo=REPO, state=tmp_path / "state", conf=REPO / "packaging/debian/logrotate"))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", str(script)],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    listing, _, report = p.stdout.partition("{")
    assert listing.split() == ["compat-hook.log", "compat-hook.log.1", "compat-hook.log.2.gz"], listing
    doc = json.loads("{" + report)
    assert doc["records"] == 6 and doc["bad_lines"] == 0, doc
