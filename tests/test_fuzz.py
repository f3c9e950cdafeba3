"""Property tests and fuzzing of the two parsers that read attacker-controlled bytes.

* ``compat_hook.facts.elfnote.inspect_elf`` (the image's libcuda candidate) never
  raises, whatever the bytes: every problem lands in ``error``/``note_error``,
  the result survives the cache round trip (``to_dict`` -> JSON ->
  ``from_dict``) and ``loadable_for`` answers.
* ``compat_hook.facts.oci.read_state`` (through a real pipe fd, as the hook reads
  stdin) and ``load_spec`` / ``rootfs_path`` (a real temp bundle) raise
  nothing but ``StateError``; what they accept is usable (an absolute,
  NUL-free bundle; a NUL-free rootfs path), and ``Request.from_spec`` takes
  any accepted spec.

Inputs are structure-aware mutations of elfgen fixtures (header and section
table fields set to boundary values, flips, truncations, inserts, notes with
generated JSON) and of valid states/specs, plus raw bytes.

The fuzz target (``test_fuzz_inspect_elf_coverage_guided``) runs
``COMPAT_HOOK_FUZZ_EXAMPLES`` examples (default 2000), stops generating new
work after ``COMPAT_HOOK_FUZZ_SECONDS`` (default 30), and is coverage-guided
in the hypothesis way: each example's score for ``hypothesis.target`` is the
number of distinct lines of elfnote.py (and of elfinfo.py, where the note's
JSON is checked) it executed, so the search climbs towards inputs that get
deeper into the parser.

tests/fuzz_corpus/{elf,state}/ hold interesting inputs (one per distinct
outcome class found by a systematic boundary-value search, plus hand-made
hostile files), written by ``/usr/bin/python3 -m tests.test_fuzz
write-corpus`` and committed; every file is replayed here against the
coarse outcome recorded in that directory's EXPECTED.json.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import struct
import sys
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from compat_hook.facts import elfgen
from compat_hook.core import jsonfast
from compat_hook.facts.container import Request
from compat_hook.facts.elfnote import ElfInfo, inspect_elf
from compat_hook.core.errors import StateError
from compat_hook.facts.oci import load_spec, read_state, rootfs_path

Path = pathlib.Path
CORPUS = Path(__file__).with_name("fuzz_corpus")
FUZZ_EXAMPLES = int(os.environ.get("COMPAT_HOOK_FUZZ_EXAMPLES", "2000"))
FUZZ_SECONDS = float(os.environ.get("COMPAT_HOOK_FUZZ_SECONDS", "30"))
MACHINE = os.uname().machine if os.uname().machine in ("x86_64", "aarch64") else "x86_64"
HOST_EM = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}[MACHINE]

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- ELF inputs


def _bases() -> list[bytes]:
    mk = elfgen.make_elf
    return [
        mk(note_json=elfgen.NOTE_590, machine=MACHINE),
        mk(note_json=elfgen.NOTE_575, machine=MACHINE, soname=None),
        mk(note_json=None, machine=MACHINE),
        mk(note_json=elfgen.NOTE_INVALID, machine=MACHINE, build_id=False),
        elfgen.orin_overrun_elf(),
        mk(note_json=elfgen.NOTE_590, elf_class=32, machine="i386"),
        mk(note_json=elfgen.NOTE_575, byte_order="big", machine="ppc64"),
        mk(note_json='{"format":1,"cuda version":"12.4","DRIVER":[550],"x":{"y":[1,2]}}', machine=MACHINE,
           extra_sections=[(elfgen.NOTE_NAME, 7, elfgen.note_bytes(elfgen.NOTE_ORIN))]),
    ]


BASES = _bases()
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 12, 16, 0x20, 0x3F, 0x40, 0x7F, 0x80, 0xFF, 0x100, 0xFFF, 0x1000,
               0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 62,
               (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def field_offsets(data: bytes) -> list[tuple[int, int]]:
    """``(offset, width)`` of the ELF header, section header and note header fields of ``data``."""
    if len(data) < 52 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return [(0, 1)]
    is64, bo = data[4] == 2, "<" if data[5] == 1 else ">"
    out = [(4, 1), (5, 1), (16, 2), (18, 2)]
    if is64:
        hdr = {"shoff": (0x28, 8), "shentsize": (0x3A, 2), "shnum": (0x3C, 2), "shstrndx": (0x3E, 2)}
        sh = {"name": (0, 4), "type": (4, 4), "offset": (0x18, 8), "size": (0x20, 8), "link": (0x28, 4),
              "align": (0x30, 8), "entsize": (0x38, 8)}
        shent = 64
    else:
        hdr = {"shoff": (0x20, 4), "shentsize": (0x2E, 2), "shnum": (0x30, 2), "shstrndx": (0x32, 2)}
        sh = {"name": (0, 4), "type": (4, 4), "offset": (0x10, 4), "size": (0x14, 4), "link": (0x18, 4),
              "align": (0x20, 4), "entsize": (0x24, 4)}
        shent = 40
    out += list(hdr.values())
    try:
        shoff = struct.unpack_from(bo + ("Q" if is64 else "I"), data, hdr["shoff"][0])[0]
        shnum = struct.unpack_from(bo + "H", data, hdr["shnum"][0])[0]
    except struct.error:
        return out
    for i in range(min(shnum, 16)):
        base = shoff + i * shent
        if base + shent > len(data):
            break
        out += [(base + o, wd) for o, wd in sh.values()]
        stype = struct.unpack_from(bo + "I", data, base + 4)[0]
        if stype == 7:  # SHT_NOTE: its Nhdr
            noff = struct.unpack_from(bo + ("Q" if is64 else "I"), data, base + sh["offset"][0])[0]
            out += [(noff, 4), (noff + 4, 4), (noff + 8, 4)] if noff + 12 <= len(data) else []
    return [(o, wd) for o, wd in out if o + wd <= len(data)] or [(0, 1)]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(
        st.sampled_from(["format", "CUDA version", "cuda VERSION", "driver", "Driver", "device", "x", ""])
        | st.text(max_size=8), kids, max_size=5),
    max_leaves=20)


@st.composite
def note_texts(draw) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return json.dumps(draw(json_values)).encode()
    if kind == 1:
        base = draw(st.sampled_from([elfgen.NOTE_590, elfgen.NOTE_575, elfgen.NOTE_ORIN])).encode()
        i = draw(st.integers(0, len(base)))
        j = draw(st.integers(i, len(base)))
        return base[:i] + draw(st.binary(max_size=8)) + base[j:]
    if kind == 2:
        d = draw(st.integers(1, 5000))
        return b"[" * d + b"]" * draw(st.integers(0, d))
    return draw(st.binary(max_size=64))


@st.composite
def mutated_elf(draw) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        data = bytearray(elfgen.make_elf(note_json=draw(note_texts()), machine=MACHINE,
                                         soname=draw(st.sampled_from(["libcuda.so.1", None, "x" * 300]))))
    else:
        data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(0, 5))):
        op = draw(st.sampled_from(["set", "set", "set", "flip", "truncate", "insert", "delete"]))
        n = len(data)
        if op == "set" and n:
            fields = field_offsets(bytes(data))
            off, width = draw(st.sampled_from(fields)) if draw(st.booleans()) else (
                draw(st.integers(0, n - 1)), draw(st.sampled_from([1, 2, 4, 8])))
            if off + width > n:
                continue
            value = draw(st.sampled_from(INTERESTING) | st.integers(0, (1 << (8 * width)) - 1))
            value &= (1 << (8 * width)) - 1
            if draw(st.booleans()):  # relative to the file size: the off-by-one boundaries
                value = max(0, min((1 << (8 * width)) - 1, n + draw(st.integers(-16, 16))))
            order = "<" if (n > 5 and data[5] == 1) else ">"
            data[off:off + width] = value.to_bytes(width, "little" if order == "<" else "big")
        elif op == "flip" and n:
            i = draw(st.integers(0, n - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            data = data[: draw(st.integers(0, n))]
        elif op == "insert":
            i = draw(st.integers(0, n))
            data[i:i] = draw(st.binary(max_size=32))
        elif op == "delete" and n:
            i = draw(st.integers(0, n - 1))
            del data[i: i + draw(st.integers(1, 32))]
    return bytes(data)


def check_info(info) -> None:
    """What every inspect_elf result must satisfy."""
    assert isinstance(info, ElfInfo)
    d = info.to_dict()
    text = jsonfast.dumps(d) if _finite(d) else None
    back = ElfInfo.from_dict(json.loads(text) if text is not None else d)
    assert back == info, (back, info)
    if info.error is not None:
        assert info.note is None and isinstance(info.error, str)
    if info.note is not None:
        assert info.note_error is None
        assert info.note.cuda_version is None or isinstance(info.note.cuda_version, str)
        for lst in (info.note.driver, info.note.device):
            assert lst is None or all(type(v) is int for v in lst)
    why = info.loadable_for(HOST_EM)
    assert why is None or why in ("not_elf", "elf_class", "elf_machine", "elf_type", "soname"), why


def _finite(obj) -> bool:
    if isinstance(obj, float):
        return obj == obj and obj not in (float("inf"), float("-inf"))
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return True


def inspect_bytes(data: bytes) -> ElfInfo:
    return inspect_elf(io.BytesIO(data))


_FILE = None


def inspect_file(data: bytes) -> ElfInfo:
    """Through a real file descriptor (fstat size path), like the hook's open_regular file."""
    global _FILE
    if _FILE is None:
        _FILE = tempfile.TemporaryFile()
    fd = _FILE.fileno()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    with open(os.dup(fd), "rb", buffering=0) as f:
        return inspect_elf(f)


@pytest.mark.slow
@PROPS
@given(mutated_elf())
def test_inspect_elf_never_raises_on_mutated_fixtures(data):
    check_info(inspect_bytes(data))


@pytest.mark.slow
@PROPS
@given(mutated_elf())
def test_inspect_elf_same_answer_through_a_real_file(data):
    a, b = inspect_bytes(data), inspect_file(data)
    check_info(b)
    assert a == b


@PROPS
@given(st.binary(max_size=512))
def test_inspect_elf_never_raises_on_raw_bytes(data):
    check_info(inspect_bytes(data))
    check_info(inspect_bytes(b"\x7fELF\x02\x01\x01" + data))


# ---- the coverage-guided fuzz target

_ELFNOTE = sys.modules[inspect_elf.__module__].__file__
#: The reader and the data classes it builds (the note's JSON is checked in elfinfo.py).
_TRACED = (_ELFNOTE, sys.modules[ElfInfo.__module__].__file__)
_seen_lines: set = set()


def _covered(data: bytes) -> set:
    lines: set = set()

    def local(frame, event, arg):
        if event == "line":
            lines.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def glob(frame, event, arg):
        return local if frame.f_code.co_filename in _TRACED else None

    sys.settrace(glob)
    try:
        info = inspect_bytes(data)
    finally:
        sys.settrace(None)
    check_info(info)
    return lines


_t0: list = []


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_elf())
def test_fuzz_inspect_elf_coverage_guided(data):
    if not _t0:
        _t0.append(time.monotonic())
    if time.monotonic() - _t0[0] > FUZZ_SECONDS:
        check_info(inspect_bytes(data))  # past the time budget: plain checks, no tracing
        return
    lines = _covered(data)
    _seen_lines.update(lines)
    target(float(len(lines)), label="elfnote lines executed")


def test_fuzz_reached_deep_paths():
    """The fuzz target above got past the header into note, JSON and SONAME parsing."""
    if not _seen_lines:  # run alone: do a quick pass so the check means something
        for b in BASES:
            _seen_lines.update(_covered(b))
    src = pathlib.Path(_ELFNOTE).read_text().splitlines()
    want = [i + 1 for i, line in enumerate(src)
            if "info.note = _note_from_json(obj)" in line or 'if tag == "DT_SONAME"' in line]
    assert want and all((_ELFNOTE, w) in _seen_lines for w in want), want


# ----------------------------------------------------------------------------- state / config.json

VALID_STATE = {"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1, "bundle": "/run/b",
               "annotations": {"a": "b"}}
VALID_SPEC = {"ociVersion": "1.0.2", "root": {"path": "rootfs", "readonly": False},
              "process": {"args": ["/bin/true"], "env": ["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=12.4"]},
              "annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=all"},
              "linux": {"devices": [{"path": "/dev/nvidia0"}]}, "mounts": [{"destination": "/dev/nvidiactl"}]}

any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=15)


@st.composite
def mutated_json(draw, valid: dict) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:  # the valid document with one key's value replaced by anything
        d = json.loads(json.dumps(valid))
        path = draw(st.sampled_from(_paths(d)))
        _set(d, path, draw(any_json))
        return json.dumps(d).encode()
    if kind == 1:  # text-level edit of the valid document
        t = json.dumps(valid).encode()
        i = draw(st.integers(0, len(t)))
        j = draw(st.integers(i, min(len(t), i + 8)))
        return t[:i] + draw(st.binary(max_size=6) | st.sampled_from([b"\0", b"\\u0000", b"NaN", b"}", b'"'])) + t[j:]
    if kind == 2:
        return json.dumps(draw(any_json)).encode()
    if kind == 3:  # the bundle / root path as any string
        d = json.loads(json.dumps(valid))
        s = draw(st.text() | st.sampled_from(["", "/", "rel", "/a\0b", "\ud800", "/\udcff", "/" + "a" * 5000]))
        if "bundle" in d:
            d["bundle"] = s
        else:
            d["root"]["path"] = s
        return json.dumps(d).encode()
    return draw(st.binary(max_size=256))


def _paths(d, prefix=()):
    out = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, prefix + (i,))
    return out or [()]


def _set(d, path, value):
    if not path:
        return
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def read_state_via_pipe(data: bytes):
    r, w = os.pipe()
    try:
        if len(data) < 60000:
            os.write(w, data)
            os.close(w)
            w = -1
            return read_state(r)
        import threading

        def feed(wfd=w):
            try:
                os.write(wfd, data)
            except OSError:
                pass
            finally:
                os.close(wfd)

        t = threading.Thread(target=feed)
        w = -1
        t.start()
        try:
            return read_state(r)
        finally:
            os.close(r)
            r = -1
            t.join()
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)


def check_state(data: bytes) -> bool:
    try:
        state = read_state_via_pipe(data)
    except StateError as e:
        assert str(e) and "\n" not in str(e)
        return False
    assert isinstance(state, dict)
    b = state["bundle"]
    assert isinstance(b, str) and b.startswith("/") and "\0" not in b
    return True


_BUNDLE: list = []


@pytest.fixture(autouse=True, scope="module")
def _cleanup_bundle():
    yield
    import shutil

    for d in _BUNDLE:
        shutil.rmtree(d, ignore_errors=True)
    _BUNDLE.clear()


def check_spec(data: bytes) -> bool:
    if not _BUNDLE:
        _BUNDLE.append(tempfile.mkdtemp(prefix="fuzz-bundle-"))
    bundle = _BUNDLE[0]
    with open(os.path.join(bundle, "config.json"), "wb") as f:
        f.write(data)
    try:
        spec = load_spec(bundle)
        path = rootfs_path(bundle, spec)
    except StateError as e:
        assert str(e)
        return False
    assert isinstance(spec, dict) and isinstance(path, str) and path.startswith("/") and "\0" not in path
    Request.from_spec(spec, None, spec.get("annotations"))  # never raises for an accepted spec
    return True


@pytest.mark.slow
@PROPS
@given(mutated_json(VALID_STATE))
def test_read_state_only_raises_state_error(data):
    check_state(data)


@pytest.mark.slow
@PROPS
@given(mutated_json(VALID_SPEC))
def test_load_spec_only_raises_state_error(data):
    check_spec(data)


def test_state_limits():
    assert check_state(json.dumps(VALID_STATE).encode()) is True
    assert check_state(b'{"bundle":"/b","x":"' + b"y" * (2 << 20) + b'"}') is False  # > 1 MiB, via a thread
    assert check_spec(json.dumps(VALID_SPEC).encode()) is True


# ----------------------------------------------------------------------------- the corpus


def _elf_class(info: ElfInfo) -> dict:
    return {"elf_ok": info.error is None, "note": info.note is not None}


def _shape(info: ElfInfo) -> tuple:
    norm = (lambda s: None if s is None else re.sub(r"\d+|'[^']*'|\([^)]*\)", "N", s))
    return (norm(info.error), norm(info.note_error), info.note is not None, info.soname is not None,
            info.elf_class, info.byte_order)


def _elf_corpus() -> dict:
    """name -> bytes: hand-made hostile files plus one per outcome shape of a boundary-value sweep."""
    from tests.support import hostile as h

    out = {
        "empty.bin": b"", "magic-only.bin": b"\x7fELF", "truncated-header.bin": h.elf()[:40],
        "truncated-sections.bin": h.elf()[:-100], "shnum-ffff.bin": h.elf(shnum_override=0xFFFF),
        "shoff-2p63.bin": h.elf(shoff_override=1 << 63), "shentsize-7.bin": h.elf(shentsize_override=7),
        "shstrndx-fff0.bin": h.elf(shstrndx_override=0xFFF0), "namesz-4g.bin": h.elf(note_namesz=0xFFFFFFFF),
        "descsz-4g.bin": h.elf(note_descsz=0xFFFFFFFF), "note-section-2p63.bin": h.elf(note_section_size=1 << 63),
        "note-nested-30000.bin": h.elf(note="[" * 30000 + "]" * 30000), "orin-overrun.bin": elfgen.orin_overrun_elf(),
        "note-invalid-json.bin": h.elf(note=elfgen.NOTE_INVALID), "note-590.bin": h.elf(),
    }
    ext = bytearray(h.elf(shnum_override=0))
    shoff = struct.unpack_from("<Q", ext, 0x28)[0]
    struct.pack_into("<Q", ext, shoff + 0x20, (1 << 64) - 1)
    out["extended-numbering-2p64.bin"] = bytes(ext)
    seen = {_shape(inspect_bytes(v)) for v in out.values()}
    for bi, base in enumerate(BASES):
        for off, width in field_offsets(base):
            for value in INTERESTING + [len(base) + d for d in (-13, -12, -1, 0, 1)]:
                if value >= 1 << (8 * width) or value < 0:
                    continue
                data = bytearray(base)
                data[off:off + width] = value.to_bytes(width, "little" if base[5] == 1 else "big")
                shape = _shape(inspect_bytes(bytes(data)))
                if shape not in seen:
                    seen.add(shape)
                    out[f"sweep-b{bi}-at{off:x}-w{width}-v{value:x}.bin"] = bytes(data)
    return out


def _state_corpus() -> dict:
    good = json.dumps(VALID_STATE).encode()
    spec = json.dumps(VALID_SPEC).encode()
    states = {
        "valid": good, "crun-style": b'{"ociVersion":"1.0","id":"c","pid":0,"root":"rootfs","bundle":"/b",'
                                      b'"status":"created","annotations":{}}',
        "empty": b"", "whitespace": b" \n\t\r", "truncated": good[:25], "truncated-1": good[:-1],
        "nan": b'{"bundle":NaN}', "infinity": b'{"bundle":"/b","pid":Infinity}', "bigint": b'{"bundle":"/b","pid":1e999}',
        "bom": b"\xef\xbb\xbf" + good, "utf16": good.decode().encode("utf-16"), "not-utf8": b'{"bundle":"/\xff"}',
        "two-docs": good + good, "trailing-garbage": good + b"x", "array": b"[]", "string": b'"/b"',
        "null": b"null", "nested-deep": b"[" * 50000 + b"]" * 50000, "dup-keys": b'{"bundle":"rel","bundle":"/b"}',
        "bundle-relative": b'{"bundle":"b"}', "bundle-int": b'{"bundle":1}', "bundle-nul": b'{"bundle":"/b\\u0000x"}',
        "bundle-lone-surrogate": b'{"bundle":"/\\ud800"}', "raw-control-char": b'{"bundle":"/b\x01"}',
        "single-quotes": b"{'bundle':'/b'}", "comment": b'{"bundle":"/b"} // x', "no-bundle": b'{"id":"x"}',
        "annotations-weird": b'{"bundle":"/b","annotations":[1,{"a":null}]}',
    }
    specs = {
        "valid": spec, "empty": b"", "array": b"[]", "root-missing": b'{"process":{}}',
        "root-string": b'{"root":"rootfs"}', "root-path-empty": b'{"root":{"path":""}}',
        "root-path-int": b'{"root":{"path":3}}', "root-path-nul": b'{"root":{"path":"a\\u0000b"}}',
        "root-path-absolute": b'{"root":{"path":"/var/lib/x/merged"}}',
        "root-path-dotdot": b'{"root":{"path":"../../.."}}',
        "process-env-weird": b'{"root":{"path":"r"},"process":{"env":[1,null,"A",["x"],"NVIDIA_VISIBLE_DEVICES"]}}',
        "process-not-object": b'{"root":{"path":"r"},"process":[]}',
        "annotations-weird": b'{"root":{"path":"r"},"annotations":{"compat-hook/disable":1,"x":[]}}',
        "devices-weird": b'{"root":{"path":"r"},"linux":{"devices":[null,1,{"path":5},{"path":"/dev/nvidia"}]}}',
        "mounts-weird": b'{"root":{"path":"r"},"mounts":{"destination":"/dev/nvidia0"}}',
        "not-utf8": b'{"root":{"path":"r\xff"}}', "nan": b'{"root":{"path":"r"},"x":NaN}',
    }
    out = {f"state-{k}.json": v for k, v in states.items()}
    out.update({f"spec-{k}.json": v for k, v in specs.items()})
    return out


def write_corpus() -> None:
    for sub, items, classify in (
            ("elf", _elf_corpus(), lambda d: _elf_class(inspect_bytes(d))),
            ("state", _state_corpus(), None)):
        d = CORPUS / sub
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        expected = {}
        for name, data in sorted(items.items()):
            (d / name).write_bytes(data)
            if classify is not None:
                expected[name] = classify(data)
            else:
                expected[name] = {"ok": (check_state if name.startswith("state-") else check_spec)(data)}
        (d / "EXPECTED.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


def _corpus_files(sub: str) -> list[Path]:
    d = CORPUS / sub
    return sorted(p for p in d.iterdir() if p.name != "EXPECTED.json") if d.is_dir() else []


def test_corpus_is_complete():
    for sub, minimum in (("elf", 25), ("state", 30)):
        files = _corpus_files(sub)
        expected = json.loads((CORPUS / sub / "EXPECTED.json").read_text())
        assert len(files) >= minimum and sorted(expected) == [p.name for p in files], sub


@pytest.mark.parametrize("path", _corpus_files("elf"), ids=lambda p: p.name)
def test_replay_elf_corpus(path):
    data = path.read_bytes()
    info = inspect_bytes(data)
    check_info(info)
    assert inspect_file(data) == info
    assert _elf_class(info) == json.loads((CORPUS / "elf" / "EXPECTED.json").read_text())[path.name], info


@pytest.mark.parametrize("path", _corpus_files("state"), ids=lambda p: p.name)
def test_replay_state_corpus(path):
    data = path.read_bytes()
    ok = (check_state if path.name.startswith("state-") else check_spec)(data)
    assert {"ok": ok} == json.loads((CORPUS / "state" / "EXPECTED.json").read_text())[path.name]


if __name__ == "__main__":
    if sys.argv[1:] == ["write-corpus"]:
        write_corpus()
        print(f"wrote {CORPUS}")
    else:
        sys.exit("usage: python3 -m tests.test_fuzz write-corpus")
