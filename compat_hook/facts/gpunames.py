"""GPU names as operators type them, for ``plan --gpu``: brand and compute capability per name.

Three forms are accepted, told apart by their spelling:

* an NVML product name, as ``nvidia-smi -L`` prints it: ``NVIDIA H100 80GB HBM3``,
  ``Tesla V100-SXM2-16GB``, ``NVIDIA GeForce RTX 4090``;
* a GPU Feature Discovery ``nvidia.com/gpu.product`` label value: the NVML name
  with ``-`` for spaces, and ``-MIG-<profile>`` (a MIG slice) or ``-SHARED``
  (time-slicing) appended: ``NVIDIA-H100-80GB-HBM3-MIG-1g.10gb``;
* a short model name: ``H100``, ``A100``, ``L40S``, ``T4``, ``RTX 4090``,
  ``RTX A6000``, ``RTX 6000 Ada``.

A name is matched on its model tokens (vendor words such as ``NVIDIA`` and
``Tesla`` dropped, memory and form-factor tokens after the model ignored)
against :data:`MODELS`; GeForce, TITAN, Quadro and Tesla names and GeForce-style
``RTX <D0N0>`` numbers (2060 ... 5090) are recognised by their family even
when the model is not in the table (their brand is what the compat checks
need; the compute capability is then unknown). Anything else is
:class:`UnknownGpuName`: a guessed brand would turn into a wrong prediction
(``UNKNOWN`` makes the device check fail, which ``plan`` would report as a
breakage that is not there).

The brand is what :func:`compat_hook.facts.hostfacts.brand_from_model` gives the
NVML-style name, the same rule the hook applies to ``/proc`` model names.
The compute capability is what the R590+ architecture check
(``gpu_arch_unsupported``: below 7.5) reads.

The *architecture* (Kepler ... Blackwell) is what decides which driver
branches drive a GPU (:mod:`compat_hook.facts.gpusupport`). It comes from the
compute capability (:func:`architecture`), from a PCI device ID
(:func:`architecture_of_pci`: NVIDIA numbers its chips in blocks, one block per
chip family), or, for a name whose compute capability is not in the table,
from its family's letter (``Tesla K80``, ``Quadro P4000``: K Kepler, M Maxwell,
P Pascal, V Volta, T Turing). Tegra parts (Jetson) have none here: their
drivers are not the desktop branches.

>>> architecture((9, 0)), architecture((8, 7)), architecture_of_pci(0x1DB1), architecture_of_pci(0x2330)
('Hopper', None, 'Volta', 'Hopper')
>>> resolve("Tesla K20Xm").architecture, resolve("Quadro M4000").architecture
('Kepler', 'Maxwell')

>>> g = resolve("H100"); g.model, g.brand_name, g.compute_capability
('NVIDIA H100', 'NVIDIA', (9, 0))
>>> g = resolve("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"); g.model, g.compute_capability, g.form
('NVIDIA A100 SXM4 40GB', (8, 0), 'gfd')
>>> resolve("RTX 4090").brand_name, resolve("Tesla V100-SXM2-16GB").compute_capability
('GEFORCE', (7, 0))
>>> resolve("NVIDIA GeForce GTX 1650").brand_name
'GEFORCE'
>>> resolve("H1OO")
Traceback (most recent call last):
    ...
compat_hook.facts.gpunames.UnknownGpuName: --gpu 'H1OO': not a GPU name compat-hook knows; give an NVML name (NVIDIA H100 80GB HBM3), a GFD nvidia.com/gpu.product value (NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-40GB-MIG-1g.5gb) or a model name (H100, H200, A100, A10, A30, L4, L40, L40S, T4, V100, B200, GB200, RTX 4090, RTX A6000, RTX 6000 Ada, GeForce ..., Quadro ..., TITAN ...)
"""

from __future__ import annotations

from ..core.errors import UsageError

__all__ = ["GpuName", "UnknownGpuName", "resolve", "MODELS", "ACCEPTED", "architecture", "architecture_of_pci",
           "PCI_BLOCKS"]

#: One line naming the accepted forms (in the error for a name not known).
ACCEPTED = ("an NVML name (NVIDIA H100 80GB HBM3), a GFD nvidia.com/gpu.product value "
            "(NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-40GB-MIG-1g.5gb) or a model name (H100, H200, A100, "
            "A10, A30, L4, L40, L40S, T4, V100, B200, GB200, RTX 4090, RTX A6000, RTX 6000 Ada, "
            "GeForce ..., Quadro ..., TITAN ...)")

#: model tokens -> (NVML-style name, compute capability). Data-center and
#: professional boards; the NVML name carries the vendor word NVML prints
#: (``Tesla`` up to Turing, ``NVIDIA`` since Ampere), which is what sets the brand.
MODELS = {
    # data center
    "k10": ("Tesla K10", (3, 0)), "k20": ("Tesla K20", (3, 5)), "k20x": ("Tesla K20X", (3, 5)),
    "k40": ("Tesla K40", (3, 5)), "k80": ("Tesla K80", (3, 7)),
    "m4": ("Tesla M4", (5, 2)), "m6": ("Tesla M6", (5, 2)), "m10": ("Tesla M10", (5, 0)),
    "m60": ("Tesla M60", (5, 2)), "m40": ("Tesla M40", (5, 2)),
    "p100": ("Tesla P100", (6, 0)), "p40": ("Tesla P40", (6, 1)), "p4": ("Tesla P4", (6, 1)),
    "p6": ("Tesla P6", (6, 1)),
    "v100": ("Tesla V100", (7, 0)), "v100s": ("Tesla V100S", (7, 0)), "t4": ("Tesla T4", (7, 5)),
    "a100": ("NVIDIA A100", (8, 0)), "a800": ("NVIDIA A800", (8, 0)), "a30": ("NVIDIA A30", (8, 0)),
    "a10": ("NVIDIA A10", (8, 6)), "a10g": ("NVIDIA A10G", (8, 6)), "a16": ("NVIDIA A16", (8, 6)),
    "a2": ("NVIDIA A2", (8, 6)), "a40": ("NVIDIA A40", (8, 6)),
    "l4": ("NVIDIA L4", (8, 9)), "l20": ("NVIDIA L20", (8, 9)), "l40": ("NVIDIA L40", (8, 9)),
    "l40s": ("NVIDIA L40S", (8, 9)),
    "h100": ("NVIDIA H100", (9, 0)), "h800": ("NVIDIA H800", (9, 0)), "h200": ("NVIDIA H200", (9, 0)),
    "h20": ("NVIDIA H20", (9, 0)), "gh200": ("NVIDIA GH200", (9, 0)),
    "b100": ("NVIDIA B100", (10, 0)), "b200": ("NVIDIA B200", (10, 0)), "gb200": ("NVIDIA GB200", (10, 0)),
    "b300": ("NVIDIA B300", (10, 3)), "gb300": ("NVIDIA GB300", (10, 3)), "gb10": ("NVIDIA GB10", (12, 1)),
    "orin": ("Orin", (8, 7)),
    # professional (RTX A-series: Ampere; "Ada": Ada Lovelace; Quadro RTX: Turing)
    "rtx a2000": ("NVIDIA RTX A2000", (8, 6)), "rtx a4000": ("NVIDIA RTX A4000", (8, 6)),
    "rtx a4500": ("NVIDIA RTX A4500", (8, 6)), "rtx a5000": ("NVIDIA RTX A5000", (8, 6)),
    "rtx a5500": ("NVIDIA RTX A5500", (8, 6)), "rtx a6000": ("NVIDIA RTX A6000", (8, 6)),
    "rtx 2000 ada": ("NVIDIA RTX 2000 Ada Generation", (8, 9)),
    "rtx 4000 ada": ("NVIDIA RTX 4000 Ada Generation", (8, 9)),
    "rtx 4500 ada": ("NVIDIA RTX 4500 Ada Generation", (8, 9)),
    "rtx 5000 ada": ("NVIDIA RTX 5000 Ada Generation", (8, 9)),
    "rtx 6000 ada": ("NVIDIA RTX 6000 Ada Generation", (8, 9)),
    "rtx 4000": ("Quadro RTX 4000", (7, 5)), "rtx 5000": ("Quadro RTX 5000", (7, 5)),
    "rtx 6000": ("Quadro RTX 6000", (7, 5)), "rtx 8000": ("Quadro RTX 8000", (7, 5)),
    "rtx pro 6000": ("NVIDIA RTX PRO 6000 Blackwell", (12, 0)),
    "titan v": ("NVIDIA TITAN V", (7, 0)), "titan rtx": ("NVIDIA TITAN RTX", (7, 5)),
    "titan xp": ("NVIDIA TITAN Xp", (6, 1)),
}

#: Words that say who made or sells the board, not which model it is.
_VENDOR = ("nvidia", "tesla")
#: GeForce RTX generation (first digit) -> compute capability.
_GEFORCE_RTX_CC = {"2": (7, 5), "3": (8, 6), "4": (8, 9), "5": (12, 0)}

#: Compute capability -> architecture, for the GPUs the desktop and data-center driver
#: branches drive (NVIDIA's "CUDA Toolkit, Driver, and Architecture Matrix",
#: docs/background.md "GPU architectures and driver branches"). Tegra parts are left
#: out on purpose (3.2, 5.3, 6.2, 7.2, 8.7, Thor's 10.1 / 11.0): Jetson's drivers
#: are not numbered like the desktop branches.
_CC_ARCH = {
    (2, 0): "Fermi", (2, 1): "Fermi",
    (3, 0): "Kepler", (3, 5): "Kepler", (3, 7): "Kepler",
    (5, 0): "Maxwell", (5, 2): "Maxwell",
    (6, 0): "Pascal", (6, 1): "Pascal",
    (7, 0): "Volta",
    (7, 5): "Turing",
    (8, 0): "Ampere", (8, 6): "Ampere",
    (8, 9): "Ada",
    (9, 0): "Hopper",
    (10, 0): "Blackwell", (10, 3): "Blackwell", (12, 0): "Blackwell", (12, 1): "Blackwell",
}

#: PCI device ID blocks (NVIDIA, vendor 0x10de) -> architecture: ``(first, last, architecture)``.
#: NVIDIA hands out device IDs in a block per chip family (GK104 0x1180-, GV100 0x1D80-,
#: GH100 0x2300-, ...), as the PCI ID database and the GPU tables of NVIDIA's driver README
#: list them; only display-class functions count (a chip's HDMI audio function has an ID
#: of its own outside these blocks). An ID outside every block has no architecture: a GPU
#: newer than this table is not guessed at.
PCI_BLOCKS = (
    (0x0FC0, 0x0FFF, "Kepler"),     # GK107
    (0x1000, 0x103F, "Kepler"),     # GK110, GK180, GK210 (Tesla K20/K40/K80)
    (0x1180, 0x11FF, "Kepler"),     # GK104, GK106 (Tesla K10, GRID K520)
    (0x1280, 0x12BF, "Kepler"),     # GK208
    (0x1340, 0x13FF, "Maxwell"),    # GM108, GM107, GM204 (Tesla M60)
    (0x1400, 0x143F, "Maxwell"),    # GM206 (Tesla M4)
    (0x15F0, 0x15FF, "Pascal"),     # GP100 (Tesla P100)
    (0x1610, 0x167F, "Maxwell"),    # GM204 mobile
    (0x1720, 0x172F, "Pascal"),     # GP100
    (0x1740, 0x17FF, "Maxwell"),    # GM108 mobile, GM107, GM200 (Tesla M40)
    (0x1B00, 0x1D7F, "Pascal"),     # GP102 .. GP108 (Tesla P40, P4)
    (0x1D80, 0x1DFF, "Volta"),      # GV100 (Tesla V100, TITAN V)
    (0x1E00, 0x1FFF, "Turing"),     # TU102, TU104 (Tesla T4), TU106, TU117
    (0x2080, 0x20FF, "Ampere"),     # GA100 (A100, A30, A800)
    (0x2180, 0x21FF, "Turing"),     # TU116
    (0x2200, 0x223F, "Ampere"),     # GA102 (A40, A10, RTX A6000)
    (0x2300, 0x23FF, "Hopper"),     # GH100 (H100, H200, GH200)
    (0x2400, 0x25FF, "Ampere"),     # GA103 .. GA107 (A16, A2)
    (0x2680, 0x28FF, "Ada"),        # AD102 .. AD107 (L40, L40S, L4, RTX 6000 Ada)
    (0x2900, 0x29FF, "Blackwell"),  # GB100 (B200, GB200)
    (0x2B00, 0x2FFF, "Blackwell"),  # GB202 .. GB207, GB10
    (0x3180, 0x31FF, "Blackwell"),  # GB110 (B300, GB300)
)

#: The letter a Tesla or Quadro model number starts with -> architecture (``K80``, ``P4000``).
_LETTER_ARCH = {"k": "Kepler", "m": "Maxwell", "p": "Pascal", "v": "Volta", "t": "Turing"}


def architecture(cc) -> str | None:
    """The architecture of a compute capability ``(major, minor)``; None for Tegra and unknown ones."""
    return _CC_ARCH.get(tuple(cc[:2])) if cc else None


def architecture_of_pci(device_id) -> str | None:
    """The architecture of an NVIDIA PCI device ID (an int, or text such as ``0x2330``), or None.

    >>> architecture_of_pci("0x1eb8"), architecture_of_pci(0x10f0), architecture_of_pci("banana")
    ('Turing', None, None)
    """
    if isinstance(device_id, str):
        try:
            device_id = int(device_id.strip(), 16)
        except ValueError:
            return None
    for first, last, arch in PCI_BLOCKS:
        if first <= device_id <= last:
            return arch
    return None


class UnknownGpuName(UsageError):
    """A ``--gpu`` name that is none of the accepted forms (exit 2, one line)."""


class GpuName:
    """What one ``--gpu`` name resolved to: ``model`` (NVML-style), ``brand``, ``compute_capability``,
    ``form`` and ``architecture`` (from the compute capability, else the family's model letter; or None)."""

    __slots__ = ("text", "model", "brand", "compute_capability", "form", "architecture")

    def __init__(self, text: str, model: str, brand: int, compute_capability, form: str,
                 arch: str | None = None) -> None:
        self.text, self.model, self.brand = text, model, brand
        self.compute_capability, self.form = compute_capability, form
        self.architecture = architecture(compute_capability) or arch

    @property
    def brand_name(self) -> str:
        from .hostfacts import BRAND_NAMES

        return BRAND_NAMES.get(self.brand, str(self.brand))


def _tokens(text: str) -> tuple:
    """``(form, words)``: the name's spelling and its lower-case words, GFD suffixes dropped.

    >>> _tokens("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED")
    ('gfd', ['nvidia', 'h100', '80gb', 'hbm3'])
    """
    t = text.strip()
    words = t.replace("-", " ").replace("_", " ").lower().split()
    form = "gfd" if "-" in t and " " not in t else \
        "nvml" if words[:1] and words[0] in ("nvidia", "tesla", "quadro", "geforce", "titan") else "short"
    if "mig" in words[1:]:        # -MIG-1g.10gb: a slice of the board named before it
        words = words[:words.index("mig", 1)]
    while words and words[-1] == "shared":  # GFD's time-slicing suffix
        words.pop()
    return form, words


def _geforce_rtx(number: str):
    """The compute capability of a GeForce ``RTX <D0N0>`` number (2060, 3090, 4090, 5080), or None.

    >>> _geforce_rtx("4090"), _geforce_rtx("6000"), _geforce_rtx("4500")
    ((8, 9), None, None)
    """
    if len(number) == 4 and number.isdigit() and number[1] == "0" and number[3] == "0" and number[2] in "56789":
        return _GEFORCE_RTX_CC.get(number[0])
    return None


def _display(text: str, form: str, words_kept: int) -> str:
    """The name as given, in NVML spelling (GFD dashes as spaces, the MIG / SHARED suffix dropped)."""
    parts = text.strip().replace("-", " ").replace("_", " ").split()
    return " ".join(parts[:words_kept])


def resolve(text: str) -> GpuName:
    """The brand and compute capability of one ``--gpu`` name; :class:`UnknownGpuName` if none fits."""
    from .hostfacts import brand_from_model

    form, words = _tokens(text or "")
    model_words = [w for w in words if w not in _VENDOR]
    family = model_words[0] if model_words else ""
    if family in ("geforce", "titan", "quadro") or (words[:1] == ["tesla"] and model_words):
        fam = family if family in ("geforce", "titan", "quadro") else "tesla"
        cc = _family_cc(fam, model_words)
        name = _display(text, form, len(words))
        return GpuName(text, name, brand_from_model(name), cc, form, _family_arch(fam, model_words))
    # the longest known model at the start of the words (rtx 6000 ada before rtx 6000)
    for n in (3, 2, 1):
        key = " ".join(model_words[:n])
        if len(model_words) >= n and key in MODELS:
            base, cc = MODELS[key]
            # A short name, or a full one without the vendor word NVML prints, takes the table's
            # spelling (the vendor word is what sets the brand: Tesla T4, NVIDIA A100).
            name = base if form == "short" or words[:1] != base.lower().split()[:1] else \
                _display(text, form, len(words))
            return GpuName(text, name, brand_from_model(base), cc, form)
    if family == "rtx" and len(model_words) >= 2:
        cc = _geforce_rtx(model_words[1])
        if cc is not None:
            name = "NVIDIA GeForce RTX " + " ".join("Ti" if w == "ti" else w.upper() for w in model_words[1:])
            return GpuName(text, name, brand_from_model(name), cc, form)
    raise UnknownGpuName(f"--gpu {text!r}: not a GPU name compat-hook knows; give {ACCEPTED}")


def _family_cc(family: str, model_words: list):
    """The compute capability of a GeForce / TITAN / Quadro / Tesla name, where the model tells it."""
    rest = model_words[1:] if family != "tesla" else model_words
    if family == "titan":
        hit = MODELS.get("titan " + " ".join(rest[:1]))
        return hit[1] if hit else None
    if family == "geforce" and rest[:1] == ["rtx"] and len(rest) > 1:
        return _geforce_rtx(rest[1])
    if family == "geforce" and rest[:1] == ["gtx"] and len(rest) > 1 and rest[1][:2] in ("16", "10"):
        return (7, 5) if rest[1].startswith("16") else (6, 1)
    if family == "geforce" and rest[:1] == ["gtx"] and len(rest) > 1 and len(rest[1]) == 3 \
            and rest[1][0] == "9" and rest[1].isdigit():
        return (5, 2)  # GTX 950 ... 980: GM204 / GM206 / GM200
    for n in (3, 2, 1):
        hit = MODELS.get(" ".join(rest[:n])) if len(rest) >= n else None
        if hit:
            return hit[1]
    return None


def _family_arch(family: str, model_words: list) -> str | None:
    """The architecture a Tesla or Quadro model number's letter names (``K80``, ``P4000``), or None.

    >>> _family_arch("tesla", ["v100s", "pcie"]), _family_arch("quadro", ["rtx", "8000"]), _family_arch("titan", ["x"])
    ('Volta', None, None)
    """
    rest = model_words[1:] if family == "quadro" else model_words if family == "tesla" else []
    w = rest[0] if rest else ""
    if len(w) >= 2 and w[0] in _LETTER_ARCH and w[1].isdigit():
        return _LETTER_ARCH[w[0]]
    return None
