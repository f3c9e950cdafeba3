"""A small, pure-Python ELF generator for test fixtures.

It writes shared-object stubs shaped like NVIDIA's ``testdata/compat``
fixtures (docs/background.md "The NVIDIA toolkit"): an ELF header, optional ``.note.gnu.build-id``,
``.note.cuda.fwd_compatibility`` (SHT_NOTE, flag A, align 4), and
``.shstrtab``. With a SONAME it also adds ``.dynamic`` + ``.dynstr`` and the
two program headers a loader-ish tool needs to find them (PT_LOAD covering the
file at vaddr 0, PT_DYNAMIC), so ``readelf -d`` and ``ldconfig -n`` read the
SONAME like they would from a real library. Virtual addresses equal file
offsets, which keeps the DT_STRTAB pointer trivial.

The files are only ever *inspected* (pyelftools, readelf, ldconfig); they
contain no code and must never be dlopen()ed.

With ``soname=None`` the layout is byte-for-byte the size of NVIDIA's fixtures
(560 bytes for the 575/590 notes, 488 for the Orin overrun), which the tests
check as a sanity test of the layout.
"""

from __future__ import annotations

import hashlib
import os
import struct

__all__ = [
    "NOTE_575",
    "NOTE_590",
    "NOTE_ORIN",
    "NOTE_INVALID",
    "NOTE_NAME",
    "make_elf",
    "note_bytes",
    "orin_overrun_elf",
    "write",
]

NOTE_575 = '{"format":1,"CUDA version":"12.9","driver":[535,550,560,565,570,575],"device":[1,2,7,8,9,10,11,12,13,14]}'
NOTE_590 = '{"format":1,"CUDA version":"13.1","driver":[535,550,570,575,580,590],"device":[1,2,7,8,9,10,11,12,13,14]}'
NOTE_ORIN = '{"format":1,"CUDA version":"13.2"}'
NOTE_INVALID = '{"format":1,"CUDA version":"13.2",}'

NOTE_NAME = ".note.cuda.fwd_compatibility"

_MACHINES = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "ppc64": 21, "i386": 3, "arm": 40}

# Section types / flags / dynamic tags / segment types used below.
_SHT_PROGBITS, _SHT_STRTAB, _SHT_DYNAMIC, _SHT_NOTE = 1, 3, 6, 7
_SHF_WRITE, _SHF_ALLOC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME, _DT_STRSZ = 0, 5, 14, 10
_PT_LOAD, _PT_DYNAMIC = 1, 2
_PF_R, _PF_W = 4, 2


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a if a > 1 else n


def _note(owner: bytes, desc: bytes, ntype: int, bo: str, *, namesz=None, descsz=None) -> bytes:
    """One Nhdr + owner + desc, each padded to 4 (the ELF note alignment NVIDIA uses)."""
    name = owner + b"\0" if owner else b""
    nsz = len(name) if namesz is None else namesz
    dsz = len(desc) if descsz is None else descsz
    body = struct.pack(bo + "III", nsz, dsz, ntype)
    body += name + b"\0" * (_align(len(name), 4) - len(name))
    body += desc + b"\0" * (_align(len(desc), 4) - len(desc))
    return body


def note_bytes(payload: str | bytes, *, owner: bytes = b"NVIDIA Corporation", byte_order: str = "little", ntype: int = 0) -> bytes:
    """One complete note (Nhdr, owner, NUL-terminated payload), 4-aligned: for ``extra_sections``."""
    data = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
    return _note(owner, data + b"\0", ntype, "<" if byte_order == "little" else ">")


def make_elf(
    *,
    machine="x86_64",
    elf_class: int = 64,
    byte_order: str = "little",
    elf_type: int = 3,
    soname: str | None = "libcuda.so.1",
    note_json: str | bytes | None = None,
    note_owner: bytes = b"NVIDIA Corporation",
    note_namesz: int | None = None,
    note_descsz: int | None = None,
    note_section_size: int | None = None,
    note_type: int = 0,
    extra_sections=(),
    shnum_override: int | None = None,
    shoff_override: int | None = None,
    shentsize_override: int | None = None,
    shstrndx_override: int | None = None,
    build_id: bool = True,
) -> bytes:
    """Return the bytes of a small ELF shared object.

    machine: "x86_64" | "aarch64" | "ppc64le" | "i386" | "arm" or a raw e_machine int.
    note_json: the descriptor payload (JSON text); it is NUL-terminated and
      NUL-padded to 4, and descsz counts the NUL, as in NVIDIA's files.
      ``None`` leaves the note section out.
    note_namesz / note_descsz: override the declared sizes (0, or an overrun).
    note_section_size: override the note section's sh_size (the bytes written
      stay the same; the next section still starts after them).
    extra_sections: iterable of ``(name, sh_type, data)`` added after the note.
    shnum/shoff/shentsize/shstrndx_override: write those raw values into the
      ELF header, for robustness tests.
    """
    if elf_class not in (32, 64):
        raise ValueError("elf_class must be 32 or 64")
    if byte_order not in ("little", "big"):
        raise ValueError("byte_order must be 'little' or 'big'")
    bo = "<" if byte_order == "little" else ">"
    e_machine = machine if isinstance(machine, int) else _MACHINES[machine]
    is64 = elf_class == 64
    ehsize, phentsize, shentsize = (64, 56, 64) if is64 else (52, 32, 40)
    dynent = 16 if is64 else 8
    word_align = 8 if is64 else 4

    # (name, type, flags, data, align, entsize, link, size_override)
    sections: list[list] = []
    if build_id:
        seed = note_json.encode() if isinstance(note_json, str) else (note_json or b"")
        digest = hashlib.sha1(b"compat-hook elfgen" + seed + bytes([e_machine & 0xFF])).digest()
        sections.append([".note.gnu.build-id", _SHT_NOTE, _SHF_ALLOC, _note(b"GNU", digest, 3, bo), 4, 0, 0, None])
    if note_json is not None:
        payload = note_json.encode("utf-8") if isinstance(note_json, str) else bytes(note_json)
        desc = payload + b"\0"
        data = _note(note_owner, desc, note_type, bo, namesz=note_namesz, descsz=note_descsz)
        sections.append([NOTE_NAME, _SHT_NOTE, _SHF_ALLOC, data, 4, 0, 0, note_section_size])
    for name, sh_type, data in extra_sections:
        sections.append([name, sh_type, 0, bytes(data), 1, 0, 0, None])
    dyn_index = None
    if soname is not None:
        dynstr = b"\0" + soname.encode("utf-8") + b"\0"
        sections.append([".dynstr", _SHT_STRTAB, _SHF_ALLOC, dynstr, 1, 0, 0, None])
        dynstr_index = len(sections)  # +1 for the NULL section, -1 for the list index
        # .dynamic is a placeholder of its final size (4 entries), filled in once .dynstr's offset is known.
        placeholder = b"\0" * (4 * dynent)
        sections.append([".dynamic", _SHT_DYNAMIC, _SHF_ALLOC | _SHF_WRITE, placeholder, word_align, dynent, dynstr_index, None])
        dyn_index = len(sections) - 1

    names = [s[0] for s in sections] + [".shstrtab"]
    shstrtab = b"\0"
    name_off = {}
    for n in names:
        name_off[n] = len(shstrtab)
        shstrtab += n.encode() + b"\0"
    sections.append([".shstrtab", _SHT_STRTAB, 0, shstrtab, 1, 0, 0, None])

    phnum = 2 if soname is not None else 0
    off = ehsize + phnum * phentsize
    offsets = []
    for s in sections:
        off = _align(off, s[4])
        offsets.append(off)
        off += len(s[3])
    shoff = _align(off, word_align)
    total = shoff + (len(sections) + 1) * shentsize

    xword = "Q" if is64 else "I"
    if dyn_index is not None:
        dynstr_off = offsets[dyn_index - 1]
        dynstr_len = len(sections[dyn_index - 1][3])
        sections[dyn_index][3] = b"".join(
            struct.pack(bo + xword * 2, tag, val)
            for tag, val in ((_DT_SONAME, 1), (_DT_STRTAB, dynstr_off), (_DT_STRSZ, dynstr_len), (_DT_NULL, 0))
        )

    out = bytearray(total)
    ident = b"\x7fELF" + bytes([1 if not is64 else 2, 1 if bo == "<" else 2, 1, 0]) + b"\0" * 8
    out[0:16] = ident
    shnum = len(sections) + 1
    fields = (
        elf_type, e_machine, 1,  # e_type, e_machine, e_version
        0,  # e_entry
        ehsize if phnum else 0,  # e_phoff
        shoff if shoff_override is None else shoff_override,
        0,  # e_flags
        ehsize, phentsize if phnum else 0, phnum,
        shentsize if shentsize_override is None else shentsize_override,
        shnum if shnum_override is None else shnum_override,
        shnum - 1 if shstrndx_override is None else shstrndx_override,
    )
    struct.pack_into(bo + "HHI" + xword * 3 + "IHHHHHH", out, 16, *fields)

    if phnum:
        dyn_off, dyn_len = offsets[dyn_index], len(sections[dyn_index][3])
        phdrs = ((_PT_LOAD, _PF_R | _PF_W, 0, total, 0x1000), (_PT_DYNAMIC, _PF_R | _PF_W, dyn_off, dyn_len, word_align))
        for i, (ptype, flags, poff, size, palign) in enumerate(phdrs):
            at = ehsize + i * phentsize
            if is64:
                struct.pack_into(bo + "IIQQQQQQ", out, at, ptype, flags, poff, poff, poff, size, size, palign)
            else:
                struct.pack_into(bo + "IIIIIIII", out, at, ptype, poff, poff, poff, size, size, flags, palign)

    for s, o in zip(sections, offsets):
        out[o:o + len(s[3])] = s[3]

    shfmt = bo + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
    # Index 0 is the NULL section (all zeros, already there).
    for i, (s, o) in enumerate(zip(sections, offsets), start=1):
        name, sh_type, flags, data, align, entsize, link, size_override = s
        size = len(data) if size_override is None else size_override
        addr = o if flags & _SHF_ALLOC else 0
        struct.pack_into(shfmt, out, shoff + i * shentsize, name_off[name], sh_type, flags, addr, o, size, link, 0, align, entsize)
    return bytes(out)


def orin_overrun_elf(note_json: str | bytes = NOTE_ORIN) -> bytes:
    """Like NVIDIA's ``libcuda.orin.13.2.1.so.1.1`` (488 bytes, AArch64).

    The note declares descsz 41, but the section (sh_size 71 = 12 + 20 + 39)
    holds only 39 descriptor bytes: the payload, NUL-padded to 39. A reader
    must clamp the descriptor to the section end (docs/background.md "The ELF note").
    """
    payload = note_json.encode("utf-8") if isinstance(note_json, str) else bytes(note_json)
    if len(payload) >= 39:
        raise ValueError("payload must be shorter than the 39 descriptor bytes in the section")
    # make_elf appends one NUL; pad the rest so the section holds exactly 39 desc bytes.
    desc_in_section = payload + b"\0" * (38 - len(payload))
    return make_elf(
        machine="aarch64",
        soname=None,
        note_json=desc_in_section,
        note_descsz=41,
        note_section_size=12 + 20 + 39,
    )


def write(path, data: bytes):
    """Write ``data`` to ``path`` (a str or os.PathLike) and return ``path``."""
    with open(path, "wb") as f:
        f.write(data)
    return path


if __name__ == "__main__":  # pragma: no cover - manual helper
    import sys

    out = sys.argv[1] if len(sys.argv) > 1 else os.devnull
    write(out, make_elf(note_json=NOTE_575))
