"""The loader model is bounded in time as well as in files: a hostile ``include`` tree ends in a reason code.

The layer an attacker ships: ``/etc/ld.so.conf`` includes ``/etc/ld.so.conf.d/*.conf``, a dir of
thousands of links to one file whose one 16 KB line is ``include`` followed by hundreds of patterns
naming that same dir. Read as ldconfig reads it, that is every file read again through every
pattern: unbounded, it kept ``plan`` busy for minutes. The model reads each dir once, matches each
glob once, expands at most a few patterns per line and in all, and stops at a deadline
(``compat_hook.facts.loader``). What it could not read is ``LdConf.incomplete``, a reason code that
the hook's log line and ``explain`` carry (the decision goes on with what was read), and on which
``plan`` gives no verdict (the row's ``error_code``, exit 4).

No timing is asserted beyond what the bounds guarantee: a few seconds for what takes tens of
milliseconds, against minutes before.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time

import pytest

from compat_hook.facts import loader
from compat_hook.facts.rootfs import Root
from tests.support import hostile as h
from tests.support import images as I

REPO = str(pathlib.Path(__file__).resolve().parent.parent)
PY = "/usr/bin/python3"
#: One 16 KB include line: the dir's glob, 680 times.
LINE = ("include " + " ".join(["/etc/ld.so.conf.d/*.conf"] * 680) + "\n").encode()
CODES = set(loader.INCOMPLETE)


def hostile_tree(root: pathlib.Path, n: int) -> pathlib.Path:
    """``n`` links in ld.so.conf.d to the one file holding :data:`LINE`."""
    d = root / "etc/ld.so.conf.d"
    d.mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("/opt/first\ninclude /etc/ld.so.conf.d/*.conf\n")
    (d / "inc.cnf").write_bytes(LINE)
    for i in range(n):
        os.symlink("inc.cnf", d / f"{i:05d}.conf")
    return root


def hostile_layer(n: int) -> bytes:
    entries = [("dir", "etc"), ("dir", "etc/ld.so.conf.d"),
               ("file", "etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n"),
               ("file", "etc/ld.so.conf.d/inc.cnf", LINE)]
    entries += [("symlink", f"etc/ld.so.conf.d/{i:05d}.conf", "inc.cnf") for i in range(n)]
    return I.gz(I.tar_layer(entries))


class Counting:
    """The surface the loader reads, passed through and counted (the input, not the code under test)."""

    def __init__(self, root) -> None:
        self.root, self.listed, self.read = root, {}, 0

    def listdir(self, path):
        self.listed[path] = self.listed.get(path, 0) + 1
        return self.root.listdir(path)

    def read_file(self, path, limit=1 << 20):
        self.read += 1
        return self.root.read_file(path, limit)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return hostile_tree(tmp_path_factory.mktemp("hostile") / "rootfs", 20000)


def test_each_dir_is_listed_once_and_the_reading_is_bounded(tree):
    with Root(str(tree)) as root:
        c = Counting(root)
        t0 = time.monotonic()
        conf = loader.ld_so_conf(c, skip="00-00-compat-hook.conf")
        took = time.monotonic() - t0
    assert c.listed == {"/etc/ld.so.conf.d": 1}
    assert c.read <= loader.MAX_FILES + 1
    assert conf.incomplete in CODES and conf.why_incomplete().startswith(conf.incomplete + ": ")
    assert len(conf.notes) <= loader.MAX_NOTES
    # what was read before the bound still counts: /etc/ld.so.conf's own first line
    assert conf.entries[0][1:] == ("/etc/ld.so.conf:1", "/opt/first")
    assert took < 5 + loader.DEADLINE_S


def test_a_deadline_passed_stops_the_reading_with_its_code(tree):
    with Root(str(tree)) as root:
        conf = loader.ld_so_conf(root, deadline=time.monotonic() - 1)
    assert conf.incomplete == "ld_so_conf_deadline"
    assert [e[2] for e in conf.entries] == ["/opt/first"]  # the line before the include
    assert not any("includes no" in n for n in conf.notes)  # not known: not said


def test_a_plain_tree_is_complete_and_reads_no_clock_without_an_include(tmp_path):
    plain = tmp_path / "plain"
    (plain / "etc/ld.so.conf.d").mkdir(parents=True)
    (plain / "etc/ld.so.conf").write_text("/opt/a\n")
    with Root(str(plain)) as root:
        # a deadline long past: never looked at, as there is no include
        assert loader.ld_so_conf(root, deadline=0.0).incomplete is None
    (plain / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (plain / "etc/ld.so.conf.d/a.conf").write_text("/a\n")
    with Root(str(plain)) as root:
        conf = loader.ld_so_conf(root)
    assert conf.incomplete is None and [e[2] for e in conf.entries] == ["/a"]


def test_many_patterns_on_one_line_are_cut_with_the_bounded_code(tmp_path):
    r = tmp_path / "r"
    (r / "etc/ld.so.conf.d").mkdir(parents=True)
    globs = " ".join(f"/etc/ld.so.conf.d/{i:02d}*.conf" for i in range(loader.MAX_PATTERNS + 4))
    (r / "etc/ld.so.conf").write_text(f"include {globs}\n")
    for i in range(loader.MAX_PATTERNS + 4):
        (r / f"etc/ld.so.conf.d/{i:02d}.conf").write_text(f"/d{i}\n")
    with Root(str(r)) as root:
        conf = loader.ld_so_conf(root)
    assert conf.incomplete == "ld_so_conf_bounded"
    assert [e[2] for e in conf.entries] == [f"/d{i}" for i in range(loader.MAX_PATTERNS)]


def _conf(tmp_path: pathlib.Path) -> str:
    host = tmp_path / "host"
    (host / "proc/driver/nvidia").mkdir(parents=True, exist_ok=True)
    (host / "proc/driver/nvidia/version").write_text(h.HOST_VERSION_LINE)
    conf = tmp_path / "plan.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {host}\nstore_dir: {tmp_path / 'store'}\n")
    return str(conf)


def _plan(*args) -> tuple:
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "compat_hook", "plan", *args, "--driver", "580.65.06", "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    return p, time.monotonic() - t0


def test_plan_on_the_hostile_rootfs_gives_no_verdict_with_the_code(tree, tmp_path):
    p, took = _plan(str(tree), "--config", _conf(tmp_path))
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr
    [row] = json.loads(p.stdout)["images"]
    assert row["error_code"] in CODES and row["now"] is None, row
    assert took < 30  # minutes before; the reading's own bound is a fraction of a second


def test_plan_on_the_hostile_image_gives_no_verdict_with_the_code(tmp_path):
    lay = I.Layout(tmp_path / "layout")
    blob = hostile_layer(20000)
    assert len(blob) < 1 << 20  # a small layer
    lay.tag(lay.image([blob], env=["CUDA_VERSION=12.4.1"]), "hostile")
    p, took = _plan(f"oci:{lay.path}:hostile", "--config", _conf(tmp_path))
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr
    [row] = json.loads(p.stdout)["images"]
    assert row["error_code"] in CODES, row
    assert took < 30


def test_the_agents_workload_rows_give_no_verdict_with_the_code(tmp_path):
    """The agent's pass assesses its node's workloads through ``plan``'s workload rows
    (``policy.preflight.plan(workloads=...)``, as ``cluster.predict`` calls it): the hostile image is
    one unreadable workload with the code (the pass incomplete, an existing hold kept), the other
    workload of the node is judged as ever."""
    import functools

    from compat_hook.core.config import from_mapping
    from compat_hook.images.sources import open_source
    from compat_hook.policy import preflight

    lay = I.Layout(tmp_path / "layout")
    lay.tag(lay.image([hostile_layer(20000)], env=["CUDA_VERSION=12.4.1"]), "hostile")
    lay.tag(lay.image([I.gz(I.tar_layer([("file", "etc/os-release", b"ID=debian\n")]))],
                      env=["CUDA_VERSION=12.4.1"]), "plain")
    host = tmp_path / "host"
    (host / "proc/driver/nvidia").mkdir(parents=True)
    (host / "proc/driver/nvidia/version").write_text(h.HOST_VERSION_LINE)
    cfg = from_mapping({"log_file": None, "nvml": "off", "host_root": str(host)})
    wl = [{"source": f"oci:{lay.path}:{t}", "name": f"{t} (ml/p c)", "env": [], "annotations": {},
           "runtime": "compat-hook", "unknown": None} for t in ("hostile", "plain")]
    t0 = time.monotonic()
    r = preflight.plan(cfg, [], driver="580.65.06", workloads=wl, opener=open_source,
                       expander=functools.partial(list))
    assert time.monotonic() - t0 < 30
    bad, good = r["images"]
    assert bad["error_code"] in CODES and bad["now"] is None and bad["name"] == "hostile (ml/p c)", bad
    assert good.get("error") is None and good["now"] is not None, good
    assert r["summary"]["unreadable"] == 1 and preflight.gate(r, None)[0] == preflight.EXIT_UNREADABLE


@pytest.mark.parametrize("compat", [False, True])
def test_the_hook_on_the_hostile_rootfs_starts_the_container_and_logs_the_code(tmp_path, compat):
    """Without a compat driver (the common start) the decision is made on what was read; with one, the
    hook does not run ldconfig on a tree it could not finish reading (the real one would read it too, up
    to ``ldconfig_timeout``): it fails open at once with the loader's code as its reason."""
    env = h.make_hook_env(tmp_path / "hookenv")
    bundle = h.write_bundle(tmp_path / "bundle")
    root = h.base_rootfs(bundle / "rootfs", compat=compat)
    hostile_tree(root, 20000)
    res = h.run_hook(env.entry, h.state_json(bundle), cwd=root)
    assert res.rc == 0 and b"Traceback" not in res.stdout + res.stderr, res
    assert res.duration < h.HOOK_TIMEOUT / 2, res
    rec = env.last_record()
    assert rec["ld_so_conf_incomplete"] in CODES, rec
    if compat:
        assert (rec["decision"], rec["reason"]) == ("error", rec["ld_so_conf_incomplete"]), rec
        assert not any(a.startswith("ldconfig") for a in rec.get("actions") or []) and "maps" not in rec, rec
        assert res.duration < h.HOOK_TIMEOUT / 4, res  # no ldconfig_timeout waited out
        return
    assert (rec["decision"], rec["reason"]) == ("skip", "no_candidate"), rec
    assert any(w.startswith(rec["ld_so_conf_incomplete"] + ":") for w in rec["warnings"]), rec


def test_explain_names_the_code(tree, tmp_path):
    p = subprocess.run([PY, "-m", "compat_hook", "explain", "--rootfs", str(tree), "--host-driver-version",
                        "535.183.01", "--config", _conf(tmp_path), "--json"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "ld_so_conf_bounded" in p.stdout or "ld_so_conf_deadline" in p.stdout, p.stdout[-2000:]
