"""What an ELF inspection found, as plain data: :class:`ElfInfo` and its :class:`CompatNote`.

The classes :func:`compat_hook.facts.elfnote.inspect_elf` returns and the
state-dir cache stores (``to_dict`` / ``from_dict``), and the host
architecture -> ``e_machine`` table. Apart from the reader, so that a
container start whose library facts come from the cache (or that has no
candidate at all) loads these few classes and not the ELF reader: ~0.3 ms of
the hook's start (``elfnote`` and the ``struct`` it needs, ``python3 -X
importtime`` on the hook's argv, benchmarks/README.md).
:mod:`compat_hook.facts.elfnote` re-exports every public name here.

>>> machine_for_arch("amd64"), machine_for_arch("riscv64")
('EM_X86_64', None)
>>> ElfInfo.from_dict(ElfInfo(elf_class=64, soname=LIBCUDA_SONAME).to_dict()).soname
'libcuda.so.1'
"""

from __future__ import annotations

__all__ = ["CompatNote", "ElfInfo", "HOST_MACHINES", "LIBCUDA_SONAME", "machine_for_arch"]

LIBCUDA_SONAME = "libcuda.so.1"

#: ``platform.machine()`` / GOARCH spellings -> pyelftools ``e_machine`` names.
HOST_MACHINES = {
    "x86_64": "EM_X86_64",
    "amd64": "EM_X86_64",
    "aarch64": "EM_AARCH64",
    "arm64": "EM_AARCH64",
    "ppc64le": "EM_PPC64",
}

_NOTE_KEYS = ("format", "cuda version", "driver", "device")
_NOTE_DICT_KEYS = frozenset(("format", "cuda_version", "driver", "device", "raw"))
_INFO_KEYS = frozenset(
    ("elf_class", "machine", "elf_type", "soname", "byte_order", "note", "note_error", "error")
)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _is_int(value) -> bool:
    # bool is a subclass of int in Python but not a JSON number: Go rejects
    # ``true`` for an int field, so do we. Go's int is 64-bit.
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _int_list(value, key: str):
    if value is None:  # JSON null: Go leaves the field nil, no error.
        return None
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise ValueError(f"note key {key!r} is not a list of integers")
    return list(value)


def _note_from_json(obj) -> CompatNote:
    """Build a :class:`CompatNote` from the parsed JSON value; ValueError if invalid."""
    if not isinstance(obj, dict):
        raise ValueError("note JSON is not an object")
    found = {}
    for key in obj:
        if not isinstance(key, str):
            raise ValueError("note JSON has a non-string key")
        # casefold() is closer than lower() to Go's case-insensitive field
        # matching (it folds the Kelvin sign and long s as Go does).
        folded = key.casefold()
        if folded in _NOTE_KEYS:
            if folded in found:
                # "CUDA version" and "CUDA Version" together: Go would take
                # whichever comes last; refuse to guess.
                raise ValueError(f"note JSON has key {key!r} twice (keys are case-insensitive)")
            found[folded] = obj[key]
    fmt = found.get("format")
    if fmt is not None and not _is_int(fmt):
        raise ValueError("note key 'format' is not an integer")
    cuda = found.get("cuda version")
    if cuda is not None and not isinstance(cuda, str):
        raise ValueError("note key 'CUDA version' is not a string")
    # Strict on the lists: a half-valid "driver" list could make the decision
    # enable compat for a branch NVIDIA never listed; a note we cannot read
    # exactly is treated as absent, as NVIDIA's toolkit does.
    driver = _int_list(found.get("driver"), "driver")
    device = _int_list(found.get("device"), "device")
    return CompatNote(fmt, cuda, driver, device, obj)


class CompatNote:
    """The parsed ``.note.cuda.fwd_compatibility`` payload.

    ``format``: int or None; ``cuda_version``: the "CUDA version" string or
    None; ``driver`` / ``device``: lists of ints or None (absent on Orin);
    ``raw``: the whole JSON object, unknown keys included.
    """

    __slots__ = ("format", "cuda_version", "driver", "device", "raw")

    def __init__(self, format=None, cuda_version=None, driver=None, device=None, raw=None):
        self.format = format
        self.cuda_version = cuda_version
        self.driver = driver
        self.device = device
        self.raw = {} if raw is None else raw

    def to_dict(self) -> dict:
        """A JSON-serialisable dict; :meth:`from_dict` restores it."""
        return {
            "format": self.format,
            "cuda_version": self.cuda_version,
            "driver": None if self.driver is None else list(self.driver),
            "device": None if self.device is None else list(self.device),
            "raw": dict(self.raw),
        }

    @classmethod
    def from_dict(cls, d: dict) -> CompatNote:
        """Rebuild from :meth:`to_dict` output; ValueError if malformed.

        The fields are re-derived from ``raw`` with the same rules as a note
        read from a file, so a tampered cache entry cannot smuggle in values
        the parser would have refused; the stored fields must agree with them.
        """
        if not isinstance(d, dict) or set(d) != _NOTE_DICT_KEYS:
            raise ValueError("compat note: expected keys " + ", ".join(sorted(_NOTE_DICT_KEYS)))
        note = _note_from_json(d["raw"])
        for name in ("format", "cuda_version", "driver", "device"):
            if not _same(d[name], getattr(note, name)):
                raise ValueError(f"compat note: {name!r} does not match raw")
        return note

    def __eq__(self, other):
        if not isinstance(other, CompatNote):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self) -> str:
        return (
            f"CompatNote(format={self.format!r}, cuda_version={self.cuda_version!r}, "
            f"driver={self.driver!r}, device={self.device!r})"
        )


def _same(a, b) -> bool:
    """Equality that does not confuse True with 1 (``[True] == [1]`` in Python)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _opt_str(d: dict, key: str):
    value = d[key]
    if value is not None and not isinstance(value, str):
        raise ValueError(f"elf info: {key!r} must be a string or null")
    return value


class ElfInfo:
    """What :func:`compat_hook.facts.elfnote.inspect_elf` found.

    ``elf_class``: 32 | 64 | None; ``machine``: pyelftools name (``"EM_X86_64"``,
    ``"EM_AARCH64"``, ``"EM_0x1234"`` when unknown) or None; ``elf_type``:
    ``"ET_DYN"`` etc. or None; ``soname``: DT_SONAME or None; ``byte_order``:
    ``"little"`` | ``"big"`` | None; ``note``: :class:`CompatNote` or None;
    ``note_error``: why a present note was refused (None when the note is
    fine *or* simply absent); ``error``: why the file is not a usable ELF
    (then ``note`` is None; fields read before the problem stay set).
    """

    __slots__ = ("elf_class", "machine", "elf_type", "soname", "note", "note_error", "error", "byte_order")

    def __init__(
        self,
        elf_class=None,
        machine=None,
        elf_type=None,
        soname=None,
        note=None,
        note_error=None,
        error=None,
        byte_order=None,
    ):
        self.elf_class = elf_class
        self.machine = machine
        self.elf_type = elf_type
        self.soname = soname
        self.note = note
        self.note_error = note_error
        self.error = error
        self.byte_order = byte_order

    def to_dict(self) -> dict:
        """A JSON-serialisable dict; :meth:`from_dict` restores it."""
        return {
            "elf_class": self.elf_class,
            "machine": self.machine,
            "elf_type": self.elf_type,
            "soname": self.soname,
            "byte_order": self.byte_order,
            "note": None if self.note is None else self.note.to_dict(),
            "note_error": self.note_error,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ElfInfo:
        """Rebuild from :meth:`to_dict` output (e.g. a cache entry); ValueError if malformed."""
        if not isinstance(d, dict) or set(d) != _INFO_KEYS:
            raise ValueError("elf info: expected keys " + ", ".join(sorted(_INFO_KEYS)))
        elf_class = d["elf_class"]
        if elf_class is not None and not (type(elf_class) is int and elf_class in (32, 64)):
            raise ValueError("elf info: 'elf_class' must be 32, 64 or null")
        byte_order = d["byte_order"]
        if byte_order not in (None, "little", "big"):
            raise ValueError("elf info: 'byte_order' must be 'little', 'big' or null")
        note = None if d["note"] is None else CompatNote.from_dict(d["note"])
        info = cls(
            elf_class=elf_class,
            machine=_opt_str(d, "machine"),
            elf_type=_opt_str(d, "elf_type"),
            soname=_opt_str(d, "soname"),
            note=note,
            note_error=_opt_str(d, "note_error"),
            error=_opt_str(d, "error"),
            byte_order=byte_order,
        )
        # inspect_elf never produces these combinations; a cache that has
        # them was edited or corrupted.
        if note is not None and (info.note_error is not None or info.error is not None):
            raise ValueError("elf info: a note cannot come with note_error or error")
        return info

    def loadable_for(self, host_machine: str) -> str | None:
        """None if the host loader could use this as ``libcuda.so.1``, else a reason code.

        Codes (stable, for logs): ``not_elf``, ``elf_class`` (not ELFCLASS64),
        ``elf_machine`` (not ``host_machine``, e.g. ``"EM_X86_64"``),
        ``elf_type`` (not ET_DYN), ``soname`` (a SONAME other than libcuda.so.1;
        none at all is accepted, as the loader then uses the file name).
        """
        if self.error is not None:
            return "not_elf"
        if self.elf_class != 64:
            return "elf_class"
        if self.machine != host_machine:
            return "elf_machine"
        if self.elf_type != "ET_DYN":
            return "elf_type"
        if self.soname is not None and self.soname != LIBCUDA_SONAME:
            return "soname"
        return None

    def __eq__(self, other):
        if not isinstance(other, ElfInfo):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"ElfInfo({fields})"


def machine_for_arch(arch: str) -> str | None:
    """The ``e_machine`` name for a host architecture (``"x86_64"`` -> ``"EM_X86_64"``), or None."""
    if not isinstance(arch, str):
        return None
    return HOST_MACHINES.get(arch.strip().lower())
