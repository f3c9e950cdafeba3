"""compat_hook.facts.imagefacts: the candidate rules, the resolved compat dir, the ELF cache."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compat_hook.facts import hostfacts, imagefacts
from compat_hook.policy.decision import decide
from compat_hook.facts.rootfs import Root
from tests.conftest import Dir, Symlink, build_tree, config_for, elf
from tests.support.trees import write_fake_host
from tests.elfgen import NOTE_575, NOTE_590, NOTE_ORIN

C = "usr/local/cuda-12.4/compat"


def gather(path, config=None, **kw):
    config = config or config_for()
    with Root(str(path)) as r:
        return imagefacts.gather(r, config, **kw)


def test_single_regular_file(make_rootfs):
    p = make_rootfs({f"{C}/libcuda.so.550.54.15": elf(None), f"{C}/libcuda.so.1": Symlink("libcuda.so.550.54.15"),
                     f"{C}/libcuda.so": Symlink("libcuda.so.1"), "usr/local/cuda": Symlink("cuda-12.4")})
    img = gather(p)
    assert img.status == "found"
    assert img.candidate == "libcuda.so.550.54.15" and img.candidates == ["libcuda.so.550.54.15"]
    assert img.compat_version == (550, 54, 15) and img.compat_version_text == "550.54.15"
    assert img.compat_dir == "/usr/local/cuda-12.4/compat"  # resolved, as the drop-in must say
    assert img.configured_dir == "/usr/local/cuda/compat"
    assert img.elf is not None and img.elf.error is None and img.elf_source == "parsed"
    assert not img.tegra_lib
    d = img.to_dict()
    assert d["compat_version"] == "550.54.15" and d["elf"]["soname"] == "libcuda.so.1"
    assert d["dirs_checked"][0] == {"dir": "/usr/local/cuda/compat", "resolved": "/usr/local/cuda-12.4/compat",
                                    "status": "1 candidate(s)"}


def test_dirs_and_dangling_links_are_not_candidates(make_rootfs):
    p = make_rootfs({"usr/local/cuda/compat/libcuda.so.550.54.15": Symlink("/nowhere/libcuda.so.550.54.15"),
                     "usr/local/cuda/compat/libcuda.so.555.42.06": Symlink("/usr/local"),
                     "usr/local/cuda/compat/libcuda.so.560.35.03": Dir(),
                     "usr/local/cuda/compat/libcuda.so.1": elf(None)})  # no version: not a candidate
    img = gather(p)
    assert img.status == "none" and img.candidates == [] and img.link_targets == {}
    others = {o["name"]: o["kind"] for o in img.other_libs}
    assert others == {"libcuda.so.550.54.15": "symlink", "libcuda.so.555.42.06": "symlink", "libcuda.so.1": "file"}


def test_a_symlinked_candidate_is_its_regular_target_in_the_root(make_rootfs):
    """The compat dir's ``libcuda.so.<version>`` links into another dir: the loader follows the link, so its
    target (resolved inside the root, a regular file) is the candidate; an absolute link stays in the root."""
    p = make_rootfs({"opt/nv/libcuda.so.550.54.15": elf("550.54.15"),
                     "usr/local/cuda/compat/libcuda.so.550.54.15": Symlink("/opt/nv/libcuda.so.550.54.15"),
                     "usr/local/cuda/compat/libcuda.so.1": Symlink("/opt/nv/libcuda.so.550.54.15")})
    img = gather(p)
    assert img.status == "found" and img.candidate == "libcuda.so.550.54.15", img.to_dict()
    assert img.link_targets == {"libcuda.so.550.54.15": "/opt/nv/libcuda.so.550.54.15"}
    assert img.file_of(img.candidate) == "/opt/nv/libcuda.so.550.54.15"
    assert img.elf is not None and img.elf.error is None and img.dirs_checked[0]["status"] == "1 candidate(s) (symlinked)"


def test_none(make_rootfs):
    img = gather(make_rootfs({"usr/local": Dir()}))
    assert img.status == "none" and img.compat_dir is None
    assert [d["status"] for d in img.dirs_checked] == ["missing", "missing"]


def test_compat_dir_is_a_file(make_rootfs):
    img = gather(make_rootfs({"usr/local/cuda/compat": "not a dir"}))
    assert img.dirs_checked[0]["status"] == "not a directory"


def test_ambiguous(make_rootfs):
    p = make_rootfs({f"{C}/libcuda.so.575.57.08": elf(NOTE_575), f"{C}/libcuda.so.550.54.15": elf(None),
                     "usr/local/cuda": Symlink("cuda-12.4")})
    img = gather(p)
    assert img.status == "ambiguous"
    assert img.candidates == ["libcuda.so.550.54.15", "libcuda.so.575.57.08"]
    assert img.candidate is None and img.elf is None
    d = decide(hostfacts.HostFacts(driver_version=(535, 1, 1)), img, None, config_for())
    assert d.reason == "ambiguous_candidates" and d.details["candidates"] == img.candidates


def test_compat_orin(make_rootfs):
    p = make_rootfs({"usr/local/cuda-13.2/compat_orin/libcuda.so.1.1": elf(NOTE_ORIN, soname=None),
                     "usr/local/cuda": Symlink("cuda-13.2")})
    img = gather(p)
    assert img.status == "found" and img.tegra_lib
    assert img.compat_version is None and img.compat_version_text == "1.1"
    assert img.compat_dir == "/usr/local/cuda-13.2/compat_orin"
    assert img.configured_dir == "/usr/local/cuda/compat_orin"
    assert img.elf.note.cuda_version == "13.2"


def test_first_configured_dir_with_a_candidate_is_the_primary(make_rootfs):
    p = make_rootfs({"usr/local/cuda/compat/libnvidia-nvvm.so.4": Symlink("x"),
                     "usr/local/cuda/compat_orin/libcuda.so.1.1": elf(NOTE_ORIN)})
    img = gather(p)
    assert img.configured_dir == "/usr/local/cuda/compat_orin" and img.others == []
    assert [o["name"] for o in img.other_libs] == []
    cfg = config_for(compat_dirs=["/opt/compat", "/usr/local/cuda/compat_orin", "/usr/local/cuda/compat"])
    img = gather(p, cfg)
    # every configured dir is looked at: a later one may hold the candidate the host needs
    assert [d["status"] for d in img.dirs_checked] == ["missing", "1 candidate(s)", "0 candidate(s)"]


def test_sbsa_and_orin_compat_are_both_candidates(make_rootfs):
    """An image for both Jetson Orin and SBSA hosts carries compat/ and compat_orin/: both are
    found (the primary where the toolkit looks, the other in ``others``), so the decision can pick."""
    p = make_rootfs({"usr/local/cuda-13.2/compat/libcuda.so.595.45.04": elf(NOTE_590),
                     "usr/local/cuda-13.2/compat_orin/libcuda.so.1.1": elf(NOTE_ORIN),
                     "usr/local/cuda": Symlink("cuda-13.2")})
    img = gather(p)
    assert [(c.compat_dir, c.flavour, c.origin) for c in img.all()] == [
        ("/usr/local/cuda-13.2/compat", "dgpu", "configured"), ("/usr/local/cuda-13.2/compat_orin", "orin", "configured")]
    assert img.others[0].elf.note.cuda_version == "13.2"
    assert img.to_dict()["others"][0]["compat_dir"] == "/usr/local/cuda-13.2/compat_orin"


def test_other_libs_listed(make_rootfs):
    v = "550.54.15"
    p = make_rootfs({f"{C}/libcuda.so.{v}": elf(None), f"{C}/libcuda.so.1": Symlink(f"libcuda.so.{v}"),
                     f"{C}/libnvidia-nvvm.so.{v}": b"x", f"{C}/libnvidia-nvvm.so.4": Symlink(f"libnvidia-nvvm.so.{v}"),
                     f"{C}/libnvidia-ptxjitcompiler.so.{v}": b"x", f"{C}/libcudadebugger.so.1": Symlink("x"),
                     f"{C}/README": "not a lib", f"{C}/libnvidia-pkcs11-openssl3.so.{v}": b"x",
                     "usr/local/cuda": Symlink("cuda-12.4")})
    img = gather(p)
    names = [(o["name"], o["kind"], o["version"]) for o in img.other_libs]
    assert names == [
        ("libcuda.so.1", "symlink", "1"),
        ("libcudadebugger.so.1", "symlink", "1"),
        ("libnvidia-nvvm.so.4", "symlink", "4"),
        (f"libnvidia-nvvm.so.{v}", "file", v),
        (f"libnvidia-pkcs11-openssl3.so.{v}", "file", v),
        (f"libnvidia-ptxjitcompiler.so.{v}", "file", v),
    ]


def test_inspect_false_leaves_elf_unread(make_rootfs):
    img = gather(make_rootfs({"usr/local/cuda/compat/libcuda.so.550.54.15": elf(None)}), inspect=False)
    assert img.status == "found" and img.elf is None
    assert decide(hostfacts.HostFacts(driver_version=(535, 1, 1)), img, None, config_for()).reason == \
        "candidate_unreadable"


@pytest.mark.parametrize("name", ["libcuda.so.550.54.15.1", "libcuda.so.abc.def", "libcuda.so.550.54.15 "])
def test_candidate_without_a_version(make_rootfs, name):
    img = gather(make_rootfs({f"usr/local/cuda/compat/{name}": elf(None)}))
    assert img.status == "found" and img.compat_version is None
    d = decide(hostfacts.HostFacts(driver_version=(535, 1, 1), arch=os.uname().machine), img, None, config_for())
    assert d.reason == "compat_version_invalid"


@pytest.mark.parametrize("name", ["libcuda.so.1", "libcuda.so.", "libcuda.so..1", "libcuda.so.1.", "libcuda.so"])
def test_not_candidate_names(make_rootfs, name):
    img = gather(make_rootfs({f"usr/local/cuda/compat/{name}": elf(None)}))
    assert img.status == "none"


# -- the ELF cache ------------------------------------------------------------------------

LIB = "usr/local/cuda/compat/libcuda.so.575.57.08"


def _decide(img, driver=(550, 54, 15)):
    h = hostfacts.HostFacts(driver_version=driver, arch=os.uname().machine)
    return decide(h, img, None, config_for()).to_dict()


def _entries(state):
    return sorted(glob.glob(os.path.join(state, "cache", "elf-*.json")))


def test_cache_hit_returns_identical_facts(make_rootfs, tmp_path):
    state = str(tmp_path / "state")
    p = make_rootfs({LIB: elf(NOTE_575)})
    a = gather(p, state_dir=state)
    assert a.elf_source == "parsed" and len(_entries(state)) == 1
    b = gather(p, state_dir=state)
    assert b.elf_source == "cache"
    assert b.elf == a.elf and b.elf.note == a.elf.note
    da, db = a.to_dict(), b.to_dict()
    da.pop("elf_source"), db.pop("elf_source")
    assert da == db
    assert _decide(a) == _decide(b)
    assert stat_mode(os.path.join(state, "cache")) == 0o700


def stat_mode(p):
    return os.stat(p).st_mode & 0o777


def test_cache_disabled(make_rootfs, tmp_path):
    state = str(tmp_path / "state")
    p = make_rootfs({LIB: elf(NOTE_575)})
    gather(p, config_for(cache=False), state_dir=state)
    assert not os.path.exists(os.path.join(state, "cache"))
    assert gather(p, config_for(cache=False), state_dir=state).elf_source == "parsed"


def _tamper(path, fn):
    with open(path) as f:
        obj = json.load(f)
    fn(obj)
    with open(path, "w") as f:
        json.dump(obj, f)


TAMPERS = {
    "class_string": lambda o: o["info"].__setitem__("elf_class", "64"),
    "class_bool": lambda o: o["info"].__setitem__("elf_class", True),
    "machine_int": lambda o: o["info"].__setitem__("machine", 62),
    "note_driver_strings": lambda o: o["info"]["note"].__setitem__("driver", ["560"]),
    "note_driver_mismatch_raw": lambda o: o["info"]["note"].__setitem__("driver", [535, 545, 550, 560, 565, 570, 575]),
    "note_not_dict": lambda o: o["info"].__setitem__("note", "yes"),
    "extra_key": lambda o: o["info"].__setitem__("trusted", True),
    "missing_key": lambda o: o["info"].pop("soname"),
    "note_and_error": lambda o: o["info"].__setitem__("error", "x"),
    "info_list": lambda o: o.__setitem__("info", []),
    "key_changed": lambda o: o.__setitem__("key", [0, 0, 0, 0, 0]),
    "tool_version": lambda o: o.__setitem__("tool", "0.0.0-other"),
    "format": lambda o: o.__setitem__("format", 99),
}


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tampered_entry_is_ignored(make_rootfs, tmp_path, name):
    state = str(tmp_path / "state")
    p = make_rootfs({LIB: elf(NOTE_575)})
    first = gather(p, state_dir=state)
    (entry,) = _entries(state)
    _tamper(entry, TAMPERS[name])
    # Host 560 is listed in the real note: a note tampered to "560"-only
    # strings or a different list must not change the answer.
    again = gather(p, state_dir=state)
    assert again.elf_source == "parsed"
    assert again.elf == first.elf
    for drv in ((560, 35, 3), (545, 23, 8), (550, 54, 15)):
        assert _decide(again, drv) == _decide(first, drv)


@pytest.mark.parametrize("garbage", [b"", b"{", b"\x00\xff", b"[1,2]", b'{"format":1}', b"NaN"])
def test_corrupt_entry_is_a_miss(make_rootfs, tmp_path, garbage):
    state = str(tmp_path / "state")
    p = make_rootfs({LIB: elf(NOTE_575)})
    first = gather(p, state_dir=state)
    (entry,) = _entries(state)
    with open(entry, "wb") as f:
        f.write(garbage)
    again = gather(p, state_dir=state)
    assert again.elf_source == "parsed" and again.elf == first.elf
    # ... and a fresh entry replaces the corrupt one
    assert gather(p, state_dir=state).elf_source == "cache"


def test_entry_as_symlink_is_not_followed(make_rootfs, tmp_path):
    state = str(tmp_path / "state")
    p = make_rootfs({LIB: elf(NOTE_575)})
    gather(p, state_dir=state)
    (entry,) = _entries(state)
    fake = tmp_path / "fake.json"
    shutil.copy(entry, fake)
    os.unlink(entry)
    os.symlink(fake, entry)
    assert gather(p, state_dir=state).elf_source == "parsed"


def test_modified_library_gets_a_new_key(make_rootfs, tmp_path):
    """Rewrite the library in place, same size, mtime set back: the ctime moves, so it is re-parsed."""
    state = str(tmp_path / "state")
    old, new = elf(NOTE_575), elf(NOTE_575.replace("560,", "545,"))
    assert len(old) == len(new) and old != new
    p = make_rootfs({LIB: old})
    lib = os.path.join(p, LIB)
    st0 = os.stat(lib)
    first = gather(p, state_dir=state)
    assert gather(p, state_dir=state).elf_source == "cache"
    assert _decide(first, (560, 35, 3))["decision"] == "enable"
    time.sleep(0.02)  # past the kernel's coarse timestamp granularity (one jiffy)
    with open(lib, "r+b") as f:  # same inode, same size
        f.write(new)
    os.utime(lib, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    st1 = os.stat(lib)
    assert (st1.st_ino, st1.st_size, st1.st_mtime_ns) == (st0.st_ino, st0.st_size, st0.st_mtime_ns)
    assert st1.st_ctime_ns != st0.st_ctime_ns
    again = gather(p, state_dir=state)
    assert again.elf_source == "parsed"
    assert 560 not in again.elf.note.driver and 545 in again.elf.note.driver
    d = _decide(again, (560, 35, 3))
    assert (d["decision"], d["reason"]) == ("skip", "host_branch_unsupported")
    assert _decide(again, (545, 23, 8))["decision"] == "enable"


def test_unwritable_state_dir_is_only_a_miss(make_rootfs, tmp_path):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    p = make_rootfs({LIB: elf(NOTE_575)})
    img = gather(p, state_dir=str(blocker))
    assert img.elf_source == "parsed" and img.elf.note is not None


# -- "a cache can never change a decision" --------------------------------------------

_versions = st.tuples(st.integers(100, 700), st.integers(0, 200), st.integers(0, 99))
_notes = st.sampled_from([None, NOTE_575, NOTE_590, '{"format":1,"CUDA version":"12.4","driver":[470,535]}'])

_shared = {}


def _shared_dirs():
    if not _shared:
        _shared["base"] = tempfile.mkdtemp(prefix="compat-hook-cache-prop-")
        _shared["state"] = os.path.join(_shared["base"], "state")
        _shared["n"] = 0
    return _shared


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(host_v=_versions, compat_v=_versions, note=_notes, cuda=st.sampled_from([None, "12.8", "13.0"]))
def test_cache_never_changes_a_decision(host_v, compat_v, note, cuda):
    # One state dir shared by every example (as on a real host), fresh
    # rootfs trees each time: an entry of an earlier file must never be
    # taken for a later one, even with a recycled inode number.
    s = _shared_dirs()
    s["n"] += 1
    work = os.path.join(s["base"], f"ex{s['n']}")
    compat = ".".join(f"{n:02d}" for n in compat_v)
    rootfs = build_tree(os.path.join(work, "rootfs"), {f"usr/local/cuda/compat/libcuda.so.{compat}": elf(note)})
    host_root = write_fake_host(os.path.join(work, "host"))
    try:
        cfg = config_for(host_root)
        facts = hostfacts.HostFacts(driver_version=host_v if cuda is None else None,
                                    cuda_version=tuple(int(x) for x in cuda.split(".")) + (0,) if cuda else None,
                                    arch=os.uname().machine)
        cold = gather(rootfs, cfg, state_dir=None)
        first = gather(rootfs, cfg, state_dir=s["state"])
        warm = gather(rootfs, cfg, state_dir=s["state"])
        assert warm.elf_source == "cache"
        want = decide(facts, cold, None, cfg).to_dict()
        assert decide(facts, first, None, cfg).to_dict() == want
        assert decide(facts, warm, None, cfg).to_dict() == want
    finally:
        shutil.rmtree(work)


def teardown_module(module):
    if _shared:
        shutil.rmtree(_shared["base"], ignore_errors=True)


def test_cache_hits_across_overlay_mounts(tmp_path):
    """containerd and Podman mount each container's rootfs as a new overlay
    (a new st_dev every time): the same image layer must still be a hit."""
    import subprocess

    from compat_hook.facts.elfgen import NOTE_575, make_elf
    from compat_hook.facts.rootfs import Root

    lower = tmp_path / "lower"
    (lower / "usr/local/cuda/compat").mkdir(parents=True)
    (lower / "usr/local/cuda/compat/libcuda.so.575.57.08").write_bytes(make_elf(note_json=NOTE_575))
    from compat_hook.core.config import from_mapping

    cfg = from_mapping({})
    state = str(tmp_path / "state")
    seen = []
    mounts = []
    try:
        for i in range(2):  # both mounted at once, like two running containers
            up, wk, mnt = (tmp_path / f"{n}{i}" for n in ("up", "wk", "mnt"))
            for d in (up, wk, mnt):
                d.mkdir()
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={lower},upperdir={up},workdir={wk}", str(mnt)], check=True)
            mounts.append(mnt)
        for mnt in mounts:
            with Root(str(mnt)) as r:
                f = imagefacts.gather(r, cfg, state_dir=state)
            st = os.stat(mnt / "usr/local/cuda/compat/libcuda.so.575.57.08")
            seen.append((f.elf_source, (st.st_dev, os.stat(mnt).st_dev), f.elf.note.cuda_version))
    finally:
        for mnt in mounts:
            subprocess.run(["umount", str(mnt)], check=True)
    assert [s[0] for s in seen] == ["parsed", "cache"]
    assert seen[0][1][1] != seen[1][1][1]  # two overlay superblocks
    assert seen[1][2] == "12.9"
