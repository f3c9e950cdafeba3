"""compat_hook.core.cache: entries are whole, validated, keyed on identity, never raise."""

from __future__ import annotations

import json
import os
import stat

import pytest

from compat_hook import __version__
from compat_hook.core import cache


DATA = bytes(range(256)) * 16  # 4 KiB


def st_of(tmp_path, name="lib", data=DATA):
    p = tmp_path / name
    p.write_bytes(data)
    return os.stat(p), p


def recorded(path, spans=((0, 64), (1024, 128), (4000, 200))):
    """Read like the ELF reader does (seek + read) through a Recorder."""
    with open(path, "rb") as f:
        rec = cache.Recorder(f)
        for off, n in spans:
            rec.seek(off)
            rec.read(n)
    return rec


def get(state, path):
    with open(path, "rb") as f:
        return cache.get_elf(state, os.fstat(f.fileno()), f.fileno())


INFO = {"elf_class": 64, "machine": "EM_X86_64"}


def test_elf_roundtrip(tmp_path):
    state = str(tmp_path / "state")
    s, p = st_of(tmp_path)
    assert get(state, p) is None
    assert cache.put_elf(state, s, INFO, recorded(p))
    assert get(state, p) == INFO
    d = os.path.join(state, "cache")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    (name,) = os.listdir(d)
    assert stat.S_IMODE(os.stat(os.path.join(d, name)).st_mode) == 0o600
    obj = json.load(open(os.path.join(d, name)))
    assert obj["tool"] == __version__ and obj["format"] == 1 and obj["key"] == cache.file_key(s)
    # the read at 4000 hit EOF after 96 bytes: the span records what was read
    assert obj["spans"] == [[0, 64], [1024, 128], [4000, 96]]


def test_key_fields(tmp_path):
    s, _ = st_of(tmp_path)
    # no st_dev: an overlay rootfs has a new device number at every mount
    assert cache.file_key(s) == [s.st_ino, s.st_size, s.st_mtime_ns]


def test_recorder_is_transparent(tmp_path):
    _, p = st_of(tmp_path)
    with open(p, "rb") as f:
        rec = cache.Recorder(f)
        assert rec.fileno() == f.fileno()
        got = [(rec.seek(off), rec.read(n)) for off, n in ((0, 64), (1024, 128), (4000, 200))]
        assert rec.seek(0, os.SEEK_END) == len(DATA)
    assert got == [(0, DATA[:64]), (1024, DATA[1024:1152]), (4000, DATA[4000:])]
    assert rec.total == 64 + 128 + 96 and rec.spans == [[0, 64], [1024, 128], [4000, 96]]


def test_other_file_with_the_same_key_is_a_miss(tmp_path):
    """An image that forges another library's metadata still gets a miss."""
    state = str(tmp_path / "state")
    a, pa = st_of(tmp_path, "a")
    b, pb = st_of(tmp_path, "b", DATA[:1024] + b"X" + DATA[1025:])
    cache.put_elf(state, a, {"v": "a"}, recorded(pa))
    d = os.path.join(state, "cache")
    (name,) = os.listdir(d)
    obj = json.load(open(os.path.join(d, name)))
    obj["key"] = cache.file_key(b)
    json.dump(obj, open(os.path.join(d, cache._elf_name(cache.file_key(b))), "w"))
    assert get(state, pb) is None


def test_changed_bytes_in_a_read_range_are_a_miss(tmp_path):
    state = str(tmp_path / "state")
    s0, p = st_of(tmp_path)
    cache.put_elf(state, s0, INFO, recorded(p))
    with open(p, "r+b") as f:  # same size; then put the mtime back
        f.seek(1100)
        f.write(b"Z")
    os.utime(p, ns=(s0.st_atime_ns, s0.st_mtime_ns))
    assert cache.file_key(os.stat(p)) == cache.file_key(s0)
    assert get(state, p) is None


def test_bytes_outside_the_read_ranges_do_not_matter(tmp_path):
    """The reader never looked there, so its answer cannot depend on them."""
    state = str(tmp_path / "state")
    s0, p = st_of(tmp_path)
    cache.put_elf(state, s0, INFO, recorded(p))
    with open(p, "r+b") as f:
        f.seek(2000)
        f.write(b"Z")
    os.utime(p, ns=(s0.st_atime_ns, s0.st_mtime_ns))
    os.chmod(p, 0o600)  # metadata changes alone never invalidate
    assert get(state, p) == INFO


@pytest.mark.parametrize("mutate", [
    lambda o: o.__setitem__("tool", "9.9.9"),
    lambda o: o.__setitem__("format", 2),
    lambda o: o.__setitem__("info", [1]),
    lambda o: o.pop("info"),
    lambda o: o.__setitem__("key", None),
    lambda o: o.__setitem__("digest", "0" * 40),
    lambda o: o.pop("digest"),
    lambda o: o.__setitem__("spans", None),
    lambda o: o.__setitem__("spans", [[0, -1]]),
    lambda o: o.__setitem__("spans", [[True, 64]]),
    lambda o: o.__setitem__("spans", [[0, 64, 1]]),
    lambda o: o.__setitem__("spans", [[0, 1 << 30]]),
    lambda o: o.__setitem__("spans", [[0, 1]] * 1000),
    lambda o: o.__setitem__("spans", o["spans"][:-1]),
])
def test_invalid_entry_is_a_miss(tmp_path, mutate):
    state = str(tmp_path / "state")
    s, p = st_of(tmp_path)
    cache.put_elf(state, s, INFO, recorded(p))
    path = os.path.join(state, "cache", cache._elf_name(cache.file_key(s)))
    obj = json.load(open(path))
    mutate(obj)
    json.dump(obj, open(path, "w"))
    assert get(state, p) is None


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"format":1,"tool":"' +
                                     __version__.encode() + b'"}'])
def test_corrupt_entry_is_a_miss(tmp_path, content):
    state = str(tmp_path / "state")
    s, p = st_of(tmp_path)
    cache.put_elf(state, s, INFO, recorded(p))
    path = os.path.join(state, "cache", cache._elf_name(cache.file_key(s)))
    open(path, "wb").write(content)
    assert get(state, p) is None


def test_entry_symlink_not_followed(tmp_path):
    state = str(tmp_path / "state")
    s, p = st_of(tmp_path)
    cache.put_elf(state, s, INFO, recorded(p))
    path = os.path.join(state, "cache", cache._elf_name(cache.file_key(s)))
    os.rename(path, tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", path)
    assert get(state, p) is None


def test_write_failures_are_misses(tmp_path):
    blocker = tmp_path / "state"
    blocker.write_text("file")
    s, p = st_of(tmp_path)
    assert cache.put_elf(str(blocker), s, INFO, recorded(p)) is False
    assert get(str(blocker), p) is None
    assert cache.put_config(str(blocker), "/c.yaml", "mode: env\n", {"mode": "env"}) is False
    # unserialisable data: no exception, no file left behind
    state = str(tmp_path / "ok")
    assert cache.put_elf(state, s, {"x": object()}, recorded(p)) is False
    assert cache.put_elf(state, s, {"x": float("nan")}, recorded(p)) is False
    assert os.listdir(os.path.join(state, "cache")) == []


def test_planted_temp_name_does_not_redirect_the_write(tmp_path):
    state = str(tmp_path / "state")
    s, p = st_of(tmp_path)
    d = os.path.join(state, "cache")
    os.makedirs(d)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    name = cache._elf_name(cache.file_key(s))
    # the old, predictable temp name: planted, it neither blocks nor redirects
    os.symlink(victim, os.path.join(d, f".{name}.{os.getpid()}.tmp"))
    assert cache.put_elf(state, s, INFO, recorded(p)) is True
    assert victim.read_text() == "keep"
    assert get(state, p) == INFO


def test_config_entries(tmp_path):
    state = str(tmp_path / "state")
    assert cache.get_config(state, "/etc/c.yaml", "mode: env\n") is None
    assert cache.put_config(state, "/etc/c.yaml", "mode: env\n", {"mode": "env"})
    assert cache.get_config(state, "/etc/c.yaml", "mode: env\n") == {"mode": "env"}
    assert cache.get_config(state, "/etc/c.yaml", "mode: env\n\n") is None
    assert cache.get_config(state, "/etc/other.yaml", "mode: env\n") is None
    assert cache.put_config(state, "/etc/c.yaml", "- x\n", ["x"]) is False


def test_prune_keeps_at_most_max_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "MAX_ENTRIES", 5)
    state = str(tmp_path / "state")
    stats = []
    for i in range(8):
        s, p = st_of(tmp_path, f"lib{i}")
        stats.append(p)
        assert cache.put_elf(state, s, {"i": i}, recorded(p))
    names = os.listdir(os.path.join(state, "cache"))
    assert len(names) == 5
    assert get(state, stats[-1]) == {"i": 7}
