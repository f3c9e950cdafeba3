"""Tests of compat_hook.facts.elfnote and of the tests.elfgen fixture generator.

The parsing table is NVIDIA's TestGetCUDACompatElfHeaderFromReader
(docs/background.md "The NVIDIA toolkit"); the fixtures are generated, not copied.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat_hook.facts.elfnote import (
    HOST_MACHINES,
    CompatNote,
    ElfInfo,
    inspect_elf,
    machine_for_arch,
)
from tests.elfgen import (
    NOTE_575,
    NOTE_590,
    NOTE_INVALID,
    NOTE_ORIN,
    make_elf,
    note_bytes,
    orin_overrun_elf,
    write,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REASONS = {None, "not_elf", "elf_class", "elf_machine", "elf_type", "soname"}


class CountingReader:
    """A read-only file wrapper that counts what inspect_elf reads."""

    def __init__(self, f):
        self._f = f
        self.bytes_read = 0
        self.calls = 0
        self.unbounded_reads = 0

    def read(self, n=-1):
        if n is None or n < 0:
            self.unbounded_reads += 1
        data = self._f.read(n)
        self.calls += 1
        self.bytes_read += len(data)
        return data

    def seek(self, offset, whence=0):
        return self._f.seek(offset, whence)

    def tell(self):
        return self._f.tell()

    def fileno(self):
        return self._f.fileno()


def inspect_bytes(data: bytes) -> ElfInfo:
    return inspect_elf(io.BytesIO(data))


def inspect_counted(data: bytes):
    reader = CountingReader(io.BytesIO(data))
    return inspect_elf(reader), reader


# --- a tiny independent ELF64-LE section-table editor, for corrupting fixtures ---

def _shdr_base(data: bytes, index: int) -> int:
    shoff = struct.unpack_from("<Q", data, 40)[0]
    return shoff + index * 64


def section_index(data: bytes, name: str) -> int:
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shnum, shstrndx = struct.unpack_from("<HH", data, 60)
    str_off = struct.unpack_from("<Q", data, shoff + shstrndx * 64 + 24)[0]
    for i in range(shnum):
        (name_off,) = struct.unpack_from("<I", data, shoff + i * 64)
        start = str_off + name_off
        if data[start : data.index(b"\0", start)] == name.encode():
            return i
    raise AssertionError(f"no section {name}")


_SHDR_FIELDS = {"sh_type": (4, "I"), "sh_offset": (24, "Q"), "sh_size": (32, "Q"), "sh_link": (40, "I")}


def patch_section(data: bytes, name_or_index, **fields) -> bytes:
    index = name_or_index if isinstance(name_or_index, int) else section_index(data, name_or_index)
    out = bytearray(data)
    for field, value in fields.items():
        at, fmt = _SHDR_FIELDS[field]
        struct.pack_into("<" + fmt, out, _shdr_base(data, index) + at, value)
    return bytes(out)


# ---------------------------------------------------------------- generator


def test_generator_reproduces_nvidia_fixture_sizes():
    # docs/background.md "The NVIDIA toolkit": 560 bytes (575, 590) and 488 bytes (Orin, invalid-json).
    assert len(make_elf(note_json=NOTE_575, soname=None)) == 560
    assert len(make_elf(note_json=NOTE_590, machine="aarch64", soname=None)) == 560
    assert len(orin_overrun_elf()) == 488
    assert len(orin_overrun_elf(NOTE_INVALID)) == 488
    # The default (with .dynamic/.dynstr and two program headers) stays small.
    assert 500 <= len(make_elf(note_json=NOTE_575)) <= 1024


def test_generator_is_deterministic():
    assert make_elf(note_json=NOTE_575) == make_elf(note_json=NOTE_575)
    assert make_elf(note_json=NOTE_575) != make_elf(note_json=NOTE_590)


def _readelf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["readelf", *args], capture_output=True, text=True, check=False)


def test_readelf_cross_checks_the_generator(tmp_path):
    lib = str(write(tmp_path / "libcuda.so.575.57.08", make_elf(note_json=NOTE_575)))
    notes = _readelf("-W", "-n", lib)
    assert notes.returncode == 0, notes.stderr
    assert "Displaying notes found in: .note.cuda.fwd_compatibility" in notes.stdout
    assert "NVIDIA Corporation   0x0000006a\tUnknown note type: (0x00000000)" in notes.stdout
    assert "NT_GNU_BUILD_ID" in notes.stdout
    assert notes.stderr == ""

    sections = _readelf("-W", "-S", lib)
    fields = next(ln for ln in sections.stdout.splitlines() if ".note.cuda.fwd_compatibility" in ln).split()
    # Type NOTE, then address, offset, size 0x8c, entsize 0, flag A, link 0, info 0, align 4 (docs/background.md "The ELF note").
    at = fields.index("NOTE")
    assert fields[at + 3 :] == ["00008c", "00", "A", "0", "0", "4"]

    dyn = _readelf("-W", "-d", lib)
    assert "Library soname: [libcuda.so.1]" in dyn.stdout

    dump = _readelf("-p", ".note.cuda.fwd_compatibility", lib)
    assert NOTE_575 in dump.stdout

    header = _readelf("-h", lib).stdout
    assert "DYN (Shared object file)" in header and "X86-64" in header


def test_readelf_sees_the_orin_overrun_like_nvidias_file(tmp_path):
    lib = str(write(tmp_path / "libcuda.so.1.1", orin_overrun_elf()))
    notes = _readelf("-W", "-n", lib)
    assert "note with invalid namesz and/or descsz" in notes.stderr
    assert "descsize: 0x29" in notes.stderr
    sections = _readelf("-W", "-S", lib).stdout
    assert "000047" in next(ln for ln in sections.splitlines() if ".note.cuda" in ln)


def test_ldconfig_reads_the_generated_soname(tmp_path):
    # Other tests use these files as compat libraries in ldconfig mode: the
    # SONAME must be found through PT_DYNAMIC like in a real library.
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    write(tmp_path / "libcuda.so.575.57.08", make_elf(note_json=NOTE_575))
    subprocess.run([ldconfig, "-n", str(tmp_path)], check=True, capture_output=True)
    assert os.readlink(tmp_path / "libcuda.so.1") == "libcuda.so.575.57.08"


# ---------------------------------------------------------------- NVIDIA parsing table


def test_parse_575():
    info = inspect_bytes(make_elf(note_json=NOTE_575))
    assert info.error is None and info.note_error is None
    note = info.note
    assert note.format == 1
    assert note.cuda_version == "12.9"
    assert note.driver == [535, 550, 560, 565, 570, 575]
    assert note.device == [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]
    assert note.raw == json.loads(NOTE_575)
    assert (info.elf_class, info.machine, info.elf_type, info.byte_order) == (64, "EM_X86_64", "ET_DYN", "little")
    assert info.soname == "libcuda.so.1"
    assert info.loadable_for("EM_X86_64") is None


def test_parse_590_on_aarch64():
    info = inspect_bytes(make_elf(note_json=NOTE_590, machine="aarch64", soname=None))
    assert info.error is None and info.note_error is None
    assert info.machine == "EM_AARCH64"
    assert info.note.cuda_version == "13.1"
    assert info.note.driver == [535, 550, 570, 575, 580, 590]
    assert info.note.device == [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]
    assert info.loadable_for("EM_AARCH64") is None
    assert info.loadable_for("EM_X86_64") == "elf_machine"


def test_parse_orin_overrun_clamps_to_section_end():
    info = inspect_bytes(orin_overrun_elf())
    assert info.error is None
    assert info.note_error is None
    assert info.note.format == 1
    assert info.note.cuda_version == "13.2"
    assert info.note.driver is None and info.note.device is None
    assert info.note.raw == json.loads(NOTE_ORIN)


@pytest.mark.parametrize("data", [orin_overrun_elf(NOTE_INVALID), make_elf(note_json=NOTE_INVALID)])
def test_parse_invalid_json(data):
    info = inspect_bytes(data)
    assert info.note is None
    assert "invalid JSON" in info.note_error
    assert info.error is None  # still a fine ELF: only the note is refused


@pytest.mark.parametrize("key", ["CUDA version", "CUDA Version", "cuda version", "CUDA VERSION", "Cuda Version"])
def test_cuda_version_key_is_case_insensitive(key):
    info = inspect_bytes(make_elf(note_json=json.dumps({"format": 1, key: "13.0", "DRIVER": [580]})))
    assert info.note_error is None
    assert info.note.cuda_version == "13.0"
    assert info.note.driver == [580]


def test_key_in_two_case_variants_is_refused():
    info = inspect_bytes(make_elf(note_json='{"CUDA version":"12.9","CUDA Version":"13.1"}'))
    assert info.note is None
    assert "twice" in info.note_error


def test_unknown_keys_are_kept_in_raw():
    info = inspect_bytes(make_elf(note_json='{"format":2,"CUDA version":"14.0","extra":{"a":1}}'))
    assert info.note.format == 2
    assert info.note.raw["extra"] == {"a": 1}


@pytest.mark.parametrize("owner", [b"NVIDIA Corp", b"GNU", b"nvidia corporation", b"NVIDIA Corporation!"])
def test_wrong_owner(owner):
    info = inspect_bytes(make_elf(note_json=NOTE_575, note_owner=owner))
    assert info.note is None
    assert info.note_error == "note owner is not NVIDIA Corporation"
    assert info.error is None


def test_owner_trailing_nuls_are_trimmed():
    info = inspect_bytes(make_elf(note_json=NOTE_575, note_owner=b"NVIDIA Corporation\0\0\0\0\0"))
    assert info.note_error is None
    assert info.note.cuda_version == "12.9"


@pytest.mark.parametrize("override", [{"note_namesz": 0}, {"note_descsz": 0}])
def test_empty_name_or_descriptor_means_no_note(override):
    info = inspect_bytes(make_elf(note_json=NOTE_575, **override))
    assert info.note is None
    assert info.note_error == "note has an empty name or descriptor"


def test_no_note_section():
    info = inspect_bytes(make_elf(note_json=None))
    assert info.note is None
    assert info.note_error is None
    assert info.error is None
    assert info.loadable_for("EM_X86_64") is None


def test_note_section_found_by_name_and_type_only():
    # A PROGBITS section with the right name is not the note (NVIDIA: the first SHT_NOTE).
    data = patch_section(make_elf(note_json=NOTE_575), ".note.cuda.fwd_compatibility", sh_type=1)
    info = inspect_bytes(data)
    assert info.note is None and info.note_error is None and info.error is None
    # Another note section (the build-id one) does not count either.
    info = inspect_bytes(make_elf(note_json=None, build_id=True))
    assert info.note is None and info.note_error is None


def test_first_note_section_wins():
    second = (".note.cuda.fwd_compatibility", 7, note_bytes(NOTE_590))
    info = inspect_bytes(make_elf(note_json=NOTE_575, extra_sections=[second]))
    assert info.note.cuda_version == "12.9"
    # Alone, the extra section is found and parsed like the generated one.
    info = inspect_bytes(make_elf(note_json=None, extra_sections=[second]))
    assert info.note.cuda_version == "13.1"


def test_only_the_first_note_in_the_section_counts():
    both = note_bytes("ignored", owner=b"GNU") + note_bytes(NOTE_575)
    info = inspect_bytes(make_elf(note_json=None, extra_sections=[(".note.cuda.fwd_compatibility", 7, both)]))
    assert info.note is None
    assert info.note_error == "note owner is not NVIDIA Corporation"
    reverse = note_bytes(NOTE_575) + note_bytes("ignored", owner=b"GNU")
    info = inspect_bytes(make_elf(note_json=None, extra_sections=[(".note.cuda.fwd_compatibility", 7, reverse)]))
    assert info.note.cuda_version == "12.9"


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ('[1,2,3]', "not an object"),
        ('"12.9"', "not an object"),
        ('{"format":"1"}', "'format' is not an integer"),
        ('{"format":true}', "'format' is not an integer"),
        ('{"format":1.0}', "'format' is not an integer"),
        ('{"CUDA version":12.9}', "'CUDA version' is not a string"),
        ('{"driver":[535,"550"]}', "'driver' is not a list of integers"),
        ('{"driver":[535,true]}', "'driver' is not a list of integers"),
        ('{"driver":535}', "'driver' is not a list of integers"),
        ('{"device":[1.5]}', "'device' is not a list of integers"),
        ('{"device":{"a":1}}', "'device' is not a list of integers"),
        ('{"driver":[99999999999999999999]}', "'driver' is not a list of integers"),
        ("", "invalid JSON"),
        ("   ", "invalid JSON"),
        ('{"format":NaN}', "invalid JSON"),
        ("[" * 20000 + "]" * 20000, "invalid JSON"),
    ],
)
def test_note_json_is_validated_strictly(payload, fragment):
    info = inspect_bytes(make_elf(note_json=payload))
    assert info.note is None
    assert fragment in info.note_error
    assert info.error is None


def test_json_null_fields_are_absent():
    info = inspect_bytes(make_elf(note_json='{"format":null,"CUDA version":null,"driver":null,"device":null}'))
    assert info.note_error is None
    note = info.note
    assert (note.format, note.cuda_version, note.driver, note.device) == (None, None, None, None)


def test_descriptor_not_utf8():
    info = inspect_bytes(make_elf(note_json=b'{"CUDA version":"\xff\xfe"}'))
    assert info.note is None
    assert info.note_error == "note descriptor is not valid UTF-8"


def test_descriptor_outside_section():
    # namesz claims 19 bytes but the section ends right after the name.
    data = make_elf(note_json=NOTE_575)
    data = patch_section(data, ".note.cuda.fwd_compatibility", sh_size=12 + 20)
    info = inspect_bytes(data)
    assert info.note is None
    assert info.note_error == "note descriptor lies outside the section"


def test_name_overrunning_the_section():
    info = inspect_bytes(make_elf(note_json=NOTE_575, note_namesz=1_000_000))
    assert info.note is None
    assert info.note_error == "note name overruns the section"


def test_note_section_too_small_or_outside_file():
    data = make_elf(note_json=NOTE_575)
    small = inspect_bytes(patch_section(data, ".note.cuda.fwd_compatibility", sh_size=8))
    assert small.note is None and "too small" in small.note_error
    outside = inspect_bytes(patch_section(data, ".note.cuda.fwd_compatibility", sh_offset=1 << 40))
    assert outside.note is None and "outside the file" in outside.note_error
    assert outside.error is None


# ---------------------------------------------------------------- loader checks


def test_elf32():
    info = inspect_bytes(make_elf(elf_class=32, note_json=NOTE_575))
    assert info.error is None
    assert info.elf_class == 32
    assert info.soname == "libcuda.so.1"
    assert info.note.cuda_version == "12.9"  # the note is still read
    assert info.loadable_for("EM_X86_64") == "elf_class"


def test_aarch64_on_x86_64_host():
    info = inspect_bytes(make_elf(machine="aarch64", note_json=NOTE_590))
    assert info.loadable_for("EM_X86_64") == "elf_machine"
    assert info.loadable_for(machine_for_arch("aarch64")) is None


def test_et_exec():
    info = inspect_bytes(make_elf(elf_type=2, note_json=NOTE_575))
    assert info.elf_type == "ET_EXEC"
    assert info.loadable_for("EM_X86_64") == "elf_type"


def test_other_soname():
    info = inspect_bytes(make_elf(soname="libfoo.so.1", note_json=NOTE_575))
    assert info.soname == "libfoo.so.1"
    assert info.loadable_for("EM_X86_64") == "soname"


def test_no_soname_is_loadable():
    info = inspect_bytes(make_elf(soname=None, note_json=NOTE_575))
    assert info.soname is None
    assert info.error is None
    assert info.loadable_for("EM_X86_64") is None


def test_unknown_machine_gets_a_stable_name():
    info = inspect_bytes(make_elf(machine=0x7777))
    assert info.error is None
    assert info.machine == "EM_0x7777"
    assert info.loadable_for("EM_X86_64") == "elf_machine"


def test_loadable_reason_order():
    # not_elf before anything else; then class, machine, type, soname.
    assert ElfInfo(error="x", elf_class=64, machine="EM_X86_64", elf_type="ET_DYN").loadable_for("EM_X86_64") == "not_elf"
    assert ElfInfo(elf_class=32, machine="EM_AARCH64", elf_type="ET_EXEC").loadable_for("EM_X86_64") == "elf_class"
    assert ElfInfo(elf_class=64, machine="EM_AARCH64", elf_type="ET_EXEC").loadable_for("EM_X86_64") == "elf_machine"
    assert ElfInfo(elf_class=64, machine="EM_X86_64", elf_type="ET_EXEC", soname="x").loadable_for("EM_X86_64") == "elf_type"
    assert ElfInfo(elf_class=64, machine="EM_X86_64", elf_type="ET_DYN", soname="x").loadable_for("EM_X86_64") == "soname"


def test_machine_for_arch():
    assert machine_for_arch("x86_64") == "EM_X86_64"
    assert machine_for_arch("amd64") == "EM_X86_64"
    assert machine_for_arch("aarch64") == "EM_AARCH64"
    assert machine_for_arch("arm64") == "EM_AARCH64"
    assert machine_for_arch("ppc64le") == "EM_PPC64"
    assert machine_for_arch(" X86_64\n") == "EM_X86_64"
    assert machine_for_arch("riscv64") is None
    assert machine_for_arch(None) is None
    assert set(HOST_MACHINES.values()) == {"EM_X86_64", "EM_AARCH64", "EM_PPC64"}


def test_big_endian():
    info = inspect_bytes(make_elf(machine="ppc64le", byte_order="big", note_json=NOTE_590))
    assert info.error is None and info.note_error is None
    assert info.byte_order == "big"
    assert info.machine == "EM_PPC64"
    assert info.soname == "libcuda.so.1"
    assert info.note.driver == [535, 550, 570, 575, 580, 590]
    assert info.loadable_for("EM_PPC64") is None


def test_big_endian_elf32():
    info = inspect_bytes(make_elf(elf_class=32, byte_order="big", machine="aarch64", note_json=NOTE_ORIN))
    assert info.error is None
    assert (info.elf_class, info.byte_order, info.machine) == (32, "big", "EM_AARCH64")
    assert info.note.cuda_version == "13.2"


# ---------------------------------------------------------------- not an ELF / broken ELF


def test_text_file_and_empty_file(tmp_path):
    text = write(tmp_path / "libcuda.so.575.57.08", b"this is not a library\n")
    empty = write(tmp_path / "libcuda.so.333.88.99", b"")
    with open(text, "rb", buffering=0) as f:
        info = inspect_elf(f)
    assert info.error == "not an ELF file"
    assert info.loadable_for("EM_X86_64") == "not_elf"
    assert info.note is None
    with open(empty, "rb", buffering=0) as f:
        info = inspect_elf(f)
    assert info.error == "empty file"
    assert info.loadable_for("EM_X86_64") == "not_elf"


@pytest.mark.parametrize("cut", [40, 63, 3, 5])
def test_truncated_header(cut):
    info = inspect_bytes(make_elf(note_json=NOTE_575)[:cut])
    assert info.error == "truncated ELF header"
    assert info.loadable_for("EM_X86_64") == "not_elf"
    assert info.note is None


def test_truncated_after_header():
    # A whole header but the section table is gone.
    info = inspect_bytes(make_elf(note_json=NOTE_575)[:300])
    assert info.error == "section table out of range"
    assert info.note is None


@pytest.mark.parametrize("ident, message", [(3, "unsupported ELF class 3"), (0, "unsupported ELF class 0")])
def test_bad_class(ident, message):
    data = bytearray(make_elf(note_json=NOTE_575))
    data[4] = ident
    assert inspect_bytes(bytes(data)).error == message


def test_bad_byte_order():
    data = bytearray(make_elf(note_json=NOTE_575))
    data[5] = 7
    assert inspect_bytes(bytes(data)).error == "unsupported ELF byte order 7"


@pytest.mark.parametrize(
    "override, message",
    [
        ({"shnum_override": 0xFFFF}, "section table out of range"),
        ({"shnum_override": 1000}, "section table out of range"),
        ({"shoff_override": 1 << 63}, "section table out of range"),
        ({"shoff_override": (1 << 64) - 1}, "section table out of range"),
        ({"shentsize_override": 1}, "bad section header size 1"),
        ({"shentsize_override": 0}, "bad section header size 0"),
        ({"shentsize_override": 0xFFFF}, "bad section header size 65535"),
        ({"shstrndx_override": 0xFEFF}, "section name table index out of range"),
        ({"shstrndx_override": 1}, "section name table is not SHT_STRTAB"),
    ],
)
def test_absurd_header_fields(override, message):
    start = time.monotonic()
    info, reader = inspect_counted(make_elf(note_json=NOTE_575, **override))
    assert time.monotonic() - start < 2
    assert info.error == message
    assert info.note is None
    assert info.loadable_for("EM_X86_64") == "not_elf"
    assert reader.bytes_read < 4096
    assert reader.unbounded_reads == 0


def test_shoff_zero_means_no_sections():
    info = inspect_bytes(make_elf(note_json=NOTE_575, shoff_override=0))
    assert info.error is None
    assert info.note is None and info.soname is None
    assert info.machine == "EM_X86_64"


def test_extended_section_count_from_section_zero():
    # e_shnum == 0: the count lives in section 0's sh_size (gABI). A huge one
    # makes pyelftools' ELFFile iterate forever; we refuse it up front.
    data = make_elf(note_json=NOTE_575, shnum_override=0)
    huge = patch_section(data, 0, sh_size=(1 << 64) - 1)
    start = time.monotonic()
    info, reader = inspect_counted(huge)
    assert time.monotonic() - start < 2
    assert info.error == "section table out of range"
    assert reader.bytes_read < 4096
    # The legitimate use of the same mechanism works.
    real_count = struct.unpack_from("<H", make_elf(note_json=NOTE_575), 60)[0]
    ok = inspect_bytes(patch_section(data, 0, sh_size=real_count))
    assert ok.error is None
    assert ok.note.cuda_version == "12.9"


def test_shstrndx_xindex_uses_section_zero_link():
    data = make_elf(note_json=NOTE_575, shstrndx_override=0xFFFF)
    real = section_index(make_elf(note_json=NOTE_575), ".shstrtab")
    info = inspect_bytes(patch_section(data, 0, sh_link=real))
    assert info.error is None and info.note.cuda_version == "12.9"
    bad = inspect_bytes(patch_section(data, 0, sh_link=50_000))
    assert bad.error == "section name table index out of range"


def test_many_sections_are_refused_without_reading_them():
    data = make_elf(note_json=NOTE_575, shnum_override=0)
    shoff = struct.unpack_from("<Q", data, 40)[0]
    big = data + b"\0" * (5000 * 64)  # room in the file for 5000 headers
    info, reader = inspect_counted(patch_section(big, 0, sh_size=5000))
    assert info.error == "too many sections (5000)"
    assert reader.bytes_read < 4096
    assert shoff > 0


@pytest.mark.parametrize(
    "name, fields, message",
    [
        (".shstrtab", {"sh_size": 1 << 62}, "section name table out of range"),
        (".shstrtab", {"sh_offset": 1 << 62}, "section name table out of range"),
        (".dynamic", {"sh_size": 1 << 62}, "dynamic section out of range"),
        (".dynamic", {"sh_offset": (1 << 64) - 16}, "dynamic section out of range"),
        (".dynamic", {"sh_link": 4}, "dynamic section has no valid string table link"),  # itself
        (".dynamic", {"sh_link": 0}, "dynamic section has no valid string table link"),
        (".dynamic", {"sh_link": 9999}, "dynamic section has no valid string table link"),
        (".dynstr", {"sh_size": 1 << 62}, "dynamic string table out of range"),
        (".dynstr", {"sh_size": 1}, "SONAME lies outside the dynamic string table"),
        (".dynstr", {"sh_size": 5}, "SONAME is not NUL-terminated"),
    ],
)
def test_absurd_section_fields(name, fields, message):
    data = make_elf(note_json=NOTE_575)
    assert section_index(data, ".dynamic") == 4
    start = time.monotonic()
    info, reader = inspect_counted(patch_section(data, name, **fields))
    assert time.monotonic() - start < 2
    assert info.error == message
    assert info.note is None  # an ELF we refuse carries no trustworthy note
    assert reader.bytes_read < 4096


def test_dynamic_without_dt_null_is_bounded():
    # .dynamic claims the whole (large, zero-free) rest of the file.
    data = make_elf(note_json=NOTE_575)
    dyn = section_index(data, ".dynamic")
    off = struct.unpack_from("<Q", data, _shdr_base(data, dyn) + 24)[0]
    filler = struct.pack("<qQ", 0x6FFFFEF5, 1) * 200_000  # DT_GNU_HASH entries, 3.2 MB
    data = data + filler
    data = patch_section(data, dyn, sh_offset=len(data) - len(filler), sh_size=len(filler))
    start = time.monotonic()
    info, reader = inspect_counted(data)
    assert time.monotonic() - start < 2
    assert info.error is None
    assert info.soname is None
    assert reader.bytes_read < 128 * 1024
    assert off > 0


def test_huge_descsz_is_clamped_and_cheap():
    # descsz says 100 MB; the section end bounds it, and the note parses.
    start = time.monotonic()
    info, reader = inspect_counted(make_elf(note_json=NOTE_575, note_descsz=100 << 20))
    assert time.monotonic() - start < 1
    assert info.note_error is None
    assert info.note.cuda_version == "12.9"
    assert reader.bytes_read < 1024 * 1024
    assert reader.unbounded_reads == 0


def test_huge_note_section_is_clamped_to_the_file():
    # descsz and sh_size both say 100 MB: the descriptor runs to EOF (over
    # the following sections), so it is garbage, but reading it is cheap.
    start = time.monotonic()
    data = make_elf(note_json=NOTE_575, note_descsz=100 << 20, note_section_size=100 << 20)
    info, reader = inspect_counted(data)
    assert time.monotonic() - start < 1
    assert info.note is None
    assert info.note_error in ("note descriptor is not valid UTF-8",) or "invalid JSON" in info.note_error
    assert info.error is None
    assert reader.bytes_read < 2 * len(data)
    assert reader.unbounded_reads == 0


def test_huge_descriptor_in_a_huge_sparse_file(tmp_path):
    # A 200 MB (sparse) file whose note really is 100 MB long: read at most 64 KiB.
    path = write(tmp_path / "libcuda.so.999.1.1", make_elf(note_json=NOTE_575, note_descsz=100 << 20, note_section_size=100 << 20))
    with open(path, "r+b") as f:
        f.truncate(200 << 20)
    with open(path, "rb", buffering=0) as raw:
        reader = CountingReader(raw)
        start = time.monotonic()
        info = inspect_elf(reader)
    assert time.monotonic() - start < 1
    assert info.note is None
    assert info.note_error == "note descriptor is larger than 64 KiB"
    assert info.error is None
    assert reader.bytes_read < 1024 * 1024


def test_big_real_descriptor_is_refused():
    payload = '{"format":1,"pad":"' + "x" * 70_000 + '"}'
    info, reader = inspect_counted(make_elf(note_json=payload))
    assert info.note is None
    assert info.note_error == "note descriptor is larger than 64 KiB"
    assert reader.bytes_read < 16 * 1024  # the descriptor itself is never read


def test_reads_little_from_a_fixture():
    data = make_elf(note_json=NOTE_575)
    info, reader = inspect_counted(data)
    assert info.note is not None
    assert reader.unbounded_reads == 0
    assert reader.bytes_read < 2 * len(data)


def test_inspect_uses_the_given_file_object_only(tmp_path):
    # The caller opened the file safely inside a container root; inspect_elf
    # must not reopen it by path: delete the path and it must still work.
    path = write(tmp_path / "libcuda.so.575.57.08", make_elf(note_json=NOTE_575))
    with open(path, "rb") as f:
        os.unlink(path)
        info = inspect_elf(f)
    assert info.note.cuda_version == "12.9"


def test_read_error_is_reported():
    class Broken(CountingReader):
        def read(self, n=-1):
            raise OSError(5, "Input/output error")

    info = inspect_elf(Broken(io.BytesIO(make_elf(note_json=NOTE_575))))
    assert info.error is not None and "Input/output error" in info.error
    assert info.loadable_for("EM_X86_64") == "not_elf"


def test_io_error_after_the_header_is_reported():
    class FailsLater(CountingReader):
        def read(self, n=-1):
            if self.calls >= 1:
                raise OSError(5, "Input/output error")
            return super().read(n)

    info = inspect_elf(FailsLater(io.BytesIO(make_elf(note_json=NOTE_575))))
    assert "Input/output error" in info.error
    assert info.note is None


def test_a_bug_of_ours_is_not_reported_as_a_bad_file():
    # A caller handing over a text-mode reader is a bug in compat-hook, not a
    # hostile image: it must surface (the entry point's fail-open handler logs
    # internal_error), not hide as "unparseable ELF".
    class TextAfterHeader(CountingReader):
        def read(self, n=-1):
            data = super().read(n)
            return data if self.calls == 1 else data.decode("latin-1")

    with pytest.raises(TypeError):
        inspect_elf(TextAfterHeader(io.BytesIO(make_elf(note_json=NOTE_575))))


# ---------------------------------------------------------------- to_dict / from_dict


ROUND_TRIP_FIXTURES = [
    make_elf(note_json=NOTE_575),
    make_elf(note_json=NOTE_590, machine="aarch64", byte_order="big"),
    orin_overrun_elf(),
    orin_overrun_elf(NOTE_INVALID),
    make_elf(elf_class=32, soname="libfoo.so.2"),
    make_elf(note_json='{"CUDA Version":"13.0","x":[1,{"y":null}]}'),
    b"",
    b"\x7fELF\x02\x01",
]


@pytest.mark.parametrize("data", ROUND_TRIP_FIXTURES)
def test_round_trip(data):
    info = inspect_bytes(data)
    d = info.to_dict()
    text = json.dumps(d)
    back = ElfInfo.from_dict(json.loads(text))
    assert back == info
    assert back.to_dict() == d
    assert type(back.note) is type(info.note)
    if info.note is not None:
        assert back.note.driver == info.note.driver
        assert back.note.cuda_version == info.note.cuda_version


def _good_dict() -> dict:
    return inspect_bytes(make_elf(note_json=NOTE_575)).to_dict()


def _mutated(fn):
    # Applied inside the test, so a broken inspect_elf fails tests, not collection.
    def make() -> dict:
        d = _good_dict()
        fn(d)
        return d

    return make


def _const(value):
    return lambda: value


@pytest.mark.parametrize(
    "bad",
    [
        _const(None),
        _const([]),
        _const("x"),
        _mutated(lambda d: d.pop("soname")),
        _mutated(lambda d: d.pop("note")),
        _mutated(lambda d: d.update(extra=1)),
        _mutated(lambda d: d.update(elf_class="64")),
        _mutated(lambda d: d.update(elf_class=True)),
        _mutated(lambda d: d.update(elf_class=16)),
        _mutated(lambda d: d.update(machine=62)),
        _mutated(lambda d: d.update(elf_type=["ET_DYN"])),
        _mutated(lambda d: d.update(soname=b"libcuda.so.1")),
        _mutated(lambda d: d.update(byte_order="middle")),
        _mutated(lambda d: d.update(error=1)),
        _mutated(lambda d: d.update(note_error=False)),
        _mutated(lambda d: d.update(note_error="also an error")),
        _mutated(lambda d: d.update(error="and not an ELF")),
        _mutated(lambda d: d.update(note="note")),
        _mutated(lambda d: d["note"].pop("raw")),
        _mutated(lambda d: d["note"].update(extra=1)),
        _mutated(lambda d: d["note"].update(raw=[1])),
        _mutated(lambda d: d["note"].update(raw=None)),
        _mutated(lambda d: d["note"].update(driver=[535])),
        _mutated(lambda d: d["note"].update(driver="535")),
        _mutated(lambda d: d["note"].update(format=True)),
        _mutated(lambda d: d["note"].update(format=2)),
        _mutated(lambda d: d["note"].update(cuda_version="99.0")),
        _mutated(lambda d: d["note"].update(device=None)),
        _mutated(lambda d: d["note"]["raw"].update(driver=[535, True])),
        _mutated(lambda d: (d["note"]["raw"].update(driver=[535, True]), d["note"].update(driver=[535, True]))),
        _mutated(lambda d: d["note"]["raw"].update({"CUDA Version": "1.0"})),
    ],
)
def test_from_dict_rejects_malformed(bad):
    with pytest.raises(ValueError):
        ElfInfo.from_dict(bad())


def test_compat_note_round_trip_and_rejects():
    note = inspect_bytes(make_elf(note_json=NOTE_575)).note
    assert CompatNote.from_dict(note.to_dict()) == note
    # to_dict hands out copies: mutating them does not change the note.
    d = note.to_dict()
    d["driver"].append(1)
    d["raw"]["format"] = 7
    assert note.driver == [535, 550, 560, 565, 570, 575] and note.raw["format"] == 1
    with pytest.raises(ValueError):
        CompatNote.from_dict({"format": 1})
    with pytest.raises(ValueError):
        CompatNote.from_dict({**note.to_dict(), "raw": {1: 2}})


def test_good_dict_is_accepted():
    # Guards the rejection table above: the unmutated dict must pass.
    info = ElfInfo.from_dict(_good_dict())
    assert info.note.cuda_version == "12.9"
    assert info.soname == "libcuda.so.1"


# ---------------------------------------------------------------- import hygiene


def _python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_module_imports_are_cheap():
    code = (
        "import sys, compat_hook\n"
        "before = set(sys.modules)\n"
        "import compat_hook.facts.elfnote\n"
        "new = set(sys.modules) - before\n"
        "banned = {'elftools', 'typing', 'dataclasses', 're', 'json', 'subprocess'}\n"
        "print(sorted(m for m in new if m.split('.')[0] in banned))\n"
    )
    assert _python(code) == "[]"


def test_elftools_is_not_imported_for_files_that_are_not_elf():
    code = (
        "import io, sys\n"
        "from compat_hook.facts.elfnote import inspect_elf\n"
        "a = inspect_elf(io.BytesIO(b''))\n"
        "b = inspect_elf(io.BytesIO(b'#!/bin/sh\\n'))\n"
        "print(a.error, '|', b.error, '|', 'elftools' in sys.modules)\n"
        "from tests.elfgen import make_elf\n"
        "c = inspect_elf(io.BytesIO(make_elf()))\n"
        "print(c.error, '|', 'elftools' in sys.modules)\n"
    )
    assert _python(code).splitlines() == ["empty file | not an ELF file | False", "None | True"]


# ---------------------------------------------------------------- property tests


VALID = make_elf(note_json=NOTE_575)
VALID_BE32 = make_elf(note_json=NOTE_590, elf_class=32, byte_order="big", machine="aarch64")


def _check_invariants(info):
    assert isinstance(info, ElfInfo)
    assert info.loadable_for("EM_X86_64") in REASONS
    if info.error is None:
        assert info.elf_class in (32, 64)
    if info.note is not None:
        assert info.note_error is None and info.error is None
    # Whatever came out must survive the cache.
    assert ElfInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes_never_raise(data):
    _check_invariants(inspect_bytes(data))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=0, max_size=200))
def test_random_bytes_after_a_valid_ident_never_raise(tail):
    # Most random inputs die at the magic check; start from a valid ident.
    _check_invariants(inspect_bytes(b"\x7fELF\x02\x01\x01\x00" + b"\0" * 8 + tail))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([VALID, VALID_BE32]),
    st.lists(st.tuples(st.integers(min_value=0, max_value=len(VALID) - 1), st.integers(0, 255)), max_size=12),
    st.lists(st.tuples(st.integers(min_value=0, max_value=len(VALID) - 1), st.sampled_from([b"\xff" * 8, b"\0" * 8, b"\x7f\xff\xff\xff"])), max_size=3),
    st.integers(min_value=0, max_value=len(VALID) + 8),
)
def test_mutated_fixture_never_raises(base, byte_edits, word_edits, cut):
    data = bytearray(base)
    for at, value in byte_edits:
        if at < len(data):
            data[at] = value
    for at, word in word_edits:
        data[at : at + len(word)] = word
    data = bytes(data[:cut])
    info, reader = inspect_counted(data)
    _check_invariants(info)
    assert reader.unbounded_reads == 0
    # Never more than a few passes over a file this small.
    assert reader.bytes_read <= 8 * max(len(data), 64)


# ---------------------------------------------------------------- real libcuda


@pytest.mark.parametrize("version", ["535.261.03", "550.163.01", "555.58.02"])
def test_real_debian_libcuda(version):
    from tests.support.debs import libcuda

    path = libcuda(version)
    size = os.path.getsize(path)
    assert size > 20 * 1024 * 1024  # the real 28 MB library, not a stub
    with open(path, "rb", buffering=0) as raw:
        reader = CountingReader(raw)
        info = inspect_elf(reader)
    assert info.error is None
    assert info.elf_class == 64
    assert info.machine == "EM_X86_64"
    assert info.elf_type == "ET_DYN"
    assert info.byte_order == "little"
    assert info.soname == "libcuda.so.1"
    # Debian's 535/550/555 have no fwd-compat note (docs/background.md "The ELF note").
    assert info.note is None
    assert info.note_error is None
    assert info.loadable_for("EM_X86_64") is None
    assert info.loadable_for("EM_AARCH64") == "elf_machine"
    assert reader.bytes_read < 1024 * 1024
    assert reader.unbounded_reads == 0
