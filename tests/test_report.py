"""``compat-hook report`` on decision logs the real hook wrote, and on damaged, rotated and big ones.

The log of :func:`hook_log`: the registered hook (``python3 -I -S``, as runc
runs it) started for pods on a host whose driver goes from 535 to 590 (a
driver upgrade between starts), plus a failing start; what ``report`` says is
checked against those runs.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time

import pytest

from compat_hook.core import logjson
from compat_hook.commands.report import MAX_KEYS, MAX_PERIODS, parse_since, report
from tests.support import hostile as H

PY = "/usr/bin/python3"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H590 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.44.01  Wed Jul  2 13:16:27 UTC 2025\n"


def cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "compat_hook", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, stdin=subprocess.DEVNULL)


def _start(env, tmp_path, name: str, pod: str, image: str, *, bundle_ok: bool = True) -> dict:
    bundle = tmp_path / f"b-{name}"
    if bundle_ok:
        H.base_rootfs(bundle / "rootfs")
    spec = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"args": ["/bin/true"], "env": ["NVIDIA_VISIBLE_DEVICES=all"], "cwd": "/"},
            "annotations": {"io.kubernetes.cri.sandbox-name": pod, "io.kubernetes.cri.sandbox-namespace": "ml",
                            "io.kubernetes.cri.container-name": "main", "io.kubernetes.cri.image-name": image}}
    H.write_bundle(bundle, spec=spec)  # without bundle_ok, no rootfs: the start fails
    r = H.run_hook(env.entry, H.state_json(bundle, id=name))
    assert r.rc == 0, r
    return json.loads(env.log.read_text().splitlines()[-1])


@pytest.fixture(scope="module")
def hook_log(tmp_path_factory):
    """Real hook runs: 3 starts on driver 535, the upgrade to 590, 2 starts and a failing one."""
    tmp = tmp_path_factory.mktemp("report")
    env = H.make_hook_env(tmp)
    recs = [_start(env, tmp, f"a{i}", f"train-{i}", "nvcr.io/nvidia/pytorch:24.05") for i in range(3)]
    (env.host_root / "proc/driver/nvidia/version").write_text(H590)
    recs += [_start(env, tmp, f"b{i}", f"train-{i}", "nvcr.io/nvidia/pytorch:24.05") for i in range(2)]
    recs.append(_start(env, tmp, "bad", "broken-0", "example/bad:1", bundle_ok=False))
    return env.log, recs


def test_periods_follow_the_driver_upgrade(hook_log):
    log, recs = hook_log
    assert [r["host_driver_version"] for r in recs[:5]] == [H.HOST_DRIVER] * 3 + ["590.44.01"] * 2
    rep = report([str(log)])
    assert rep["records"] == 6 and rep["bad_lines"] == 0
    # the failing start never read the driver: its own period, not the 590 one it came after
    assert "host_driver_version" not in recs[5]
    before, after, nodrv = rep["periods"]
    assert (before["driver"], after["driver"], nodrv["driver"]) == (H.HOST_DRIVER, "590.44.01", None)
    assert before["from"] == recs[0]["time"] and before["to"] == recs[2]["time"]
    assert after["from"] == recs[3]["time"] and after["to"] == recs[4]["time"]
    assert nodrv["from"] == nodrv["to"] == recs[5]["time"] and nodrv["records"] == 1
    assert before["decisions"] == [{"decision": recs[0]["decision"], "reason": recs[0]["reason"], "count": 3,
                                    "events": {"hook": 3}}]
    assert {(d["decision"], d["reason"]): d["count"] for d in after["decisions"]} == {
        (recs[3]["decision"], recs[3]["reason"]): 2}
    assert after["failures"]["count"] == 0
    # The decision changed with the driver: compat before, the host's after.
    assert recs[0]["decision"] == "enable" and recs[3]["decision"] == "skip"
    assert before["images"] == [{"image": "nvcr.io/nvidia/pytorch:24.05", "count": 3,
                                 "decisions": {f"enable/{recs[0]['reason']}": 3}}]
    assert [p["pod"] for p in before["pods"]] == ["ml/train-0", "ml/train-1", "ml/train-2"]
    f = nodrv["failures"]
    assert f["count"] == 1 and f["last"][0]["container_id"] == "bad" and f["last"][0]["error"] == recs[5]["error"]
    assert rep["summary"] == {"periods": 3, "drivers": [H.HOST_DRIVER, "590.44.01", None], "failures": 1,
                              "warnings": sum(len(r.get("warnings") or []) for r in recs)}


def test_cli_text_json_exit_status(hook_log):
    log, recs = hook_log
    p = cli("report", "--log", log)
    assert p.returncode == 0, p.stderr
    assert f"host driver {H.HOST_DRIVER}: {recs[0]['time']} .. {recs[2]['time']}, 3 record(s) (hook 3)" in p.stdout
    assert "host driver 590.44.01:" in p.stdout and "failures: 1" in p.stdout
    assert f"2 driver period(s) ({H.HOST_DRIVER} -> 590.44.01), and records without a driver, 1 failure(s)" \
        in p.stdout
    assert f"no host driver in the record: {recs[5]['time']} .. {recs[5]['time']}, 1 record(s) (hook 1)" in p.stdout
    j = cli("report", "--log", log, "--json")
    assert json.loads(j.stdout) == json.loads(json.dumps(report([str(log)])))
    assert cli("report", "--log", log, "--fail-on", "failures").returncode == 3
    # Since the upgrade: one period, and still the failure.
    since = cli("report", "--log", log, "--since", recs[3]["time"], "--json")
    rep = json.loads(since.stdout)
    assert [p["driver"] for p in rep["periods"]] == ["590.44.01", None] and rep["skipped_before_since"] == 3
    # The last hour holds every start, the failing one too; a time to come, none.
    assert cli("report", "--log", log, "--since", "1h", "--fail-on", "failures").returncode == 3
    none = cli("report", "--log", log, "--since", "2999-01-01", "--fail-on", "failures", "--json")
    assert none.returncode == 0 and json.loads(none.stdout)["records"] == 0


def test_config_log_file_is_the_default(hook_log, tmp_path):
    log, _ = hook_log
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"log_file: {json.dumps(str(log))}\n")
    p = cli("report", "--config", cfg, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["records"] == 6
    cfg.write_text("log_file: null\n")
    p = cli("report", "--config", cfg)
    assert p.returncode == 2
    assert p.stderr.strip() == "compat-hook: no log: the config's log_file is null; give --log FILE"


def test_bad_usage_and_unreadable_input(tmp_path):
    for args, msg in ((["--log", tmp_path / "nope"], "cannot read"),
                      (["--log", tmp_path, "--no-rotated"], "cannot read"),
                      (["--log", tmp_path / "nope", "--since", "yesterday"], "--since 'yesterday'"),
                      (["--fail-on", "warnings"], "invalid choice")):
        p = cli("report", *args)
        assert p.returncode == 2 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)
        assert "Traceback" not in p.stderr


def _rec(t: str, drv: str, decision="enable", reason="compat_major_newer", **kw) -> dict:
    return dict(time=t, event="hook", decision=decision, reason=reason, host_driver_version=drv, **kw)


def test_damaged_and_rotated_logs(tmp_path):
    base = tmp_path / "compat-hook.log"
    # Oldest first: .2.gz (truncated mid-way, rotation interrupted), .1, then the live file.
    g = gzip.compress(b"".join((json.dumps(_rec(f"2026-01-01T00:00:0{i}.000Z", "535.104.05")) + "\n").encode()
                               for i in range(5)))
    (tmp_path / "compat-hook.log.2.gz").write_bytes(g[: len(g) - 12])
    (tmp_path / "compat-hook.log.1").write_bytes(
        (json.dumps(_rec("2026-01-02T00:00:00.000Z", "535.104.05")) + "\n").encode()
        + b"{not json\n" + b"[1, 2]\n" + b'{"time": "\xff\xfe not UTF-8"}\n' + b"x" * (2 << 20) + b"\n"
        + (json.dumps(_rec("2026-01-02T00:00:01.000Z", "535.104.05", "error", "os_error", error="boom"))
           + "\n").encode())
    # The live file, written by the hook's own log writer.
    logjson.write_line(str(base), {"event": "hook", "decision": "enable", "reason": "compat_major_newer",
                                   "host_driver_version": "580.65.06", "warnings": ["w1", "w1"]})
    with open(base, "a") as f:
        f.write(json.dumps({"time": "2026-01-03T00:00:01.000Z", "event": "runtime", "decision": "skip",
                            "reason": "not_gpu"}) + "\n")   # no driver: the period without one
        f.write('{"time": "2026-01-03T00:00:02.000Z", "event": "hook", "decisi')   # torn last line
    rep = report([str(base)])
    assert rep["files"] == [str(tmp_path / "compat-hook.log.2.gz"), str(tmp_path / "compat-hook.log.1"), str(base)]
    # 5 gzip records at most (the damaged tail costs the last ones), 2 in .1, 2 live.
    n_gz = rep["records"] - 4
    assert 0 <= n_gz <= 5
    # .1: not JSON, not an object, not UTF-8, over 1 MiB; the torn live line; the .gz tail.
    assert rep["bad_lines"] == 6 and len(rep["notes"]) == 1 and "compat-hook.log.2.gz" in rep["notes"][0]
    assert [p["driver"] for p in rep["periods"]] == ["535.104.05", "580.65.06", None]
    assert rep["periods"][0]["failures"]["count"] == 1
    assert rep["periods"][1]["events"] == {"hook": 1} and rep["periods"][2]["events"] == {"runtime": 1}
    assert rep["periods"][1]["warnings"] == [{"warning": "w1", "count": 2}]
    only = report([str(base)], rotated=False)
    assert only["files"] == [str(base)] and only["records"] == 2


def test_records_without_a_driver_are_a_period_of_their_own(tmp_path):
    """Before the first driver, and between two records of one driver: neither counted in a driver
    period nor splitting one."""
    log = tmp_path / "log"
    log.write_text("".join(json.dumps(r) + "\n" for r in (
        {"time": "2026-01-01T00:00:00.000Z", "event": "hook", "decision": "skip", "reason": "not_gpu"},
        _rec("2026-01-01T00:00:01.000Z", "535.104.05"),
        {"time": "2026-01-01T00:00:02.000Z", "event": "hook", "decision": "error", "reason": "bad_config"},
        _rec("2026-01-01T00:00:03.000Z", "535.104.05"),
        _rec("2026-01-01T00:00:04.000Z", "550.54.15"),
        _rec("2026-01-01T00:00:05.000Z", "535.104.05"))))
    rep = report([str(log)])
    assert [(p["driver"], p["records"], p["failures"]["count"]) for p in rep["periods"]] == [
        ("535.104.05", 2, 0), ("550.54.15", 1, 0), ("535.104.05", 1, 0), (None, 2, 1)]
    assert rep["periods"][-1]["from"] == "2026-01-01T00:00:00.000Z"
    assert rep["periods"][-1]["to"] == "2026-01-01T00:00:02.000Z"


BAD_TIMES = ["garbage", "zzzz-99-99T99:99:99.999Z", "2026-13-01T00:00:00.000Z", "", 1767225600, None,
             "2026-01-01 00:00:00", "9999-12-31T23:59:59.999Z "]


def test_a_record_without_a_valid_time_does_not_pass_since(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as f:
        f.write(json.dumps(_rec("2026-01-01T00:00:00.000Z", "535.104.05")) + "\n")            # old
        for t in BAD_TIMES:                                                                  # no valid time
            f.write(json.dumps(dict(_rec("x", "535.104.05"), time=t)) + "\n")
        f.write(json.dumps({k: v for k, v in _rec("x", "535.104.05").items() if k != "time"}) + "\n")
        f.write(json.dumps(_rec("2026-06-01T00:00:00.000Z", "535.104.05")) + "\n")            # recent
    rep = report([str(log)], since="2026-03-01T00:00:00.000Z")
    assert rep["records"] == 1 and rep["skipped_before_since"] == 1
    assert rep["bad_time"] == rep["excluded_no_time"] == len(BAD_TIMES) + 1
    assert f"{len(BAD_TIMES) + 1} record(s) without a valid time left out by --since" in rep["notes"]
    # without --since they count (their time is unknown), and are still counted as such
    every = report([str(log)])
    assert every["records"] == len(BAD_TIMES) + 3 and every["bad_time"] == len(BAD_TIMES) + 1
    assert every["excluded_no_time"] == 0
    p = cli("report", "--log", log, "--since", "2026-03-01")
    assert p.returncode == 0
    assert p.stdout.splitlines()[0].endswith(f"; {len(BAD_TIMES) + 1} record(s) without a valid time")
    assert f"note: {len(BAD_TIMES) + 1} record(s) without a valid time left out by --since" in p.stdout


def test_bad_config_failure_names_the_container(tmp_path):
    """A fail-closed hook whose config does not load stops the start and still names the container
    it failed for (from the state), in the log file its registration named."""
    env = H.make_hook_env(tmp_path, on_error="fail")
    assert "--fail-closed" in env.entry["args"]
    env.config.write_text("mode: sideways\n")
    bundle = tmp_path / "b"
    H.base_rootfs(bundle / "rootfs")
    H.write_bundle(bundle)
    state = H.state_json(bundle, id="ctr-7", annotations={"io.kubernetes.cri.sandbox-name": "train-7",
                                                          "io.kubernetes.cri.sandbox-namespace": "ml",
                                                          "io.kubernetes.cri.image-name": "example/app:1"})
    res = H.run_hook(env.entry, state)
    assert res.rc == 1, res
    assert res.stderr.decode() == "compat-hook: mode: must be one of ldconfig, env, both, got 'sideways'\n"
    [rec] = env.log_records()
    assert (rec["decision"], rec["reason"]) == ("error", "bad_config") and "mode" in rec["error"]
    assert rec["outcome"] == "container stopped (on_error: fail)"
    assert (rec["container_id"], rec["bundle"]) == ("ctr-7", str(bundle))
    assert (rec["pod"], rec["namespace"], rec["image"]) == ("train-7", "ml", "example/app:1")
    rep = report([str(env.log)])
    [failure] = rep["periods"][0]["failures"]["last"]
    assert failure["container_id"] == "ctr-7" and failure["bundle"] == str(bundle)
    assert f"ctr-7 (ml/train-7): bad_config: " in cli("report", "--log", env.log).stdout


def test_records_without_an_image_are_counted_and_explained(tmp_path):
    log = tmp_path / "log"
    log.write_text("".join(json.dumps(r) + "\n" for r in (
        _rec("2026-01-01T00:00:00.000Z", "535.104.05", image="nvcr.io/nvidia/pytorch:24.05"),
        dict(_rec("2026-01-01T00:00:01.000Z", "535.104.05"), event="runtime"),   # a Docker start
        _rec("2026-01-01T00:00:02.000Z", "535.104.05"))))
    [p] = report([str(log)])["periods"]
    assert p["no_image"] == {"hook": 1, "runtime": 1}
    assert "    (no image named: 2 record(s), hook 1, runtime 1; Docker and ctr put no image in the OCI spec)" \
        in cli("report", "--log", log).stdout.splitlines()


def test_flapping_drivers_are_bounded(tmp_path):
    log = tmp_path / "log"
    log.write_text("".join(json.dumps(_rec(f"2026-01-01T00:00:{i % 60:02d}.000Z",
                                           "535.104.05" if i % 2 else "550.54.15")) + "\n" for i in range(1000)))
    rep = report([str(log)])
    assert len(rep["periods"]) == MAX_PERIODS and rep["periods"][-1]["driver"] == "(several)"
    assert sum(p["records"] for p in rep["periods"]) == 1000 and len(rep["notes"]) == 1


def test_since_parsing():
    assert parse_since("2026-12-02T15:00:00Z") == "2026-12-02T15:00:00.000Z"
    assert parse_since("2026-12-02") == "2026-12-02T00:00:00.000Z"
    assert parse_since("30m", now=3600.0) == "1970-01-01T00:30:00.000Z"
    assert parse_since("1.5h", now=7200.0) == "1970-01-01T00:30:00.000Z"


def test_big_log_in_constant_memory(tmp_path):
    """300k lines (~100 MB) with ever new pods and images: the tables stay capped, memory flat."""
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    t0 = time.monotonic()
    line = {"time": "", "event": "hook", "decision": "enable", "reason": "compat_major_newer",
            "host_driver_version": "535.104.05", "container_id": "", "pod": "", "namespace": "ml",
            "image": "", "candidate": "libcuda.so.550.54.15", "actions": ["wrote drop-in", "ldconfig -r"] * 8}
    with open(big, "w") as f:
        for i in range(300_000):
            line.update(time=f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z",
                        container_id=f"c{i}", pod=f"job-{i}", image=f"reg/img:{i}")
            f.write(json.dumps(line) + "\n")
    small.write_text(json.dumps(line) + "\n")
    assert big.stat().st_size > 90 << 20 and time.monotonic() - t0 < 60
    code = ("import sys; from compat_hook.commands.report import report; r = report([sys.argv[1]]); "
            "print(r['records'], len(r['periods'][0]['pods']), "
            "[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])")
    out = {}
    for p in (small, big):
        res = subprocess.run([PY, "-c", code, str(p)], capture_output=True, text=True, cwd=REPO, timeout=300)
        assert res.returncode == 0, res.stderr
        out[p.name] = [int(x) for x in res.stdout.split()]
    assert out["big.log"][:2] == [300_000, MAX_KEYS + 1]          # capped, plus "(others)"
    assert out["big.log"][2] - out["small.log"][2] < 8 * 1024, out  # KiB


def test_the_logs_spool_is_read_by_report_and_merged_by_the_next_line(tmp_path):
    """A hook the log is closed to (a user-namespaced createContainer hook) leaves its line in the spool;
    only lines in compat-hook's own shape count, each marked with the uid that wrote it."""
    from compat_hook.core import logjson

    log = tmp_path / "log"
    assert logjson.write_line(str(log), {"event": "hook", "decision": "skip", "reason": "no_gpu_request"})
    spool = tmp_path / ".log.spool"  # beside the log, hidden
    assert spool.is_dir() and spool.stat().st_mode & 0o7777 == 0o1733  # made by the first line
    good = ('{"time":"2026-01-01T00:00:00.000Z","event":"hook","decision":"enable",'
            '"reason":"compat_major_newer","host_driver_version":"535.104.05"}\n')
    (spool / "1-good.json").write_text(good)
    (spool / "2-two-lines.json").write_text(good + good)
    (spool / "3-no-time.json").write_text('{"event":"hook","decision":"enable"}\n')
    (spool / "4-big.json").write_text(good[:-2] + "," + '"x":"' + "a" * 70000 + '"}\n')
    os.symlink(str(log), spool / "5-link.json")
    (spool / "0-a-dir").mkdir()  # passed over, never read
    rep = report([str(log)])
    assert rep["records"] == 2, rep  # the log's own line and the one good spooled line
    assert logjson.write_line(str(log), {"event": "hook", "decision": "skip", "reason": "no_gpu_request"})
    assert sorted(os.listdir(spool)) == ["0-a-dir"]  # merged or dropped, all gone but the dir
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x.get("spooled_by_uid") for x in lines] == [None, None, os.getuid()]
    assert list(lines[2])[:2] == ["time", "spooled_by_uid"] and lines[2]["decision"] == "enable"
    assert report([str(log)])["records"] == 3
