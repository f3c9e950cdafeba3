"""ELF inspection of a candidate compat ``libcuda`` (never dlopen()ed).

:func:`inspect_elf` reports what the loader would care about (class, machine,
type, SONAME) and the ``.note.cuda.fwd_compatibility`` note NVIDIA ships in
R575+ compat libraries (docs/background.md "The ELF note"). Note rules follow NVIDIA Container
Toolkit v1.20 (docs/background.md "The NVIDIA toolkit"), a little stricter:

- the first SHT_NOTE section named ``.note.cuda.fwd_compatibility``, first
  note only; namesz or descsz 0, or an owner other than ``NVIDIA Corporation``
  (NULs trimmed) means no note;
- the descriptor is clamped to the section end (NVIDIA's Orin library declares
  2 bytes more than its section holds), then to the file size, and capped at
  64 KiB; trailing NULs are trimmed; it must be UTF-8 JSON, an object;
- keys match case-insensitively; a key of the wrong type invalidates the note
  (Go's ``json.Unmarshal`` into NVIDIA's typed struct fails the same way).

Cost and safety: the hook runs on every container start, so this module keeps
its module-level imports to ``os``, ``struct`` and the plain data classes
(:mod:`compat_hook.facts.elfinfo`, all a cache hit needs) and imports pyelftools only
inside :func:`inspect_elf`, and only once the file has passed the cheap
magic/class checks (NVIDIA's own tests use 0-byte libraries). pyelftools is
used only to *decode* bytes (``ELFStructs``); every read is ours, bounded and
checked against the file size first, because ``ELFFile`` happily follows
hostile header fields (``e_shnum`` from section 0, ``.dynamic`` without
DT_NULL up to EOF, C strings up to EOF, ``sh_link`` recursion).
"""

from __future__ import annotations

import os
import struct

from .elfinfo import HOST_MACHINES, LIBCUDA_SONAME, CompatNote, ElfInfo, _note_from_json, machine_for_arch

__all__ = [
    "CompatNote",
    "ElfInfo",
    "HOST_MACHINES",
    "LIBCUDA_SONAME",
    "NOTE_OWNER",
    "NOTE_SECTION",
    "inspect_elf",
    "machine_for_arch",
]

NOTE_SECTION = ".note.cuda.fwd_compatibility"
NOTE_OWNER = "NVIDIA Corporation"

# Read limits. A real libcuda is ~28 MB, but its section table is ~40 entries,
# .shstrtab a few hundred bytes and NVIDIA's note ~100 bytes; anything far
# beyond these is hostile or broken, and must not cost memory or time.
_MAX_DESC = 64 * 1024
_MAX_SECTIONS = 4096
_MAX_STRTAB = 1024 * 1024
_MAX_DYN_ENTRIES = 4096
_MAX_OWNER = 4096
_MAX_SONAME = 4096

_NHDR_SIZE = 12
_SHN_XINDEX = 0xFFFF
_ELF_MAGIC = b"\x7fELF"


class _Bad(Exception):
    """An input problem that makes the file unusable as an ELF; its message goes to ``error``."""


def _loads(text: str):
    # ValueError on invalid JSON. Imported here, not at module level, because
    # only files that carry a note need it.
    from ..core import jsonfast

    return jsonfast.loads(text)


def _file_size(f) -> int:
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        # No descriptor (BytesIO, a wrapper): the stream end is the size.
        return f.seek(0, os.SEEK_END)


def _read_at(f, offset: int, n: int) -> bytes:
    """Up to ``n`` bytes at ``offset`` (fewer only at EOF); callers bound ``n``."""
    f.seek(offset)
    chunks = []
    while n > 0:
        chunk = f.read(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _enum_name(value, prefix: str) -> str:
    # pyelftools returns the raw int for values it has no name for.
    return value if isinstance(value, str) else f"{prefix}_{value:#x}"


def inspect_elf(f) -> ElfInfo:
    """Inspect a candidate compat libcuda through ``f``.

    ``f``: a binary file object, opened read-only and seekable (the caller
    opened it safely inside the container root; it is never reopened by
    path). Only the ELF header, the section table, ``.shstrtab``, the note
    and ``.dynamic``/``.dynstr`` are read, a few KB for a 28 MB libcuda. The
    file position is left anywhere.

    Never raises for bad input: every problem lands in ``.error`` (not a
    usable ELF) or ``.note_error`` (an ELF whose note was refused).
    """
    info = ElfInfo()
    try:
        size = _file_size(f)
        head = _read_at(f, 0, 64) if size > 0 else b""
    except (OSError, ValueError) as exc:
        info.error = f"cannot read file: {exc}"
        return info
    if not _check_ident(head, info):
        return info

    # Only now pay for pyelftools' import (docs/design.md, "Hot path rules").
    # import_dep also finds it when the hook runs as `python3 -I -S`.
    from ..core._deps import import_dep

    import_dep("elftools")
    from elftools.common.exceptions import ELFError
    from elftools.construct import ConstructError

    # Only what hostile bytes can raise becomes "unparseable": pyelftools' own
    # errors while decoding a header, struct.error and ValueError. Anything
    # else (AttributeError, TypeError, KeyError, ...) is a bug of ours and must
    # reach the entry point's fail-open handler as one, not hide as a bad file.
    try:
        _inspect(f, head, size, info)
    except _Bad as exc:
        info.error = str(exc)
        info.note = None
    except OSError as exc:  # the file itself failed us (EIO, a FUSE-backed layer)
        info.error = f"cannot read file: {exc}"
        info.note = None
    except (ELFError, ConstructError, struct.error, ValueError) as exc:
        info.error = f"unparseable ELF ({exc.__class__.__name__}: {exc})"
        info.note = None
    return info


def _check_ident(head: bytes, info: ElfInfo) -> bool:
    """Check e_ident and the header length without pyelftools; False (and .error) if unusable."""
    if not head:
        info.error = "empty file"
        return False
    if head[:4] != _ELF_MAGIC:
        info.error = "truncated ELF header" if _ELF_MAGIC.startswith(head) else "not an ELF file"
        return False
    if len(head) < 6:
        info.error = "truncated ELF header"
        return False
    if head[4] not in (1, 2):
        info.error = f"unsupported ELF class {head[4]}"
        return False
    if head[5] not in (1, 2):
        info.error = f"unsupported ELF byte order {head[5]}"
        return False
    info.elf_class = 32 if head[4] == 1 else 64
    info.byte_order = "little" if head[5] == 1 else "big"
    if len(head) < (52 if info.elf_class == 32 else 64):
        info.error = "truncated ELF header"
        return False
    return True


def _inspect(f, head: bytes, size: int, info: ElfInfo) -> None:
    from elftools.elf.structs import ELFStructs

    little = info.byte_order == "little"
    structs = ELFStructs(little_endian=little, elfclass=info.elf_class)
    structs.create_basic_structs()
    ehdr = structs.Elf_Ehdr.parse(head)
    structs.create_advanced_structs(ehdr["e_type"], ehdr["e_machine"], ehdr["e_ident"]["EI_OSABI"])
    info.elf_type = _enum_name(ehdr["e_type"], "ET")
    info.machine = _enum_name(ehdr["e_machine"], "EM")

    headers = _section_headers(f, ehdr, structs, size)
    if not headers:
        return  # no section table: no note, no SONAME to find by section

    shstrndx = ehdr["e_shstrndx"]
    if shstrndx == _SHN_XINDEX:
        shstrndx = headers[0]["sh_link"]
    names = b""
    if shstrndx != 0:
        if shstrndx >= len(headers):
            raise _Bad("section name table index out of range")
        strtab = headers[shstrndx]
        if strtab["sh_type"] != "SHT_STRTAB":
            raise _Bad("section name table is not SHT_STRTAB")
        names = _section_bytes(f, strtab, size, _MAX_STRTAB, "section name table")

    note_hdr = dyn_hdr = None
    wanted = NOTE_SECTION.encode()
    for h in headers:
        if note_hdr is None and h["sh_type"] == "SHT_NOTE" and _name(names, h["sh_name"]) == wanted:
            note_hdr = h
        if dyn_hdr is None and h["sh_type"] == "SHT_DYNAMIC":
            dyn_hdr = h
    if note_hdr is not None:
        _read_note(f, note_hdr, size, "<" if little else ">", info)
    if dyn_hdr is not None:
        info.soname = _read_soname(f, dyn_hdr, headers, structs, size)


def _section_headers(f, ehdr, structs, size: int) -> list:
    """All section headers, after checking the table fits in the file."""
    shoff = ehdr["e_shoff"]
    if shoff == 0:
        return []
    entsize = structs.Elf_Shdr.sizeof()
    if ehdr["e_shentsize"] != entsize:
        raise _Bad(f"bad section header size {ehdr['e_shentsize']}")
    if shoff > size - entsize:
        raise _Bad("section table out of range")
    count = ehdr["e_shnum"]
    if count == 0:
        # Extended numbering: the real count is section 0's sh_size. This is
        # where pyelftools' ELFFile would iterate 2**64 sections.
        count = structs.Elf_Shdr.parse(_read_at(f, shoff, entsize))["sh_size"]
        if count == 0:
            return []
    if count > (size - shoff) // entsize:
        raise _Bad("section table out of range")
    if count > _MAX_SECTIONS:
        raise _Bad(f"too many sections ({count})")
    table = _read_at(f, shoff, count * entsize)
    if len(table) != count * entsize:
        raise _Bad("section table out of range")  # the file shrank under us
    parse = structs.Elf_Shdr.parse
    return [parse(table[i : i + entsize]) for i in range(0, len(table), entsize)]


def _section_bytes(f, h, size: int, limit: int, what: str) -> bytes:
    """A whole section's bytes; it must lie inside the file and be at most ``limit``."""
    off, length = h["sh_offset"], h["sh_size"]
    if off > size or length > size - off:
        raise _Bad(f"{what} out of range")
    if length > limit:
        raise _Bad(f"{what} too large ({length} bytes)")
    return _read_at(f, off, length)


def _name(names: bytes, offset: int) -> bytes | None:
    if offset >= len(names):
        return None
    end = names.find(b"\0", offset)
    return names[offset:] if end < 0 else names[offset:end]


def _read_note(f, h, size: int, bo: str, info: ElfInfo) -> None:
    """Parse the first note of the section into ``info.note`` / ``info.note_error``."""
    off = h["sh_offset"]
    if off >= size:
        info.note_error = f"{NOTE_SECTION} lies outside the file"
        return
    # Clamp the section to the file: a short file must not make us read past EOF.
    avail = min(h["sh_size"], size - off)
    if avail < _NHDR_SIZE:
        info.note_error = f"{NOTE_SECTION} is too small for a note header"
        return
    namesz, descsz, _ntype = struct.unpack(bo + "III", _read_at(f, off, _NHDR_SIZE))
    if namesz == 0 or descsz == 0:
        info.note_error = "note has an empty name or descriptor"
        return
    if namesz > avail - _NHDR_SIZE:
        info.note_error = "note name overruns the section"
        return
    owner_error = f"note owner is not {NOTE_OWNER}"
    if namesz > _MAX_OWNER:
        info.note_error = owner_error
        return
    if _read_at(f, off + _NHDR_SIZE, namesz).rstrip(b"\0") != NOTE_OWNER.encode():
        info.note_error = owner_error
        return
    # Notes are 4-aligned (NVIDIA's section is align 4); readelf uses 8 for
    # an 8-aligned section, and so do we.
    align = 8 if h["sh_addralign"] == 8 else 4
    desc_off = _NHDR_SIZE + (namesz + align - 1) // align * align
    # The Orin rule: trust the section end over descsz.
    desc_len = min(descsz, avail - desc_off)
    if desc_len <= 0:
        info.note_error = "note descriptor lies outside the section"
        return
    if desc_len > _MAX_DESC:
        info.note_error = f"note descriptor is larger than {_MAX_DESC // 1024} KiB"
        return
    desc = _read_at(f, off + desc_off, desc_len).rstrip(b"\0")
    try:
        text = desc.decode("utf-8")
    except UnicodeDecodeError:
        info.note_error = "note descriptor is not valid UTF-8"
        return
    try:
        obj = _loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested deeply
        detail = str(exc)
        if detail.startswith("invalid JSON: "):  # jsonfast's prefix; do not say it twice
            detail = detail[len("invalid JSON: "):]
        info.note_error = f"invalid JSON in {NOTE_SECTION}: {detail}"
        return
    try:
        info.note = _note_from_json(obj)
    except ValueError as exc:
        info.note_error = str(exc)


def _read_soname(f, dyn, headers: list, structs, size: int) -> str | None:
    """DT_SONAME of the first SHT_DYNAMIC section, resolved through its sh_link string table."""
    entsize = structs.Elf_Dyn.sizeof()
    off, length = dyn["sh_offset"], dyn["sh_size"]
    if off > size or length > size - off:
        raise _Bad("dynamic section out of range")
    # DT_SONAME comes early in real libraries; never walk more than the cap
    # (pyelftools would walk to EOF looking for DT_NULL).
    count = min(length // entsize, _MAX_DYN_ENTRIES)
    data = _read_at(f, off, count * entsize)
    soname_off = None
    parse = structs.Elf_Dyn.parse
    for i in range(0, len(data) - entsize + 1, entsize):
        entry = parse(data[i : i + entsize])
        tag = entry["d_tag"]
        if tag == "DT_NULL":
            break
        if tag == "DT_SONAME":
            soname_off = entry["d_val"]
            break
    if soname_off is None:
        return None
    link = dyn["sh_link"]
    if not 0 < link < len(headers) or headers[link]["sh_type"] != "SHT_STRTAB":
        raise _Bad("dynamic section has no valid string table link")
    strtab = headers[link]
    st_off, st_len = strtab["sh_offset"], strtab["sh_size"]
    if st_off > size or st_len > size - st_off:
        raise _Bad("dynamic string table out of range")
    if soname_off >= st_len:
        raise _Bad("SONAME lies outside the dynamic string table")
    raw = _read_at(f, st_off + soname_off, min(st_len - soname_off, _MAX_SONAME))
    end = raw.find(b"\0")
    if end < 0:
        raise _Bad("SONAME is not NUL-terminated")
    return raw[:end].decode("utf-8", errors="replace")
