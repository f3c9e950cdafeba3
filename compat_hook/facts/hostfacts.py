"""Facts about the host: kernel driver version, CUDA version, GPUs, Tegra, arch.

Everything is read under a *host root* (``/`` in production, a fake tree in
tests), and every fact remembers where it came from, so ``explain`` and the
log can say why. Sources, best first:

* driver version: ``/proc/driver/nvidia/version`` (proprietary and open
  kernel module lines), ``/sys/module/nvidia/version``, the host
  ``libcuda.so.X.Y[.Z]`` in the driver library dirs; NVML only confirms;
* GPUs: NVML brand when nvidia-ml-py is installed, else the model name in
  ``/proc/driver/nvidia/gpus/*/information`` (a name heuristic, marked so);
  each GPU's index, UUID and device minor come from NVML or from that file
  (``GPU UUID:``, ``Device Minor:``), its PCI device ID from NVML or from
  ``/sys/bus/pci/devices/<bdf>/device`` (what places the GPU in an
  architecture without NVML's compute capability: the decision's
  architecture rule, :mod:`compat_hook.facts.gpusupport`, reads it, then the
  model name). Without NVML a GPU's index is its
  place in PCI bus id order, the order NVML, ``nvidia-smi`` and the NVIDIA
  toolkit enumerate GPUs in (``CUDA_DEVICE_ORDER`` does not apply: it only
  orders the devices CUDA numbers inside the container);
* the GPUs a container gets: :func:`compat_hook.policy.decision.select_gpus` maps
  the names of its request (indexes, UUIDs, MIG UUIDs, ``/dev/nvidiaN``
  minors) to them;
* Tegra: no kernel driver version and ``/dev/nvgpu``; its CUDA version comes
  from NVML or the configuration.

>>> parse_proc_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
...                    "575.57.08  Release Build  (dvs-builder@U16)  Tue May 20 2025")
'575.57.08'
>>> parse_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76  Mon Sep 12 19:21:56 UTC 2022")
'515.76'
>>> brand_from_model("NVIDIA GeForce RTX 3090 Ti"), brand_from_model("NVIDIA H100 80GB HBM3")
(5, 14)
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start

from ..core.versions import format_version, try_parse_version

__all__ = ["HostFacts", "Gpu", "gather", "parse_proc_version", "parse_gpu_information", "brand_from_model",
           "pci_device_id", "BRAND_NAMES"]

#: nvmlBrandType_t values (nvml.h); the note's ``device`` list uses them.
BRAND_NAMES = {
    0: "UNKNOWN", 1: "QUADRO", 2: "TESLA", 3: "NVS", 4: "GRID", 5: "GEFORCE", 6: "TITAN",
    7: "NVIDIA_VAPPS", 8: "NVIDIA_VPC", 9: "NVIDIA_VCS", 10: "NVIDIA_VWS",
    11: "NVIDIA_CLOUD_GAMING", 12: "QUADRO_RTX", 13: "NVIDIA_RTX", 14: "NVIDIA",
    15: "GEFORCE_RTX", 16: "TITAN_RTX",
}


def parse_proc_version(text: str) -> str | None:
    """The version token after ``Kernel Module`` (optionally ``for <arch>``).

    Equivalent to NGC's regex ``Kernel Module(?: for \\S+)?\\s+(\\d+\\.\\d+(?:\\.\\d+)?)\\s``
    without importing ``re`` (~10 ms).
    """
    for line in text.splitlines():
        i = line.find("Kernel Module")
        if i < 0:
            continue
        toks = line[i + len("Kernel Module"):].split()
        if toks and toks[0] == "for":
            toks = toks[2:]
        if toks and try_parse_version(toks[0]) is not None and "." in toks[0]:
            return toks[0]
    return None


def brand_from_model(model: str) -> int:
    """A best-effort nvmlBrandType_t from a model name (no NVML).

    Only the distinction that matters is reliable: GeForce and TITAN boards
    are consumer (forward compat fails there with error 804); other NVIDIA
    names are datacenter or professional. An empty or generic name is 0
    (unknown), which the device check treats as "cannot tell".
    """
    m = model.strip()
    low = m.lower()
    if not m or low in ("graphics device", "unknown", "nvidia graphics device"):
        return 0
    # NVML reports GeForce RTX / TITAN RTX boards as GEFORCE / TITAN: nvml.h
    # marks 15 (GEFORCE_RTX) and 16 (TITAN_RTX) "Unused".
    if "geforce" in low:
        return 5
    if "titan" in low:
        return 6
    if "quadro" in low:
        return 12 if "rtx" in low else 1
    if "tesla" in low:
        return 2
    if "rtx" in low:
        return 13
    if low.startswith("nvidia") or "orin" in low or "thor" in low:
        return 14
    return 0


class Gpu:
    """One GPU: model name, brand (nvmlBrandType_t or None) and their sources.

    ``index`` (NVML's, else PCI bus id order), ``uuid`` (``GPU-...``),
    ``minor`` (the N of ``/dev/nvidiaN``) and ``mig`` (its MIG devices'
    UUIDs, NVML only) name it the way a container request does.
    ``compute_capability`` (NVML) and ``pci_id`` (its PCI device ID,
    ``0x1db1``, from NVML or sysfs) are what its architecture is told by,
    before the model name (:func:`compat_hook.facts.gpusupport.of_gpu`).
    """

    __slots__ = ("bus_id", "model", "brand", "brand_source", "compute_capability", "index", "uuid",
                 "minor", "mig", "pci_id")

    def __init__(self, bus_id: str, model: str, brand: int | None, brand_source: str,
                 compute_capability: tuple | None = None, *, index: int | None = None,
                 uuid: str | None = None, minor: int | None = None, mig=(), pci_id: str | None = None) -> None:
        self.bus_id = bus_id
        self.model = model
        self.brand = brand
        self.brand_source = brand_source
        self.compute_capability = compute_capability
        self.index = index
        self.uuid = uuid
        self.minor = minor
        self.mig = list(mig)
        self.pci_id = pci_id

    def label(self) -> str:
        """How logs name it: ``0 0000:17:00.0 NVIDIA H100 80GB HBM3``.

        >>> Gpu("0000:17:00.0", "NVIDIA H100 80GB HBM3", 14, "nvml", index=0).label()
        '0 0000:17:00.0 NVIDIA H100 80GB HBM3'
        """
        head = f"{self.index} " if self.index is not None else ""
        return f"{head}{self.bus_id} {self.model or '?'}"

    def to_dict(self) -> dict:
        return {"bus_id": self.bus_id, "index": self.index, "uuid": self.uuid, "minor": self.minor,
                "model": self.model, "brand": self.brand,
                "brand_name": BRAND_NAMES.get(self.brand) if self.brand is not None else None,
                "brand_source": self.brand_source,
                "compute_capability": (f"{self.compute_capability[0]}.{self.compute_capability[1]}"
                                       if self.compute_capability else None),
                "pci_device_id": self.pci_id, "mig_devices": list(self.mig)}


class HostFacts:
    """What the host says. Versions are ``(major, minor, patch)`` tuples or None."""

    __slots__ = ("driver_version", "driver_source", "cuda_version", "cuda_source", "gpus",
                 "gpus_source", "tegra", "arch", "machine", "notes", "driver_text")

    def __init__(self, driver_version=None, driver_source=None, cuda_version=None, cuda_source=None,
                 gpus=None, gpus_source=None, tegra=False, arch="x86_64", notes=None,
                 driver_text=None, machine=None) -> None:
        self.driver_version = driver_version
        # As the source wrote it (575.57.08): kept for display and logs.
        self.driver_text = driver_text or (format_version(driver_version, 3) if driver_version else None)
        self.driver_source = driver_source
        self.cuda_version = cuda_version
        self.cuda_source = cuda_source
        self.gpus = list(gpus or [])
        self.gpus_source = gpus_source
        self.tegra = tegra
        self.arch = arch
        if machine is None:
            from .elfinfo import machine_for_arch  # a table (not the ELF reader)

            machine = machine_for_arch(arch)
        #: The ELF ``e_machine`` a library must have to load here (``EM_X86_64``), or None.
        self.machine = machine
        self.notes = list(notes or [])

    def to_dict(self) -> dict:
        return {
            "driver_version": self.driver_text if self.driver_version else None,
            "driver_source": self.driver_source,
            "cuda_version": format_version(self.cuda_version, 2) if self.cuda_version else None,
            "cuda_source": self.cuda_source,
            "gpus": [g.to_dict() for g in self.gpus],
            "gpus_source": self.gpus_source,
            "tegra": self.tegra,
            "arch": self.arch,
            "machine": self.machine,
            "notes": list(self.notes),
        }


def _read_text(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _driver_from_libs(root: str, dirs: list, notes: list):
    """The host libcuda's version: the target of ``libcuda.so.1``, else the single one."""
    found = {}
    for d in dirs:
        hd = _under(root, d)
        try:
            names = os.listdir(hd)
        except OSError:
            continue
        link_target = None
        try:
            link_target = os.path.basename(os.readlink(os.path.join(hd, "libcuda.so.1")))
        except OSError:
            pass
        for n in names:
            if not n.startswith("libcuda.so."):
                continue
            suffix = n[len("libcuda.so."):]
            v = try_parse_version(suffix)
            # libcuda.so.1.1 is Tegra's soname-style name, not a driver version
            # (NVIDIA toolkit issue #1271: it made every Tegra host "1.1").
            if v is None or suffix.count(".") < 1 or suffix == "1.1":
                continue
            try:
                if not os.path.isfile(os.path.join(hd, n)) or os.path.islink(os.path.join(hd, n)):
                    continue
            except OSError:
                continue
            found[v] = (f"{d}/{n}", suffix, n == link_target)
    if not found:
        return None, None
    linked = [v for v, (_, _, is_link) in found.items() if is_link]
    if linked:
        v = linked[0]
    elif len(found) == 1:
        v = next(iter(found))
    else:
        notes.append("several host libcuda versions and no libcuda.so.1 link: "
                     + ", ".join(sorted(s for _, s, _ in found.values())))
        return None, None
    return v, f"libcuda:{found[v][0]}"


def parse_gpu_information(text: str) -> dict:
    r"""``Model``, ``GPU UUID`` and ``Device Minor`` of a ``/proc/driver/nvidia/gpus/<bdf>/information``.

    >>> parse_gpu_information("Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-5a1c\nDevice Minor: \t 3\n")
    {'model': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-5a1c', 'minor': 3}
    """
    out: dict = {"model": "", "uuid": None, "minor": None}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "Model":
            out["model"] = value
        elif key == "GPU UUID" and value.startswith("GPU-"):
            out["uuid"] = value
        elif key == "Device Minor" and value.isdigit():
            out["minor"] = int(value)
    return out


def pci_device_id(text: str | None) -> str | None:
    """A sysfs ``device`` file's PCI device ID (``0x1db1``), or None for anything else.

    >>> pci_device_id("0x1DB1\\n"), pci_device_id("banana"), pci_device_id(None)
    ('0x1db1', None, None)
    """
    t = (text or "").strip().lower()
    if len(t) == 6 and t.startswith("0x") and all(c in "0123456789abcdef" for c in t[2:]):
        return t
    return None


def _gpus_from_proc(root: str) -> list:
    base = _under(root, "/proc/driver/nvidia/gpus")
    try:
        # The PCI bus id names sort in bus order (fixed-width lower-case hex):
        # the order NVML enumerates GPUs in, so a GPU's place is its index.
        buses = sorted(os.listdir(base), key=str.lower)
    except OSError:
        return []
    gpus = []
    for index, bus in enumerate(buses):
        text = _read_text(os.path.join(base, bus, "information"))
        if text is None:
            continue
        info = parse_gpu_information(text)
        # The device ID places the GPU in an architecture (the information file has none); the
        # kernel names the GPU's dir in sysfs as the driver does here (0000:17:00.0): one small read.
        dev = pci_device_id(_read_text(_under(root, f"/sys/bus/pci/devices/{bus.lower()}/device"), 64))
        gpus.append(Gpu(bus, info["model"], brand_from_model(info["model"]), "proc-model-name",
                        index=index, uuid=info["uuid"], minor=info["minor"], pci_id=dev))
    return gpus


def _nvml_migs(pynvml, handle) -> list:
    """The UUIDs of a GPU's MIG devices (none when MIG is off or NVML cannot say)."""
    out = []
    try:
        count = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception:
        return out
    for j in range(count):
        try:
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))
        except Exception:
            continue
        out.append(u.decode() if isinstance(u, bytes) else str(u))
    return out


def _nvml(notes: list):
    """``(driver_version_text, cuda_version, gpus)`` from NVML, or None.

    Imported only when configured and installed; every failure is a note.
    """
    try:
        import pynvml  # type: ignore[import-not-found]
    except Exception:
        notes.append("nvml: nvidia-ml-py not installed")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        notes.append(f"nvml: init failed: {e}")
        return None
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        if isinstance(drv, bytes):
            drv = drv.decode()
        cuda = None
        try:
            from ..core.versions import decode_cuda_driver_version

            cuda = decode_cuda_driver_version(pynvml.nvmlSystemGetCudaDriverVersion())
        except Exception as e:
            notes.append(f"nvml: no CUDA driver version: {e}")
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            if isinstance(name, bytes):
                name = name.decode()
            try:
                brand = int(pynvml.nvmlDeviceGetBrand(h))
            except Exception:
                brand = None
            try:
                cc = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                cc = None
            bus, dev = str(i), None
            try:
                pci = pynvml.nvmlDeviceGetPciInfo(h)
                bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
                # pciDeviceId: the device ID in the high 16 bits, the vendor's (0x10de) in the low
                dev = f"0x{(int(pci.pciDeviceId) >> 16) & 0xffff:04x}"
            except Exception:
                pass
            uuid = minor = None
            try:
                uuid = pynvml.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            except Exception:
                pass
            try:
                minor = int(pynvml.nvmlDeviceGetMinorNumber(h))
            except Exception:
                pass
            gpus.append(Gpu(bus, name, brand, "nvml", cc, index=i, uuid=uuid, minor=minor,
                            mig=_nvml_migs(pynvml, h), pci_id=dev))
        return drv, cuda, gpus
    except Exception as e:
        notes.append(f"nvml: query failed: {e}")
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def gather(config, *, driver_version: str | None = None, cuda_version: str | None = None) -> HostFacts:
    """Read the host facts under ``config.host_root``.

    ``driver_version`` / ``cuda_version`` (from the command line) and the
    config's ``host_driver_version`` / ``host_cuda_version`` override detection.
    """
    root = config.host_root
    notes: list = []
    arch = os.uname().machine
    drv = drv_src = drv_text = None
    given = driver_version or config.host_driver_version
    if given:
        drv, drv_text = try_parse_version(given), given.strip()
        drv_src = "command line" if driver_version else "config"
        if drv is None:
            notes.append(f"given host driver version {given!r} is not a version")
    else:
        text = _read_text(_under(root, "/proc/driver/nvidia/version"))
        if text is not None:
            tok = parse_proc_version(text)
            if tok is not None:
                drv, drv_src, drv_text = try_parse_version(tok), "/proc/driver/nvidia/version", tok
            else:
                notes.append("/proc/driver/nvidia/version has no Kernel Module version")
        if drv is None:
            text = _read_text(_under(root, "/sys/module/nvidia/version"))
            if text is not None and text.strip():
                v = try_parse_version(text.strip())
                if v is not None and "." in text:
                    drv, drv_src, drv_text = v, "/sys/module/nvidia/version", text.strip()
                else:
                    notes.append(f"/sys/module/nvidia/version is not a version: {text.strip()[:40]!r}")
        if drv is None:
            drv, drv_src = _driver_from_libs(root, config.driver_lib_dirs, notes)
            if drv_src:
                drv_text = drv_src.rsplit("libcuda.so.", 1)[-1]

    cuda = cuda_src = None
    given = cuda_version or config.host_cuda_version
    if given:
        cuda = try_parse_version(given)
        cuda_src = "command line" if cuda_version else "config"
        if cuda is None:
            notes.append(f"given host CUDA version {given!r} is not a version")

    tegra = drv is None and os.path.exists(_under(root, "/dev/nvgpu"))
    gpus = _gpus_from_proc(root)
    gpus_src = "/proc/driver/nvidia/gpus" if gpus else None

    # NVML is asked only on a real host root: a test's fake tree must not
    # reach the machine's real driver through it.
    if config.nvml == "auto" and root == "/" and (
            os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvgpu")):
        got = _nvml(notes)
        if got is not None:
            nv_drv, nv_cuda, nv_gpus = got
            v = try_parse_version(nv_drv) if nv_drv else None
            if drv is None and v is not None and not nv_drv.startswith("1.1"):
                drv, drv_src, drv_text = v, "nvml", nv_drv
            elif drv is not None and v is not None and v != drv:
                notes.append(f"nvml driver {nv_drv} differs from {drv_src}")
            if cuda is None and nv_cuda is not None:
                cuda, cuda_src = nv_cuda, "nvml"
            if nv_gpus:
                gpus, gpus_src = nv_gpus, "nvml"
            if any("orin (nvgpu)" in g.model.lower() for g in nv_gpus):
                tegra = True
    return HostFacts(drv, drv_src, cuda, cuda_src, gpus, gpus_src, tegra, arch, notes,
                     drv_text if drv is not None else None)
