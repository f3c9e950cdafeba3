"""The host compat store: ``compat-hook store add|list|remove`` and the store decision.

Packages are real: the Debian build of libcuda 550.163.01 (tests/support/debs.py)
laid out like NVIDIA's cuda-compat-12-4 package (``usr/local/cuda-12.4/compat``
with its symlinks and a ptxjit stub), as an unpacked directory and as a
``.deb`` built here with ``dpkg-deb --build``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess

import pytest

from compat_hook.facts import elfgen
from compat_hook.commands import store
from compat_hook.policy import storefacts
from compat_hook.core.config import from_mapping
from compat_hook.facts.container import Request
from compat_hook.facts.hostfacts import HostFacts
from tests.support import debs
from tests.support.versions import COMPAT_550

PY = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parents[1]
V550 = COMPAT_550
COMPAT_REL = "usr/local/cuda-12.4/compat"


@pytest.fixture(scope="module")
def lib550() -> pathlib.Path:
    return debs.libcuda(V550)


def make_package(top: pathlib.Path, lib: pathlib.Path | bytes, version: str = V550,
                 rel: str = COMPAT_REL) -> pathlib.Path:
    """A cuda-compat-like tree under ``top`` (``top/usr/local/cuda-12.4/compat/...``)."""
    d = top / rel
    d.mkdir(parents=True, exist_ok=True)
    name = f"libcuda.so.{version}"
    if isinstance(lib, bytes):
        (d / name).write_bytes(lib)
    else:
        shutil.copyfile(lib, d / name)
    os.symlink(name, d / "libcuda.so.1")
    os.symlink("libcuda.so.1", d / "libcuda.so")
    ptx = f"libnvidia-ptxjitcompiler.so.{version}"
    (d / ptx).write_bytes(elfgen.make_elf(soname="libnvidia-ptxjitcompiler.so.1"))
    os.symlink(ptx, d / "libnvidia-ptxjitcompiler.so.1")
    os.symlink("/etc/passwd", d / "evil-absolute-link")  # never copied: not a sibling
    return top


def build_deb(pkg: pathlib.Path, out: pathlib.Path, version: str = V550) -> pathlib.Path:
    (pkg / "DEBIAN").mkdir(exist_ok=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: cuda-compat-12-4\n"
        f"Version: {version}-1\n"
        "Architecture: amd64\n"
        "Maintainer: compat-hook tests <tests@example.invalid>\n"
        "Description: CUDA forward compatibility (test package)\n")
    p = subprocess.run(["dpkg-deb", "-Znone", "--root-owner-group", "--build", str(pkg), str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "compat_hook", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


@pytest.fixture
def cfg(tmp_path) -> pathlib.Path:
    p = tmp_path / "config.yaml"
    p.write_text("log_file: null\nnvml: \"off\"\n")
    return p


def store_cli(cfg, sd, *args):
    return cli("store", *args, "--config", cfg, "--store-dir", sd)


def assert_one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode in (1, 2), (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compat-hook: "), p.stderr
    for n in needles:
        assert n in lines[0], p.stderr


def check_stored(sd: pathlib.Path, lib: pathlib.Path) -> None:
    d = sd / V550
    assert (d / f"libcuda.so.{V550}").read_bytes() == lib.read_bytes()
    assert stat.S_IMODE(os.lstat(d / f"libcuda.so.{V550}").st_mode) == 0o644
    assert os.readlink(d / "libcuda.so.1") == f"libcuda.so.{V550}"
    assert os.readlink(d / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(d / "libnvidia-ptxjitcompiler.so.1") == f"libnvidia-ptxjitcompiler.so.{V550}"
    assert (d / f"libnvidia-ptxjitcompiler.so.{V550}").is_file()
    assert not os.path.lexists(d / "evil-absolute-link")
    assert sorted(os.listdir(sd)) == [V550, f"{V550}.json"]  # no work dirs left behind
    meta = json.loads((sd / f"{V550}.json").read_text())
    assert meta["version"] == V550 and meta["elf"]["machine"] == "EM_X86_64"
    assert meta["provides_cuda"] == "12.4"
    assert "evil-absolute-link -> /etc/passwd" in meta["skipped"]


def test_add_unpacked_dir_list_remove(tmp_path, lib550, cfg):
    pkg = make_package(tmp_path / "pkg", lib550)
    sd = tmp_path / "store"
    p = store_cli(cfg, sd, "add", pkg)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"stored compat driver {V550} at {sd / V550}"
    check_stored(sd, lib550)

    p = store_cli(cfg, sd, "list")
    assert p.returncode == 0 and p.stdout.startswith(V550) and str(sd / V550) in p.stdout, p
    p = store_cli(cfg, sd, "list", "--json")
    entries = json.loads(p.stdout)
    assert [e["version"] for e in entries] == [V550] and entries[0]["source"] == str(pkg)

    # The same driver twice is refused; the stored copy stays.
    assert_one_line_error(store_cli(cfg, sd, "add", pkg), "already stored")
    check_stored(sd, lib550)

    p = store_cli(cfg, sd, "remove", V550)
    assert p.returncode == 0 and p.stdout.strip() == f"removed {V550}", p
    assert os.listdir(sd) == []
    p = store_cli(cfg, sd, "list")
    assert p.stdout.strip() == "(the store is empty)"
    assert_one_line_error(store_cli(cfg, sd, "remove", V550), "not in the store")
    assert_one_line_error(store_cli(cfg, sd, "remove", "../etc"), "not a stored version")


def test_add_deb(tmp_path, lib550, cfg):
    pkg = make_package(tmp_path / "pkg", lib550)
    deb = build_deb(pkg, tmp_path / "cuda-compat-12-4_550.163.01-1_amd64.deb")
    sd = tmp_path / "store"
    p = store_cli(cfg, sd, "add", deb, "--json")
    assert p.returncode == 0, p.stderr
    entry = json.loads(p.stdout)
    assert entry["version"] == V550 and entry["source"] == str(deb)
    assert entry["files"] == sorted(entry["files"]) and f"libcuda.so.1 -> libcuda.so.{V550}" in entry["files"]
    check_stored(sd, lib550)


def test_the_store_decision_uses_stored_packages(tmp_path, lib550):
    sd = tmp_path / "store"
    store.add(str(sd), str(make_package(tmp_path / "pkg", lib550)), None)
    cfg = from_mapping({"store_dir": str(sd), "nvml": "off", "log_file": None})
    [pkg] = storefacts.packages(str(sd))
    assert pkg.compat_dir == str(sd / V550) and pkg.compat_version == (550, 163, 1)

    def req(*env):
        return Request.from_spec({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", *env]}})

    h535 = HostFacts(driver_version=(535, 261, 3), arch="x86_64")
    h555 = HostFacts(driver_version=(555, 58, 2), arch="x86_64")
    d = storefacts.decide_for(h535, req("CUDA_VERSION=12.4.1"), cfg)
    assert (d.action, d.reason, d.compat_dir, d.compat_version) == ("enable", "store_package", str(sd / V550), V550)
    assert storefacts.decide_for(h555, req("CUDA_VERSION=12.4.1"), cfg).reason == "store_not_needed"
    assert storefacts.decide_for(h535, req("CUDA_VERSION=12.8"), cfg).reason == "no_store_package"
    assert storefacts.decide_for(h535, req("NVIDIA_REQUIRE_CUDA=cuda>=12.3 brand=tesla"), cfg).enable
    assert storefacts.decide_for(h535, req(), cfg).reason == "no_candidate"
    assert storefacts.decide_for(h535, req("CUDA_VERSION=12.4", "COMPAT_HOOK_DISABLE=1"), cfg).reason == "opt_out"


def test_validation_failures_are_one_line(tmp_path, cfg):
    sd = tmp_path / "store"
    good = elfgen.make_elf(machine="x86_64")

    arm = make_package(tmp_path / "arm", elfgen.make_elf(machine="aarch64"), version="550.54.15")
    assert_one_line_error(store_cli(cfg, sd, "add", arm), "libcuda.so.550.54.15",
                          "not a loadable libcuda", "another machine")

    two = make_package(tmp_path / "two", good, version="550.54.15")
    (two / COMPAT_REL / "libcuda.so.570.86.10").write_bytes(good)
    assert_one_line_error(store_cli(cfg, sd, "add", two), "several compat drivers",
                          "libcuda.so.550.54.15", "libcuda.so.570.86.10")

    two_dirs = make_package(tmp_path / "twodirs", good, version="550.54.15")
    make_package(two_dirs, good, version="570.86.10", rel="usr/local/cuda-12.8/compat")
    assert_one_line_error(store_cli(cfg, sd, "add", two_dirs), "several compat drivers")

    none = tmp_path / "none" / COMPAT_REL
    none.mkdir(parents=True)
    os.symlink("libcuda.so.550.54.15", none / "libcuda.so.1")  # a link alone is no driver
    assert_one_line_error(store_cli(cfg, sd, "add", tmp_path / "none"), "no regular libcuda.so.<version>")

    not_elf = make_package(tmp_path / "notelf", b"not an ELF file at all", version="550.54.15")
    assert_one_line_error(store_cli(cfg, sd, "add", not_elf), "not a loadable libcuda", "not an ELF")

    tegra = make_package(tmp_path / "tegra", good, version="1.1")
    assert_one_line_error(store_cli(cfg, sd, "add", tegra), "Tegra")

    text = tmp_path / "pkg.tar"
    text.write_text("x")
    assert_one_line_error(store_cli(cfg, sd, "add", text), "not a directory or a .deb")
    bad_deb = tmp_path / "broken.deb"
    bad_deb.write_bytes(b"!<arch>\nnot really")
    assert_one_line_error(store_cli(cfg, sd, "add", bad_deb), "dpkg-deb failed")
    assert_one_line_error(store_cli(cfg, sd, "add", tmp_path / "missing"), "no such file")
    # Nothing was stored, and no work dir was left behind.
    assert os.listdir(sd) == []


def test_list_skips_broken_entries(tmp_path, lib550):
    sd = tmp_path / "store"
    store.add(str(sd), str(make_package(tmp_path / "pkg", lib550)), None)
    (sd / "560.1.2.json").write_text("{not json")
    (sd / "570.1.2").mkdir()  # a dir without metadata
    (sd / "580.1.2.json").write_text(json.dumps({"version": "580.1.2"}))  # metadata without a dir
    assert [e["version"] for e in store.list_entries(str(sd))] == [V550]
    assert store.list_entries(str(tmp_path / "nowhere")) == []


def test_store_usage_errors(tmp_path, cfg):
    p = cli("store", "--config", cfg)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = cli("store", "add")
    assert p.returncode == 2 and "Traceback" not in p.stderr
