"""``compat-hook explain``: the right answer and reason for every row of the docs'
tables, the CLI contract (JSON keys, exit statuses, one-line errors), and that
it writes nothing anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compat_hook.commands.explain import explain, render_text
from tests.support import measured as T
from tests.conftest import Symlink, config_for, elf, snapshot_tree
from tests.elfgen import NOTE_575, NOTE_590

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = {"decision", "reason", "compat_dir", "compat_version", "host_driver_version", "note"}
ROOT_575 = {"usr/local/cuda-12.9/compat/libcuda.so.575.57.08": elf(NOTE_575),
            "usr/local/cuda-12.9/compat/libcuda.so.1": Symlink("libcuda.so.575.57.08"),
            "usr/local/cuda": Symlink("cuda-12.9")}


def cfg(tmp_path, host_root, **kw):
    return config_for(host_root, store_dir=str(tmp_path / "store"), log_file=str(tmp_path / "log" / "x.log"), **kw)


def write_config(tmp_path, host_root=None, extra=""):
    p = tmp_path / "conf" / "config.yaml"
    p.parent.mkdir(exist_ok=True)
    text = (f"nvml: 'off'\nstore_dir: {tmp_path / 'store'}\nlog_file: {tmp_path / 'log' / 'x.log'}\n"
            + (f"host_root: {host_root}\n" if host_root else "") + extra)
    p.write_text(text)
    return str(p)


def cli(*args, env=None):
    e = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "compat_hook", "explain", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=e)


# -- every table row, in process ----------------------------------------------------

def _explain_rows(make_rootfs, fake_host, tmp_path, entries, rows, **config):
    rootfs = make_rootfs(entries)
    host = fake_host()
    c = cfg(tmp_path, host, **config)
    for driver, cuda, action, reason in rows:
        r = explain(c, rootfs=str(rootfs), host_driver_version=driver, host_cuda_version=cuda)
        assert (r["decision"], r["reason"]) == (action, reason), (driver, cuda, r["details"])
        assert KEYS <= set(r)
        if action == "enable":
            assert r["compat_dir"] is not None
        render_text(r)


def test_explain_measured_elf590(make_rootfs, fake_host, tmp_path):
    _explain_rows(make_rootfs, fake_host, tmp_path, T.measured_rootfs(elf(NOTE_590)), T.ELF590)


def test_explain_measured_elf575(make_rootfs, fake_host, tmp_path):
    entries = {"usr/local/cuda-12.9/compat/libcuda.so.575.57.08": elf(NOTE_575), "usr/local/cuda": Symlink("cuda-12.9")}
    _explain_rows(make_rootfs, fake_host, tmp_path, entries, T.ELF575)


def test_explain_measured_noelf590(make_rootfs, fake_host, tmp_path):
    _explain_rows(make_rootfs, fake_host, tmp_path, T.measured_rootfs(elf(None)), T.NOELF590)


def test_explain_measured_garbage590(make_rootfs, fake_host, tmp_path):
    # NVIDIA would enable the 535-580 rows (major rule on a non-ELF file); we skip: not_elf.
    rows = [(d, None, "skip", "not_elf") for d in ("535.183.01", "550.54.15", "580.65.06", "590.30.01")]
    _explain_rows(make_rootfs, fake_host, tmp_path, T.measured_rootfs(b"garbage\n"), rows)


def test_explain_nvidia_elf_header_table(make_rootfs, fake_host, tmp_path):
    rows = [("590.44.01", None, "skip", "compat_not_newer"), ("570.211.01", None, "enable", "compat_newer_supported"),
            ("575.10.10", None, "enable", "compat_newer_supported"), ("575.57.08", None, "skip", "compat_not_newer"),
            ("575.99.99", None, "skip", "compat_not_newer"), (None, "12.8", *T.CUDA_ONLY),
            (None, "12.9", *T.CUDA_ONLY), (None, "12.10", *T.CUDA_ONLY)]  # a dGPU host: no CUDA-only rule
    _explain_rows(make_rootfs, fake_host, tmp_path, T.TESTDATA_575, rows, compat_dirs=["/compat/575.57.08"])


def test_explain_nvidia_layouts(make_rootfs, fake_host, tmp_path):
    stub = elf(None)
    cases = [
        ({"usr/local/cuda/compat/libcuda.so.333.88.99": stub}, "222.55.66", "enable", "/usr/local/cuda/compat"),
        ({"usr/local/cuda/compat/libcuda.so.222.88.99": stub}, "99.55.66", "enable", "/usr/local/cuda/compat"),
        ({"usr/local/cuda/compat/libcuda.so.222.88.99": stub}, "222.55.66", "skip", None),
        ({"etc/alternatives/cuda/compat/libcuda.so.333.88.99": stub, "usr/local/cuda": Symlink("/etc/alternatives/cuda")},
         "222.55.66", "enable", "/etc/alternatives/cuda/compat"),
        ({"compat/libcuda.so.333.88.99": stub, "usr/local/cuda": Symlink("../../../../../../")},
         "222.55.66", "enable", "/compat"),
    ]
    host = fake_host()
    for entries, driver, action, compat_dir in cases:
        r = explain(cfg(tmp_path, host), rootfs=str(make_rootfs(entries)), host_driver_version=driver)
        assert (r["decision"], r["compat_dir"]) == (action, compat_dir), r["details"]


def test_explain_reads_host_facts_from_the_host_root(make_rootfs, fake_host, tmp_path):
    host = fake_host(version_line="NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024",
                     gpus=["NVIDIA GeForce RTX 4090"])
    r = explain(cfg(tmp_path, host), rootfs=str(make_rootfs(ROOT_575)))
    assert (r["decision"], r["reason"]) == ("skip", "device_unsupported")
    assert r["host_driver_version"] == "550.54.15"
    assert r["host"]["driver_source"] == "/proc/driver/nvidia/version"
    text = render_text(r)
    assert "decision: SKIP  (device_unsupported)" in text
    assert "brand GEFORCE (from proc-model-name)" in text
    r = explain(cfg(tmp_path, host, device_check="warn"), rootfs=str(make_rootfs(ROOT_575)))
    assert r["decision"] == "enable" and r["warnings"]
    assert "warning: GPU brand outside" in render_text(r)


# -- the CLI --------------------------------------------------------------------------

def test_cli_json(make_rootfs, fake_host, tmp_path):
    rootfs, host = make_rootfs(ROOT_575), fake_host()
    out = cli("--rootfs", str(rootfs), "--host-root", str(host), "--host-driver-version", "550.54.15",
              "--config", write_config(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    r = json.loads(out.stdout)
    assert KEYS <= set(r)
    assert (r["decision"], r["reason"]) == ("enable", "compat_newer_supported")
    assert r["compat_dir"] == "/usr/local/cuda-12.9/compat"
    assert r["compat_version"] == "575.57.08"
    assert r["host_driver_version"] == "550.54.15"
    assert r["note"]["cuda_version"] == "12.9" and r["note"]["driver"] == [535, 550, 560, 565, 570, 575]
    assert r["effects"]["hook"] == [
        "write /etc/ld.so.conf.d/00-00-compat-hook.conf naming /usr/local/cuda-12.9/compat (the compat dir)",
        "refresh the container's ld cache (ldconfig -r)"]
    # the wrapper (ldconfig mode) adds the hook that writes it
    assert [e.split(" /")[0] for e in r["effects"]["wrapper"]] == ["added createContainer hook"]


def test_cli_text(make_rootfs, fake_host, tmp_path):
    out = cli("--rootfs", str(make_rootfs(ROOT_575)), "--host-root", str(fake_host()),
              "--host-driver-version", "580.65.06", "--config", write_config(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("decision: SKIP  (compat_not_newer)\n")
    assert "(explain changes nothing)" in out.stdout


def test_cli_text_of_an_ambiguous_compat_dir(make_rootfs, fake_host, tmp_path):
    """Several libcuda.so.<version> in one dir: the skip's file list is not the per-dir list of a
    multi-dir image (the two once shared a key, and text and the hook's log line failed on it)."""
    root = {f"usr/local/cuda/compat/libcuda.so.590.{i}.01": elf(NOTE_590) for i in range(3)}
    out = cli("--rootfs", str(make_rootfs(root)), "--host-root", str(fake_host()),
              "--host-driver-version", "535.54.03", "--config", write_config(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("decision: SKIP  (ambiguous_candidates)\n"), out.stdout
    assert "compat dirs (each decided alone" not in out.stdout


def _bundle(tmp_path, entries, env, make_rootfs, root_path="rootfs"):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    rootfs = make_rootfs(entries)
    os.rename(rootfs, bundle / "rootfs")
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": root_path},
        "process": {"args": ["/bin/sh"], "env": env}, "annotations": {}}))
    return bundle


STALE = "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib:/usr/local/nvidia/lib64"


@pytest.mark.parametrize("driver, decision, new", [
    ("550.54.15", "enable", None),  # ldconfig mode: the image's compat entry is right here
    ("580.65.06", "skip", "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"),
])
def test_cli_bundle_shows_the_stale_ld_library_path(make_rootfs, fake_host, tmp_path, driver, decision, new):
    bundle = _bundle(tmp_path, ROOT_575, ["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", STALE], make_rootfs)
    out = cli("--bundle", str(bundle), "--host-root", str(fake_host()), "--host-driver-version", driver,
              "--config", write_config(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["decision"] == decision
    env_edits = [e for e in r["effects"]["wrapper"] if e.startswith("LD_LIBRARY_PATH")]
    assert env_edits == ([new] if new else [])
    assert r["ld_library_path_compat"] == ["/usr/local/cuda/compat"]
    assert r["request"]["gpu_requested"] is True
    assert r["rootfs"] == str(bundle / "rootfs")


def test_cli_bundle_without_gpu_request(make_rootfs, fake_host, tmp_path):
    bundle = _bundle(tmp_path, ROOT_575, ["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=void"], make_rootfs)
    out = cli("--bundle", str(bundle), "--host-root", str(fake_host()), "--host-driver-version", "550.54.15",
              "--config", write_config(tmp_path), "--json")
    r = json.loads(out.stdout)
    assert (r["decision"], r["reason"]) == ("skip", "no_gpu_request")
    assert r["effects"] == {"hook": [], "wrapper": []}


def _one_line_error(out):
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("compat-hook: "), out.stderr
    return lines[0]


def test_cli_missing_rootfs(tmp_path, fake_host):
    line = _one_line_error(cli("--rootfs", str(tmp_path / "nope"), "--host-root", str(fake_host()),
                               "--config", write_config(tmp_path), "--json"))
    assert "nope" in line


def test_cli_rootfs_is_a_file(tmp_path, fake_host):
    f = tmp_path / "file"
    f.write_text("x")
    _one_line_error(cli("--rootfs", str(f), "--config", write_config(tmp_path)))


def test_cli_missing_bundle_config(tmp_path):
    (tmp_path / "b").mkdir()
    line = _one_line_error(cli("--bundle", str(tmp_path / "b"), "--config", write_config(tmp_path)))
    assert "config.json" in line


def test_cli_bundle_with_missing_root(tmp_path, make_rootfs):
    bundle = _bundle(tmp_path, {}, ["NVIDIA_VISIBLE_DEVICES=all"], make_rootfs, root_path="elsewhere")
    _one_line_error(cli("--bundle", str(bundle), "--config", write_config(tmp_path)))


@pytest.mark.parametrize("text, start", [
    ("mode: [unclosed\n", "{path}: not valid YAML at line"),
    ("modee: env\n", "modee: unknown key"),
    ("compat_dirs: [rel]\n", "compat_dirs[0]: must be an absolute path"),
    ("- a list\n", "(top level): must be a mapping"),
])
def test_cli_bad_config(tmp_path, make_rootfs, text, start):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    line = _one_line_error(cli("--rootfs", str(make_rootfs({})), "--config", str(p)))
    assert line.startswith("compat-hook: " + start.format(path=p)), line


def test_cli_bad_config_from_env(tmp_path, make_rootfs):
    _one_line_error(cli("--rootfs", str(make_rootfs({})), env={"COMPAT_HOOK_CONFIG": str(tmp_path / "nope.yaml")}))


def test_cli_usage_error():
    out = cli()
    assert out.returncode == 2 and "Traceback" not in out.stderr


# -- explain writes nothing ---------------------------------------------------------------

def test_explain_writes_nothing(make_rootfs, fake_host, tmp_path):
    entries = dict(ROOT_575)
    entries["etc/ld.so.conf.d/00-00-compat-hook.conf"] = "/usr/local/cuda-11.8/compat\n"  # a stale drop-in
    bundle = _bundle(tmp_path, entries, ["NVIDIA_VISIBLE_DEVICES=all", STALE], make_rootfs)
    host = fake_host(version_line="NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Tue 2025",
                     libcuda=["libcuda.so.580.65.06"])
    conf = write_config(tmp_path, host_root=host, extra="cache: true\n")
    # Everything of this test lives under tmp_path: bundle, rootfs, host tree, config.
    before = snapshot_tree(tmp_path)
    for args in (["--bundle", str(bundle), "--json"], ["--rootfs", str(bundle / "rootfs")],
                 ["--rootfs", str(bundle / "rootfs"), "--host-driver-version", "550.54.15"]):
        out = cli(*args, "--config", conf)
        assert out.returncode == 0, out.stderr
    r = json.loads(cli("--bundle", str(bundle), "--json", "--config", conf).stdout)
    # the image's LD_LIBRARY_PATH names the compat dir on a newer host: the hook hides it, and
    # removes the stale drop-in (no host libcuda in this rootfs to name); first the host's libcuda
    # (from the host's driver dir) goes over the compat file, for the roads that name it by path
    # the dir hidden, keeping only its compat libcuda file with the host's library over it
    hook = r["effects"]["hook"]
    binds = [e for e in hook if e.startswith("bind-mount ")]
    assert binds and all(" over /usr/local/cuda-12.9/compat/libcuda.so." in e for e in binds), hook
    assert hook[0].startswith("mask /usr/local/cuda-12.9/compat with a read-only tmpfs holding only libcuda.so."), hook
    assert hook[1:1 + len(binds)] == binds and hook[1 + len(binds)] == "remove /etc/ld.so.conf.d/00-00-compat-hook.conf"
    after = snapshot_tree(tmp_path)
    assert after == before
    assert not (tmp_path / "log").exists()
    assert not (tmp_path / "store").exists()
    assert not any(os.path.basename(p) == b"cache" for p in after)


def _two_gpu_host(base):
    from tests.conftest import build_tree

    info = ("Model: \t\t {m}\nIRQ: \t\t 154\nGPU UUID: \t {u}\nBus Type: \t PCIe\nBus Location: \t {b}\n"
            "Device Minor: \t {n}\nGPU Excluded:\t No\n")
    gpus = {"0000:17:00.0": ("NVIDIA H100 80GB HBM3", "GPU-5a1c0d3e-0000-4a4a-8b8b-000000000001", 0),
            "0000:65:00.0": ("NVIDIA GeForce RTX 4090", "GPU-9e8d7c6b-0000-4b4b-8c8c-000000000002", 1)}
    return build_tree(base, {f"proc/driver/nvidia/gpus/{b}/information": info.format(m=m, u=u, b=b, n=n)
                             for b, (m, u, n) in gpus.items()})


@pytest.mark.parametrize("env, reason, checked", [
    ("NVIDIA_VISIBLE_DEVICES=0", "compat_newer_supported",
     "GPUs checked: 0 0000:17:00.0 NVIDIA H100 80GB HBM3 (named by NVIDIA_VISIBLE_DEVICES: 0)"),
    ("NVIDIA_VISIBLE_DEVICES=all", "device_unsupported",
     "GPUs checked: 0 0000:17:00.0 NVIDIA H100 80GB HBM3, 1 0000:65:00.0 NVIDIA GeForce RTX 4090 "
     "(all GPUs: NVIDIA_VISIBLE_DEVICES names all)"),
])
def test_cli_bundle_shows_the_gpus_it_decided_on(make_rootfs, tmp_path, env, reason, checked):
    bundle = _bundle(tmp_path, ROOT_575, ["PATH=/usr/bin", env], make_rootfs)
    host = _two_gpu_host(tmp_path / "host")
    args = ("--bundle", str(bundle), "--host-root", str(host), "--host-driver-version", "550.54.15",
            "--config", write_config(tmp_path))
    out = cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["reason"] == reason
    assert r["gpus_checked"]["why"] == checked[checked.index("(") + 1:-1]
    assert [(g["index"], g["minor"], g["uuid"][:12]) for g in r["host"]["gpus"]] == [
        (0, 0, "GPU-5a1c0d3e"), (1, 1, "GPU-9e8d7c6b")]
    text = cli(*args).stdout
    assert f"  {checked}\n" in text, text
    assert ("  GPU 1 0000:65:00.0: NVIDIA GeForce RTX 4090  brand GEFORCE (from proc-model-name)  "
            "[minor 1, GPU-9e8d7c6b-0000-4b4b-8c8c-000000000002]") in text


def test_explain_shows_every_libcuda_the_image_carries(make_rootfs, fake_host, tmp_path):
    """A userland driver in the image's system lib dir is a fact, with what ldconfig links there; on a
    host newer than it, it is a target of the host's libcuda as the compat file is. A ``libcuda.so``
    link climbing out of the root is resolved inside it and leads to nothing."""
    sys_dir = "usr/lib/x86_64-linux-gnu"
    rootfs = make_rootfs({**ROOT_575, f"{sys_dir}/libcuda.so.575.57.08": elf(NOTE_575),
                          f"{sys_dir}/libcuda.so.1": Symlink("libcuda.so.575.57.08"),
                          "lib64/libcuda.so": Symlink("../../../../etc/libcuda.so.1.2")})
    r = explain(cfg(tmp_path, fake_host()), rootfs=str(rootfs), host_driver_version="580.65.06")
    user = f"/{sys_dir}/libcuda.so.575.57.08"
    assert r["effect"] == "host"
    assert [(u["path"], u["via"]) for u in r["image"]["userland"]] == [(user, f"/{sys_dir}/libcuda.so.1")]
    assert r["ldconfig_picks"] == {f"/{sys_dir}": "libcuda.so.580.65.06"}  # the host's is the higher here
    # this fake host has no libcuda file to mount: explain says the userland file stays, as it does a compat file
    assert f"{user} stays: the host driver's libcuda.so.580.65.06 is neither in the container nor in the host's " \
           "driver_lib_dirs" in r["notes"], r["notes"]
    text = render_text(r)
    assert f"userland libcuda: {user} (version 575.57.08, through /{sys_dir}/libcuda.so.1)" in text
    assert f"ldconfig links /{sys_dir}/libcuda.so.1 -> libcuda.so.580.65.06" in text


def test_explain_shows_a_userland_libcuda_no_link_leads_to(make_rootfs, fake_host, tmp_path):
    """A regular ``libcuda.so.<version>`` in the multiarch dir with no link to it is a fact (an absolute
    dlopen maps it, an ldconfig at the start links it); a dir, a link out of the root, a FIFO of that name, and
    an unlinked file in ``/usr/lib`` (not a dir the host's driver is mounted into) are none."""
    sys_dir = "usr/lib/x86_64-linux-gnu"
    rootfs = make_rootfs({**ROOT_575, f"{sys_dir}/libcuda.so.590.48.01": elf(NOTE_590),
                          f"{sys_dir}/libcuda.so.600.1.2/x": b"",
                          f"{sys_dir}/libcuda.so.560.1.1": Symlink("../../../../etc/libcuda.so.560.1.1"),
                          "usr/lib/libcuda.so.575.57.08": elf(NOTE_575)})
    os.mkfifo(rootfs / sys_dir / "libcuda.so.570.1.1")
    r = explain(cfg(tmp_path, fake_host()), rootfs=str(rootfs), host_driver_version="580.65.06")
    user = f"/{sys_dir}/libcuda.so.590.48.01"
    assert r["effect"] == "host"
    assert r["image"]["userland"] == [{"path": user, "name": "libcuda.so.590.48.01", "version": "590.48.01",
                                       "via": None}], r["image"]["userland"]
    # ldconfig at the start links the dir's highest version: the image's 590 over the host's 580
    assert r["ldconfig_picks"] == {f"/{sys_dir}": "libcuda.so.590.48.01"}
    assert r["toolkit"]["alone"]["maps"] == user, r["toolkit"]["alone"]
    text = render_text(r)
    assert (f"userland libcuda: {user} (version 590.48.01, no link leads to it: an absolute path or ldconfig's "
            "link)") in text, text
