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

__all__ = ["GpuName", "UnknownGpuName", "resolve", "MODELS", "ACCEPTED"]

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
    "k80": ("Tesla K80", (3, 7)), "m60": ("Tesla M60", (5, 2)), "m40": ("Tesla M40", (5, 2)),
    "p100": ("Tesla P100", (6, 0)), "p40": ("Tesla P40", (6, 1)), "p4": ("Tesla P4", (6, 1)),
    "v100": ("Tesla V100", (7, 0)), "v100s": ("Tesla V100S", (7, 0)), "t4": ("Tesla T4", (7, 5)),
    "a100": ("NVIDIA A100", (8, 0)), "a800": ("NVIDIA A800", (8, 0)), "a30": ("NVIDIA A30", (8, 0)),
    "a10": ("NVIDIA A10", (8, 6)), "a10g": ("NVIDIA A10G", (8, 6)), "a16": ("NVIDIA A16", (8, 6)),
    "a2": ("NVIDIA A2", (8, 6)), "a40": ("NVIDIA A40", (8, 6)),
    "l4": ("NVIDIA L4", (8, 9)), "l20": ("NVIDIA L20", (8, 9)), "l40": ("NVIDIA L40", (8, 9)),
    "l40s": ("NVIDIA L40S", (8, 9)),
    "h100": ("NVIDIA H100", (9, 0)), "h800": ("NVIDIA H800", (9, 0)), "h200": ("NVIDIA H200", (9, 0)),
    "h20": ("NVIDIA H20", (9, 0)), "gh200": ("NVIDIA GH200", (9, 0)),
    "b100": ("NVIDIA B100", (10, 0)), "b200": ("NVIDIA B200", (10, 0)), "gb200": ("NVIDIA GB200", (10, 0)),
    "b300": ("NVIDIA B300", (10, 3)), "gb300": ("NVIDIA GB300", (10, 3)),
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


class UnknownGpuName(UsageError):
    """A ``--gpu`` name that is none of the accepted forms (exit 2, one line)."""


class GpuName:
    """What one ``--gpu`` name resolved to: ``model`` (NVML-style), ``brand``, ``compute_capability``, ``form``."""

    __slots__ = ("text", "model", "brand", "compute_capability", "form")

    def __init__(self, text: str, model: str, brand: int, compute_capability, form: str) -> None:
        self.text, self.model, self.brand = text, model, brand
        self.compute_capability, self.form = compute_capability, form

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
        cc = _family_cc(family if family in ("geforce", "titan", "quadro") else "tesla", model_words)
        name = _display(text, form, len(words))
        return GpuName(text, name, brand_from_model(name), cc, form)
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
    for n in (3, 2, 1):
        hit = MODELS.get(" ".join(rest[:n])) if len(rest) >= n else None
        if hit:
            return hit[1]
    return None
