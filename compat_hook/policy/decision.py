"""The compat decision: facts + config in, a Decision out. No I/O.

The rules match NVIDIA Container Toolkit v1.20 where they overlap
(its cmd/nvidia-cdi-hook/cudacompat) and are stricter where it is silent:

1. the container opted out, or requests no GPU, or its
   ``NVIDIA_DRIVER_CAPABILITIES`` names neither ``compute`` nor ``all`` (NVIDIA's
   runtime gives it no libcuda then) -> skip;
2. no candidate, or several in one dir -> skip;
3. the candidate is not a loadable ELF for this host (class, machine,
   type, SONAME) -> skip (NVIDIA applies its major-number rule even to
   non-ELF files; we don't);
3b. Jetson Orin's compat (``compat_orin``, ``libcuda.so.1.1``) on any host not
   known to be a Tegra one (a dGPU host, or one whose driver version is
   unknown) -> skip; the SBSA/dGPU compat on a Tegra (Orin, nvgpu) host ->
   skip: NVIDIA ships the two apart (docs/background.md, "Tegra");
4. host-CUDA path, on a Tegra host only (Orin's ``libcuda.so.1.1`` there, or
   ``host.tegra``: no kernel driver version, a CUDA version): note
   ``CUDA version`` > host CUDA -> enable. A dGPU host whose driver version is
   unknown does not take it, whatever CUDA version is known: rule 5;
5. host driver unknown -> skip;
6. compat <= host (full version) -> skip: a downgrade is error 803;
7. note with a ``driver`` list: the host branch must be in it; a note
   without one while the host driver is known -> skip;
8. no note: the compat major must exceed the host major;
9. note ``device`` list and known GPU brands: a GPU whose brand is outside
   the list -> skip (error 804 on GeForce / TITAN), per ``device_check``;
   no device list (no note: every compat package before the note existed,
   Debian's 550 ``libcuda1``): NVIDIA's CUDA Compatibility guide supports
   forward compatibility only on data-center GPUs and select NGC Server
   Ready RTX boards, note or not, so a GeForce or TITAN GPU -> skip
   (``device_consumer``, unless ``device_check: off``); the brands every
   NVIDIA note lists (:data:`DEFAULT_DEVICE_BRANDS`) pass; any other brand
   (unknown, NVS, GRID) is judged per ``device_check`` as with a list;
10. a GPU the compat driver's branch does not drive -> skip
    (``gpu_arch_unsupported``): the GPU's architecture outside that branch's
    in :data:`compat_hook.facts.gpusupport.BRANCHES`, the one branch x
    architecture table ``plan`` judges drivers by (R590+ dropped Maxwell,
    Pascal and Volta, i.e. compute capability below 7.5; every branch after R470 Kepler). The
    architecture comes from the GPU facts ``plan`` uses
    (:func:`compat_hook.facts.gpusupport.of_gpu`): NVML's compute capability,
    else the PCI device ID (:mod:`compat_hook.facts.hostfacts` reads it from
    sysfs), else the model name; a GPU none of them places is not judged, nor
    a Tegra host (its drivers are not these branches).

An image may carry several candidate dirs (:meth:`ImageFacts.all
<compat_hook.facts.imagefacts.ImageFacts.all>`: the configured dirs, conda's
``cuda-compat``, compat dirs its ``LD_LIBRARY_PATH`` names). Each is decided by
these rules alone; of those that enable, the newest compat driver is chosen (it
serves every CUDA runtime an older one does); when none does, the skip of
the first candidate built for this kind of host (rule 3b) is the decision, else
the first one's. ``details["compat_dirs"]`` lists each with its
reason.

Rules 9 and 10 look at the GPUs the container gets
(:meth:`~compat_hook.facts.container.Request.gpu_names` mapped by
:func:`select_gpus`), all of the host's only when
the request names none in particular; ``details["gpus_checked"]`` says which.

>>> from compat_hook.core.config import from_mapping
>>> from compat_hook.facts.hostfacts import HostFacts
>>> from compat_hook.facts.imagefacts import ImageFacts
>>> from compat_hook.facts.elfnote import ElfInfo
>>> img = ImageFacts(); img.status = "found"; img.candidate = "libcuda.so.550.163.01"
>>> img.compat_dir = "/usr/local/cuda-12.4/compat"; img.compat_version = (550, 163, 1)
>>> img.elf = ElfInfo.from_dict({"elf_class": 64, "machine": "EM_X86_64", "elf_type": "ET_DYN",
...     "soname": "libcuda.so.1", "note": None, "note_error": None, "error": None, "byte_order": "little"})
>>> d = decide(HostFacts(driver_version=(535, 261, 3), arch="x86_64"), img, None, from_mapping({}))
>>> d.action, d.reason, d.compat_dir
('enable', 'compat_major_newer', '/usr/local/cuda-12.4/compat')
>>> decide(HostFacts(driver_version=(555, 58, 2), arch="x86_64"), img, None, from_mapping({})).reason
'compat_not_newer'
"""

from __future__ import annotations

from ..core.versions import branch_max_cuda, format_version, try_parse_version

__all__ = ["Decision", "decide", "decide_request", "decide_store", "REASONS", "LEAVE_REASONS",
           "DEFAULT_DEVICE_BRANDS", "CONSUMER_BRANDS", "select_gpus"]

#: nvmlBrandType_t of GeForce and TITAN boards (GEFORCE, TITAN, GEFORCE_RTX,
#: TITAN_RTX): no forward compatibility there, with or without a note (804).
CONSUMER_BRANDS = frozenset((5, 6, 15, 16))
#: The brands a compat driver without a device list is allowed on: the list
#: every NVIDIA note carries (R575, R590: QUADRO, TESLA, the vGPU brands,
#: QUADRO_RTX, NVIDIA_RTX, NVIDIA), i.e. data-center and professional RTX.
DEFAULT_DEVICE_BRANDS = (1, 2, 7, 8, 9, 10, 11, 12, 13, 14)

#: Every reason code, with the one-line explanation ``explain`` prints.
REASONS = {
    # enable
    "compat_newer_supported": "the compat driver is newer than the host driver and its note lists the host branch",
    "compat_major_newer": "no note: the compat driver's branch is newer than the host's (NVIDIA's legacy rule)",
    "compat_cuda_newer": "host-CUDA path: the note's CUDA version is newer than the host's",
    "store_package": "the image carries no compat libs but needs a newer CUDA; a host-store package fits",
    # skip
    "opt_out": "the container opted out",
    "no_gpu_request": "the container requests no GPU",
    "no_compute_capability": ("NVIDIA_DRIVER_CAPABILITIES names neither compute nor all: NVIDIA's runtime gives "
                              "the container no libcuda"),
    "no_candidate": "no regular libcuda.so.<version> in the compat dirs",
    "ambiguous_candidates": "several libcuda.so.<version> files; refusing to guess",
    "candidate_unreadable": "the candidate could not be opened as a regular file",
    "not_elf": "the candidate is not an ELF file",
    "elf_class": "the candidate is not ELFCLASS64",
    "elf_machine": "the candidate is built for another machine",
    "elf_type": "the candidate is not a shared object (ET_DYN)",
    "soname": "the candidate's SONAME is not libcuda.so.1",
    "compat_orin_not_tegra": "Jetson Orin's compat driver (compat_orin) on a host that is not a Tegra (Orin) host",
    "compat_dgpu_on_tegra": "the SBSA/dGPU compat driver on a Tegra (Orin) host, which needs compat_orin",
    "compat_version_invalid": "the candidate's file name carries no valid driver version",
    "host_driver_unknown": "the host kernel driver version is unknown",
    "host_cuda_unknown": "host-CUDA path, but the host CUDA version is unknown",
    "compat_cuda_not_newer": "host-CUDA path: the note's CUDA version is not newer than the host's",
    "note_cuda_missing": "host-CUDA path, but the note has no CUDA version",
    "compat_not_newer": "the compat driver is not newer than the host driver (would be error 803)",
    "host_branch_unsupported": "the note's driver list does not include the host branch (would be error 803)",
    "note_without_driver_list": "the note lists no supported host branches",
    "compat_major_not_newer": "no note: the compat driver's branch is not newer than the host's",
    "device_unsupported": ("a GPU's brand is outside the note's device list, or the default list when there "
                           "is none (would be error 804)"),
    "device_unknown": "a GPU's brand is unknown and device_check is enforce",
    "device_consumer": ("no device list (no note): a GeForce or TITAN GPU, where NVIDIA supports no forward "
                        "compatibility (would be error 804)"),
    "gpu_arch_unsupported": ("the compat driver's branch does not drive the architecture of a GPU the container "
                             "gets (R590+ dropped Maxwell, Pascal and Volta: compute capability below 7.5)"),
    "no_store_package": "no host-store package fits this host and image",
    "store_not_needed": "the host driver already provides the CUDA version the image needs",
}

#: Skips after which compat-hook leaves the container as the image and the
#: NVIDIA toolkit made it: it was told to stay out (opt-out, no GPU), it
#: cannot tell what is right (host unknown), or the image carries no compat
#: driver to keep away. Every other skip means "compat is wrong here", and
#: compat-hook makes the host driver win (its ``effect`` is ``"host"``).
LEAVE_REASONS = frozenset(("opt_out", "no_gpu_request", "no_compute_capability", "host_driver_unknown",
                           "host_cuda_unknown", "no_candidate", "no_store_package", "store_not_needed"))


class Decision:
    """``action`` is ``"enable"`` or ``"skip"``; ``reason`` is a key of :data:`REASONS`."""

    __slots__ = ("action", "reason", "compat_dir", "compat_version", "source", "details", "warnings")

    def __init__(self, action: str, reason: str, compat_dir: str | None = None,
                 compat_version: str | None = None, source: str = "image",
                 details: dict | None = None, warnings: list | None = None) -> None:
        self.action = action
        self.reason = reason
        self.compat_dir = compat_dir
        self.compat_version = compat_version
        self.source = source
        self.details = details or {}
        self.warnings = warnings or []

    @property
    def enable(self) -> bool:
        return self.action == "enable"

    @property
    def message(self) -> str:
        return REASONS.get(self.reason, self.reason)

    @property
    def effect(self) -> str:
        """What should take effect in the container: ``compat``, ``host`` or ``leave``.

        ``host``: compat is wrong for this host and container, so the host
        driver must win over whatever compat path the image or another hook
        sets up; ``leave``: compat-hook does not touch what others did.

        >>> Decision("skip", "device_unsupported").effect, Decision("skip", "opt_out").effect
        ('host', 'leave')
        """
        if self.action == "enable":
            return "compat"
        return "leave" if self.reason in LEAVE_REASONS else "host"

    def mounted_at(self, target: str) -> "Decision":
        """This (store) decision with the package seen at ``target`` in the container.

        >>> d = Decision("enable", "store_package", "/var/lib/compat-hook/store/550.54.15", source="store")
        >>> d.mounted_at("/usr/local/cuda/compat").compat_dir
        '/usr/local/cuda/compat'
        """
        details = dict(self.details, host_dir=self.compat_dir)
        return Decision(self.action, self.reason, target, self.compat_version, self.source, details,
                        list(self.warnings))

    def to_dict(self) -> dict:
        return {"decision": self.action, "reason": self.reason, "message": self.message,
                "compat_dir": self.compat_dir, "compat_version": self.compat_version,
                "source": self.source, "details": dict(self.details), "warnings": list(self.warnings)}

    def __repr__(self) -> str:
        return f"Decision({self.action!r}, {self.reason!r}, compat_dir={self.compat_dir!r})"


def _v(t):
    return format_version(t, 3) if t else None


def _skip(reason: str, **details) -> Decision:
    return Decision("skip", reason, details=details)


def _device_check(gpus, note, mode: str):
    """``(reason or None, warnings, allowed)`` for the brands of ``gpus``.

    ``allowed``: the note's device list, or :data:`DEFAULT_DEVICE_BRANDS`
    where it gives none (then GeForce / TITAN are refused outright).
    """
    devices = note.device if note is not None else None
    if mode == "off" or not gpus:
        return None, [], None
    allowed = list(devices) if devices else list(DEFAULT_DEVICE_BRANDS)
    if not devices:
        consumer = [f"{g.model or g.bus_id} (brand {g.brand}, {g.brand_source})" for g in gpus
                    if g.brand in CONSUMER_BRANDS]
        if consumer:
            return "device_consumer", [], allowed
    allowed_set = set(allowed)
    bad, unknown = [], []
    for g in gpus:
        if g.brand is None or g.brand == 0:
            unknown.append(g.model or g.bus_id)
        elif g.brand not in allowed_set:
            bad.append(f"{g.model or g.bus_id} (brand {g.brand}, {g.brand_source})")
    which = "the note's device list" if devices else "the default device list (no note lists one)"
    if bad:
        msg = f"GPU brand outside {which}: " + ", ".join(bad)
        return ("device_unsupported", [], allowed) if mode == "enforce" else (None, [msg], allowed)
    if unknown:
        msg = "GPU brand unknown: " + ", ".join(unknown)
        return ("device_unknown", [], allowed) if mode == "enforce" else (None, [msg], allowed)
    return None, [], allowed


def _arch_check(gpus, compat_version, tegra: bool):
    """The first of ``gpus`` the compat driver's branch does not drive, as a line; None when none.

    Asks :mod:`compat_hook.facts.gpusupport` (the table ``plan`` uses), imported
    here only: a container start pays for it when a compat driver would be
    enabled on GPUs, never on the no-compat path.
    """
    if compat_version is None or tegra or not gpus:
        return None
    from ..facts.gpusupport import branch_text, of_gpu, supports

    branch = compat_version[0]
    for g in gpus:
        a = of_gpu(g, None, None)
        if a.arch is not None and not supports(branch, a.arch):
            return f"{a.name()}, from its {a.arch_from}: driven by {branch_text(a.arch)}, not R{branch}"
    return None


def _uuid_key(text: str) -> str:
    return text.strip().lower()


def select_gpus(gpus: list, names) -> tuple:
    """``(selected, why)``: the GPUs of ``gpus`` a container request names.

    ``names``: ``None`` (the request names no GPU in particular) or a list of
    ``(kind, value, source)`` from :meth:`compat_hook.facts.container.Request.gpu_names`,
    kind one of ``all``, ``index``, ``uuid``, ``mig``, ``minor``, ``unknown``.
    Every GPU is returned when the request says ``all``, names none, or names
    one that cannot be mapped to a GPU here (a MIG UUID without NVML, a typo):
    deciding on too many GPUs can only skip compat, too few could enable it
    on a GPU that fails with error 804.

    >>> from compat_hook.facts.hostfacts import Gpu
    >>> h100 = Gpu("0000:17:00.0", "NVIDIA H100", 14, "t", index=0, uuid="GPU-aa", minor=0)
    >>> rtx = Gpu("0000:65:00.0", "NVIDIA GeForce RTX 4090", 5, "t", index=1, uuid="GPU-bb", minor=1)
    >>> sel, why = select_gpus([h100, rtx], [("uuid", "GPU-AA", "NVIDIA_VISIBLE_DEVICES")])
    >>> [g.index for g in sel], why
    ([0], 'named by NVIDIA_VISIBLE_DEVICES: GPU-AA')
    >>> sel, why = select_gpus([h100, rtx], [("minor", "1", "device /dev/nvidia1")])
    >>> [g.index for g in sel]
    [1]
    >>> sel, why = select_gpus([h100, rtx], [("mig", "MIG-1f2e", "NVIDIA_VISIBLE_DEVICES")])
    >>> len(sel), why
    (2, 'all GPUs: MIG-1f2e (NVIDIA_VISIBLE_DEVICES) names no GPU known here')
    """
    gpus = list(gpus)
    if not names:
        return gpus, "all GPUs: the request names none in particular"
    for kind, value, source in names:
        if kind == "all":
            return gpus, f"all GPUs: {source} names all"
    chosen: list = []
    for kind, value, source in names:
        hit = None
        for g in gpus:
            if ((kind == "index" and g.index is not None and str(g.index) == value)
                    or (kind == "minor" and g.minor is not None and str(g.minor) == value)
                    or (kind == "uuid" and g.uuid and _uuid_key(g.uuid) == _uuid_key(value))
                    or (kind == "mig" and any(_uuid_key(m) == _uuid_key(value) for m in g.mig))):
                hit = g
                break
        if hit is None:
            return gpus, f"all GPUs: {value} ({source}) names no GPU known here"
        if hit not in chosen:
            chosen.append(hit)
    chosen.sort(key=lambda g: (g.index is None, g.index if g.index is not None else 0, g.bus_id))
    sources: dict = {}
    for _, value, source in names:
        sources.setdefault(source, []).append(value)
    return chosen, "named by " + "; ".join(f"{s}: {', '.join(v)}" for s, v in sources.items())


def _container_gpus(host, request):
    """``(gpus, why)``: the host's GPUs the container gets (all when it names none)."""
    if not host.gpus:
        return [], "no GPUs known on this host"
    if request is None:
        return list(host.gpus), "all GPUs: no container request (a bare rootfs)"
    return select_gpus(host.gpus, request.gpu_names())


def decide_request(request, config) -> Decision | None:
    """Rule 1 alone: the skip for an opted-out or non-GPU container, else ``None``.

    Needs no host or image facts, so a caller can stop here before reading any.
    """
    if request is not None:
        if request.disabled:
            return _skip("opt_out", by=request.disabled_reason)
        if config.require_gpu_request and not request.gpu_requested:
            return _skip("no_gpu_request", gpu=request.gpu_reason)
        if "NVIDIA_DRIVER_CAPABILITIES" in request.env:  # the usual start reads nothing more
            compute, why = request.compute()
            if not compute:
                return _skip("no_compute_capability", capabilities=why)
    return None


def decide(host, image, request, config) -> Decision:
    """Decide whether this container should use the image's compat driver.

    ``host``: :class:`~compat_hook.facts.hostfacts.HostFacts`; ``image``:
    :class:`~compat_hook.facts.imagefacts.ImageFacts`; ``request``:
    :class:`~compat_hook.facts.container.Request` or ``None`` (a GPU container with
    no opt-out, as ``explain --rootfs`` assumes); ``config``: a
    :class:`~compat_hook.core.config.Config`.
    """
    first = decide_request(request, config)
    if first is not None:
        return first
    every = image.all()
    if len(every) <= 1:
        return _decide_one(host, image, request, config)
    tried = [(c, _decide_one(host, c, request, config)) for c in every]
    chosen = None
    for c, d in tried:
        if d.enable and (chosen is None or _newer(c, chosen[0])):
            chosen = (c, d)
    if chosen is None:
        # None may be used: the decision is the first candidate's meant for this kind of host
        # (an Orin host's compat_orin, not the SBSA compat beside it), else the first one's.
        meant = [t for t in tried if t[1].reason not in _FLAVOUR_REASONS]
        c, d = (meant or tried)[0]
    else:
        c, d = chosen
    d.details["compat_dirs"] = [
        {"dir": x.compat_dir, "origin": getattr(x, "origin", None), "candidate": x.candidate or list(x.candidates),
         "compat_version": x.compat_version_text, "decision": y.reason, "chosen": chosen is not None and x is c}
        for x, y in tried]
    return d


_FLAVOUR_REASONS = ("compat_orin_not_tegra", "compat_dgpu_on_tegra")


def _newer(a, b) -> bool:
    """Whether candidate ``a``'s compat driver is newer than ``b``'s (driver version, else the note's CUDA)."""
    def key(c):
        note = c.elf.note if c.elf is not None else None
        cuda = try_parse_version(note.cuda_version) if note is not None and note.cuda_version else None
        return (c.compat_version or (), cuda or ())
    return key(a) > key(b)


def _decide_one(host, image, request, config) -> Decision:
    """The rules 2-10 for one candidate dir."""
    if image.status == "ambiguous":
        return _skip("ambiguous_candidates", candidates=list(image.candidates), dir=image.compat_dir)
    if image.status != "found":
        return _skip("no_candidate")
    base = {"candidate": image.candidate, "dir": image.compat_dir}
    if image.elf is None:
        return _skip("candidate_unreadable", **base)
    machine = host.machine
    why = image.elf.loadable_for(machine) if machine else "elf_machine"
    if why is not None:
        return _skip(why, host_machine=machine, elf=image.elf.to_dict(), **base)
    flavour = getattr(image, "flavour", "orin" if image.tegra_lib else "dgpu")
    if flavour == "orin" and not host.tegra:
        # Orin's compat only on a host known to be Orin: an unknown driver version is no such proof.
        return _skip("compat_orin_not_tegra", host_driver=_v(host.driver_version), **base)
    if flavour == "dgpu" and host.tegra:
        return _skip("compat_dgpu_on_tegra", host_cuda=_v(host.cuda_version), **base)

    note = image.elf.note
    warnings: list = []
    if image.elf.note_error:
        warnings.append(f"note ignored: {image.elf.note_error}")
    compat = image.compat_version
    hdrv = host.driver_version
    enable_reason = None
    details = dict(base, compat_version=image.compat_version_text, host_driver=_v(hdrv),
                   host_driver_source=host.driver_source, note=note.to_dict() if note else None)

    if image.tegra_lib or host.tegra:
        # Host-CUDA path: a Tegra host only (rule 3b refused Orin's libcuda.so.1.1 anywhere else).
        # A dGPU host with a CUDA version but no driver version is rule 5's host_driver_unknown.
        if note is None:
            return _skip("compat_version_invalid" if image.tegra_lib and hdrv is not None
                         else "note_cuda_missing", **details)
        nc = try_parse_version(note.cuda_version) if note.cuda_version else None
        if nc is None:
            return _skip("note_cuda_missing", **details)
        if host.cuda_version is None:
            return _skip("host_cuda_unknown", **details)
        details["note_cuda"], details["host_cuda"] = note.cuda_version, _v(host.cuda_version)
        if not nc > host.cuda_version:
            return _skip("compat_cuda_not_newer", **details)
        enable_reason = "compat_cuda_newer"
    else:
        if compat is None:
            return _skip("compat_version_invalid", **details)
        if hdrv is None:
            return _skip("host_driver_unknown", **details)
        if not compat > hdrv:
            return _skip("compat_not_newer", **details)
        if note is not None:
            if not note.driver:
                return _skip("note_without_driver_list", **details)
            if hdrv[0] not in note.driver:
                return _skip("host_branch_unsupported", supported=list(note.driver), **details)
            enable_reason = "compat_newer_supported"
        else:
            if not compat[0] > hdrv[0]:
                return _skip("compat_major_not_newer", **details)
            enable_reason = "compat_major_newer"

    gpus, why = _container_gpus(host, request)
    if host.gpus:
        details["gpus_checked"] = {"gpus": [g.label() for g in gpus], "why": why}
    bad, more, allowed = _device_check(gpus, note, config.device_check)
    warnings.extend(more)
    if bad is not None:
        return _skip(bad, gpus=[g.to_dict() for g in gpus], allowed=allowed,
                     device_list="note" if note is not None and note.device else "default", **details)
    arch = _arch_check(gpus, compat, host.tegra)
    if arch is not None:
        return _skip("gpu_arch_unsupported", gpu=arch, **details)
    return Decision("enable", enable_reason, image.compat_dir, image.compat_version_text,
                    "image", details, warnings)


def decide_store(host, request, packages: list, config, image_needs=None) -> Decision:
    """Pick a host-store compat package for an image that carries none.

    ``packages``: list of :class:`~compat_hook.facts.imagefacts.ImageFacts`, one per
    stored package (``compat_dir`` = its host path). ``image_needs``: the
    ``(version, source)`` from :meth:`Request.required_cuda`. The package
    must pass :func:`decide` exactly as an image's own would, and provide at
    least the CUDA the image needs; the newest such package wins.
    """
    first = decide_request(request, config)
    if first is not None:
        return first
    need, need_src = image_needs if image_needs else (None, None)
    if need is None:
        return _skip("no_candidate", store="the image states no CUDA version it needs")
    native = branch_max_cuda(host.driver_version[0]) if host.driver_version else host.cuda_version
    if native is None:
        return _skip("host_driver_unknown", need=_v(need))
    if native[:2] >= need[:2]:
        return _skip("store_not_needed", need=f"{need[0]}.{need[1]}", need_source=need_src,
                     host_cuda=f"{native[0]}.{native[1]}")
    best, tried = None, []
    for pkg in packages:
        d = decide(host, pkg, request, config)
        provides = None
        if pkg.elf is not None and pkg.elf.note is not None and pkg.elf.note.cuda_version:
            provides = try_parse_version(pkg.elf.note.cuda_version)
        if provides is None and pkg.compat_version is not None:
            provides = branch_max_cuda(pkg.compat_version[0])
        ok = d.enable and provides is not None and provides[:2] >= need[:2]
        tried.append({"version": pkg.compat_version_text, "decision": d.reason,
                      "provides_cuda": _v(provides), "fits": ok})
        if ok and (best is None or pkg.compat_version > best[0].compat_version):
            best = (pkg, d)
    if best is None:
        return _skip("no_store_package", need=f"{need[0]}.{need[1]}", need_source=need_src, tried=tried)
    pkg, d = best
    details = dict(d.details, need=f"{need[0]}.{need[1]}", need_source=need_src, tried=tried,
                   rule=d.reason)
    return Decision("enable", "store_package", pkg.compat_dir, pkg.compat_version_text, "store",
                    details, d.warnings)
