"""Which driver branches drive which GPUs: the branch x architecture table, and each GPU's architecture.

A kernel driver drives only the GPU architectures of its branch: a new
architecture needs a branch at least as new as the first one released for it,
and NVIDIA drops old architectures after a last branch (Kepler after R470;
Maxwell, Pascal and Volta after R580). On any other branch the kernel module
does not drive the GPU, so no container sees it: CUDA fails with error 100
(``CUDA_ERROR_NO_DEVICE``), whatever the image carries. A rollback, or an
upgrade over an architecture boundary, breaks every GPU container of the node.

:data:`BRANCHES` is that table, one row per architecture, each row sourced in
docs/background.md ("GPU architectures and driver branches"):

* ``first``: the branch of the first CUDA Toolkit release with the
  architecture (NVIDIA's "CUDA Toolkit, Driver, and Architecture Matrix"
  names that release; ``core/versions``' branch -> CUDA table names its
  branch). ``None``: older than every branch a CUDA container runs on today;
* ``last``: the last branch that drives it (NVIDIA's matrix, "Last Driver
  Support", and its Unix driver deprecation notices); ``None``: still driven.

:func:`of_gpu` finds a GPU's architecture: its compute capability (NVML),
else its PCI device ID (``/sys/bus/pci/devices/<bdf>/device``, read by
:func:`pci_gpus`, and by :mod:`compat_hook.facts.hostfacts` for the GPUs the driver lists),
else its model name (:mod:`compat_hook.facts.gpunames`). A GPU
whose architecture none of them tells is not judged: a guess would be a
wrong prediction either way. :func:`pci_gpus` also finds the NVIDIA GPUs a
driver does *not* list (``/proc/driver/nvidia/gpus`` has only the GPUs it
drives): a driver that does not support a GPU is seen, not missed.

>>> supports(470, "Hopper"), supports(520, "Hopper"), supports(580, "Volta"), supports(590, "Volta")
(False, True, True, False)
>>> supports(470, "Kepler"), supports(495, "Kepler"), supports(535, None)
(True, False, True)
>>> first_last("Blackwell")
(570, None)
"""

from __future__ import annotations

from ..core import fastos as os  # the decision's architecture rule imports this at a container start

__all__ = ["BRANCHES", "GpuArch", "supports", "first_last", "branch_text", "of_gpu", "pci_gpus",
           "norm_bus"]

#: architecture -> (first branch, last branch); None: no bound on that side (see the module docstring).
BRANCHES = {
    "Fermi": (None, 390),
    "Kepler": (None, 470),
    "Maxwell": (None, 580),
    "Pascal": (None, 580),
    "Volta": (384, 580),       # CUDA 9.0
    "Turing": (410, None),     # CUDA 10.0
    "Ampere": (450, None),     # CUDA 11.0
    "Ada": (520, None),        # CUDA 11.8
    "Hopper": (520, None),     # CUDA 11.8
    "Blackwell": (570, None),  # CUDA 12.8
}

#: A PCI display controller (class 0x03xxxx) of vendor NVIDIA is a GPU.
_NVIDIA = "0x10de"


def first_last(arch: str | None) -> tuple:
    """``(first, last)`` branch of an architecture; ``(None, None)`` for one not in the table."""
    return BRANCHES.get(arch or "", (None, None))


def supports(branch: int, arch: str | None) -> bool:
    """Whether driver branch ``branch`` drives GPUs of ``arch``; an unknown architecture is not judged (True)."""
    first, last = first_last(arch)
    return (first is None or branch >= first) and (last is None or branch <= last)


def branch_text(arch: str) -> str:
    """The branches that drive ``arch``, as a phrase.

    >>> branch_text("Hopper"), branch_text("Volta"), branch_text("Kepler")
    ('R520 and later', 'R384 to R580', 'R470 and earlier')
    """
    first, last = first_last(arch)
    if first is not None and last is not None:
        return f"R{first} to R{last}"
    if first is not None:
        return f"R{first} and later"
    if last is not None:
        return f"R{last} and earlier"
    return "every branch"


def norm_bus(bus_id: str) -> str:
    """A PCI bus id in the kernel's form: NVML's ``00000000:17:00.0`` is ``0000:17:00.0``.

    >>> norm_bus("00000000:17:00.0"), norm_bus("0000:65:00.0"), norm_bus("B3:00.0")
    ('0000:17:00.0', '0000:65:00.0', '0000:b3:00.0')
    """
    parts = (bus_id or "").strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


class GpuArch:
    """One GPU with its architecture: ``gpu`` (a :class:`~compat_hook.facts.hostfacts.Gpu`, or None for a
    GPU the driver does not list), ``bus_id``, ``pci_id`` (``0x2330`` or None), ``arch``, ``arch_from``
    (how it was found) and ``listed`` (the driver lists it: it drives it; None: not known, ``--gpu``)."""

    __slots__ = ("gpu", "bus_id", "pci_id", "arch", "arch_from", "listed")

    def __init__(self, gpu, bus_id: str, pci_id: str | None, arch: str | None, arch_from: str | None,
                 listed: bool | None) -> None:
        self.gpu, self.bus_id, self.pci_id = gpu, bus_id, pci_id
        self.arch, self.arch_from, self.listed = arch, arch_from, listed

    def name(self) -> str:
        """How the report names it: its model, else its PCI ID, with its architecture."""
        what = (self.gpu.model if self.gpu is not None and self.gpu.model else
                f"PCI device 10de:{self.pci_id[2:]}" if self.pci_id else "GPU")
        where = f" at {self.bus_id}" if self.bus_id and not self.bus_id.startswith("gpu") else ""
        return f"{what}{where} ({self.arch or 'architecture unknown'})"

    def to_dict(self) -> dict:
        base = self.gpu.to_dict() if self.gpu is not None else {
            "bus_id": self.bus_id, "index": None, "uuid": None, "minor": None, "model": None, "brand": None,
            "brand_name": None, "brand_source": None, "compute_capability": None, "mig_devices": []}
        base.update(pci_device_id=self.pci_id, architecture=self.arch, architecture_from=self.arch_from,
                    listed_by_driver=self.listed)
        return base


def of_gpu(gpu, pci_ids: dict | None = None, listed: bool | None = True) -> GpuArch:
    """The architecture of a listed GPU: compute capability, else PCI device ID, else model name.

    ``pci_ids``: ``{bus id: "0x2330"}`` from :func:`pci_gpus`, else the GPU's own
    ``pci_id`` (what :mod:`compat_hook.facts.hostfacts` read for it); ``listed``: the
    driver lists it (``None``: not known, a GPU named by ``plan --gpu``). Pure: the
    decision's architecture rule (:mod:`compat_hook.policy.decision`, rule 10) and
    ``plan`` place a GPU by this one function.

    >>> from compat_hook.facts.hostfacts import Gpu
    >>> a = of_gpu(Gpu("0000:17:00.0", "NVIDIA Graphics Device", None, "proc-model-name"), {"0000:17:00.0": "0x2330"})
    >>> a.arch, a.arch_from
    ('Hopper', 'PCI device ID 0x2330')
    >>> of_gpu(Gpu("gpu0", "Tesla V100-SXM2-16GB", 2, "--gpu")).arch_from
    'model name Tesla V100-SXM2-16GB'
    >>> of_gpu(Gpu("0000:17:00.0", "NVIDIA Graphics Device", 0, "proc-model-name", pci_id="0x1db1")).arch
    'Volta'
    """
    from . import gpunames

    bus = norm_bus(gpu.bus_id)
    pci = (pci_ids or {}).get(bus) or getattr(gpu, "pci_id", None)
    arch, how = gpunames.architecture(gpu.compute_capability), None
    if arch is not None:
        how = "compute capability {}.{}".format(*gpu.compute_capability[:2])
    elif pci is not None and gpunames.architecture_of_pci(pci) is not None:
        arch, how = gpunames.architecture_of_pci(pci), f"PCI device ID {pci}"
    elif gpu.model:
        try:
            arch = gpunames.resolve(gpu.model).architecture
        except gpunames.UnknownGpuName:
            arch = None
        how = f"model name {gpu.model}" if arch is not None else None
    return GpuArch(gpu, bus, pci, arch, how, listed)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None


def pci_gpus(host_root: str) -> dict:
    """``{bus id: "0x2330"}``: the NVIDIA display controllers under ``<host_root>/sys/bus/pci/devices``.

    Every NVIDIA GPU of the machine, whether a driver drives it or not. A
    missing or unreadable sysfs gives ``{}`` (the other sources still count).
    """
    base = os.path.join(host_root or "/", "sys/bus/pci/devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    out = {}
    for bdf in names[:4096]:
        d = os.path.join(base, bdf)
        if _read(os.path.join(d, "vendor")) != _NVIDIA:
            continue
        cls, dev = _read(os.path.join(d, "class")), _read(os.path.join(d, "device"))
        # 0x03xxxx: VGA (0x0300) and 3D (0x0302) controllers; the audio and USB functions are not GPUs
        if cls and cls.lower().startswith("0x03") and dev and dev.lower().startswith("0x"):
            out[norm_bus(bdf)] = dev.lower()
    return out
