"""What the NVIDIA Container Toolkit does about compat on its own (v1.20 rules), and what wins.

Pure functions over facts already gathered; used by ``explain`` (both sides
of a start) and ``plan`` (what the toolkit alone gives after a driver
upgrade). The rules are ``nvidia-cdi-hook enable-cuda-compat``'s
(NVIDIA/nvidia-container-toolkit, cmd/nvidia-cdi-hook/cudacompat):

* it looks only in ``/usr/local/cuda/compat`` for one regular
  ``libcuda.so.*.*`` (resolved in the root);
* with a note and both versions: the host branch must be in the note's
  ``driver`` list and the compat driver strictly newer;
* without a note (no section, not ELF, bad JSON): the compat branch must be
  newer than the host's;
* the note's ``device`` list, the ELF class and machine are not checked;
* no host driver version: it does nothing.

ldconfig lets the first directory in ld.so.conf order win for a soname;
``LD_LIBRARY_PATH`` beats the cache. :func:`effective` combines the toolkit's
drop-in, the image's own compat drop-ins and ``LD_LIBRARY_PATH`` with
compat-hook's effect into the library the container loads.

>>> from compat_hook.imagefacts import ImageFacts
>>> img = ImageFacts(); img.status = "found"; img.configured_dir = "/usr/local/cuda/compat"
>>> img.compat_dir = "/usr/local/cuda-12.4/compat"; img.compat_version = (550, 54, 15)
>>> would_enable(img, (535, 183, 1))
(True, 'no note: the compat branch 550 is newer than the host branch 535')
>>> would_enable(img, (555, 42, 2))[0]
False
"""

from __future__ import annotations

__all__ = ["COMPAT_ROOT", "would_enable", "effective"]

#: ``--cuda-compat-container-root``'s default, the only dir the toolkit looks in.
COMPAT_ROOT = "/usr/local/cuda/compat"


def would_enable(image, host_driver) -> tuple:
    """``(uses_compat, why)``: whether ``enable-cuda-compat`` writes its drop-in.

    ``image``: :class:`~compat_hook.imagefacts.ImageFacts`; ``host_driver``:
    the host version tuple, or ``None``.
    """
    if host_driver is None:
        return False, "no host driver version: the toolkit's hook does nothing"
    if image is None or image.status != "found" or image.configured_dir != COMPAT_ROOT:
        if image is not None and image.status == "ambiguous" and image.configured_dir == COMPAT_ROOT:
            return False, "several libcuda.so.*.* in the compat dir: the toolkit does nothing"
        return False, f"no libcuda.so.*.* in {COMPAT_ROOT}"
    compat = image.compat_version
    elf = image.elf
    note = elf.note if elf is not None else None
    if compat is None:
        return False, "the compat file name carries no version the toolkit parses"
    if note is not None:
        if not note.driver:
            return False, "the note lists no driver branches: never"
        if host_driver[0] not in note.driver:
            return False, f"the note's driver list lacks the host branch {host_driver[0]}"
        if not compat > host_driver:
            return False, "the compat driver is not newer than the host's"
        return True, f"the note lists branch {host_driver[0]} and the compat driver is newer"
    if compat[0] > host_driver[0]:
        return True, f"no note: the compat branch {compat[0]} is newer than the host branch {host_driver[0]}"
    return False, f"no note: the compat branch {compat[0]} is not newer than the host branch {host_driver[0]}"


def effective(*, has_compat: bool, toolkit_enables: bool, dropins: list, ld_library_path: list,
              hook_effect: str | None, wrapper_strips: bool) -> dict:
    """Which libcuda the container loads: ``{"result": "compat"|"host", "by": ...}``.

    ``has_compat``: the image carries a compat libcuda; ``toolkit_enables``:
    :func:`would_enable`; ``dropins``: the image's (and stale toolkit)
    compat drop-ins (:func:`compat_hook.imagefacts.compat_dropins`);
    ``ld_library_path``: compat dirs on the image's ``LD_LIBRARY_PATH``;
    ``hook_effect``: compat-hook's ``compat``/``host``/``leave`` where its
    hook runs (``None``: not registered); ``wrapper_strips``: the wrapper
    takes compat dirs off ``LD_LIBRARY_PATH``.

    >>> effective(has_compat=True, toolkit_enables=True, dropins=[], ld_library_path=[],
    ...           hook_effect="host", wrapper_strips=False)
    {'result': 'host', 'by': "compat-hook's drop-in naming the host driver's dir sorts first"}
    """
    if not has_compat:
        return {"result": "host", "by": "the image carries no compat libcuda"}
    if ld_library_path and not wrapper_strips:
        return {"result": "compat", "by": f"LD_LIBRARY_PATH names {ld_library_path[0]} (beats the ld cache)"}
    if hook_effect == "compat":
        return {"result": "compat", "by": "compat-hook's drop-in names the compat dir and sorts first"}
    if hook_effect == "host":
        return {"result": "host", "by": "compat-hook's drop-in naming the host driver's dir sorts first"}
    if toolkit_enables:
        return {"result": "compat", "by": "the toolkit's enable-cuda-compat drop-in (00-compat-*.conf)"}
    # The image's multiarch drop-in (x86_64-linux-gnu.conf) names the host
    # driver's dir; a compat drop-in sorting before it wins (vLLM renamed
    # its file zzz-cuda-compat.conf to lose).
    for d in dropins:
        if d["file"] < "x86_64-linux-gnu.conf":
            return {"result": "compat", "by": f"/etc/ld.so.conf.d/{d['file']} names {d['dirs'][0]}"}
    return {"result": "host", "by": "nothing puts the compat dir first"}
